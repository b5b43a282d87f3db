"""One GradScaler iteration, mixprec vs torch, on the same parameters.

An iteration is what the scaler does between ``backward()`` and the next
forward (backward excluded): ``unscale_`` (where listed), ``step`` and
``update``. Cases:

* ``sgd``            unscale_ + step(SGD, default settings) + update
* ``adamw-fused``    step(torch AdamW fused=True) + update (the optimizer unscales
                     in its kernel; the scaler only checks for inf/NaN)
* ``adamw-fused+u``  unscale_ + step(AdamW fused=True) + update (the clipping recipe)

over a few parameter sets (fp32, and fp32+bf16 mixed where torch's scaler
accepts bf16). Each timed iteration first restores the (scaled) gradients with
one ``torch._foreach_copy_`` so that every iteration sees the same values; that
restore is timed alone and subtracted ("net"). Timings: torch.utils.benchmark
``blocked_autorange`` medians, both scalers measured in the same process,
interleaved per case over ``--rounds`` rounds (the best median of each is kept).

Host syncs per iteration: on CUDA, the synchronisations reported by
``torch.cuda.set_sync_debug_mode("warn")`` during one iteration; on CPU (where
nothing syncs) the number of device-to-host reads (``Tensor.item``/``tolist``/
``__bool__``...) that *would* sync on a GPU.

    PYTHONPATH=python python benchmarks/bench_scaler.py [--device cpu|cuda|all]
        [--min-run-time 1.0] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import warnings
from typing import Callable

import torch
import torch.utils.benchmark as tb

import mixprec

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


def make_params(device: str, spec: str, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    if spec == "fp32-few-large":
        shapes, dtypes = [(1024, 1024)] * 8 + [(1024,)] * 8, [torch.float32] * 16
    elif spec == "fp32-many-small":
        shapes, dtypes = [(64, 64)] * 300 + [(64,)] * 300, [torch.float32] * 600
    elif spec == "fp32+bf16-mixed":
        shapes = [(512, 512)] * 16 + [(512,)] * 16
        dtypes = [torch.float32, torch.bfloat16] * 16
    else:
        raise ValueError(spec)
    out = []
    for shape, dt in zip(shapes, dtypes):
        p = torch.nn.Parameter(torch.randn(shape, generator=g).to(device, dt))
        p.grad = (torch.randn(shape, generator=g) * 1024).to(device, dt)
        out.append(p)
    return out


def make_iteration(
    scaler_cls: type, device: str, spec: str, case: str
) -> tuple[Callable, Callable]:
    params = make_params(device, spec)
    grads = [p.grad for p in params]
    saved = [g.clone() for g in grads]
    if case == "sgd":
        opt = torch.optim.SGD(params, lr=1e-6)
    else:
        opt = torch.optim.AdamW(params, lr=1e-6, fused=True)
    scaler = scaler_cls(device, init_scale=1024.0)
    scaler.scale(torch.ones((), device=device))  # lazy init of the scale
    explicit_unscale = case in ("sgd", "adamw-fused+u")

    def restore() -> None:
        torch._foreach_copy_(grads, saved)

    def iteration() -> None:
        restore()
        if explicit_unscale:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    return iteration, restore


@contextlib.contextmanager
def count_host_reads(device: str):
    counter = {"n": 0}
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                yield counter
            finally:
                torch.cuda.set_sync_debug_mode(0)
        counter["n"] = sum("synchroniz" in str(x.message) for x in w)
        return
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def wrap(name: str, fn: Callable) -> Callable:
        def counted(self, *a, **k):
            counter["n"] += 1
            return fn(self, *a, **k)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counter
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def median_us(fn: Callable, device: str, min_run_time: float) -> float:
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return t.median * 1e6


def run(devices: list[str], min_run_time: float, rounds: int) -> None:
    print(f"torch {torch.__version__}, mixprec {mixprec.__version__}, "
          f"threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}")
    if "cuda" in devices:
        print(f"GPU: {torch.cuda.get_device_name()}")
    header = (f"{'device':<6} {'params':<16} {'case':<14} {'torch us':>9} {'mixprec us':>10} "
              f"{'restore us':>10} {'ratio':>6} {'net ratio':>9} {'syncs t/m':>9}")
    print(header)
    print("-" * len(header))
    for device in devices:
        for spec in ("fp32-few-large", "fp32-many-small", "fp32+bf16-mixed"):
            for case in ("sgd", "adamw-fused", "adamw-fused+u"):
                times: dict[str, float] = {}
                syncs: dict[str, int] = {}
                iters: dict[str, Callable] = {}
                restore = None
                for name, cls in (("torch", torch.amp.GradScaler), ("mixprec", mixprec.GradScaler)):
                    it, restore = make_iteration(cls, device, spec, case)
                    it()
                    with count_host_reads(device) as c:
                        it()
                        if device == "cuda":
                            torch.cuda.synchronize()
                    syncs[name] = c["n"]
                    iters[name] = it
                # interleaved rounds, best median per scaler: robust to a noisy machine
                for _ in range(rounds):
                    for name, it in iters.items():
                        t = median_us(it, device, min_run_time)
                        times[name] = min(times.get(name, float("inf")), t)
                assert restore is not None
                restore_t = min(median_us(restore, device, min_run_time / 2) for _ in range(rounds))
                assert restore_t is not None
                ratio = times["mixprec"] / times["torch"]
                net = (times["mixprec"] - restore_t) / max(times["torch"] - restore_t, 1e-9)
                print(f"{device:<6} {spec:<16} {case:<14} {times['torch']:>9.1f} "
                      f"{times['mixprec']:>10.1f} {restore_t:>10.1f} {ratio:>6.2f} {net:>9.2f} "
                      f"{syncs['torch']:>4}/{syncs['mixprec']:<4}")
    print("ratio = mixprec / torch (< 1: mixprec faster); net = after subtracting the "
          "gradient restore; syncs t/m = host syncs per iteration, torch / mixprec")


def main() -> None:
    ap = argparse.ArgumentParser(description="mixprec vs torch GradScaler iteration")
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--min-run-time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            raise SystemExit("no CUDA device")
        devices.remove("cuda")
        print("(no CUDA device: CPU only)")
    run(devices, args.min_run_time, args.rounds)


if __name__ == "__main__":
    main()
