"""Train a small GPT-style model with FSDP2 (``fully_shard``) and mixprec, on CPUs (gloo)
or GPUs (nccl), one process per device:

    torchrun --nproc-per-node 2 examples/fsdp2_train.py --recipe B-bf16

The training loop is the usual AMP loop, unchanged: ``mixprec.optim.AdamW(model.parameters())``
and ``mixprec.GradScaler()`` (a no-op for bf16 without loss scaling). The recipes
(docs/distributed.md explains each):

* ``A-bf16`` / ``A-fp16``: a float32 model, ``MixedPrecisionPolicy(param_dtype=bf16|fp16,
  reduce_dtype=float32)``; the optimizer steps the float32 shards (fp16: with loss scaling).
* ``B-bf16`` / ``B-fp16``: the model converted to 16 bits before ``fully_shard``; the
  optimizer keeps float32 masters of the shards (ZeRO-style: sharded like everything else).
* ``B-sr``: a bf16 model, no masters, stochastic rounding of the bf16 update.
* ``ddp``: a float32 model in DistributedDataParallel, autocast bf16 (nothing sharded).

Rank 0 prints the loss (the mean over the ranks) every ``--log-every`` steps and at the last;
at the end each rank prints what it holds per parameter of the whole model: params, grads
and optimizer state (measured from the tensors: local shards of DTensors), and the peak
memory of its GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec import _dtensor

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. "
    "All: Speak, speak. First Citizen: You are all resolved rather to die than to famish? "
) * 16
RECIPES = ("A-bf16", "A-fp16", "B-bf16", "B-fp16", "B-sr", "ddp")


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, ctx: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, 4) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds: params, grads and optimizer state (local shards)."""
    def nbytes(t: torch.Tensor) -> int:
        t = _dtensor.local(t)
        return t.numel() * t.element_size()

    state = sum(nbytes(v) for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor))
    return {"params": sum(nbytes(p) for p in model.parameters()),
            "grads": sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer state": state}


def setup(recipe: str, model: nn.Module, device: torch.device) -> tuple[nn.Module, dict]:
    """Wrap ``model`` for ``recipe``; returns it and the optimizer's keyword arguments."""
    if recipe == "ddp":
        model = model.to(device)
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids), {}
    fully_shard, MixedPrecisionPolicy = _dtensor.fsdp2()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict = {"mesh": mesh}
    opt_kwargs: dict = {}
    low = torch.float16 if recipe.endswith("fp16") else torch.bfloat16
    if recipe.startswith("A"):
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    else:
        model = model.to(low)  # 16-bit params before fully_shard (recipe B, B')
        if recipe == "B-sr":
            opt_kwargs = {"master_weights": False, "stochastic_rounding": True}
    model = model.to(device)
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model, opt_kwargs


def main(argv: list[str] | None = None) -> list[float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", choices=RECIPES, default="B-bf16")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = ap.parse_args(argv)

    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(0)  # the same initial model on every rank
        chars = sorted(set(TEXT))
        data = torch.tensor([chars.index(c) for c in TEXT], device=device)
        ctx = 32
        model = GPT(len(chars), args.d_model, args.layers, ctx)
        n_params = sum(p.numel() for p in model.parameters())
        model, opt_kwargs = setup(args.recipe, model, device)
        opt = mixprec.optim.AdamW(model.parameters(), lr=3e-3, **opt_kwargs)
        scaler = mixprec.GradScaler(device.type, enabled=args.recipe.endswith("fp16"))
        amp = args.recipe == "ddp"
        g = torch.Generator().manual_seed(1000 + rank)  # each rank: its own batches
        losses = []
        for step in range(args.steps):
            ix = torch.randint(0, data.numel() - ctx - 1, (8,), generator=g).tolist()
            x = torch.stack([data[i:i + ctx] for i in ix])
            y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
            scaler.scale(loss).backward()
            scaler.clip_grad_norm_(opt, 1.0)
            scaler.step(opt)
            scaler.update()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
            if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                print(f"step {step:4d}  loss {losses[-1]:.4f}  (ln(vocab) = "
                      f"{math.log(len(chars)):.2f})", flush=True)
        held = held_bytes(model, opt)
        parts = ", ".join(f"{k} {v / n_params:.2f}" for k, v in held.items())
        peak = (f"; peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**20:.1f} MiB"
                if use_cuda else "")
        for k in range(world):  # in rank order
            if k == rank:
                print(f"rank {rank}/{world} [{args.recipe}] bytes per model param held: "
                      f"{parts}{peak}", flush=True)
            dist.barrier()
        return losses
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is printed and the process group destroyed. Leave without the interpreter's
    # shutdown: gloo's worker threads outlive destroy_process_group() once fully_shard has
    # run, and one may free a finished collective during that shutdown and abort the
    # process after the last line (a torch issue; docs/troubleshooting.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
