"""The training loop: :class:`MixedPrecisionTrainer`, :class:`MixedPrecisionManager` and
their configuration.

* :mod:`.config`: :class:`MixedPrecisionConfig`, the modes, precision levels and presets;
* :mod:`.manager`: :class:`MixedPrecisionManager`, the per-mode logic for any loop
  (forward context, ``backward``, ``step``, state, stats);
* :mod:`.modes`: one strategy object per mode, used by the manager;
* :mod:`.adaptive`: the ADAPTIVE mode's controller;
* :mod:`.metrics`: :class:`StepMetrics`, the per-step metrics log, log lines and the plot;
* :mod:`.fp8`: the FP8 level (torchao's Float8 linears), :func:`fp8_available`;
* :mod:`.trainer`: :class:`MixedPrecisionTrainer`, the loop built on the manager;
* :mod:`.checkpoint`: its checkpoints: the format, its checks, atomic save/load (a file or a
  DCP directory), periodic checkpoints, rotation and resuming
  (:func:`~.checkpoint.latest_checkpoint`, :class:`~.checkpoint.IncompleteCheckpointError`).
"""

from __future__ import annotations

from .checkpoint import IncompleteCheckpointError, latest_checkpoint
from .config import HandlingAction, MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel
from .fp8 import fp8_available, fp8_unavailable
from .manager import MixedPrecisionManager
from .trainer import MixedPrecisionTrainer, StepMetrics

__all__ = ["MixedPrecisionConfig", "MixedPrecisionMode", "PrecisionLevel", "HandlingAction",
           "MixedPrecisionManager", "MixedPrecisionTrainer", "StepMetrics", "fp8_available",
           "fp8_unavailable", "latest_checkpoint", "IncompleteCheckpointError"]
