"""What bounds the 8-bit optimizer step: a torch.profiler trace of ``mixprec.optim.AdamW``
with 8-bit moments (``state_bits=8``) beside the 32-bit step, at GPT-2 small's shapes.

For each of the two steps (fp32 params, the same grads): the device time per step (CUDA
events, median of ``--iters``), the bytes it moves per step (params read and written,
grads read, every state tensor read and written: the 32-bit step's moments, or the 8-bit
codes and block maxima), the resulting GB/s and its share of the copy bandwidth measured
in the same run, and the profiler's kernel table (time per kernel name, launches). Then
the ratio 8-bit / 32-bit (goal <= 0.7) and the 8-bit step's share of the copy bandwidth
(goal >= 85 %). Checked first, untimed: every step moves the params.

    python tools/gpu_profile8.py                          # CUDA, GPT-2 small
    python tools/gpu_profile8.py --device cpu --small     # the same code, tiny, on CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

import mixprec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _common import copy_bandwidth, gpt2_small_shapes  # noqa: E402


def make_step(bits: int, shapes: List[Tuple[int, ...]], device: str
              ) -> Tuple[Callable[[], None], int]:
    """(one optimizer step, the bytes that step moves) for fp32 params of ``shapes``."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    opt = mixprec.optim.AdamW(params, lr=1e-3, state_bits=bits)
    before = [p.detach().clone() for p in params[:4]]
    opt.step()  # (creates the state)
    if any(torch.equal(a, p.detach()) for a, p in zip(before, params)):
        raise SystemExit(f"error: the {bits}-bit step did not move the params")
    moved = 0
    for p in params:
        moved += 2 * p.nbytes + p.grad.nbytes  # type: ignore[union-attr]
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and k != "step" and v.numel() > 1:
                moved += 2 * v.nbytes
    return opt.step, moved


def time_ms(fn: Callable[[], None], device: str, iters: int) -> float:
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_table(fn: Callable[[], None], device: str, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    try:
        return prof.key_averages().table(sort_by=key, row_limit=rows)
    except Exception:  # noqa: BLE001  (older column names)
        return prof.key_averages().table(row_limit=rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rows", type=int, default=12, help="kernel table rows")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU (use --device cpu --small here)")
    shapes = [(4096,), (257, 64), (3,)] if args.small else gpt2_small_shapes()
    iters = min(args.iters, 3) if args.small else args.iters
    res = {}
    for bits in (32, 8):
        step, moved = make_step(bits, shapes, args.device)
        ms = time_ms(step, args.device, iters)
        res[bits] = (ms, moved)
        print(f"== {bits}-bit AdamW step: {ms:.3f} ms, {moved / 1e6:.1f} MB moved, "
              f"{moved / ms / 1e6:.1f} GB/s")
        print(kernel_table(step, args.device, args.rows), flush=True)
    ms8, moved8 = res[8]
    copy = copy_bandwidth(moved8 // 2, torch.device(args.device), 0.05 if args.small else 0.5)
    share = moved8 / ms8 / 1e6 / copy
    print(f"ratio 8-bit / 32-bit step time: {ms8 / res[32][0]:.2f} (goal <= 0.7)")
    print(f"8-bit step: {moved8 / ms8 / 1e6:.1f} GB/s, {100 * share:.0f} % of the copy "
          f"bandwidth {copy:.1f} GB/s (goal >= 85 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
