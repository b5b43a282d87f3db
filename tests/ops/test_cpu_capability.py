"""The CPU kernels exist once per instruction set (default, AVX2, AVX-512) and the best
one is picked at run time, so the main run only exercises one of them. Here the op
tests run again with each other set forced through MIXPREC_CPU_CAPABILITY."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import pytest

import mixprec
from _helpers import TESTS

OPS = TESTS / "ops"
ORDER = ["default", "avx2", "avx512"]


def native_capability() -> Optional[str]:
    """The kernel set mixprec picked on this machine."""
    return mixprec.build_info().get("cpu_capability")


def require_below_native(cap: str) -> None:
    """Skip unless `cap` is a set below the one mixprec picked."""
    native = native_capability()
    assert native in ORDER, f"unknown CPU capability {native!r}"
    if ORDER.index(cap) >= ORDER.index(native):
        pytest.skip(f"{cap} is not below this machine's {native}")


def test_cpu_kernels_run_on_torchs_threads() -> None:
    """The CPU kernels' loops run on torch's thread pool (torch's stable ``parallel_for``,
    inside libtorch: whatever compiler built mixprec): with 2 threads in 2 chunks, with 1
    in 1."""
    import torch

    from mixprec._extension import EXT as _C

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _C.cpu_kernel_threads() == 2
        torch.set_num_threads(1)
        assert _C.cpu_kernel_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("cap", ORDER[:-1])
def test_op_suite_with_capability(cap: str) -> None:
    require_below_native(cap)
    env = {**os.environ, "MIXPREC_CPU_CAPABILITY": cap}
    probe = subprocess.run(
        [sys.executable, "-c", "import mixprec; print(mixprec.build_info()['cpu_capability'])"],
        capture_output=True, text=True, env=env, timeout=300)
    assert probe.stdout.strip() == cap, probe.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(OPS / "test_unscale.py"), str(OPS / "test_norm.py"), "-k", "cpu"],
        capture_output=True, text=True, env=env, timeout=900, cwd=TESTS.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout

