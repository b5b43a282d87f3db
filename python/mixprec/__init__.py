"""mixprec: fused mixed-precision training ops for PyTorch.

Subpackages, by the layers of ARCHITECTURE.md: :mod:`mixprec.ops` (the fused ops),
:mod:`mixprec.amp` (:class:`GradScaler`, :class:`autocast`, precision policies),
:mod:`mixprec.optim` (fused master-weight optimizers), :mod:`mixprec.train`
(:class:`MixedPrecisionTrainer`), :mod:`mixprec.capture` (:func:`capture_step`),
:mod:`mixprec.diagnostics` (:func:`check_fp16_safe`, :func:`health_report`,
:func:`compare_precisions`). Every public name is importable from ``mixprec``. Importing it
loads the compiled kernels (:class:`ImportError` when they are missing or fail to load, or
torch is older than 2.11; a warning when torch has CUDA but mixprec's CUDA kernels cannot
load).
"""

from __future__ import annotations

from . import amp, capture, diagnostics, ops, optim, train
from ._cmake import cmake_prefix_path, has_cpp_package
from ._extension import build_info, has_cuda_kernels
from ._version import __version__
from .amp import *  # noqa: F403  (every name of amp.__all__)
from .capture import capture_step
from .diagnostics import *  # noqa: F403  (every name of diagnostics.__all__)
from .train import *  # noqa: F403  (every name of train.__all__)

__all__ = ["__version__", "build_info", "cmake_prefix_path", "has_cpp_package",
           "has_cuda_kernels", "ops", "amp", "optim", "train", "capture", "capture_step",
           "diagnostics", *amp.__all__, *train.__all__, *diagnostics.__all__]
