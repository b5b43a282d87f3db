"""The models the benchmarks and tools/ train: one transformer block, the GPT built of it
(pre-LN, GPT-2 small by default) and a small conv net. Examples keep their own copies (each
example is one self-contained file).

``GPT(ModelConfig())`` is GPT-2 small (124M parameters): tied LM head, learned positions,
GPT-2's initialisation (N(0, 0.02), residual projections scaled by 1/sqrt(2 L)), tanh GELU.
:func:`tiny_gpt` is the character-level model of the accuracy studies (an untied head,
torch's default initialisation, exact GELU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape and flavour of the GPT."""

    layers: int = 12
    d_model: int = 768
    heads: int = 12
    vocab: int = 50257
    ctx: int = 1024
    tied_head: bool = True  # the LM head is the token embedding
    gpt2_init: bool = True  # GPT-2's init; else torch's defaults (positions N(0, 0.02))
    gelu: str = "tanh"  # F.gelu's ``approximate``
    bias: bool = True  # the blocks' linears have biases


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, bias = cfg.d_model, cfg.bias
        self.heads, self.gelu = cfg.heads, cfg.gelu
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.attn_proj = nn.Linear(d, d, bias=bias)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.mlp_proj = nn.Linear(4 * d, d, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, tokens, d_model), any float dtype; same shape out."""
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate=self.gelu))


class GPT(nn.Module):
    """GPT language model: token ids (batch, tokens) -> logits (batch, tokens, vocab)."""

    def __init__(self, cfg: ModelConfig = ModelConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.ctx, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = None if cfg.tied_head else nn.Linear(cfg.d_model, cfg.vocab)
        with torch.no_grad():
            if not cfg.gpt2_init:
                self.wpe.weight.mul_(0.02)
                return
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") \
                        else 0.02
                    nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.head is None else self.head(x)


def tiny_gpt(vocab: int, ctx: int = 32, d: int = 64, layers: int = 2, heads: int = 4) -> GPT:
    """The accuracy studies' character-level GPT (untied head, torch's init, exact GELU)."""
    return GPT(ModelConfig(layers, d, heads, vocab, ctx, tied_head=False, gpt2_init=False,
                           gelu="none"))


def convnet(classes: int = 10) -> nn.Module:
    """A small conv net for 3 x 32 x 32 images (three conv + batch-norm layers)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, classes))
