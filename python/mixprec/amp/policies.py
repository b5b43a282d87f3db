"""Loss-scale policies of :class:`mixprec.GradScaler` and the checks of its extra arguments.

A policy (:data:`POLICIES`) presets the scale arguments to a training system's rule;
:func:`resolve_options` merges it with the user's arguments and validates them;
:func:`apply_scale_rule` updates the scale on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from .. import ops

__all__ = ["ScalePolicy", "POLICIES", "ScaleRule", "resolve_options", "apply_scale_rule"]

#: torch.amp.GradScaler's defaults: an argument left at them takes the preset's value.
TORCH_INIT_SCALE = 2.0**16
TORCH_GROWTH_INTERVAL = 2000


@dataclass(frozen=True)
class ScalePolicy:
    """The loss-scale rule of a training system, as :class:`~mixprec.GradScaler` presets.

    It supplies ``init_scale`` and ``growth_interval`` left at torch's defaults and
    ``hysteresis``/``min_scale``/``max_scale`` left at ``None``; any other value passed
    wins. Growth and backoff factors are 2.0 and 0.5 in all three systems.
    """

    name: str
    init_scale: float
    growth_interval: int
    hysteresis: int
    min_scale: Optional[float]
    max_scale: Optional[float]


#: The presets. Rules, in terms of :func:`mixprec.ops.update_scale_ext_`:
#:
#: ``"torch"`` -- ``torch.amp.GradScaler``: back off by 0.5 on every overflow, grow by 2 after
#: 2000 clean steps, no bounds, no hysteresis (bitwise ``torch._amp_update_scale_``).
#:
#: ``"deepspeed"`` -- ``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler`` with DeepSpeed's
#: fp16 config defaults (``initial_scale_power=16``, ``loss_scale_window=1000``,
#: ``hysteresis=2``, ``min_loss_scale=1``, ``consecutive_hysteresis=False``): an overflow
#: resets the growth window; while ``cur_hysteresis > 1`` it only decrements it, otherwise
#: ``scale = max(scale / 2, min_loss_scale)``; after ``loss_scale_window`` clean iterations
#: the scale doubles and hysteresis is refilled. Differences: at ``min_loss_scale`` the scale
#: stays (DeepSpeed's ``raise_error_at_min_scale`` needs a host sync), and
#: ``consecutive_hysteresis=True`` is not modelled.
#:
#: ``"megatron"`` -- ``megatron.core.optimizer.grad_scaler.DynamicGradScaler`` with
#: Megatron-LM's defaults (``--initial-loss-scale 2**32``, ``--min-loss-scale 1``,
#: ``--loss-scale-window 1000``, ``--hysteresis 2``): on overflow ``growth_tracker = 0``,
#: ``hysteresis_tracker -= 1`` and, if ``<= 0``, ``scale = max(scale * 0.5, min_scale)``;
#: after ``growth_interval`` clean steps ``scale *= 2`` and the tracker is refilled.
#: Difference: a growth whose result would overflow float32 is skipped here.
POLICIES: dict[str, ScalePolicy] = {
    "torch": ScalePolicy("torch", 2.0**16, 2000, 1, None, None),
    "deepspeed": ScalePolicy("deepspeed", 2.0**16, 1000, 2, 1.0, None),
    "megatron": ScalePolicy("megatron", 2.0**32, 1000, 2, 1.0, None),
}


def resolve_options(policy: str, init_scale: float, growth_interval: int,
                    allow_fp16_grads: Optional[bool], min_scale: Optional[float],
                    max_scale: Optional[float], hysteresis: Optional[int]) -> ScalePolicy:
    """``POLICIES[policy]`` with the constructor's arguments that are not left at their
    defaults, checked: ``ValueError`` for an unknown policy or out-of-range
    bounds/hysteresis, ``TypeError`` for a non-bool ``allow_fp16_grads``."""
    if policy not in POLICIES:
        raise ValueError(
            f"mixprec.GradScaler: policy must be one of {sorted(POLICIES)}, got {policy!r}")
    preset = POLICIES[policy]
    init_scale = preset.init_scale if init_scale == TORCH_INIT_SCALE else init_scale
    if growth_interval == TORCH_GROWTH_INTERVAL:
        growth_interval = preset.growth_interval
    hysteresis = preset.hysteresis if hysteresis is None else hysteresis
    min_scale = preset.min_scale if min_scale is None else min_scale
    max_scale = preset.max_scale if max_scale is None else max_scale
    if allow_fp16_grads is not None and not isinstance(allow_fp16_grads, bool):
        raise TypeError("mixprec.GradScaler: allow_fp16_grads must be None, True or False, "
                        f"got {allow_fp16_grads!r}")
    if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 1:
        raise ValueError(f"mixprec.GradScaler: hysteresis must be an int >= 1, got {hysteresis!r}")
    for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
        if value is not None and not (0.0 < float(value) < math.inf):
            raise ValueError(f"mixprec.GradScaler: {name} must be finite and > 0, got {value!r}")
    if min_scale is not None and max_scale is not None and min_scale > max_scale:
        raise ValueError(
            f"mixprec.GradScaler: min_scale ({min_scale}) must not exceed max_scale ({max_scale})")
    return ScalePolicy(policy, init_scale, growth_interval, int(hysteresis),
                       None if min_scale is None else float(min_scale),
                       None if max_scale is None else float(max_scale))


@dataclass(frozen=True)
class ScaleRule:
    """The constants of one ``update()``: the current growth/backoff factors and growth
    interval (torch's setters change them), the bounds and the hysteresis."""

    growth_factor: float
    backoff_factor: float
    growth_interval: int
    min_scale: Optional[float] = None
    max_scale: Optional[float] = None
    hysteresis: int = 1

    @property
    def extended(self) -> bool:
        """Whether it needs :func:`mixprec.ops.update_scale_ext_` and ``hysteresis_left``."""
        return self.hysteresis != 1 or self.min_scale is not None or self.max_scale is not None


def apply_scale_rule(rule: ScaleRule, scale: Tensor, tracker: Tensor, found: Tensor,
                     hysteresis_left: Optional[Tensor],
                     stats: Optional[tuple[Tensor, Tensor]] = None) -> None:
    """Back off or grow ``scale`` from the iteration's summed inf flag ``found``; no host sync.

    torch's rule (:func:`mixprec.ops.update_scale_`) unless ``rule.extended``
    (:func:`mixprec.ops.update_scale_ext_`, needing ``hysteresis_left``: int32 0-dim on the
    scale's device). Mutates ``scale``, ``tracker`` and ``hysteresis_left``; with ``stats``
    (the ops' ``counts`` and ``prev_scale``) the same kernel counts the update there."""
    counts, prev = (None, None) if stats is None else stats
    if not rule.extended:
        ops.update_scale_(scale, tracker, found, rule.growth_factor, rule.backoff_factor,
                          rule.growth_interval, counts, prev)
        return
    if hysteresis_left is None:
        raise ValueError("apply_scale_rule: an extended rule needs hysteresis_left")
    ops.update_scale_ext_(scale, tracker, hysteresis_left, found, rule.growth_factor,
                          rule.backoff_factor, rule.growth_interval, rule.min_scale,
                          rule.max_scale, rule.hysteresis, counts, prev)
