"""Conservative / standard / aggressive loss-scale strategies, side by side.

Trains the digits CNN of ``train_digits.py`` in float16 with loss scaling under
the three :class:`mixprec.MixedPrecisionConfig` presets:

* ``conservative`` -- scale 2**15, growth every 5000 clean steps, hysteresis 2;
* ``standard``     -- scale 2**16, growth every 2000 clean steps (torch's defaults);
* ``aggressive``   -- scale 2**17, growth every 1000 clean steps.

The growth windows are divided by ``--window-divisor`` (default 50) so that a run of a
few hundred steps shows growth and backoff; the ratios between the presets are kept.
Prints a table (accuracy, skipped steps, scale changes, final scale, time) and writes
``strategies.png`` (log2 scale over steps for each preset).

Run: ``python examples/compare_strategies.py [--epochs N] [--window-divisor D]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import mixprec


def _digits_module() -> Any:
    path = Path(__file__).resolve().with_name("train_digits.py")
    spec = importlib.util.spec_from_file_location("train_digits", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_preset(name: str, digits: Any, data: Any, epochs: int, divisor: int, device: str,
               seed: int = 0) -> dict[str, Any]:
    preset = mixprec.train.config.PRESETS[name]
    window = max(1, preset["scale_window"] // divisor)
    config = mixprec.MixedPrecisionConfig.preset(
        name, precision_level="fp16", scale_window=window, logging_frequency=10**9
    )
    x_tr, y_tr, x_te, y_te = data
    torch.manual_seed(seed)
    model = digits.SmallCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    trainer = mixprec.MixedPrecisionTrainer(config)
    trainer.setup_training(model, optimizer, nn.CrossEntropyLoss())
    loader = digits._EpochLoader(x_tr, y_tr, 64, seed)
    t0 = time.perf_counter()
    trainer.train(loader, epochs, progress=True)
    elapsed = time.perf_counter() - t0
    acc = trainer.evaluate(digits.batches(x_te, y_te, 256, seed))["accuracy"]
    st = trainer.stats()
    return {"preset": name, "initial": config.initial_scale, "window": window,
            "hysteresis": config.hysteresis, "accuracy": acc, "skipped": st["skipped_steps"],
            "inc": st["scale_increases"], "dec": st["scale_decreases"],
            "final": st["current_scale"], "time": elapsed, "history": st["scale_history"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--window-divisor", type=int, default=50)
    parser.add_argument("--out", default="strategies.png")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(args.threads, os.cpu_count() or 1)))
    digits = _digits_module()
    data = digits.load_digits_tensors(0)
    rows = [run_preset(n, digits, data, args.epochs, args.window_divisor, args.device)
            for n in ("conservative", "standard", "aggressive")]
    head = (f"{'preset':13s} {'init scale':>10s} {'window':>7s} {'hyst':>5s} {'accuracy':>9s} "
            f"{'skipped':>8s} {'scale +/-':>10s} {'final scale':>12s} {'time (s)':>9s}")
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        changes = f"{r['inc']}/{r['dec']}"
        print(f"{r['preset']:13s} {r['initial']:10g} {r['window']:7d} {r['hysteresis']:5d} "
              f"{100 * r['accuracy']:8.2f}% {r['skipped']:8d} {changes:>10s} "
              f"{r['final']:12g} {r['time']:9.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in rows:
        steps = [s for s, _ in r["history"]]
        ax.step(steps, [torch.tensor(v).log2().item() for _, v in r["history"]], where="post",
                label=f"{r['preset']} (skipped {r['skipped']})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("log2(loss scale)")
    ax.set_title("loss-scale strategies, float16 on sklearn digits")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
