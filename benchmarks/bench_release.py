"""Gradient release: the gradient bytes alive during one backward of a GPT (its layer stack,
then the whole model with its tied embedding), with and without
``mixprec.optim.release_gradients``, counted with hooks (no GPU needed).

Each time a param's gradient is accumulated, a hook sums the bytes of every gradient alive
at that moment; the peak is the largest sum. The params after the step are compared bit for
bit between the two runs (the work happened, and the same work).

    python benchmarks/bench_release.py                       # GPT-2 small, bf16 + masters
    python benchmarks/bench_release.py --layers 2 --d 128    # a quick run
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import List, Optional

import torch
from torch import nn

import mixprec
from _models import GPT, ModelConfig


class _Stack(nn.Module):
    """The GPT's blocks alone, on given hidden states (batch, tokens, d_model)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.blocks = gpt.blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _loss(model: nn.Module, data: torch.Tensor) -> torch.Tensor:
    if isinstance(model, _Stack):
        return model(data).float().pow(2).mean()
    logits = model(data[:, :-1])
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten())


def _peak_grad_bytes(model: nn.Module, data: torch.Tensor, bucket_bytes: Optional[int],
                     state_bits: int) -> tuple:
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-4, state_bits=state_bits)
    params = list(model.parameters())
    sums: List[int] = []
    # registered first, so each runs before release's hook frees anything
    hooks = [p.register_post_accumulate_grad_hook(lambda _p: sums.append(sum(
        q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)))
        for p in params]
    if bucket_bytes is not None:
        mixprec.optim.release_gradients(model, opt, bucket_bytes=bucket_bytes)
    _loss(model, data).backward()
    after_backward = sum(q.grad.numel() * q.grad.element_size() for q in params
                         if q.grad is not None)
    opt.step()
    for h in hooks:
        h.remove()
    return max(sums), after_backward, [p.detach().clone() for p in params]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    ap.add_argument("--state-bits", type=int, default=32, choices=(8, 32))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig(layers=args.layers, d_model=args.d, heads=args.heads)
    base = GPT(cfg).to(torch.bfloat16)
    idx = torch.randint(0, cfg.vocab, (1, args.tokens + 1))
    bucket = int(args.bucket_mib * 2**20)
    print(f"mixprec {mixprec.__version__} | torch {torch.__version__} | GPT layers "
          f"{cfg.layers} d {cfg.d_model}, bf16 params, AdamW (float32 masters, "
          f"{args.state_bits}-bit moments), 1 x {args.tokens} tokens, CPU")
    hidden = torch.randn(1, args.tokens, cfg.d_model, dtype=torch.bfloat16)
    mib = 2.0**20
    print(f"{'':44} {'params':>8} {'peak grad MiB':>14} {'after backward':>15}")
    failed = False
    for part, model, data in (("layer stack", _Stack(base), hidden), ("whole model", base, idx)):
        n = sum(p.numel() for p in model.parameters())
        peak, left, plain = _peak_grad_bytes(copy.deepcopy(model), data, None, args.state_bits)
        rpeak, rleft, released = _peak_grad_bytes(copy.deepcopy(model), data, bucket,
                                                  args.state_bits)
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(plain, released))
        failed |= not same
        for name, pk, lf in ((f"{part}, without release", peak, left),
                             (f"{part}, release ({args.bucket_mib:g} MiB buckets)", rpeak,
                              rleft)):
            print(f"{name:44} {n / 1e6:7.1f}M {pk / mib:14.1f} {lf / mib:15.1f}")
        print(f"{part}: peak release / without {rpeak / peak:.3f}; params after the step "
              f"bitwise equal: {same}")
    if failed:
        print("error: the runs with and without release differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
