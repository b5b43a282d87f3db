"""Writes tests/data/optim8_flat_layout.pt: the 8-bit optimizer state of the previous
8-bit layout ("dynamic8/b256": blocks of 256 over the flattened tensor), saved by the
mixprec that had it (version string 0.1.0, before the row layout). Run with that tree on
the path:

    PYTHONPATH=<that tree>/python python tests/data/make_8bit_flat_checkpoint.py

The params cover each way such a checkpoint loads into the row layout: rows a multiple of
256 long (the old blocks are the new ones: the same codes), rows of 48 and 120 (requantized
from the decoded values), and a 1-D param (float32 moments now: read back exactly). The
file holds each optimizer's state_dict and, beside it, the moments the old release read
back (float32), for the test to compare against.
"""

from __future__ import annotations

import pathlib

import torch
from torch import nn

import mixprec
from mixprec.optim import _state8


def model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    m.square = nn.Parameter(torch.randn(8, 512) * 0.1)   # rows of 512: 2 whole blocks
    m.narrow = nn.Parameter(torch.randn(120, 48) * 0.1)  # rows of 48: blocks cut rows
    m.wide = nn.Parameter(torch.randn(48, 120) * 0.1)    # rows of 120
    m.flat = nn.Parameter(torch.randn(1000) * 0.1)       # 1-D
    return m


def main() -> None:
    out = {"version": mixprec.__version__, "quant": _state8.QUANT}
    for name, make in (("adamw", lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2,
                                                                    min_8bit_size=256)),
                       ("sgd", lambda ps: mixprec.optim.SGD8bit(ps, lr=1e-1, momentum=0.9,
                                                                min_8bit_size=256))):
        m = model()
        opt = make(m.parameters())
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            opt.zero_grad()
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        decoded = []
        for p in m.parameters():
            st = opt.state[p]
            row = {}
            for mom, table in (("exp_avg", "dynamic8-signed"), ("exp_avg_sq",
                               "dynamic8-unsigned"), ("momentum_buffer", "dynamic8-signed")):
                if mom in st:
                    t = st[mom]
                    row[mom] = (_state8.read_back(t, st[mom + "_absmax"], table, p)
                                if t.dtype == torch.uint8 else t.clone())
            decoded.append(row)
        out[name] = {"model": m.state_dict(), "optim": opt.state_dict(), "decoded": decoded}
    path = pathlib.Path(__file__).with_name("optim8_flat_layout.pt")
    torch.save(out, path)
    print("wrote", path)


if __name__ == "__main__":
    main()
