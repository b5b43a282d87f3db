"""DTensor (FSDP2) support shared by every layer: where torch keeps the classes, and the
few facts mixprec needs of a DTensor.

mixprec's kernels work on plain tensors. A DTensor (what ``fully_shard`` turns params and
grads into) is handed to them as its local shard (:func:`local`); what depends on the
whole tensor is then reduced over the mesh dimensions the tensor is split over:

* an inf/NaN verdict: MAX over the whole mesh (torch's own DTensor rule for
  ``_amp_foreach_non_finite_check_and_unscale_`` skips the ``Replicate`` dimensions; a
  MAX over them too costs one more one-element all-reduce and keeps replicas together
  even when their grads differ);
* a norm: the p-th powers summed over the ``Shard`` dimensions only, so that the replicas
  of HSDP (``Replicate`` x ``Shard``) count each shard once.

A DTensor's layout is read through its public ``device_mesh`` and ``placements``. Where
FSDP2 is missing, :func:`fsdp2` says why. This module imports nothing of mixprec.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["dtensor_class", "fsdp2", "fsdp2_unavailable", "is_dtensor", "any_dtensor",
           "local", "locals_of", "shard_like", "specs_of", "reduce_groups", "all_reduce",
           "all_reduce_norm"]

# A DTensor's layout: (its DeviceMesh, its placements as a tuple).
Layout = Tuple[Any, Tuple[Any, ...]]

# The DTensor class once some module imported it (importing it costs about a second, so
# mixprec never does so itself: without that module no DTensor exists), and the callbacks
# told about it (the DTensor sharding rules of the ops, mixprec.ops._dtensor_rules).
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
    """``(fully_shard, MixedPrecisionPolicy)`` from ``torch.distributed.fsdp``. ImportError
    naming the torch version when it has no FSDP2."""
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
    return cls is not None and any(isinstance(t, cls) for t in tensors)


def local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (the very tensor it wraps, not a copy); ``t`` itself
    for anything else."""
    return t._local_tensor if is_dtensor(t) else t


def locals_of(tensors: Sequence[Tensor]) -> List[Tensor]:
    """:func:`local` of each tensor."""
    return [local(t) for t in tensors]


def shard_like(t: Tensor, p: Tensor, what: str) -> Tensor:
    """``t`` (a loaded state tensor of DTensor param ``p``) laid out as ``p``: a DTensor
    on ``p``'s mesh with its placements. A DTensor laid out otherwise is redistributed; a
    plain tensor of ``p``'s full shape (every rank holding the same values) is sharded
    locally, without communication. ValueError for another shape."""
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
    out = []
    for dim, p in enumerate(placements):
        if p.is_replicate():
            continue
        if not p.is_shard():
            if p.is_partial():
                raise NotImplementedError(
                    "mixprec: a norm of a DTensor gradient with a Partial placement is not "
                    "supported; reduce the gradient first (FSDP2 gives Shard gradients)")
            continue
        out.append(dim)
    return tuple(out)


def all_reduce(t: Tensor, op: Any, groups: Sequence[Any]) -> None:
    """All-reduce ``t`` in place with ``op`` over each of ``groups`` in turn."""
    import torch.distributed as dist

    for g in groups:
        dist.all_reduce(t, op=op, group=g)


def all_reduce_norm(total: Tensor, norm_type: float, groups: Sequence[Any]) -> Tensor:
    """The p-norm of the whole from this rank's ``total`` (the norm of its disjoint part):
    the p-th powers (in float64) summed over ``groups``, then the p-th root (float32);
    ``inf``: the MAX. A new tensor; ``total`` itself when ``groups`` is empty."""
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
    """The process groups over which a property of DTensors laid out as ``specs``
    (:func:`specs_of`) is reduced, each once, in a fixed order (the same on every rank
    that holds the same model): every mesh dimension (``shard_only=False``: inf checks,
    MAX; also the ``Replicate`` ones, so that replicas whose grads differ, which a correct
    all-reduce never gives, still cannot diverge) or every ``Shard`` dimension
    (``shard_only=True``: norms, SUM). Empty without specs. Computed afresh each call
    (FSDP2 models repeat a handful of layouts: one hash per tensor)."""
    if not specs:
        return []
    seen = dict.fromkeys(specs)  # in order
    groups: List[Any] = []
    per_key = []
    for mesh, placements in seen:
        mine = [mesh.get_group(dim) for dim in _dims(placements, shard_only)]
        per_key.append(mine)
        for g in mine:
            if all(g is not h for h in groups):
                groups.append(g)
    if shard_only and any(len(m) != len(groups) for m in per_key):
        # a sum over one group of terms that are split over another would count them twice
        raise NotImplementedError(
            "mixprec: the norm of DTensor gradients split over different mesh dimensions "
            "is not supported; clip each set of gradients with its own optimizer")
    return groups
