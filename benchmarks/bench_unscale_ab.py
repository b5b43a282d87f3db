"""A/B benchmark for a shared, noisy CPU: mixprec's unscale_and_check_ and torch's
_amp_foreach_non_finite_check_and_unscale_ on the same tensors, interleaved.

Each round times both ops back to back (order alternating between rounds) on the same
grads, so load from other processes hits both alike; the figure of merit is the per-round
ratio torch / mixprec (> 1: mixprec faster), reported as median and [min, max] over the
rounds. Two clocks: wall time (what a user waits) and process CPU time (all threads,
OpenMP barrier spinning included), which moves far less when other processes compete for
the cores. Both callables are verified once, untimed, before timing (the grads become
grads * inv_scale, an inf is found).

    python benchmarks/bench_unscale_ab.py                      # 2 x 2^24 fp32, 21 rounds
    python benchmarks/bench_unscale_ab.py --numel 16777216 --tensors 2 --rounds 31 --threads 1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

import mixprec
from _common import verify_unscale_fn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
INV_SCALE = 1.0 + 2.0**-20  # != 1, so both ops write; repeated runs neither overflow nor drift


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summary(ts: List[float], base: List[float]) -> str:
    """Median/min/max of one op's times (ms) and of the per-round ratios base / ts."""
    ratios = [b / t for b, t in zip(base, ts)]
    return (f"median {statistics.median(ts):8.3f} ms  [{min(ts):8.3f}, {max(ts):8.3f}]  "
            f"torch/this {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=2**24, help="elements per tensor")
    ap.add_argument("--tensors", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--reps", type=int, default=3, help="calls per op per round")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    grads = [torch.randn(args.numel).to(DTYPES[args.dtype]) for _ in range(args.tensors)]
    found = torch.zeros(())
    inv = torch.full((), INV_SCALE)

    def ours() -> None:
        mixprec.ops.unscale_and_check_(grads, found, inv)

    def theirs() -> None:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)

    fns: Dict[str, Callable[[], None]] = {"torch": theirs, "mixprec": ours}
    for name, fn in fns.items():
        verify_unscale_fn(fn, grads, found, inv, name)
        fn()

    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    res = {c: {n: [] for n in fns} for c in clocks}  # type: Dict[str, Dict[str, List[float]]]
    order = list(fns.items())
    for r in range(args.rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.reps):
                fn()
            w1, c1 = time.perf_counter(), time.process_time()
            res["wall"][name].append((w1 - w0) / args.reps * 1e3)
            res["cpu"][name].append((c1 - c0) / args.reps * 1e3)
    assert float(found) == 0.0, "an inf appeared while timing"

    print(f"# bench_unscale_ab: {args.tensors} x {args.numel} {args.dtype}, {args.rounds} rounds "
          f"x {args.reps} calls, interleaved")
    print(f"# date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | cpu {cpu_model()} | "
          f"torch {torch.__version__} capability {torch.backends.cpu.get_cpu_capability()} | "
          f"mixprec {mixprec.__version__} kernels {mixprec.build_info().get('cpu_capability')} | "
          f"threads {torch.get_num_threads()}")
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            print(f"# load average {' '.join(f.read().split()[:3])}")
    except OSError:
        pass
    for c in clocks:
        for name in fns:
            print(f"{c:<5}{name:<9}{summary(res[c][name], res[c]['torch'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
