"""tools/abi_gates.py: the built op libraries pass, and each gate catches what it guards.

Each planted library is a tiny shared object whose one function calls what the gate forbids
(an at:: function, SLEEF's pow, a shim torch 2.11 lacks, Python's C API), that needs a
library, glibc or libstdc++ version an op library must not, or that carries a build path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
import abi_gates  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and shutil.which("nm") and shutil.which("readelf")
         and shutil.which("g++")),
    reason="needs Linux with binutils and g++")

SHIMS = set().union(*(set(f.read_text().split()) for f in abi_gates.EXPORTS))


def _library(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", str(src), "-o", str(out), *flags],
                   check=True)
    return out


def _problems(lib: Path) -> str:
    return "\n".join(p for p in abi_gates.check_library(lib, SHIMS)
                     if not p.startswith("torch-abi-audit"))


def test_the_built_op_libraries_pass() -> None:
    import mixprec._extension as ext

    libs = [Path(ext.EXT.__file__)] + ([ext.EXT.cuda_library] if ext.EXT.cuda_library else [])
    for lib in libs:
        assert abi_gates.check_library(lib, SHIMS) == [], lib


@pytest.mark.parametrize("name, source, caught", [
    ("aten", 'namespace at { void launch(); }\nextern "C" void f() { at::launch(); }\n',
     "imports torch C++ symbols: at::launch()"),
    ("sleef", 'extern "C" double Sleef_powd1_u10(double, double);\n'
     'extern "C" double f(double x) { return Sleef_powd1_u10(x, x); }\n',
     "imports SLEEF functions: Sleef_powd1_u10"),
    ("shim", 'extern "C" int torch_shim_from_the_future(void*);\n'
     'extern "C" int f(void* p) { return torch_shim_from_the_future(p); }\n',
     "torch 2.11 does not export: torch_shim_from_the_future"),
    ("python", 'extern "C" void* PyLong_FromLong(long);\n'
     'extern "C" void* f() { return PyLong_FromLong(1); }\n',
     "imports Python C API symbols: PyLong_FromLong"),
])
def test_a_forbidden_import_is_caught(tmp_path: Path, name: str, source: str,
                                      caught: str) -> None:
    """An at:: call, SLEEF's pow, a shim torch 2.11 lacks, Python's C API."""
    assert caught in _problems(_library(tmp_path, name, source))


def test_torch_cxx_code_exported_is_caught(tmp_path: Path) -> None:
    lib = _library(tmp_path, "export", "namespace c10 { int answer() { return 42; } }\n")
    assert "exports torch C++ code: c10::answer()" in _problems(lib)


def test_a_foreign_needed_library_is_caught(tmp_path: Path) -> None:
    dep = _library(tmp_path, "libforeign", "extern \"C\" int g() { return 1; }\n")
    lib = _library(tmp_path, "needs",
                   "extern \"C\" int g();\nextern \"C\" int f() { return g(); }\n",
                   f"-L{tmp_path}", "-l:libforeign.so")
    assert dep.exists() and "needs libforeign.so" in _problems(lib)


def test_a_glibc_above_2_28_is_caught(tmp_path: Path) -> None:
    # pow has been GLIBC_2.29 since glibc 2.29; bound to it unless glibc_compat.h is included
    lib = _library(tmp_path, "glibc", "#include <cmath>\n"
                   "extern \"C\" double f(double x, double y) { return std::pow(x, y); }\n")
    versions = subprocess.run(["readelf", "--version-info", "-W", str(lib)],
                              capture_output=True, text=True).stdout
    if "GLIBC_2.29" not in versions:
        pytest.skip("this system's libm binds pow below GLIBC_2.29")
    assert "needs GLIBC_2.29" in _problems(lib)
    compat = _library(tmp_path, "glibc_compat", "#include <cmath>\n"
                      "extern \"C\" double f(double x, double y) { return std::pow(x, y); }\n",
                      "-include", str(REPO / "csrc" / "compat" / "glibc_compat.h"))
    assert "GLIBC" not in _problems(compat)


def test_a_wheel_with_another_library_is_caught(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "mixprec-0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mixprec/_ops.abi3.so", b"")
        z.writestr("mixprec/_C.cpython-311-x86_64-linux-gnu.so", b"")
    assert abi_gates._foreign_libraries(wheel) == ["mixprec/_C.cpython-311-x86_64-linux-gnu.so"]


def test_a_libstdcxx_above_manylinux_2_28_is_caught(tmp_path: Path) -> None:
    # At -O0 nothing is inlined: the C++20 str() is called in libstdc++ (GLIBCXX_3.4.29 in
    # GCC >= 11) unless csrc/compat/libstdcxx_compat.cpp is linked in.
    source = ("#include <sstream>\n#include <string>\n"
              "std::string f(int x) { std::ostringstream s; s << x; return s.str(); }\n")
    lib = _library(tmp_path, "cxx", source, "-O0", "-std=c++20")
    versions = subprocess.run(["readelf", "--version-info", "-W", str(lib)],
                              capture_output=True, text=True).stdout
    if "GLIBCXX_3.4.29" not in versions:
        pytest.skip("this compiler's libstdc++ keeps str() below GLIBCXX_3.4.29")
    assert "needs GLIBCXX_3.4.29 (at most 3.4.24)" in _problems(lib)
    compat = _library(tmp_path, "cxx_compat", source, "-O0", "-std=c++20",
                      str(REPO / "csrc" / "compat" / "libstdcxx_compat.cpp"))
    assert "GLIBCXX" not in _problems(compat)


def test_a_build_path_in_a_message_is_caught(tmp_path: Path) -> None:
    source = ('extern "C" const char* f() { return "check failed at " __FILE__; }\n')
    (tmp_path / "csrc").mkdir()
    lib = _library(tmp_path / "csrc", "where", source)
    assert f"carries build paths: {tmp_path}/csrc/where.cpp" in _problems(lib)
    mapped = _library(tmp_path / "csrc", "mapped", source, f"-fmacro-prefix-map={tmp_path}/=")
    assert "build paths" not in _problems(mapped)
