"""Writes ``flat_buffer_checkpoint.pt``, the fixture of
``tests/optim/test_optim_torch_parity.py::test_flat_buffer_checkpoint_loads_into_the_plain_optimizer``.

The flat-buffer mode (``mixprec.optim.flat_buffers``) was removed after commit 9471ec2.
This script was run once, at that commit (the last one with the mode), from the
repository root of a checkout of it with its extension built::

    PYTHONPATH=python python tests/data/make_flat_buffer_checkpoint.py

For AdamW (bfloat16 params with float32 masters beside float32 params) and SGD (momentum,
float32 params) it trains a tiny model in flat-buffer mode for three steps and writes what
a checkpoint of that release held (the model's and the optimizer's ``state_dict()``: the
moments and masters are views of flat state buffers, so torch.save wrote each buffer once,
padding included), the model's params before training, the five input batches, and the
params after two more flat-buffer steps. Do not regenerate the file with newer code: its
point is that it was written by the old one.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import torch
from torch import nn

import mixprec

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS_BEFORE_SAVE = 3
STEPS_AFTER = 2


class Mixed(nn.Module):
    """A bfloat16 layer then a float32 one (two flat buffers, one per dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8).to(torch.bfloat16)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x.to(torch.bfloat16)).float().relu())


def _case(make_opt: Any, seed: int) -> Dict[str, Any]:
    torch.manual_seed(seed)
    model = Mixed()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    inputs = torch.randn(STEPS_BEFORE_SAVE + STEPS_AFTER, 5, 6)
    mixprec.optim.flat_buffers(model)
    opt = make_opt(model.parameters())

    def step(x: torch.Tensor) -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    for x in inputs[:STEPS_BEFORE_SAVE]:
        step(x)
    # the checkpoint, as a training script of that release saved it
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    path = os.path.join(HERE, "_flat_tmp.pt")
    torch.save(saved, path)
    checkpoint = torch.load(path, weights_only=True)
    os.remove(path)
    for x in inputs[STEPS_BEFORE_SAVE:]:
        step(x)
    continued = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"init": init, "inputs": inputs, "checkpoint": checkpoint, "continued": continued}


def main() -> None:
    out = {
        "made_by": "tests/data/make_flat_buffer_checkpoint.py at commit 9471ec2",
        "torch": str(torch.__version__),
        "adamw": _case(lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), 0),
        "sgd": _case(lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9), 1),
    }
    # one torch.save of the whole: the flat buffers the views share are written once each
    torch.save(out, os.path.join(HERE, "flat_buffer_checkpoint.pt"))


if __name__ == "__main__":
    main()
