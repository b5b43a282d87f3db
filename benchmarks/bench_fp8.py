"""FP8 training (``precision_level="fp8"``, torchao's Float8 linears) beside BF16.

Two modes:

* ``--device cpu`` (default): the accuracy study. bench_8bit_accuracy.py's tiny
  character-level GPT (embedding 64, 2 blocks, 4x MLP, context 32, batch 16: every
  hidden linear has dimensions divisible by 16), seeds 0, 1, 2, trained through
  :class:`mixprec.MixedPrecisionManager` in AUTOMATIC mode with mixprec's AdamW:
  ``bf16`` (precision_level="bf16") and ``fp8 <recipe>`` for each torchao recipe
  (``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp``; default module filter: the first
  and last linears, and the LM head whose width is the vocabulary, stay in bfloat16).
  Reported: final train loss (mean of the last 50 steps) and held-out loss per run,
  mean +- std per setting, and the verdict: whether each fp8 recipe's mean final loss
  lies within BF16's seed-to-seed spread (min..max over the seeds, widened to at least
  mean +- 1 std). Then, on the fp8-converted model (each recipe), mixprec's AdamW against
  ``torch.optim.AdamW`` (``foreach=False``), fed the same gradients every step
  (teacher-forced: the gradients of the mixprec copy are given to the torch copy and to
  a float64 torch AdamW reference), for ``--adamw-steps`` steps: the largest distance of
  each float32 run from the float64 one, in float32 ulps of |weight| + lr; mixprec's must
  be within ``ROUNDING_RATIO`` x torch's + ``ROUNDING_SLACK``. And free-running (each
  copy its own gradients), the final-loss difference.
  Check: every run trained (final loss < 0.7 x first loss) and the AdamW check holds;
  else exit status 1.

* ``--device cuda``: the speed study, for a GPU with float8 tensor cores (sm89+). A
  stack of pre-LayerNorm transformer layers (hidden ``--hidden``, default 2048; 20
  layers: about 1.0 B parameters) on random bfloat16 inputs of ``--batch`` x ``--seq``
  tokens, loss = mean square of the output. Side by side, in one process: ``bf16 +
  mixprec AdamW`` (AUTOMATIC, float32 params), ``fp8 <recipe> + mixprec AdamW`` for each
  recipe, and ``torchao fp8 tensorwise + torch fused AdamW`` (plain torchao: the same
  module filter, ``torch.autocast``, ``torch.optim.AdamW(fused=True)``). Each block is
  compiled (``block.compile()``, as torchao advises for float8; ``--no-compile`` runs
  eagerly). Per part: ``--warmup`` untimed steps, then timed steps until ``--steps`` or
  ``--time-limit`` seconds; tokens/s and peak memory (``torch.cuda.max_memory_allocated``).
  A part that runs out of memory or fails is reported and the others go on. Check: every
  part's loss finite.

``--tiny`` shrinks the speed study to a few seconds on any device (hidden 64, 2 layers,
batch 2 x 32 tokens, 3 steps): ``--device cpu --tiny`` exercises the GPU mode's code on
the CPU (tests/train/test_fp8.py runs it).

Usage:
    PYTHONPATH=python python benchmarks/bench_fp8.py [--steps-lm N] [--threads N]
    PYTHONPATH=python python benchmarks/bench_fp8.py --device cpu --tiny
    PYTHONPATH=python python benchmarks/bench_fp8.py --device cuda        # on an sm89+ GPU
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import mixprec
import mixprec.optim
from _models import Block, ModelConfig, tiny_gpt
from bench_8bit_accuracy import LMData, last_n, ref_band
from mixprec.train.fp8 import Fp8Handle, default_module_filter, fp8_unavailable

SEEDS = (0, 1, 2)
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
LR_LM = 3e-3
WEIGHT_DECAY = 0.01
TRAINED_RATIO = 0.7
#: teacher-forced, mixprec's AdamW must stay as close to torch's AdamW in float64 as
#: torch's own float32 AdamW does, within this factor plus ROUNDING_SLACK ulps of
#: |weight| + lr ("equal within float32 rounding": both round the same formula in another
#: order, and the rounding differences add up over the steps)
ROUNDING_RATIO = 2.0
ROUNDING_SLACK = 4.0


# ----------------------------------------------------------------------------- accuracy


@dataclass
class LMRun:
    first_loss: float
    final_loss: float
    held_loss: float
    seconds: float
    fp8_linears: int


def lm_run(data: LMData, seed: int, level: str, recipe: str, steps: int) -> LMRun:
    """Train the tiny GPT through MixedPrecisionManager (AUTOMATIC) for ``steps``."""
    vocab = len(data.chars)
    torch.manual_seed(seed)
    model = tiny_gpt(vocab)
    opt = mixprec.optim.AdamW(model.parameters(), lr=LR_LM, weight_decay=WEIGHT_DECAY)
    cfg = mixprec.MixedPrecisionConfig(mode="automatic", precision_level=level,
                                       fp8_recipe=recipe, performance_monitoring=False)
    manager = mixprec.MixedPrecisionManager(model, opt, cfg)
    n_fp8 = 0 if manager.fp8 is None else len(manager.fp8.modules)
    starts = data.batch_starts(steps, seed)
    offs = torch.arange(LMData.CTX)
    losses = torch.empty(steps)
    model.train()
    t0 = time.perf_counter()
    for i in range(steps):
        pos = starts[i].unsqueeze(1) + offs
        x, y = data.train[pos], data.train[pos + 1]
        opt.zero_grad(set_to_none=True)
        with manager.autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        manager.backward(loss)
        manager.step()
        losses[i] = loss.detach()
    secs = time.perf_counter() - t0
    model.eval()
    with torch.no_grad(), manager.autocast():
        logits = model(data.held_x)
    held = F.cross_entropy(logits.float().view(-1, vocab), data.held_y.view(-1)).item()
    ls = losses.tolist()
    tail = ls[-last_n(steps):]
    return LMRun(ls[0], sum(tail) / len(tail), held, secs, n_fp8)


def adamw_check(data: LMData, recipe: str, steps: int) -> Tuple[float, float, float]:
    """On the fp8-converted tiny GPT, teacher-forced: the largest distance of mixprec's
    AdamW and of torch's (float32) from torch's AdamW in float64, in float32 ulps of
    |weight| + lr; and free-running, the final-loss difference of mixprec and torch."""
    vocab = len(data.chars)
    torch.manual_seed(0)
    base = tiny_gpt(vocab)
    Fp8Handle(base, recipe, torch.bfloat16, "cpu")  # what the FP8 level does
    offs = torch.arange(LMData.CTX)
    starts = data.batch_starts(steps, 0)

    def batch(i: int) -> Tuple[Tensor, Tensor]:
        pos = starts[i].unsqueeze(1) + offs
        return data.train[pos], data.train[pos + 1]

    def loss_of(model: nn.Module, i: int) -> Tensor:
        x, y = batch(i)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

    def pair() -> Tuple[nn.Module, nn.Module, Any, Any]:
        a, b = copy.deepcopy(base), copy.deepcopy(base)
        oa = mixprec.optim.AdamW(a.parameters(), lr=LR_LM, weight_decay=WEIGHT_DECAY)
        ob = torch.optim.AdamW(b.parameters(), lr=LR_LM, weight_decay=WEIGHT_DECAY,
                               foreach=False)
        return a, b, oa, ob

    # teacher-forced: the torch copy, and a float64 torch reference, step on the mixprec
    # copy's gradients
    a, b, oa, ob = pair()
    ref = [p.detach().double().clone().requires_grad_(True) for p in a.parameters()]
    oref = torch.optim.AdamW(ref, lr=LR_LM, weight_decay=WEIGHT_DECAY, foreach=False)
    err = [0.0, 0.0]  # max ulps from the float64 reference: mixprec, torch
    for i in range(steps):
        oa.zero_grad(set_to_none=True)
        loss_of(a, i).backward()
        for p, q, r in zip(a.parameters(), b.parameters(), ref):
            q.grad = p.grad.clone()
            r.grad = p.grad.double()
        oa.step()
        ob.step()
        oref.step()
        for p, q, r in zip(a.parameters(), b.parameters(), ref):
            # an update of size lr rounds at its own scale: the ulp of |p| + lr
            ulp = torch.finfo(torch.float32).eps * (r.detach().abs() + LR_LM)
            for k, t in enumerate((p, q)):
                err[k] = max(err[k], float(((t.detach().double() - r.detach()).abs()
                                             / ulp).max()))
    # free-running
    a, b, oa, ob = pair()
    finals = []
    for m, o in ((a, oa), (b, ob)):
        ls = []
        for i in range(steps):
            o.zero_grad(set_to_none=True)
            loss = loss_of(m, i)
            loss.backward()
            o.step()
            ls.append(float(loss.detach()))
        finals.append(statistics.fmean(ls[-last_n(steps):]))
    return err[0], err[1], abs(finals[0] - finals[1])


def mean_std(xs: List[float]) -> Tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def accuracy(args: argparse.Namespace) -> int:
    steps = args.steps_lm
    data = LMData()
    why = fp8_unavailable()
    if why is not None:
        print(f"FAILED: the FP8 level cannot run: {why}")
        return 1
    settings = [("bf16", "bf16", "tensorwise")] + [(f"fp8 {r}", "fp8", r) for r in RECIPES]
    results: Dict[str, Dict[int, LMRun]] = {}
    t_all = time.perf_counter()
    for name, level, recipe in settings:
        results[name] = {}
        for seed in SEEDS:
            r = lm_run(data, seed, level, recipe, steps)
            results[name][seed] = r
            print(f"[progress] {name} / seed {seed}: final loss {r.final_loss:.4f}, "
                  f"{r.seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"\n=== tiny LM (vocab {len(data.chars)}, lr {LR_LM:g}, weight_decay "
          f"{WEIGHT_DECAY}, {steps} steps; final loss = mean of the last {last_n(steps)} "
          "steps; AUTOMATIC mode, mixprec AdamW) ===")
    head = (f"{'setting':<24} {'seed':>4} {'fp8 lin':>7} {'first':>8} {'final':>8} "
            f"{'held':>8} {'s/run':>7}")
    print(head)
    print("-" * len(head))
    failed: List[str] = []
    for name, per in results.items():
        for seed, r in per.items():
            print(f"{name:<24} {seed:>4} {r.fp8_linears:>7} {r.first_loss:>8.4f} "
                  f"{r.final_loss:>8.4f} {r.held_loss:>8.4f} {r.seconds:>7.1f}")
            if not r.final_loss < TRAINED_RATIO * r.first_loss:
                failed.append(f"{name} seed {seed}")
    print("\nmean +- std over the seeds:")
    for name, per in results.items():
        m, s = mean_std([r.final_loss for r in per.values()])
        hm, hs = mean_std([r.held_loss for r in per.values()])
        print(f"  {name:<24} final {m:.4f} +- {s:.4f}   held {hm:.4f} +- {hs:.4f}")
    lo, hi = ref_band([r.final_loss for r in results["bf16"].values()])
    print(f"\nverdict (tiny LM): BF16 spread {lo:.4f} .. {hi:.4f}")
    for name in results:
        if name == "bf16":
            continue
        m, _ = mean_std([r.final_loss for r in results[name].values()])
        verdict = "WITHIN" if lo <= m <= hi else ("below (better)" if m < lo else "ABOVE")
        print(f"  {name:<24} mean final {m:.4f}: {verdict}")
    print(f"\nmixprec AdamW vs torch AdamW (foreach=False) on the fp8-converted model, "
          f"{args.adamw_steps} steps:")
    for recipe in RECIPES:
        mine, theirs, dloss = adamw_check(data, recipe, args.adamw_steps)
        ok = mine <= ROUNDING_RATIO * theirs + ROUNDING_SLACK
        print(f"  fp8 {recipe:<20} teacher-forced max distance from float64 AdamW: mixprec "
              f"{mine:.1f} ulp, torch {theirs:.1f} ulp: {'ok' if ok else 'FAIL'}; "
              f"free-running final-loss difference {dloss:.2e}")
        if not ok:
            failed.append(f"AdamW check fp8 {recipe}")
    print(f"\ntotal time: {time.perf_counter() - t_all:.1f} s")
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    print(f"check passed: every run trained (final < {TRAINED_RATIO} x first loss) and "
          "mixprec AdamW equals torch AdamW within the bound")
    return 0


# ----------------------------------------------------------------------------- speed


class Stack(nn.Module):
    """``n_layer`` pre-LayerNorm transformer blocks (``_models.Block``: attention through
    SDPA, 4x GELU MLP, linears without bias) on (batch, tokens, d) inputs."""

    def __init__(self, d: int, n_layer: int, n_head: int) -> None:
        super().__init__()
        cfg = ModelConfig(n_layer, d, n_head, gelu="none", bias=False)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(n_layer))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass
class SpeedResult:
    name: str
    tokens_per_s: Optional[float] = None
    peak_gib: Optional[float] = None
    steps: int = 0
    loss: Optional[float] = None
    error: Optional[str] = None


def _peak_reset(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def _peak(dev: torch.device) -> Optional[float]:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**30
    return None


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def speed_part(name: str, args: argparse.Namespace, dev: torch.device,
               setup: Callable[[nn.Module], Tuple[Callable[[Tensor], Tensor],
                                                  Callable[[Tensor], None],
                                                  Callable[[], None]]]) -> SpeedResult:
    """One side of the speed study: build the stack, ``setup(model)`` gives (loss of a
    batch, backward + optimizer step of a loss, zero_grad); warm up, then time."""
    res = SpeedResult(name)
    model: Optional[nn.Module] = None
    try:
        _peak_reset(dev)
        torch.manual_seed(0)
        with torch.device(dev):
            model = Stack(args.hidden, args.layers, args.heads)
        fwd_loss, step, zero = setup(model)
        if args.compile:
            for layer in model.layers:  # type: ignore[union-attr]
                layer.compile()
        tokens = args.batch * args.seq
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(args.batch, args.seq, args.hidden, device=dev, generator=g,
                        dtype=torch.bfloat16)
        loss = torch.zeros(())

        def one() -> Tensor:
            zero()
            loss = fwd_loss(x)
            step(loss)
            return loss.detach()

        for _ in range(args.warmup):
            loss = one()
        _sync(dev)
        t0 = time.perf_counter()
        n = 0
        while n < args.steps and time.perf_counter() - t0 < args.time_limit:
            loss = one()
            n += 1
            if dev.type == "cuda" and n % 5 == 0:
                _sync(dev)
        _sync(dev)
        dt = time.perf_counter() - t0
        res.steps = n
        res.tokens_per_s = tokens * n / dt if n else None
        res.peak_gib = _peak(dev)
        res.loss = float(loss)
        if not math.isfinite(res.loss):
            res.error = f"non-finite loss {res.loss}"
    except torch.OutOfMemoryError:
        res.error = "out of memory (lower --batch)"
    except Exception as e:  # report and go on with the other parts
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        del model
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return res


def mixprec_setup(level: str, recipe: str, dev: torch.device) -> Callable[..., Any]:
    def setup(model: nn.Module) -> Tuple[Callable[[Tensor], Tensor], Callable[[Tensor], None],
                                         Callable[[], None]]:
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        cfg = mixprec.MixedPrecisionConfig(mode="automatic", precision_level=level,
                                           fp8_recipe=recipe, performance_monitoring=False)
        manager = mixprec.MixedPrecisionManager(model, opt, cfg, device=dev)

        def fwd_loss(x: Tensor) -> Tensor:
            with manager.autocast():
                return model(x).float().pow(2).mean()

        def step(loss: Tensor) -> None:
            manager.backward(loss)
            manager.step()

        return fwd_loss, step, lambda: opt.zero_grad(set_to_none=True)

    return setup


def torchao_setup(dev: torch.device) -> Callable[..., Any]:
    def setup(model: nn.Module) -> Tuple[Callable[[Tensor], Tensor], Callable[[Tensor], None],
                                         Callable[[], None]]:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        keep = default_module_filter(model)

        def chosen(m: nn.Module, fqn: str) -> bool:
            return (isinstance(m, nn.Linear) and m.in_features % 16 == 0
                    and m.out_features % 16 == 0 and keep(m, fqn))

        convert_to_float8_training(model, module_filter_fn=chosen,
                                   config=Float8LinearConfig.from_recipe_name("tensorwise"))
        fused = dev.type == "cuda"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                                fused=fused)
        # torchao's forward casts to the *CUDA* autocast dtype: on the CPU (--tiny) its
        # converted linears would see float32 inputs, so the CPU run casts the input
        # itself and stays out of autocast (docs/fp8.md, "CPU autocast")
        use_autocast = dev.type == "cuda"

        def fwd_loss(x: Tensor) -> Tensor:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_autocast):
                return model(x if use_autocast else x.float()).float().pow(2).mean()

        def step(loss: Tensor) -> None:
            loss.backward()
            opt.step()

        return fwd_loss, step, lambda: opt.zero_grad(set_to_none=True)

    return setup


def speed(args: argparse.Namespace) -> int:
    dev = torch.device(args.device)
    why = fp8_unavailable()
    if why is not None:
        print(f"FAILED: the FP8 level cannot run: {why}")
        return 1
    n_params = args.layers * 12 * args.hidden**2
    print(f"speed study on {dev}"
          + (f" ({torch.cuda.get_device_name(dev)}, sm{''.join(map(str, torch.cuda.get_device_capability(dev)))})"  # noqa: E501
             if dev.type == "cuda" else "")
          + f": {args.layers} layers x hidden {args.hidden} ({n_params / 1e9:.2f} B params), "
          f"batch {args.batch} x {args.seq} tokens, {'compiled blocks' if args.compile else 'eager'}, "  # noqa: E501
          f"{args.warmup} warm-up steps, then up to {args.steps} steps or {args.time_limit:g} s")
    parts: List[Tuple[str, Callable[..., Any]]] = [
        ("bf16 + mixprec AdamW", mixprec_setup("bf16", "tensorwise", dev))]
    parts += [(f"fp8 {r} + mixprec AdamW", mixprec_setup("fp8", r, dev)) for r in RECIPES]
    parts.append(("torchao fp8 tensorwise + torch fused AdamW", torchao_setup(dev)))
    results = []
    for name, setup in parts:
        r = speed_part(name, args, dev, setup)
        results.append(r)
        print(f"[progress] {name}: {r.tokens_per_s or 0:.0f} tokens/s, {r.steps} steps"
              + (f", {r.error}" if r.error else ""), file=sys.stderr, flush=True)
    head = f"{'part':<44} {'tokens/s':>12} {'vs bf16':>8} {'peak GiB':>9} {'steps':>6} {'loss':>10}"
    print(head)
    print("-" * len(head))
    base = results[0].tokens_per_s
    bad = []
    for r in results:
        if r.error:
            print(f"{r.name:<44} {'-':>12} {'-':>8} {'-':>9} {r.steps:>6} {'-':>10}  {r.error}")
            bad.append(r.name)
            continue
        rel = f"{r.tokens_per_s / base:.2f}x" if base and r.tokens_per_s else "-"
        peak = f"{r.peak_gib:.1f}" if r.peak_gib is not None else "n/a"
        print(f"{r.name:<44} {r.tokens_per_s or 0:>12.0f} {rel:>8} {peak:>9} {r.steps:>6} "
              f"{r.loss:>10.4g}")
    if bad:
        print("FAILED: " + "; ".join(bad))
        return 1
    print("check passed: every part ran and its loss is finite")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu",
                    help="cpu: the accuracy study (or with --tiny the speed study's code); "
                    "cuda: the speed study")
    ap.add_argument("--tiny", action="store_true",
                    help="the speed study at a tiny size (hidden 64, 2 layers, 3 steps)")
    ap.add_argument("--steps-lm", type=int, default=600, help="accuracy: steps per run")
    ap.add_argument("--adamw-steps", type=int, default=50,
                    help="accuracy: steps of the AdamW equality check")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=60.0,
                    help="seconds of timed steps per part (the warm-up not counted)")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="speed: run the blocks eagerly (default: block.compile() on cuda)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    print("FP8 training study (mixprec precision_level='fp8' on torchao Float8 linears)")
    print(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    try:
        import torchao

        tao = torchao.__version__
    except Exception as e:
        tao = f"missing ({type(e).__name__})"
    print(f"versions: mixprec {mixprec.__version__}, torch {torch.__version__}, torchao {tao}, "
          f"python {platform.python_version()}")
    if args.tiny:
        args.hidden, args.layers, args.heads = 64, 2, 4
        args.batch, args.seq, args.warmup, args.steps = 2, 32, 1, 3
        if args.device == "cpu" and "--no-compile" not in (argv or sys.argv):
            args.compile = False  # inductor on the CPU takes minutes
        return speed(args)
    if args.device == "cpu":
        if args.steps_lm < 10:
            ap.error("--steps-lm must be >= 10")
        return accuracy(args)
    return speed(args)


if __name__ == "__main__":
    sys.exit(main())
