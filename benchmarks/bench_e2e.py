"""Benchmark: end-to-end training steps of a GPT-2-small-like model, per precision recipe.

The model is plain PyTorch (benchmarks/_models.py; nothing is downloaded): token embedding +
learned positions, pre-LN blocks with causal self-attention
(``F.scaled_dot_product_attention``) and a 4x MLP (tanh GELU), final LayerNorm, LM head
tied to the token embedding; GPT-2's initialisation. Defaults are GPT-2 small (12 layers,
d_model 768, 12 heads, vocab 50257, 1024 positions: 124.4M parameters).

Data: one fixed batch of random tokens (seeded), trained on at every step, so the loss
falls (the model memorises it) and "loss after N steps" measures how far each recipe got.

Variants (one training step = zero_grad, forward, cross-entropy on float32 logits,
backward, optimizer step, scaler update where there is a scaler; AdamW lr ``--lr``,
betas (0.9, 0.95), weight decay 0.1, no gradient clipping):

==========  ====================================================================
fp32        strict FP32: fp32 params, no autocast, TF32 off; torch AdamW
amp-torch   fp32 params, ``torch.autocast`` fp16, ``torch.amp.GradScaler``, torch AdamW
amp-mps     the same with ``mixprec.GradScaler``
amp-mpopt   fp32 params, autocast fp16, ``mixprec.GradScaler``, ``mixprec.optim.AdamW``
fp16-m      fp16 params (the whole model), FP32 masters in ``mixprec.optim.AdamW``,
            ``mixprec.GradScaler`` (fp16 grads, unscaled inside the optimizer kernel)
bf16-m      bf16 params (the whole model), FP32 masters in ``mixprec.optim.AdamW``,
            no loss scaling
bf16-sr     bf16 params without masters, ``mixprec.optim.AdamW(master_weights=False,
            stochastic_rounding=True)``, no loss scaling
fp16-m8     fp16-m with 8-bit moments (``state_bits=8``: every tensor of at least 4,096
            elements)
bf16-m8     bf16-m with 8-bit moments
bf16-sr8    bf16-sr with 8-bit moments
==========  ====================================================================

"torch AdamW" is ``torch.optim.AdamW(fused=True)`` where torch supports it on the device,
else ``foreach=True`` (the header says which).

Reported per variant: the median step time over ``--steps`` steps after ``--warmup``
steps (CUDA events around each step; on CPU ``time.perf_counter``), as the median over
``--repeats`` independent runs (a fresh model from the same seed each time, variants
interleaved within each repeat) with the min-max of the per-run medians as the spread;
tokens/s; the ratio to ``amp-torch``; peak memory (CUDA: ``torch.cuda.max_memory_allocated``
over the whole run, model and optimizer state included; CPU: n/a); the optimizer state
(every tensor of ``optimizer.state``, on every device: masters, moments or codes and block
maxima, step counts), in MiB and bytes per parameter; host syncs per step
(CUDA: the synchronisations ``torch.cuda.set_sync_debug_mode("warn")`` reports during the
last warm-up step; CPU: n/a); the loss after ``warmup + steps`` steps (median over repeats);
and, for the loss-scaled variants, the steps skipped for overflow.

Checks (untimed, printed, non-zero exit status on failure): every loss is finite; every
parameter tensor of the first run changed from its initial value; every variant lowered
the loss by at least half as much as fp32; and every variant's final loss is within
``16 x max(|L_amp-torch - L_fp32|, fp32 run-to-run range, 1e-3 x L0_fp32)`` of fp32's
(L0: the loss at the first step, about ln(vocab)). The factor: bf16's unit roundoff (2^-8)
is 8x fp16's (2^-11), so a recipe that computes in bf16 may be expected to drift up to ~8x
as far from FP32 as fp16 autocast does, and another 2x is allowed for recipes that also
round the stored weights to 16 bits every step. The floor (about 2x fp16's unit roundoff
of the initial loss) keeps the tolerance from collapsing when fp16 autocast happens to
land on fp32's loss.

The two GPU operating points::

    PYTHONPATH=python python benchmarks/bench_e2e.py --preset large   # 8 x 1024
    PYTHONPATH=python python benchmarks/bench_e2e.py --preset small   # 1 x 128

A tiny CPU run::

    python benchmarks/bench_e2e.py --device cpu --layers 1 --d-model 64 --heads 4 \\
        --vocab 256 --batch 2 --seq 16 --warmup 2 --steps 4 --repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import math
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import mixprec
import mixprec.optim
from _common import count_cuda_syncs
from _models import GPT, ModelConfig

NA = "n/a"
# Loss-agreement check (see the module docstring for the derivation of the factor).
LOSS_TOL_FACTOR = 16.0
LOSS_REL_FLOOR = 1e-3
# A variant must lower the loss by at least this fraction of fp32's decrease.
MIN_PROGRESS = 0.5
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
PRESETS = {"large": (8, 1024), "small": (1, 128)}


# ---------------------------------------------------------------------------------------------
# The model


# ---------------------------------------------------------------------------------------------
# Variants


@dataclass(frozen=True)
class Variant:
    """One training recipe."""

    key: str
    label: str
    param_dtype: torch.dtype
    autocast: bool  # torch.autocast fp16 around forward + loss
    scaler: Optional[str]  # "torch", "mixprec" or None
    optimizer: str  # "torch" or "mixprec"
    master_weights: bool = True
    stochastic_rounding: bool = False
    state_bits: int = 32


VARIANTS: Tuple[Variant, ...] = (
    Variant("fp32", "fp32 strict, torch AdamW", torch.float32, False, None, "torch"),
    Variant("amp-torch", "amp16 + torch scaler + torch AdamW", torch.float32, True, "torch",
            "torch"),
    Variant("amp-mps", "amp16 + mixprec scaler + torch AdamW", torch.float32, True,
            "mixprec", "torch"),
    Variant("amp-mpopt", "amp16 + mixprec scaler + mixprec AdamW", torch.float32, True,
            "mixprec", "mixprec"),
    Variant("fp16-m", "fp16 params + fp32 masters", torch.float16, False, "mixprec",
            "mixprec"),
    Variant("bf16-m", "bf16 params + fp32 masters", torch.bfloat16, False, None, "mixprec"),
    Variant("bf16-sr", "bf16 params, no masters, SR", torch.bfloat16, False, None, "mixprec",
            master_weights=False, stochastic_rounding=True),
    Variant("fp16-m8", "fp16 params + fp32 masters, 8-bit moments", torch.float16, False,
            "mixprec", "mixprec", state_bits=8),
    Variant("bf16-m8", "bf16 params + fp32 masters, 8-bit moments", torch.bfloat16, False,
            None, "mixprec", state_bits=8),
    Variant("bf16-sr8", "bf16 params, no masters, SR, 8-bit moments", torch.bfloat16, False,
            None, "mixprec", master_weights=False, stochastic_rounding=True, state_bits=8),
)
REFERENCE, AMP_REFERENCE = "fp32", "amp-torch"


@dataclass
class Run:
    """One variant's model, optimizer and step function."""

    model: GPT
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    step: Callable[[], torch.Tensor]


def torch_adamw_kwargs(device: torch.device) -> Tuple[Dict[str, bool], str]:
    """``fused=True`` when torch's fused AdamW runs on ``device``, else ``foreach=True``."""
    p = nn.Parameter(torch.zeros(4, device=device))
    p.grad = torch.ones(4, device=device)
    try:
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        return {"fused": True}, "torch AdamW(fused=True)"
    except (RuntimeError, ValueError) as exc:
        return {"foreach": True}, (f"torch AdamW(foreach=True): fused=True is not supported on "
                                   f"{device.type} ({type(exc).__name__}: {exc})")


def fp16_autocast_unavailable(device: torch.device) -> Optional[str]:
    """Why fp16 autocast cannot run on ``device``, or None."""
    try:
        with torch.autocast(device.type, dtype=torch.float16):
            y = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        if y.dtype != torch.float16:
            return f"n/a (torch.autocast fp16 does not cast matmuls on {device.type})"
    except RuntimeError as exc:
        return f"n/a (torch.autocast fp16 on {device.type}: {exc})"
    return None


def build_run(variant: Variant, init_model: GPT, data: Tuple[torch.Tensor, torch.Tensor],
              device: torch.device, lr: float, torch_kwargs: Dict[str, bool]) -> Run:
    """A fresh copy of ``init_model`` on ``device`` in the variant's dtype, its optimizer,
    scaler and one-step function."""
    model = copy.deepcopy(init_model).to(device=device, dtype=variant.param_dtype)
    params = list(model.parameters())
    opt: torch.optim.Optimizer
    if variant.optimizer == "torch":
        opt = torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY,
                                **torch_kwargs)
    else:
        opt = mixprec.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY,
                                  master_weights=variant.master_weights,
                                  stochastic_rounding=variant.stochastic_rounding,
                                  state_bits=variant.state_bits)
    scaler: Optional[torch.amp.GradScaler] = None
    if variant.scaler == "torch":
        scaler = torch.amp.GradScaler(device.type)
    elif variant.scaler == "mixprec":
        scaler = mixprec.GradScaler(device.type)
    x, y = data
    vocab = model.cfg.vocab

    def autocast() -> ContextManager[object]:
        if variant.autocast:
            return torch.autocast(device.type, dtype=torch.float16)
        return contextlib.nullcontext()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()

    return Run(model, opt, scaler, step)


# ---------------------------------------------------------------------------------------------
# Measuring




@dataclass
class Measurement:
    """What one run of one variant produced."""

    step_s: float  # median seconds per timed step
    peak_bytes: Optional[int]
    syncs: Optional[int]
    first_loss: float
    final_loss: float
    skipped: Optional[int]
    changed: Optional[Tuple[int, int]] = None  # (param tensors changed, total), first run only
    state_bytes: int = 0  # every tensor of optimizer.state


def skipped_steps(scaler: Optional[torch.amp.GradScaler], total_steps: int) -> Optional[int]:
    """Overflow-skipped steps of a run, from the final scale (reads it: call untimed).

    Both scalers start at 2^16 and halve the scale on every skipped step; with fewer
    steps than the growth interval (2000) the scale never grows, so the count is exact.
    """
    if scaler is None or total_steps >= 2000:
        return None
    return round(math.log2(65536.0 / scaler.get_scale()))


def changed_params(model: GPT, init_model: GPT, dtype: torch.dtype) -> Tuple[int, int]:
    """(number of parameter tensors that differ from their initial values, total)."""
    changed = 0
    pairs = list(zip(model.parameters(), init_model.parameters()))
    for p, p0 in pairs:
        now = p.detach().cpu().float()
        before = p0.detach().to(dtype).float()
        changed += int(not torch.equal(now, before))
    return changed, len(pairs)


def measure(run: Run, device: torch.device, warmup: int, steps: int,
            check_params: bool, init_model: GPT, dtype: torch.dtype) -> Measurement:
    """Run warmup + steps steps of ``run``; time the last ``steps``."""
    cuda = device.type == "cuda"
    first: Optional[torch.Tensor] = None
    syncs: Optional[int] = None
    for i in range(warmup):
        if cuda and i == warmup - 1:
            with count_cuda_syncs(device) as box:
                loss = run.step()
            syncs = box[0]
        else:
            loss = run.step()
        if first is None:
            first = loss
    times: List[float] = []
    if cuda:
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        for i in range(steps):
            starts[i].record()
            loss = run.step()
            ends[i].record()
            if first is None:
                first = loss
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = run.step()
            times.append(time.perf_counter() - t0)
            if first is None:
                first = loss
    assert first is not None
    # Untimed from here on.
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    m = Measurement(step_s=statistics.median(times), peak_bytes=peak, syncs=syncs,
                    first_loss=float(first.item()), final_loss=float(loss.item()),
                    skipped=skipped_steps(run.scaler, warmup + steps))
    if check_params:
        m.changed = changed_params(run.model, init_model, dtype)
    m.state_bytes = sum(t.numel() * t.element_size() for st in run.optimizer.state.values()
                        for t in st.values() if isinstance(t, torch.Tensor))
    return m


# ---------------------------------------------------------------------------------------------
# Reporting


@dataclass
class Row:
    """A table row: a variant and its runs (or why none)."""

    variant: Variant
    na: Optional[str] = None
    runs: List[Measurement] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.variant.key

    def median_s(self) -> float:
        return statistics.median(r.step_s for r in self.runs)

    def final_loss(self) -> float:
        return statistics.median(r.final_loss for r in self.runs)

    def first_loss(self) -> float:
        return statistics.median(r.first_loss for r in self.runs)


def fmt_table(rows: Sequence[Row], tokens: int, amp_s: Optional[float],
              n_params: int) -> List[str]:
    head = (f"{'variant':<16} {'ms/step':>9} {'spread ms':>15} {'tok/s':>10} "
            f"{'vs amp-torch':>12} {'peak MiB':>9} {'state MiB':>9} {'B/param':>7} "
            f"{'syncs/step':>10} {'loss@N':>8} {'skipped':>7}")
    lines = [head, "-" * len(head)]
    for row in rows:
        if row.na is not None or not row.runs:
            lines.append(f"{row.name:<16} {row.na or NA}")
            continue
        med = row.median_s()
        lo = min(r.step_s for r in row.runs)
        hi = max(r.step_s for r in row.runs)
        spread = f"{lo * 1e3:.2f}-{hi * 1e3:.2f}"
        ratio = f"{med / amp_s:.2f}x" if amp_s else NA
        peaks = [r.peak_bytes for r in row.runs if r.peak_bytes is not None]
        peak = f"{max(peaks) / 2**20:.0f}" if peaks else NA
        syncs = [r.syncs for r in row.runs if r.syncs is not None]
        sync_s = f"{max(syncs)}" if syncs else NA
        skips = [r.skipped for r in row.runs if r.skipped is not None]
        skip_s = f"{max(skips)}" if skips else "-"
        state = row.runs[0].state_bytes
        lines.append(f"{row.name:<16} {med * 1e3:>9.2f} {spread:>15} {tokens / med:>10.0f} "
                     f"{ratio:>12} {peak:>9} {state / 2**20:>9.1f} {state / n_params:>7.2f} "
                     f"{sync_s:>10} {row.final_loss():>8.4f} {skip_s:>7}")
    return lines


def run_checks(rows: Sequence[Row]) -> Tuple[List[str], int]:
    """The untimed correctness checks; returns (printed lines, number of failures)."""
    lines: List[str] = []
    failures = 0

    def verdict(ok: bool) -> str:
        nonlocal failures
        failures += 0 if ok else 1
        return "ok" if ok else "FAIL"

    measured = [r for r in rows if r.runs]
    by_key = {r.variant.key: r for r in measured}
    for r in measured:
        losses = [x for m in r.runs for x in (m.first_loss, m.final_loss)]
        finite = all(math.isfinite(x) for x in losses)
        changed = r.runs[0].changed
        ch_ok = changed is not None and changed[0] == changed[1]
        ch_s = f"{changed[0]}/{changed[1]}" if changed else NA
        lines.append(f"  {r.name:<16} losses finite: {verdict(finite):<4}  param tensors "
                     f"changed {ch_s}: {verdict(ch_ok)}")
    ref = by_key.get(REFERENCE)
    if ref is None:
        lines.append(f"  (no {REFERENCE} row: loss progress and agreement not checked)")
        return lines, failures
    l_ref, l0_ref = ref.final_loss(), ref.first_loss()
    ref_drop = l0_ref - l_ref
    lines.append(f"  {REFERENCE} loss {l0_ref:.4f} -> {l_ref:.4f} (drop {ref_drop:.4f}): "
                 f"{verdict(ref_drop > 0)}")
    ref_range = max(m.final_loss for m in ref.runs) - min(m.final_loss for m in ref.runs)
    amp = by_key.get(AMP_REFERENCE)
    d_amp = abs(amp.final_loss() - l_ref) if amp is not None else 0.0
    floor = LOSS_REL_FLOOR * abs(l0_ref)
    tol = LOSS_TOL_FACTOR * max(d_amp, ref_range, floor)
    lines.append(f"  loss tolerance = {LOSS_TOL_FACTOR:g} x max(|L_{AMP_REFERENCE} - "
                 f"L_{REFERENCE}| {d_amp:.4g}, {REFERENCE} run-to-run range {ref_range:.4g}, "
                 f"{LOSS_REL_FLOOR:g} x L0_{REFERENCE} {floor:.4g}) = {tol:.4g}")
    for r in measured:
        if r is ref:
            continue
        drop = r.first_loss() - r.final_loss()
        prog_ok = ref_drop > 0 and drop >= MIN_PROGRESS * ref_drop
        diff = abs(r.final_loss() - l_ref)
        lines.append(f"  {r.name:<16} drop {drop:.4f} >= {MIN_PROGRESS:g} x {ref_drop:.4f}: "
                     f"{verdict(prog_ok):<4}  |L - L_{REFERENCE}| {diff:.4g} <= {tol:.4g}: "
                     f"{verdict(diff <= tol)}")
    return lines, failures


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="operating point: large = batch 8 x seq 1024, small = 1 x 128 "
                         "(--batch/--seq override it)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=1024,
                    help="positions in the embedding table (raised to --seq if smaller)")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="independent runs per variant")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(v.key for v in VARIANTS),
                    help="comma-separated subset of: " + ", ".join(v.key for v in VARIANTS))
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    args = ap.parse_args(argv)
    batch, seq = PRESETS[args.preset] if args.preset else PRESETS["large"]
    args.batch = args.batch if args.batch is not None else batch
    args.seq = args.seq if args.seq is not None else seq
    known = {v.key for v in VARIANTS}
    args.variant_keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    unknown = [k for k in args.variant_keys if k not in known]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {sorted(known)}")
    for name in ("layers", "d_model", "heads", "vocab", "batch", "seq", "steps", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.d_model % args.heads:
        ap.error("--d-model must be a multiple of --heads")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device visible (use --device cpu)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; returns 0 when every check passed, 1 otherwise."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # strict FP32 for the fp32 parts of every variant: no TF32 matmuls
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = ModelConfig(args.layers, args.d_model, args.heads, args.vocab, max(args.ctx, args.seq))
    torch.manual_seed(args.seed)
    init_model = GPT(cfg)
    n_params = sum(p.numel() for p in init_model.parameters())
    gen = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, cfg.vocab, (args.batch, args.seq + 1), generator=gen)
    data = (tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device))
    torch_kwargs, torch_opt = torch_adamw_kwargs(device)
    amp_na = fp16_autocast_unavailable(device)

    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
    else:
        dev = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    cmd = " ".join(shlex.quote(a) for a in [sys.argv[0]] + list(
        sys.argv[1:] if argv is None else argv))
    print(f"# bench_e2e | {datetime.datetime.now().isoformat(timespec='seconds')} | "
          f"device {device.type}: {dev} | torch {torch.__version__} | mixprec "
          f"{mixprec.__version__} (CUDA kernels: {mixprec.has_cuda_kernels()})")
    print(f"# command: {cmd}")
    print(f"# model: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, vocab "
          f"{cfg.vocab}, {cfg.ctx} positions, {n_params / 1e6:.2f}M params | batch "
          f"{args.batch} x seq {args.seq} = {args.batch * args.seq} tokens/step")
    print(f"# {args.warmup} warm-up + {args.steps} timed steps per run, {args.repeats} "
          f"run(s) per variant | AdamW lr {args.lr:g}, betas {BETAS}, wd {WEIGHT_DECAY} | "
          f"TF32 off | torch optimizer: {torch_opt}")

    rows: List[Row] = []
    for v in VARIANTS:
        if v.key not in args.variant_keys:
            continue
        row = Row(v)
        if v.autocast:
            row.na = amp_na
        rows.append(row)

    for rep in range(args.repeats):
        for row in rows:
            if row.na is not None:
                continue
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            run = build_run(row.variant, init_model, data, device, args.lr, torch_kwargs)
            row.runs.append(measure(run, device, args.warmup, args.steps, rep == 0,
                                    init_model, row.variant.param_dtype))
            del run

    amp = next((r for r in rows if r.variant.key == AMP_REFERENCE and r.runs), None)
    print()
    for line in fmt_table(rows, args.batch * args.seq, amp.median_s() if amp else None,
                          n_params):
        print(line)
    print(f"ms/step: median over runs of each run's median step; spread: min-max of the run "
          f"medians; loss@N: loss at step {args.warmup + args.steps} (median over runs); "
          f"skipped: overflow-skipped steps (scaler variants); state MiB, B/param: every "
          f"tensor of optimizer.state")
    if device.type != "cuda":
        print("peak MiB and syncs/step: n/a on CPU (CUDA allocator and sync debug mode only)")
    print("variants:")
    for v in VARIANTS:
        if v.key in args.variant_keys:
            print(f"  {v.key:<10} {v.label}")

    print("\nchecks (untimed):")
    lines, failures = run_checks(rows)
    for line in lines:
        print(line)
    if failures:
        print(f"{failures} check(s) FAILED")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
