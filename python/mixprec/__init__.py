"""mixprec: fused mixed-precision training ops for PyTorch.

The subpackages follow the layers of ARCHITECTURE.md:

* :mod:`mixprec.ops`: the fused ops (``torch.ops.mixprec.*``);
* :mod:`mixprec.amp`: :class:`GradScaler`, :class:`autocast`, precision policies;
* :mod:`mixprec.optim`: the fused master-weight optimizers;
* :mod:`mixprec.train`: :class:`MixedPrecisionTrainer` and its configuration.

Every public name is importable from ``mixprec`` itself. Importing this package
loads the compiled kernels (:mod:`mixprec._extension`; :class:`ImportError` when they
are missing or were built against another torch).
"""

from __future__ import annotations

from . import amp, ops, optim, train
from . import capture as capture  # one CUDA graph per step; see __all__ below
from ._cmake import cmake_prefix_path
from ._extension import build_info, has_cuda_kernels
from ._version import __version__
from .amp import *  # noqa: F403  (every name of amp.__all__)
from .capture import capture_step as capture_step
from .train import *  # noqa: F403  (every name of train.__all__)

# mixprec.capture and capture_step are not in __all__ yet: tests/project/test_public_api.py lists
# the public names and is to be edited deliberately (with them) by its owner.
__all__ = [
    "__version__",
    "build_info",
    "cmake_prefix_path",
    "has_cuda_kernels",
    "ops",
    "amp",
    "optim",
    "train",
    *amp.__all__,
    *train.__all__,
]
