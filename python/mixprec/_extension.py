"""Loading of mixprec's op libraries and what they were built with.

The kernels live in shared libraries built on torch's stable ABI (``TORCH_TARGET_VERSION``
2.11), loaded with :func:`torch.ops.load_library`: ``_ops`` (the schemas, the CPU kernels and
a description of the build, read through C functions with :mod:`ctypes`) and, where torch has
CUDA, ``_ops_cuda``. One build loads into every torch from 2.11 on. A missing library, or a
torch older than 2.11, raises :class:`ImportError` saying what to do.
"""

from __future__ import annotations

import ctypes
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from ._version import __version__

#: The oldest torch whose stable ABI the op libraries were built for.
MIN_TORCH = (2, 11)

REBUILD_HINT = (
    "Reinstall mixprec (`pip install --force-reinstall --no-deps mixprec`), or build it from "
    "the source tree (`make build` in a checkout)."
)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def find_library(name: str) -> Path | None:
    """The file of op library ``name`` ("_ops", "_ops_cuda", ...) in the package, or None."""
    here = Path(__file__).resolve().parent
    found = sorted(here.glob(f"{name}.*so"))
    return found[0] if found else None


class OpLibrary:
    """The loaded ``_ops`` library: its build description as attributes.

    Attributes (from the library): ``version``, ``torch_version`` (the torch it was compiled
    with), ``torch_target`` (the oldest torch it loads into, "2.11"), ``cuda_kernels`` (bool:
    whether the CUDA library was built), ``cuda_version``, ``cuda_archs``, ``cxx_compiler``,
    ``cxx_compiler_version``, ``nvcc_version``, ``git_commit`` (str), ``op_names`` (tuple of
    the ops' names, in the op table's order), ``capture_sync_ops`` (dict op name -> rule),
    ``capture_scaler_settings`` (tuple of (name, accessor)), ``capture_live_options``
    (frozenset); ``__file__``: the library's path. Set by loading: ``cuda_library`` (the
    loaded CUDA library's path, or None) and ``cuda_missing`` (why it is not loaded, or "").
    """

    def __init__(self, path: Path) -> None:
        self.__file__ = str(path)
        self._dll = ctypes.CDLL(str(path))
        self._dll.mixprec_build_info_json.restype = ctypes.c_char_p
        self._dll.mixprec_cpu_capability.restype = ctypes.c_char_p
        self._dll.mixprec_cpu_kernel_threads.restype = ctypes.c_int
        info: dict[str, Any] = json.loads(self._dll.mixprec_build_info_json().decode())
        self.version: str = info["version"]
        self.torch_version: str = info["torch_version"]
        self.torch_target: str = info["torch_target"]
        self.cuda_kernels: bool = bool(info["cuda_kernels"])
        self.cuda_version: str = info["cuda_version"]
        self.cuda_archs: str = info["cuda_archs"]
        self.cxx_compiler: str = info["cxx_compiler"]
        self.cxx_compiler_version: str = info["cxx_compiler_version"]
        self.nvcc_version: str = info["nvcc_version"]
        self.git_commit: str = info.get("git_commit", "")
        self.op_names: tuple[str, ...] = tuple(info["op_names"])
        self.capture_sync_ops: dict[str, str] = dict(info["capture_sync_ops"])
        self.capture_scaler_settings: tuple[tuple[str, str], ...] = tuple(
            (name, accessor) for name, accessor in info["capture_scaler_settings"])
        self.capture_live_options: frozenset[str] = frozenset(info["capture_live_options"])
        self.cuda_library: Path | None = None
        self.cuda_missing: str = ""

    def cpu_capability(self) -> str:
        """The CPU kernel set chosen for this machine: "avx512", "avx2" or "default"."""
        return self._dll.mixprec_cpu_capability().decode()

    def cpu_kernel_threads(self) -> int:
        """How many threads the CPU kernels' loops run on now (torch's intra-op pool)."""
        return int(self._dll.mixprec_cpu_kernel_threads())


def _load() -> OpLibrary:
    if _torch_version() < MIN_TORCH:
        raise ImportError(
            f"mixprec needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its kernels use torch's "
            f"stable ABI of that version); torch {torch.__version__} is installed.")
    path = find_library("_ops")
    if path is None:
        raise ImportError(
            "mixprec: the op library mixprec/_ops was not found (was the package built?). "
            + REBUILD_HINT)
    try:
        torch.ops.load_library(str(path))
        library = OpLibrary(path)
    except (OSError, RuntimeError, AttributeError) as exc:
        raise ImportError(
            f"mixprec: the op library {path} failed to load into torch {torch.__version__}: "
            f"{exc}\n" + REBUILD_HINT) from exc
    if torch.version.cuda is not None:
        library.cuda_missing = _load_cuda(library)
        if library.cuda_missing:
            _refuse_cuda_tensors(library.op_names, library.cuda_missing)
    return library


def _load_cuda(library: OpLibrary) -> str:
    """Load the CUDA op library into this CUDA torch; return why it was not loaded, or ""."""
    if not library.cuda_kernels:
        return ("this build of mixprec has no CUDA kernels (it was built without nvcc, or with "
                "MIXPREC_FORCE_CPU=1); build it with a CUDA toolkit (docs/install.md)")
    built, running = library.cuda_version, str(torch.version.cuda)
    if built.split(".")[0] != running.split(".")[0]:
        why = (f"its CUDA kernels were built for CUDA {built}, and torch {torch.__version__} "
               f"runs CUDA {running}: install a torch built for CUDA {built.split('.')[0]}.x, "
               "or build mixprec from source against this torch (docs/install.md)")
    else:
        cuda = find_library("_ops_cuda")
        if cuda is None:
            why = f"mixprec/_ops_cuda is missing next to {library.__file__}. " + REBUILD_HINT
        else:
            try:
                torch.ops.load_library(str(cuda))
                library.cuda_library = cuda
                return ""
            except OSError as exc:
                why = f"{cuda} failed to load: {exc}. " + REBUILD_HINT
    warnings.warn(f"mixprec: the CUDA kernels are not loaded ({why}); the CPU kernels work.",
                  stacklevel=3)
    return why


#: Python CUDA kernels that refuse, where mixprec's CUDA library is not loaded into a CUDA torch.
_CUDA_REFUSALS: list[torch.library.Library] = []


def _refuse_cuda_tensors(op_names: tuple[str, ...], why: str) -> None:
    """Register a CUDA kernel per op that raises naming the missing library and ``why``."""
    lib = torch.library.Library("mixprec", "IMPL")
    for name in op_names:
        def refuse(*args: Any, _name: str = name, **kwargs: Any) -> None:
            raise RuntimeError(f"mixprec.ops.{_name}: got CUDA tensors, but mixprec's CUDA op "
                               f"library (mixprec/_ops_cuda) is not loaded: {why}")
        lib.impl(name, refuse, "CUDA")
    _CUDA_REFUSALS.append(lib)


#: The loaded op library ``mixprec/_ops``.
EXT: OpLibrary = _load()


def has_cuda_kernels() -> bool:
    """Whether mixprec's CUDA kernels are loaded (built, and torch has CUDA)."""
    return EXT.cuda_library is not None


def build_info() -> dict[str, Any]:
    """What mixprec was built with and what it runs with.

    A dict: ``version``, ``torch_built`` (the torch it was compiled with), ``torch_target``
    (the oldest torch it loads into: its stable-ABI target, "2.11"), ``torch_running``,
    ``cuda_kernels`` (bool: loaded), ``cuda_kernels_missing`` (why a CUDA torch runs without
    them, or None), ``cuda_version`` (the CUDA the kernels were built with, or None),
    ``cuda_archs`` ("8.0"-style strings), ``git_commit`` (the source commit it was built
    from, setup.py's ``source_commit()``, "+dirty.<hash>" with local changes; None when
    unknown), ``cpu_capability`` (the CPU kernel set in use: "avx512", "avx2" or
    "default"), ``cuda_runtime_available`` and ``cuda_device`` (its name, or None). Never
    syncs or allocates on a device.
    """
    gpu = torch.cuda.is_available()
    return {
        "version": __version__,
        "torch_built": EXT.torch_version,
        "torch_target": EXT.torch_target,
        "torch_running": torch.__version__,
        "cuda_kernels": has_cuda_kernels(),
        "cuda_kernels_missing": EXT.cuda_missing or None,
        "cuda_version": EXT.cuda_version or None,
        "git_commit": EXT.git_commit or None,
        "cuda_archs": [a for a in EXT.cuda_archs.split(";") if a],
        "cpu_capability": EXT.cpu_capability(),
        "cuda_runtime_available": gpu,
        "cuda_device": torch.cuda.get_device_name() if gpu else None,
    }
