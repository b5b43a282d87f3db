"""The CUDA backend of every op, run on the CPU: a testing aid for machines without a GPU.

The test-only library ``mixprec/_cuda_emulation`` (built beside the op libraries when
``MIXPREC_BUILD_TEST_EXT=1``, as ``make test`` does; never part of a plain install)
carries the CUDA launchers of ``csrc/cuda/*.h`` instantiated with a host executor
(``csrc/cuda_emulation``):
the same argument checks, flattening, dtype grouping, slot wiring, launch plans
(``TensorListMeta``) and kernel bodies as the CUDA kernels, run over an emulated
grid (every block, every thread, one after the other) on CPU tensors. They are
registered as the CPU kernels of the private namespace ``mixprec_cuda_emu``; this
module defines that namespace's schemas as copies of ``mixprec``'s, so
``ops().fused_adam_(...)`` takes exactly the arguments of
``torch.ops.mixprec.fused_adam_`` and does on CPU tensors what the CUDA kernel does
on CUDA tensors (up to device libm rounding in p-norms; see host_exec.h).

``ops().plan_<op>`` (every op) does the launcher's host work only --
checks, flattening, grouping, launch plans -- and launches nothing; with
``planned_blocks()`` / ``planned_launches()`` (totals since load) it measures the
host cost of the CUDA ops without a GPU (benchmarks/bench_host_cost.py);
``planned_small_launches()`` counts the launches that fit the small kernel-argument
table (``SmallTensorListMeta``), which launch faster.

Nothing in mixprec calls these ops; they are slow (one emulated thread at a time)
and exist so that CI, which has no GPU, executes the CUDA code paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from mixprec import _extension
from mixprec.ops import __all__ as OP_NAMES

NAMESPACE = "mixprec_cuda_emu"

LIBRARY = "_cuda_emulation"

_library: Optional[torch.library.Library] = None
_module: Optional[Path] = None
_tried = False


def module() -> Optional[Path]:
    """The test library's path (loading it registers the emulated launchers), loaded on
    first use after mixprec's op library; None when it was not built."""
    global _module, _tried
    if not _tried and _extension.EXT is not None:
        _tried = True
        path = _extension.find_library(LIBRARY)
        if path is not None:
            torch.ops.load_library(str(path))
            _module = path
    return _module


def available() -> bool:
    """Whether the test extension with the emulated CUDA launchers is built and loads."""
    if module() is None:
        return False
    _define()
    return all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACE}::{name}", "CPU")
        for name in OP_NAMES + ["plan_" + n for n in OP_NAMES]
    )


def _define() -> None:
    global _library
    if _library is None:
        lib = torch.library.Library(NAMESPACE, "DEF")
        for name in OP_NAMES:
            schema = str(getattr(torch.ops.mixprec, name).default._schema)
            lib.define(schema.split("::", 1)[1])
            lib.define("plan_" + schema.split("::", 1)[1])
        lib.define("planned_blocks() -> int")
        lib.define("planned_launches() -> int")
        lib.define("planned_small_launches() -> int")
        _library = lib


def backends(op: str, reference: bool = False) -> Dict[str, Callable[..., Any]]:
    """Every implementation of op ``op`` this machine runs, by name: the CPU kernel, the
    CUDA launcher through the emulation (when built) and, with ``reference``, the
    pure-PyTorch reference (``tests/_reference.py``)."""
    out: Dict[str, Callable[..., Any]] = {"cpu": getattr(torch.ops.mixprec, op)}
    if reference:
        import _reference

        out["reference"] = getattr(_reference, op)
    if available():
        out["cuda-emulated"] = getattr(ops(), op)
    return out


def ops() -> torch._ops._OpNamespace:
    """``torch.ops.mixprec_cuda_emu``, its schemas defined on first use.

    Raises:
        RuntimeError: when the test library is not built.
    """
    if not available():
        raise RuntimeError(
            "mixprec: the CUDA emulation needs the test library mixprec/_cuda_emulation: "
            "build with MIXPREC_BUILD_TEST_EXT=1 (make test does)"
        )
    return getattr(torch.ops, NAMESPACE)
