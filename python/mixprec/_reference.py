"""Pure-PyTorch versions of every mixprec op.

Two jobs: the oracle the tests compare the kernels against, and the fallback
:mod:`mixprec.ops` uses when the compiled extension is missing or has no
kernel for a device. Each function has the op's exact signature and
semantics, validates its arguments with the same rules, never syncs with the
host (everything stays in device tensors) and is bitwise equal to the kernel
for the same inputs.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_state(op: str, name: str, t: Tensor, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"mixprec.{op}: {name} must be a Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise RuntimeError(f"mixprec.{op}: {name} must be a dense (strided) tensor, got {t.layout}")
    if t.dtype != dtype:
        raise RuntimeError(f"mixprec.{op}: {name} must be a {dtype} tensor, got {t.dtype}")
    if t.numel() != 1:
        raise RuntimeError(
            f"mixprec.{op}: {name} must be a one-element tensor, got shape {list(t.shape)}"
        )
    if t.device != device:
        raise RuntimeError(
            f"mixprec.{op}: {name} must be on {device} (the device of found_inf), got {t.device}"
        )


def _check_list(op: str, name: str, tensors: Sequence[Tensor], device: torch.device) -> None:
    for i, t in enumerate(tensors):
        if t.layout != torch.strided:
            raise RuntimeError(
                f"mixprec.{op}: {name}[{i}] must be a dense (strided) tensor, got layout "
                f"{t.layout}"
            )
        if t.dtype not in _FLOATS:
            raise RuntimeError(
                f"mixprec.{op}: {name}[{i}] must be float32, float16, bfloat16 or float64, "
                f"got {t.dtype}"
            )
        if t.device != device:
            raise RuntimeError(
                f"mixprec.{op}: {name}[{i}] is on {t.device} but found_inf is on {device}; "
                "call the op once per device"
            )


def _any_nonfinite(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    flags = [(~torch.isfinite(t)).any() for t in tensors if t.numel() > 0]
    if flags:
        hit = torch.stack(flags).any().to(found_inf.dtype).reshape(found_inf.shape)
        found_inf.copy_(torch.maximum(found_inf, hit))


def unscale_and_check_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """Reference of ``torch.ops.mixprec.unscale_and_check_`` (see :mod:`mixprec.ops`)."""
    op = "unscale_and_check_"
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_state(op, "inv_scale", inv_scale, torch.float32, found_inf.device)
    _check_list(op, "grads", grads, found_inf.device)
    _any_nonfinite(grads, found_inf)
    is_one = inv_scale.reshape(()) == 1.0
    for g in grads:
        if g.numel() == 0:
            continue
        math = _opmath(g.dtype)
        v = g.to(math)
        g.copy_(torch.where(is_one, v, v * inv_scale.reshape(()).to(math)))


def unscale_and_norm_(
    grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor, norm_type: float = 2.0
) -> Tensor:
    """Reference of ``torch.ops.mixprec.unscale_and_norm_`` (norm accumulated in float64)."""
    op = "unscale_and_norm_"
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_state(op, "inv_scale", inv_scale, torch.float32, found_inf.device)
    _check_list(op, "grads", grads, found_inf.device)
    if not norm_type > 0:
        raise RuntimeError(f"mixprec.{op}: norm_type must be > 0 or inf, got {norm_type}")
    unscale_and_check_(grads, found_inf, inv_scale)
    norms = [
        torch.linalg.vector_norm(g.to(_opmath(g.dtype)).double(), norm_type)
        for g in grads
        if g.numel() > 0
    ]
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=found_inf.device)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type).float()


def check_finite_(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    """Reference of ``torch.ops.mixprec.check_finite_``."""
    op = "check_finite_"
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_list(op, "tensors", tensors, found_inf.device)
    _any_nonfinite(tensors, found_inf)


def _check_update_args(
    op: str,
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_interval: int,
    hysteresis_left: Optional[Tensor] = None,
) -> None:
    dev = scale.device
    _check_state(op, "scale", scale, torch.float32, dev)
    _check_state(op, "growth_tracker", growth_tracker, torch.int32, dev)
    if hysteresis_left is not None:
        _check_state(op, "hysteresis_left", hysteresis_left, torch.int32, dev)
    _check_state(op, "found_inf", found_inf, torch.float32, dev)
    if not 1 <= growth_interval <= 2**31 - 1:
        raise RuntimeError(
            f"mixprec.{op}: growth_interval must be a positive 32-bit integer, got "
            f"{growth_interval}"
        )


def update_scale_(
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> None:
    """Reference of ``torch.ops.mixprec.update_scale_`` (= ``torch._amp_update_scale_``)."""
    _check_update_args("update_scale_", scale, growth_tracker, found_inf, growth_interval)
    s64 = scale.double()
    found = found_inf != 0
    successful = growth_tracker + 1
    at_interval = successful == growth_interval
    grown = (s64 * growth_factor).float()
    backed = (s64 * backoff_factor).float()
    grow = at_interval & torch.isfinite(grown)
    new_scale = torch.where(found, backed, torch.where(grow, grown, scale))
    zero = torch.zeros_like(growth_tracker)
    new_tracker = torch.where(found | at_interval, zero, successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)


def update_scale_ext_(
    scale: Tensor,
    growth_tracker: Tensor,
    hysteresis_left: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    min_scale: Optional[float] = None,
    max_scale: Optional[float] = None,
    hysteresis: int = 1,
) -> None:
    """Reference of ``torch.ops.mixprec.update_scale_ext_`` (rule in :mod:`mixprec.ops`)."""
    op = "update_scale_ext_"
    _check_update_args(op, scale, growth_tracker, found_inf, growth_interval, hysteresis_left)
    if not (growth_factor > 1.0 and growth_factor != float("inf")):
        raise RuntimeError(f"mixprec.{op}: growth_factor must be a finite number > 1, got "
                           f"{growth_factor}")
    if not 0.0 < backoff_factor < 1.0:
        raise RuntimeError(f"mixprec.{op}: backoff_factor must be in (0, 1), got {backoff_factor}")
    if not 1 <= hysteresis <= 2**31 - 1:
        raise RuntimeError(f"mixprec.{op}: hysteresis must be a positive 32-bit integer, got "
                           f"{hysteresis}")
    lo, hi = 0.0, float("inf")
    for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
        if value is not None and not (0.0 < value < float("inf")):
            raise RuntimeError(f"mixprec.{op}: {name} must be a finite number > 0, got {value}")
    if min_scale is not None:
        lo = float(min_scale)
    if max_scale is not None:
        hi = float(max_scale)
    if lo > hi:
        raise RuntimeError(f"mixprec.{op}: min_scale ({lo}) must not exceed max_scale ({hi})")

    s64 = scale.double()
    found = found_inf != 0
    zero = torch.zeros_like(growth_tracker)
    left = torch.clamp(hysteresis_left - 1, min=0)
    backed = torch.clamp(s64 * backoff_factor, min=lo).float()
    overflow_scale = torch.where(left == 0, backed, scale)

    successful = growth_tracker + 1
    at_interval = successful == growth_interval
    grown64 = s64 * growth_factor
    grow = at_interval & torch.isfinite(grown64.float())
    grown = torch.clamp(grown64, max=hi).float()
    clean_scale = torch.where(grow, grown, scale)
    clean_left = torch.where(at_interval, torch.full_like(hysteresis_left, hysteresis),
                             hysteresis_left)

    scale.copy_(torch.where(found, overflow_scale, clean_scale))
    growth_tracker.copy_(torch.where(found | at_interval, zero, successful))
    hysteresis_left.copy_(torch.where(found, left, clean_left))
