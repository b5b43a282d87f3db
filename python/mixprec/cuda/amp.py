"""``mixprec.cuda.amp.GradScaler``: :class:`mixprec.GradScaler` with the argument
order of ``torch.cuda.amp.GradScaler`` (no ``device``; it is always ``"cuda"``).

It subclasses both :class:`mixprec.GradScaler` and ``torch.cuda.amp.GradScaler``,
so ``isinstance`` checks against either torch class hold. Like torch's class it
is deprecated in favour of ``GradScaler("cuda", ...)`` and says so with the
same ``FutureWarning`` (scripts that filter torch's warning filter this one).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..amp.grad_scaler import GradScaler as _GradScaler

__all__ = ["GradScaler"]

_DEPRECATION = (
    "`torch.cuda.amp.GradScaler(args...)` is deprecated. "
    "Please use `torch.amp.GradScaler('cuda', args...)` instead."
)


class GradScaler(_GradScaler, torch.cuda.amp.GradScaler):
    """``torch.cuda.amp.GradScaler(init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)`` backed by :class:`mixprec.GradScaler`.

    Positional arguments in torch.cuda.amp's order; the keyword-only extras of
    :class:`mixprec.GradScaler` (``allow_fp16_grads``, ``min_scale``,
    ``max_scale``, ``hysteresis``, ``policy``, ``process_group``) are accepted too.
    Warns ``FutureWarning`` (torch's deprecation message) and, without CUDA,
    ``UserWarning`` and disables itself, as torch's class does.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        **extras: Any,
    ) -> None:
        warnings.warn(_DEPRECATION, FutureWarning, stacklevel=2)
        _GradScaler.__init__(
            self,
            "cuda",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
            **extras,
        )


