"""Run PyTorch's own optimizer test suite against mixprec's Adam, AdamW and SGD.

Usage::

    PYTHONPATH=python .venv/bin/python tools/torch_optim_suite.py \\
        build/torch_tests/test_optim.py [--dtype float32 | --dtype all] \\
        [--side torch --side mixprec] [-k EXPR] [--out build/torch_optim_suite] \\
        [--report FILE.md]

``build/torch_tests/test_optim.py`` is torch's ``test/test_optim.py`` of the installed
torch's version; it is not in the wheel and is not part of this repository (fetch it
from pytorch's sources and keep it under the git-ignored ``build/``).

What it does:

1. Builds two optimizer databases from ``torch.testing._internal.common_optimizers``
   (``optim_db``, a list of ``OptimizerInfo``): **torch** (torch's own infos for
   ``torch.optim.Adam``/``AdamW``/``SGD``, untouched) and **mixprec** (copies of those
   three with ``optim_cls`` replaced by ``mixprec.optim.Adam``/``AdamW``/``SGD``, the class
   names being the same, and with the capabilities mixprec lacks switched off; see
   :func:`mixprec_info` for each change and why).
2. For each side, writes a small pytest module under ``--out`` that patches
   ``common_optimizers.optim_db`` with that side's database and then imports torch's
   test file (whose ``@optims(optim_db)`` decorators and ``instantiate_device_type_tests``
   then see only the substituted infos), and runs it with pytest on CPU only
   (``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu``), ``-p no:cacheprovider -q``, one process,
   recording a JUnit XML file. The module's stub-only sibling imports
   (``optim.test_lrscheduler``, ``optim.test_optim``, ``optim.test_swa_utils``: other
   classes of torch's test directory) are replaced by empty stand-ins, and the two tests
   that do not go through ``optim_db`` (``test_adamw_serialization``, hard-wired to
   ``torch.optim.AdamW``; ``test_step_iteration``, LBFGS) are deselected.
3. Audits ``test_errors``' inputs one by one (torch's ``optim_error_inputs_func``): for each
   error input, what torch's class and mixprec's class raise (type and message), since
   ``test_errors`` itself stops at the first mismatch.
4. Prints, per test name, passed/failed/skipped for torch's classes and mixprec's
   ("not generated" where a capability was switched off, with the reason), the failure
   messages, the optimizer inputs dropped for mixprec and why, and the totals.

``--dtype`` selects the tests whose name carries that dtype (repeatable; default
``float32``, which is every test of Adam/AdamW/SGD except torch's fused/foreach/sparse/
complex ones; ``all`` runs every dtype). The exit status is 0 when the runs completed
(whatever the test outcomes), 2 when pytest could not run.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import time
import types
import unittest
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
SIDES = ("torch", "mixprec")
OPTIM_NAMES = ("Adam", "AdamW", "SGD")

#: Tests of torch's TestOptimRenewed that do not read optim_db (deselected).
NOT_DB_DRIVEN = ("test_adamw_serialization", "test_step_iteration")

#: mixprec's own param-group keys, added to ``not_og_supported_flags``: a state dict from
#: torch (or from before these keys) lacks them, and load_state_dict fills them from the
#: defaults (``FusedOptimizer.load_state_dict``).
MIXPREC_EXTRA_FLAGS = ("master_weights", "stochastic_rounding", "seed", "state_bits",
                       "min_8bit_size")

#: Why a test of torch's suite is not generated for mixprec's infos (prefix of the test
#: name -> reason). Filled from the capabilities :func:`mixprec_info` switches off.
NOT_GENERATED_REASONS: Dict[str, str] = {
    "test_foreach_matches_forloop": (
        "supported_impls has no 'foreach': mixprec has one implementation (a fused "
        "kernel); foreach= is accepted and ignored, so foreach-vs-forloop parity has "
        "nothing to compare"),
    "test_fused_matches_forloop": (
        "supported_impls has no 'fused' / supports_fused_on=(): fused= is accepted and "
        "ignored (always fused); no second implementation to compare"),
    "test_fused_error_on_params_on_meta": (
        "needs 'fused' in supported_impls and torch's fused-path error message for meta "
        "params"),
    "test_fused_large_tensor": "needs 'fused' in supported_impls (and 64 GB)",
    "test_cpu_load_state_dict": "needs 'fused' in supported_impls (and a non-CPU device)",
    "test_fused_": "needs 'fused' in supported_impls (torch runs these on CUDA only)",
    "test_mixed_device_dtype": "needs 'foreach' or 'fused' in supported_impls (and 2 GPUs)",
    "test_peak_memory_foreach": "needs 'foreach' in supported_impls (and CUDA)",
    "test_defaults_changed_to_foreach": "needs 'foreach' in supported_impls (and CUDA)",
    "test_set_default_dtype_works_with_foreach": "needs 'foreach' in supported_impls (and CUDA)",
    "test_foreach_large_tensor": "needs 'foreach' in supported_impls (and CUDA, 72 GB)",
    "test_complex": (
        "supports_complex=False: mixprec takes float32/float16/bfloat16 params only "
        "(complex params raise RuntimeError by design)"),
    "test_rosenbrock_sparse": (
        "supports_sparse=False: mixprec refuses sparse grads (RuntimeError by design)"),
}


# -- the databases ---------------------------------------------------------------------


@dataclass
class Dropped:
    """An optimizer input of torch's info left out of mixprec's, and why."""

    optim: str
    desc: str
    kwargs: str
    reason: str


def _mixprec_classes() -> Dict[str, type]:
    import mixprec.optim as mo

    return {"Adam": mo.Adam, "AdamW": mo.AdamW, "SGD": mo.SGD}


def _accepted_kwargs(cls: type) -> Tuple[str, ...]:
    return tuple(n for n in inspect.signature(cls.__init__).parameters
                 if n not in ("self", "params"))


def why_unsupported(cls: type, kwargs: Dict[str, Any]) -> Optional[str]:
    """Why mixprec's ``cls`` cannot take the optimizer input ``kwargs`` (None: it can)."""
    unknown = sorted(set(kwargs) - set(_accepted_kwargs(cls)))
    if unknown:
        return f"{cls.__name__}() has no argument {', '.join(unknown)}"
    if kwargs.get("differentiable", False):
        return "differentiable=True is refused by design (the step is a fused in-place kernel)"
    return None


def _filtered_inputs(func: Callable[..., List[Any]], cls: type) -> Callable[..., List[Any]]:
    """torch's ``optim_inputs_func`` without the inputs ``cls`` cannot take."""

    def optim_inputs_func(device: Any, dtype: Any = None) -> List[Any]:
        return [i for i in func(device, dtype) if why_unsupported(cls, i.kwargs) is None]

    return optim_inputs_func


def torch_infos() -> List[Any]:
    """torch's own OptimizerInfos for torch.optim.Adam, AdamW and SGD (in optim_db's order)."""
    import torch
    from torch.testing._internal import common_optimizers as co

    wanted = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
    infos = [i for i in co.optim_db if i.optim_cls in wanted]
    if len(infos) != len(wanted):
        raise RuntimeError("optim_db lacks an info for one of torch.optim.Adam/AdamW/SGD")
    return infos


def mixprec_info(info: Any) -> Any:
    """A copy of torch's ``info`` for mixprec's class of the same name.

    Changes, all of them capabilities mixprec does not have:

    * ``supported_impls=()``, ``supports_fused_on=()``: mixprec has one implementation, a
      fused kernel; ``foreach=``/``fused=`` are accepted and ignored and
      ``differentiable=True`` raises ValueError, so torch's tests that toggle these flags
      (parity between implementations, differentiable variants) do not apply;
    * ``supports_sparse=False``: sparse grads raise RuntimeError;
    * ``supports_complex=False``: complex params raise RuntimeError (float32/float16/
      bfloat16 only);
    * ``optim_inputs_func`` drops inputs with arguments mixprec's constructor lacks (none
      on CPU at torch 2.14: reported by the summary);
    * ``not_og_supported_flags`` += mixprec's own group keys (:data:`MIXPREC_EXTRA_FLAGS`),
      so test_can_load_older_state_dict also loads dicts without them.

    Everything else (scheduler inputs, error inputs and their expected messages, skips)
    is torch's.
    """
    cls = _mixprec_classes()[info.name]
    new = copy.copy(info)
    new.optim_cls = cls
    new.supported_impls = ()
    new.supports_fused_on = ()
    new.supports_sparse = False
    new.metadata_for_sparse = ({}, [])
    new.supports_complex = False
    new.optim_inputs_func = _filtered_inputs(info.optim_inputs_func, cls)
    new.not_og_supported_flags = tuple(info.not_og_supported_flags) + MIXPREC_EXTRA_FLAGS
    return new


def build_db(side: str) -> List[Any]:
    infos = torch_infos()
    return infos if side == "torch" else [mixprec_info(i) for i in infos]


def dropped_inputs(dtypes: Sequence[Any]) -> List[Dropped]:
    """The inputs of torch's infos that :func:`mixprec_info` leaves out, on CPU."""
    out: List[Dropped] = []
    classes = _mixprec_classes()
    for info in torch_infos():
        for dtype in dtypes:
            for i in info.optim_inputs_func("cpu", dtype):
                reason = why_unsupported(classes[info.name], i.kwargs)
                if reason is not None:
                    out.append(Dropped(info.name, i.desc, repr(i.kwargs), reason))
    return out


# -- loading torch's test file (inside the pytest process) -------------------------------


def _stub_sibling_modules() -> None:
    """torch's test_optim.py imports three classes from its own test directory
    (``optim/test_*.py``) only to re-export them; give it empty stand-ins."""
    names = {"optim.test_lrscheduler": "TestLRScheduler",
             "optim.test_optim": "TestDifferentiableOptimizer",
             "optim.test_swa_utils": "TestSWAUtils"}
    if "optim" not in sys.modules:
        pkg = types.ModuleType("optim")
        pkg.__path__ = []
        sys.modules["optim"] = pkg
    for mod_name, cls_name in names.items():
        if mod_name not in sys.modules:
            mod = types.ModuleType(mod_name)
            # not a TestCase and no test_* methods: pytest collects nothing from it
            setattr(mod, cls_name, type(cls_name, (), {"__test__": False}))
            sys.modules[mod_name] = mod


def load_suite(path: str, side: str) -> Dict[str, type]:
    """Import torch's test file at ``path`` with ``side``'s optim_db; return its CPU test
    classes (for a generated pytest module to put in its globals)."""
    os.environ.setdefault("PYTORCH_TESTING_DEVICE_ONLY_FOR", "cpu")
    from torch.testing._internal import common_optimizers as co

    co.optim_db = build_db(side)  # read by the test file's imports and decorators
    _stub_sibling_modules()
    name = f"torch_test_optim_{side}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return {k: v for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, unittest.TestCase)
            and k.startswith("Test") and k.endswith("CPU")}


# -- running pytest --------------------------------------------------------------------


SHIM = '''\
# Generated by tools/torch_optim_suite.py: torch's test_optim.py with the {side} optim_db.
import sys

sys.path.insert(0, {tools!r})
import torch_optim_suite as _suite  # noqa: E402

globals().update(_suite.load_suite({path!r}, {side!r}))
'''


@dataclass
class Outcome:
    status: str  # passed, failed, skipped
    message: str = ""


@dataclass
class SideRun:
    side: str
    seconds: float
    returncode: int
    results: Dict[str, Outcome] = field(default_factory=dict)
    tail: str = ""


def _k_expression(dtypes: Sequence[str], extra: Optional[str]) -> str:
    parts = [" and ".join(f"not {t}" for t in NOT_DB_DRIVEN)]
    if "all" not in dtypes:
        parts.append("(" + " or ".join(dtypes) + ")")
    if extra:
        parts.append(f"({extra})")
    return " and ".join(parts)


def _parse_junit(xml_path: Path) -> Dict[str, Outcome]:
    out: Dict[str, Outcome] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "?")
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                text = (child.text or "").strip().splitlines()
                message = child.get("message") or (text[-1] if text else child.tag)
                break
            if child.tag == "skipped":
                status, message = "skipped", child.get("message", "")
        # (without common_utils' repro hint; a KeyError's message is a repr: \n escaped)
        message = message.replace("\\n", "\n").split("To execute this test")[0]
        out[name] = Outcome(status, " ".join(message.split())[:300])
    return out


def run_side(side: str, test_file: Path, out: Path, k: str) -> SideRun:
    out.mkdir(parents=True, exist_ok=True)
    shim = out / f"test_torch_optim_{side}.py"
    shim.write_text(SHIM.format(side=side, tools=str(REPO / "tools"), path=str(test_file)))
    (out / "pytest.ini").write_text("[pytest]\n")  # not the project's config or conftest
    xml_path = out / f"junit_{side}.xml"
    if xml_path.exists():
        xml_path.unlink()
    cmd = [sys.executable, "-m", "pytest", str(shim), "-p", "no:cacheprovider", "-q",
           "-c", str(out / "pytest.ini"), "--rootdir", str(out), "-k", k,
           f"--junitxml={xml_path}", "-o", "junit_family=xunit2"]
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu")
    print(f"[{side}] {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=str(out), env=env, capture_output=True, text=True)
    run = SideRun(side, time.monotonic() - start, proc.returncode,
                  tail="\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:]))
    if xml_path.exists():
        run.results = _parse_junit(xml_path)
    print(f"[{side}] pytest exit {proc.returncode} in {run.seconds:.0f} s, "
          f"{len(run.results)} tests", flush=True)
    return run


# -- test_errors, input by input -------------------------------------------------------


def _try(func: Callable[[], Any], warning: bool) -> str:
    """What ``func`` does: 'ok', 'TypeName: message' or 'warns TypeName: message'."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            func()
    except Exception as e:  # noqa: BLE001 (any exception is a result here)
        return f"{type(e).__name__}: {e}"
    if warning and caught:
        w = caught[0]
        return f"warns {w.category.__name__}: {w.message}"
    return "ok"


def _matches(result: str, error_type: type, regex: str) -> bool:
    name, _, message = result.removeprefix("warns ").partition(": ")
    return name == error_type.__name__ and re.search(regex, message) is not None


def audit_errors() -> List[Tuple[str, str, str, str, bool, bool]]:
    """Each error input of torch's Adam/AdamW/SGD infos on CPU float32: (optim, desc,
    torch's result, mixprec's result, torch matches the expectation, mixprec matches)."""
    import torch
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum

    rows = []
    classes = _mixprec_classes()
    for info in torch_infos():
        if info.optim_error_inputs_func is None:
            continue
        n = len(info.optim_error_inputs_func(device="cpu", dtype=torch.float32))
        for index in range(n):
            results = []
            for cls in (info.optim_cls, classes[info.name]):
                # fresh inputs per class: a step may change the params
                e = info.optim_error_inputs_func(device="cpu", dtype=torch.float32)[index]
                oi = e.optimizer_error_input
                warning = issubclass(e.error_type, Warning)
                if e.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR:
                    def call(c: type = cls, o: Any = oi) -> Any:
                        return c(o.params, **o.kwargs)
                else:
                    def call(c: type = cls, o: Any = oi) -> Any:
                        return c(o.params, **o.kwargs).step()
                results.append(_try(call, warning))
            rows.append((info.name, f"{oi.desc} (expects {e.error_type.__name__} "
                                    f"/{e.error_regex}/)", results[0], results[1],
                         _matches(results[0], e.error_type, e.error_regex),
                         _matches(results[1], e.error_type, e.error_regex)))
    return rows


# -- the report ------------------------------------------------------------------------


def _not_generated(name: str) -> str:
    for prefix, reason in NOT_GENERATED_REASONS.items():
        if name.startswith(prefix):
            return reason
    return "not generated"


def report(runs: Dict[str, SideRun], dropped: List[Dropped],
           errors: List[Tuple[str, str, str, str, bool, bool]]) -> str:
    lines: List[str] = []
    names = sorted(set().union(*(r.results for r in runs.values())))
    width = max([len(n) for n in names] + [10])
    lines.append("## Per test (CPU)\n")
    lines.append(f"{'test':<{width}}  " + "  ".join(f"{s:<8}" for s in runs))
    for n in names:
        cells = [runs[s].results[n].status if n in runs[s].results else "absent"
                 for s in runs]
        lines.append(f"{n:<{width}}  " + "  ".join(f"{c:<8}" for c in cells))
    if "mixprec" in runs:
        absent = [n for n in names if n not in runs["mixprec"].results]
        if absent:
            lines.append("\n## Not generated for mixprec's infos\n")
            for n in absent:
                lines.append(f"- {n}: {_not_generated(n)}")
    for side, run in runs.items():
        bad = [(n, o) for n, o in sorted(run.results.items()) if o.status == "failed"]
        if bad:
            lines.append(f"\n## Failures, {side}\n")
            for n, o in bad:
                lines.append(f"- {n}: {o.message}")
    lines.append("\n## Optimizer inputs dropped for mixprec (CPU)\n")
    if dropped:
        for d in dropped:
            lines.append(f"- {d.optim} '{d.desc}' {d.kwargs}: {d.reason}")
    else:
        lines.append("- none: mixprec's constructors take every CPU input of torch's infos")
    if errors:
        lines.append("\n## test_errors input by input (CPU, float32)\n")
        for optim, desc, t, m, t_ok, m_ok in errors:
            if t_ok and m_ok:
                verdict = "both as expected"
            else:
                verdict = f"torch {'as expected' if t_ok else 'DIFFERS'}, " \
                          f"mixprec {'as expected' if m_ok else 'DIFFERS'}"
            lines.append(f"- {optim}: {desc}: {verdict}")
            if not (t_ok and m_ok):
                lines.append(f"    torch:   {t[:200]}")
                lines.append(f"    mixprec: {m[:200]}")
    lines.append("\n## Totals (CPU)\n")
    for side, run in runs.items():
        counts = {s: sum(o.status == s for o in run.results.values())
                  for s in ("passed", "failed", "skipped")}
        extra = ""
        if side == "mixprec" and len(runs) > 1:
            extra = f", {len([n for n in names if n not in run.results])} not generated"
        lines.append(f"- {side}: {counts['passed']} passed, {counts['failed']} failed, "
                     f"{counts['skipped']} skipped{extra} ({len(run.results)} run, "
                     f"{run.seconds:.0f} s, pytest exit {run.returncode})")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="torch's test/test_optim.py")
    parser.add_argument("--dtype", action="append", default=None,
                        help="run tests of this dtype (repeatable; 'all'; default float32)")
    parser.add_argument("--side", action="append", choices=SIDES, default=None,
                        help="which classes to test (repeatable; default both)")
    parser.add_argument("-k", dest="k", default=None, help="extra pytest -k expression")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "torch_optim_suite",
                        help="folder for the generated modules and JUnit files")
    parser.add_argument("--report", type=Path, default=None, help="also write the report here")
    parser.add_argument("--no-error-audit", action="store_true",
                        help="skip the input-by-input audit of test_errors")
    args = parser.parse_args(argv)

    test_file = args.test_file.resolve()
    if not test_file.is_file():
        parser.error(f"{test_file} does not exist")
    dtypes = args.dtype or ["float32"]
    sides = args.side or list(SIDES)
    import torch

    print(f"torch {torch.__version__} ({torch.version.git_version}); test file {test_file}")
    k = _k_expression(dtypes, args.k)
    runs = {side: run_side(side, test_file, args.out.resolve(), k) for side in sides}
    for run in runs.values():
        if not run.results:
            print(f"[{run.side}] no results; pytest said:\n{run.tail}", file=sys.stderr)
            return 2
    all_dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    wanted = [d for d in all_dtypes if "all" in dtypes or str(d).split(".")[1] in dtypes]
    dropped = dropped_inputs(wanted) if "mixprec" in sides else []
    errors = [] if args.no_error_audit else audit_errors()
    text = report(runs, dropped, errors)
    print(text)
    if args.report is not None:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
