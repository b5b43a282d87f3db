"""The CUDA backend of every op, run on the CPU: a testing aid for machines without a GPU.

``mixprec._C`` carries, besides the real kernels, the CUDA launchers of
``csrc/cuda/*.h`` instantiated with a host executor (``csrc/cuda_emulation``):
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
host cost of the CUDA ops without a GPU (benchmarks/bench_launch_plan.py);
``planned_small_launches()`` counts the launches that fit the small kernel-argument
table (``SmallTensorListMeta``), which launch faster.

Nothing in mixprec calls these ops; they are slow (one emulated thread at a time)
and exist so that CI, which has no GPU, executes the CUDA code paths.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import __all__ as OP_NAMES
from . import _extension

NAMESPACE = "mixprec_cuda_emu"

_library: Optional[torch.library.Library] = None


def available() -> bool:
    """Whether the loaded extension carries the emulated CUDA launchers."""
    if _extension.EXT is None:
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


def ops() -> torch._ops._OpNamespace:
    """``torch.ops.mixprec_cuda_emu``, its schemas defined on first use.

    Raises:
        RuntimeError: when the extension is not loaded or lacks the emulation.
    """
    if not available():
        raise RuntimeError(
            "mixprec: the CUDA emulation needs the compiled extension (mixprec._C) "
            "built from this checkout"
        )
    return getattr(torch.ops, NAMESPACE)
