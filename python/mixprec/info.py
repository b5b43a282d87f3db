"""``python -m mixprec.info``: print how mixprec was built and what it runs with."""

from __future__ import annotations

import sys
from typing import Any

from . import _extension
from ._extension import build_info

TOOLCHAIN_KEYS = ("cxx_compiler", "cxx_compiler_version", "nvcc_version")


def toolchain_info() -> dict[str, str | None]:
    """The toolchain recorded in the op library: ``cxx_compiler`` (path),
    ``cxx_compiler_version`` and ``nvcc_version`` (None without CUDA kernels)."""
    return {key: getattr(_extension.EXT, key, "") or None for key in TOOLCHAIN_KEYS}


def full_info() -> dict[str, Any]:
    """:func:`mixprec.build_info` plus the toolchain and whether the FP8 level can run
    (``fp8``, ``fp8_torchao``, ``fp8_detail``: see :func:`mixprec.train.fp8.fp8_info`)."""
    from .train.fp8 import fp8_info

    return {**build_info(), **toolchain_info(), **fp8_info()}


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
