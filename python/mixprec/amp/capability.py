"""Which step protocol an optimizer speaks: the scaler's only view of its type.

:class:`mixprec.GradScaler` never tests an optimizer's class; it reads what the optimizer
declares: ``_step_supports_amp_scaling`` (torch's: it skips its own step on ``found_inf``),
``_step_takes_scalars`` (mixprec's: ``step()`` takes ``grad_scale``/``found_inf``/
``clip_coef`` as keywords) or a ``grad_scaler`` parameter of ``step`` (torch's deprecated
protocol). The stepping is :mod:`mixprec.amp.protocol`'s.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

__all__ = ["HOST", "SCALARS", "ATTRIBUTES", "LEGACY", "step_kind", "step_takes_grad_scaler"]

#: :func:`step_kind`'s answers. ``HOST``: an ordinary optimizer (the scaler decides the skip
#: with one host sync); ``SCALARS``: mixprec's protocol; ``ATTRIBUTES``: torch's
#: ``grad_scale``/``found_inf`` attributes; ``LEGACY``: the ``grad_scaler`` argument.
HOST, SCALARS, ATTRIBUTES, LEGACY = "host", "scalars", "attributes", "legacy"


def step_kind(optimizer: torch.optim.Optimizer) -> str:
    """How :meth:`GradScaler.step <mixprec.GradScaler.step>` steps ``optimizer``: one of
    :data:`HOST`, :data:`SCALARS`, :data:`ATTRIBUTES`, :data:`LEGACY`."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return HOST
    if getattr(optimizer, "_step_takes_scalars", False):
        return SCALARS
    return LEGACY if step_takes_grad_scaler(optimizer.step) else ATTRIBUTES


def step_takes_grad_scaler(step: Callable[..., Any]) -> bool:
    """Whether ``step`` (unwrapped) has a ``grad_scaler`` parameter. Nothing is kept."""
    code = getattr(inspect.unwrap(getattr(step, "__func__", step)), "__code__", None)
    if code is None:
        return "grad_scaler" in inspect.signature(step).parameters
    return "grad_scaler" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
