"""``python -m mixprec.info``: print how mixprec was built and what it runs with."""

from __future__ import annotations

import sys
from typing import Any

from . import _extension
from ._extension import build_info

TOOLCHAIN_KEYS = ("cxx_compiler", "cxx_compiler_version", "nvcc_version")


def toolchain_info() -> dict[str, str | None]:
    """The toolchain recorded in the loaded ``mixprec._C``.

    Keys ``cxx_compiler`` (path of the C++ compiler), ``cxx_compiler_version``
    (first line of its ``--version``) and ``nvcc_version`` (nvcc's release
    line; None without CUDA kernels). All None without the extension or for a
    build that predates the record (module constants set in
    csrc/python_entry/module.cpp from csrc/build_info.cpp).
    """
    module = _extension.EXT
    return {key: (getattr(module, key, "") or None) if module is not None else None
            for key in TOOLCHAIN_KEYS}


def libstdcxx_status() -> str | None:
    """How the loaded ``mixprec._C`` gets libstdc++: "shared", or the problem.

    A ``_C`` that carries its own static copy of libstdc++ crashes (or loses
    the numbers) on error messages that format integers; the build refuses
    such compilers, unless MIXPREC_ALLOW_STATIC_LIBSTDCXX=1 was set. None
    without the extension or on a platform whose binaries are not ELF.
    """
    from . import _toolchain

    path = getattr(_extension.EXT, "__file__", None)
    if path is None or not sys.platform.startswith("linux"):
        return None
    try:
        problem = _toolchain.inspect_shared_object(path)
    except (OSError, ValueError):
        return None
    if problem is None:
        return "shared"
    return ("STATIC COPY, error messages with numbers will misbehave; rebuild with "
            f"CXX=/usr/bin/g++ ({problem})")


def full_info() -> dict[str, Any]:
    """:func:`mixprec.build_info` plus the toolchain, the libstdc++ check and whether the
    FP8 level can run (``fp8``, ``fp8_torchao``, ``fp8_detail``: see
    :func:`mixprec.train.fp8.fp8_info`)."""
    from .train.fp8 import fp8_info

    return {**build_info(), **toolchain_info(), "libstdcxx": libstdcxx_status(), **fp8_info()}


def format_info() -> str:
    """The build information as aligned ``key: value`` lines."""
    info = full_info()
    width = max(len(k) for k in info)
    lines = []
    for key, value in info.items():
        if isinstance(value, list):
            value = ";".join(value) or "-"
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        elif value is None:
            value = "-"
        lines.append(f"{key.ljust(width)} : {value}")
    return "\n".join(lines)


def main() -> int:
    print(format_info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
