"""The CPU kernels exist once per instruction set (default, AVX2, AVX-512) and the best
one is picked at run time, so the main run only exercises one of them. Here the op
tests run again with each other set forced through MIXPREC_CPU_CAPABILITY."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mixprec

TESTS = Path(__file__).resolve().parent
NATIVE = mixprec.build_info()["cpu_capability"]
ORDER = ["default", "avx2", "avx512"]


@pytest.mark.skipif(not mixprec.has_extension(), reason="needs the compiled extension")
@pytest.mark.parametrize("cap", [c for c in ORDER if ORDER.index(c) < ORDER.index(NATIVE)])
def test_op_suite_with_capability(cap):
    env = {**os.environ, "MIXPREC_CPU_CAPABILITY": cap}
    probe = subprocess.run(
        [sys.executable, "-c", "import mixprec; print(mixprec.build_info()['cpu_capability'])"],
        capture_output=True, text=True, env=env, timeout=300)
    assert probe.stdout.strip() == cap, probe.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(TESTS / "test_unscale.py"), str(TESTS / "test_norm.py"), "-k", "cpu"],
        capture_output=True, text=True, env=env, timeout=900, cwd=TESTS.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
