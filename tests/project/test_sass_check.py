"""The static check of the 8-bit CUDA kernels (tools/sass_check.py): the kernels, as
they are, compile for sm_90 with no local-memory frame and no spills, with the code tables
read from shared memory in the round loop, and the check fails on a kernel that has a
frame (a planted local array indexed at run time) or reads the tables from global memory
(a planted cursor that points at them). Needs nvcc (no GPU);
skipped without one, except where the build is expected to have CUDA kernels
(MIXPREC_EXPECT_CUDA_KERNELS=1, as `make test` with MIXPREC_FORCE_CUDA sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import REPO

TOOL = REPO / "tools" / "sass_check.py"


def _has_nvcc() -> bool:
    home = os.environ.get("CUDA_HOME")
    return shutil.which("nvcc") is not None or (
        home is not None and (Path(home) / "bin" / "nvcc").exists())


pytestmark = pytest.mark.skipif(
    not _has_nvcc() and os.environ.get("MIXPREC_EXPECT_CUDA_KERNELS") != "1",
    reason="needs nvcc")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def test_the_8bit_kernels_have_no_local_memory_frame_or_spills():
    r = _run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sass_check: ok" in r.stdout
    for case in ("adam8 fp32", "adam8 bf16+master", "sgd8 fp32"):
        assert case in r.stdout
    # (cuobjdump is there: triton's, in the venv) the round loop's table reads checked
    assert "code tables read from shared memory" in r.stdout, r.stdout


def test_the_check_fails_on_a_planted_local_array_and_on_tables_in_global_memory():
    r = _run("--plant")
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {line.split("  ")[0]: line for line in r.stdout.splitlines()}
    assert "<- local memory" in rows["planted adam8 fp32"], r.stdout
    assert "<- code tables in global memory" in rows["planted-global adam8 fp32"], r.stdout
    assert "<-" not in rows["adam8 fp32"], r.stdout
    assert "FAILED" in r.stderr
