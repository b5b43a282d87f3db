"""update_scale_ (bitwise torch._amp_update_scale_) and update_scale_ext_ rules."""

from __future__ import annotations

import pytest
import torch

import _reference
import mixprec
from _helpers import assert_bitwise_equal


def state(device: str, scale: float, tracker: int = 0, hyst: int | None = None):
    s = torch.full((), scale, dtype=torch.float32, device=device)
    t = torch.full((), tracker, dtype=torch.int32, device=device)
    if hyst is None:
        return s, t
    return s, t, torch.full((), hyst, dtype=torch.int32, device=device)


def test_issue_sequence(device):
    """scale 4, growth 2, backoff 0.25, interval 2: clean, clean, inf -> (4,1), (8,0), (2,0)."""
    s, t = state(device, 4.0)
    found = torch.zeros((), device=device)
    seen = []
    for inf in (0.0, 0.0, 1.0):
        found.fill_(inf)
        mixprec.ops.update_scale_(s, t, found, 2.0, 0.25, 2)
        seen.append((s.item(), t.item()))
    assert seen == [(4.0, 1), (8.0, 0), (2.0, 0)]


def test_growth_skipped_when_not_finite(device):
    s, t = state(device, 1e38)
    found = torch.zeros((), device=device)
    for _ in range(3):
        mixprec.ops.update_scale_(s, t, found, 16.0, 0.5, 1)
        assert s.item() == pytest.approx(1e38) and t.item() == 0


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_random_sequences_bitwise_equal_to_torch(device, impl):
    fn = mixprec.ops.update_scale_ if impl == "kernel" else _reference.update_scale_
    g = torch.Generator().manual_seed(1234)
    for _trial in range(20):
        init = float(torch.empty(()).uniform_(-20, 120, generator=g).exp2())
        growth = float(torch.empty(()).uniform_(1.01, 10, generator=g))
        backoff = float(torch.empty(()).uniform_(0.01, 0.99, generator=g))
        interval = int(torch.randint(1, 5, (), generator=g))
        ours, theirs = state(device, init), state(device, init)
        for _ in range(40):
            found = torch.full((), float(torch.rand((), generator=g) < 0.3), device=device)
            fn(*ours, found, growth, backoff, interval)
            torch._amp_update_scale_(*theirs, found, growth, backoff, interval)
            assert_bitwise_equal(ours[0], theirs[0])
            assert ours[1].item() == theirs[1].item()


def run_ext(device, steps, scale=1024.0, interval=2, min_scale=None, max_scale=None,
            hysteresis=1):
    """Runs update_scale_ext_ (growth 2, backoff 0.5) over a found_inf sequence."""
    s, t, h = state(device, scale, 0, hysteresis)
    out = []
    for inf in steps:
        found = torch.full((), float(inf), device=device)
        mixprec.ops.update_scale_ext_(s, t, h, found, 2.0, 0.5, interval, min_scale, max_scale,
                                      hysteresis)
        out.append((s.item(), t.item(), h.item()))
    return out


def test_ext_hysteresis(device):
    # hysteresis 3: two overflows absorbed, the third backs off; growth refills.
    seq = run_ext(device, [1, 1, 1, 1, 0, 0, 1], hysteresis=3)
    assert seq == [
        (1024.0, 0, 2),
        (1024.0, 0, 1),
        (512.0, 0, 0),
        (256.0, 0, 0),  # exhausted: every further overflow backs off
        (256.0, 1, 0),
        (512.0, 0, 3),  # growth refills
        (512.0, 0, 2),  # absorbed again
    ]


def test_ext_min_scale(device):
    seq = run_ext(device, [1, 1, 1, 1], scale=8.0, min_scale=2.0)
    assert [s for s, _, _ in seq] == [4.0, 2.0, 2.0, 2.0]


def test_ext_max_scale(device):
    seq = run_ext(device, [0, 0, 0, 0, 0, 0], scale=1024.0, max_scale=3000.0)
    assert [s for s, _, _ in seq] == [1024.0, 2048.0, 2048.0, 3000.0, 3000.0, 3000.0]


def test_ext_defaults_equal_plain_op(device):
    g = torch.Generator().manual_seed(7)
    a, b = state(device, 2.0**16), state(device, 2.0**16, 0, 1)
    for _ in range(200):
        found = torch.full((), float(torch.rand((), generator=g) < 0.2), device=device)
        mixprec.ops.update_scale_(*a, found, 2.0, 0.5, 3)
        mixprec.ops.update_scale_ext_(*b, found, 2.0, 0.5, 3)
        assert_bitwise_equal(a[0], b[0])
        assert a[1].item() == b[1].item()


def test_ext_kernel_equals_reference(device):
    g = torch.Generator().manual_seed(99)
    kw = dict(min_scale=0.75, max_scale=2.0**20, hysteresis=2)
    a, b = state(device, 512.0, 0, 2), state(device, 512.0, 0, 2)
    for _ in range(300):
        found = torch.full((), float(torch.rand((), generator=g) < 0.4), device=device)
        mixprec.ops.update_scale_ext_(*a, found, 3.0, 0.3, 2, **kw)
        _reference.update_scale_ext_(*b, found, 3.0, 0.3, 2, **kw)
        for x, y in zip(a, b):
            assert_bitwise_equal(x, y)


@pytest.mark.parametrize("ext", [False, True], ids=["plain", "ext"])
def test_statistics_equal_the_torch_ops(device, ext):
    """With ``counts`` and ``prev_scale`` the kernel counts the update as the torch ops of
    ``_reference._count_update`` (the scaler's previous Python statistics) do, bit for bit
    over random sequences: NaN and inf flags, growth past float32's range, bounds that stop
    a back-off, hysteresis, and a scale set between updates (counted against prev_scale)."""
    g = torch.Generator().manual_seed(51)
    for _trial in range(12):
        init = float(torch.empty(()).uniform_(-10, 126, generator=g).exp2())
        interval = int(torch.randint(1, 4, (), generator=g))
        kw = ({"min_scale": init / 4, "max_scale": init * 8, "hysteresis": 2} if ext else {})
        runs = {}
        for impl in ("kernel", "reference"):
            s, t, h = state(device, init, hyst=2)
            counts = torch.tensor([0, 0, 0, 0, -1], dtype=torch.int64, device=device)
            runs[impl] = (s, t, h, counts, s.clone())
        for step in range(30):
            r = float(torch.rand((), generator=g))
            found = torch.full((), float("nan") if r < 0.05 else float(r < 0.35), device=device)
            if step % 11 == 10:  # set from outside: the next update compares to prev_scale
                for s, *_ in runs.values():
                    s.fill_(init * 2)
            for impl, (s, t, h, counts, prev) in runs.items():
                mod = mixprec.ops if impl == "kernel" else _reference
                if ext:
                    mod.update_scale_ext_(s, t, h, found, 2.0, 0.5, interval, **kw,
                                          counts=counts, prev_scale=prev)
                else:
                    mod.update_scale_(s, t, found, 2.0, 0.5, interval, counts, prev)
            for a, b in zip(runs["kernel"], runs["reference"]):
                assert_bitwise_equal(a, b)
        steps, skipped, inc, dec, last = runs["kernel"][3].tolist()
        assert steps == 30 and 0 < skipped < 30 and inc + dec > 0 and last >= 0


def test_statistics_equal_the_scaler_tracker(device):
    """The kernel's counts equal those of the scaler's own torch-op path
    (``_StatsTracker.record``, kept for updates to a given new_scale) in the same run."""
    from mixprec.amp.stats import _StatsTracker

    ours, theirs = state(device, 1024.0), state(device, 1024.0)
    kernel_side, op_side = _StatsTracker(), _StatsTracker()
    for step, inf in enumerate([0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0]):
        found = torch.full((), float(inf), device=device)
        if step == 6:
            ours[0].fill_(3.0)
            theirs[0].fill_(3.0)
        mixprec.ops.update_scale_(*ours, found, 2.0, 0.5, 2, *kernel_side.kernel_state(ours[0]))
        op_side.start(theirs[0])
        mixprec.ops.update_scale_(*theirs, found, 2.0, 0.5, 2)
        op_side.record(found, theirs[0])
        assert kernel_side.read() == op_side.read()
        assert_bitwise_equal(kernel_side._prev, op_side._prev)
    assert kernel_side.read() == (11, 3, 3, 4, 5)  # (the scale set at step 6 counts as a decrease)
