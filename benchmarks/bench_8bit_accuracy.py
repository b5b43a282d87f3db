"""Accuracy study: 8-bit AdamW moments (mixprec, torchao, bitsandbytes) and split masters vs 32-bit.

Trains two small tasks on CPU with each optimizer, for seeds 0, 1 and 2, and
compares the final losses:

* ``digits``: scikit-learn's ``load_digits`` (8x8 images, 10 classes, bundled
  with scikit-learn, no download), standardized with the train split's
  statistics, an 80/20 split by a fixed permutation (the same for every seed).
  Model: Linear(64,256)-ReLU-Linear(256,256)-ReLU-Linear(256,10), float32,
  batch 64. Reported: final train loss (mean of the last 50 steps) and test
  accuracy.
* ``tiny LM``: a character-level GPT (embedding 64, 2 pre-LayerNorm blocks of
  4-head causal self-attention through ``F.scaled_dot_product_attention`` and a
  4x MLP, context 32, learned positions, final LayerNorm), float32, batch 16, on
  a corpus the script generates deterministically from a small English grammar
  (no download). The last 10 % of the corpus is held out. Reported: final train
  loss (mean of the last 50 steps), held-out loss and held-out next-character
  accuracy (every non-overlapping context-32 window of the held-out slice).

Optimizers, all with the same lr and weight_decay=0.01, the same initial
weights and the same batch order for a given seed:
``mixprec AdamW 32-bit`` (``state_bits=32``), ``mixprec AdamW8bit``
(``min_8bit_size=4096``), ``torchao AdamW8bit`` (``torchao.optim.AdamW8bit``,
its default ``torch.compile``-d step; ``--torchao-eager``, implied by
``--quick``, runs it eagerly instead: TORCHDYNAMO_DISABLE=1 during its steps only)
and ``bitsandbytes AdamW8bit``
(``bitsandbytes.optim.AdamW8bit``, default ``min_8bit_size=4096``). A library
that fails to import is skipped with the reason printed.

Master forms (``--settings masters``, or ``all``): the same tasks with bfloat16 params
(the inputs cast to bfloat16, the loss in float32) and mixprec AdamW keeping float32
masters (``bf16 masters f32``, the reference of these rows), a 16-bit or an 8-bit
correction (``master_correction_bits``), each with 32-bit and with 8-bit moments, and
bfloat16 without masters (rounded to nearest) for contrast. Their verdicts are against
the ``bf16 masters f32`` runs' spread (and the float32 rows' against the 32-bit one).

Output: per task, a table of every run (final loss, eval metrics, seconds of
the training loop), then mean +- std (sample std over the seeds) per optimizer
and a verdict per optimizer: whether its mean final loss lies within the 32-bit
mixprec runs' seed-to-seed spread (their min..max over the seeds, widened to at
least mean +- 1 std). Lower than the spread is reported as "below (better)".

Check (untimed): every run must have trained, its final loss below 0.7 times
its first step's loss; otherwise the script reports it and exits with status 1.

Defaults: 1,500 digits steps and 2,000 LM steps, one torch thread (steadier
than two on a loaded 2-core machine): about 6 to 10 minutes on such a machine.

Usage:
    PYTHONPATH=python python benchmarks/bench_8bit_accuracy.py [--quick]
        [--steps-digits N] [--steps-lm N] [--threads N] [--torchao-eager]
        [--settings 8bit|masters|all]

``--quick`` is a smoke run of about 20 seconds (40 steps per task, final loss
over the last 20, torchao eager; no convergence claims). A progress line per
run goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import mixprec
import mixprec.optim
from _common import eager_step
from _models import tiny_gpt

SEEDS = (0, 1, 2)
WEIGHT_DECAY = 0.01
MIN_8BIT_SIZE = 4096
LR_DIGITS = 1e-3
LR_LM = 3e-3
LAST_N = 50  # final loss: mean of the last LAST_N step losses
TRAINED_RATIO = 0.7
REF_NAME = "mixprec AdamW 32-bit"
BF16_REF = "bf16 masters f32"
#: the master-form rows: name -> mixprec AdamW keyword arguments (bfloat16 params)
MASTER_ROWS: Dict[str, Dict[str, object]] = {
    BF16_REF: {},
    "bf16 masters 16-bit": {"master_correction_bits": 16},
    "bf16 masters 8-bit": {"master_correction_bits": 8},
    "bf16 8bit, masters f32": {"state_bits": 8},
    "bf16 8bit, masters 16": {"state_bits": 8, "master_correction_bits": 16},
    "bf16 8bit, masters 8": {"state_bits": 8, "master_correction_bits": 8},
    "bf16 without masters": {"master_weights": False},
}

OptFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]


# ----------------------------------------------------------------------------- optimizers


def master_factories() -> Dict[str, OptFactory]:
    """The master-form rows' factories (their params are bfloat16: :data:`MASTER_ROWS`)."""
    def make(kw: Dict[str, object]) -> OptFactory:
        def factory(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
            return mixprec.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY,
                                       min_8bit_size=MIN_8BIT_SIZE, **kw)  # type: ignore
        return factory

    return {name: make(kw) for name, kw in MASTER_ROWS.items()}


def param_dtype(name: str) -> torch.dtype:
    """The params' dtype of the run of optimizer row ``name``."""
    return torch.bfloat16 if name in MASTER_ROWS else torch.float32


def optimizer_factories(
        torchao_eager: bool = False) -> Tuple[Dict[str, OptFactory], Dict[str, str],
                                               Dict[str, str]]:
    """(name -> factory, name -> skip reason, library -> version)."""
    facs: Dict[str, OptFactory] = {}
    skipped: Dict[str, str] = {}
    versions: Dict[str, str] = {"torch": torch.__version__,
                                "mixprec": getattr(mixprec, "__version__", "?")}

    def mp32(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return mixprec.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY, state_bits=32)

    def mp8(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return mixprec.optim.AdamW8bit(params, lr=lr, weight_decay=WEIGHT_DECAY,
                                       min_8bit_size=MIN_8BIT_SIZE)

    facs[REF_NAME] = mp32
    facs["mixprec AdamW8bit"] = mp8

    try:
        import torchao
        import torchao.optim as ao_optim

        versions["torchao"] = torchao.__version__

        def ao8(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
            opt = ao_optim.AdamW8bit(params, lr=lr, weight_decay=WEIGHT_DECAY)
            return eager_step(opt) if torchao_eager else opt

        facs["torchao AdamW8bit"] = ao8
    except Exception as e:  # noqa: BLE001 - any import failure means: skip
        skipped["torchao AdamW8bit"] = f"import failed: {type(e).__name__}: {e}"
        versions["torchao"] = "not available"

    try:
        import bitsandbytes as bnb

        versions["bitsandbytes"] = bnb.__version__

        def bnb8(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
            return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=WEIGHT_DECAY,
                                       min_8bit_size=MIN_8BIT_SIZE)

        facs["bitsandbytes AdamW8bit"] = bnb8
    except Exception as e:  # noqa: BLE001 - any import failure means: skip
        skipped["bitsandbytes AdamW8bit"] = f"import failed: {type(e).__name__}: {e}"
        versions["bitsandbytes"] = "not available"
    return facs, skipped, versions


# ----------------------------------------------------------------------------- results


@dataclass
class RunResult:
    first_loss: float
    final_loss: float
    metrics: Dict[str, float]
    seconds: float


@dataclass
class Task:
    name: str
    lr: float
    steps: int
    metric_names: List[str]
    # (seed, optimizer factory, lr, steps, param dtype) -> result
    run: Callable[[int, OptFactory, float, int, torch.dtype], RunResult]
    results: Dict[str, Dict[int, RunResult]] = field(default_factory=dict)


def last_n(steps: int) -> int:
    """How many final steps the final loss averages: LAST_N, at most half the run."""
    return min(LAST_N, steps // 2)


def train_loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int,
               loss_of_step: Callable[[int], Tensor]) -> Tuple[List[float], float]:
    """Runs ``steps`` optimizer steps; (per-step losses, seconds)."""
    losses = torch.empty(steps)
    model.train()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = loss_of_step(i)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[i] = loss.detach()
    return losses.tolist(), time.perf_counter() - t0


def summarize(losses: List[float], seconds: float, metrics: Dict[str, float]) -> RunResult:
    tail = losses[-last_n(len(losses)):]
    return RunResult(first_loss=losses[0], final_loss=sum(tail) / len(tail), metrics=metrics,
                     seconds=seconds)


# ----------------------------------------------------------------------------- task: digits


class DigitsData:
    def __init__(self) -> None:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32)
        y = torch.tensor(d.target, dtype=torch.long)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
        n_train = int(0.8 * len(x))
        tr, te = perm[:n_train], perm[n_train:]
        mean, std = x[tr].mean(0), x[tr].std(0).clamp_min(1e-3)
        self.x_train, self.y_train = (x[tr] - mean) / std, y[tr]
        self.x_test, self.y_test = (x[te] - mean) / std, y[te]


def digits_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def batch_indices(n: int, batch: int, steps: int, seed: int) -> Tensor:
    """(steps, batch) indices: epochs of a seeded permutation, the last partial batch dropped."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    per_epoch = n // batch
    epochs = math.ceil(steps / per_epoch)
    rows = [torch.randperm(n, generator=gen)[: per_epoch * batch].view(per_epoch, batch)
            for _ in range(epochs)]
    return torch.cat(rows)[:steps]


def make_digits_run(data: DigitsData
                    ) -> Callable[[int, OptFactory, float, int, torch.dtype], RunResult]:
    init: Dict[int, Dict[str, Tensor]] = {}

    def run(seed: int, factory: OptFactory, lr: float, steps: int,
            dtype: torch.dtype = torch.float32) -> RunResult:
        if seed not in init:
            torch.manual_seed(seed)
            init[seed] = {k: v.clone() for k, v in digits_model().state_dict().items()}
        model = digits_model()
        model.load_state_dict(init[seed])
        model.to(dtype)
        opt = factory(model.parameters(), lr)
        idx = batch_indices(len(data.x_train), 64, steps, seed)
        x_train, x_test = data.x_train.to(dtype), data.x_test.to(dtype)

        def loss_of_step(i: int) -> Tensor:
            b = idx[i]
            return F.cross_entropy(model(x_train[b]).float(), data.y_train[b])

        losses, secs = train_loop(model, opt, steps, loss_of_step)
        model.eval()
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == data.y_test).float().mean().item()
        return summarize(losses, secs, {"test acc": acc})

    return run


# ----------------------------------------------------------------------------- task: tiny LM

_SUBJECTS = ["the old miller", "a young fox", "the quiet river", "my neighbour", "the clockmaker",
             "a tired traveller", "the red kite", "our teacher", "the small boat", "a grey wolf",
             "the baker's daughter", "an honest sailor"]
_VERBS = ["watched", "crossed", "followed", "remembered", "painted", "carried", "found",
          "counted", "mended", "visited", "forgot", "described"]
_OBJECTS = ["the stone bridge", "seven green apples", "a letter from the north", "the long road",
            "the broken wheel", "a map of the valley", "the winter stars", "the empty market",
            "an old wooden chair", "the bells of the town"]
_ADVERBS = ["slowly", "at dawn", "without a word", "twice", "before the rain", "with great care",
            "after supper", "in silence", "every morning"]
_JOINS = ["and then", "because", "while", "although", "so", "until"]
_PARAGRAPH = ("In the valley there was a mill by the water, and every morning the wheel "
              "turned as it always had. People came from the hills with grain, and they "
              "talked about the weather, the prices at the market and the news from the "
              "town. Nobody hurried, and nobody was ever quite on time.")


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(_ADVERBS)}"
    if rng.random() < 0.3:
        s += (f", {rng.choice(_JOINS)} {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} "
              f"{rng.choice(_OBJECTS)}")
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!", "?"])


def make_corpus(n_chars: int = 60_000) -> str:
    """Deterministic text: grammar-generated paragraphs with a fixed paragraph between."""
    rng = random.Random(20240)
    parts: List[str] = []
    total = 0
    while total < n_chars:
        para = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7)))
        if rng.random() < 0.25:
            para += "\n" + _PARAGRAPH
        parts.append(para)
        total += len(para) + 2
    return "\n\n".join(parts)[:n_chars]


class LMData:
    CTX = 32
    BATCH = 16

    def __init__(self) -> None:
        text = make_corpus()
        self.chars = sorted(set(text))
        stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
        n_train = int(0.9 * len(ids))
        self.train, self.held = ids[:n_train], ids[n_train:]
        self.n_chars = len(text)
        # held-out: every non-overlapping window (inputs, targets)
        n_win = (len(self.held) - 1) // self.CTX
        starts = torch.arange(n_win) * self.CTX
        self.held_x = torch.stack([self.held[s:s + self.CTX] for s in starts.tolist()])
        self.held_y = torch.stack([self.held[s + 1:s + 1 + self.CTX] for s in starts.tolist()])

    def batch_starts(self, steps: int, seed: int) -> Tensor:
        gen = torch.Generator().manual_seed(20_000 + seed)
        return torch.randint(0, len(self.train) - self.CTX - 1, (steps, self.BATCH),
                             generator=gen)


def make_lm_run(data: LMData
                ) -> Callable[[int, OptFactory, float, int, torch.dtype], RunResult]:
    init: Dict[int, Dict[str, Tensor]] = {}
    offs = torch.arange(LMData.CTX)
    vocab = len(data.chars)

    def run(seed: int, factory: OptFactory, lr: float, steps: int,
            dtype: torch.dtype = torch.float32) -> RunResult:
        if seed not in init:
            torch.manual_seed(seed)
            init[seed] = {k: v.clone() for k, v in tiny_gpt(vocab).state_dict().items()}
        model = tiny_gpt(vocab)
        model.load_state_dict(init[seed])
        model.to(dtype)
        opt = factory(model.parameters(), lr)
        starts = data.batch_starts(steps, seed)

        def loss_of_step(i: int) -> Tensor:
            pos = starts[i].unsqueeze(1) + offs
            x, y = data.train[pos], data.train[pos + 1]
            return F.cross_entropy(model(x).float().view(-1, vocab), y.view(-1))

        losses, secs = train_loop(model, opt, steps, loss_of_step)
        model.eval()
        with torch.no_grad():
            logits = model(data.held_x).float()
            held_loss = F.cross_entropy(logits.view(-1, vocab), data.held_y.view(-1)).item()
            held_acc = (logits.argmax(-1) == data.held_y).float().mean().item()
        return summarize(losses, secs, {"held loss": held_loss, "held acc": held_acc})

    return run


# ----------------------------------------------------------------------------- report


def mean_std(xs: List[float]) -> Tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def ref_band(xs: List[float]) -> Tuple[float, float]:
    """The reference runs' spread: min..max, widened to at least mean +- 1 std."""
    m, s = mean_std(xs)
    return min(min(xs), m - s), max(max(xs), m + s)


def print_task(task: Task) -> List[str]:
    """Prints the task's tables and verdicts; returns the names of runs that did not train."""
    mcols = task.metric_names
    head = (f"{'optimizer':<24} {'seed':>4} {'first loss':>10} {'final loss':>10} "
            + " ".join(f"{m:>10}" for m in mcols) + f" {'s/run':>7}")
    print(f"\n=== task: {task.name}  (lr {task.lr:g}, weight_decay {WEIGHT_DECAY}, "
          f"{task.steps} steps; final loss = mean of the last {last_n(task.steps)} steps) ===")
    print(head)
    print("-" * len(head))
    failed: List[str] = []
    for name, per_seed in task.results.items():
        for seed, r in per_seed.items():
            ok = r.final_loss < TRAINED_RATIO * r.first_loss
            mark = "" if ok else "  !! did not train"
            if not ok:
                failed.append(f"{task.name} / {name} / seed {seed}")
            print(f"{name:<24} {seed:>4} {r.first_loss:>10.4f} {r.final_loss:>10.4f} "
                  + " ".join(f"{r.metrics[m]:>10.4f}" for m in mcols)
                  + f" {r.seconds:>7.1f}{mark}")
    print()
    head2 = (f"{'optimizer':<24} {'final loss (mean+-std)':>24} "
             + " ".join(f"{m + ' (mean+-std)':>24}" for m in mcols) + f" {'s/run':>7}")
    print(head2)
    print("-" * len(head2))
    for name, per_seed in task.results.items():
        rs = list(per_seed.values())
        fm, fs = mean_std([r.final_loss for r in rs])
        cells = []
        for m in mcols:
            mm, ms = mean_std([r.metrics[m] for r in rs])
            cells.append(f"{mm:>12.4f} +- {ms:<8.4f}")
        secs = statistics.fmean(r.seconds for r in rs)
        print(f"{name:<24} {fm:>12.5f} +- {fs:<8.5f} " + " ".join(cells) + f" {secs:>7.1f}")
    for ref_name, rows in ((REF_NAME, lambda n: n not in MASTER_ROWS),
                           (BF16_REF, lambda n: n in MASTER_ROWS)):
        print_verdict(task, ref_name, rows)
    return failed


def print_verdict(task: Task, ref_name: str, rows: Callable[[str], bool]) -> None:
    """Each row of ``rows`` (a name filter) against the spread of ``ref_name``'s runs."""
    ref = task.results.get(ref_name)
    if ref:
        lo, hi = ref_band([r.final_loss for r in ref.values()])
        what = "32-bit" if ref_name == REF_NAME else f"'{ref_name}'"
        print(f"\nverdict ({task.name}): {what} spread of final loss = [{lo:.5f}, {hi:.5f}]")
        for name, per_seed in task.results.items():
            if name == ref_name or not rows(name):
                continue
            fm, _ = mean_std([r.final_loss for r in per_seed.values()])
            if lo <= fm <= hi:
                where = f"WITHIN the {what} spread"
            elif fm < lo:
                where = f"BELOW the {what} spread (better)"
            else:
                where = f"ABOVE the {what} spread (worse)"
            print(f"  {name:<24} mean final loss {fm:.5f}: {where}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 40 steps per task, torchao eager (a few seconds)")
    ap.add_argument("--steps-digits", type=int, default=None,
                    help="steps of the digits task (default 1500, --quick 40)")
    ap.add_argument("--steps-lm", type=int, default=None,
                    help="steps of the tiny-LM task (default 2000, --quick 40)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--torchao-eager", action="store_true",
                    help="run torchao's step without torch.compile (implied by --quick)")
    ap.add_argument("--settings", choices=["8bit", "masters", "all"], default="all",
                    help="8bit: the 8-bit libraries' rows; masters: the 32-bit reference "
                         "and the bfloat16 master-form rows; all (default): both")
    args = ap.parse_args(argv)
    steps_digits = args.steps_digits or (40 if args.quick else 1500)
    steps_lm = args.steps_lm or (40 if args.quick else 2000)
    if min(steps_digits, steps_lm) < 10:
        ap.error("steps must be >= 10")
    torch.set_num_threads(args.threads)
    torchao_eager = args.torchao_eager or args.quick

    facs, skipped, versions = optimizer_factories(torchao_eager)
    if args.settings == "masters":
        facs = {REF_NAME: facs[REF_NAME]}
    if args.settings != "8bit":
        facs.update(master_factories())
    print("8-bit AdamW accuracy study (CPU)")
    print(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())
          + f", python {platform.python_version()}")
    print(f"cpu: {platform.processor() or platform.machine()}, torch threads "
          f"{torch.get_num_threads()}, seeds {list(SEEDS)}")
    print(f"optimizers run: {', '.join(facs)}")
    if "torchao AdamW8bit" in facs:
        print("torchao step: " + ("eager (TORCHDYNAMO_DISABLE=1 during its steps)" if torchao_eager
                                  else "torch.compile (its default; compiled once per process, "
                                  "the compile time falls in its first run's seconds)"))
    for name, why in skipped.items():
        print(f"skipped: {name}: {why}")

    lm_data = LMData()
    print(f"tiny LM corpus: {lm_data.n_chars} chars, vocab {len(lm_data.chars)}, "
          f"train {len(lm_data.train)}, held-out {len(lm_data.held)} chars")
    tasks = [
        Task("digits", LR_DIGITS, steps_digits, ["test acc"], make_digits_run(DigitsData())),
        Task("tiny LM", LR_LM, steps_lm, ["held loss", "held acc"], make_lm_run(lm_data)),
    ]

    t_all = time.perf_counter()
    for task in tasks:
        for name, factory in facs.items():
            task.results[name] = {}
            for seed in SEEDS:
                r = task.run(seed, factory, task.lr, task.steps, param_dtype(name))
                task.results[name][seed] = r
                print(f"[progress] {task.name} / {name} / seed {seed}: final loss "
                      f"{r.final_loss:.4f}, {r.seconds:.1f} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_all

    failed: List[str] = []
    for task in tasks:
        failed += print_task(task)
    print(f"\ntotal training + eval time: {total:.1f} s")
    if failed:
        print(f"FAILED: {len(failed)} run(s) did not train (final loss >= {TRAINED_RATIO} x "
              "first loss): " + "; ".join(failed))
        return 1
    print(f"check passed: every run's final loss < {TRAINED_RATIO} x its first loss")
    return 0


if __name__ == "__main__":
    sys.exit(main())
