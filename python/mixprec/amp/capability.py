"""Which of the step protocols an optimizer speaks: the scaler's only view of its type.

:class:`mixprec.GradScaler` never tests an optimizer's class. It reads what the
optimizer declares:

* ``_step_supports_amp_scaling`` (torch's flag): the optimizer skips its own step on
  the device when ``found_inf`` is set, so the scaler never syncs to decide;
* ``_step_takes_scalars`` (mixprec's one extension of it, declared by
  :class:`mixprec.optim.Adam`, ``AdamW`` and ``SGD``): with the flag above, ``step()``
  takes ``grad_scale``/``found_inf``/``clip_coef`` as keyword arguments
  (:func:`mixprec.amp.protocol.step_direct`) instead of torch's attributes;
* a ``grad_scaler`` parameter of ``step`` (torch's deprecated protocol).

:func:`step_kind` answers all three at once, before the scaler's inf check; the
stepping itself is :mod:`mixprec.amp.protocol`'s. The C++ twin tests
``dynamic_cast<FusedOptimizer*>``.
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
    """Whether ``step`` has a ``grad_scaler`` parameter (torch's deprecated protocol): the
    argument names of its code object (torch's step wrappers unwrapped), or
    ``inspect.signature`` for a callable without one. Nothing is kept."""
    code = getattr(inspect.unwrap(getattr(step, "__func__", step)), "__code__", None)
    if code is None:
        return "grad_scaler" in inspect.signature(step).parameters
    return "grad_scaler" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
