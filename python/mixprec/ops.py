"""Typed wrappers over ``torch.ops.mixprec.*``.

Every op works on CPU and CUDA tensors, never synchronises with the host, and
takes its step-varying scalars (``found_inf``, ``inv_scale``, ``scale``, ...)
as one-element device tensors, so a training step built from them can be
captured in a CUDA graph and traced by ``torch.compile(fullgraph=True)``.

An op that rejects its arguments raises ``RuntimeError`` naming the argument
and leaves every tensor unchanged.

When the compiled extension is missing, or has no kernel for the tensors'
device (a CPU-only build given CUDA tensors), the op runs the pure-PyTorch
reference in :mod:`mixprec._reference` instead: same results, slower, and a
warning the first time.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from . import _reference
from ._extension import MixprecExtensionWarning, has_cuda_kernels, has_extension

__all__ = ["unscale_and_check_", "check_finite_", "update_scale_", "update_scale_ext_"]

_warned_devices: set[str] = set()


def _compiled_kernels_for(device: torch.device) -> bool:
    if not has_extension():
        return False
    if device.type == "cpu" or device.type == "meta":
        return True
    if device.type == "cuda" and has_cuda_kernels():
        return True
    if device.type not in _warned_devices:
        _warned_devices.add(device.type)
        warnings.warn(
            f"mixprec: this build has no {device.type} kernels; ops on {device.type} tensors run "
            "the pure-PyTorch reference (slow). Rebuild with a CUDA toolkit to get them.",
            MixprecExtensionWarning,
            stacklevel=3,
        )
    return False


def _pick(name: str, device: torch.device) -> Callable[..., None]:
    if _compiled_kernels_for(device):
        return getattr(torch.ops.mixprec, name)
    return getattr(_reference, name)


def unscale_and_check_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """Unscale gradients in place and record whether any was inf or NaN.

    For every ``g`` in ``grads``: ``g *= inv_scale`` (in float32 for fp16/bf16
    grads, float64 for float64) and, if any input value was inf or NaN,
    ``found_inf`` is set to 1.0. ``found_inf`` is never cleared: zero it before
    the first call of a step.

    Bitwise equal to ``torch._amp_foreach_non_finite_check_and_unscale_``
    wherever that accepts the input; additionally takes bfloat16 grads and
    lists mixing float32/float16/bfloat16/float64 (one call, grouped inside).

    Args:
        grads: tensors of any shape and strides (non-dense ones are processed
            through a contiguous copy), all on one device. Mutated.
        found_inf: float32 tensor with one element on the grads' device. Mutated.
        inv_scale: float32 tensor with one element on that device (``1 / scale``,
            taken in float64 and rounded to float32 as torch does). Read only.

    No host sync. One kernel launch per dtype present (more only past ~1,500
    tensors or ~80M elements per dtype) on CUDA; one parallel pass on CPU.
    """
    _pick("unscale_and_check_", found_inf.device)(grads, found_inf, inv_scale)


def check_finite_(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    """Set ``found_inf`` to 1.0 if any value in ``tensors`` is inf or NaN.

    Read-only on ``tensors`` (unlike torch's check-and-unscale with scale 1,
    which writes every element back): meant for optimizers that unscale inside
    their own kernel. Same argument rules as :func:`unscale_and_check_`;
    ``found_inf`` is mutated, never cleared. No host sync.
    """
    _pick("check_finite_", found_inf.device)(tensors, found_inf)


def update_scale_(
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> None:
    """Update the loss scale in place, exactly as ``torch._amp_update_scale_``.

    If ``found_inf`` is non-zero: ``scale *= backoff_factor`` and the tracker
    resets. Otherwise the tracker counts up; when it reaches
    ``growth_interval`` the scale is multiplied by ``growth_factor`` (skipped
    if the result would not be finite in float32) and the tracker resets.
    Products are taken in float64 and rounded to float32.

    Args:
        scale: float32, one element. Mutated.
        growth_tracker: int32, one element, same device. Mutated.
        found_inf: float32, one element, same device. Read only.
        growth_factor, backoff_factor: plain floats (not validated, as in torch).
        growth_interval: positive int.

    Runs on the tensors' device (a one-thread kernel on CUDA); no host sync.
    """
    _pick("update_scale_", scale.device)(
        scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval
    )


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
    """:func:`update_scale_` with hysteresis and bounds on the scale.

    The rule (products and clamps in float64, one rounding to float32):

    * overflow (``found_inf != 0``): ``growth_tracker = 0``;
      ``hysteresis_left = max(hysteresis_left - 1, 0)``; if that is 0,
      ``scale = max(scale * backoff_factor, min_scale)``. So the first
      ``hysteresis - 1`` overflows since the last growth are absorbed and every
      later one backs off (DeepSpeed's and Megatron-LM's rule).
    * clean step: ``growth_tracker += 1``; when it reaches ``growth_interval``:
      ``scale = min(scale * growth_factor, max_scale)`` unless the grown scale is
      not finite in float32, ``growth_tracker = 0`` and
      ``hysteresis_left = hysteresis`` (refilled).

    With ``hysteresis=1`` and no bounds this is bitwise :func:`update_scale_`.
    Initialise ``hysteresis_left`` to ``hysteresis``.

    Args:
        scale: float32, one element. Mutated.
        growth_tracker, hysteresis_left: int32, one element each, same device. Mutated.
        found_inf: float32, one element, same device. Read only.
        growth_factor: finite, > 1. backoff_factor: in (0, 1).
        growth_interval, hysteresis: positive ints.
        min_scale, max_scale: optional finite positive bounds, min <= max.

    No host sync.
    """
    _pick("update_scale_ext_", scale.device)(
        scale,
        growth_tracker,
        hysteresis_left,
        found_inf,
        growth_factor,
        backoff_factor,
        growth_interval,
        min_scale,
        max_scale,
        hysteresis,
    )
