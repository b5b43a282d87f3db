"""``FusedOptimizer.lr_by_steps_taken``: the LR schedule counts only the steps taken.

A framework that steps its LR scheduler after every optimizer step (HF Trainer,
Accelerate) advances it over steps skipped on the device too; with the table attached, the
lr the kernels use follows the device step count instead, with no host sync. The
reference is the loop that knows on the host (one sync per step): the scheduler stepped
only when ``scaler.step_was_skipped`` is False."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import pytest
import torch
from torch import nn

import mixprec

STEPS = 8
OVERFLOW = {2, 3, 6}  # 0-based steps whose loss is inf: skipped on the device

Make = Callable[[Any], torch.optim.Optimizer]
OPTIMIZERS = {
    "AdamW": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
    "AdamW-bf16-masters-8bit": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, state_bits=8,
                                                              min_8bit_size=16),
    "SGD-momentum": lambda ps: mixprec.optim.SGD(ps, lr=1e-1, momentum=0.9),
}


def _model(bf16: bool) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    return m.to(torch.bfloat16) if bf16 else m


def _sched(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))


def _train(make: Make, bf16: bool, table: bool, host_knows: bool,
           steps: range = range(STEPS), state: Any = None) -> Tuple[nn.Module, Any]:
    """``steps`` of a scaled loop. ``table``: the lr from the steps-taken table, scheduler
    stepped every step (what a framework does); ``host_knows``: the scheduler stepped only
    after a taken step (one sync each)."""
    model = _model(bf16)
    opt = make(model.parameters())
    sched = _sched(opt)
    scaler = mixprec.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=100)
    if table:
        opt.lr_by_steps_taken(sched, STEPS)
    if state is not None:
        model.load_state_dict(state[0])
        opt.load_state_dict(state[1])
        sched.load_state_dict(state[2])
        scaler.load_state_dict(state[3])
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 8, generator=g) for _ in range(STEPS)]
    for k in steps:
        opt.zero_grad()
        dtype = next(model.parameters()).dtype
        loss = model(xs[k].to(dtype)).float().pow(2).mean()
        if k in OVERFLOW:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if not host_knows or not scaler.step_was_skipped:
            sched.step()
    return model, (model.state_dict(), opt.state_dict(), sched.state_dict(),
                   scaler.state_dict())


def _params(m: nn.Module) -> List[torch.Tensor]:
    return [p.detach() for p in m.parameters()]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_framework_loop_with_the_table_equals_the_loop_that_syncs(name: str) -> None:
    bf16 = "bf16" in name
    ours, _ = _train(OPTIMIZERS[name], bf16, table=True, host_knows=False)
    ref, _ = _train(OPTIMIZERS[name], bf16, table=False, host_knows=True)
    for a, b in zip(_params(ours), _params(ref)):
        assert torch.equal(a, b)


def test_without_the_table_a_framework_loop_drifts() -> None:
    """The control: stepping the scheduler over skipped steps changes the result."""
    ours, _ = _train(OPTIMIZERS["AdamW"], False, table=False, host_knows=False)
    ref, _ = _train(OPTIMIZERS["AdamW"], False, table=False, host_knows=True)
    assert not all(torch.equal(a, b) for a, b in zip(_params(ours), _params(ref)))


def test_resume_continues_bitwise() -> None:
    make = OPTIMIZERS["AdamW"]
    straight, _ = _train(make, False, table=True, host_knows=False)
    _, state = _train(make, False, table=True, host_knows=False, steps=range(4))
    resumed, _ = _train(make, False, table=True, host_knows=False, steps=range(4, STEPS),
                        state=state)
    for a, b in zip(_params(straight), _params(resumed)):
        assert torch.equal(a, b)


def test_past_the_table_the_last_value_stays() -> None:
    p = nn.Parameter(torch.ones(3))
    opt = mixprec.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 ** k)
    opt.lr_by_steps_taken(sched, 2)  # lr 1.0, then 0.5 for every later step
    assert opt.param_groups[0]["lr"] == 1.0 and sched.last_epoch == 0  # left as it was
    moves = []
    for _ in range(4):
        before = p.detach().clone()
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
        moves.append(float((before - p.detach())[0]))
    assert moves == [1.0, 0.5, 0.5, 0.5]


def test_refusals_name_the_cause() -> None:
    p = nn.Parameter(torch.ones(3))
    opt = mixprec.optim.AdamW([p], lr=1e-3)
    other = mixprec.optim.AdamW([nn.Parameter(torch.ones(3))], lr=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        opt.lr_by_steps_taken(plateau, 10)
    with pytest.raises(ValueError, match="scheduler of this optimizer"):
        opt.lr_by_steps_taken(_sched(other), 10)
    with pytest.raises(ValueError, match="num_steps"):
        opt.lr_by_steps_taken(_sched(opt), 0)
    p.grad = torch.ones(3)
    opt.step()
    with pytest.raises(RuntimeError, match="before the first step"):
        opt.lr_by_steps_taken(torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0), 10)


def test_compiled_step_reads_the_table() -> None:
    """Under torch.compile(fullgraph=True) the gather is traced: the same params. (The
    step is called through the class: a scheduler replaces ``opt.step`` by a counting
    wrapper of torch's lr_scheduler.py, which dynamo does not trace, for torch's own
    optimizers too.)"""
    torch._dynamo.reset()
    runs = []
    for compiled in (False, True):
        p = nn.Parameter(torch.ones(4))
        opt = mixprec.optim.AdamW([p], lr=1e-1)
        opt.lr_by_steps_taken(_sched(opt), 5)
        def plain(opt: torch.optim.Optimizer = opt) -> None:
            type(opt).step(opt)

        step = torch.compile(plain, fullgraph=True) if compiled else plain
        for k in range(3):
            p.grad = torch.full((4,), float(k + 1))
            step()
        runs.append(p.detach().clone())
    assert torch.equal(runs[0], runs[1])
