"""Where a pip-installed mixprec keeps its C++ package (headers, libmixprec,
CMake files), for LibTorch programs::

    cmake -DCMAKE_PREFIX_PATH="$(python -c 'import mixprec; print(mixprec.cmake_prefix_path)')" ..

    # CMakeLists.txt
    find_package(mixprec REQUIRED)      # finds Torch too
    target_link_libraries(app PRIVATE mixprec::mixprec)

The prefix is ``<package>/_cpp`` (``include/mixprec/*.h``,
``lib/libmixprec.so``, ``lib/cmake/mixprec/``). It is filled when the package
is built with ``MIXPREC_BUNDLE_CPP=1`` (setup.py then also builds and installs
libmixprec with CMake; wheels are built that way). Without it, build
libmixprec from the source tree (``cmake --install``) and use that prefix.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["cmake_prefix_path", "has_cpp_package", "cpp_package_config"]

#: The CMake prefix of mixprec's C++ package inside this Python package (a
#: string, like ``torch.utils.cmake_prefix_path``). See :func:`has_cpp_package`.
cmake_prefix_path: str = str(Path(__file__).resolve().parent / "_cpp")


def cpp_package_config() -> Path | None:
    """The bundled ``mixprecConfig.cmake``, or None when this package has none."""
    root = Path(cmake_prefix_path)
    for libdir in ("lib", "lib64"):
        config = root / libdir / "cmake" / "mixprec" / "mixprecConfig.cmake"
        if config.is_file():
            return config
    return None


def has_cpp_package() -> bool:
    """Whether this package ships the C++ package (built with MIXPREC_BUNDLE_CPP=1)."""
    return cpp_package_config() is not None


if __name__ == "__main__":  # python -m mixprec._cmake
    import sys

    if not has_cpp_package():
        print(f"mixprec: no C++ package under {cmake_prefix_path} (build with "
              "MIXPREC_BUNDLE_CPP=1, or use a CMake install of the repository)",
              file=sys.stderr)
        sys.exit(1)
    print(cmake_prefix_path)
