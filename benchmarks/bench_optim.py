"""Benchmark: one full mixed-precision optimizer step, mixprec vs torch.

A step is what a training loop runs after backward: the loss-scaler's
unscale/inf-check, the optimizer update, and the scale update. Cases:

* ``mixprec AdamW fp16+master`` / ``bf16+master``: 16-bit params and grads,
  FP32 masters and moments in the optimizer. The grads carry a loss scale of
  1024; found_inf from ``mixprec.ops.check_finite_`` (reads the grads once),
  the update with the unscale folded in (``step(grad_scale=, found_inf=)``),
  ``update_scale_``. This is the sequence a scaler runs for an optimizer with
  ``_step_supports_amp_scaling``.
* ``torch AdamW(fused=True) fp32 + GradScaler``: fp32 params/grads under
  ``torch.amp.GradScaler`` (``scaler.step`` + ``scaler.update``).
* ``torch AdamW(foreach=True) fp32 + GradScaler``: the same with torch's
  default multi-tensor AdamW (the scaler unscales the grads first).
* ``mixprec AdamW fp32`` and ``torch AdamW(fused=True) fp32`` without a scaler:
  the plain fp32 update (the CPU comparison of the issue).
* ``mixprec AdamW8bit ...``: the same mixprec cases with ``state_bits=8`` (block-wise
  8-bit moments for every tensor of at least 4,096 elements; ``fused_adam8_``), and the
  8-bit optimizers a user would pick instead, on fp32 params without a scaler:
  ``torchao AdamW8bit`` (its ``torch.compile``-d step; eager with ``--quick``) and
  ``bitsandbytes AdamW8bit``, n/a where they do not import or run.

Shapes: GPT-2 small (124M parameters) on CUDA. On CPU, by default, the same
layer shapes with 2 layers and an 8192-token vocabulary (about 21M
parameters), printed as such; ``--cpu-layers``/``--cpu-vocab``/``--cpu-embd``
change that. ``--quick``: one layer, width 64, vocabulary 512 on both devices
(a smoke test).

Verification, once per case and untimed, on the optimizer that is timed (its
first step): the weights after one step equal a ``torch.optim.AdamW`` step in
float64 on copies, within the rounding of a float32 step
(``_common.optimizer_tolerance``); 16-bit params equal their float32 master
rounded to nearest; the scale is unchanged. For the mixprec cases with a
scaler, a second step with an inf planted in a grad must change nothing
(params, masters, moments, step counts) and halve the scale. An 8-bit step from a fresh
state equals the 32-bit step (the param update uses the unquantized new moments), so the
8-bit cases are held to the same reference; the library controls, which may order their
operations otherwise, to 1 % of each element's movement. A failed check
is an error (the case is not timed; exit status 1). torch cases the installed
torch cannot run print n/a.

Reported per case: median time (torch.utils.benchmark, blocked_autorange;
the best of ``--rounds`` rounds interleaved with the other cases),
ratio to the torch fused case, bytes moved per parameter (the minimum traffic
of the method: every tensor read or written once per kernel pass it needs),
the resulting GB/s and its fraction of the copy bandwidth measured in the
same run (``_common.copy_bandwidth``, in every timing round, the best kept).
A GB/s figure above it (beyond a noise margin: 5 % on CUDA, 50 % on CPU) is an
error, marked !!: the step did not move the bytes it must.
On CUDA the mixprec steps are also run once under
``torch.cuda.set_sync_debug_mode("error")``: they make no host sync.

``--state-bytes`` prints instead the optimizer state bytes per param at GPT-2 small of
each master form and moment width (``benchmarks/_state_bytes.py``) and exits.

Usage:
    PYTHONPATH=python python benchmarks/bench_optim.py [--device cpu|cuda|all] [--quick]
    PYTHONPATH=python python benchmarks/bench_optim.py --state-bytes
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch

import mixprec  # noqa: F401  (loads the kernels)
import mixprec.optim
from _common import (
    NA,
    CheckFailed,
    Report,
    Shape,
    add_timing_args,
    check_close,
    check_found_inf,
    check_optimizer_result,
    check_scalar,
    check_unchanged,
    copy_bandwidth,
    eager_step,
    flat64,
    fmt,
    gpt2_shapes,
    numel,
    plant_inf,
    ratio,
    reference_run,
    restore_planted,
    run_control,
    snapshot,
    sync,
    time_fn,
)
from mixprec import ops

# Bytes moved per parameter, by case (see the module docstring).
#  mixprec 16-bit + master: check_finite_ reads the grad (2); the update reads
#    grad 2 + master 4 + m 4 + v 4 and writes master 4 + m 4 + v 4 + param 2.
#  torch fused fp32 + scaler: the scaler's inf check rewrites the grads (4 + 4);
#    the fused update reads p, g, m, v (16) and writes p, m, v (12).
#  torch foreach fp32 + scaler: unscale (8) and torch's foreach AdamW passes:
#    mul_(p) 8, lerp_(m, g) 12, mul_(v) 8, addcmul_(v, g, g) 16, sqrt 8, div_ 8,
#    add_(eps) 8, addcdiv_(p, m, d) 16.
#  fp32 update without scaler: p, g, m, v read (16), p, m, v written (12).
#  8-bit moments: m and v take 1 byte each instead of 4 (plus one float32 absmax per
#    256 elements, 0.016 bytes, left out: the figures stay lower bounds):
#    16-bit + master: 2 + (grad 2 + master 4 + m 1 + v 1) + (master 4 + m 1 + v 1 +
#    param 2); fp32 without scaler: p 4, g 4, m 1, v 1 read, p, m, v written.
BYTES = {
    "mixprec16": 2 + 28,
    "torch_fused_scaler": 8 + 28,
    "torch_foreach_scaler": 8 + 84,
    "fp32_plain": 28,
    "mixprec16_8bit": 2 + 16,
    "fp32_8bit": 16,
}
LR, WEIGHT_DECAY = 1e-4, 1e-2
# The mixprec cases' grads carry this loss scale (a power of two: scaling and unscaling
# are exact, so the float64 reference sees the same grads).
GRAD_SCALE = 1024.0
REF = "torch AdamW(fused) fp32 + GradScaler"

Step = Callable[[], None]


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


def _reference(params: List[torch.nn.Parameter], grad_scale: float) -> Tuple[torch.Tensor,
                                                                              torch.Tensor]:
    """float64 torch.optim.AdamW: one step from the params' current values (weights and
    movement; AdamW's decay is decoupled, so no slack term)."""
    w0 = flat64(params)
    g = flat64([p.grad for p in params]) / grad_scale
    ref, movement, _ = reference_run(torch.optim.AdamW,
                                     {"lr": LR, "weight_decay": WEIGHT_DECAY}, w0, [g])
    return ref, movement


def mixprec_case(name: str, shapes: List[Shape], dtype: torch.dtype, device: str,
                 scaler: bool, state_bits: int = 32) -> Tuple[Step, Callable[[], None]]:
    """(step, verify) of a mixprec case; verify runs the first step."""
    params = make_params(shapes, dtype, device)
    grads = [p.grad for p in params]
    opt = mixprec.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, state_bits=state_bits)
    scale = torch.full((1,), GRAD_SCALE if scaler else 1.0, device=device)
    tracker = torch.zeros(1, dtype=torch.int32, device=device)
    found = torch.zeros(1, device=device)
    if scaler:
        torch._foreach_mul_(grads, GRAD_SCALE)

        def step() -> None:
            found.zero_()
            ops.check_finite_(grads, found)
            opt.step(grad_scale=scale, found_inf=found)
            ops.update_scale_(scale, tracker, found, 2.0, 0.5, 1_000_000)
    else:
        step = opt.step  # type: ignore[assignment]

    def verify() -> None:
        ref, movement = _reference(params, GRAD_SCALE if scaler else 1.0)
        step()
        sync(device)
        masters = ([opt.state[p]["master_param"] for p in params]
                   if dtype != torch.float32 else [])
        check_optimizer_result(name, params, masters, ref, movement, 1)
        if not scaler:
            return
        check_found_inf(found, False, f"{name}: clean step")
        check_scalar(scale, GRAD_SCALE, f"{name}: scale after a clean step")
        state = [t for p in params for t in opt.state[p].values() if torch.is_tensor(t)]
        before = snapshot(list(params) + state)
        planted = plant_inf(grads)
        try:
            step()
            sync(device)
        finally:
            restore_planted(planted)
        check_found_inf(found, True, f"{name}: step with an inf planted")
        check_unchanged(before, list(params) + state,
                        f"{name}: step with an inf planted (must be skipped)")
        check_scalar(scale, GRAD_SCALE * 0.5, f"{name}: scale after a step with an inf")
        scale.fill_(GRAD_SCALE)
        tracker.zero_()
        found.zero_()

    return step, verify


def torch_case(name: str, shapes: List[Shape], device: str, impl: str,
               scaler: bool) -> Tuple[Step, Callable[[], None]]:
    """(step, verify) of a torch control."""
    params = make_params(shapes, torch.float32, device)
    kw = {"fused": True} if impl == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, **kw)
    sc: Optional[torch.amp.GradScaler] = None
    if not scaler:
        step = opt.step
    else:
        # init_scale 1 keeps the grads unchanged from step to step (the foreach
        # route unscales them in place); the work done is the same for any scale.
        sc = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=1_000_000)
        sc.scale(torch.ones((), device=device))  # initialises the scale tensor

        def step() -> None:
            sc.step(opt)
            sc.update()

    def verify() -> None:
        ref, movement = _reference(params, 1.0)
        step()
        sync(device)
        check_optimizer_result(name, params, [], ref, movement, 1)
        if sc is not None and sc.get_scale() != 1.0:
            raise CheckFailed(f"{name}: scale {sc.get_scale()} after a clean step, expected 1")

    return step, verify  # type: ignore[return-value]


def library8_case(name: str, shapes: List[Shape], device: str, lib: str,
                  quick: bool) -> Tuple[Step, Callable[[], None]]:
    """(step, verify) of an 8-bit optimizer of another library on fp32 params; raises
    NotImplementedError (the case is n/a) when the library does not import."""
    params = make_params(shapes, torch.float32, device)
    try:
        if lib == "torchao":
            import torchao.optim as ao_optim

            opt = ao_optim.AdamW8bit(params, lr=LR, weight_decay=WEIGHT_DECAY)
            if quick:
                opt = eager_step(opt)
        else:
            import bitsandbytes as bnb

            opt = bnb.optim.AdamW8bit(params, lr=LR, weight_decay=WEIGHT_DECAY)
    except ImportError as exc:
        raise NotImplementedError(f"{lib} does not import: {exc}") from exc

    def verify() -> None:
        # (another library may order its float32 operations otherwise: its weights must
        # be within 1 % of each element's movement of the float64 reference, plus one
        # float32 spacing of the weight for the rounding of the stored result: an element
        # that moved by 8e-9 would otherwise be held to 8e-11, below float32's spacing)
        ref, movement = _reference(params, 1.0)
        opt.step()
        sync(device)
        spacing = torch.finfo(torch.float32).eps * ref.abs()
        check_close(params, ref, 0.01 * movement.abs() + spacing + 1e-12,
                    f"{name}: float32 params vs float64 reference (1 % of the movement "
                    "+ one float32 spacing)")

    return opt.step, verify  # type: ignore[return-value]


def check_no_sync(fn: Step) -> str:
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


def run(device: str, shapes: List[Shape], label: str, min_run_time: float, rounds: int,
        report: Report, quick: bool = False) -> None:
    n = numel(shapes)
    print(f"\n=== {device}: {label}, {n / 1e6:.1f}M parameters in {len(shapes)} tensors ===")
    if device == "cpu":
        print(f"threads: {torch.get_num_threads()}")
    else:
        print(f"GPU: {torch.cuda.get_device_name()}")
    # the bound for passes moving 30 bytes per parameter (15 read, 15 written); measured
    # again in every timing round, the best kept (the machine's quietest moment)
    bw = copy_bandwidth(15 * n, device, min_run_time)
    cases: List[Tuple[str, str, bool, Callable[[str], Tuple[Step, Callable[[], None]]]]] = [
        ("mixprec AdamW fp16+master, scaler", "mixprec16", False,
         lambda nm: mixprec_case(nm, shapes, torch.float16, device, True)),
        ("mixprec AdamW bf16+master, scaler", "mixprec16", False,
         lambda nm: mixprec_case(nm, shapes, torch.bfloat16, device, True)),
        (REF, "torch_fused_scaler", True,
         lambda nm: torch_case(nm, shapes, device, "fused", True)),
        ("torch AdamW(foreach) fp32 + GradScaler", "torch_foreach_scaler", True,
         lambda nm: torch_case(nm, shapes, device, "foreach", True)),
        ("mixprec AdamW fp32, no scaler", "fp32_plain", False,
         lambda nm: mixprec_case(nm, shapes, torch.float32, device, False)),
        ("torch AdamW(fused) fp32, no scaler", "fp32_plain", True,
         lambda nm: torch_case(nm, shapes, device, "fused", False)),
        ("mixprec AdamW8bit fp16+master, scaler", "mixprec16_8bit", False,
         lambda nm: mixprec_case(nm, shapes, torch.float16, device, True, state_bits=8)),
        ("mixprec AdamW8bit bf16+master, scaler", "mixprec16_8bit", False,
         lambda nm: mixprec_case(nm, shapes, torch.bfloat16, device, True, state_bits=8)),
        ("mixprec AdamW8bit fp32, no scaler", "fp32_8bit", False,
         lambda nm: mixprec_case(nm, shapes, torch.float32, device, False, state_bits=8)),
        ("torchao AdamW8bit fp32, no scaler", "fp32_8bit", True,
         lambda nm: library8_case(nm, shapes, device, "torchao", quick)),
        ("bitsandbytes AdamW8bit fp32, no scaler", "fp32_8bit", True,
         lambda nm: library8_case(nm, shapes, device, "bnb", quick)),
    ]
    # Build and verify every case (untimed). A torch case torch cannot run is n/a; a
    # failed verification is an error and leaves the case untimed.
    fns: Dict[str, Step] = {}
    status: Dict[str, str] = {}
    for name, _, is_control, make in cases:
        def build_and_verify(name: str = name, make=make) -> Step:
            step, verify = make(name)
            if not report.verify(name, verify):
                raise _Unverified()
            return step

        try:
            out = run_control(build_and_verify) if is_control else build_and_verify()
        except _Unverified:
            status[name] = "VERIFICATION FAILED"
            continue
        if isinstance(out, NA):
            status[name] = f"n/a: {out.reason}"
            continue
        fns[name] = out
    # Every case is timed in `rounds` rounds, interleaved with the others, and
    # its best median kept, so background load hits all cases alike.
    times: Dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time_fn(fn, device, min_run_time)
            times[name] = min(t, times.get(name, t))
        bw = max(bw, copy_bandwidth(15 * n, device, min_run_time))
    print(f"copy bandwidth (read+write, best of {rounds + 1} measurements): {bw:.1f} GB/s",
          flush=True)
    print(f"{'case':42s} {'time ms':>9s} {'vs torch fused+scaler':>22s} {'B/param':>8s} "
          f"{'GB/s':>7s} {'of copy':>8s}")
    for name, kind, _, _ in cases:
        if name not in times:
            print(f"{name:42s} {status[name]}")
            continue
        t = times[name]
        gbs = BYTES[kind] * n / t / 1e9
        mark = report.check_bandwidth(f"{device}: {name}", gbs, bw, device)
        r = ratio(t, times.get(REF))
        print(f"{name:42s} {t * 1e3:9.2f} {fmt(r, '.2f') + ('x' if r else ''):>22s} "
              f"{BYTES[kind]:8d} {gbs:7.1f} {gbs / bw:7.0%}{mark}")
        if device == "cuda" and name.startswith("mixprec"):
            print(f"{'':42s} {check_no_sync(fns[name])}")
    for name in ("mixprec AdamW fp16+master, scaler", "mixprec AdamW bf16+master, scaler"):
        print(f"ratio {name} / torch fused+scaler: "
              f"{fmt(ratio(times.get(name), times.get(REF)), '.3f')}")
    plain = ratio(times.get("mixprec AdamW fp32, no scaler"),
                  times.get("torch AdamW(fused) fp32, no scaler"))
    print(f"ratio mixprec fp32 / torch fused fp32 (no scaler): {fmt(plain, '.3f')}", flush=True)
    for dt in ("fp16+master, scaler", "bf16+master, scaler", "fp32, no scaler"):
        r8 = ratio(times.get(f"mixprec AdamW8bit {dt}"), times.get(f"mixprec AdamW {dt}"))
        print(f"ratio mixprec 8-bit / 32-bit state ({dt}): {fmt(r8, '.3f')}")
    for lib in ("torchao", "bitsandbytes"):
        r = ratio(times.get("mixprec AdamW8bit fp32, no scaler"),
                  times.get(f"{lib} AdamW8bit fp32, no scaler"))
        print(f"ratio mixprec 8-bit / {lib} AdamW8bit (fp32, no scaler): {fmt(r, '.3f')}",
              flush=True)


class _Unverified(Exception):
    """A case whose verification failed (already reported)."""


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--cpu-layers", type=int, default=2)
    ap.add_argument("--cpu-vocab", type=int, default=8192)
    ap.add_argument("--cpu-embd", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--state-bytes", action="store_true",
                    help="print the optimizer state bytes per param at GPT-2 small "
                         "(counted from the state tensors; benchmarks/_state_bytes.py) "
                         "and exit; nothing is timed")
    add_timing_args(ap, "1 layer, width 64, vocab 512 on every device, short timing")
    args = ap.parse_args(argv)
    if args.state_bytes:
        import _state_bytes

        _state_bytes.print_table()
        return 0
    min_run_time = args.min_run_time or (0.02 if args.quick else 1.0)
    rounds = args.rounds or (1 if args.quick else 3)
    report = Report("bench_optim", args.bandwidth_tolerance)
    print(f"mixprec {mixprec.__version__}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, "
          f"{datetime.date.today().isoformat()}")
    quick = (gpt2_shapes(1, 512, 64, 256), "quick: GPT-2 layer shapes, 1 layer, width 64, "
             "vocab 512, context 256")
    if args.device in ("cpu", "all"):
        shapes, label = quick if args.quick else (
            gpt2_shapes(args.cpu_layers, args.cpu_vocab, args.cpu_embd),
            f"GPT-2-small layer shapes, SMALLER model: {args.cpu_layers} layers, "
            f"vocab {args.cpu_vocab}, width {args.cpu_embd}")
        run("cpu", shapes, label, min_run_time, rounds, report, args.quick)
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            shapes, label = quick if args.quick else (gpt2_shapes(), "GPT-2 small (124M)")
            run("cuda", shapes, label, min_run_time, rounds, report, args.quick)
        elif args.device == "cuda":
            report.fail("--device cuda: no GPU visible")
        else:
            print("\ncuda: no GPU visible, skipped")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
