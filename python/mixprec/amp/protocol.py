"""The scaler <-> optimizer protocol of :class:`mixprec.GradScaler`.

How :meth:`GradScaler.step <mixprec.GradScaler.step>` hands an optimizer that skips its own step on
the device (``_step_supports_amp_scaling``) its :class:`~mixprec._step.StepScalars`: mixprec's
optimizers as arguments, as the C++ ``FusedOptimizer::step_with`` (:func:`step_direct`); others
(torch's ``fused=True`` ones) as attributes set for the call (:func:`step_with_attributes`).
Besides torch's ``stage`` and ``found_inf_per_device``, mixprec keeps an :class:`OptimizerRecord`
per optimizer and iteration (under :data:`RECORD_KEY` in ``GradScaler._per_optimizer_states``, so
``update()`` resets it with torch's state) and an :class:`IterationRecord` of the last iteration.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState

from .._step import StepScalars

__all__ = ["RECORD_KEY", "OptimizerRecord", "IterationRecord", "StepScalars", "step_amp_aware",
           "step_scalars", "step_direct", "step_with_attributes", "any_found"]


#: Key of the :class:`OptimizerRecord` in a per-optimizer state dict.
RECORD_KEY = "mixprec"

_MISSING: Any = object()


@dataclass
class OptimizerRecord:
    """mixprec's part of one optimizer's state during one iteration.

    Attributes:
        deferred_unscale: ``clip_grad_norm_`` folded its clip into the step: the stage is
            UNSCALED but the grads still carry the scale (the optimizer gets ``grad_scale``).
        clip_coef: the product of the iteration's folded clips (0-dim float32 on the scale's
            device), or None.
        host_found_inf: whether :meth:`~mixprec.GradScaler.step` found inf/NaN, when it
            synced to decide (ordinary optimizers); else None.
    """

    deferred_unscale: bool = False
    clip_coef: Optional[Tensor] = None
    host_found_inf: Optional[bool] = None


def record_of(state: dict[str, Any]) -> OptimizerRecord:
    """The record of a per-optimizer state dict, created on first use."""
    record = state.get(RECORD_KEY)
    if record is None:
        record = state[RECORD_KEY] = OptimizerRecord()
    return record


#: What :func:`peek_record` answers for a state without a record: shared, never written.
_NO_RECORD = OptimizerRecord()


def peek_record(state: dict[str, Any]) -> OptimizerRecord:
    """The record of a state dict to read, or (it has none) a shared default one: do not
    write to what this returns (:func:`record_of` gives the state's own)."""
    return state.get(RECORD_KEY, _NO_RECORD)


def was_checked(state: dict[str, Any]) -> bool:
    """Whether the optimizer of ``state`` took part in the iteration (an inf check or a step)."""
    return state["stage"] is not OptState.READY or bool(state["found_inf_per_device"])


@dataclass
class IterationRecord:
    """What :meth:`~mixprec.GradScaler.update` keeps of the iteration it closed.

    Attributes:
        states: its per-optimizer states by ``id(optimizer)`` (``found_inf()`` reads them).
        skipped: whether it found inf/NaN, where the host knew without a sync (every checked
            optimizer went through a host-synced ``step()``), else None (``step_was_skipped``
            then reads the flags).
    """

    states: dict[int, dict[str, Any]]
    skipped: Optional[bool] = None


def any_found(flags: Iterable[Tensor], home: torch.device) -> Tensor:
    """``1.0`` if any of the inf ``flags`` is set, else ``0.0``: a fresh 0-dim float32 tensor
    on ``home``. No host sync."""
    moved = [f.to(home, non_blocking=True) for f in flags]
    if not moved:
        return torch.zeros((), dtype=torch.float32, device=home)
    return (sum(moved[1:], moved[0]) > 0).to(torch.float32).reshape(())


def close_iteration(states: dict[int, dict[str, Any]], found: Optional[Tensor]) -> IterationRecord:
    """The record ``update()`` keeps of the iteration whose per-optimizer ``states`` it closes.
    ``found``: the iteration's summed flag (None: no check ran, not skipped). ``skipped`` is
    filled in when known without a sync (every checked optimizer had a host-synced ``step()``).
    """
    states = dict(states)
    skipped: Optional[bool] = None
    if found is None:
        skipped = False
    else:
        checked = [s for s in states.values() if s["found_inf_per_device"]]
        hosts = [peek_record(s).host_found_inf for s in checked]
        if checked and all(h is not None for h in hosts):
            skipped = any(hosts)
    return IterationRecord(states, skipped)


def found_inf(current: dict[int, dict[str, Any]], last: Optional[IterationRecord],
              optimizer: Optional[torch.optim.Optimizer], home: torch.device) -> Tensor:
    """The body of :meth:`mixprec.GradScaler.found_inf`. ``current``: the scaler's per-optimizer
    states; ``last``: the last completed iteration's record, answered from while no optimizer of
    the current one has been checked. No host sync."""
    checked = {k: s for k, s in current.items() if was_checked(s)}
    if checked or last is None:
        states, window, skipped = checked, "in this iteration", None
    else:
        states, window, skipped = last.states, "in the last iteration", last.skipped
    if optimizer is None:
        if not states and last is None:
            raise RuntimeError("GradScaler.found_inf(): no inf check has run yet; call it after "
                               "step(), unscale_() or clip_grad_norm_(), or after update().")
        if skipped is not None:
            return torch.full((), float(skipped), dtype=torch.float32, device=home)
        return any_found((f for s in states.values() for f in s["found_inf_per_device"].values()),
                         home)
    state = states.get(id(optimizer))
    if state is None:
        raise RuntimeError(f"GradScaler.found_inf(): this {type(optimizer).__name__} had no inf "
                           f"check {window}; call found_inf(optimizer) after step(), unscale_() or "
                           "clip_grad_norm_() of it (or after update(), for the iteration update() "
                           "closed).")
    return any_found(state["found_inf_per_device"].values(), home)


def legacy_step(optimizer: torch.optim.Optimizer, grad_scaler: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """torch's deprecated protocol: an amp-aware ``optimizer.step`` with a ``grad_scaler``
    parameter gets the scaler itself (with torch's FutureWarning)."""
    warnings.warn("GradScaler is going to stop passing itself as a keyword argument to the passed "
                  "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                  "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
                  "directly.", FutureWarning, stacklevel=4)
    kwargs["grad_scaler"] = grad_scaler
    return optimizer.step(*args, **kwargs)


def step_amp_aware(optimizer: torch.optim.Optimizer, state: dict[str, Any], scale: Tensor,
                   direct: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """:meth:`GradScaler.step <mixprec.GradScaler.step>` of an optimizer with
    ``_step_supports_amp_scaling`` whose inf check has run (``state`` past READY; ``direct``: it
    takes the scalars as arguments, :data:`mixprec.amp.capability.SCALARS`): step it with the
    scalars. No host sync."""
    scalars = step_scalars(optimizer, state, scale, direct)
    return (step_direct if direct else step_with_attributes)(optimizer, scalars, args, kwargs)


def step_scalars(optimizer: torch.optim.Optimizer, state: dict[str, Any], scale: Tensor,
                 direct: bool) -> StepScalars:
    """The scalars of ``optimizer``'s step, from its per-optimizer ``state``. No host sync.

    ``grad_scale`` is the scale, or None when ``unscale_`` already ran (and was not a folded clip);
    a ``grad_scale``/``clip_coef`` the user set on the optimizer beforehand is multiplied in, as
    torch does for ``grad_scale``. ``found_inf`` is the sum of the per-device flags on the scale's
    device; when the optimizer has no gradients, a zero tensor for the ``direct`` protocol and the
    int 0 for the attribute one (as torch passes it).
    """
    flags = [f.to(scale.device, non_blocking=True)
             for f in state["found_inf_per_device"].values()]
    found_inf: Union[int, Tensor]
    if flags:
        found_inf = sum(flags[1:], flags[0])  # flags[0] itself when alone
    else:
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device) if direct else 0
    record = peek_record(state)
    preset = getattr(optimizer, "grad_scale", _MISSING)
    grad_scale: Optional[Tensor]
    if state["stage"] is OptState.UNSCALED and not record.deferred_unscale:
        grad_scale = None if preset is _MISSING else preset
    else:
        grad_scale = scale if preset is _MISSING else scale * preset
    clip_coef = record.clip_coef
    if clip_coef is not None:
        user_coef = optimizer.__dict__.get("clip_coef")
        if user_coef is not None:
            clip_coef = clip_coef * user_coef
    return StepScalars(grad_scale, found_inf, clip_coef)


def step_direct(optimizer: torch.optim.Optimizer, scalars: StepScalars, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """``optimizer.step(*args, grad_scale=, found_inf=, clip_coef=, **kwargs)``: mixprec's protocol
    (keyword arguments passed to ``scaler.step`` win over the scaler's)."""
    return optimizer.step(*args, **{**scalars.as_kwargs(), **kwargs})


def step_with_attributes(optimizer: torch.optim.Optimizer, scalars: StepScalars,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's protocol, for optimizers other than mixprec's: set ``optimizer.grad_scale`` and
    ``found_inf``, step, delete them (also when ``step`` raises)."""
    optimizer.grad_scale = scalars.grad_scale  # type: ignore[attr-defined]
    optimizer.found_inf = scalars.found_inf  # type: ignore[attr-defined]
    try:
        return optimizer.step(*args, **kwargs)
    finally:
        for name in ("grad_scale", "found_inf"):
            if name in optimizer.__dict__:
                delattr(optimizer, name)
