"""The GPU proof of ``mixprec.capture.capture_step``: correctness first, then timings.

Correctness (each part: a captured run and an eager run of identical copies, 50 steps, the
same data; every persistent tensor -- params, grads, masters, moments, 8-bit codes and
maxima, step counts, lr, scale, growth tracker -- and every loss compared bit for bit;
``torch.cuda.set_sync_debug_mode("error")`` from the first replay on, and over the eager
run after its warm-up, so any host sync raises):

    fp16_scaler   fp16 params, float32 masters, mixprec.GradScaler, clipping, forced
                  overflows (the loss times inf at 5 steps), StepLR changing the lr
    bf16_8bit     bf16 params, masters, 8-bit moments (state_bits=8), clipping
    bf16_sr       bf16 params without masters, stochastic rounding

Timings (ms per step, CUDA events, after warm-up; each in its own time limit):

    gpt2_1x128    GPT-2 small (124M; 12 x 768, benchmarks/_models.py), batch 1 x 128 tokens
    gpt2_8x1024   the same, 8 x 1024
    convnet       a small conv net, batch 8 x 3 x 32 x 32 (a workload whose step is host-bound)
    convnet_64    the same at batch 64
  each as (``--variants``; ms per step and peak GiB allocated): ``captured`` mixprec
  (fp16 autocast, mixprec AdamW + GradScaler, one graph per step) | ``eager-mixprec`` the
  same step eagerly | ``eager`` torch AMP (torch.autocast fp16, torch.amp.GradScaler,
  torch AdamW fused=True) | ``compile`` torch.compile(mode="reduce-overhead") of the model
  with torch's AMP step around it | ``torch-graph`` torch's own whole-step capture written
  by hand: ``torch.cuda.graph`` around the step of ``AdamW(fused=True, capturable=True)``
  and ``torch.amp.GradScaler``.

Exit status: 1 on a mismatch or an error in a correctness part; timeouts and errors of
timing parts are reported in the table and do not fail the run.

    python tools/gpu_capture_check.py                   # everything, on cuda
    python tools/gpu_capture_check.py --only correctness
    python tools/gpu_capture_check.py --device cpu --dry-run   # the CPU-checkable logic
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import mixprec
from mixprec.capture import capture_step, persistent_tensors

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _models import GPT, ModelConfig, convnet  # noqa: E402

OVERFLOWS = {7, 19, 20, 33, 44}


# --------------------------------------------------------------------------- models

# --------------------------------------------------------------------------- correctness

@dataclass
class Case:
    name: str
    dtype: torch.dtype
    amp: torch.dtype
    scaler: bool
    opt: Dict[str, Any]
    clip: Optional[float]


CASES = {
    "fp16_scaler": Case("fp16_scaler", torch.float16, torch.float16, True,
                        {"master_weights": True}, 1.0),
    "bf16_8bit": Case("bf16_8bit", torch.bfloat16, torch.bfloat16, False,
                      {"master_weights": True, "state_bits": 8, "min_8bit_size": 4096}, 1.0),
    "bf16_sr": Case("bf16_sr", torch.bfloat16, torch.bfloat16, False,
                    {"master_weights": False, "stochastic_rounding": True, "seed": 7}, None),
}


class Run:
    """One training setup (model, mixprec AdamW, scaler, StepLR) and its step body."""

    def __init__(self, case: Case, device: str, small: bool) -> None:
        torch.manual_seed(0)
        d, layers = (64, 2) if small else (256, 4)
        self.vocab, self.ctx = (256, 32) if small else (4096, 128)
        self.model = GPT(ModelConfig(layers, d, 4, self.vocab, self.ctx)).to(device, case.dtype)
        self.opt = mixprec.optim.AdamW(self.model.parameters(), lr=3e-3, **case.opt)
        self.scaler = (mixprec.GradScaler(device, init_scale=2.0**12, growth_interval=6)
                       if case.scaler else None)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=9, gamma=0.7)
        self.case, self.device = case, device

    def body(self, idx: Tensor, tgt: Tensor, mult: Tensor) -> Tensor:
        opt, scaler, case = self.opt, self.scaler, self.case
        opt.zero_grad(set_to_none=False)
        with torch.autocast(self.device, dtype=case.amp):
            logits = self.model(idx)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()) * mult
        if scaler is not None:
            scaler.scale(loss).backward()
            if case.clip is not None:
                scaler.clip_grad_norm_(opt, case.clip)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if case.clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), case.clip)
            opt.step()
        return loss.detach()

    def data(self, steps: int, batch: int) -> List[Tuple[Tensor, Tensor, Tensor]]:
        g = torch.Generator().manual_seed(1)
        out = []
        for s in range(steps):
            idx = torch.randint(0, self.vocab, (batch, self.ctx), generator=g)
            tgt = torch.randint(0, self.vocab, (batch, self.ctx), generator=g)
            inf = self.scaler is not None and s in OVERFLOWS
            mult = torch.tensor(math.inf if inf else 1.0)
            out.append((idx.to(self.device), tgt.to(self.device), mult.to(self.device)))
        return out

    def snapshot(self) -> List[Tuple[str, Tensor]]:
        return [(n, t.detach().clone()) for n, t in
                persistent_tensors([self.opt], self.scaler, [self.model])]


class _SyncErrors:
    """``torch.cuda.set_sync_debug_mode("error")`` for a block (no-op off CUDA)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        if self.on:
            torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc: Any) -> None:
        if self.on:
            torch.cuda.set_sync_debug_mode("default")


def eager_reference(run: Run, data: List[Any], sync_check: bool, warm: int
                    ) -> Tuple[List[Tensor], List[Tuple[str, Tensor]]]:
    """The eager loop: the body, then the scheduler; syncs are errors after ``warm``
    steps. Returns the losses and the final snapshot."""
    losses = []
    for n, batch in enumerate(data):
        with _SyncErrors(sync_check and n >= warm):
            losses.append(run.body(*batch))
            run.sched.step()
    return [x.cpu() for x in losses], run.snapshot()


def captured_run(run: Run, data: List[Any], sync_check: bool, warm: int
                 ) -> Tuple[List[Tensor], List[Tuple[str, Tensor]], Any]:
    step = capture_step(run.body, data[0], optimizers=[run.opt], scaler=run.scaler,
                        modules=[run.model], schedulers=[run.sched], warmup=warm - 2)
    losses = []
    for n, batch in enumerate(data):
        with _SyncErrors(sync_check and n >= warm):  # call warm-1 captures; then replays
            losses.append(step(*batch))
            run.sched.step()
    return [x.cpu() for x in losses], run.snapshot(), step


def compare(a: List[Tuple[str, Tensor]], b: List[Tuple[str, Tensor]], la: List[Tensor],
            lb: List[Tensor]) -> List[str]:
    bad = []
    for n, (x, y) in enumerate(zip(la, lb)):
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            bad.append(f"loss of step {n}: {x.item()} vs {y.item()}")
    if len(a) != len(b):
        bad.append(f"{len(a)} vs {len(b)} persistent tensors")
    for (na, x), (_, y) in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(
                x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            bad.append(na)
    return bad


def correctness(case: Case, device: str, steps: int, small: bool) -> str:
    cuda = device == "cuda"
    warm = 4  # 2 warm-up calls, the checked call, then capture (+ replay) at call 3
    a, b = Run(case, device, small), Run(case, device, small)
    data = a.data(steps, 2)
    la, sa = eager_reference(a, data, cuda, warm)
    lb, sb, step = captured_run(b, data, cuda, warm)
    bad = compare(sa, sb, la, lb)
    if cuda and step.graph is None:
        bad.append("no graph was captured")
    extra = ""
    if a.scaler is not None and b.scaler is not None:
        st_a, st_b = a.scaler.stats(), b.scaler.stats()
        if (st_a.skipped_steps, st_a.scale_increases) != (st_b.skipped_steps,
                                                          st_b.scale_increases):
            bad.append(f"scaler stats {st_a} vs {st_b}")
        if st_b.skipped_steps != len([s for s in OVERFLOWS if s < steps]):
            bad.append(f"skipped {st_b.skipped_steps} steps, forced {len(OVERFLOWS)}")
        extra = f", skipped {st_b.skipped_steps}, grew {st_b.scale_increases}x"
    if bad:
        raise AssertionError(f"{len(bad)} mismatch(es): " + "; ".join(bad[:8]))
    return (f"bitwise equal over {steps} steps ({len(sb)} tensors, "
            f"{int(step.graph is not None)} graph, mode {step.mode}{extra})")


# --------------------------------------------------------------------------- timings

def _time(fn: Callable[[], Any], warm: int, iters: int, device: str) -> float:
    for _ in range(warm):
        fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _workload(name: str, device: str, small: bool) -> Tuple[Callable[[], nn.Module], Any]:
    if name.startswith("gpt2"):
        batch, ctx = (1, 128) if name == "gpt2_1x128" else (8, 1024)
        if small:
            batch, ctx = 1, 16
        cfg = ModelConfig(2, 64, 4, 512, ctx) if small else ModelConfig()
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, cfg.vocab, (batch, ctx), generator=g).to(device)
        tgt = torch.randint(0, cfg.vocab, (batch, ctx), generator=g).to(device)
        return (lambda: GPT(cfg)), (idx, tgt)
    x = torch.randn(64 if name == "convnet_64" and not small else 8, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (x.shape[0],), device=device)
    return convnet, (x, y)


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    out = model(x)
    return F.cross_entropy(out.float().flatten(0, -2) if out.dim() > 2 else out.float(),
                           y.flatten())


def _amp_step(model: nn.Module, opt: Any, scaler: Any, x: Tensor, y: Tensor, device: str,
              set_to_none: Optional[bool]) -> Tensor:
    """One AMP training step as torch's docs write it: grads zeroed (``set_to_none``; None:
    not here), the fp16 autocast forward, the scaled backward, ``scaler.step``,
    ``scaler.update``; returns the loss, detached. The body of every variant."""
    if set_to_none is not None:
        opt.zero_grad(set_to_none=set_to_none)
    with torch.autocast(device, dtype=torch.float16):
        loss = _loss(model, x, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss.detach()


def _torch_graph_step(model: nn.Module, x: Tensor, y: Tensor, device: str
                      ) -> Callable[[], Tensor]:
    """torch's own whole-step capture, written by hand as torch's docs show: the forward,
    backward, ``torch.amp.GradScaler`` step (no sync with a fused optimizer) and update of
    an ``AdamW(fused=True, capturable=True)`` in one ``torch.cuda.graph``; warm-up on a side
    stream. Returns the replay (on CPU: the eager step)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda",
                            capturable=device == "cuda")
    scaler = torch.amp.GradScaler(device)

    def step() -> Tensor:
        return _amp_step(model, opt, scaler, x, y, device, set_to_none=None)

    if device != "cuda":
        return lambda: _amp_step(model, opt, scaler, x, y, device, set_to_none=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        out = step()

    def replay() -> Tensor:
        graph.replay()
        return out
    return replay


VARIANTS = ("captured", "eager-mixprec", "eager", "compile", "torch-graph")


def timing(name: str, variant: str, device: str, small: bool, iters: int
           ) -> Tuple[float, float]:
    """(ms per step, peak GiB allocated) of one workload in one variant:
    ``captured`` mixprec AdamW + GradScaler under ``capture_step``; ``eager-mixprec`` the
    same step eagerly; ``eager`` torch AMP (torch.amp.GradScaler, AdamW fused); ``compile``
    the same with the model under ``torch.compile(mode="reduce-overhead")``;
    ``torch-graph`` torch's hand-written whole-step capture (:func:`_torch_graph_step`)."""
    make, (x, y) = _workload(name, device, small)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = make().to(device)
    if variant in ("captured", "eager-mixprec"):
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = mixprec.GradScaler(device)

        def body(x: Tensor, y: Tensor) -> Tensor:
            return _amp_step(model, opt, scaler, x, y, device, set_to_none=False)

        if variant == "captured":
            step = capture_step(body, (x, y), optimizers=[opt], scaler=scaler,
                                modules=[model])
            fn: Callable[[], Any] = lambda: step(x, y)  # noqa: E731
        else:
            fn = lambda: body(x, y)  # noqa: E731
        warm = 5
    elif variant == "torch-graph":
        fn, warm = _torch_graph_step(model, x, y, device), 3
    else:
        opt_t = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        scaler_t = torch.amp.GradScaler(device)
        fwd = model if variant == "eager" else torch.compile(model, mode="reduce-overhead")

        fn = lambda: _amp_step(fwd, opt_t, scaler_t, x, y, device,  # noqa: E731
                               set_to_none=True)
        warm = 5 if variant == "eager" else 8
    ms = _time(fn, warm, iters, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return ms, peak


# --------------------------------------------------------------------------- driver

class PartTimeout(Exception):
    pass


def _limited(seconds: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` with a wall-clock limit (SIGALRM; main thread)."""
    def alarm(*_: Any) -> None:
        raise PartTimeout(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dry-run", action="store_true",
                   help="tiny models, few steps, no timings of compile: the CPU-checkable "
                        "logic (parsing, the eager reference loop, capture_step's checks)")
    p.add_argument("--only", choices=["correctness", "timings"], default=None)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--workloads", default="gpt2_1x128,gpt2_8x1024,convnet")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--iters", type=int, default=20, help="timed steps per timing")
    p.add_argument("--correctness-limit", type=int, default=150, help="seconds per case")
    p.add_argument("--timing-limit", type=int, default=150, help="seconds per timing")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a GPU; use --device cpu --dry-run here")
    if args.dry_run:
        args.steps = min(args.steps, 10)
        args.iters = min(args.iters, 2)
        if args.device == "cpu":
            args.variants = ",".join(v for v in args.variants.split(",") if v != "compile")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    small = args.dry_run
    rows: List[Tuple[str, str, str]] = []
    failed = False
    print(f"mixprec {mixprec.__version__} ({mixprec.__file__}), torch {torch.__version__}, "
          f"device {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}")
    if args.only in (None, "correctness"):
        for name in args.cases.split(","):
            t0 = time.perf_counter()
            try:
                msg = _limited(args.correctness_limit,
                               lambda name=name: correctness(CASES[name], args.device,
                                                                args.steps, small))
                status = "ok"
            except Exception as e:  # noqa: BLE001  (reported, the run goes on)
                msg, status, failed = f"{type(e).__name__}: {e}", "FAIL", True
            rows.append((f"correctness {name}", status,
                         f"{msg} [{time.perf_counter() - t0:.0f} s]"))
            print(f"{rows[-1][0]:28s} {rows[-1][1]:5s} {rows[-1][2]}", flush=True)
    if args.only in (None, "timings"):
        for work in args.workloads.split(","):
            cells = []
            for variant in args.variants.split(","):
                try:
                    ms, peak = _limited(args.timing_limit,
                                        lambda w=work, v=variant: timing(w, v, args.device,
                                                                           small, args.iters))
                    cells.append(f"{variant} {ms:8.2f} ms {peak:5.2f} GiB")
                except Exception as e:  # noqa: BLE001
                    cells.append(f"{variant} {type(e).__name__}: {str(e)[:80]}")
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            rows.append((f"timing {work}", "-", " | ".join(cells)))
            print(f"{rows[-1][0]:28s} {rows[-1][1]:5s} {rows[-1][2]}", flush=True)
    print("\n" + "\n".join(f"{a:28s} {b:5s} {c}" for a, b, c in rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
