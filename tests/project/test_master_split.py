"""Split float32 masters, proven: common/master_math.h's 16- and 8-bit corrections of a
bf16 param, and cpu/master_simd.h's vector form, over all 2^32 float32 bit patterns.

tools/master_split_check.cpp takes P = the kernels' bf16 rounding of each pattern m and
checks that the 16-bit form decodes to m except exactly at the 32640 upper midpoints of
even finite params (one ulp toward P there), that the 8-bit code is d / 256 rounded half
to even and within its bound, that NaN stays NaN (+-0, subnormals and infinities are
among the patterns), and that the vector encode/decode of one instruction set gives the
scalar results lane for lane. The full scalar proof runs in the portable build; the
AVX2 and AVX-512 builds (where this CPU has them) check their vectors over every pattern.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from _helpers import REPO

CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")

ISA_FLAGS = {
    "portable": [],
    "avx2": ["-DMIXPREC_SIMD_AVX2", "-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-DMIXPREC_SIMD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl",
               "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}


def _cpu_has(isa: str) -> bool:
    """Whether this CPU runs code built for `isa` (torch's own capability probe)."""
    if isa == "portable":
        return True
    caps = torch.backends.cpu.get_cpu_capability().lower()
    return caps == "avx512" or (isa == "avx2" and caps == "avx2")


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("isa", list(ISA_FLAGS))
def test_split_masters_for_every_float32(isa: str, tmp_path: Path) -> None:
    if not _cpu_has(isa):
        pytest.skip(f"this CPU does not run {isa} code")
    exe = tmp_path / f"master_split_check_{isa}"
    build = [str(CXX), "-O2", "-std=c++17", "-pthread", "-ffp-contract=off",
             "-Wno-psabi", *ISA_FLAGS[isa], f"-I{REPO / 'csrc'}",
             f"-I{cpp_extension.include_paths()[0]}",
             str(REPO / "tools" / "master_split_check.cpp"), "-o", str(exe)]
    r = subprocess.run(build, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    args = [str(exe), "2"] + ([] if isa == "portable" else ["vector"])
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"isa {isa}: vector checks of all float32 patterns" in r.stdout
    assert r.stdout.rstrip().endswith(" 0 failures"), r.stdout
    if isa == "portable":
        assert ("checked 4294967296 float32 patterns: 4278157442 exact in 16 bits, "
                "32640 exceptions (32640 midpoints") in r.stdout
