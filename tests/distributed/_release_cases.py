"""What test_release_fsdp2.py runs in each gloo process: a model sharded with
``fully_shard`` trained with gradient release (each shard stepped in FSDP2's reduce-scatter,
its grad freed), the same sharded model without release, and the unsharded model, side by
side on the same data (every rank the same batch: the averaged grad is exact)."""

from __future__ import annotations

import copy
import os
from typing import Any, Callable, Dict

import torch
from torch import nn

import mixprec
from _fsdp2_cases import DEVICE, batch, bitwise, params_of, shard, tiny_model
from mixprec import _dtensor
from mixprec.optim.release import release_gradients

_OPTIMIZERS: Dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "bf16_adamw": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "fp32_adamw8bit": lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=16),
    "bf16_sgd": lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9),
}


def _same(a: list, b: list) -> bool:
    """Bitwise, floats by their bits (NaN payloads included), 8-bit codes as they are."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and (
            torch.equal(x, y) if not x.is_floating_point()
            else bitwise([x.reshape(-1)], [y.reshape(-1)]))
        for x, y in zip(a, b))


def _state_bits(opt: torch.optim.Optimizer, model: nn.Module) -> list:
    out = []
    for p in model.parameters():
        for _, v in sorted(opt.state[p].items()):
            if isinstance(v, torch.Tensor):
                t = v.full_tensor() if _dtensor.is_dtensor(v) else v
                out.append(t.detach().clone())
    return out


def run(rank: int, world: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE, (world,))
    results: Dict[str, Any] = {}
    for name, make in _OPTIMIZERS.items():
        dtype = torch.bfloat16 if name.startswith("bf16") else torch.float32
        ref = tiny_model(dtype)
        released, plain = shard(copy.deepcopy(ref), mesh), shard(copy.deepcopy(ref), mesh)
        runs = [(released, make(released.parameters())), (plain, make(plain.parameters())),
                (ref, make(ref.parameters()))]
        handle = release_gradients(released, runs[0][1], bucket_bytes=1)
        freed = []
        for step in range(4):
            x = batch(step, dtype)
            for k, (m, o) in enumerate(runs):
                m(x).float().pow(2).mean().backward()
                if k == 0:
                    freed.append(all(p.grad is None for p in m.parameters()))
                o.step()
                o.zero_grad()
        results[name] = {
            "params_vs_plain": bitwise(params_of(released), params_of(plain)),
            "params_vs_unsharded": bitwise(params_of(released), params_of(ref)),
            "state_vs_plain": _same(_state_bits(runs[0][1], released),
                                    _state_bits(runs[1][1], plain)),
            "coded": any(t.dtype == torch.uint8 for t in _state_bits(runs[0][1], released)),
            "freed_in_backward": freed,
            "buckets": handle.buckets_stepped,
            "nonempty_shards": sum(_dtensor.local(p).numel() > 0 for p in released.parameters()),
        }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
