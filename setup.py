"""Build of mixprec's op libraries (torch.utils.cpp_extension).

The Python package has no extension module: it loads shared libraries with
``torch.ops.load_library``, built on torch's stable ABI (``TORCH_TARGET_VERSION``
= 2.11), so one build loads into every torch from 2.11 on:

* ``mixprec/_ops``: the op schemas, the CPU kernels and the build description
  (C functions read with ctypes; csrc/registration.cpp, csrc/build_info.cpp,
  csrc/common/, csrc/cpu/). It needs only libtorch_cpu: CPU and CUDA torch alike.
* ``mixprec/_ops_cuda``: the CUDA kernels (csrc/cuda/), loaded only when torch has
  CUDA.

Configuration (printed at build time, recorded in the binary for
``mixprec.build_info()``):

* CUDA kernels are compiled when torch is a CUDA build (``torch.version.cuda``)
  and a CUDA toolkit (nvcc) is found. Whether a GPU is visible plays no part.
* ``MIXPREC_FORCE_CUDA=1`` requires the CUDA kernels (and fails clearly when
  nvcc or a CUDA build of torch is missing); ``MIXPREC_FORCE_CPU=1`` leaves
  them out.
* ``TORCH_CUDA_ARCH_LIST`` picks the GPU architectures; default "8.0;9.0+PTX".
* ``MIXPREC_BUILD_TEST_EXT=1`` also builds the test-only library
  ``mixprec/_cuda_emulation`` (csrc/cuda_emulation/: the CUDA launchers run on
  the CPU, for tests/ops/test_cuda_emulation.py and ``benchmarks/bench_host_cost.py
  --emulated``), in every configuration, CPU-only included. ``make test`` sets it;
  wheels and plain installs leave it out.
* ``MIXPREC_BUNDLE_CPP=1`` also builds libmixprec (the C++ API, no Python) with
  CMake, same configuration rules, and installs it with its headers and CMake
  package files into ``mixprec/_cpp`` -- what ``mixprec.cmake_prefix_path``
  points at (wheels for LibTorch users). ``MIXPREC_CPP_BUILD_DIR`` picks the
  CMake build folder (default build/cmake-bundle; build/cmake reuses the
  build of ``make test-cpp``). Off by default: it compiles the kernels again.
* The C++ compiler must link the shared libstdc++ into shared objects. Before
  compiling, the build links a small test object with the compiler that will
  link the libraries (``CXX``, else ``c++``; and the linker setuptools uses) and
  refuses a compiler that links libstdc++ statically (``-static-libstdc++``,
  e.g. from a wrapper script): such a library crashes on any error
  message with a number in it. The built libraries are checked the same way.
  ``MIXPREC_ALLOW_STATIC_LIBSTDCXX=1`` turns the refusal into a warning.
  The compiler (path, ``--version``) and nvcc's version are recorded in the
  binary (``python -m mixprec.info``).
* The source commit is recorded too (``build_info()["git_commit"]``): the first 12
  hex digits of ``git rev-parse HEAD``, with ``+dirty.<8 hex>`` (a hash of ``git diff
  HEAD``) when tracked files differ from it; ``MIXPREC_GIT_COMMIT`` overrides it (a
  build outside git), "" when unknown. ``make gpu-check`` refuses a wheel of another one.

Sources come from the csrc/ folders by glob; CMakeLists.txt builds libmixprec from
the same kernel sources plus the C++ API (csrc/api/, csrc/ops.cpp, csrc/autograd.cpp:
the C++ Autograd-key kernels; the Python package registers its own from Python,
python/mixprec/ops/_autograd.py). The test-only csrc/cuda_emulation/ is built here only.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCHS = "8.0;9.0+PTX"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _load_tool(file: str, name: str):
    """``tools/<file>``, loaded by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_toolchain = _load_tool("toolchain_checks.py", "_mixprec_build_toolchain")
_commit_stamp = _load_tool("commit_stamp.py", "_mixprec_build_commit_stamp")


def _c_string(value: str) -> str:
    """``value`` escaped for a C string literal in the generated header."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def source_commit(root: Path = ROOT) -> str:
    """The commit the sources are at (tools/commit_stamp.py: 12 hex digits, ``+dirty.<8 hex>``
    with local changes, "" without git); ``MIXPREC_GIT_COMMIT`` when set. tools/gpu_check.py
    expects the same of the tree it checks."""
    return os.environ.get("MIXPREC_GIT_COMMIT") or _commit_stamp.tree_commit(root)


def _cxx_compiler() -> str:
    """The compiler torch.utils.cpp_extension compiles the C++ sources with."""
    return os.environ.get("CXX", "c++")


def _nvcc_release(nvcc: str) -> str:
    """nvcc's "Cuda compilation tools, release X.Y, VX.Y.Z" line, "" if unknown."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    release = [line for line in lines if "release" in line]
    return (release or lines or [""])[-1]


def check_cxx_toolchain(compilers: list[str | list[str]], allow: bool | None = None) -> None:
    """Refuse C++ compilers that link libstdc++ statically into shared objects.

    Each compiler command links a small shared object with ``-shared -fPIC``
    (plus ``LDFLAGS``) that is then inspected (tools/toolchain_checks.py).
    Exits with the cause and the fix, or only warns when ``allow`` (default:
    ``MIXPREC_ALLOW_STATIC_LIBSTDCXX=1``). A compiler that cannot build the
    probe at all, or a non-ELF platform, gets a warning: the real build then
    reports its own error.
    """
    if not sys.platform.startswith("linux"):
        return
    if allow is None:
        allow = _flag(_toolchain.OVERRIDE_ENV)
    seen: set[str] = set()
    for cxx in compilers:
        shown = cxx if isinstance(cxx, str) else shlex.join(cxx)
        if shown in seen:
            continue
        seen.add(shown)
        try:
            problem = _toolchain.probe_compiler(
                cxx, work_dir=None, extra_flags=shlex.split(os.environ.get("LDFLAGS", "")))
        except (RuntimeError, ValueError, OSError) as e:
            print(f"mixprec: warning: could not check how {shown} links libstdc++: {e}",
                  flush=True)
            continue
        if problem is None:
            continue
        message = _toolchain.refusal_message(shown, problem)
        if not allow:
            sys.exit(message)
        print(f"{message}\nmixprec: warning: {_toolchain.OVERRIDE_ENV} is set, building anyway.",
              flush=True)


def check_built_extension(path: str | Path, allow: bool | None = None) -> None:
    """Refuse (and delete) a built shared object that carries its own libstdc++."""
    if not sys.platform.startswith("linux") or not Path(path).exists():
        return
    if allow is None:
        allow = _flag(_toolchain.OVERRIDE_ENV)
    try:
        problem = _toolchain.inspect_shared_object(path)
    except (ValueError, OSError) as e:
        print(f"mixprec: warning: could not inspect {path}: {e}", flush=True)
        return
    if problem is None:
        return
    message = _toolchain.refusal_message(_cxx_compiler(), problem, built=True)
    if not allow:
        Path(path).unlink()
        sys.exit(f"{message}\nmixprec: removed {path}.")
    print(f"{message}\nmixprec: warning: {_toolchain.OVERRIDE_ENV} is set, keeping {path}.",
          flush=True)


def _locate_cuda_home() -> None:
    """Point torch at a full CUDA toolkit before cpp_extension looks for one.

    torch derives CUDA_HOME from ``which nvcc`` when CUDA_HOME is unset; a
    wrapper script on PATH (as on this project's machines) then yields a prefix
    without the CUDA headers. Prefer /usr/local/cuda when it holds nvcc.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    candidates = []
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for home in candidates:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            os.environ["CUDA_HOME"] = str(home)
            return


def _version() -> str:
    text = (ROOT / "python" / "mixprec" / "_version.py").read_text()
    match = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    assert match, "python/mixprec/_version.py has no __version__"
    return match.group(1)


def _glob(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        files.extend(sorted(glob.glob(pattern, root_dir=ROOT)))
    return files


#: The stable-ABI version the op libraries are built for (torch 2.11): they load into every
#: torch from 2.11 on, CPU and CUDA builds alike.
TORCH_TARGET_VERSION = "0x020b000000000000"


def _cpu_sources() -> list[str]:
    # The schemas, the CPU kernels, their checks and the build description. (ops.cpp and
    # autograd.cpp are libmixprec's: the C++ API's typed calls and Autograd-key kernels.)
    return _glob(["csrc/registration.cpp", "csrc/build_info.cpp", "csrc/common/*.cpp",
                  "csrc/cpu/*.cpp"])


def _cuda_sources() -> list[str]:
    # The CUDA kernels and their own copy of the host-side checks (csrc/cuda/host_checks.cpp).
    return _glob(["csrc/cuda/*.cu", "csrc/cuda/*.cpp"])


def _test_ext_sources() -> list[str]:
    # The emulated launchers and their own copy of the host-side checks
    # (csrc/cuda_emulation/host_checks.cpp). Host code only: built in every configuration.
    return _glob(["csrc/cuda_emulation/*.cpp"])


def _write_build_config(out_dir: Path, values: dict[str, str]) -> None:
    template = (ROOT / "csrc" / "build_config.h.in").read_text()
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "mixprec_build_config.h"
    if not target.exists() or target.read_text() != template:  # keep ninja's cache warm
        target.write_text(template)


def _extensions() -> tuple[list, dict]:
    _locate_cuda_home()
    import torch
    from torch.utils import cpp_extension

    force_cuda, force_cpu = _flag("MIXPREC_FORCE_CUDA"), _flag("MIXPREC_FORCE_CPU")
    if force_cuda and force_cpu:
        sys.exit("mixprec: MIXPREC_FORCE_CUDA and MIXPREC_FORCE_CPU are both set; pick one.")
    nvcc = None
    if cpp_extension.CUDA_HOME is not None:
        candidate = Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
    torch_cuda = torch.version.cuda
    if force_cuda and torch_cuda is None:
        sys.exit(
            f"mixprec: MIXPREC_FORCE_CUDA=1 but torch {torch.__version__} is not a CUDA build; "
            "install a CUDA build of torch or unset MIXPREC_FORCE_CUDA."
        )
    if force_cuda and nvcc is None:
        sys.exit(
            "mixprec: MIXPREC_FORCE_CUDA=1 but no CUDA toolkit (nvcc) was found; install the "
            "CUDA toolkit matching torch.version.cuda="
            f"{torch_cuda} and set CUDA_HOME, or unset MIXPREC_FORCE_CUDA."
        )
    with_cuda = not force_cpu and torch_cuda is not None and nvcc is not None
    if with_cuda and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "") if with_cuda else ""
    if with_cuda:
        reason = "forced by MIXPREC_FORCE_CUDA" if force_cuda else "CUDA torch + nvcc found"
    elif force_cpu:
        reason = "MIXPREC_FORCE_CPU=1"
    elif torch_cuda is None:
        reason = "torch is a CPU-only build"
    else:
        reason = "no CUDA toolkit (nvcc) found; set CUDA_HOME"
    version = _version()
    cxx_path, cxx_version = _toolchain.compiler_description(_cxx_compiler())
    nvcc_version = _nvcc_release(nvcc) if with_cuda and nvcc else ""
    commit = source_commit()
    print(
        "mixprec build configuration:\n"
        f"  mixprec       {version} (commit {commit or 'unknown'})\n"
        f"  torch         {torch.__version__} (CUDA {torch_cuda or 'none'})\n"
        f"  CUDA kernels  {'yes' if with_cuda else 'no'} ({reason})\n"
        f"  C++ compiler  {cxx_path} ({cxx_version or 'version unknown'})\n"
        f"  nvcc          {nvcc or 'not found'}{f' ({nvcc_version})' if nvcc_version else ''}\n"
        f"  archs         {archs or '-'}\n"
        f"  stable ABI    torch >= 2.11 (TORCH_TARGET_VERSION={TORCH_TARGET_VERSION})",
        flush=True,
    )

    gen_dir = ROOT / "build" / ("generated-cuda" if with_cuda else "generated-cpu")
    _write_build_config(
        gen_dir,
        {
            "MIXPREC_VERSION": version,
            "MIXPREC_TORCH_VERSION": torch.__version__,
            "MIXPREC_CUDA_VERSION": (torch_cuda or "") if with_cuda else "",
            "MIXPREC_CUDA_ARCHS": archs,
            "MIXPREC_WITH_CUDA_KERNELS": "1" if with_cuda else "0",
            "MIXPREC_CXX_COMPILER": _c_string(cxx_path),
            "MIXPREC_CXX_COMPILER_VERSION": _c_string(cxx_version),
            "MIXPREC_NVCC_VERSION": _c_string(nvcc_version),
            "MIXPREC_GIT_COMMIT": _c_string(commit),
        },
    )
    include_dirs = [str(ROOT / "csrc"), str(ROOT / "csrc" / "include"), str(gen_dir)]
    # Stable ABI only: every ATen/c10 header #errors under TORCH_TARGET_VERSION; hidden
    # symbols, so the libraries export only their C entry points and registrations.
    # csrc/compat/glibc_compat.h, first in every translation unit: no glibc symbol above 2.28.
    # csrc/compat/libstdcxx_compat.cpp, linked into each: no libstdc++ version above 3.4.24.
    # No debug info, and __FILE__ (in torch's and mixprec's check messages) relative to the
    # source tree and torch's include folder, so no build machine's path ships.
    stable = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
              "-include", str(ROOT / "csrc" / "compat" / "glibc_compat.h")]
    host = ["-g0", f"-fmacro-prefix-map={ROOT}/=",
            f"-fmacro-prefix-map={cpp_extension.include_paths()[0]}/="]
    cxx_flags = ["-O3", "-fvisibility=hidden", "-ffp-contract=off"] + stable + host
    compat = _glob(["csrc/compat/*.cpp"])

    def library(name: str, sources: list[str], cuda: bool = False):
        """A shared library loaded with torch.ops.load_library (no Python module).

        It links only the torch libraries whose C shims it calls: libtorch_cpu, and for the
        CUDA kernels libtorch_cuda (the current stream) and the CUDA runtime.
        """
        cls = cpp_extension.CUDAExtension if cuda else cpp_extension.CppExtension
        args: dict = {"cxx": cxx_flags}
        if cuda:
            args["nvcc"] = ["-O3", "-lineinfo", "--fmad=false",
                            "-Xcompiler", "-fvisibility=hidden"] + stable
            args["nvcc"] += [arg for flag in host for arg in ("-Xcompiler", flag)]
        ext = cls(name=name, sources=sources + compat, include_dirs=include_dirs,
                  extra_compile_args=args, py_limited_api=True)
        ext.libraries = ["torch_cpu"] + (["torch_cuda", "cudart"] if cuda else [])
        return ext

    exts = [library("mixprec._ops", _cpu_sources())]
    if with_cuda:
        exts.append(library("mixprec._ops_cuda", _cuda_sources(), cuda=True))
    if _flag("MIXPREC_BUILD_TEST_EXT"):
        print("mixprec: MIXPREC_BUILD_TEST_EXT=1: also building mixprec._cuda_emulation "
              "(tests only)", flush=True)
        exts.append(library("mixprec._cuda_emulation", _test_ext_sources()))
    build_ext = _with_cpp_bundle(
        cpp_extension.BuildExtension.with_options(no_python_abi_suffix=False))
    return exts, {"build_ext": build_ext}


def _bundle_cpp(package_dir: Path) -> None:
    """Build libmixprec with CMake and install it into ``package_dir/_cpp``."""
    import torch
    import torch.utils

    cmake = shutil.which("cmake")
    if cmake is None:
        sys.exit("mixprec: MIXPREC_BUNDLE_CPP=1 needs cmake (>= 3.18) on PATH")
    build_dir = Path(os.environ.get("MIXPREC_CPP_BUILD_DIR") or ROOT / "build" / "cmake-bundle")
    if not build_dir.is_absolute():
        build_dir = ROOT / build_dir
    torch_cmake = torch.utils.cmake_prefix_path
    configure = [cmake, "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={torch_cmake}", f"-DTorch_DIR={torch_cmake}/Torch",
                 f"-DMIXPREC_TORCH_VERSION_STRING={torch.__version__}",
                 # RPATH to the pip-installed torch next to the package
                 "-DMIXPREC_PIP_LAYOUT=ON"]
    if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    dest = package_dir / "_cpp"
    print(f"mixprec: building libmixprec (CMake, {build_dir}) into {dest}", flush=True)
    subprocess.check_call(configure)
    subprocess.check_call([cmake, "--build", str(build_dir), "--parallel",
                           os.environ.get("MAX_JOBS", "2")])
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.check_call([cmake, "--install", str(build_dir), "--prefix", str(dest)])
    _single_library_file(dest)


def _single_library_file(dest: Path) -> None:
    """Keep one libmixprec file, named by its soname (wheels store symlinks as copies).

    ``cmake --install`` writes libmixprec.so.X.Y.Z plus the symlinks
    libmixprec.so.X.Y (the soname, what programs load) and libmixprec.so; the
    file becomes libmixprec.so.X.Y and the imported target points at it.
    """
    for libdir in dest.glob("lib*"):
        links = [f for f in libdir.glob("libmixprec.so*") if f.is_symlink()]
        real = [f for f in libdir.glob("libmixprec.so*") if f.is_file() and not f.is_symlink()]
        soname = [f for f in links if re.fullmatch(r"libmixprec\.so\.\d+\.\d+", f.name)]
        if len(real) != 1 or len(soname) != 1:
            continue
        for link in links:
            link.unlink()
        real[0].rename(libdir / soname[0].name)
        for targets in (libdir / "cmake" / "mixprec").glob("mixprecTargets-*.cmake"):
            text = targets.read_text()
            targets.write_text(text.replace(real[0].name, soname[0].name))


def _with_cpp_bundle(base: type) -> type:
    class BuildExtWithCpp(base):  # type: ignore[misc, valid-type]
        def build_extensions(self) -> None:
            # Before anything is compiled: the compiler of the sources and the
            # C++ linker setuptools will use (CXX, or the interpreter's CXX).
            linker = list(getattr(self.compiler, "compiler_cxx", None) or [])
            check_cxx_toolchain([_cxx_compiler()] + ([linker] if linker else []))
            super().build_extensions()

        def build_extension(self, ext) -> None:  # noqa: ANN001 (setuptools Extension)
            super().build_extension(ext)
            check_built_extension(self.get_ext_fullpath(ext.name))

        def run(self) -> None:
            super().run()
            if _flag("MIXPREC_BUNDLE_CPP"):
                inplace = self.inplace or getattr(self, "editable_mode", False)
                package_dir = (ROOT / "python" / "mixprec" if inplace
                               else Path(self.build_lib) / "mixprec")
                _bundle_cpp(package_dir)

    return BuildExtWithCpp


def _bdist_wheel() -> type:
    """bdist_wheel tagged py3-none: the libraries use neither Python's C API nor its ABI."""
    from setuptools.command.bdist_wheel import bdist_wheel

    class BdistWheelPy3(bdist_wheel):
        def get_tag(self) -> tuple[str, str, str]:
            return ("py3", "none", super().get_tag()[2])

    return BdistWheelPy3


ext_modules, cmdclass = _extensions()
cmdclass["bdist_wheel"] = _bdist_wheel()

setup(
    name="mixprec",
    version=_version(),
    package_dir={"": "python"},
    packages=find_packages("python"),
    # the C++ package of MIXPREC_BUNDLE_CPP=1 builds (mixprec.cmake_prefix_path)
    package_data={"mixprec": ["_cpp/include/mixprec/*.h", "_cpp/lib*/libmixprec.so.*",
                              "_cpp/lib*/cmake/mixprec/*.cmake"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
