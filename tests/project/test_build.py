"""Build configuration, `python -m mixprec.info`, the missing-extension and torch-mismatch
errors, and the build's libstdc++ checks (tools/toolchain_checks.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mixprec
from _helpers import REPO

PKG_DIR = Path(mixprec.__file__).resolve().parent


def _load_toolchain_checks():
    """tools/toolchain_checks.py, loaded by path as setup.py loads it."""
    spec = importlib.util.spec_from_file_location(
        "_toolchain_checks", REPO / "tools" / "toolchain_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_toolchain = _load_toolchain_checks()


def test_build_info_keys_and_values():
    info = mixprec.build_info()
    assert info["version"] == mixprec.__version__
    assert info["torch_running"] == torch.__version__
    assert info["torch_built"] == torch.__version__
    assert info["torch_target"] == "2.11"
    assert isinstance(info["cuda_kernels"], bool)
    assert (info["cuda_kernels_missing"] is None) is (info["cuda_kernels"]
                                                      or torch.version.cuda is None)
    if info["cuda_kernels"]:
        assert torch.version.cuda is not None
        assert info["cuda_version"] and info["cuda_archs"]
    else:
        assert info["cuda_version"] is None and info["cuda_archs"] == []


@pytest.mark.skipif("MIXPREC_EXPECT_CUDA_KERNELS" not in os.environ,
                    reason="the build variant under test is named by MIXPREC_EXPECT_CUDA_KERNELS")
def test_build_variant_is_the_expected_one():
    """`make test` names the variant it built; a CUDA build that silently lost its kernels
    (or a CPU-only build that kept them) fails here."""
    expected = os.environ["MIXPREC_EXPECT_CUDA_KERNELS"] == "1"
    assert mixprec.has_cuda_kernels() is expected
    if expected:
        assert {"8.0", "9.0"} <= {a.replace("+PTX", "") for a in mixprec.build_info()
                                  ["cuda_archs"]} or os.environ.get("TORCH_CUDA_ARCH_LIST")


def _run(code: str, env: dict | None = None, cwd: str | None = None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def test_python_m_mixprec_info():
    out = subprocess.run([sys.executable, "-m", "mixprec.info"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for key in ("version", "torch_built", "torch_target", "torch_running", "cuda_kernels",
                "cuda_version", "cuda_archs"):
        assert key in text
    kernels_line = next(line for line in text.splitlines() if line.startswith("cuda_kernels"))
    assert kernels_line.endswith("yes" if mixprec.has_cuda_kernels() else "no")


def test_missing_extension_raises_with_rebuild_hint(tmp_path):
    """A copy of the package without its op library refuses to import, saying how to
    build it (there is no slow fallback: every op needs its kernels)."""
    copy = tmp_path / "mixprec"
    shutil.copytree(PKG_DIR, copy, ignore=shutil.ignore_patterns("_ops*.so", "__pycache__"))
    out = _run("import mixprec", env={"PYTHONPATH": str(tmp_path)}, cwd=str(tmp_path))
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "mixprec/_ops was not found" in out.stderr, out.stderr
    assert "make build" in out.stderr, out.stderr


def test_a_missing_cuda_library_leaves_the_cpu_kernels_and_says_so(tmp_path):
    """A copy of a CUDA build without mixprec/_ops_cuda imports in a CUDA torch with a
    warning naming the missing file; the CPU kernels work."""
    from mixprec._extension import EXT

    if not (EXT.cuda_kernels and torch.version.cuda):
        pytest.skip("needs a build with CUDA kernels and a CUDA torch")
    copy = tmp_path / "mixprec"
    shutil.copytree(PKG_DIR, copy, ignore=shutil.ignore_patterns("_ops_cuda*.so", "__pycache__"))
    code = ("import warnings, torch\nwarnings.simplefilter('always')\nimport mixprec\n"
            "g = [torch.ones(2)]\nmixprec.ops.unscale_and_check_(g, torch.zeros(1), "
            "torch.full((1,), 0.5))\nprint('CPU', g[0].tolist(), "
            "mixprec.build_info()['cuda_kernels_missing'])")
    out = _run(code, env={"PYTHONPATH": str(tmp_path)}, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "mixprec/_ops_cuda is missing next to" in out.stderr, out.stderr
    assert out.stdout.startswith("CPU [0.5, 0.5] mixprec/_ops_cuda is missing"), out.stdout


def test_a_torch_older_than_the_stable_abi_target_is_refused_by_name():
    code = """
import torch
torch.__version__ = "2.10.1+cpu"
try:
    import mixprec
except ImportError as e:
    print("ERR", e)
"""
    out = _run(code, env={"PYTHONPATH": str(PKG_DIR.parent)})
    assert "ERR" in out.stdout, out.stdout + out.stderr
    assert "torch >= 2.11" in out.stdout and "2.10.1+cpu" in out.stdout, out.stdout



def test_a_cuda_torch_the_kernels_cannot_serve_keeps_the_cpu_kernels_and_names_why():
    """A CUDA torch of another CUDA major (or a build without CUDA kernels): the import
    warns (the former), the CPU kernels work, and CUDA tensors get an error naming the CUDA
    library and the reason, not the dispatcher's "could not run" message."""
    from mixprec._extension import EXT

    code = """
import warnings
import torch
torch.version.cuda = "99.0"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import mixprec
print("WARN", [str(w.message) for w in caught if "CUDA kernels are not loaded" in str(w.message)])
info = mixprec.build_info()
print("INFO", info["cuda_kernels"], "|", info["cuda_kernels_missing"])
grads, found, inv = [torch.ones(3)], torch.zeros(1), torch.full((1,), 0.5)
mixprec.ops.unscale_and_check_(grads, found, inv)
print("CPU", grads[0].tolist())
with torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.CUDA):
    try:
        mixprec.ops.unscale_and_check_(grads, found, inv)
    except RuntimeError as e:
        print("ERR", e)
print("AFTER", grads[0].tolist())
"""
    out = _run(code, env={"PYTHONPATH": str(PKG_DIR.parent)})
    lines = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines()}
    assert set(lines) >= {"WARN", "INFO", "CPU", "ERR", "AFTER"}, out.stdout + out.stderr
    why = ("built for CUDA " + EXT.cuda_version + ", and torch" if EXT.cuda_kernels
           else "has no CUDA kernels")
    if EXT.cuda_kernels:  # a build without CUDA kernels said so when it was built
        assert why in lines["WARN"] and "the CPU kernels work" in lines["WARN"], lines["WARN"]
    else:
        assert lines["WARN"] == "WARN []", lines["WARN"]
    assert lines["INFO"].startswith("INFO False |") and why in lines["INFO"], lines["INFO"]
    if EXT.cuda_kernels:
        assert "runs CUDA 99.0" in lines["INFO"] and "install a torch built for CUDA" in lines[
            "INFO"]
    assert lines["CPU"] == "CPU [0.5, 0.5, 0.5]"
    assert "mixprec.ops.unscale_and_check_: got CUDA tensors" in lines["ERR"], lines["ERR"]
    assert "mixprec/_ops_cuda" in lines["ERR"] and why in lines["ERR"], lines["ERR"]
    assert lines["AFTER"] == "AFTER [0.5, 0.5, 0.5]"


# ---- the C++ toolchain: libstdc++ must be linked as a shared library ---------------------------
# A compiler (wrapper) that links libstdc++ statically into shared objects builds a library whose
# error messages crash the process (g++ 13) or lose their numbers (g++ 12). The build probes
# the compiler before compiling and refuses; see tools/toolchain_checks.py.



def _system_cxx() -> str:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no g++ / c++ on PATH")
    return cxx


def _static_libstdcxx_wrapper(tmp_path: Path) -> Path:
    """A compiler wrapper like the GPU image's /opt/gcc/bin/g++: the real g++ plus
    -static-libstdc++ on every command line."""
    cxx = _system_cxx()
    archive = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip(f"{cxx} has no libstdc++.a to link statically")
    wrapper = tmp_path / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{cxx}" "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    return wrapper


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="ELF shared objects (Linux) only")


@linux_only
def test_probe_accepts_the_system_compiler():

    assert _toolchain.probe_compiler(_system_cxx()) is None


@linux_only
def test_probe_reports_a_wrapper_that_links_libstdcxx_statically(tmp_path):

    problem = _toolchain.probe_compiler(str(_static_libstdcxx_wrapper(tmp_path)))
    assert problem is not None
    assert "no DT_NEEDED libstdc++.so.6" in problem
    assert "_ZNSt6locale7classicEv" in problem  # std::locale::classic() is inside the object
    # the same flag given by hand, not through a wrapper
    assert _toolchain.probe_compiler([_system_cxx(), "-static-libstdc++"]) is not None


@linux_only
def test_elf_reader_agrees_with_binutils(tmp_path):
    """The pure-Python ELF reader (no binutils needed at build time) against readelf/nm."""

    if not (shutil.which("readelf") and shutil.which("nm")):
        pytest.skip("binutils (readelf, nm) not installed")
    so = tmp_path / "probe.so"
    src = tmp_path / "probe.cpp"
    src.write_text(_toolchain._PROBE_SOURCE)
    subprocess.run([_system_cxx(), "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    for path in (so, Path(mixprec._extension.EXT.__file__)):
        info = _toolchain.read_elf_dynamic(path)
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines()
                  if "(NEEDED)" in line]
        assert info.needed == needed
        nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                            text=True, check=True).stdout
        defined = {line.split()[-1].split("@")[0] for line in nm.splitlines() if line.strip()}
        assert info.defined == defined
    assert "libstdc++.so.6" in _toolchain.read_elf_dynamic(so).needed


@linux_only
def test_the_loaded_extension_uses_the_shared_libstdcxx():
    """A library that carried std::ostream::_M_insert<long> itself crashed on error messages."""

    assert _toolchain.inspect_shared_object(mixprec._extension.EXT.__file__) is None


def _setup_py_copy(tmp_path: Path) -> Path:
    """setup.py with the files it reads, without any build output, in a scratch tree."""
    if not (REPO / "setup.py").is_file():
        pytest.skip("needs the source tree (setup.py)")
    root = tmp_path / "src"
    shutil.copytree(REPO / "csrc", root / "csrc")
    shutil.copytree(REPO / "python", root / "python",
                    ignore=shutil.ignore_patterns("_ops*.so", "_cuda_emulation*.so", "_cpp",
                                                  "__pycache__"))
    (root / "tools").mkdir()
    for tool in ("toolchain_checks.py", "commit_stamp.py"):  # (setup.py loads both)
        shutil.copy2(REPO / "tools" / tool, root / "tools" / tool)
    shutil.copy2(REPO / "setup.py", root / "setup.py")
    return root


@linux_only
def test_setup_py_refuses_a_compiler_that_links_libstdcxx_statically(tmp_path):
    """The build stops before compiling anything, names the cause, the fix and the override."""
    wrapper = _static_libstdcxx_wrapper(tmp_path)
    root = _setup_py_copy(tmp_path)
    env = {**os.environ, "CXX": str(wrapper), "MIXPREC_FORCE_CPU": "1", "MAX_JOBS": "1"}
    env.pop("MIXPREC_ALLOW_STATIC_LIBSTDCXX", None)
    env.pop("MIXPREC_FORCE_CUDA", None)  # CI sets it; the two FORCE switches exclude each other
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=root,
                         env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert f"the C++ compiler `{wrapper}` links libstdc++ statically" in text
    assert "CXX=/usr/bin/g++ CC=/usr/bin/gcc" in text
    assert "MIXPREC_ALLOW_STATIC_LIBSTDCXX=1" in text
    assert not list(root.rglob("*.o")) and not list(root.rglob("_C*.so"))  # nothing compiled


@linux_only
def test_info_reports_the_toolchain():
    from mixprec import info

    tools = info.toolchain_info()
    assert tools["cxx_compiler"], "the extension records no compiler (built before the record?)"
    assert os.path.isabs(tools["cxx_compiler"].split()[0])
    assert tools["cxx_compiler_version"]
    assert bool(tools["nvcc_version"]) is mixprec.has_cuda_kernels()
    text = subprocess.run([sys.executable, "-m", "mixprec.info"], capture_output=True, text=True,
                          timeout=300, check=True).stdout
    fields = {key.strip(): value.strip()
              for key, value in (line.split(" : ", 1) for line in text.splitlines())}
    assert fields["cxx_compiler"] == tools["cxx_compiler"]
    assert fields["cxx_compiler_version"] == tools["cxx_compiler_version"]


# ---- mixprec.cmake_prefix_path -----------------------------------------------------------------

def test_cmake_prefix_path_without_cpp_package_raises_with_the_ways_to_get_it(tmp_path,
                                                                              monkeypatch):
    from mixprec import _cmake

    prefix = tmp_path / "_cpp"
    monkeypatch.setattr(_cmake, "_PREFIX", prefix)
    path = _cmake.MissingCppPackage(prefix)
    assert path == str(prefix)  # still compares as the path
    for use in (str, print, lambda p: f"-DCMAKE_PREFIX_PATH={p}", lambda p: p + "/lib",
                lambda p: "x" + p, lambda p: os.path.join(p, "lib")):
        with pytest.raises(FileNotFoundError, match="MIXPREC_BUNDLE_CPP=1 pip install") as err:
            use(path)
        assert "cmake --install" in str(err.value) and str(prefix) in str(err.value)
    # once the package exists (built after the import), it is the plain path
    config = prefix / "lib" / "cmake" / "mixprec" / "mixprecConfig.cmake"
    config.parent.mkdir(parents=True)
    config.write_text("# test\n")
    assert str(path) == str(prefix) and f"{path}" == str(prefix)
    assert os.path.join(path, "lib") == str(prefix / "lib")


def test_cmake_prefix_path_of_this_installation():
    """Bundled: a plain path with the package files. Not bundled (editable, default install):
    printing it fails with the instructions instead of printing a folder that does not exist."""
    from mixprec import _cmake

    code = "import mixprec; print(mixprec.cmake_prefix_path)"
    out = _run(code)
    if mixprec.has_cpp_package():
        assert type(mixprec.cmake_prefix_path) is str
        assert out.returncode == 0 and Path(out.stdout.strip()).is_dir()
    else:
        assert isinstance(mixprec.cmake_prefix_path, _cmake.MissingCppPackage)
        assert out.returncode != 0 and out.stdout == ""
        assert "FileNotFoundError" in out.stderr and "MIXPREC_BUNDLE_CPP=1" in out.stderr
        module = subprocess.run([sys.executable, "-m", "mixprec._cmake"], capture_output=True,
                                text=True, timeout=300)
        assert module.returncode == 1 and "MIXPREC_BUNDLE_CPP=1" in module.stderr
