"""Pure-PyTorch reference of split float32 masters (common/master_math.h): the master of
a bf16 param kept as the param plus an int16 or int8 correction.

With ``bits(x)`` a float32's uint32 pattern and ``P`` the param's uint16 pattern,
``d = bits(m) - (P << 16)`` (0 where P is NaN); 16 bits keep ``min(d, 0x7fff)``, 8 bits
``d / 256`` rounded half to even and clamped to [-128, 127]; the master reads back as
``(P << 16) + c`` (``c * 256``), the param's NaN where P is NaN. A step of a fused op
with split masters is the float32-master step of ``tests/_reference.py`` on the decoded
masters, followed by the encode of each new master against its new param (nothing
written when found_inf is set). Computed here with int64 arithmetic and a floor
division, independently of the kernels' shifts.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

import _reference

SPLIT_DTYPES = (torch.int16, torch.int8)


def _param_bits(p: Tensor) -> Tensor:
    """The bf16 params' patterns as int64 in [0, 0xffff]."""
    return p.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF


def _to_float32(u: Tensor) -> Tensor:
    """int64 patterns in [0, 2^32) as float32."""
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32).view(torch.float32)


def decode(p: Tensor, c: Tensor) -> Tensor:
    """The float32 masters of bf16 params ``p`` with corrections ``c`` (int16 or int8)."""
    pb = _param_bits(p)
    off = c.to(torch.int64) * (256 if c.dtype == torch.int8 else 1)
    nan = torch.isnan(p)
    u = ((pb << 16) + torch.where(nan, 0, off)) % 2**32
    return _to_float32(u).reshape(p.shape)


def encode(m: Tensor, p: Tensor, dtype: torch.dtype) -> Tensor:
    """The corrections (``dtype`` int16 or int8) of float32 masters ``m`` to params ``p``."""
    mb = m.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    d = mb - (_param_bits(p) << 16)
    d = torch.where(d >= 2**31, d - 2**32, torch.where(d < -(2**31), d + 2**32, d))
    d = torch.where(torch.isnan(p), 0, d)
    if dtype == torch.int16:
        return d.clamp(max=0x7FFF).to(torch.int16).reshape(p.shape)
    q = torch.div(d, 256, rounding_mode="floor")
    r = d - 256 * q
    q = q + ((r > 128) | ((r == 128) & (q % 2 == 1))).to(torch.int64)
    return q.clamp(-128, 127).to(torch.int8).reshape(p.shape)


def split(m: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A float32 master as (bf16 param, correction): the param is m rounded to nearest."""
    p = m.to(torch.bfloat16)
    return p, encode(m, p, dtype)


def step(op: str, **kwargs: Any) -> None:
    """``tests/_reference.<op>`` with the op's own keyword arguments, where master_params
    may be int16/int8 corrections (then decoded, stepped in float32, encoded back)."""
    ref = getattr(_reference, op)
    corr = list(kwargs.get("master_params") or [])
    if not corr or corr[0].dtype not in SPLIT_DTYPES:
        ref(**kwargs)
        return
    params = kwargs["params"]
    masters = [decode(p, c) for p, c in zip(params, corr)]
    ref(**{**kwargs, "master_params": masters})
    found_inf: Optional[Tensor] = kwargs.get("found_inf")
    if found_inf is not None and float(found_inf) != 0.0:
        return
    for p, c, m in zip(params, corr, masters):
        c.copy_(encode(m, p, c.dtype))
