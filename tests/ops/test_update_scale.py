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
