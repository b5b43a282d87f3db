"""Benchmark: one full mixed-precision optimizer step, mixprec vs torch.

A step is what a training loop runs after backward: the loss-scaler's
unscale/inf-check, the optimizer update, and the scale update. Cases:

* ``mixprec AdamW fp16+master`` / ``bf16+master``: 16-bit params and grads,
  FP32 masters and moments in the optimizer. found_inf from
  ``mixprec.ops.check_finite_`` (reads the grads once), the update with the
  unscale folded in (``step(grad_scale=, found_inf=)``), ``update_scale_``.
  This is the sequence a scaler runs for an optimizer with
  ``_step_supports_amp_scaling``.
* ``torch AdamW(fused=True) fp32 + GradScaler``: fp32 params/grads under
  ``torch.amp.GradScaler`` (``scaler.step`` + ``scaler.update``).
* ``torch AdamW(foreach=True) fp32 + GradScaler``: the same with torch's
  default multi-tensor AdamW (the scaler unscales the grads first).
* ``mixprec AdamW fp32`` and ``torch AdamW(fused=True) fp32`` without a scaler:
  the plain fp32 update (the CPU comparison of the issue).

Shapes: GPT-2 small (124M parameters) on CUDA. On CPU, by default, the same
layer shapes with 2 layers and an 8192-token vocabulary (about 21M
parameters), printed as such; ``--cpu-layers``/``--cpu-vocab`` change that.

Reported per case: median time (torch.utils.benchmark, blocked_autorange;
the best of ``--rounds`` rounds interleaved with the other cases),
ratio to the torch fused case, bytes moved per parameter (the minimum traffic
of the method: every tensor read or written once per kernel pass it needs),
the resulting GB/s and its fraction of the copy bandwidth measured in the
same run (``dst.copy_(src)`` of a large fp32 buffer, read + write counted).
On CUDA the mixprec step is also run once under
``torch.cuda.set_sync_debug_mode("error")``: it makes no host sync.

Usage:
    PYTHONPATH=python python benchmarks/bench_optim.py [--device cpu|cuda|all]
"""

from __future__ import annotations

import argparse
import datetime
import platform
from typing import Callable, Dict, List, Tuple

import torch
import torch.utils.benchmark as tbench

import mixprec  # noqa: F401  (loads the kernels)
import mixprec.optim
from mixprec import ops

Shape = Tuple[int, ...]

# Bytes moved per parameter, by case (see the module docstring).
#  mixprec 16-bit + master: check_finite_ reads the grad (2); the update reads
#    grad 2 + master 4 + m 4 + v 4 and writes master 4 + m 4 + v 4 + param 2.
#  torch fused fp32 + scaler: the scaler's inf check rewrites the grads (4 + 4);
#    the fused update reads p, g, m, v (16) and writes p, m, v (12).
#  torch foreach fp32 + scaler: unscale (8) and torch's foreach AdamW passes:
#    mul_(p) 8, lerp_(m, g) 12, mul_(v) 8, addcmul_(v, g, g) 16, sqrt 8, div_ 8,
#    add_(eps) 8, addcdiv_(p, m, d) 16.
#  fp32 update without scaler: p, g, m, v read (16), p, m, v written (12).
BYTES = {
    "mixprec16": 2 + 28,
    "torch_fused_scaler": 8 + 28,
    "torch_foreach_scaler": 8 + 84,
    "fp32_plain": 28,
}


def gpt2_shapes(n_layer: int, vocab: int, n_embd: int = 768, n_ctx: int = 1024) -> List[Shape]:
    shapes: List[Shape] = [(vocab, n_embd), (n_ctx, n_embd)]
    for _ in range(n_layer):
        shapes += [(n_embd,), (n_embd,), (n_embd, 3 * n_embd), (3 * n_embd,),
                   (n_embd, n_embd), (n_embd,), (n_embd,), (n_embd,),
                   (n_embd, 4 * n_embd), (4 * n_embd,), (4 * n_embd, n_embd), (n_embd,)]
    shapes += [(n_embd,), (n_embd,)]
    return shapes


def make_params(shapes: List[Shape], dtype: torch.dtype,
                device: str) -> List[torch.nn.Parameter]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(device=device,
                                                                          dtype=dtype))
        p.grad = (torch.randn(s, generator=gen) * 1e-3).to(device=device, dtype=dtype)
        params.append(p)
    return params


def copy_bandwidth(device: str, numel: int) -> float:
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    t = tbench.Timer("dst.copy_(src)", globals={"dst": dst, "src": src}).blocked_autorange(
        min_run_time=1.0)
    return 2 * src.numel() * 4 / t.median / 1e9


def mixprec_case(shapes: List[Shape], dtype: torch.dtype, device: str,
                 scaler: bool) -> Callable[[], None]:
    params = make_params(shapes, dtype, device)
    opt = mixprec.optim.AdamW(params, lr=1e-4)
    grads = [p.grad for p in params]
    scale = torch.full((1,), 1.0, device=device)
    tracker = torch.zeros(1, dtype=torch.int32, device=device)
    found = torch.zeros(1, device=device)
    if not scaler:
        return opt.step

    def step() -> None:
        found.zero_()
        ops.check_finite_(grads, found)
        opt.step(grad_scale=scale, found_inf=found)
        ops.update_scale_(scale, tracker, found, 2.0, 0.5, 1_000_000)

    return step


def torch_case(shapes: List[Shape], device: str, impl: str,
               scaler: bool) -> Callable[[], None]:
    params = make_params(shapes, torch.float32, device)
    kw = {"fused": True} if impl == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-4, **kw)
    if not scaler:
        return opt.step
    # init_scale 1 keeps the grads unchanged from step to step (no denormals);
    # the work done is the same for any scale.
    sc = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=1_000_000)
    sc.scale(torch.ones((), device=device))  # initialises the scale tensor

    def step() -> None:
        sc.step(opt)
        sc.update()

    return step


def time_it(fn: Callable[[], None], device: str, min_run_time: float) -> float:
    for _ in range(3):  # warm-up (state creation, caches)
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    timer = tbench.Timer("fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median


def check_no_sync(fn: Callable[[], None]) -> str:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        result = "0 host syncs"
    except RuntimeError as exc:
        result = f"host sync: {exc}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return result


def run(device: str, shapes: List[Shape], label: str, min_run_time: float,
        rounds: int) -> None:
    n = sum(torch.Size(s).numel() for s in shapes)
    print(f"\n=== {device}: {label}, {n / 1e6:.1f}M parameters in {len(shapes)} tensors ===")
    if device == "cpu":
        print(f"threads: {torch.get_num_threads()}")
    else:
        print(f"GPU: {torch.cuda.get_device_name()}")
    bw = copy_bandwidth(device, 64 * 2**20 if device == "cuda" else 16 * 2**20)
    print(f"copy bandwidth (read+write): {bw:.1f} GB/s")
    cases: List[Tuple[str, str, Callable[[], Callable[[], None]]]] = [
        ("mixprec AdamW fp16+master, scaler", "mixprec16",
         lambda: mixprec_case(shapes, torch.float16, device, True)),
        ("mixprec AdamW bf16+master, scaler", "mixprec16",
         lambda: mixprec_case(shapes, torch.bfloat16, device, True)),
        ("torch AdamW(fused) fp32 + GradScaler", "torch_fused_scaler",
         lambda: torch_case(shapes, device, "fused", True)),
        ("torch AdamW(foreach) fp32 + GradScaler", "torch_foreach_scaler",
         lambda: torch_case(shapes, device, "foreach", True)),
        ("mixprec AdamW fp32, no scaler", "fp32_plain",
         lambda: mixprec_case(shapes, torch.float32, device, False)),
        ("torch AdamW(fused) fp32, no scaler", "fp32_plain",
         lambda: torch_case(shapes, device, "fused", False)),
    ]
    # Every case is timed in `rounds` rounds, interleaved with the others, and
    # its best median kept, so background load hits all cases alike.
    fns = {name: make() for name, _, make in cases}
    times: Dict[str, float] = {}
    for _ in range(rounds):
        for name, _, _ in cases:
            t = time_it(fns[name], device, min_run_time)
            times[name] = min(t, times.get(name, t))
    print(f"{'case':42s} {'time ms':>9s} {'vs torch fused+scaler':>22s} {'B/param':>8s} "
          f"{'GB/s':>7s} {'of copy':>8s}")
    for name, kind, _ in cases:
        fn = fns[name]
        t = times[name]
        ratio = f"{t / times['torch AdamW(fused) fp32 + GradScaler']:.2f}x"
        gbs = BYTES[kind] * n / t / 1e9
        print(f"{name:42s} {t * 1e3:9.2f} {ratio:>22s} {BYTES[kind]:8d} {gbs:7.1f} "
              f"{gbs / bw:7.0%}")
        if device == "cuda" and name.startswith("mixprec") and "scaler" in name:
            print(f"{'':42s} {check_no_sync(fn)}")
    ref = times["torch AdamW(fused) fp32 + GradScaler"]
    for name in ("mixprec AdamW fp16+master, scaler", "mixprec AdamW bf16+master, scaler"):
        print(f"ratio {name} / torch fused+scaler: {times[name] / ref:.3f}")
    plain = times["mixprec AdamW fp32, no scaler"] / times["torch AdamW(fused) fp32, no scaler"]
    print(f"ratio mixprec fp32 / torch fused fp32 (no scaler): {plain:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--cpu-layers", type=int, default=2)
    ap.add_argument("--cpu-vocab", type=int, default=8192)
    ap.add_argument("--min-run-time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"mixprec {mixprec.__version__}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, "
          f"{datetime.date.today().isoformat()}")
    if args.device in ("cpu", "all"):
        run("cpu", gpt2_shapes(args.cpu_layers, args.cpu_vocab),
            f"GPT-2-small layer shapes, SMALLER model: {args.cpu_layers} layers, "
            f"vocab {args.cpu_vocab}", args.min_run_time, args.rounds)
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            run("cuda", gpt2_shapes(12, 50257), "GPT-2 small (124M)", args.min_run_time,
                args.rounds)
        else:
            print("\ncuda: no GPU visible, skipped")


if __name__ == "__main__":
    main()
