"""The trainer reads nothing back from the device inside a step (eager or ``capture=True``,
fp16 or bf16, with or without an LR scheduler): host reads counted with a dispatch mode
(``aten::_local_scalar_dense``, ``aten::item``) and with :class:`mixprec.capture.SyncDetector`.
With a mixprec optimizer the scheduler's lr reaches the kernels from the optimizer's lr
table, and the scheduler is caught up at log steps: the training is the one a loop that
reads "was the step skipped" after every step gives, bit for bit."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
import torch
from torch import nn

import mixprec
from _helpers import HostReads
from mixprec.capture import SyncDetector


def _trainer(level: str, capture: bool, scheduler: bool, logging_frequency: int = 1000
             ) -> mixprec.MixedPrecisionTrainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.9 ** k) if scheduler else None
    cfg = mixprec.MixedPrecisionConfig(precision_level=level, capture=capture,
                                       logging_frequency=logging_frequency)
    trainer = mixprec.MixedPrecisionTrainer(cfg)
    return trainer.setup_training(model, opt, nn.CrossEntropyLoss(), sched)


def _batch(seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)


def reads_per_step(trainer: mixprec.MixedPrecisionTrainer, steps: int = 5) -> Tuple[float, float]:
    """Host reads per ``train_step`` (dispatch-mode count, SyncDetector count), after
    the warm-up steps (capture's eager and checked calls, the table's first making)."""
    x, y = _batch()
    for _ in range(4):
        trainer.train_step(x, y)
    counter, detector = HostReads(), SyncDetector()
    with counter, detector:
        for _ in range(steps):
            trainer.train_step(x, y)
    return len(counter.ops) / steps, detector.count / steps


@pytest.mark.parametrize("scheduler", [False, True], ids=["no-scheduler", "scheduler"])
@pytest.mark.parametrize("capture", [False, True], ids=["eager", "capture"])
@pytest.mark.parametrize("level", ["fp16", "bf16"])
def test_no_host_read_inside_a_step(level: str, capture: bool, scheduler: bool) -> None:
    assert reads_per_step(_trainer(level, capture, scheduler)) == (0.0, 0.0)


def test_a_planted_read_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count above is not blind: one ``.item()`` planted in the optimizer's step is
    seen by both counters, once per step."""
    trainer = _trainer("fp16", False, True)
    step_group = mixprec.optim.FusedOptimizer._step_group

    def planted(self: Any, index: int, group: Any, *args: Any) -> None:
        group["params"][0].detach().sum().item()
        step_group(self, index, group, *args)

    monkeypatch.setattr(mixprec.optim.FusedOptimizer, "_step_group", planted)
    assert reads_per_step(trainer) == (1.0, 1.0)


def _reference(level: str, batches: List[Tuple[torch.Tensor, torch.Tensor]]
               ) -> Tuple[List[torch.Tensor], int, List[float]]:
    """The loop that reads "was the step skipped" after each step (a host read) and steps
    the scheduler only after steps taken: params, the scheduler's epoch, the lrs."""
    trainer = _trainer(level, False, True)
    manager = trainer.mixed_precision_manager
    sched = trainer.scheduler
    lrs = []
    for x, y in batches:
        trainer.optimizer.zero_grad()
        with manager.autocast():
            out = trainer.model(x)
        manager.backward(nn.functional.cross_entropy(out.float(), y))
        manager.step()
        if not manager.step_was_skipped:
            sched.step()
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
    return [p.detach().clone() for p in trainer.model.parameters()], sched.last_epoch, lrs


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "capture"])
@pytest.mark.parametrize("level", ["fp16", "bf16"])
def test_skipped_steps_do_not_advance_the_schedule(level: str, capture: bool) -> None:
    """Steps skipped on the device (a NaN batch) do not advance the lr; log steps every 3
    steps remake the table from the caught-up scheduler; the same bits as the loop that
    syncs after each step."""
    batches = [_batch(k) for k in range(11)]
    for k in (2, 3, 7):
        batches[k][0][0, 0] = float("nan")
    want_params, want_epoch, want_lrs = _reference(level, batches)
    trainer = _trainer(level, capture, True, logging_frequency=3)
    lrs = [trainer.train_step(x, y)["lr"] for x, y in batches]
    assert lrs == want_lrs
    assert trainer.scheduler.last_epoch == want_epoch == 8
    for a, b in zip(trainer.model.parameters(), want_params):
        assert torch.equal(a.detach(), b)
