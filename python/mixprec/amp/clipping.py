"""Gradient clipping of :meth:`mixprec.GradScaler.clip_grad_norm_`: the decision tree.

1. **folded** (a mixprec optimizer, ``fold_into_step=True``, ``p > 0``, no sparse grads): one
   read-only pass, :func:`mixprec.ops.check_finite_and_norm_`; the grads stay scaled and
   unclipped, the step gets ``grad_scale`` and the clip coefficient (kept in the
   :class:`~mixprec.amp.protocol.OptimizerRecord`).
2. **fused** (from READY otherwise): :func:`mixprec.ops.unscale_and_norm_`, then an in-place
   clip (:func:`clip_with_norm`).
3. **unfused** (after ``unscale_``, or ``norm_type`` 0): ``unscale_`` if needed, torch's
   ``get_total_norm`` and the in-place clip.

The norm is reduced over ``process_group``, else over the ``Shard`` mesh dimensions of
DTensor grads (HSDP counts each shard once). No branch syncs with the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState

from .. import _dtensor, ops
from .capability import SCALARS, step_kind
from .grads import (
    DeviceGrads,
    collect_grads,
    fp16_grads_allowed,
    inv_scale,
    norm_pass,
    reduce_found_inf,
    unscale_optimizer_grads,
)
from .protocol import record_of

__all__ = ["ClipAccess", "clip_grad_norm", "clip_with_norm"]


@dataclass(frozen=True)
class ClipAccess:
    """What clipping needs of the scaler: ``scale`` (float32, one element; where the norm
    and flags end up), ``state`` (the optimizer's per-iteration dict; written here), the
    scaler's ``allow_fp16_grads`` and ``process_group``."""

    scale: Tensor
    state: dict[str, Any]
    allow_fp16_grads: Optional[bool]
    process_group: Any

    def grads(self, optimizer: torch.optim.Optimizer, coalesce_sparse: bool = False
              ) -> DeviceGrads:
        """``optimizer``'s grads by device, as the scaler collects them."""
        allow = fp16_grads_allowed(self.allow_fp16_grads, optimizer)
        return collect_grads(optimizer, allow, coalesce_sparse)


def clip_grad_norm(scaler: ClipAccess, optimizer: torch.optim.Optimizer, max_norm: float,
                   norm_type: float, fold_into_step: bool) -> Tensor:
    """:meth:`mixprec.GradScaler.clip_grad_norm_` of an enabled scaler."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    scale, state = scaler.scale, scaler.state
    if state["stage"] is OptState.STEPPED:
        raise RuntimeError("clip_grad_norm_() is being called after step().")
    norm_type = float(norm_type)
    home = scale.device
    fold = (fold_into_step and step_kind(optimizer) is SCALARS and norm_type > 0
            and not any(p.grad is not None and p.grad.is_sparse for p in params))
    record = record_of(state)
    deferred = record.deferred_unscale
    if deferred and not fold:
        # an earlier folded clip left the grads scaled, its coefficient pending: apply both
        _apply_deferred(scaler, optimizer, record)
        deferred = False
    total: Optional[Tensor] = None
    group = scaler.process_group
    specs: list[Any] = []  # the layouts of DTensor grads
    if norm_type > 0 and (state["stage"] is OptState.READY or deferred):  # (deferred: folds)
        per_device = scaler.grads(optimizer, coalesce_sparse=not fold)
        specs = per_device.specs
        flags, total = norm_pass(per_device, ops.check_finite_and_norm_ if fold
                                 else ops.unscale_and_norm_, inv_scale(scale), norm_type)
        if not deferred:
            state["found_inf_per_device"] = reduce_found_inf(flags, home, group, specs)
            state["stage"] = OptState.UNSCALED
            record.deferred_unscale = fold
    else:
        if state["stage"] is OptState.READY:
            for p in params:
                if p.grad is not None and p.grad.is_sparse:
                    p.grad = p.grad.coalesce()
            found = torch.zeros((), dtype=torch.float32, device=home)
            state["found_inf_per_device"] = unscale_optimizer_grads(
                optimizer, inv_scale(scale), found, False, group, scaler.allow_fp16_grads)
            state["stage"] = OptState.UNSCALED
        grads = [p.grad for p in params if p.grad is not None]
        specs = _dtensor.specs_of(grads)
        with torch.no_grad():
            if grads:
                local = _dtensor.locals_of(grads)
                total = torch.nn.utils.get_total_norm(local, norm_type).to(home, torch.float32)
            else:
                total = torch.zeros((), dtype=torch.float32, device=home)
    if group is not None:
        total = _dtensor.all_reduce_norm(total, norm_type, [group])
    elif specs:
        total = _dtensor.all_reduce_norm(total, norm_type,
                                         _dtensor.reduce_groups(specs, shard_only=True))
    pending = record.clip_coef
    if pending is not None:
        total = total * pending
    if fold:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        record.clip_coef = coef if pending is None else pending * coef
    else:
        clip_with_norm(params, max_norm, total)
    return total


def _apply_deferred(scaler: ClipAccess, optimizer: torch.optim.Optimizer,
                    record: Any) -> None:
    """Multiply the grads in place by ``inv_scale`` times the pending clip coefficient and
    clear the deferral (the folded pass's inf flags stay valid). No host sync."""
    factor = inv_scale(scaler.scale)
    if record.clip_coef is not None:
        factor = factor * record.clip_coef
    with torch.no_grad():
        for device, grads in scaler.grads(optimizer).items():
            torch._foreach_mul_(grads, factor.to(device, non_blocking=True))
    record.deferred_unscale = False
    record.clip_coef = None


def clip_with_norm(params: list[Tensor], max_norm: float, total: Tensor) -> None:
    """Scale grads by ``min(1, max_norm / (total + 1e-6))`` as torch's clipping does
    (DTensor grads: their local shards, by the norm of the whole)."""
    if not _dtensor.any_dtensor(p.grad for p in params):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                g = _dtensor.local(p.grad)
                g.mul_(coef.to(g.device))
