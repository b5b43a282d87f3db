"""The Python twin of examples/cpp/train_mlp.cpp: the same model, data, seed,
autocast region, GradScaler, AdamW with master weights and injected inf, with
the same output lines. Its loss sequence equals the C++ program's (the ctest
tests `mixprec_example_twin_*` compare them, 1e-6 relative).

    python examples/cpp/train_mlp_twin.py [--device cpu|cuda] [--dtype bf16|fp16]
        [--steps N] [--inject-inf STEP] [--seed S] [--lr LR]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import mixprec
from mixprec.optim import AdamW


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--inject-inf", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_mlp_twin: --device cuda but no CUDA device", file=sys.stderr)
        return 1
    info = mixprec.build_info()
    print(f"mixprec {mixprec.__version__} | torch {torch.__version__} | device {args.device} | "
          f"dtype {args.dtype} | CUDA kernels {'yes' if info.get('cuda_kernels') else 'no'}")

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    model.to(device, dtype)

    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(256, 16, generator=gen).to(device)
    w = torch.randn(16, 1, generator=gen).to(device)
    y = torch.tanh(x @ w)

    optimizer = AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scaler = mixprec.GradScaler(args.device, init_scale=1024.0, growth_interval=10)

    skipped = 0
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        with torch.autocast(args.device, dtype=dtype):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == args.inject_inf:
            g = next(model.parameters()).grad
            g.view(-1)[0] = float("inf")
        scaler.clip_grad_norm_(optimizer, 1.0)
        scaler.step(optimizer)
        scaler.update()
        stepped = not scaler.step_was_skipped
        if not stepped:
            skipped += 1
        print(f"step {step} loss {loss.item():.9e} scale {scaler.get_scale():.1f}"
              f"{'' if stepped else ' skipped'}")
    print(f"done: {args.steps} steps, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
