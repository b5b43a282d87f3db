"""The training loop: :class:`MixedPrecisionTrainer` and its configuration.

* :mod:`.config`: :class:`MixedPrecisionConfig`, the modes, precision levels and presets;
* :mod:`.trainer`: :class:`MixedPrecisionTrainer` and :class:`StepMetrics`.
"""

from __future__ import annotations

from .config import HandlingAction, MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel
from .trainer import MixedPrecisionTrainer, StepMetrics

__all__ = [
    "MixedPrecisionConfig",
    "MixedPrecisionMode",
    "PrecisionLevel",
    "HandlingAction",
    "MixedPrecisionTrainer",
    "StepMetrics",
]
