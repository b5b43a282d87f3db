"""Host cost of the CUDA ops' launchers, measured on the CPU (no GPU needed).

``torch.ops.mixprec_cuda_emu.plan_<op>`` runs everything the CUDA op does on the
host -- argument checks, flattening, dtype grouping, slot wiring, launch plans --
and launches nothing (tests/_cuda_emulation.py). It is called here through the
same eager fast entry as the real ops (``emu_plan_<op>`` of the test extension
mixprec._cuda_emulation_C, built with ``MIXPREC_BUILD_TEST_EXT=1``), under
``torch.inference_mode()`` (the emulated ops have no Autograd-key kernel; the
real ops' costs a few ns per written tensor and is left out, also for the
controls). Timing it over n tensors gives the per-call (fixed) and per-tensor
host cost of the CUDA path, the cost that dominates many-small-tensor steps on a
GPU, short of the kernel-launch API calls themselves. Tensors have one element,
so the CPU-side controls below cost host work only too.

Columns: us per call for n tensors; the last two columns fit
``time = fixed + n * per_tensor`` by least squares over n >= 100. A second table gives
the plan rows per tensor (us per call / n) at each n.
Controls, same tensors, same run: mixprec's CPU op (host path + a one-element
kernel per tensor) and torch's ``_amp_foreach_non_finite_check_and_unscale_`` on
CPU (its foreach host path). The second row calls the same plan through
``torch.ops`` (GIL held, arguments converted to IValues): the fast entry releases
the GIL, so a launcher that copied tensors Python owns would pay a GIL round trip
per copy there and be slower than this row. Checked once, untimed: the plans cover
exactly the expected number of blocks.

Every call builds its plan from scratch (csrc/cuda/launch_plan.h ``LaunchPlanner``: one
pass over the lists). Run against a build that still has the plan cache of earlier
versions (``_cuda_emulation.set_plan_reuse``), each plan row is timed twice: "built
every call" (reuse switched off) and "plan reused" (the cache's steady state), so one
script measures a build before and after the cache's removal.

The last rows time the per-step list building mixprec does in Python before those op
calls, on n one-element fp32 params with grads, outside inference mode:
``FusedOptimizer._buckets`` (the op's tensor lists of a param group, built afresh every
step) and ``GradScaler._collect_grads`` (the grads handed to the scaler's ops). Checked
once, untimed: the lists hold every param.

With ``--cpu-time`` the calling thread's CPU time is measured instead of wall time
(``time.thread_time``; every case runs on the calling thread): on a shared machine whose
other work steals the cores, it still counts only this work.

    python benchmarks/bench_launch_plan.py [--sizes 10,148,1000,2000] [--cpu-time]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.utils.benchmark as tb

import mixprec
from _common import fit_fixed_per_tensor
from mixprec import _extension

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))  # the test-only emulation's loader
import _cuda_emulation  # noqa: E402


def _time_us(fn: Callable[[], None], min_run_time: float, cpu_time: bool = False) -> float:
    clock = time.thread_time if cpu_time else time.perf_counter
    timer = tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1, timer=clock)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def _adam_args(n: int, dtype: torch.dtype) -> tuple:
    params = [torch.randn(1).to(dtype) for _ in range(n)]
    masters = [p.float() for p in params] if dtype != torch.float32 else []
    return (params, [torch.randn(1).to(dtype) for _ in range(n)],
            [torch.zeros(1) for _ in range(n)], [torch.zeros(1) for _ in range(n)], [],
            masters, [torch.zeros(()) for _ in range(n)], torch.tensor(1e-3),
            0.9, 0.999, 0.01, 1e-8, False, False, True, torch.ones(1), torch.zeros(1), None,
            False, 0)


def _has_plan_cache() -> bool:
    """Whether the build still has the plan cache of earlier versions (its switch)."""
    return hasattr(_cuda_emulation, "set_plan_reuse")


def _set_reuse(on: bool) -> None:
    if _has_plan_cache():
        _cuda_emulation.set_plan_reuse(on)


def _emu_entry(name: str) -> Callable[..., Any]:
    """The fast entry of the plan-only op ``name`` (mixprec._C.emu_<name> in earlier
    builds, else the test extension's)."""
    fn = getattr(_extension.EXT, "emu_" + name, None)
    if fn is None:
        fn = getattr(_cuda_emulation.module(), "emu_" + name)
    return fn


def _fast(fn: Callable[..., Any]) -> Callable[..., None]:
    """A fast-entry function that must not decline its arguments."""
    def call(*args: Any) -> None:
        if fn(*args) is NotImplemented:
            raise SystemExit(f"error: {fn.__name__} declined its arguments")
    return call


def _cases(n: int) -> Dict[str, Tuple[Callable[[], None], bool]]:
    """name -> (call, whether plan reuse is on while it is timed: builds with the cache)."""
    c = _extension.EXT
    emu = _cuda_emulation.ops()
    plan_unscale = _fast(_emu_entry("plan_unscale_and_check_"))
    plan_adam = _fast(_emu_entry("plan_fused_adam_"))
    cpu_unscale = _fast(c.fast_unscale_and_check_)
    grads = [torch.randn(1) for _ in range(n)]
    found, inv = torch.zeros(1), torch.ones(1)  # inv_scale 1: nothing is written
    adam16 = _adam_args(n, torch.float16)
    adam32 = _adam_args(n, torch.float32)
    cases = {
        "unscale_and_check_ CUDA host path, built every call":
            (lambda: plan_unscale(grads, found, inv), False),
        "  the same through torch.ops (GIL held), built":
            (lambda: emu.plan_unscale_and_check_(grads, found, inv), False),
        "fused_adam_ fp16+master CUDA host path, built every call":
            (lambda: plan_adam(*adam16), False),
        "fused_adam_ fp32 CUDA host path, built every call":
            (lambda: plan_adam(*adam32), False),
        "control: mixprec unscale_and_check_ CPU kernel":
            (lambda: cpu_unscale(grads, found, inv), False),
        "control: torch _amp_foreach_..._unscale_ on CPU":
            (lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv),
             False),
    }
    if _has_plan_cache():
        cases["unscale_and_check_ CUDA host path, plan reused"] = (
            lambda: plan_unscale(grads, found, inv), True)
        cases["fused_adam_ fp16+master CUDA host path, plan reused"] = (
            lambda: plan_adam(*adam16), True)
        cases["fused_adam_ fp32 CUDA host path, plan reused"] = (
            lambda: plan_adam(*adam32), True)
    return cases


def _check_plans(n: int) -> None:
    """Untimed: one plan call covers n blocks (one per one-element tensor)."""
    emu = _cuda_emulation.ops()
    grads = [torch.randn(1) for _ in range(n)]
    before = emu.planned_blocks()
    emu.plan_unscale_and_check_(grads, torch.zeros(1), torch.ones(1))
    got = emu.planned_blocks() - before
    if got != n:
        raise SystemExit(f"error: plan_unscale_and_check_ planned {got} blocks for {n} tensors")
    before = emu.planned_blocks()
    emu.plan_fused_adam_(*_adam_args(n, torch.float16))
    # one block per tensor, plus one step-increment block per 256 tensors
    want = n + (n + 255) // 256
    got = emu.planned_blocks() - before
    if got != want:
        raise SystemExit(f"error: plan_fused_adam_ planned {got} blocks, want {want}")


def _python_cases(n: int) -> Dict[str, Callable[[], None]]:
    """name -> call: the per-step list building of an optimizer and a scaler over n
    params, each checked once (untimed) to list every param."""
    params = [torch.nn.Parameter(torch.randn(1)) for _ in range(n)]
    sum(p.sum() for p in params).backward()
    opt = mixprec.optim.AdamW(params, lr=1e-3)
    opt.step()  # (the state exists)
    group = opt.param_groups[0]
    lists = opt._buckets(0, group)
    if sum(len(b["params"]) for b in lists.values()) != n:
        raise SystemExit(f"error: the optimizer's lists do not hold the {n} params")
    scaler = mixprec.GradScaler("cpu")
    grads = scaler._collect_grads(opt, False)
    if sum(len(g) for g in grads.values()) != n:
        raise SystemExit(f"error: the scaler's grads are not the {n} grads")
    return {
        "optimizer lists (_buckets)": lambda: opt._buckets(0, group),
        "scaler grads (_collect_grads)": lambda: scaler._collect_grads(opt, False),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,148,1000,2000")
    parser.add_argument("--min-run-time", type=float, default=0.3)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the calling thread's CPU time, not wall time")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.set_num_threads(1)
    print(f"mixprec {mixprec.__version__}, torch {torch.__version__}, "
          f"{platform.machine()}, CPU capability {mixprec.build_info()['cpu_capability']}, "
          f"1 thread, {datetime.date.today()}")
    _check_plans(max(sizes))
    names = list(_cases(1))
    table: Dict[str, List[float]] = {name: [] for name in names}
    try:
        with torch.inference_mode():
            for n in sizes:
                cases = _cases(n)
                for name in names:
                    fn, reuse = cases[name]
                    _set_reuse(reuse)
                    table[name].append(_time_us(fn, args.min_run_time, args.cpu_time))
    finally:
        _set_reuse(True)
    plan_names = list(names)
    py_names = list(_python_cases(1))
    for n in sizes:
        cases = _python_cases(n)
        for name in py_names:
            table.setdefault(name, []).append(
                _time_us(cases[name], args.min_run_time, args.cpu_time))
    names += py_names
    width = max(len(n) for n in names)
    clock = "thread CPU time" if args.cpu_time else "wall time"
    print(f"us per call ({clock}); columns: n one-element fp32 tensors "
          "(fp16 params for +master)")
    print(f"{'case':<{width}} " + " ".join(f"{n:>8}" for n in sizes) + "  fixed us  us/tensor")
    for name in names:
        fixed, per = fit_fixed_per_tensor(sizes, table[name])
        print(f"{name:<{width}} " + " ".join(f"{t:8.1f}" for t in table[name])
              + f"  {fixed:8.1f}  {per:9.3f}")
    print("us per tensor (us per call / n)")
    print(f"{'case':<{width}} " + " ".join(f"{n:>8}" for n in sizes))
    for name in plan_names:
        print(f"{name:<{width}} " + " ".join(f"{t / n:8.3f}" for t, n in zip(table[name], sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
