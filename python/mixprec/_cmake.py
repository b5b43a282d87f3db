"""Where a pip-installed mixprec keeps its C++ package (headers, libmixprec, CMake files)::

    cmake -DCMAKE_PREFIX_PATH="$(python -c 'import mixprec; print(mixprec.cmake_prefix_path)')" ..
    # CMakeLists.txt
    find_package(mixprec REQUIRED)      # finds Torch too
    target_link_libraries(app PRIVATE mixprec::mixprec)

The prefix, ``<package>/_cpp``, is filled when the package is built with
``MIXPREC_BUNDLE_CPP=1`` (not by default, and not by ``make wheel``); without it
``cmake_prefix_path`` raises FileNotFoundError, saying how to get one, when used as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["cmake_prefix_path", "has_cpp_package", "cpp_package_config"]

_PREFIX = Path(__file__).resolve().parent / "_cpp"


def cpp_package_config() -> Path | None:
    """The bundled ``mixprecConfig.cmake``, or None when this package has none."""
    for libdir in ("lib", "lib64"):
        config = _PREFIX / libdir / "cmake" / "mixprec" / "mixprecConfig.cmake"
        if config.is_file():
            return config
    return None


def has_cpp_package() -> bool:
    """Whether this package ships the C++ package (built with MIXPREC_BUNDLE_CPP=1)."""
    return cpp_package_config() is not None


def missing_cpp_package_message() -> str:
    """Why :data:`cmake_prefix_path` is unusable here, and how to get the C++ package."""
    return (
        f"mixprec: this installation has no C++ package: {_PREFIX} does not hold "
        "lib/cmake/mixprec/mixprecConfig.cmake. Editable and default installs do not build "
        "it. Either reinstall the Python package with it, from the source tree:\n"
        "  MIXPREC_BUNDLE_CPP=1 pip install --no-build-isolation .\n"
        "or build and install libmixprec with CMake and use that prefix instead:\n"
        "  TORCH_CMAKE=$(python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')\n"
        "  cmake -S . -B build/cmake -DCMAKE_PREFIX_PATH=\"$TORCH_CMAKE\"\n"
        "  cmake --build build/cmake -j && cmake --install build/cmake --prefix <prefix>\n"
        "  cmake -DCMAKE_PREFIX_PATH=\"<prefix>;$TORCH_CMAKE\" ..."
    )


class MissingCppPackage(str):
    """:data:`cmake_prefix_path` without the C++ package: equal to the path, but turning it
    into text (``str()``, ``print``, f-strings, ``%``, ``+``, :func:`os.path.join`) raises
    FileNotFoundError saying how to get the package (str methods still see the plain path).
    Once the package exists it behaves as the plain path.
    """

    __slots__ = ()

    def __str__(self) -> str:
        if not has_cpp_package():
            raise FileNotFoundError(missing_cpp_package_message())
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __add__(self, other: Any) -> str:
        return str(self) + other

    def __radd__(self, other: Any) -> str:
        return other + str(self)

    def __mod__(self, other: Any) -> str:
        return str(self) % other

    def __repr__(self) -> str:
        return f"MissingCppPackage({str.__repr__(self)})"


#: The CMake prefix of the C++ package, ``<package>/_cpp`` (a string, like
#: ``torch.utils.cmake_prefix_path``); a :class:`MissingCppPackage` without it.
cmake_prefix_path: str = str(_PREFIX) if has_cpp_package() else MissingCppPackage(_PREFIX)


if __name__ == "__main__":  # python -m mixprec._cmake
    import sys

    if not has_cpp_package():
        print(missing_cpp_package_message(), file=sys.stderr)
        sys.exit(1)
    print(_PREFIX)
