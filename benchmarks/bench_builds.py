"""Benchmark: the CPU optimizer step and unscale of two builds of mixprec, side by side in one run.

For a kernel change: build the other tree beside this one (for example an earlier
commit, ``git worktree add ../mixprec-old <commit>`` and its ``make build``) and pass its
``python`` folder as ``--other``. Each case runs in a fresh process per build, the builds
alternating round by round (``--rounds``), one intra-op thread, and is timed in thread
CPU time (``time.thread_time``), so other processes on the machine stretch neither
build's figure. Reported per case: each build's median over rounds of its best step, and
the median, min and max of the per-round ratios (this build / other).

Cases (``--cases``, comma-separated): ``adamw8-fp32-<numel>`` (fp32 param, 8-bit moments),
``adamw8-bf16-<numel>`` (bf16 param, fp32 masters, 8-bit moments), ``adamw-fp32-<numel>``
and ``adamw-bf16-<numel>`` (32-bit moments), one ``mixprec.optim.AdamW`` step over one param
of ``<numel>`` elements in rows of 1,024 (``--row``); ``unscale-<count>x<numel>``, one
``mixprec.ops.unscale_and_check_`` over ``<count>`` fp32 grads of ``<numel>`` elements
(``inv_scale`` 0.5: the values stay far from subnormals over the timed calls, no inf).
The default is AdamW fp32, bf16 + masters and 8-bit (fp32 param) at 2^20 and 2^24, and
unscale on 2,000 × 4,096 and 2 × 2^24. Checked untimed in every run: the param moved and
the state has the dtypes the case names; the unscale multiplied every grad by
``inv_scale`` and set ``found_inf`` for a planted inf (before the timed calls), and the
timed calls, over finite grads, left it at 0.

"This build" is the mixprec that ``import mixprec`` finds.

Usage:
    PYTHONPATH=python python benchmarks/bench_builds.py --other ../mixprec-old/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

DEFAULT_CASES = ",".join(
    [f"{k}-{n}" for k in ("adamw-fp32", "adamw-bf16", "adamw8-fp32") for n in (2**20, 2**24)]
    + ["unscale-2000x4096", f"unscale-2x{2**24}"]
)


def case_numel(case: str) -> int:
    """The elements a case's call walks: ``<numel>``, or ``<count> * <numel>`` for unscale."""
    last = case.split("-")[-1]
    count, _, numel = last.rpartition("x")
    return int(count or 1) * int(numel)


def timed(fn: Callable[[], None], steps: int) -> dict[str, float]:
    """``fn`` called 3 times untimed, then ``steps`` times: the best and median call (s)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return {"best": min(times), "median": statistics.median(times)}


def run_unscale(case: str, steps: int) -> dict[str, float]:
    """``unscale-<count>x<numel>`` in this process (see the module docstring)."""
    import mixprec

    count, numel = (int(x) for x in case.split("-")[1].split("x"))
    torch.manual_seed(0)
    grads = [torch.randn(numel) for _ in range(count)]
    found_inf = torch.zeros(1)
    inv_scale = torch.full((1,), 0.5)
    grads[-1][numel // 2] = float("inf")
    want = [g * 0.5 for g in grads]
    mixprec.ops.unscale_and_check_(grads, found_inf, inv_scale)
    if found_inf.item() != 1.0 or not all(torch.equal(g, w) for g, w in zip(grads, want)):
        raise SystemExit(f"{case}: the unscale did not multiply the grads or find the inf")
    grads[-1][numel // 2] = 1.0
    found_inf.zero_()
    out = timed(lambda: mixprec.ops.unscale_and_check_(grads, found_inf, inv_scale), steps)
    if found_inf.item() != 0.0:
        raise SystemExit(f"{case}: found_inf set over finite grads")
    return out


def run_case(case: str, row: int, steps: int) -> dict[str, float]:
    """One case in this process (the build on ``sys.path``): the best and median step (s)."""
    import mixprec

    torch.set_num_threads(1)
    if case.startswith("unscale-"):
        return run_unscale(case, steps)
    kind, dtype_name, numel = case.split("-")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    bits = 8 if kind == "adamw8" else 32
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(int(numel) // row, row).to(dtype))
    p.grad = (torch.randn(p.shape) * 1e-2).to(dtype)
    before = p.detach().clone()
    opt = mixprec.optim.AdamW([p], lr=1e-3, state_bits=bits, min_8bit_size=0)
    out = timed(opt.step, steps)
    state = opt.state[p]
    want = torch.uint8 if bits == 8 else torch.float32
    if state["exp_avg"].dtype != want or torch.equal(p.detach(), before):
        raise SystemExit(f"{case}: the step did not run as the case says")
    if dtype != torch.float32 and state["master_param"].dtype != torch.float32:
        raise SystemExit(f"{case}: no float32 master")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="the other build's python folder (holds mixprec/)")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--row", type=int, default=1024)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this case
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: by size)")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, args.row, args.steps)))
        return 0
    if not args.other:
        ap.error("--other is required")
    import mixprec

    this = os.path.dirname(os.path.dirname(os.path.abspath(mixprec.__file__)))
    builds = {"this": this, "other": os.path.abspath(args.other)}
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"this: {builds['this']}\nother: {builds['other']}")
    for case in args.cases.split(","):
        steps = args.steps or max(4, min(40, 2**26 // case_numel(case)))
        best: dict[str, list[float]] = {"this": [], "other": []}
        for r in range(args.rounds):
            for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
                env = dict(os.environ, PYTHONPATH=builds[name])
                cmd = [sys.executable, __file__, "--one", case, "--row", str(args.row)]
                out = subprocess.run(
                    [*cmd, "--steps", str(steps)], env=env, capture_output=True, text=True
                )
                if out.returncode != 0:
                    raise SystemExit(f"{case} ({name}): {out.stderr.strip()[-2000:]}")
                best[name].append(json.loads(out.stdout.splitlines()[-1])["best"])
        ratios = [a / b for a, b in zip(best["this"], best["other"])]
        print(
            f"{case:24s} this {statistics.median(best['this']) * 1e3:8.3f} ms"
            f"  other {statistics.median(best['other']) * 1e3:8.3f} ms"
            f"  this/other {statistics.median(ratios):.3f}"
            f" (min {min(ratios):.3f}, max {max(ratios):.3f}, {args.rounds} rounds)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
