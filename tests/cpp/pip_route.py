"""The pip route to the C++ package, run by ctest (tests/cpp):

    python pip_route.py --prefix <installed mixprec prefix> --example <examples/cpp> --work DIR

Lays out a Python package the way a wheel built with MIXPREC_BUNDLE_CPP=1 has
it (the mixprec package of this Python, with the installed C++ package copied
to mixprec/_cpp), then, with only that package on PYTHONPATH:

* ``mixprec.cmake_prefix_path`` names mixprec/_cpp;
* examples/cpp configures with ``-DCMAKE_PREFIX_PATH=<that>`` alone
  (find_package(mixprec) finds Torch itself), builds and runs.

It does not run setup.py (that would compile the kernels again); the setup.py
step is the `cmake --install` into mixprec/_cpp tested here plus the
package_data that ships it. Exit status 77 (skipped) without mixprec.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

SKIP = 77


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--generator", default="")
    args = ap.parse_args()

    try:
        import mixprec  # noqa: F401
    except Exception as exc:  # pragma: no cover
        print(f"SKIP: cannot import mixprec: {exc}")
        return SKIP
    src_pkg = Path(mixprec.__file__).resolve().parent
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    site = work / "site"
    pkg = site / "mixprec"
    # the Python package (compiled modules linked, not copied)
    shutil.copytree(src_pkg, pkg, ignore=shutil.ignore_patterns("__pycache__", "_cpp", "*.so"))
    for so in src_pkg.glob("*.so"):
        (pkg / so.name).symlink_to(so)
    # what `cmake --install <build> --prefix mixprec/_cpp` puts there
    shutil.copytree(args.prefix, pkg / "_cpp", symlinks=True)

    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import mixprec\n"
            "p = getattr(mixprec, 'cmake_prefix_path', None)\n"
            "if p is None:\n"
            "    import sys; print('note: mixprec.cmake_prefix_path not exported by __init__; '\n"
            "                      'using mixprec._cmake', file=sys.stderr)\n"
            "    from mixprec._cmake import cmake_prefix_path as p\n"
            "print(p)\n")
    prefix = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                            capture_output=True, text=True)
    sys.stderr.write(prefix.stderr)
    prefix_path = prefix.stdout.strip().splitlines()[-1]
    print("mixprec.cmake_prefix_path =", prefix_path)
    if Path(prefix_path).resolve() != (pkg / "_cpp").resolve():
        print(f"FAIL cmake_prefix_path {prefix_path} is not {pkg / '_cpp'}")
        print("0 passed, 1 failed")
        return 1

    build = work / "example"
    configure = ["cmake", "-S", args.example, "-B", str(build),
                 "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix_path}"]
    if args.generator:
        configure += ["-G", args.generator]
    # a clean environment for find_package: no Torch_DIR / prefix from the caller
    cenv = {k: v for k, v in os.environ.items() if k not in ("CMAKE_PREFIX_PATH", "Torch_DIR")}
    subprocess.run(configure, env=cenv, check=True)
    subprocess.run(["cmake", "--build", str(build), "-j", os.environ.get("CPP_JOBS", "2")],
                   env=cenv, check=True)
    exe = build / "train_mlp"
    out = subprocess.run([str(exe), "--steps", "3", "--inject-inf", "2"], check=True,
                         capture_output=True, text=True).stdout
    print(out)
    ok = "done: 3 steps, 1 skipped" in out
    # the example links the bundled library, not another copy
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    lib_line = next((line for line in ldd.splitlines() if "libmixprec" in line), "")
    print(lib_line.strip())
    bundled = str((pkg / "_cpp").resolve()) in lib_line
    print("ok  example built + ran from mixprec.cmake_prefix_path" if ok else "FAIL example run")
    print("ok  links mixprec/_cpp/lib/libmixprec" if bundled else "FAIL not the bundled lib")
    passed = int(ok) + int(bundled) + 1
    print(f"{passed} passed, {3 - passed} failed")
    return 0 if passed == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
