"""Accelerate with mixprec's optimizers on CPU: bf16 autocast, ``clip_grad_norm_``,
8-bit state, BF16 params with FP32 masters, ``save_state``/``load_state`` resumed bit
for bit, each against a hand-written loop; and the skipped-step signal as it is today
(``docs/frameworks.md``): a step skipped on the device is not seen by
``optimizer_step_was_skipped``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
from torch import nn

import mixprec

accelerate = pytest.importorskip("accelerate")
from accelerate.utils import set_seed  # noqa: E402

MakeOpt = Callable[[Any], torch.optim.Optimizer]
OPTIMIZERS: Dict[str, MakeOpt] = {
    "AdamW": lambda params: mixprec.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
    "AdamW8bit": lambda params: mixprec.optim.AdamW8bit(params, lr=1e-2, min_8bit_size=64),
}
CLIP = 0.05
STEPS = 4


def data() -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(16, 8, generator=g) for _ in range(STEPS)]


def target(x: torch.Tensor) -> torch.Tensor:
    return (x[:, :3] * 2).sum(1, keepdim=True).expand(-1, 3).contiguous()


def net(bf16_params: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
    return model.to(torch.bfloat16) if bf16_params else model


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    return nn.functional.mse_loss(model(x.to(dtype)).float(), target(x))


def fresh_state() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def run_accelerate(opt: str, bf16_params: bool, steps: range, load: Optional[Path] = None,
                   save: Optional[Path] = None) -> nn.Module:
    fresh_state()
    set_seed(0)
    acc = accelerate.Accelerator(cpu=True, mixed_precision="no" if bf16_params else "bf16")
    model = net(bf16_params)
    optimizer = OPTIMIZERS[opt](model.parameters())
    model, optimizer = acc.prepare(model, optimizer)
    if load is not None:
        acc.load_state(str(load))
    xs = data()
    for k in steps:
        with acc.autocast():
            loss = loss_of(model, xs[k])
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), CLIP)
        assert norm > CLIP
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if save is not None:
        acc.save_state(str(save))
    return acc.unwrap_model(model)


def reference(opt: str, bf16_params: bool) -> nn.Module:
    model = net(bf16_params)
    optimizer = OPTIMIZERS[opt](model.parameters())
    for x in data():
        if bf16_params:
            loss = loss_of(model, x)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


@pytest.mark.parametrize("opt,bf16_params", [("AdamW", False), ("AdamW8bit", False),
                                             ("AdamW", True)])
def test_train_clip_and_resume(opt: str, bf16_params: bool, tmp_path: Path) -> None:
    straight = run_accelerate(opt, bf16_params, range(STEPS))
    want = reference(opt, bf16_params)
    for a, b in zip(straight.parameters(), want.parameters()):
        assert torch.equal(a, b)
    run_accelerate(opt, bf16_params, range(2), save=tmp_path / "state")
    resumed = run_accelerate(opt, bf16_params, range(2, STEPS), load=tmp_path / "state")
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b)
    if bf16_params:
        assert all(p.dtype == torch.bfloat16 for p in resumed.parameters())


def test_a_skipped_step_is_invisible_to_accelerate_today() -> None:
    """With a GradScaler, Accelerate decides "skipped" by whether ``optimizer.step`` was
    called (it patches it); mixprec's optimizers are always called and skip on the
    device, so ``optimizer_step_was_skipped`` stays False and the scheduler advances
    (as with torch's ``fused=True`` optimizers). ``scaler.step_was_skipped`` knows (one
    host sync). A CPU stand-in for fp16 on a GPU: mixprec's scaler on the CPU."""
    fresh_state()
    acc = accelerate.Accelerator(cpu=True)
    acc.scaler = mixprec.GradScaler("cpu")  # what fp16 on a GPU would set (torch's there)
    model = net(False)
    optimizer = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model, optimizer, sched = acc.prepare(model, optimizer, sched)
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(loss_of(model, data()[0]) * float("inf"))
    optimizer.step()
    sched.step()
    assert acc.scaler.step_was_skipped  # the step was skipped on the device ...
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert acc.optimizer_step_was_skipped is False  # ... and Accelerate does not know
    assert sched.scheduler.last_epoch == 1  # the LR schedule advanced


def test_lr_by_steps_taken_keeps_the_schedule_of_the_steps_taken() -> None:
    """The fix for the gap above, without a sync: with ``lr_by_steps_taken`` the lr the
    kernels use follows the steps taken, so an Accelerate loop (scheduler stepped after
    every step, a skipped one included) equals a hand-written loop that steps the
    scheduler only after a taken step (which needs one sync per step to know)."""
    xs = data()

    def run(accelerated: bool) -> List[torch.Tensor]:
        fresh_state()
        model = net(False)
        optimizer = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        scaler = mixprec.GradScaler("cpu")
        if accelerated:
            optimizer.lr_by_steps_taken(sched, STEPS)
            acc = accelerate.Accelerator(cpu=True)
            acc.scaler = scaler
            model, optimizer, sched = acc.prepare(model, optimizer, sched)
        for k, x in enumerate(xs):
            loss = loss_of(model, x) * (float("inf") if k == 1 else 1.0)
            if accelerated:
                acc.backward(loss)
                optimizer.step()
                sched.step()  # Accelerate's: advances over the skipped step
                assert acc.optimizer_step_was_skipped is False
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                if not scaler.step_was_skipped:  # one host sync
                    sched.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)
