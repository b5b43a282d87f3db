"""C++ <-> Python checks from pytest, when the C++ test programs are built.

The main route is ctest (``make test-cpp``: tests/cpp/CMakeLists.txt runs
tests/cpp/interop.py with the programs it builds). These pytest cases run the
same checks against programs that a previous ``make test-cpp`` left in
build/cmake-tests (or MIXPREC_CPP_TESTS_DIR), and skip when there are none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import REPO

ROOT = REPO
TESTS_DIR = Path(os.environ.get("MIXPREC_CPP_TESTS_DIR", ROOT / "build" / "cmake-tests"))
INTEROP = ROOT / "tests" / "cpp" / "interop.py"


def _program(name: str) -> Path:
    path = TESTS_DIR / name
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"{path} not built (run make test-cpp)")
    return path


def _run(*args: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(INTEROP), *args], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode == 77:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout.splitlines()[-1]


def test_scaler_state_cpp_python(tmp_path: Path) -> None:
    _run("scaler", "--tool", str(_program("interop_tool")), "--dir", str(tmp_path),
         tmp_path=tmp_path)


def test_optimizer_parity_cpp_python(tmp_path: Path) -> None:
    _run("optim", "--tool", str(_program("interop_tool")), "--dir", str(tmp_path),
         tmp_path=tmp_path)


def test_example_matches_twin(tmp_path: Path) -> None:
    exe = _program("example/train_mlp")
    _run("example", "--bin", str(exe), "--", "--steps", "25", "--inject-inf", "9",
         tmp_path=tmp_path)
