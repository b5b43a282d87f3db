"""Grad mode off for the per-step host paths, at a third of ``torch.no_grad()``'s cost.

``with torch.no_grad():`` costs about 1.5 us on the host (its class chain checks for
TorchScript and builds two objects); the step of a mixprec optimizer over ten tensors costs
about 10 us in all. The scaler's passes that write grads (:mod:`mixprec.amp.grads`,
:mod:`mixprec.amp.clipping`) use :func:`no_grad` here instead: the same grad-mode switch,
``torch._C._set_grad_enabled``, that ``torch.no_grad`` makes, without the rest
(benchmarks/RESULTS.md, "fifth session", has the figures). Under ``torch.compile`` it is
``torch.no_grad()`` itself, which dynamo knows.

Not a decorator and not for ``torch.jit``; thread-local as grad mode is.
"""

from __future__ import annotations

from typing import Any, Union

import torch

__all__ = ["is_grad_enabled", "set_grad_enabled", "no_grad"]

# (bound at import: read on every step)
is_grad_enabled = torch.is_grad_enabled
set_grad_enabled = torch._C._set_grad_enabled
_IS_COMPILING = torch.compiler.is_compiling


class _GradOff:
    """``with _GradOff():`` runs its block with grad mode off and restores it after."""

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = is_grad_enabled()
        set_grad_enabled(False)

    def __exit__(self, *exc: Any) -> None:
        set_grad_enabled(self._was)


def no_grad() -> Union[_GradOff, torch.no_grad]:
    """A context manager that turns grad mode off for its block (``torch.no_grad()`` while
    torch.compile traces)."""
    return torch.no_grad() if _IS_COMPILING() else _GradOff()
