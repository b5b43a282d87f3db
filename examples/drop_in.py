"""mixprec.GradScaler as a drop-in: the same training script, run twice.

A tiny nanoGPT-style character model (embedding, one causal self-attention
block, MLP, tied head) trained with the usual AMP recipe:

    autocast -> scaler.scale(loss).backward() -> scaler.unscale_ + clip
    -> scaler.step -> scaler.update, with a checkpoint save/load of
    scaler.state_dict() half way.

Run 1 uses torch's ``torch.amp.GradScaler``; run 2 is the *unchanged* function
after ``mixprec.patch_torch()``, so ``torch.amp.GradScaler`` builds mixprec's
scaler. An overflow is forced at one iteration to show a skipped step and a
backoff. The two runs print identical loss and scale sequences (asserted).

    PYTHONPATH=python python examples/drop_in.py [--device cpu|cuda] [--iters 30]
"""

from __future__ import annotations

import argparse
import io
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import mixprec

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. "
    "All: Speak, speak. First Citizen: You are all resolved rather to die than to famish? "
) * 8


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 32, ctx: int = 16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.block, self.ln = Block(d, 4), nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as nanoGPT
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.block(self.tok(idx) + self.pos(pos))))


def train(device: str, iters: int, amp_dtype: torch.dtype) -> tuple[list[float], list[float], str]:
    torch.manual_seed(1337)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT], device=device)
    model = TinyGPT(len(chars)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    use_scaler = amp_dtype == torch.float16 or device == "cpu"
    scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=5,
                                  enabled=use_scaler)
    g = torch.Generator().manual_seed(0)
    losses, scales = [], []
    for it in range(iters):
        ix = torch.randint(0, data.numel() - 17, (8,), generator=g).tolist()
        x = torch.stack([data[i:i + 16] for i in ix])
        y = torch.stack([data[i + 1:i + 17] for i in ix])
        with torch.autocast(device, dtype=amp_dtype):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if it == iters // 3:  # simulate an fp16 overflow: this step must be skipped
            model.head.weight.grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        if it == iters // 2:  # checkpoint round trip of the scaler state
            buf = io.BytesIO()
            torch.save({"scaler": scaler.state_dict()}, buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True)
            scaler = torch.amp.GradScaler(device, enabled=use_scaler)
            scaler.load_state_dict(state["scaler"])
    return losses, scales, type(scaler).__module__ + "." + type(scaler).__qualname__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    # fp16 autocast where it exists (CUDA; CPU in recent torch), else bf16
    amp_dtype = torch.float16
    try:
        with torch.autocast(args.device, dtype=torch.float16):
            torch.ones(2, 2, device=args.device) @ torch.ones(2, 2, device=args.device)
    except RuntimeError:
        amp_dtype = torch.bfloat16
    print(f"device={args.device} autocast={amp_dtype} torch={torch.__version__} "
          f"mixprec={mixprec.__version__}")

    ref_losses, ref_scales, ref_cls = train(args.device, args.iters, amp_dtype)
    with mixprec.patch_torch():
        mp_losses, mp_scales, mp_cls = train(args.device, args.iters, amp_dtype)

    print(f"run 1 scaler: {ref_cls}\nrun 2 scaler: {mp_cls}")
    print(f"{'iter':>4}  {'loss (torch)':>14}  {'loss (mixprec)':>14}  {'scale (torch)':>13}  "
          f"{'scale (mixprec)':>15}")
    for i, (a, b, s, t) in enumerate(zip(ref_losses, mp_losses, ref_scales, mp_scales)):
        print(f"{i:>4}  {a:>14.6f}  {b:>14.6f}  {s:>13.1f}  {t:>15.1f}")
    assert mp_cls.startswith("mixprec.") and not ref_cls.startswith("mixprec.")
    assert ref_losses == mp_losses, "loss sequences differ"
    assert ref_scales == mp_scales, "scale sequences differ"
    print("identical loss and scale sequences: OK")


if __name__ == "__main__":
    main()
