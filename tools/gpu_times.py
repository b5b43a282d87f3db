"""What tools/gpu_check.py decides before running a part: how long the part is expected to
take and where that figure comes from, and whether the installed mixprec was built from the
commit of the tree being checked.

Measured part times: each run records every part it ran (seconds, whether it was killed at
its limit, the machine, torch, commit, date) in ``times.json`` in its ``--out`` folder and in
``build/gpu-check-times.json`` (kept between the calls on a warm machine). Estimates come,
first found first, from ``build/gpu-check-times.json`` (an earlier call on this machine),
``tools/gpu_check_times.json`` (a GPU run's ``times.json``, committed), else the part's
built-in guess. Each mode (``gpu``, ``cpu-smoke``) has its own records.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import commit_stamp

ROOT = Path(__file__).resolve().parent.parent
LOCAL_TIMES = ROOT / "build" / "gpu-check-times.json"
COMMITTED_TIMES = ROOT / "tools" / "gpu_check_times.json"
MARGIN = 1.15  # a measured time, plus this share, is the estimate


def load(paths: List[Path], mode: str) -> Dict[str, Tuple[dict, str]]:
    """{part: (its record, the file it came from)}: for each part, the first file of
    ``paths`` that has a record of it in ``mode``."""
    found: Dict[str, Tuple[dict, str]] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records = data.get(mode, {}) if isinstance(data, dict) else {}
        for part, rec in records.items() if isinstance(records, dict) else []:
            if part not in found and isinstance(rec, dict) and "seconds" in rec:
                found[part] = (rec, str(path.relative_to(ROOT) if path.is_relative_to(ROOT)
                                        else path))
    return found


def estimate(guess: float, limit: float, rec: Optional[Tuple[dict, str]]
             ) -> Tuple[float, str]:
    """(expected seconds, where the figure comes from). A record of a part killed at its
    limit says only "at least that": the limit it had then, or the guess if larger."""
    if rec is None:
        return guess, "guess"
    r, where = rec
    seconds = float(r["seconds"])
    what = f"{r.get('gpu', '?')}, {r.get('date', '?')}, {r.get('commit', '?')}"
    if r.get("timed_out"):
        return max(guess, seconds, limit), f"killed at {seconds:.0f} s in {where} ({what})"
    return math.ceil(seconds * MARGIN), f"measured {seconds:.0f} s in {where} ({what})"


def record(paths: List[Path], mode: str, part: str, seconds: float, timed_out: bool,
           status: str, gpu: str, torch: str, commit: str) -> None:
    """Add (or replace) ``part``'s record in each file of ``paths``."""
    rec = {"seconds": round(seconds, 1), "timed_out": timed_out, "status": status,
           "gpu": gpu, "torch": torch, "commit": commit,
           "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"}
    for path in paths:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data.setdefault(mode, {})[part] = rec
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)


def tree_commit(root: Path = ROOT) -> str:
    """The commit of the tree being checked, as setup.py's ``source_commit()`` stamps it
    (:func:`commit_stamp.tree_commit`)."""
    return commit_stamp.tree_commit(root)


def commit_verdict(built: Optional[str], tree: str, allow: bool) -> Tuple[bool, str]:
    """(may the figures be credited to the tree, what to say): the installed mixprec's
    ``build_info()["git_commit"]`` (``built``) against the tree's commit."""
    if built and tree and built == tree:
        return True, f"built at {built}, the tree's commit"
    if not built:
        why = "carries no commit stamp (built before the stamp, or by CMake)"
    elif not tree:
        why = f"was built at {built}; the tree's commit is unknown (no git here)"
    else:
        why = f"was built at {built}, the tree is at {tree}"
    if allow:
        return True, f"mixprec {why}: allowed by --allow-other-commit"
    return False, (f"mixprec {why}: its figures would be credited to another commit. Rebuild "
                   "it from this tree (make wheel, or make build) or pass --allow-other-commit")
