"""Host cost per call of the scaler op and of one optimizer step, mixprec vs torch, on a GPU.

For ``n`` tensors of ``--numel`` elements (default 1,024: the kernels' own work is a few
microseconds even at 4,000 tensors, so a call costs what the host spends issuing it),
each case is called ``--calls`` times back to back without a sync, then the device is
synchronised; the figure is the wall time per call (the median of ``--rounds`` such
blocks). While the GPU keeps up, that is the host cost of one call. The last columns fit
``time = fixed + n * per_tensor`` by least squares over n >= 100.

Cases (fp32 unless named):

=====================  ==============================================================
unscale mixprec.ops    ``mixprec.ops.unscale_and_check_`` (the wrapper over torch.ops)
unscale torch.ops      ``torch.ops.mixprec.unscale_and_check_`` (the dispatcher)
unscale torch          ``torch._amp_foreach_non_finite_check_and_unscale_``
adamw mixprec          ``mixprec.optim.AdamW.step()``, fp32 params
adamw torch fused      ``torch.optim.AdamW(fused=True).step()``, fp32 params
adamw mixprec bf16+m   ``mixprec.optim.AdamW.step()``, bf16 params with fp32 masters
adamw torch fused bf16 ``torch.optim.AdamW(fused=True).step()``, bf16 params (no masters)
adamw mixprec fp16+m   ``mixprec.optim.AdamW.step(grad_scale=, found_inf=)``, fp16
                       params with fp32 masters (the unscale folded in)
iter mixprec           ``mixprec.GradScaler``: ``unscale_(AdamW)`` + ``step`` +
                       ``update()`` (fp32; scale and backward excluded)
iter torch             ``torch.amp.GradScaler``: the same with ``AdamW(fused=True)``
=====================  ==============================================================

Checked once, untimed, on the very objects that are timed: the unscale cases multiply
the grads by ``inv_scale`` and find a planted inf; every optimizer case moves every
param; the scaler iterations report 0 host syncs (CUDA's sync debug mode) and leave the
scale unchanged. A failed check is an error (exit status 1).

    python benchmarks/bench_host_cost.py [--sizes 10,100,1000,2000,4000] [--numel 1024]

``--baseline DIR`` also times the mixprec cases of the package under ``DIR`` (e.g. a
checkout of an earlier commit, with its extension built: ``DIR/mixprec``), in a child
process right after this one's, and prints them as ``<case> (baseline)`` rows of the same
table, with a per-tensor column (the fit's slope) for each. ``--repeats K`` times the whole
table K times, this package and the baseline interleaved (which goes first alternates),
and prints the median of the K figures, then their spread (min-max) and the medians'
ratio to the baseline.

``--allow-cpu --device cpu --numel 1`` runs the same cases on the CPU (one thread): the
same Python host path (optimizer wrapper, list checks, scaler) with one-element CPU
kernels instead of CUDA launches -- a CI-measurable stand-in for the Python part only.
With ``--cpu-time`` it counts the thread's CPU time, which other processes on a shared
machine disturb less than the wall time.

``--emulated`` times the CUDA ops' host path on the CPU, without a GPU: the plan-only ops
of the test library (``mixprec/_cuda_emulation``, built with
``MIXPREC_BUILD_TEST_EXT=1``; tests/_cuda_emulation.py) run everything the CUDA op does
on the host -- checks, flattening, dtype grouping, slot wiring, the launch plan built
from scratch -- and launch nothing. Called through ``torch.ops`` under
``torch.inference_mode()`` on one-element tensors, one thread; controls: mixprec's CPU op
and torch's foreach unscale on the same tensors.
Checked once, untimed: the plans cover exactly the expected number of blocks.
``--cpu-time`` counts the calling thread's CPU time instead of wall time.

    python benchmarks/bench_host_cost.py --emulated [--sizes 10,148,1000,2000] [--cpu-time]

``--launches`` counts the ops each part of a scaler iteration dispatches (a
``TorchDispatchMode`` sees every op that reaches a backend kernel: on CUDA, each is a
launch or a copy), mixprec's and torch's side by side, on the CPU, at ``--sizes`` fp32
params:

    python benchmarks/bench_host_cost.py --launches [--sizes 10,148,1000]

``--captured`` times what a captured step (``mixprec.capture_step``) does on the host per
call besides the replay launch: ``prepare()`` and the copy of the inputs into the static
buffers, at ``--sizes`` param tensors (default 148, GPT-2 small's count), on the CPU:

    python benchmarks/bench_host_cost.py --captured [--sizes 148] [--numel 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import mixprec
from _common import (
    CheckFailed,
    count_cuda_syncs,
    fit_fixed_per_tensor,
    header,
    sync,
    verify_unscale_fn,
)

Case = Tuple[Callable[[], None], Callable[[], None]]  # (timed call, untimed check)


def _params(n: int, numel: int, dtype: torch.dtype, device: str) -> List[torch.nn.Parameter]:
    out = []
    for _ in range(n):
        p = torch.nn.Parameter(torch.randn(numel, device=device).to(dtype))
        p.grad = torch.randn(numel, device=device).to(dtype)
        out.append(p)
    return out


def _moves(weights: Callable[[], List[torch.Tensor]], step: Callable[[], None],
           what: str) -> None:
    """Every weight the optimizer updates (``weights()``: the params, or the float32
    masters of 16-bit params, whose small updates may round away in the param) moves."""
    before = [w.detach().clone() for w in weights()]
    step()
    still = sum(bool(torch.equal(a, w.detach())) for a, w in zip(before, weights()))
    if still:
        raise CheckFailed(f"{what}: {still} of {len(before)} weights did not move")


def _no_syncs(step: Callable[[], None], device: str, what: str) -> None:
    if torch.device(device).type != "cuda":
        return
    step()  # state created outside the count
    with count_cuda_syncs(device) as box:
        step()
    if box[0]:
        raise CheckFailed(f"{what}: {box[0]} host syncs per step (expected 0)")


def cases(n: int, numel: int, device: str) -> Dict[str, Case]:
    """The timed callables for ``n`` tensors, each with its untimed check."""
    out: Dict[str, Case] = {}
    grads = [torch.randn(numel, device=device) for _ in range(n)]
    found_inf = torch.zeros((), device=device)
    inv = torch.ones((), device=device)  # 1.0: repeated calls leave the grads as they are

    def unscale(fn: Callable[..., None]) -> Case:
        def call() -> None:
            fn(grads, found_inf, inv)
        return call, lambda: verify_unscale_fn(call, grads, found_inf, inv, "unscale")

    out["unscale mixprec.ops"] = unscale(mixprec.ops.unscale_and_check_)
    out["unscale torch.ops"] = unscale(torch.ops.mixprec.unscale_and_check_)
    out["unscale torch"] = unscale(torch._amp_foreach_non_finite_check_and_unscale_)

    def optim(opt_fn: Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer],
              dtype: torch.dtype, what: str, **step_kwargs: torch.Tensor) -> Case:
        params = _params(n, numel, dtype, device)
        opt = opt_fn(params)

        def call() -> None:
            opt.step(**step_kwargs)

        def weights() -> List[torch.Tensor]:
            masters = getattr(opt, "master_params", None)
            return masters() if masters is not None and dtype != torch.float32 else params
        return call, lambda: _moves(weights, call, what)

    out["adamw mixprec"] = optim(lambda p: mixprec.optim.AdamW(p, lr=1e-3), torch.float32,
                                 "adamw mixprec")
    out["adamw torch fused"] = optim(lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
                                     torch.float32, "adamw torch fused")
    out["adamw mixprec bf16+m"] = optim(lambda p: mixprec.optim.AdamW(p, lr=1e-3),
                                        torch.bfloat16, "adamw mixprec bf16+m")
    out["adamw torch fused bf16"] = optim(
        lambda p: torch.optim.AdamW(p, lr=1e-1, fused=True), torch.bfloat16,  # (1e-3 rounds away)
        "adamw torch fused bf16")
    scale = torch.full((), 1024.0, device=device)
    no_inf = torch.zeros((), device=device)
    out["adamw mixprec fp16+m"] = optim(lambda p: mixprec.optim.AdamW(p, lr=1e-3),
                                        torch.float16, "adamw mixprec fp16+m",
                                        grad_scale=scale, found_inf=no_inf)

    def iteration(scaler: object, opt_fn: Callable[[List[torch.nn.Parameter]],
                                                   torch.optim.Optimizer],
                  what: str) -> Case:
        params = _params(n, numel, torch.float32, device)
        opt = opt_fn(params)
        scaler.scale(torch.ones((), device=device))  # type: ignore[attr-defined]

        def call() -> None:
            scaler.unscale_(opt)  # type: ignore[attr-defined]
            scaler.step(opt)  # type: ignore[attr-defined]
            scaler.update()  # type: ignore[attr-defined]

        def check() -> None:
            s0 = float(scaler.get_scale())  # type: ignore[attr-defined]
            _moves(lambda: list(params), call, what)
            _no_syncs(call, device, what)
            if float(scaler.get_scale()) != s0:  # type: ignore[attr-defined]
                raise CheckFailed(f"{what}: the scale changed without an overflow")
        return call, check

    out["iter mixprec"] = iteration(mixprec.GradScaler(device, init_scale=1.0),
                                    lambda p: mixprec.optim.AdamW(p, lr=1e-3),
                                    "iter mixprec")
    out["iter torch"] = iteration(torch.amp.GradScaler(device, init_scale=1.0),
                                  lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
                                  "iter torch")
    return out


def per_call_us(fn: Callable[[], None], device: str, calls: int, rounds: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Median over ``rounds`` blocks of microseconds per call (wall time, or ``clock``'s),
    ``calls`` calls issued back to back and one sync per block."""
    fn()
    sync(device)
    times = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(calls):
            fn()
        sync(device)
        times.append((clock() - t0) / calls * 1e6)
    return statistics.median(times)


def _baseline(path: str, argv: List[str], names: List[str]) -> Dict[str, Any]:
    """The table of this script's ``names`` cases timed in a child process on the
    mixprec package under ``path`` (same arguments otherwise)."""
    out = []
    skip = False
    for a in argv:  # (drop --baseline/--cases and their values)
        if skip:
            skip = False
            continue
        if a in ("--baseline", "--cases", "--repeats"):
            skip = True
            continue
        if not a.startswith(("--baseline=", "--cases=", "--repeats=")):
            out.append(a)
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "table.json")
        env = dict(os.environ, PYTHONPATH=path)
        subprocess.run([sys.executable, os.path.abspath(__file__), *out, "--cases",
                        ",".join(names), "--json", target], env=env, check=False)
        with open(target) as f:
            result: Dict[str, Any] = json.load(f)
    return result


# ---------------------------------------------------------------------------------------------
# --emulated: the CUDA ops' host path on the CPU (the test extension's plan-only ops)


def _emulation() -> Any:
    """tests/_cuda_emulation.py (the loader of the test-only extension)."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import _cuda_emulation

    return _cuda_emulation


def _adam_args(n: int, dtype: torch.dtype) -> tuple:
    params = [torch.randn(1).to(dtype) for _ in range(n)]
    masters = [p.float() for p in params] if dtype != torch.float32 else []
    return (params, [torch.randn(1).to(dtype) for _ in range(n)],
            [torch.zeros(1) for _ in range(n)], [torch.zeros(1) for _ in range(n)], [],
            masters, [torch.zeros(()) for _ in range(n)], torch.tensor(1e-3),
            0.9, 0.999, 0.01, 1e-8, False, False, True, torch.ones(1), torch.zeros(1), None,
            False, 0, None)


def emulated_cases(n: int) -> Dict[str, Callable[[], None]]:
    """name -> call over n one-element tensors (the plan-only ops must take them)."""
    ops = _emulation().ops()
    plan_unscale, plan_adam = ops.plan_unscale_and_check_, ops.plan_fused_adam_
    cpu_unscale = mixprec.ops.unscale_and_check_
    grads = [torch.randn(1) for _ in range(n)]
    found, inv = torch.zeros(1), torch.ones(1)  # inv_scale 1: nothing is written
    adam16, adam32 = _adam_args(n, torch.float16), _adam_args(n, torch.float32)
    return {
        "unscale_and_check_ CUDA host path": lambda: plan_unscale(grads, found, inv),
        "fused_adam_ fp16+master CUDA host path": lambda: plan_adam(*adam16),
        "fused_adam_ fp32 CUDA host path": lambda: plan_adam(*adam32),
        "control: mixprec unscale_and_check_ CPU kernel": lambda: cpu_unscale(grads, found, inv),
        "control: torch _amp_foreach_..._unscale_ on CPU":
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv),
    }


def check_plans(n: int) -> None:
    """Untimed: one plan covers n blocks (one per one-element tensor; fused_adam_ adds one
    step-increment block per 256 tensors)."""
    ops = _emulation().ops()
    for name, args, want in (("plan_unscale_and_check_",
                              ([torch.randn(1) for _ in range(n)], torch.zeros(1),
                               torch.ones(1)), n),
                             ("plan_fused_adam_", _adam_args(n, torch.float16),
                              n + (n + 255) // 256)):
        before = ops.planned_blocks()
        getattr(ops, name)(*args)
        if ops.planned_blocks() - before != want:
            raise CheckFailed(f"{name} planned {ops.planned_blocks() - before} blocks, "
                              f"want {want}")


def emulated(sizes: List[int], min_run_time: float, cpu_time: bool) -> int:
    import torch.utils.benchmark as tb

    torch.set_num_threads(1)
    clock = time.thread_time if cpu_time else time.perf_counter
    print(header("bench_host_cost --emulated: the CUDA ops' host path on the CPU, us per call "
                 f"({'thread CPU' if cpu_time else 'wall'} time), n one-element tensors",
                 "cpu"))
    check_plans(max(sizes))
    table: Dict[str, List[float]] = {}
    with torch.inference_mode():
        for n in sizes:
            for name, fn in emulated_cases(n).items():
                timer = tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1, timer=clock)
                table.setdefault(name, []).append(
                    timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)
    width = max(len(k) for k in table)
    print(f"{'case':<{width}} " + " ".join(f"{n:>8}" for n in sizes) + "  fixed us  us/tensor")
    for name, times in table.items():
        fixed, per = fit_fixed_per_tensor(sizes, times)
        print(f"{name:<{width}} " + " ".join(f"{t:8.1f}" for t in times)
              + f"  {fixed:8.1f}  {per:9.3f}")
    return 0


def time_table(args: argparse.Namespace, sizes: List[int],
               on_cuda: bool) -> Tuple[Dict[str, List[float]], List[str]]:
    """One figure per case and size (``args.cases`` of :func:`cases`, each checked first),
    and the failed checks."""
    table: Dict[str, List[float]] = {}
    failed: List[str] = []
    clock = time.thread_time if args.cpu_time and not on_cuda else time.perf_counter
    for n in sizes:
        for name, (call, check) in cases(n, args.numel, args.device).items():
            if args.cases and name not in args.cases.split(","):
                continue
            try:
                check()
            except CheckFailed as exc:
                failed.append(f"n={n} {name}: {exc}")
                table.setdefault(name, []).append(float("nan"))
                continue
            table.setdefault(name, []).append(per_call_us(call, args.device, args.calls,
                                                          args.rounds, clock))
        if on_cuda:
            torch.cuda.empty_cache()
    return table, failed


def captured_call(n: int, numel: int, rounds: int) -> int:
    """``--captured``: the host cost of a captured call's own work on the CPU -- the
    ``prepare()`` every call runs and the copy of the inputs into the static buffers --
    for a model of ``n`` param tensors (Linear layers of ``numel`` weights each and their
    biases; fp16 with fp32 masters, mixprec AdamW, a GradScaler, the checked call done).
    The replay launch itself is one CUDA call, not timed here. One thread, wall time, the
    median (and spread) of ``rounds`` blocks of 200 calls; prints one JSON line."""
    import mixprec
    from mixprec.capture import capture_step

    torch.set_num_threads(1)
    width = max(1, int(numel ** 0.5))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(n // 2)]).half()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.GradScaler("cpu")
    x, y = torch.randn(4, width), torch.randn(4, width)

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = (model(x.half()).float() - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    step = capture_step(body, (x, y), optimizers=[opt], scaler=scaler, modules=[model],
                        warmup=0)
    step(x, y)  # the checked call: what a graph would hold is recorded
    static = (x.clone(), y.clone())
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(200):
            step.prepare()
            static[0].copy_(x)
            static[1].copy_(y)
        times.append((time.perf_counter() - t0) / 200 * 1e6)
    times.sort()
    params = sum(1 for _ in model.parameters())
    print(json.dumps({"params": params, "median_us": times[len(times) // 2],
                      "min_us": times[0], "max_us": times[-1], "rounds": rounds}))
    return 0


def count_launches(sizes: List[int]) -> int:
    """``--launches``: per scaler part (``unscale_``, ``step``, ``update()``) and for a bare
    ``optimizer.step()``, the ops a dispatch mode sees that are not views or the profiler's
    markers (each a kernel launch or a copy on CUDA), mixprec's (GradScaler + AdamW) and
    torch's (GradScaler + AdamW(fused=True)); each op with its count, for ``update()``."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = str(func.overloadpacket)
            if not func.is_view and not name.startswith("profiler."):  # (launch nothing)
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    print(f"{'side':<8} {'n':>5} {'unscale_':>9} {'step':>5} {'update':>7} {'opt.step':>9}"
          "  update()'s ops")
    for n in sizes:
        for side, scaler, make in (
                ("mixprec", mixprec.GradScaler("cpu", init_scale=1.0),
                 lambda p: mixprec.optim.AdamW(p, lr=1e-3)),
                ("torch", torch.amp.GradScaler("cpu", init_scale=1.0),
                 lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True))):
            opt = make(_params(n, 1, torch.float32, "cpu"))
            scaler.scale(torch.ones(()))
            for _ in range(2):  # state and flags created outside the count
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
            counts = []
            for part, part_args in ((scaler.unscale_, (opt,)), (scaler.step, (opt,)),
                                    (scaler.update, ()), (opt.step, ())):
                with Count() as c:
                    part(*part_args)
                counts.append(c)
            print(f"{side:<8} {n:>5} " + " ".join(
                f"{sum(c.ops.values()):>{w}}" for c, w in zip(counts, (9, 5, 7, 9)))
                + "  " + ", ".join(f"{k} x{v}" for k, v in sorted(counts[2].ops.items())))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="10,100,1000,2000,4000")
    ap.add_argument("--numel", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=50, help="calls per timed block")
    ap.add_argument("--rounds", type=int, default=15, help="timed blocks per figure")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default all)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="time on the CPU: the host work plus CPU kernels over --numel "
                         "elements per tensor (use --numel 1); not a GPU figure")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="also time the mixprec cases of the package under DIR (a child "
                         "process with PYTHONPATH=DIR), as '<case> (baseline)' rows")
    ap.add_argument("--repeats", type=int, default=1,
                    help="time the table this many times (with --baseline: interleaved) and "
                         "print the median figure and the spread")
    ap.add_argument("--emulated", action="store_true",
                    help="the CUDA ops' host path on the CPU through the test extension")
    ap.add_argument("--min-run-time", type=float, default=0.3, help="--emulated: seconds")
    ap.add_argument("--cpu-time", action="store_true",
                    help="on the CPU (--emulated, --allow-cpu): the calling thread's CPU "
                         "time, not wall time (steadier on a busy machine)")
    ap.add_argument("--captured", action="store_true",
                    help="a captured call's prepare() + input copy on the CPU, at --sizes[0] "
                         "param tensors (GPT-2 small: 148)")
    ap.add_argument("--launches", action="store_true",
                    help="count the ops dispatched per scaler part and optimizer step (CPU)")
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)  # (the child's table)
    args = ap.parse_args(argv)
    if args.launches:
        return count_launches([int(s) for s in (args.sizes if args.sizes != ap.get_default(
            "sizes") else "10,148,1000").split(",")])
    if args.captured:
        n = int(args.sizes.split(",")[0]) if args.sizes != ap.get_default("sizes") else 148
        return captured_call(n, args.numel, args.rounds)
    if args.emulated:
        sizes = [int(s) for s in (args.sizes if args.sizes != ap.get_default("sizes")
                                  else "10,148,1000,2000").split(",")]
        return emulated(sizes, args.min_run_time, args.cpu_time)
    on_cuda = args.device == "cuda" and torch.cuda.is_available()
    if not on_cuda and not (args.allow_cpu and args.device == "cpu"):
        print("bench_host_cost: needs a CUDA device (the figure is the host cost of "
              "issuing GPU work); --allow-cpu times the CPU path, and --emulated "
              "the CUDA ops' host path on the CPU", file=sys.stderr)
        return 2
    if not on_cuda:
        torch.set_num_threads(1)  # (the CPU kernels of one-element tensors: host work)
    sizes = [int(s) for s in args.sizes.split(",")]
    clock = "thread CPU" if args.cpu_time and not on_cuda else "wall"
    print(header(f"bench_host_cost: {clock} us per call, {args.numel}-element fp32 tensors, "
                 f"{args.calls} calls per block, median of {args.rounds} blocks", args.device))
    if args.json:
        table, failed = time_table(args, sizes, on_cuda)
        with open(args.json, "w") as f:
            json.dump({"table": table, "failed": failed}, f)
        return 1 if failed else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    runs: List[Dict[str, List[float]]] = []
    failed = []
    names: List[str] = []  # the mixprec cases, which the baseline times too
    for r in range(args.repeats):
        # which goes first alternates (from the second run on), so a drift favours neither
        child = _baseline(args.baseline, argv, names) if args.baseline and r % 2 else None
        mine, failures = time_table(args, sizes, on_cuda)
        failed += failures
        names = [k for k in mine if "mixprec" in k]
        if args.baseline:
            child = child or _baseline(args.baseline, argv, names)
            for name in names:
                mine[f"{name} (baseline)"] = child["table"].get(name,
                                                                [float("nan")] * len(sizes))
            failed += [f"baseline {x}" for x in child["failed"]]
        runs.append(mine)
    table = {name: [statistics.median(run[name][i] for run in runs) for i in range(len(sizes))]
             for name in runs[0]}
    width = max(len(k) for k in table)
    print(f"{'case':<{width}} " + " ".join(f"{n:>9}" for n in sizes)
          + "  fixed us  us/tensor  " + " ".join(f"{f'us/t @{n}':>9}" for n in sizes))
    for name, times in table.items():
        fixed, per = fit_fixed_per_tensor(sizes, times)
        print(f"{name:<{width}} " + " ".join(f"{t:>9.1f}" for t in times)
              + f"  {fixed:>8.2f}  {per:>9.4f}  "
              + " ".join(f"{t / n:>9.3f}" for t, n in zip(times, sizes)))
    ref = table.get("unscale torch")
    for name in ("unscale mixprec.ops", "unscale torch.ops"):
        if ref and name in table:
            print(f"ratio {name} / unscale torch: "
                  + " ".join(f"{a / b:.2f}" for a, b in zip(table[name], ref)))
    for a, b in (("adamw mixprec", "adamw torch fused"),
                 ("adamw mixprec bf16+m", "adamw torch fused bf16"),
                 ("iter mixprec", "iter torch"),
                 ("adamw mixprec (baseline)", "adamw torch fused"),
                 ("adamw mixprec bf16+m (baseline)", "adamw torch fused bf16"),
                 ("iter mixprec (baseline)", "iter torch")):
        if a in table and b in table:
            print(f"ratio {a} / {b}: "
                  + " ".join(f"{x / y:.2f}" for x, y in zip(table[a], table[b])))
    if args.repeats > 1:
        print(f"spread over {args.repeats} repeats (min-max), and median / baseline:")
        for name in table:
            spread = " ".join(f"{min(run[name][i] for run in runs):>9.1f}-"
                              f"{max(run[name][i] for run in runs):<9.1f}"
                              for i in range(len(sizes)))
            base = table.get(f"{name} (baseline)")
            ratio = "" if base is None else "  " + " ".join(
                f"{x / y:.3f}" for x, y in zip(table[name], base))
            print(f"{name:<{width}} {spread}{ratio}")
    for line in failed:
        print(f"!! {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
