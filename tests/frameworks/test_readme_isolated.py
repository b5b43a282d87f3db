"""The README's runnable code blocks need nothing but torch and mixprec.

``tests/project/test_docs.py`` runs them in the test process, where pytest, numpy, tqdm and the
frameworks are importable: a block that needs one of those still passes there. Here they
run in a subprocess started with ``python -S`` (no ``site``: no site-packages on
``sys.path``, no ``.pth`` files run) whose ``sys.path`` is the standard library, the
folder mixprec is imported from and torch's site-packages folder, with a
``sys.meta_path`` finder that fails every import whose top-level name is not

* in the standard library (``sys.stdlib_module_names``, ``_sysconfigdata*``),
* ``torch`` or ``mixprec``,
* a distribution ``torch`` requires, transitively, as ``importlib.metadata`` lists them
  (sympy, mpmath, networkx, jinja2, markupsafe, filelock, fsspec, typing_extensions, ...;
  the blocker's allowed set is printed on failure),

so the rest of site-packages (numpy, tqdm, lightning, ...) is there but cannot be
imported (the finder stands in for ``importlib.machinery.PathFinder``: a blocked module
looks uninstalled, ``importlib.util.find_spec`` answers None as torch's optional-module
probes expect). The blocks run in order, in one namespace, each reported separately.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
import torch

import mixprec
from _helpers import REPO, runnable_blocks

ROOT = REPO
BLOCKS = runnable_blocks((ROOT / "README.md").read_text())
#: A block that needs more than torch and mixprec today, and why: xfail(strict=True),
#: so the day it passes the marker must go.
NEEDS_MORE: Dict[str, Tuple[str, str]] = {}
#: Imports the runner tries after the blocks: blocked (not required by torch).
PROBES = ("numpy", "tqdm", "lightning")
#: What ``import mixprec`` (and ``mixprec.integrations``) must not even try to import.
FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate", "transformers")


def _dist_top_levels(dist: metadata.Distribution) -> Set[str]:
    """The top-level import names a distribution installs."""
    names = set()
    top = dist.read_text("top_level.txt")
    if top:
        names |= {n.strip() for n in top.split() if n.strip()}
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] == "..":
            continue
        if len(parts) == 1:
            if parts[0].endswith(".py"):
                names.add(parts[0][:-3])
            elif parts[0].endswith(".so"):
                names.add(parts[0].split(".")[0])
        else:
            names.add(parts[0])
    return {n for n in names if n.isidentifier()}


@cache
def allowed_modules() -> Set[str]:
    """torch, mixprec, and the top-level names of the distributions torch requires,
    transitively (extras and environment markers that do not hold left out)."""
    names = {"torch", "mixprec"}
    seen: Set[str] = set()
    todo = ["torch"]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        names |= _dist_top_levels(dist)
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            if marker.strip():
                try:
                    from packaging.markers import Marker
                except ImportError:  # (packaging missing: keep the requirement)
                    pass
                else:
                    if not Marker(marker).evaluate():
                        continue
            todo.append(re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0])
    return names


RUNNER = r'''
import contextlib, importlib.abc, importlib.machinery, io, json, sys, traceback
allowed = set(ALLOWED) | set(sys.stdlib_module_names) | set(sys.builtin_module_names)

class Blocker(importlib.abc.MetaPathFinder):
    """Stands in for the path finder: finds only the allowed top-level names."""
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in allowed and not top.startswith("_sysconfigdata"):
            attempted.add(top)
            return None  # as if not installed: "No module named ...", find_spec is None
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)

sys.meta_path[:] = [Blocker() if f is importlib.machinery.PathFinder else f
                    for f in sys.meta_path]
attempted = set()
sys.path[:0] = PATHS
import mixprec.integrations  # (besides what the blocks import)
results, ns = [], {"__name__": "readme"}
for k, code in enumerate(BLOCKS):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README.md runnable block {k}", "exec"), ns)
        results.append({"ok": True})
    except BaseException:
        results.append({"ok": False, "error": traceback.format_exc()})
tried = sorted(attempted)
probes = {}
for name in PROBES:
    try:
        __import__(name)
        probes[name] = "imported"
    except ModuleNotFoundError as e:
        probes[name] = str(e)
import sysconfig
std = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib"))
foreign = sorted({n.split(".")[0] for n, m in list(sys.modules.items())
                  if n.split(".")[0] not in allowed and getattr(m, "__file__", None)
                  and not str(m.__file__).startswith(std)})
print("@@RESULT@@" + json.dumps({"blocks": results, "foreign": foreign,
                                   "probes": probes, "tried": tried}))
'''


@cache
def run_blocks() -> Dict[str, object]:
    """Run every runnable README block in one isolated subprocess; its report."""
    paths = [str(Path(mixprec.__file__).resolve().parents[1]),
             str(Path(torch.__file__).resolve().parents[1])]
    script = (RUNNER.replace("ALLOWED", repr(sorted(allowed_modules())))
              .replace("PATHS", repr(paths)).replace("BLOCKS", repr(BLOCKS))
              .replace("PROBES", repr(PROBES)))
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    if proc.returncode != 0 or not marker:
        pytest.fail(f"the isolated runner failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(marker[0][len("@@RESULT@@"):])


def _cases() -> List[object]:
    cases = []
    for k, code in enumerate(BLOCKS):
        why = [reason for needle, reason in NEEDS_MORE.items() if needle in code]
        marks = [pytest.mark.xfail(strict=True, raises=ModuleNotFoundError, reason=why[0][1])
                 ] if why else []
        cases.append(pytest.param(k, marks=marks, id=f"block{k}"))
    return cases


def test_there_are_blocks() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("k", _cases())
def test_readme_block_runs_with_only_torch_and_mixprec(k: int) -> None:
    result = run_blocks()["blocks"][k]  # type: ignore[index]
    if not result["ok"]:
        for needle, (module, _) in NEEDS_MORE.items():
            if needle in BLOCKS[k] and f"No module named '{module}'" in result["error"]:
                raise ModuleNotFoundError(f"README block {k}:\n{result['error']}")
    assert result["ok"], f"README block {k} failed:\n{result['error']}"


def test_the_blocker_blocks() -> None:
    """The isolation itself: what torch does not require cannot be imported in the
    runner, what it requires can, and no module loaded from a file outside the standard
library and the allowed packages is left in ``sys.modules`` after the blocks."""
    assert {"torch", "mixprec", "typing_extensions", "sympy"} <= allowed_modules()
    report = run_blocks()
    for name in PROBES:
        assert name not in allowed_modules()
        assert report["probes"][name] == f"No module named '{name}'"  # type: ignore[index]
    assert report["foreign"] == []


def test_mixprec_does_not_try_to_import_a_framework() -> None:
    """The frameworks stay optional: ``import mixprec``, ``mixprec.integrations`` and the
    README's blocks try no framework import (not even one guarded by try/except: the
    runner's finder records every name it refused)."""
    tried = run_blocks()["tried"]  # type: ignore[index]
    assert [m for m in FRAMEWORKS if m in tried] == [], tried
