"""What a scaler hands an optimizer step, below both :mod:`mixprec.amp` and :mod:`mixprec.optim`.

As torch's optimizers take the scaler's tensors without importing the scaler, mixprec's take
one :class:`StepScalars` without importing :mod:`mixprec.amp`: the scaler builds it
(:func:`mixprec.amp.protocol.step_scalars`), ``FusedOptimizer.step`` takes its fields as
``step()`` arguments and rebuilds nothing but the per-device copies, and :func:`op_kwargs` is
the one place that turns it into the fused ops' arguments. The warning helper of settings
without effect (:func:`warn_ineffective`), which both layers raise, lives here too. This
module imports nothing of mixprec.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch
from torch import Tensor

__all__ = ["StepScalars", "op_kwargs", "IneffectiveSettingWarning", "warn_ineffective"]


@dataclass(frozen=True)
class StepScalars:
    """The scalars a scaler hands one optimizer step: the fused optimizer ops'
    ``grad_scale``/``found_inf``/``clip_coef`` arguments, left on the device (no sync). The C++
    twin is ``mixprec::optim::StepScalars``, with the same fields.

    Attributes:
        grad_scale: the loss scale the grads still carry (float32, one element), or ``None``.
        found_inf: 1.0 when a grad held inf/NaN: the step is skipped (a float32 one-element
            tensor; the int 0 where torch's attribute protocol passes one).
        clip_coef: the folded clip's coefficient (float32, one element), or ``None``.
    """

    grad_scale: Optional[Tensor] = None
    found_inf: Union[int, Tensor, None] = None
    clip_coef: Optional[Tensor] = None

    def as_kwargs(self) -> Dict[str, Any]:
        """The fields by name, as ``step()``'s and the ops' keyword arguments (attribute reads
        only, which every torch.compile of the supported torch releases traces; ``vars()`` of a
        frozen dataclass is not traced by torch 2.11's)."""
        return {"grad_scale": self.grad_scale, "found_inf": self.found_inf,
                "clip_coef": self.clip_coef}

    def check(self, where: str) -> None:
        """``RuntimeError`` naming ``where`` and the field unless each given field is a float32
        tensor with one element (what the fused ops take)."""
        for name, t in (("grad_scale", self.grad_scale), ("found_inf", self.found_inf),
                        ("clip_coef", self.clip_coef)):
            if t is not None and not (isinstance(t, Tensor) and t.dtype == torch.float32
                                      and t.numel() == 1):
                got = (f"{t.dtype} of shape {list(t.shape)}" if isinstance(t, Tensor)
                       else type(t).__name__)
                raise RuntimeError(f"{where}: {name} must be a float32 tensor with one "
                                   f"element, got {got}")

    def on(self, device: torch.device) -> StepScalars:
        """These scalars on ``device`` (copied ``non_blocking`` where elsewhere; ``self`` when
        every tensor is there already). No host sync."""
        given = (self.grad_scale, self.found_inf, self.clip_coef)
        if all(not isinstance(t, Tensor) or t.device == device for t in given):
            return self
        return StepScalars(*(t if not isinstance(t, Tensor) or t.device == device
                             else t.to(device, non_blocking=True) for t in given))


def op_kwargs(scalars: StepScalars, lists: Dict[str, Any], args: Dict[str, Any]) -> Dict[str, Any]:
    """The keyword arguments of one fused optimizer op call (``mixprec.ops.fused_adam_`` ...):
    the tensor ``lists`` and option ``args`` of the step, and the ``scalars``."""
    return {**lists, **args, "grad_scale": scalars.grad_scale,
            "found_inf": scalars.found_inf, "clip_coef": scalars.clip_coef}


class IneffectiveSettingWarning(UserWarning):
    """A setting was accepted but has no effect (what it says, and what to do)."""


def warn_ineffective(message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` as an :class:`IneffectiveSettingWarning`, attributed ``stacklevel``
    frames up (2: the caller's caller)."""
    warnings.warn(message, IneffectiveSettingWarning, stacklevel=stacklevel + 1)
