"""The step scalars: what a scaler hands one optimizer step, and what the fused optimizer
ops take as their ``grad_scale``/``found_inf``/``clip_coef`` arguments. One type for both
sides (the scaler, :mod:`mixprec.amp.protocol`, and the optimizers, :mod:`mixprec.optim`),
in the op layer below them; C++ has its twin, ``mixprec::optim::StepScalars``, with the
same field names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from torch import Tensor

__all__ = ["StepScalars"]


@dataclass(frozen=True)
class StepScalars:
    """The scalars of one optimizer step (all optional, all left on the device: no sync).

    Attributes:
        grad_scale: the loss scale the grads still carry (float32, one element), or
            ``None`` when they are unscaled.
        found_inf: 1.0 when a grad held inf/NaN: the step is skipped (a float32
            one-element tensor; the int 0 where torch's attribute protocol passes one).
        clip_coef: the folded clip's coefficient (float32, one element), or ``None``.
    """

    grad_scale: Optional[Tensor] = None
    found_inf: Union[int, Tensor, None] = None
    clip_coef: Optional[Tensor] = None
