"""``mixprec.cuda.amp.GradScaler``: :class:`mixprec.GradScaler` with the argument
order of ``torch.cuda.amp.GradScaler`` (no ``device``; it is always ``"cuda"``).

It subclasses both :class:`mixprec.GradScaler` and ``torch.cuda.amp.GradScaler``,
so ``isinstance`` checks against either torch class hold. Like torch's class it
is deprecated in favour of ``GradScaler("cuda", ...)`` and says so with the
same ``FutureWarning`` (scripts that filter torch's warning filter this one).
"""

from __future__ import annotations

import torch

from ..amp._legacy import DeviceScaler

__all__ = ["GradScaler"]


class GradScaler(DeviceScaler, torch.cuda.amp.GradScaler):
    """``torch.cuda.amp.GradScaler(init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)`` backed by :class:`mixprec.GradScaler`.

    Positional arguments in torch.cuda.amp's order; the keyword-only extras of
    :class:`mixprec.GradScaler` (``allow_fp16_grads``, ``min_scale``,
    ``max_scale``, ``hysteresis``, ``policy``, ``process_group``) are accepted too.
    Warns ``FutureWarning`` (torch's deprecation message) and, without CUDA,
    ``UserWarning`` and disables itself, as torch's class does.
    """

    _device = "cuda"
