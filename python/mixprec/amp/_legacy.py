"""The constructor shared by the per-device scaler classes.

``mixprec.cuda.amp.GradScaler`` and the class ``mixprec.patch_torch()`` puts
behind ``torch.cpu.amp.GradScaler`` both take torch's per-device argument
order (no ``device``) and warn torch's deprecation message; they differ only
in the device, a class attribute here.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from .grad_scaler import GradScaler

__all__ = ["DeviceScaler"]


class DeviceScaler(GradScaler):
    """:class:`mixprec.GradScaler` bound to ``_device``, with the argument order of
    ``torch.<_device>.amp.GradScaler(init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)``; the keyword-only extras of :class:`mixprec.GradScaler`
    are accepted too. Warns ``FutureWarning`` with torch's deprecation message."""

    _device: ClassVar[str]

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        **extras: Any,
    ) -> None:
        device = self._device
        warnings.warn(
            f"`torch.{device}.amp.GradScaler(args...)` is deprecated. "
            f"Please use `torch.amp.GradScaler('{device}', args...)` instead.",
            FutureWarning,
            stacklevel=2,
        )
        GradScaler.__init__(
            self,
            device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
            **extras,
        )
