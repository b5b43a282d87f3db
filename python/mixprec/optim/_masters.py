"""Split masters (``master_correction_bits``): the float32 master of a bfloat16 param kept
as the param plus a 16- or 8-bit correction, in pure PyTorch.

The kernels update the pair in place; this module is the same encoding for everything
around them (state conversions on load, :func:`decode_master` for export, the tests'
reference), bit for bit. ``bits(x)`` is the int32 pattern of float32 ``x``, ``P`` the
uint16 pattern of the bf16 param, ``RNE(m)`` (round to nearest even, torch's float32 to
bfloat16 conversion)::

    d = bits(m) - (P << 16)            (wrapping 32-bit; 0 when P is NaN)
    16 bits: c = min(d, 0x7FFF)                        decode: (P << 16) + c
     8 bits: c = clamp(round_half_even(d / 256), -128, 127)   decode: (P << 16) + 256 c

16 bits: exact for every float32 but the midpoints ``d == 0x8000`` (rounded to an even
``P``, on the side away from zero: decoded one float32 ulp toward ``P``) and NaN payloads
(decoded as the param's NaN). 8 bits: within 256 float32 patterns (2^-8 of a bf16 ulp);
an odd param with the correction -128 decodes to the midpoint below it, which RNE rounds to
the bf16 value below the param (the step reads the pair, not that rounding).
A DTensor is encoded and decoded shard by shard (the arithmetic is elementwise).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from .. import _dtensor

__all__ = ["CORRECTION_DTYPES", "check_bits", "decode_master", "recode", "split_master"]

#: ``master_correction_bits`` -> the dtype of ``state["master_correction"]``.
CORRECTION_DTYPES: Dict[int, torch.dtype] = {16: torch.int16, 8: torch.int8}
_BITS_OF = {dtype: bits for bits, dtype in CORRECTION_DTYPES.items()}


def check_bits(where: str, value: Any) -> None:
    """ValueError unless ``value`` is a valid ``master_correction_bits`` (None, 8 or 16)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value not in CORRECTION_DTYPES):
        raise ValueError(f"{where}: master_correction_bits must be None (float32 masters), "
                         f"16 or 8, got {value!r}")


def _wrap32(x: Tensor) -> Tensor:
    """int64 ``x`` reduced to the int32 of the same low 32 bits (wrapping arithmetic)."""
    return (torch.remainder(x + 2 ** 31, 2 ** 32) - 2 ** 31).to(torch.int32)


def _high(param: Tensor) -> Tensor:
    """``int32(uint32(P) << 16)`` of a bf16 tensor, as int64."""
    return param.contiguous().view(torch.int16).to(torch.int64) * 65536


def _shardwise(fn: Callable[..., Tensor], like: Tensor, *tensors: Tensor) -> Tensor:
    """``fn`` of the tensors' local shards, a DTensor laid out as ``like`` when it is one."""
    if not _dtensor.is_dtensor(like):
        return fn(*tensors)
    from torch.distributed.tensor import DTensor

    out = fn(*(_dtensor.local(t) for t in tensors))
    return DTensor.from_local(out, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def _encode(m: Tensor, param: Tensor, dtype: torch.dtype) -> Tensor:
    """The correction of float32 ``m`` relative to bf16 ``param`` (the spec's encode)."""
    d = m.view(torch.int32).to(torch.int64) - _high(param)
    d = torch.where(param.isnan(), torch.zeros_like(d), _wrap32(d).to(torch.int64))
    if dtype == torch.int16:
        c = d.clamp(max=0x7FFF)
    else:
        c = ((d + 127 + ((d >> 8) & 1)) >> 8).clamp(-128, 127)
    return c.to(dtype)


def _split(master: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    m = master.detach().to(torch.float32).contiguous()
    param = m.to(torch.bfloat16)
    return param, _encode(m, param, dtype)


def split_master(master: Tensor, bits: int) -> Tuple[Tensor, Tensor]:
    """``(RNE_bf16(master), its correction)``: the bf16 param and the int16 (``bits=16``) or
    int8 (``bits=8``) correction that carry float32 ``master`` (fresh tensors; a DTensor
    gives DTensors laid out as it)."""
    dtype = CORRECTION_DTYPES[bits]
    if not _dtensor.is_dtensor(master):
        return _split(master, dtype)
    param = _shardwise(lambda m: _split(m, dtype)[0], master, master)
    return param, _shardwise(lambda m: _split(m, dtype)[1], master, master)


def recode(param: Tensor, correction: Tensor, bits: int) -> Tensor:
    """``correction`` of ``param`` as a correction of ``bits`` bits of the same param (the
    param is kept: an 8-bit master that decodes to the midpoint below an odd param, which
    rounds to the param below, is carried exactly by 16 bits relative to this one)."""
    dtype = CORRECTION_DTYPES[bits]
    with torch.no_grad():
        return _shardwise(lambda p, c: _encode(_decode(p, c), p.contiguous(), dtype), param,
                          param.detach(), correction.detach())


def _decode(param: Tensor, correction: Tensor) -> Tensor:
    c = correction.to(torch.int64)
    if correction.dtype == torch.int8:
        c = c * 256
    m = _wrap32(_high(param) + c).view(torch.float32)
    p32 = param.to(torch.float32)
    return torch.where(param.isnan(), p32, m)


def decode_master(param: Tensor, correction: Tensor) -> Tensor:
    """The float32 master a bfloat16 param and its correction carry (a fresh tensor).

    ``param``: the bf16 param (or a DTensor of one); ``correction``: its
    ``optimizer.state[param]["master_correction"]`` (int16 for ``master_correction_bits=16``,
    int8 for 8), of the param's shape (a DTensor laid out as the param when it is one).
    A NaN param decodes to its NaN. For export, ``optimizer.master_params()`` returns every
    param's master this way.

    Raises:
        TypeError: ``param`` is not bfloat16, or ``correction`` not int16/int8.
        ValueError: the shapes differ.
    """
    if not isinstance(param, Tensor) or param.dtype != torch.bfloat16:
        raise TypeError("mixprec.optim.decode_master: param must be a bfloat16 tensor, got "
                        f"{getattr(param, 'dtype', type(param).__name__)}")
    if not isinstance(correction, Tensor) or correction.dtype not in _BITS_OF:
        raise TypeError("mixprec.optim.decode_master: correction must be an int16 or int8 "
                        "tensor (state['master_correction']), got "
                        f"{getattr(correction, 'dtype', type(correction).__name__)}")
    if tuple(param.shape) != tuple(correction.shape):
        raise ValueError(f"mixprec.optim.decode_master: correction has shape "
                         f"{list(correction.shape)}, the param {list(param.shape)}")
    with torch.no_grad():
        return _shardwise(_decode, param, param.detach(), correction.detach())


def correction_bits(t: Optional[Tensor]) -> Optional[int]:
    """The bits of a correction tensor (16 or 8), None for anything else."""
    return _BITS_OF.get(t.dtype) if isinstance(t, Tensor) else None
