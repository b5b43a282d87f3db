"""DTensor (FSDP2) support shared by every layer.

mixprec's kernels take a DTensor as its local shard (:func:`local`); what depends on the
whole tensor is reduced over its mesh: an inf/NaN verdict by MAX over every dimension (also
``Replicate`` ones, keeping replicas together), a norm by summing p-th powers over the
``Shard`` dimensions only (HSDP's replicas count each shard once). Layouts are read through
the public ``device_mesh`` and ``placements``. This module imports nothing of mixprec.
"""

from __future__ import annotations

import math
import sys
from itertools import repeat
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["dtensor_class", "fsdp2", "fsdp2_unavailable", "is_dtensor", "any_dtensor",
           "local", "locals_of", "shard_like", "specs_of", "reduce_groups", "all_reduce",
           "all_reduce_norm"]

# A DTensor's layout: (its DeviceMesh, its placements as a tuple).
Layout = Tuple[Any, Tuple[Any, ...]]

# The DTensor class once some module imported it (mixprec never does: it costs a second),
# and the callbacks told about it (mixprec.ops._dtensor_rules).
_CLS: Any = None
_ON_FOUND: List[Callable[[Any], None]] = []


def on_dtensor_class(callback: Callable[[Any], None]) -> None:
    """Call ``callback(DTensor)`` once the class is known (now, if it is)."""
    _ON_FOUND.append(callback)
    if _CLS is not None:
        callback(_CLS)


def dtensor_class() -> Any:
    """torch's DTensor class if a module of this process imported it, else None."""
    global _CLS
    if _CLS is None:  # (the old path torch.distributed._tensor imports this one)
        cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        if cls is not None:
            _CLS = cls
            for callback in _ON_FOUND:
                callback(cls)
    return _CLS


def fsdp2_unavailable() -> Optional[str]:
    """Why FSDP2 cannot be used with this torch, or None when it can."""
    try:
        fsdp2()
    except ImportError as e:
        return str(e)
    return None


def fsdp2() -> Tuple[Any, Any]:
    """``(fully_shard, MixedPrecisionPolicy)``; ImportError naming the torch without FSDP2."""
    if not torch.distributed.is_available():
        raise ImportError("mixprec: FSDP2 needs torch.distributed, which this torch build "
                          "does not have")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        raise ImportError(f"mixprec: torch {torch.__version__} has no FSDP2 "
                          "(torch.distributed.fsdp.fully_shard)") from None
    dtensor_class()
    return fully_shard, MixedPrecisionPolicy


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (an FSDP2 param or grad)."""
    cls = _CLS if _CLS is not None else dtensor_class()
    return cls is not None and isinstance(t, cls)


def any_dtensor(tensors: Iterable[Any]) -> bool:
    """Whether any item of ``tensors`` is a DTensor."""
    cls = _CLS if _CLS is not None else dtensor_class()
    return cls is not None and any(map(isinstance, tensors, repeat(cls)))


def local(t: Tensor) -> Tensor:
    """A DTensor's local shard (not a copy); ``t`` itself for anything else."""
    return t._local_tensor if is_dtensor(t) else t


def locals_of(tensors: Sequence[Tensor]) -> List[Tensor]:
    """:func:`local` of each tensor."""
    return [local(t) for t in tensors]


def shard_like(t: Tensor, p: Tensor, what: str) -> Tensor:
    """``t`` (a loaded state tensor of DTensor param ``p``) laid out as ``p``: redistributed
    if a DTensor, sharded locally (no communication) if a plain tensor of ``p``'s full
    shape. ValueError for another shape."""
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(f"mixprec.optim: {what} has shape {list(t.shape)}, the param "
                         f"{list(p.shape)}")
    if is_dtensor(t):
        if t.device_mesh == p.device_mesh and tuple(t.placements) == tuple(p.placements):
            return t
        return t.redistribute(p.device_mesh, p.placements)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(t, p.device_mesh, p.placements, src_data_rank=None)


def _dims(placements: Sequence[Any], shard_only: bool) -> Tuple[int, ...]:
    if not shard_only:
        return tuple(range(len(placements)))
    if any(p.is_partial() for p in placements):
        raise NotImplementedError(
            "mixprec: a norm of a DTensor gradient with a Partial placement is not "
            "supported; reduce the gradient first (FSDP2 gives Shard gradients)")
    return tuple(dim for dim, p in enumerate(placements) if p.is_shard())


def all_reduce(t: Tensor, op: Any, groups: Sequence[Any]) -> None:
    """All-reduce ``t`` in place with ``op`` over each of ``groups`` in turn."""
    import torch.distributed as dist

    for g in groups:
        dist.all_reduce(t, op=op, group=g)


def all_reduce_norm(total: Tensor, norm_type: float, groups: Sequence[Any]) -> Tensor:
    """The p-norm of the whole from this rank's ``total`` (its disjoint part's): p-th powers
    summed in float64 over ``groups``, the root in float32 (``inf``: MAX). A new tensor;
    ``total`` itself without groups."""
    import torch.distributed as dist

    if not groups:
        return total
    if math.isinf(norm_type):
        out = total.clone()
        all_reduce(out, dist.ReduceOp.MAX, groups)
        return out
    powered = total.double().pow(norm_type)
    all_reduce(powered, dist.ReduceOp.SUM, groups)
    return powered.pow(1.0 / norm_type).float()


def specs_of(tensors: Iterable[Any]) -> List[Layout]:
    """The layouts ``(device_mesh, placements)`` of the DTensors among ``tensors``."""
    cls = _CLS if _CLS is not None else dtensor_class()
    if cls is None:
        return []
    return [(t.device_mesh, tuple(t.placements)) for t in tensors if isinstance(t, cls)]


def reduce_groups(specs: Sequence[Any], shard_only: bool) -> List[Any]:
    """The process groups to reduce over for DTensors laid out as ``specs``, each once, in
    an order the same on every rank: every mesh dimension (inf checks) or, with
    ``shard_only``, every ``Shard`` dimension (norms). Empty without specs."""
    groups: List[Any] = []
    per_key = []
    for mesh, placements in dict.fromkeys(specs):  # each layout once, in order
        mine = [mesh.get_group(dim) for dim in _dims(placements, shard_only)]
        per_key.append(mine)
        for g in mine:
            if all(g is not h for h in groups):
                groups.append(g)
    if shard_only and any(len(m) != len(groups) for m in per_key):
        raise NotImplementedError(
            "mixprec: the norm of DTensor gradients split over different mesh dimensions "
            "is not supported; clip each set of gradients with its own optimizer")
    return groups
