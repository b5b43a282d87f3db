"""Loading of the compiled extension ``mixprec._C`` and what it was built with.

``mixprec._C`` registers every kernel with the dispatcher (``torch.ops.mixprec.*``). A missing
extension, or one built against another torch, raises :class:`ImportError` saying how to
rebuild.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from ._version import __version__

REBUILD_HINT = (
    "Rebuild mixprec against the installed torch: "
    "`pip install --no-build-isolation --force-reinstall --no-deps mixprec` from the source "
    "tree (or `make build` in a checkout)."
)


def _load() -> ModuleType:
    try:
        module = importlib.import_module("mixprec._C")
    except ModuleNotFoundError as exc:
        if exc.name != "mixprec._C":
            raise
        raise ImportError(
            "mixprec: the compiled extension mixprec._C was not found (was the package "
            "built?). " + REBUILD_HINT) from exc
    except (ImportError, OSError) as exc:
        raise ImportError(
            f"mixprec: the compiled extension mixprec._C failed to load with torch "
            f"{torch.__version__}: {exc}\nIt was most likely built against another torch. "
            + REBUILD_HINT) from exc
    built = module.torch_version
    if built != torch.__version__:
        raise ImportError(
            f"mixprec._C was built against torch {built}, but torch {torch.__version__} is "
            f"running. C++ extensions must match the torch they run with. " + REBUILD_HINT)
    return module


#: The loaded extension module ``mixprec._C``.
EXT: ModuleType = _load()


def has_cuda_kernels() -> bool:
    """Whether the loaded extension was compiled with its CUDA kernels."""
    return bool(EXT.cuda_kernels)


def build_info() -> dict[str, Any]:
    """What mixprec was built with and what it runs with.

    A dict: ``version``, ``torch_built``, ``torch_running``, ``cuda_kernels`` (bool),
    ``cuda_version`` (or None), ``cuda_archs`` ("8.0"-style strings), ``cpu_capability``
    ("avx512", "avx2" or "default"), ``cuda_runtime_available`` and ``cuda_device`` (its
    name, or None). Never syncs or allocates on a device.
    """
    gpu = torch.cuda.is_available()
    return {
        "version": __version__,
        "torch_built": EXT.torch_version,
        "torch_running": torch.__version__,
        "cuda_kernels": has_cuda_kernels(),
        "cuda_version": EXT.cuda_version or None,
        "cuda_archs": [a for a in EXT.cuda_archs.split(";") if a],
        "cpu_capability": EXT.cpu_capability(),
        "cuda_runtime_available": gpu,
        "cuda_device": torch.cuda.get_device_name() if gpu else None,
    }
