"""Host time per training step vs the number of param tensors, with and without flat buffers.

A model of ``n`` tiny param tensors (``--numel`` elements each, so the kernels' own work is
negligible and what is measured is host work) on the CPU. One step is what a training
loop runs after backward: ``scaler.step(opt)`` + ``scaler.update()`` with
``mixprec.GradScaler`` and ``mixprec.optim.AdamW`` (fp32 params; or ``--dtype bf16``:
bf16 params with fp32 masters), the grads set once (not re-zeroed, the scale stays
constant: no overflow). Rows: per-tensor (the params as they are) and flat
(``mixprec.optim.flat_buffers(params)`` before the optimizer is built).

Also split out, for the flat rows: the time spent in the detection itself
(``mixprec.flat.kept_grads``/``coalesce_and_keep`` in the scaler and ``coalesce_bucket`` in the
optimizer, timed inside real steps), which stays per tensor (``id`` and data-pointer
checks, mostly at C speed). The rest of a step's per-tensor cost is the Python loops of
the scaler (``_collect_grads``) and of the optimizer (``_step_group``), which run before
the detection.

    python benchmarks/bench_flat.py [--sizes 10,100,1000,4000] [--numel 16] [--dtype fp32]

Timing is torch.utils.benchmark's blocked_autorange median, one thread.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.utils.benchmark as tb

import mixprec
from mixprec import flat as flat_mod


def _time_us(fn: Callable[[], None], min_run_time: float) -> float:
    timer = tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def _setup(n: int, numel: int, dtype: torch.dtype, flat: bool
           ) -> Tuple[List[torch.nn.Parameter], mixprec.optim.AdamW, mixprec.GradScaler]:
    params = [torch.nn.Parameter(torch.randn(numel).to(dtype)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(numel).to(dtype)
    if flat:  # params and grads (their values kept) become views of the buffers
        mixprec.optim.flat_buffers(params)
    opt = mixprec.optim.AdamW(params, lr=1e-3)
    scaler = mixprec.GradScaler("cpu", init_scale=1.0)
    scaler.scale(torch.ones(()))  # creates the scale
    return params, opt, scaler


def measure(n: int, numel: int, dtype: torch.dtype, flat: bool,
            min_run_time: float) -> Dict[str, float]:
    params, opt, scaler = _setup(n, numel, dtype, flat)

    def step() -> None:
        scaler.step(opt)
        scaler.update()

    step()  # creates the optimizer state
    out = {"step": _time_us(step, min_run_time)}
    if flat:  # the detection's share: time the two hooks inside real steps
        spent = [0.0]
        originals = {name: getattr(flat_mod, name) for name in (
            "kept_grads", "coalesce_and_keep", "coalesce_bucket")}

        def timed(fn: Callable[..., object]) -> Callable[..., object]:
            def call(*args: object) -> object:
                t0 = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    spent[0] += time.perf_counter() - t0
            return call

        try:
            for name, fn in originals.items():
                setattr(flat_mod, name, timed(fn))
            reps = 20
            for _ in range(reps):
                step()
        finally:
            for name, fn in originals.items():
                setattr(flat_mod, name, fn)
        out["detect"] = spent[0] / reps * 1e6
    del params
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sizes", default="10,100,1000,4000")
    ap.add_argument("--numel", type=int, default=16)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--min-run-time", type=float, default=0.5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# bench_flat | {datetime.datetime.now().isoformat(timespec='seconds')} | "
          f"{platform.processor() or platform.machine()} | torch {torch.__version__} | "
          f"mixprec {mixprec.__version__} | cpu capability "
          f"{mixprec.build_info().get('cpu_capability', '?')} | 1 thread")
    print(f"# scaler.step(AdamW) + update, {args.dtype} params of {args.numel} elements; "
          f"us per step (median)")
    head = (f"{'tensors':>8} {'per-tensor':>11} {'flat':>9} {'flat/per':>9} "
            f"{'flat: detection':>16} {'per-tensor us/tensor':>21} {'flat us/tensor':>15}")
    print(head)
    print("-" * len(head))
    for n in sizes:
        per = measure(n, args.numel, dtype, False, args.min_run_time)
        fl = measure(n, args.numel, dtype, True, args.min_run_time)
        print(f"{n:>8} {per['step']:>11.1f} {fl['step']:>9.1f} {fl['step'] / per['step']:>9.2f} "
              f"{fl['detect']:>16.1f} {per['step'] / n:>21.3f} {fl['step'] / n:>15.3f}")


if __name__ == "__main__":
    main()
