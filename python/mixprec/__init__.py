"""mixprec: fused mixed-precision training ops for PyTorch.

Importing this package loads the compiled kernels (``torch.ops.mixprec.*``);
see :mod:`mixprec._extension` for what happens when they are missing.
"""

from __future__ import annotations

from . import cuda, ops
from ._extension import (
    MixprecExtensionWarning,
    build_info,
    has_cuda_kernels,
    has_extension,
)
from ._patch import is_torch_patched, patch_torch, unpatch_torch
from ._version import __version__
from .grad_scaler import GradScaler
from .stats import ScalerStats

__all__ = [
    "__version__",
    "MixprecExtensionWarning",
    "build_info",
    "has_cuda_kernels",
    "has_extension",
    "ops",
    "cuda",
    "GradScaler",
    "ScalerStats",
    "patch_torch",
    "unpatch_torch",
    "is_torch_patched",
]
