"""mixprec: fused mixed-precision training ops for PyTorch.

Importing this package loads the compiled kernels (``torch.ops.mixprec.*``);
see :mod:`mixprec._extension` for what happens when they are missing.
"""

from __future__ import annotations

from . import ops
from ._extension import (
    MixprecExtensionWarning,
    build_info,
    has_cuda_kernels,
    has_extension,
)
from ._version import __version__

__all__ = [
    "__version__",
    "MixprecExtensionWarning",
    "build_info",
    "has_cuda_kernels",
    "has_extension",
    "ops",
]
