"""``torch.ops.mixprec.*`` on DTensors (FSDP2 params and grads), registered with DTensor's
dispatcher as torch registers its ``_amp_foreach_non_finite_check_and_unscale_`` rule.

* The checks run on the local shards, then ``found_inf`` (a plain tensor) is all-reduced
  (MAX) over the mesh; the norms also return the whole tensors' norm (p-th powers summed
  over the ``Shard`` dimensions; ``inf``: MAX).
* The optimizers (element-wise; 8-bit per block inside a row) run on the local shards; a
  param's DTensors must be laid out alike. ``found_inf`` is read as given (reduce it first).
  Stochastic rounding numbers elements by ``sr_bases`` (each shard's place in the whole).
* The scale updates refuse DTensors, naming the op.

Registered when mixprec first sees the DTensor class (:func:`mixprec._dtensor.on_dtensor_class`).
The all-reduces run on the current stream (no host sync with NCCL).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from .. import _dtensor

_CHECKS = ("unscale_and_check_", "check_finite_")
_NORMS = ("unscale_and_norm_", "check_finite_and_norm_")
_OPTIMIZERS = ("fused_adam_", "fused_sgd_", "fused_adam8_", "fused_sgd8_")
_SCALE = ("update_scale_", "update_scale_ext_")


def _unwrap(args: Sequence[Any]) -> Tuple[List[Any], List[Tensor]]:
    """The arguments with every DTensor (alone or in a list) as its local shard, and the
    DTensors met."""
    seen: List[Tensor] = []

    def one(t: Any) -> Any:
        if not _dtensor.is_dtensor(t):
            return t
        seen.append(t)
        return t._local_tensor

    out = [[one(t) for t in a] if isinstance(a, (list, tuple)) else one(a) for a in args]
    return out, seen


def _check_rule(name: str) -> Callable[..., Any]:
    def rule(op: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        import torch.distributed as dist

        if _dtensor.is_dtensor(args[1]):  # (checked before anything is written)
            raise RuntimeError(f"mixprec.{name}: found_inf must be a plain tensor when the "
                               "grads are DTensors")
        local, dts = _unwrap(list(args))
        specs = _dtensor.specs_of(dts)
        out = op(*local, **kwargs)
        _dtensor.all_reduce(local[1], dist.ReduceOp.MAX, _dtensor.reduce_groups(specs, False))
        if name in _NORMS:
            norm_type = float(local[3]) if len(local) > 3 else 2.0
            out.copy_(_dtensor.all_reduce_norm(out, norm_type,
                                               _dtensor.reduce_groups(specs, True)))
        return out

    return rule


def _optimizer_rule(name: str) -> Callable[..., Any]:
    def rule(op: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        params = args[0]
        for lst in args:
            if not isinstance(lst, (list, tuple)):
                continue
            for i, t in enumerate(lst):
                if not _dtensor.is_dtensor(t):
                    continue
                if i >= len(params) or not _dtensor.is_dtensor(params[i]):
                    raise RuntimeError(f"mixprec.{name}: a DTensor at position {i} of a list "
                                       "whose param is not a DTensor")
                p = params[i]
                if t.device_mesh != p.device_mesh or tuple(t.placements) != tuple(p.placements):
                    raise RuntimeError(
                        f"mixprec.{name}: the tensors of param {i} must be laid out as the "
                        f"param ({p.placements}), got {t.placements}")
        local, _ = _unwrap(list(args))
        return op(*local, **kwargs)

    return rule


def _refuse(name: str) -> Callable[..., Any]:
    def rule(op: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        raise RuntimeError(f"mixprec.{name} takes plain tensors, not DTensors: the scale "
                           "and its tracker are the same on every rank")

    return rule


def register(dtensor_cls: Any) -> None:
    """Register the rules above for every op of the extension with DTensor's dispatcher
    (no-op where this torch keeps no table of custom handlers)."""
    handlers = getattr(getattr(dtensor_cls, "_op_dispatcher", None), "_custom_op_handlers",
                       None)
    if handlers is None or not hasattr(torch.ops, "mixprec"):
        return
    for name in _CHECKS + _NORMS + _OPTIMIZERS + _SCALE:
        packet = getattr(torch.ops.mixprec, name, None)
        if packet is not None:
            make = (_optimizer_rule if name in _OPTIMIZERS
                    else _refuse if name in _SCALE else _check_rule)
            handlers[packet.default] = make(name)
