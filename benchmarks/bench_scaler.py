"""One GradScaler iteration, mixprec vs torch, on the same parameters.

An iteration is what the scaler does between ``backward()`` and the next
forward (backward excluded): ``unscale_`` (where listed), ``step`` and
``update``. Cases:

* ``sgd``            unscale_ + step(SGD, default settings) + update
* ``adamw-fused``    step(torch AdamW fused=True) + update (the optimizer unscales
                     in its kernel; the scaler only checks for inf/NaN)
* ``adamw-fused+u``  unscale_ + step(AdamW fused=True) + update (the clipping recipe)

over a few parameter sets (fp32, and fp32+bf16 mixed). Each timed iteration
first restores the (scaled) gradients with one ``torch._foreach_copy_`` so that
every iteration sees the same values; that restore is timed alone and
subtracted ("net"). Timings: torch.utils.benchmark ``blocked_autorange``
medians, both scalers measured in the same process, interleaved per case over
``--rounds`` rounds (the best median of each is kept).

Verification, untimed, on the instances that are timed: the first iteration
of mixprec's scaler leaves the same params, grads, optimizer state and scale,
bitwise, as torch's scaler on the same params (where torch's scaler cannot run
a case -- it has no bf16 unscale on CUDA -- as the same torch optimizer
stepped on the grads divided by the scale: exact, the scale is a power of
two); the second iteration, with an inf planted in a grad, changes no param
and halves the scale. A failed check is an error (exit status 1, the case is
not timed); a case torch cannot run prints n/a in its columns.

Host syncs per iteration: on CUDA, the synchronisations reported by
``torch.cuda.set_sync_debug_mode("warn")`` during one iteration; on CPU (where
nothing syncs) the number of device-to-host reads (``Tensor.item``/``tolist``/
``__bool__``...) that *would* sync on a GPU.

    PYTHONPATH=python python benchmarks/bench_scaler.py [--device cpu|cuda|all]
        [--min-run-time 1.0] [--rounds 3] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import platform
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

import mixprec
from _common import (
    NA,
    CheckFailed,
    Report,
    check_equal,
    check_unchanged,
    count_cuda_syncs,
    fmt,
    plant_inf,
    ratio,
    restore_planted,
    run_control,
    snapshot,
    sync,
    time_fn,
)

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
INIT_SCALE = 1024.0  # a power of two: unscaling is exact (the reference relies on it)
SPECS = ("fp32-few-large", "fp32-many-small", "fp32+bf16-mixed")
CASES = ("sgd", "adamw-fused", "adamw-fused+u")


def make_params(device: str, spec: str, seed: int = 0,
                quick: bool = False) -> List[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    k = 8 if quick else 1  # --quick: every dimension / 8, tensor counts / 10
    if spec == "fp32-few-large":
        shapes = [(1024 // k, 1024 // k)] * 8 + [(1024 // k,)] * 8
        dtypes = [torch.float32] * 16
    elif spec == "fp32-many-small":
        m = 30 if quick else 300
        shapes, dtypes = [(64, 64)] * m + [(64,)] * m, [torch.float32] * (2 * m)
    elif spec == "fp32+bf16-mixed":
        shapes = [(512 // k, 512 // k)] * 16 + [(512 // k,)] * 16
        dtypes = [torch.float32, torch.bfloat16] * 16
    else:
        raise ValueError(spec)
    out = []
    for shape, dt in zip(shapes, dtypes):
        p = torch.nn.Parameter(torch.randn(shape, generator=g).to(device, dt))
        p.grad = (torch.randn(shape, generator=g) * INIT_SCALE).to(device, dt)
        out.append(p)
    return out


def make_optimizer(case: str, params: List[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if case == "sgd":
        return torch.optim.SGD(params, lr=1e-6)
    return torch.optim.AdamW(params, lr=1e-6, fused=True)


@dataclasses.dataclass
class Iteration:
    """One scaler + optimizer on its own params; ``iteration()`` is what is timed."""

    params: List[torch.nn.Parameter]
    saved: List[torch.Tensor]  # the scaled grads every iteration starts from
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    iteration: Callable[[], None]
    restore: Callable[[], None]

    def state(self) -> List[torch.Tensor]:
        """Params, grads and optimizer-state tensors (step counts excluded: torch keeps
        them on the host for some optimizers)."""
        out: List[torch.Tensor] = []
        for p in self.params:
            out += [p.detach(), p.grad]
            out += [t for k, t in self.opt.state[p].items()
                    if torch.is_tensor(t) and k != "step"]
        return out


def make_iteration(scaler_cls: type, device: str, spec: str, case: str,
                   quick: bool = False) -> Iteration:
    params = make_params(device, spec, quick=quick)
    grads = [p.grad for p in params]
    saved = [g.clone() for g in grads]
    opt = make_optimizer(case, params)
    scaler = scaler_cls(device, init_scale=INIT_SCALE)
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

    return Iteration(params, saved, opt, scaler, iteration, restore)


def reference_state(device: str, spec: str, case: str, quick: bool) -> List[torch.Tensor]:
    """What one iteration of a correct scaler leaves, without any scaler: the same torch
    optimizer stepped on the grads divided by the scale (exact: a power of two). The
    grads end unscaled in every case: by ``unscale_``, or (adamw-fused) by torch's fused
    kernel, which writes the unscaled grads back."""
    params = make_params(device, spec, quick=quick)
    for p in params:
        p.grad.div_(INIT_SCALE)
    opt = make_optimizer(case, params)
    opt.step()
    ref = Iteration(params, [], opt, None, lambda: None, lambda: None)  # type: ignore[arg-type]
    return ref.state()


def verify(label: str, ours: Iteration, theirs: object, device: str, spec: str, case: str,
           quick: bool) -> None:
    """Run and check the first two iterations of ``ours`` (mixprec's scaler) against
    ``theirs`` (torch's, already run once by the caller), or against
    :func:`reference_state` when ``theirs`` is NA. Raises CheckFailed."""
    ours.iteration()
    sync(device)
    if isinstance(theirs, Iteration):
        expected, expected_scale, what = theirs.state(), theirs.scaler.get_scale(), "torch's"
    else:
        expected, expected_scale = reference_state(device, spec, case, quick), INIT_SCALE
        what = "the reference (torch optimizer on grads / scale)"
    for k, (a, e) in enumerate(zip(ours.state(), expected)):
        check_equal(a, e, f"{label}: state tensor {k} after one iteration vs {what}")
    if ours.scaler.get_scale() != expected_scale:
        raise CheckFailed(f"{label}: scale {ours.scaler.get_scale()} after one iteration, "
                          f"{what}: {expected_scale}")
    # an inf in a grad: the step is skipped and the scale backs off
    before = snapshot([p.detach() for p in ours.params])
    planted = plant_inf(ours.saved)
    try:
        ours.iteration()
        sync(device)
    finally:
        restore_planted(planted)
    check_unchanged(before, [p.detach() for p in ours.params],
                    f"{label}: params after an iteration with an inf (must be skipped)")
    if ours.scaler.get_scale() != expected_scale * 0.5:
        raise CheckFailed(f"{label}: scale {ours.scaler.get_scale()} after an iteration "
                          f"with an inf, expected {expected_scale * 0.5}")


@contextlib.contextmanager
def count_host_reads(device: str):
    counter = {"n": 0}
    if device == "cuda":
        with count_cuda_syncs(device) as box:
            yield counter
        counter["n"] = box[0]
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


def count_syncs(it: Callable[[], None], device: str) -> int:
    with count_host_reads(device) as c:
        it()
        if device == "cuda":
            torch.cuda.synchronize()
    return c["n"]


def run(devices: List[str], min_run_time: float, rounds: int, quick: bool,
        report: Report, specs: Sequence[str] = SPECS, cases: Sequence[str] = CASES) -> None:
    print(f"torch {torch.__version__}, mixprec {mixprec.__version__}, "
          f"threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}"
          f"{' (--quick: small parameter sets)' if quick else ''}")
    if "cuda" in devices:
        print(f"GPU: {torch.cuda.get_device_name()}")
    header = (f"{'device':<6} {'params':<16} {'case':<14} {'torch us':>9} {'mixprec us':>10} "
              f"{'restore us':>10} {'ratio':>6} {'net ratio':>9} {'syncs t/m':>9}")
    print(header)
    print("-" * len(header), flush=True)
    notes: List[str] = []
    for device in devices:
        for spec in specs:
            for case in cases:
                label = f"{device} {spec} {case}"
                ours = make_iteration(mixprec.GradScaler, device, spec, case, quick)
                theirs_it = make_iteration(torch.amp.GradScaler, device, spec, case, quick)
                theirs = run_control(theirs_it.iteration)  # torch's first iteration
                if isinstance(theirs, NA):
                    notes.append(f"n/a ({label}): torch's GradScaler -- {theirs.reason}")
                else:
                    sync(device)
                    theirs = theirs_it
                check = functools.partial(verify, label, ours, theirs, device, spec, case,
                                          quick)
                if not report.verify(label, check):
                    print(f"{device:<6} {spec:<16} {case:<14} VERIFICATION FAILED: not timed",
                          flush=True)
                    continue
                iters: Dict[str, Callable[[], None]] = {"mixprec": ours.iteration}
                syncs: Dict[str, Optional[int]] = {"mixprec": count_syncs(ours.iteration, device),
                                                   "torch": None}
                if isinstance(theirs, Iteration):
                    iters["torch"] = theirs.iteration
                    syncs["torch"] = count_syncs(theirs.iteration, device)
                # interleaved rounds, best median per scaler: robust to a noisy machine
                times: Dict[str, float] = {}
                for _ in range(rounds):
                    for name, it in iters.items():
                        t = time_fn(it, device, min_run_time) * 1e6
                        times[name] = min(times.get(name, float("inf")), t)
                restore_t = min(time_fn(ours.restore, device, min_run_time / 2) * 1e6
                                for _ in range(rounds))
                t_torch = times.get("torch")
                net = (ratio(times["mixprec"] - restore_t, max(t_torch - restore_t, 1e-9))
                       if t_torch is not None else None)
                print(f"{device:<6} {spec:<16} {case:<14} {fmt(t_torch, '.1f', 9)} "
                      f"{times['mixprec']:>10.1f} {restore_t:>10.1f} "
                      f"{fmt(ratio(times['mixprec'], t_torch), '.2f', 6)} {fmt(net, '.2f', 9)} "
                      f"{fmt(syncs['torch'], 'd', 4)}/{syncs['mixprec']:<4}", flush=True)
    print("ratio = mixprec / torch (< 1: mixprec faster); net = after subtracting the "
          "gradient restore; syncs t/m = host syncs per iteration, torch / mixprec")
    for n in notes:
        print(n)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="mixprec vs torch GradScaler iteration")
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--min-run-time", type=float, default=None, help="seconds (default 1.0)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds, best kept (default 3; --quick: 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--quick", action="store_true",
                    help="small parameter sets and short timing (a smoke test)")
    ap.add_argument("--specs", default=",".join(SPECS), help="parameter sets, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES), help="cases, comma-separated")
    args = ap.parse_args(argv)
    specs, cases = args.specs.split(","), args.cases.split(",")
    for x in specs + cases:
        if x not in SPECS + CASES:
            ap.error(f"unknown parameter set or case {x!r}")
    min_run_time = args.min_run_time or (0.02 if args.quick else 1.0)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = Report("bench_scaler")
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            report.fail("--device cuda: no GPU visible")
            return report.finish()
        devices.remove("cuda")
        print("(no CUDA device: CPU only)")
    run(devices, min_run_time, rounds, args.quick, report, specs, cases)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
