"""The commit a tree's sources are at, as a build stamps it into ``build_info()["git_commit"]``
(setup.py) and as ``make gpu-check`` expects it of the mixprec it measures
(tools/gpu_times.py). No third-party imports: setup.py loads this file by path."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


def tree_commit(root: Path) -> str:
    """12 hex digits of ``HEAD``, ``+dirty.<8 hex>`` (sha1 of ``git diff HEAD``) when tracked
    files differ; "" without git."""
    try:
        def git(*args: str) -> bytes:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True,
                                  timeout=60).stdout

        sha = git("rev-parse", "HEAD").decode().strip()[:12]
        diff = git("diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + (f"+dirty.{hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")
