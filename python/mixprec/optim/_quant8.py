"""Block-wise 8-bit quantization of optimizer state: the code tables and the pure-PyTorch
quantizer (the reference every backend must match bit for bit).

A state tensor is cut into **rows** (slices along dim 0; a tensor of one or no dims is one
row), each row in element order into blocks of :data:`BLOCK` = 256 (a row's last block
holds the rest: a block never spans two rows, so no FSDP2/DCP sharding cuts one and a
shard's 8-bit step computes the unsharded bits). Each block keeps a float32 ``absmax`` and
per element one byte, the index of the table entry nearest to ``x / absmax`` (float32);
it reads back as ``table[code] * absmax``. Maxima have shape :func:`absmax_shape`.

The "dynamic" tables (Dettmers et al. 2022): an optional sign, ``e`` zero bits (a factor
``10**-e``), a 1 bit, then ``f`` fraction bits: ``10**-e * (0.1 + 0.9 * (k + 1) / 2**f)``,
``k < 2**f`` (the absmax element is stored exactly as 1.0):

* :data:`SIGNED` (first moment, momentum): sign + decades ``e = 0..6``, ``f = 6 - e``
  (smallest ``1e-6``), and zero twice (+0, -0): 256 entries ascending;
* :data:`UNSIGNED` (second moment): ``e = 0..7``, ``f = 7 - e`` (smallest ``1e-7``), and 0.

Rounding is to the nearest entry (ties: the lower), except that **a nonzero value never
becomes zero** (it takes the smallest entry of its sign: a second moment flushed to zero
would turn Adam's ``m / (sqrt(v) + eps)`` into ``m / eps``). Per element, with ``A`` the
block's absmax and ``y = x / A``: ``|read - x| <= A * max(gap(y) / 2, s)``, ``gap(y)``
the distance between the entries around ``y``, ``s`` the smallest nonzero magnitude
(:func:`error_bound`). A block of zeros has ``absmax = 0``; non-finite values have no code
(steps with inf/NaN grads are skipped before they reach the state).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["BLOCK", "SIGNED", "UNSIGNED", "TABLES", "table", "quantize", "dequantize",
           "num_blocks", "row_length", "absmax_shape", "error_bound", "zero_code"]

#: elements per block (one float32 absmax each)
BLOCK = 256
#: the names of the tables (what a state dict records as the table in use)
SIGNED = "dynamic8-signed"
UNSIGNED = "dynamic8-unsigned"
TABLES = (SIGNED, UNSIGNED)


def _magnitudes(bits: int) -> list[float]:
    return [10.0**-e * (0.1 + 0.9 * (k + 1) / 2**(bits - 1 - e))
            for e in range(bits) for k in range(2**(bits - 1 - e))]


@cache
def _table_cpu(name: str) -> Tuple[Tensor, Tensor]:
    """(256 ascending values, the 255 midpoints between them) of a table, float32 CPU."""
    if name == SIGNED:
        mags = _magnitudes(7)
        values = sorted([-m for m in mags] + [0.0, 0.0] + mags)
    elif name == UNSIGNED:
        values = sorted([0.0] + _magnitudes(8))
    else:
        raise ValueError(f"mixprec: unknown 8-bit code table {name!r}; known: {TABLES}")
    v = torch.tensor(values, dtype=torch.float64).to(torch.float32)
    mid = ((v[1:].double() + v[:-1].double()) / 2).to(torch.float32)
    return v, mid


@cache
def _smallest_codes(name: str) -> Tuple[int, int]:
    """The codes of the smallest positive and (0 if none) smallest negative entries."""
    v = _table_cpu(name)[0].tolist()
    pos = min(i for i, x in enumerate(v) if x > 0)
    neg = max((i for i, x in enumerate(v) if x < 0), default=0)
    return pos, neg


def table(name: str, device: torch.device | str = "cpu") -> Tensor:
    """The 256 float32 values of table ``name`` (ascending; the code is the index)."""
    return _table_cpu(name)[0].to(device)


def zero_code(name: str) -> int:
    """The code ``quantize`` gives 0.0 (plain Python: traceable by ``torch.compile``)."""
    if name == SIGNED:
        return 127  # the first of the two zeros, after the 127 negative entries
    if name == UNSIGNED:
        return 0
    raise ValueError(f"mixprec: unknown 8-bit code table {name!r}; known: {TABLES}")


def num_blocks(numel: int) -> int:
    """Blocks of one row of ``numel`` elements."""
    return -(-numel // BLOCK)


def row_length(shape: Sequence[int]) -> int:
    """Elements per row of a tensor of ``shape`` (fewer than two dims: one row)."""
    n = 1
    for d in (shape[1:] if len(shape) >= 2 else shape):
        n *= int(d)
    return n


def absmax_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """The maxima's shape for ``shape``: ``(shape[0], blocks per row)``, or ``(blocks,)``
    for fewer than two dims."""
    per_row = num_blocks(row_length(shape))
    return (int(shape[0]), per_row) if len(shape) >= 2 else (per_row,)


def _blocks(x: Tensor) -> Tensor:
    """``x`` as (blocks, BLOCK) float32, row by row, each row's last block zero-padded."""
    row = row_length(x.shape)
    rows = x.numel() // row if row else 0
    b = torch.nn.functional.pad(x.reshape(rows, row).float(), (0, num_blocks(row) * BLOCK - row))
    return b.reshape(-1, BLOCK)


def _unblock(b: Tensor, shape: Sequence[int]) -> Tensor:
    """The inverse of :func:`_blocks`: (blocks, BLOCK) back to ``shape``, padding dropped."""
    row = row_length(shape)
    rows = math.prod(shape) // row if row else 0
    return b.reshape(rows, num_blocks(row) * BLOCK)[:, :row].reshape(shape)


def quantize(x: Tensor, name: str) -> Tuple[Tensor, Tensor]:
    """``(codes, absmax)`` of ``x`` (any float dtype, finite): ``codes`` uint8 of ``x``'s
    shape, ``absmax`` float32 of shape ``absmax_shape(x.shape)``. No host sync."""
    values, mid = _table_cpu(name)
    values, mid = values.to(x.device), mid.to(x.device)
    b = _blocks(x)
    absmax = b.abs().amax(dim=1)
    y = torch.where(absmax[:, None] > 0, b / absmax[:, None], torch.zeros_like(b))
    idx = torch.searchsorted(mid, y.contiguous(), right=False)  # ties: the lower entry
    # a nonzero value never reads back as zero: the smallest entry of its sign instead
    lands_on_zero = (values == 0)[idx] & (y != 0)
    smallest_pos, smallest_neg = _smallest_codes(name)
    idx = torch.where(lands_on_zero & (y > 0), torch.full_like(idx, smallest_pos), idx)
    idx = torch.where(lands_on_zero & (y < 0), torch.full_like(idx, smallest_neg), idx)
    codes = _unblock(idx.to(torch.uint8), x.shape).contiguous()
    return codes, absmax.reshape(absmax_shape(x.shape))


def dequantize(codes: Tensor, absmax: Tensor, name: str) -> Tensor:
    """The float32 values of ``codes`` (uint8) with per-block ``absmax`` (float32, of
    ``absmax_shape(codes.shape)``)."""
    values = _table_cpu(name)[0].to(codes.device)
    v = values[_blocks(codes).long()]
    scale = absmax.reshape(-1, 1).float()
    return _unblock(v * scale, codes.shape)


def error_bound(x: Tensor, name: str) -> Tensor:
    """The bound on ``|dequantize(quantize(x)) - x|`` per element (float64, see above)."""
    values, _ = _table_cpu(name)
    v = values.double().to(x.device)
    b = _blocks(x).double()
    a = b.abs().amax(dim=1, keepdim=True)
    y = torch.where(a > 0, b / a, torch.zeros_like(b)).clamp(-1, 1)
    hi = torch.searchsorted(v, y.contiguous()).clamp(1, 255)
    gap = v[hi] - v[hi - 1]
    smallest = v[v > 0].min()
    bound = a * torch.maximum(gap / 2, smallest.expand_as(gap))
    # float32 rounding of x / A and table * A: a few ulps of A (denormals: 2**-149)
    bound = bound + a * 4 * torch.finfo(torch.float32).eps + 2.0**-149
    return _unblock(bound, x.shape)
