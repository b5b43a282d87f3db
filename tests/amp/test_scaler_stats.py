"""mixprec-only GradScaler features: stats() and step_was_skipped."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

import mixprec
from _helpers import INF, RecordingOptimizer


# ------------------------------------------------------------------ stats / step_was_skipped
@pytest.mark.parametrize("amp_aware", [False, True])
def test_stats_and_step_was_skipped(device, amp_aware):
    n = 137
    rng = random.Random(1)
    seq = [rng.random() < 0.1 for _ in range(n)]
    seq[-3] = True
    s = mixprec.GradScaler(device, init_scale=2.0**10, growth_interval=4)
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = RecordingOptimizer([p], supports_amp=amp_aware, lr=0.0)
    assert not s.step_was_skipped
    prev, inc, dec = s.get_scale(), 0, 0
    for i, found in enumerate(seq):
        s.scale(torch.ones((), device=device))
        p.grad = torch.full((3,), INF if found else 1.0, device=device)
        s.step(opt)
        s.update()
        assert s.step_was_skipped == found
        cur = s.get_scale()
        inc += cur > prev
        dec += cur < prev
        prev = cur
        if i == 70:
            mid = s.stats()
            assert mid.steps == 71 and mid.skipped_steps == sum(seq[:71])
    st = s.stats()
    assert st.steps == n and st.skipped_steps == sum(seq)
    assert st.overflow_rate == pytest.approx(sum(seq) / n)
    assert (st.scale_increases, st.scale_decreases) == (inc, dec)
    assert st.scale == s.get_scale()
    assert st.last_overflow_step == max(i for i, f in enumerate(seq) if f)
    assert st.as_dict()["steps"] == n
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.stats() == st


def test_stats_counted_in_place_and_disabled():
    """The counters keep their storage from the first update on (a captured update()
    replays into them) and nothing else accumulates."""
    s = mixprec.GradScaler("cpu", init_scale=1.0, growth_interval=2)
    _drive_one(s)
    tracker = s._mp_stats
    held = (tracker._counts.data_ptr(), tracker._prev.data_ptr())
    n = 193
    for _ in range(n - 1):
        _drive_one(s)
    assert (tracker._counts.data_ptr(), tracker._prev.data_ptr()) == held
    assert set(vars(tracker)) == {"_host", "_counts", "_row", "_prev"}
    assert tracker._row is None  # (the scale rule's kernel counted: no row of torch ops)
    assert s.stats().scale_increases == n // 2
    s.update(new_scale=8.0)  # counted by the torch ops, into the same counters
    row = tracker._row.data_ptr()
    s.update(new_scale=4.0)
    assert (tracker._counts.data_ptr(), tracker._prev.data_ptr()) == held
    assert tracker._row.data_ptr() == row
    assert s.stats().steps == n + 2 and s.stats().scale_decreases == 2  # (2**96 -> 8 -> 4)
    d = mixprec.GradScaler("cpu", enabled=False)
    assert d.stats().steps == 0 and d.stats().scale == 1.0 and not d.step_was_skipped
    fresh = mixprec.GradScaler("cpu")
    assert fresh.stats().last_overflow_step is None and fresh.stats().overflow_rate == 0.0


@pytest.mark.parametrize("hysteresis", [1, 2])
def test_update_dispatches_one_op_and_counts_as_the_torch_ops(device, hysteresis):
    """update() is one op (the scale rule's kernel, which also counts the statistics), and
    its counts equal those of the torch-op path (update(new_scale=...) runs it) fed the
    same scales in the same run, including a scale set outside update()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from mixprec.amp.stats import _StatsTracker

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and not str(func).startswith("profiler."):
                self.seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    s = mixprec.GradScaler(device, init_scale=2.0**10, growth_interval=2, hysteresis=hysteresis)
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = torch.optim.SGD([p], lr=0.0)
    ref = _StatsTracker()
    for i, inf in enumerate([0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0]):
        s.scale(torch.ones((), device=device))
        p.grad = torch.full((3,), INF if inf else 1.0, device=device)
        s.step(opt)
        if i == 7:
            s._scale.fill_(3.0)  # set outside update(): counted against the last update's
        ref.start(s._scale)
        found = torch.full((), float(inf), device=device)
        with Ops() as ops:
            s.update()
        if i > 0:  # (the first update makes the counters)
            op = "update_scale_ext_" if hysteresis > 1 else "update_scale_"
            assert ops.seen == [f"mixprec.{op}"], ops.seen
        ref.record(found, s._scale)
        assert s._mp_stats.read() == ref.read()
    steps, skipped, inc, dec, last = ref.read()
    assert (steps, skipped, last) == (11, 4, 6) and inc > 0 and dec > 0


def _drive_one(s):
    p = torch.nn.Parameter(torch.zeros(1))
    s.scale(torch.ones(()))
    p.grad = torch.ones(1)
    s.step(torch.optim.SGD([p], lr=0.0))
    s.update()


@pytest.mark.parametrize("hysteresis", [1, 3])
def test_state_dict_and_stats_in_one_read_equal_the_two_calls(device, hysteresis):
    s = mixprec.GradScaler(device, init_scale=2.0**10, growth_interval=2, hysteresis=hysteresis)
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = RecordingOptimizer([p], supports_amp=True, lr=0.0)
    assert s.state_dict_and_stats() == (s.state_dict(), s.stats())  # before any update
    for found in (False, True, False, False, True, True, False):
        s.scale(torch.ones((), device=device))
        p.grad = torch.full((3,), INF if found else 1.0, device=device)
        s.step(opt)
        s.update()
        assert s.state_dict_and_stats() == (s.state_dict(), s.stats())
    off = mixprec.GradScaler(device, enabled=False)
    assert off.state_dict_and_stats() == ({}, off.stats())
