"""Benchmark: mixprec.ops.unscale_and_check_ vs torch._amp_foreach_non_finite_check_and_unscale_.

Sets: (a) GPT-2 small gradient shapes (148 tensors, 124M elements), (b) 2,000 tensors of
4,096 elements, (c) one tensor of 2^28 elements, (q) a quick set (3 tensors, 263K
elements); fp32, fp16, bf16. Prints time, GB/s (each element read and written once), the
ratio torch/mixprec (> 1: mixprec faster), the fraction of the copy bandwidth measured in
this run for the same number of bytes and, on CUDA, kernel launches per call.

Before timing, every case is verified once (untimed) on the very tensors and callable that
are timed: the grads become grads * inv_scale (within the rounding of the op) and found_inf
stays 0; with an inf planted, found_inf becomes 1. Where torch's op cannot run a case (it
has no bf16 kernel on CUDA) its columns read n/a. A failed verification, or a GB/s figure
above the copy bandwidth (beyond a noise margin: 5 % on CUDA, 50 % on CPU, see
_common.BANDWIDTH_TOLERANCE), is an error: marked !!, listed after the table, exit status 1.

    python benchmarks/bench_unscale.py [--device cpu|cuda] [--sets a,b,c] [--min-run-time S]
    python benchmarks/bench_unscale.py --quick      # set q, short timing (a smoke test)

``--interleaved`` is for a shared, noisy CPU: each of ``--rounds`` rounds times both ops
back to back on the same grads (the order alternating between rounds), so load from other
processes hits both alike; reported per op: the median and [min, max] of the ms per call
and of the per-round ratio torch / mixprec, on two clocks, wall time and process CPU time
(which moves far less when other processes compete for the cores). Both callables are
verified once, untimed, first.

    python benchmarks/bench_unscale.py --device cpu --interleaved --sets c --dtypes fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

import mixprec
from _common import (
    NA,
    Report,
    add_timing_args,
    copy_bandwidth,
    count_cuda_launches,
    fmt,
    gpt2_small_shapes,
    header,
    ratio,
    run_control,
    time_fn,
    verify_unscale_fn,
)

SETS = {
    "a": ("gpt2-small (148 t, 124M)", lambda: gpt2_small_shapes()),
    "b": ("2000 x 4096", lambda: [(4096,)] * 2000),
    "c": ("1 x 2^28", lambda: [(2**28,)]),
    "q": ("quick (3 t, 263K)", lambda: [(2**18,), (1000,), (3,)]),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# inv_scale != 1 (so both ops really write) yet close enough to 1 that repeated runs neither
# overflow nor drift into denormals.
INV_SCALE = 1.0 + 2.0**-20


def bench_row(report: Report, notes: List[str], name: str, dname: str,
              shapes: List[Tuple[int, ...]], device: torch.device, min_run_time: float) -> None:
    """Verify, time and print one (set, dtype) row."""
    dtype = DTYPES[dname]
    label = f"{name} {dname}"
    grads = [torch.randn(s, device=device).to(dtype) for s in shapes]
    nbytes = sum(g.numel() * g.element_size() for g in grads)
    found = torch.zeros((), device=device)
    inv = torch.full((), INV_SCALE, device=device)

    def ours() -> None:
        mixprec.ops.unscale_and_check_(grads, found, inv)

    def theirs() -> None:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)

    def verify_theirs() -> bool:
        return report.verify(label, lambda: verify_unscale_fn(theirs, grads, found, inv,
                                                              "torch's op"))

    # verification, untimed, of the callables timed below (mixprec first: an error there
    # is mixprec's; torch's control may be n/a)
    if not report.verify(label, lambda: verify_unscale_fn(ours, grads, found, inv,
                                                          "mixprec unscale_and_check_")):
        print(f"{name:<26}{dname:<6}{'VERIFICATION FAILED: not timed':>40}", flush=True)
        return
    control = run_control(verify_theirs)
    if isinstance(control, NA):
        notes.append(f"n/a ({label}): torch's op -- {control.reason}")
    torch_ok = control is True

    t_ours = time_fn(ours, device, min_run_time)
    t_theirs = time_fn(theirs, device, min_run_time) if torch_ok else None
    copy = copy_bandwidth(nbytes, device, min_run_time)
    gbs = 2 * nbytes / t_ours / 1e9
    mark = report.check_bandwidth(f"{label}: mixprec", gbs, copy, device)
    line = (f"{name:<26}{dname:<6}{t_ours * 1e3:>11.3f}"
            f"{fmt(t_theirs * 1e3 if t_theirs else None, '.3f', 10)}"
            f"{fmt(ratio(t_theirs, t_ours), '.2f', 7)}"
            f"{gbs:>8.1f}{copy:>10.1f}{100 * gbs / copy:>6.0f}%")
    if device.type == "cuda":
        lt = count_cuda_launches(theirs) if torch_ok else None
        line += f"{count_cuda_launches(ours):>8}/{fmt(lt, 'd')}"
    print(line + mark, flush=True)


def interleaved_row(name: str, dname: str, shapes: List[Tuple[int, ...]],
                    device: torch.device, rounds: int, reps: int) -> None:
    """Time mixprec's and torch's op in alternating rounds on the same grads (CPU)."""
    grads = [torch.randn(s, device=device).to(DTYPES[dname]) for s in shapes]
    found = torch.zeros((), device=device)
    inv = torch.full((), INV_SCALE, device=device)
    fns: Dict[str, Callable[[], None]] = {
        "torch": lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv),
        "mixprec": lambda: mixprec.ops.unscale_and_check_(grads, found, inv)}
    for who, fn in fns.items():
        verify_unscale_fn(fn, grads, found, inv, who)
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    res: Dict[str, Dict[str, List[float]]] = {c: {n: [] for n in fns} for c in clocks}
    order = list(fns.items())
    for r in range(rounds):
        for who, fn in (order if r % 2 == 0 else order[::-1]):
            t0 = {c: clock() for c, clock in clocks.items()}
            for _ in range(reps):
                fn()
            for c, clock in clocks.items():
                res[c][who].append((clock() - t0[c]) / reps * 1e3)
    for c in clocks:
        for who in fns:
            ts, ratios = res[c][who], [b / t for b, t in zip(res[c]["torch"], res[c][who])]
            print(f"{name:<26}{dname:<6}{c:<5}{who:<9}median {statistics.median(ts):8.3f} ms "
                  f"[{min(ts):8.3f}, {max(ts):8.3f}]  torch/this "
                  f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]",
                  flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sets", default=None, help="comma-separated keys of SETS (default a,b,c)")
    ap.add_argument("--dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--interleaved", action="store_true",
                    help="A/B rounds of both ops on a shared CPU (see the docstring)")
    ap.add_argument("--rounds", type=int, default=21, help="--interleaved: rounds")
    ap.add_argument("--reps", type=int, default=3, help="--interleaved: calls per op per round")
    add_timing_args(ap, "set q and --min-run-time 0.02 unless given: a smoke test")
    args = ap.parse_args(argv)
    sets = args.sets or ("q" if args.quick else "a,b,c")
    min_run_time = args.min_run_time or (0.02 if args.quick else 1.0)
    device = torch.device(args.device)
    report = Report("bench_unscale", args.bandwidth_tolerance)
    print(header("bench_unscale: unscale + inf/NaN check", device))
    if args.interleaved:
        for key in sets.split(","):
            for dname in args.dtypes.split(","):
                interleaved_row(SETS[key][0], dname, SETS[key][1](), device,
                                args.rounds, args.reps)
        return 0
    cols = (f"{'set':<26}{'dtype':<6}{'mixprec ms':>11}{'torch ms':>10}{'ratio':>7}"
            f"{'GB/s':>8}{'copy GB/s':>10}{'% copy':>7}")
    if device.type == "cuda":
        cols += f"{'launches m/t':>14}"
    print(cols, flush=True)
    notes: List[str] = []
    for key in sets.split(","):
        name, shapes_fn = SETS[key]
        for dname in args.dtypes.split(","):
            bench_row(report, notes, name, dname, shapes_fn(), device, min_run_time)
    for n in notes:
        print(n)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
