"""The gates every build of mixprec's op libraries must pass to load into torch 2.11 and newer.

Usage: ``python tools/abi_gates.py PATH [PATH ...]`` where each PATH is a wheel, a folder
(searched for ``*.so``) or a shared library. Exits 1 naming every failure.

Per op library (``_ops*.so`` in a wheel or folder; any library given by its path):

* **torch-abi-audit** ``--check torch`` passes (only torch's stable C shims used), and the
  minimum torch it computes is at most 2.11;
* **imports** (``nm -D --undefined-only``, demangled): no C++ symbol of ``at::``, ``c10::`` or
  ``torch::`` (other than ``torch::stable``/``torch::headeronly``), no ``Sleef_`` function
  (SLEEF's vector math is torch's own, not part of its stable surface), no Python C API;
* **exports** (``nm -D --defined-only``, demangled): no ``at::``/``c10::``/``torch::`` code
  (weak copies of torch's inline functions would shadow torch's own);
* **shims**: every imported ``aoti_torch_*``/``torch_*`` symbol is exported by torch 2.11's
  libtorch_cpu.so or libtorch_cuda.so (the lists in ``tools/abi/``, read off the 2.11.0
  wheel);
* **NEEDED** (``readelf -d``): libraries of the system, of torch's C++ runtime and of CUDA only:
  never ``libtorch_python`` or ``libpython``; the CPU library never a CUDA library;
* **build paths**: no absolute path into a source tree or torch's headers among the
  read-only strings (``__FILE__`` in check messages: the build maps them to relative ones);
* **glibc and libstdc++** (manylinux_2_28's baseline): no symbol version above GLIBC_2.28,
  GLIBCXX_3.4.24 or CXXABI_1.3.11 (``csrc/compat/`` keeps a newer compiler's out).

A wheel must hold the op libraries only (``_ops*.so``): no test library, no stale module.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPORTS = [HERE / "abi" / "torch-2.11.0-libtorch_cpu.exports",
           HERE / "abi" / "torch-2.11.0-libtorch_cuda.exports"]
MAX_TORCH = (2, 11)
#: The newest symbol version of each runtime library that manylinux_2_28 allows.
MAX_VERSIONS = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11)}

#: Libraries an op library may need: the system's, torch's and CUDA's runtime.
ALLOWED_NEEDED = re.compile(
    r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so\.\d+$"
    r"|^lib(torch|torch_cpu|torch_cuda|c10|c10_cuda)\.so$"
    r"|^libcudart\.so\.\d+$")
CUDA_NEEDED = re.compile(r"^lib(torch_cuda|c10_cuda|cudart)\.so")
BUILD_PATH = re.compile(r"/[\w./+-]*/(?:torch/include|csrc)/[\w./+-]+")
FORBIDDEN_CXX = re.compile(r"\b(at|c10|torch)::")
ALLOWED_CXX = re.compile(r"\btorch::(stable|headeronly)::")


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                          check=True).stdout


def _symbols(lib: Path, which: str) -> list[str]:
    out = _run(["nm", "-D", "-C", which, str(lib)])
    names = []
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and len(parts[1]) == 1:
            names.append(parts[2])
        elif len(parts) == 2:
            names.append(parts[1])
    return names


def _forbidden_cxx(name: str) -> bool:
    return bool(FORBIDDEN_CXX.search(ALLOWED_CXX.sub("", name)))


def _audit(lib: Path) -> list[str]:
    exe = shutil.which("torch-abi-audit") or str(Path(sys.executable).parent / "torch-abi-audit")
    if not Path(exe).exists():
        return ["torch-abi-audit is not installed (pip install torch-abi-audit)"]
    problems = []
    check = subprocess.run([exe, str(lib), "--check", "torch"], capture_output=True, text=True)
    if check.returncode != 0:
        problems.append(f"torch-abi-audit --check torch failed:\n{check.stdout}{check.stderr}")
    report = subprocess.run([exe, str(lib), "--json"], capture_output=True, text=True)
    try:
        text = json.dumps(json.loads(report.stdout))
    except json.JSONDecodeError:
        return problems + [f"torch-abi-audit --json gave no JSON: {report.stderr.strip()}"]
    versions = [tuple(int(x) for x in m.groups())
                for m in re.finditer(r'"min_torch[a-z_]*": "(\d+)\.(\d+)', text)]
    if not versions:
        problems.append("torch-abi-audit reported no minimum torch version")
    elif max(versions) > MAX_TORCH:
        problems.append(f"torch-abi-audit: needs torch {'.'.join(map(str, max(versions)))}, "
                        f"more than {MAX_TORCH[0]}.{MAX_TORCH[1]}")
    return problems


def check_library(lib: Path, shims_211: set[str]) -> list[str]:
    """Every gate on one shared library; the failures, each a line."""
    problems = _audit(lib)
    undefined = _symbols(lib, "--undefined-only")
    bad = sorted({s for s in undefined if _forbidden_cxx(s)})
    if bad:
        problems.append("imports torch C++ symbols: " + "; ".join(bad[:8]))
    sleef = sorted({s for s in undefined if s.startswith("Sleef_")})
    if sleef:
        problems.append("imports SLEEF functions: " + ", ".join(sleef[:8]))
    python = sorted({s for s in undefined if re.match(r"^_?Py[A-Z_]", s)})
    if python:
        problems.append("imports Python C API symbols: " + ", ".join(python[:8]))
    shims = {s.split("@")[0] for s in undefined if re.match(r"^(aoti_torch_|torch_)", s)}
    missing = sorted(shims - shims_211)
    if missing:
        problems.append("imports shims torch 2.11 does not export: " + ", ".join(missing))
    exported = sorted({s for s in _symbols(lib, "--defined-only") if _forbidden_cxx(s)})
    if exported:
        problems.append("exports torch C++ code: " + "; ".join(exported[:8]))
    dynamic = _run(["readelf", "-d", str(lib)])
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    for name in needed:
        if not ALLOWED_NEEDED.match(name):
            problems.append(f"needs {name}")
    if "cuda" not in lib.name and any(CUDA_NEEDED.match(n) for n in needed):
        problems.append(f"the CPU library needs a CUDA library: {needed}")
    strings = _run(["readelf", "-W", "-p", ".rodata", str(lib)])
    paths = sorted(set(BUILD_PATH.findall(strings)))
    if paths:
        problems.append("carries build paths: " + ", ".join(paths[:4]))
    versions = _run(["readelf", "--version-info", "-W", str(lib)])
    for name, most in MAX_VERSIONS.items():
        found = {tuple(int(x) for x in m.group(1).split("."))
                 for m in re.finditer(rf"\b{name}_(\d+(?:\.\d+)+)", versions)}
        if found and max(found) > most:
            problems.append(f"needs {name}_{'.'.join(map(str, max(found)))} "
                            f"(at most {'.'.join(map(str, most))})")
    return problems


def _foreign_libraries(wheel: Path) -> list[str]:
    """The shared libraries in a wheel other than the op libraries."""
    with zipfile.ZipFile(wheel) as z:
        return [n for n in z.namelist()
                if ".so" in Path(n).name and not Path(n).name.startswith("_ops")]


def _newest(versions: str, name: str) -> str:
    found = [tuple(int(x) for x in m.group(1).split("."))
             for m in re.finditer(rf"\b{name}_(\d+(?:\.\d+)+)", versions)]
    return f"{name}_{'.'.join(map(str, max(found)))}" if found else f"no {name}"


def describe(lib: Path) -> str:
    """What the gates looked at in a library that passed, as one line."""
    exe = shutil.which("torch-abi-audit") or str(Path(sys.executable).parent / "torch-abi-audit")
    torch = json.loads(_run([exe, str(lib), "--json"]))["bundled_libs"][0]["torch"]
    undefined = _symbols(lib, "--undefined-only")
    shims = [s for s in undefined if re.match(r"^(aoti_torch_|torch_)", s)]
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        _run(["readelf", "-d", str(lib)]))
    versions = _run(["readelf", "--version-info", "-W", str(lib)])
    return (f"{'stable' if torch['stable'] else 'NOT stable'}, min torch "
            f"{torch['min_torch_version']}; {len(undefined)} imported symbols, {len(shims)} of "
            f"them torch shims; {len(_symbols(lib, '--defined-only'))} exported; NEEDED "
            f"{', '.join(needed)}; newest versions "
            f"{', '.join(_newest(versions, n) for n in MAX_VERSIONS)}")


def _libraries(path: Path, scratch: Path) -> list[Path]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            wheel.extractall(scratch / path.stem)
        path = scratch / path.stem
    if path.is_dir():
        return sorted(p for p in path.rglob("*.so") if p.name.startswith("_ops"))
    return [path]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    shims = set()
    for f in EXPORTS:
        shims |= set(f.read_text().split())
    failures = 0
    for arg in argv:
        if arg.endswith(".whl") and _foreign_libraries(Path(arg)):
            print(f"abi_gates: {Path(arg).name}: FAILED\n  - holds libraries other than the op "
                  f"libraries: {', '.join(_foreign_libraries(Path(arg)))}")
            failures += 1
    with tempfile.TemporaryDirectory() as scratch:
        libs = [lib for arg in argv for lib in _libraries(Path(arg), Path(scratch))]
        if not libs:
            print(f"abi_gates: no op library found in {argv}")
            return 1
        for lib in libs:
            problems = check_library(lib, shims)
            failures += bool(problems)
            status = "ok" if not problems else "FAILED"
            print(f"abi_gates: {lib.name}: {status}"
                  + (f" ({describe(lib)})" if not problems else ""))
            for p in problems:
                print(f"  - {p}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
