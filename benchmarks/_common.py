"""Helpers shared by the benchmarks: timing with torch.utils.benchmark, copy bandwidth
measured in the same run, model shapes, and the environment header."""

from __future__ import annotations

import datetime
import platform
from typing import Callable

import torch
import torch.utils.benchmark as tbench

import mixprec


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """Parameter (= gradient) shapes of GPT-2 small: 148 tensors, 124.4M elements."""
    d, ff, vocab, ctx, layers = 768, 3072, 50257, 1024, 12
    shapes: list[tuple[int, ...]] = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, ff), (ff,),
                   (ff, d), (d,)]
    shapes += [(d,), (d,)]
    return shapes


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, min_run_time: float) -> float:
    """Median seconds per call (torch.utils.benchmark, adaptive; syncs CUDA around runs)."""
    fn()  # warm-up (also first-call allocation)
    sync(device)
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn})
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return m.median


def copy_bandwidth(nbytes: int, device: torch.device, min_run_time: float) -> float:
    """GB/s of dst.copy_(src) for buffers of `nbytes` (read + write counted)."""
    n = max(nbytes // 4, 1)
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, min_run_time)
    return 2 * n * 4 / t / 1e9


def header(title: str, device: torch.device) -> str:
    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
    else:
        dev = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return (f"# {title}\n# date {datetime.date.today()} | device {device.type}: {dev} | torch "
            f"{torch.__version__} | mixprec {mixprec.__version__} (CUDA kernels: "
            f"{mixprec.has_cuda_kernels()})")


def count_cuda_launches(fn: Callable[[], object]) -> int:
    """Number of CUDA kernels one call of fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")
