"""Run mixprec's Python suite against one build in fresh venvs, one per torch version.

The op libraries are built on torch's stable ABI (TORCH_TARGET_VERSION 2.11): the same build
must load into, and pass in, every torch from 2.11 on. For each version given, this

1. makes (or reuses) ``build/torch-<version>/venv`` with ``torch==<version>`` and the test
   dependencies only (pytest, hypothesis, numpy, expecttest): what a user's fresh
   environment has, plus the test runner;
2. puts the package in it: a wheel (``--package dist/mixprec-*.whl``) is installed with
   ``pip install --no-deps``; a built package folder (``--package python/mixprec``, the
   editable build's, test library included) is copied to ``build/torch-<version>/pkg`` and
   put on ``PYTHONPATH``;
3. checks that ``import mixprec`` there is that package (not the source tree), and runs
   the suite (``tests/`` less ``tests/project``, ``tests/frameworks`` and ``tests/cpp``,
   which need the source tree, the frameworks or the C++ build) from a scratch folder.

Usage::

    python tools/torch_matrix.py --package dist/mixprec-*.whl 2.11.0 2.13.0 2.14.1 2.15.0
    python tools/torch_matrix.py --package python/mixprec 2.13.0 -- -x -q

Torch releases newer than the machine's pip cap (a constraints file) are installed with the
cap lifted for that venv only (``PIP_CONSTRAINT=/dev/null``). Exits non-zero if any version
fails, after running all of them; prints one line per version at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_DEPS = ["pytest", "hypothesis", "numpy", "expecttest"]
LEFT_OUT = ["tests/project", "tests/frameworks", "tests/cpp"]


def _venv(version: str) -> Path:
    """The venv of torch ``version`` (created and filled on first use); its python."""
    root = REPO / "build" / f"torch-{version}"
    python = root / "venv" / "bin" / "python"
    stamp = root / "venv" / ".mixprec-matrix"
    if stamp.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    env = dict(os.environ, PIP_CONSTRAINT="/dev/null")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={version}",
                    *TEST_DEPS], check=True, env=env)
    stamp.touch()
    return python


def _install(python: Path, version: str, package: Path) -> dict[str, str]:
    """Puts ``package`` into the venv; the environment to run it with."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if package.suffix == ".whl":
        start = time.monotonic()
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                        "--force-reinstall", str(package)], check=True)
        print(f"== torch {version}: pip install --no-deps {package.name}: "
              f"{time.monotonic() - start:.1f} s", flush=True)
        return env
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "mixprec"],
                   check=False, capture_output=True)
    dest = REPO / "build" / f"torch-{version}" / "pkg"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(package, dest / "mixprec",
                    ignore=shutil.ignore_patterns("__pycache__", "_cpp"))
    env["PYTHONPATH"] = str(dest)
    return env


def run(version: str, package: Path, pytest_args: list[str]) -> bool:
    python = _venv(version)
    env = _install(python, version, package)
    with tempfile.TemporaryDirectory() as scratch:
        probe = "import torch, mixprec; print(torch.__version__, mixprec.__file__)"
        where = subprocess.run([str(python), "-c", probe], cwd=scratch, env=env,
                               capture_output=True, text=True)
        print(f"== torch {version}: {where.stdout.strip() or where.stderr.strip()}", flush=True)
        if where.returncode != 0 or str(REPO / "python") in where.stdout:
            print(f"torch_matrix: mixprec did not load from the package under test "
                  f"with torch {version}", flush=True)
            return False
        cmd = [str(python), "-m", "pytest", str(REPO / "tests"),
               "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
               *[f"--ignore={REPO / d}" for d in LEFT_OUT], *pytest_args]
        return subprocess.run(cmd, cwd=scratch, env=env).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", required=True, type=Path,
                        help="a wheel, or a built package folder (python/mixprec)")
    parser.add_argument("versions", nargs="+", help="torch versions, e.g. 2.11.0 2.15.0")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1:]
    package = args.package.resolve()
    if not package.exists():
        parser.error(f"{package} does not exist")
    results = []
    for version in args.versions:
        start = time.monotonic()
        ok = run(version, package, pytest_args)
        results.append((version, ok, time.monotonic() - start))
    for version, ok, seconds in results:
        print(f"torch_matrix: torch {version}: {'passed' if ok else 'FAILED'} ({seconds:.0f} s)")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
