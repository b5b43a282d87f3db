"""The folded 8-bit encode, proven: ``q8::encode_fraction`` (one read of
``kQ8EncodeFolded``: threshold and both codes with the nonzero rule applied) gives the
code of the unfolded two-step encode it replaced (``q8::encode_fraction_unfolded``) for
every one of the 2^32 float32 bit patterns -- both signs, zeros, subnormals, |y| > 1,
infinities, every NaN -- of both code tables. tools/quant8_fold_check.cpp is the
brute-force program (two threads, about 20-40 s on two cores); it is built here with the
host compiler against the headers in the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from _helpers import REPO

CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")
def test_the_folded_encode_is_the_unfolded_one_for_every_float32(tmp_path: Path) -> None:
    exe = tmp_path / "quant8_fold_check"
    build = [str(CXX), "-O2", "-std=c++17", "-pthread", f"-I{REPO / 'csrc'}",
             f"-I{cpp_extension.include_paths()[0]}",
             str(REPO / "tools" / "quant8_fold_check.cpp"), "-o", str(exe)]
    r = subprocess.run(build, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked 8589934592 (float32 pattern, table) pairs: 0 mismatches" in r.stdout
