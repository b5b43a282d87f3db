"""The per-device scaler classes ``mixprec.patch_torch()`` puts behind
``torch.cuda.amp.GradScaler`` and ``torch.cpu.amp.GradScaler``: torch's per-device argument
order, torch's deprecation warning, subclasses of torch's class too.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch

from .grad_scaler import GradScaler

__all__ = ["DeviceScaler", "CudaGradScaler", "CpuGradScaler"]


class DeviceScaler(GradScaler):
    """:class:`mixprec.GradScaler` bound to ``_device``, with the argument order of
    ``torch.<_device>.amp.GradScaler(init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)``; the keyword-only extras of :class:`mixprec.GradScaler`
    are accepted too. Warns ``FutureWarning`` with torch's deprecation message."""

    _device: ClassVar[str]

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 **extras: Any) -> None:
        device = self._device
        warnings.warn(f"`torch.{device}.amp.GradScaler(args...)` is deprecated. "
                      f"Please use `torch.amp.GradScaler('{device}', args...)` instead.",
                      FutureWarning, stacklevel=2)
        GradScaler.__init__(self, device, init_scale, growth_factor, backoff_factor,
                            growth_interval, enabled, **extras)


class CudaGradScaler(DeviceScaler, torch.cuda.amp.GradScaler):
    """mixprec's scaler with ``torch.cuda.amp.GradScaler``'s argument order (without CUDA it
    warns and disables itself, as torch's)."""

    _device = "cuda"


class CpuGradScaler(DeviceScaler, torch.cpu.amp.GradScaler):
    """mixprec's scaler with ``torch.cpu.amp.GradScaler``'s argument order."""

    _device = "cpu"
