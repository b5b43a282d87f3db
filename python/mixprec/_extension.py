"""Loading of the compiled extension ``mixprec._C`` and what it was built with.

Importing :mod:`mixprec` loads ``mixprec._C``, which registers every kernel
with the PyTorch dispatcher (``torch.ops.mixprec.*``). Three outcomes:

* it loads and matches the running torch: the fast kernels are used;
* it was built against a different torch: :class:`ImportError` saying how to
  rebuild (a mismatched binary would crash or misbehave, never silently work);
* it is missing (a source checkout that was never built, a failed build): a
  :class:`MixprecExtensionWarning` is issued once and :mod:`mixprec.ops` runs
  the pure-PyTorch reference kernels instead (correct, slower).
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType
from typing import Any, Optional

import torch

from ._version import __version__

REBUILD_HINT = (
    "Rebuild mixprec against the installed torch: "
    "`pip install --no-build-isolation --force-reinstall --no-deps mixprec` from the source "
    "tree (or `make build` in a checkout)."
)


class MixprecExtensionWarning(UserWarning):
    """Issued once when ``mixprec._C`` cannot be found and the slow path is used."""


def _flag_off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("0", "false", "no", "off")


#: Whether :mod:`mixprec.ops` enters the ops through the extension's direct entry
#: (``mixprec._C.fast_<op>``, csrc/python_entry/fast_call.h: the one part of mixprec that reads
#: CPython and torch-binding internals). ``MIXPREC_FAST_ENTRY=0``, read once here at
#: import, routes every op through ``torch.ops.mixprec.*`` instead: the same kernels and
#: results, a slower host path (every list element converted to an IValue).
FAST_ENTRY: bool = not _flag_off("MIXPREC_FAST_ENTRY")


def _load() -> Optional[ModuleType]:
    if os.environ.get("MIXPREC_DISABLE_EXTENSION", "") == "1":
        warnings.warn(
            "mixprec: MIXPREC_DISABLE_EXTENSION=1, so the compiled kernels are not loaded; "
            "mixprec.ops runs the pure-PyTorch reference implementation (slow).",
            MixprecExtensionWarning,
            stacklevel=3,
        )
        return None
    try:
        module = importlib.import_module("mixprec._C")
    except ModuleNotFoundError as exc:
        if exc.name != "mixprec._C":
            raise
        warnings.warn(
            "mixprec: the compiled extension mixprec._C was not found (was the package built?). "
            "mixprec.ops falls back to the pure-PyTorch reference implementation, which is "
            "correct but slow. " + REBUILD_HINT,
            MixprecExtensionWarning,
            stacklevel=3,
        )
        return None
    except (ImportError, OSError) as exc:
        raise ImportError(
            f"mixprec: the compiled extension mixprec._C failed to load with torch "
            f"{torch.__version__}: {exc}\nIt was most likely built against another torch. "
            + REBUILD_HINT
        ) from exc
    built = module.torch_version
    if built != torch.__version__:
        raise ImportError(
            f"mixprec._C was built against torch {built}, but torch {torch.__version__} is "
            f"running. C++ extensions must match the torch they run with. " + REBUILD_HINT
        )
    return module


#: The loaded extension module ``mixprec._C``; None when it is missing or disabled (the
#: reference kernels run).
EXT: Optional[ModuleType] = _load()


def has_extension() -> bool:
    """Whether the compiled kernels are loaded (False: the reference slow path is used)."""
    return EXT is not None


def has_cuda_kernels() -> bool:
    """Whether the loaded extension was compiled with its CUDA kernels."""
    return EXT is not None and bool(EXT.cuda_kernels)


def build_info() -> dict[str, Any]:
    """What mixprec was built with and what it runs with.

    Returns a dict with keys ``version``, ``extension_loaded``, ``torch_built``
    (torch version the extension was compiled against, or None),
    ``torch_running``, ``cuda_kernels`` (bool), ``cuda_version`` (toolkit of the
    build, or None), ``cuda_archs`` (list of "8.0"-style strings),
    ``cpu_capability`` (the CPU kernel set picked for this machine: "avx512",
    "avx2" or "default"; None without the extension), ``cuda_runtime_available``
    (a GPU is usable now) and ``cuda_device`` (its name, or None). Never syncs
    or allocates on a device.
    """
    gpu = torch.cuda.is_available()
    return {
        "version": __version__,
        "extension_loaded": EXT is not None,
        "torch_built": EXT.torch_version if EXT is not None else None,
        "torch_running": torch.__version__,
        "cuda_kernels": has_cuda_kernels(),
        "cuda_version": (EXT.cuda_version or None) if EXT is not None else None,
        "cuda_archs": [a for a in (EXT.cuda_archs.split(";") if EXT is not None else []) if a],
        "cpu_capability": EXT.cpu_capability() if EXT is not None else None,
        "cuda_runtime_available": gpu,
        "cuda_device": torch.cuda.get_device_name() if gpu else None,
    }
