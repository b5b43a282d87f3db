"""``python -m mixprec.info``: print how mixprec was built and what it runs with."""

from __future__ import annotations

import sys

from ._extension import build_info


def format_info() -> str:
    """The build information as aligned ``key: value`` lines."""
    info = build_info()
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
