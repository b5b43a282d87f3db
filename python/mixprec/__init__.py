"""mixprec: fused mixed-precision training ops for PyTorch.

Importing this package loads the compiled kernels (``torch.ops.mixprec.*``);
see :mod:`mixprec._extension` for what happens when they are missing.
"""

from __future__ import annotations

from . import cuda, ops, optim
from ._cmake import cmake_prefix_path
from ._extension import (
    MixprecExtensionWarning,
    build_info,
    has_cuda_kernels,
    has_extension,
)
from ._patch import is_torch_patched, patch_torch, unpatch_torch
from ._version import __version__
from .autocast import (
    DEFAULT_FP32_MODULES,
    PolicyHandle,
    PrecisionPolicy,
    apply_policy,
    autocast,
    remove_policy,
    resolve_precision,
)
from .config import HandlingAction, MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel
from .diagnostics import HealthReport, check_fp16_safe, compare_precisions, health_report
from .grad_scaler import GradScaler
from .stats import ScalerStats
from .trainer import MixedPrecisionTrainer, StepMetrics

__all__ = [
    "__version__",
    "MixprecExtensionWarning",
    "build_info",
    "cmake_prefix_path",
    "has_cuda_kernels",
    "has_extension",
    "ops",
    "optim",
    "cuda",
    "GradScaler",
    "ScalerStats",
    "patch_torch",
    "unpatch_torch",
    "is_torch_patched",
    "autocast",
    "resolve_precision",
    "PrecisionPolicy",
    "PolicyHandle",
    "apply_policy",
    "remove_policy",
    "DEFAULT_FP32_MODULES",
    "MixedPrecisionConfig",
    "MixedPrecisionMode",
    "PrecisionLevel",
    "HandlingAction",
    "MixedPrecisionTrainer",
    "StepMetrics",
    "check_fp16_safe",
    "health_report",
    "HealthReport",
    "compare_precisions",
]
