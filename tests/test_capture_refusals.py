"""The refusals of ``capture_step`` from the table both twins test
(``tests/data/capture_refusals.txt``; the C++ twin: ``tests/cpp/test_capture.cpp``): each
row's defect planted, the CaptureError expected to contain the row's text; and every row has
a planting here. Also: a call's ``prepare()`` walks no persistent tensor unless a load hook
fired or a group's first param moved; grads dropped between calls are put back."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import Tensor

import mixprec
from mixprec.capture import CapturedStep, CaptureError, capture_step

TABLE = os.path.join(os.path.dirname(__file__), "data", "capture_refusals.txt")


def refusal_table() -> Dict[str, str]:
    """``id -> expected text`` of the table's rows."""
    rows: Dict[str, str] = {}
    with open(TABLE, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                rid, _when, text = (part.strip() for part in line.split("|", 2))
                rows[rid] = text
    return rows


def matches(message: str, text: str) -> bool:
    """Whether ``message`` holds the pieces of ``text`` (split at ``*``), in order."""
    at = 0
    for piece in text.split("*"):
        found = message.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


class Run:
    """A linear layer of fp16 params, mixprec AdamW (float32 masters), a GradScaler on CPU:
    the C++ test's setup."""

    def __init__(self) -> None:
        torch.manual_seed(7)
        self.w = torch.randn(8, 4).half().requires_grad_()
        self.b = torch.randn(8).half().requires_grad_()
        self.opt = mixprec.optim.AdamW([self.w, self.b], lr=1e-2, weight_decay=0.1)
        self.scaler = mixprec.GradScaler("cpu", init_scale=256.0, growth_interval=3)

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        self.opt.zero_grad(set_to_none=False)
        out = torch.nn.functional.linear(x.to(self.w.dtype), self.w, self.b)
        loss = (out.float() - y).pow(2).mean()
        self.scaler.scale(loss).backward()
        self.scaler.clip_grad_norm_(self.opt, 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss

    def capture(self, body: Callable[..., Tensor], warmup: int = 1) -> CapturedStep:
        return capture_step(body, batch(0), optimizers=[self.opt], scaler=self.scaler,
                            warmup=warmup)


def batch(k: int) -> Tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1000 + k)
    return torch.randn(5, 4, generator=g), torch.randn(5, 8, generator=g)


def _checked_refuses(body: Callable[[Run, Tensor, Tensor], Tensor]) -> Callable[[], Any]:
    """The checked call (the second, warmup 1) runs ``body``, then refuses."""
    def plant() -> Any:
        r = Run()
        step = r.capture(lambda x, y: body(r, x, y))
        step(*batch(0))
        return step(*batch(1))
    return plant


def _between_refuses(change: Callable[[Run], Any]) -> Callable[[], Any]:
    """After the checked call, ``change`` between calls; the next call refuses."""
    def plant() -> Any:
        r = Run()
        step = r.capture(r.step)
        for k in range(3):
            step(*batch(k))
        change(r)
        return step(*batch(3))
    return plant


def _item(r: Run, x: Tensor, y: Tensor) -> Tensor:
    loss = r.step(x, y)
    if loss.item() > 1e30:  # a host read
        r.w.grad.zero_()
    return loss


def _bool_mask(r: Run, x: Tensor, y: Tensor) -> Tensor:
    loss = r.step(x, y)
    return loss + x[x.abs() > 1e30].sum()  # boolean-mask indexing


def _set_to_none(r: Run, x: Tensor, y: Tensor) -> Tensor:
    r.opt.zero_grad(set_to_none=True)
    return r.step(x, y)


def _lr_in_step(r: Run, x: Tensor, y: Tensor) -> Tensor:
    r.opt.param_groups[0]["lr"] *= 0.5  # a scheduler inside the step
    return r.step(x, y)


def _no_update(r: Run, x: Tensor, y: Tensor) -> Tensor:
    r.opt.zero_grad(set_to_none=False)
    loss = (r.w.float().sum() * x.sum())
    r.scaler.scale(loss).backward()
    r.scaler.step(r.opt)
    r.calls = getattr(r, "calls", 0) + 1
    if r.calls == 1:
        r.scaler.update()  # not in the checked call
    return loss


def _call_in_autocast() -> Any:
    r = Run()
    step = r.capture(r.step)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return step(*batch(0))


def _new_storage(r: Run) -> None:
    with torch.no_grad():
        r.w.set_(r.w.detach().clone())


def _growth_factor(r: Run) -> None:
    r.scaler.set_growth_factor(4.0)


def _weight_decay(r: Run) -> None:
    r.opt.param_groups[0]["weight_decay"] = 0.5


#: id -> a function that plants the row's defect and runs until the refusal
PLANTINGS: Dict[str, Callable[[], Any]] = {
    "not_mixprec_optimizer": lambda: capture_step(
        lambda x, y: x.sum(), batch(0), scaler=Run().scaler,
        optimizers=[torch.optim.AdamW([torch.zeros(2, requires_grad=True)])]),
    "negative_warmup": lambda: Run().capture(Run().step, warmup=-1),
    "input_signature": lambda: Run().capture(Run().step)(torch.randn(6, 4), batch(0)[1]),
    "autocast_cache": _call_in_autocast,
    "sync_item": _checked_refuses(_item),
    "sync_bool_mask": _checked_refuses(_bool_mask),
    "grads_set_to_none": _checked_refuses(_set_to_none),
    "lr_in_step": _checked_refuses(_lr_in_step),
    "no_update": _checked_refuses(_no_update),
    "option_changed": _between_refuses(_weight_decay),
    "scaler_setting_changed": _between_refuses(_growth_factor),
    "param_new_storage": _between_refuses(_new_storage),
}


def test_every_row_has_a_planting() -> None:
    assert sorted(PLANTINGS) == sorted(refusal_table())


@pytest.mark.parametrize("rid", sorted(refusal_table()))
def test_refusal(rid: str) -> None:
    """The row's defect raises, naming it with the twins' common text (a ValueError for a
    bad argument, else CaptureError)."""
    with pytest.raises((CaptureError, ValueError)) as info:
        PLANTINGS[rid]()
    assert matches(str(info.value), refusal_table()[rid]), str(info.value)


def test_prepare_walks_nothing_unless_loaded() -> None:
    """Per call, no persistent tensor is looked up (the cost does not grow with the params)
    unless torch's load hook fired or a group's first param moved or lost its grad; then
    each is, once. Fails when prepare() walks every slot each call."""
    r = Run()
    step = r.capture(r.step, warmup=0)
    step(*batch(0))
    assert step._slots is not None
    looked: List[str] = []
    for s in step._slots:
        s.get = (lambda get, name: lambda: looked.append(name) or get())(s.get, s.name)
    for k in range(1, 4):
        step(*batch(k))
    assert looked == []
    r.opt.load_state_dict(r.opt.state_dict())  # the load hook
    step(*batch(4))
    assert len(looked) == len(step._slots)
    looked.clear()
    step(*batch(5))
    assert looked == []
    r.opt.zero_grad(set_to_none=True)  # every grad dropped: the sentinel
    step(*batch(6))
    assert len(looked) == len(step._slots)


def test_grads_dropped_between_calls_are_put_back() -> None:
    """``zero_grad()`` (set_to_none=True) between calls: the captured grads are put back
    before the next call (the graph accumulates into them), as in C++."""
    r = Run()
    step = r.capture(r.step)
    for k in range(3):
        step(*batch(k))
    grads = [r.w.grad, r.b.grad]
    r.opt.zero_grad()
    assert r.w.grad is None
    step(*batch(3))
    assert r.w.grad is grads[0] and r.b.grad is grads[1]


def test_step_was_skipped_reads_the_device_flag() -> None:
    """``GradScaler.step_was_skipped`` reads the flag of the last completed iteration each
    time (as C++): a captured record's flag rewritten in place is seen."""
    r = Run()
    for k in range(2):
        r.step(*batch(k))
    assert not r.scaler.step_was_skipped
    record = r.scaler.last_iteration
    flags = [f for s in record.states.values() for f in s["found_inf_per_device"].values()]
    flags[0].fill_(1.0)  # what a replay of an overflowing step writes
    assert r.scaler.step_was_skipped
