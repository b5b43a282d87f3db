"""Writes the trainer checkpoints of ``tests/train/test_trainer_checkpoint_compat.py``.

Run once, with the trainer as it was before it was split into parts (commit b6be011,
``python/mixprec/train/trainer.py`` in one file), from the repository root::

    PYTHONPATH=python python tests/data/make_trainer_checkpoints.py

For each case it writes ``trainer_<case>.pt`` (exactly what ``save_state`` wrote) and
``trainer_<case>_expected.pt``: what that trainer reported at the save (``stats()``, the
scale) and its parameters after training on from there. Do not regenerate these files
with newer code: their point is that they were written by the old one.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

import mixprec

HERE = os.path.dirname(os.path.abspath(__file__))


class Tiny(nn.Module):
    """Linear-LayerNorm-Linear; with ``big`` its middle layer overflows float16."""

    def __init__(self, big: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.mid = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)
        if big:
            with torch.no_grad():
                self.mid.weight.mul_(1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.mid(torch.relu(self.fc1(x))))))


CASES: dict[str, dict[str, Any]] = {
    "automatic_fp16": dict(
        config=dict(mode="automatic", precision_level="fp16", scale_window=2,
                    logging_frequency=3, max_grad_norm=1.0, initial_scale=2.0**10),
        opt="adamw", big=False),
    "manual_bf16": dict(
        config=dict(mode="manual", precision_level="bf16", gradient_accumulation_steps=2,
                    logging_frequency=2),
        opt="adamw", big=False),
    "adaptive_fp16": dict(
        config=dict(mode="adaptive", precision_level="fp16", logging_frequency=2,
                    overflow_threshold=0.5),
        opt="sgd", big=True),
}
SAVE_AFTER = 7   # train_step calls before the save (mid-accumulation for manual_bf16)
CONTINUE = 6     # train_step calls after it


def batches(n: int = SAVE_AFTER + CONTINUE, bs: int = 8) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        x = torch.randn(bs, 4, generator=g)
        out.append((x, x[:, :3].argmax(1)))
    return out


def make(case: str, seed: int = 0) -> mixprec.MixedPrecisionTrainer:
    spec = CASES[case]
    torch.manual_seed(seed)
    model = Tiny(spec["big"])
    if spec["opt"] == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2,
                                                       weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    trainer = mixprec.MixedPrecisionTrainer(mixprec.MixedPrecisionConfig(**spec["config"]))
    trainer.setup_training(model, opt, nn.CrossEntropyLoss(), sched)
    return trainer


def main() -> None:
    torch.set_num_threads(1)
    data = batches()
    for case in CASES:
        trainer = make(case)
        for x, y in data[:SAVE_AFTER]:
            trainer.train_step(x, y)
        path = os.path.join(HERE, f"trainer_{case}.pt")
        trainer.save_state(path)
        stats = trainer.stats()
        stats.pop("activation_memory")  # not part of the saved state
        expected: dict[str, Any] = {"stats_at_save": stats, "scale": trainer.scaler.get_scale()}
        for x, y in data[SAVE_AFTER:]:
            trainer.train_step(x, y)
        expected["params_after"] = {n: p.detach().clone()
                                    for n, p in trainer.model.named_parameters()}
        after = trainer.stats()
        expected["stats_after"] = {k: after[k] for k in (
            "total_steps", "skipped_steps", "scale_increases", "scale_decreases",
            "current_scale", "adaptive_decisions")}
        torch.save(expected, os.path.join(HERE, f"trainer_{case}_expected.pt"))
        print(case, os.path.getsize(path), "bytes;", expected["stats_after"])


if __name__ == "__main__":
    main()
