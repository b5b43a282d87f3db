"""Stochastic rounding's element numbers for sharded params.

The fused ops round a bf16 param with the random bits of ``(seed, step, grad dtype,
element number)`` (``csrc/common/optim_math.h``); element ``e`` of param ``t`` is numbered
``sr_bases[t] + e``, by default the :data:`SR_CHUNK`-element chunks of the earlier params of
its (param dtype, grad dtype). A DTensor shard gets the same count over the whole tensors
plus the index of its first element: the same bits at every world size.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _dtensor

__all__ = ["SR_CHUNK", "extent", "sr_bases", "bucket_bases"]

#: elements per chunk of the numbering (math::kSrChunk)
SR_CHUNK = 65536


def extent(p: Tensor) -> Tuple[int, int]:
    """``(elements of the whole tensor, index in it of the local shard's element 0)`` of a
    param: ``(numel, 0)`` for a plain tensor. A DTensor's ``Shard(0)`` placements cut its
    rows as ``torch.chunk`` does, one mesh dimension after the other (FSDP2, HSDP)."""
    if not _dtensor.is_dtensor(p):
        return p.numel(), 0
    from torch.distributed.tensor import Shard

    rows = p.shape[0] if p.dim() else 1
    start, length = 0, rows
    for dim, pl in enumerate(p.placements):
        if not isinstance(pl, Shard):
            continue
        if pl.dim != 0:
            raise ValueError(f"mixprec.optim: stochastic_rounding takes DTensor params "
                             f"sharded on dim 0 (FSDP2's default), got {p.placements}")
        n = p.device_mesh.size(dim)
        chunk = -(-length // n)
        first = min(p.device_mesh.get_local_rank(dim) * chunk, length)
        start, length = start + first, max(0, min(chunk, length - first))
    per_row = p.numel() // rows if rows else 0
    return p.numel(), start * per_row


def sr_bases(params: Sequence[Tensor], grads: Sequence[Tensor],
             extents: Sequence[Tuple[int, int]]) -> List[int]:
    """The ``sr_bases`` of one op call: ``params``/``grads`` the call's (local) lists,
    ``extents`` each param's :func:`extent`."""
    chunks: Dict[Tuple[torch.dtype, torch.dtype], int] = {}
    out = []
    for p, g, (numel, offset) in zip(params, grads, extents):
        key = (p.dtype, g.dtype)
        count = chunks.get(key, 0)
        out.append((count * SR_CHUNK + offset) & 0xFFFFFFFF)
        chunks[key] = count + -(-numel // SR_CHUNK)
    return out


def bucket_bases(*buckets: Optional[Dict[str, Any]]) -> List[Optional[List[int]]]:
    """The ``sr_bases`` of each bucket's op call (None for a None bucket or one without
    ``"sr_extents"``, which ``_buckets`` adds for a DTensor group with stochastic rounding)."""
    return [None if b is None or "sr_extents" not in b
            else sr_bases(b["params"], b["grads"], b["sr_extents"]) for b in buckets]
