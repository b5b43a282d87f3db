"""What a scaler hands an optimizer step, below both :mod:`mixprec.amp` and :mod:`mixprec.optim`.

As torch's optimizers take the scaler's tensors without importing the scaler, mixprec's take
one :class:`StepScalars` without importing :mod:`mixprec.amp`: the scaler builds it
(:func:`mixprec.amp.protocol.step_scalars`) and passes its fields as ``step()`` arguments
(:meth:`StepScalars.as_kwargs`); ``FusedOptimizer.step`` makes it one object again for the whole
step (per-device copies where a scalar is elsewhere), and ``EightBitState._run_split``
(``mixprec/optim/_state8.py``, every fused optimizer's bucket step) is the one place that turns
it into the fused ops' arguments. The warning helper of settings without effect
(:func:`warn_ineffective`), which both layers raise, lives here too. This module imports
nothing of mixprec.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from torch import Tensor

__all__ = ["StepScalars", "IneffectiveSettingWarning", "warn_ineffective"]


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


class IneffectiveSettingWarning(UserWarning):
    """A setting was accepted but has no effect (what it says, and what to do)."""


def warn_ineffective(message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` as an :class:`IneffectiveSettingWarning`, attributed ``stacklevel``
    frames up (2: the caller's caller)."""
    warnings.warn(message, IneffectiveSettingWarning, stacklevel=stacklevel + 1)
