"""torch.library.opcheck on every op, and the ops inside torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

import mixprec
from conftest import assert_bitwise_equal

if not mixprec.has_extension():
    pytest.skip("opcheck needs the compiled extension", allow_module_level=True)


def _grads(device):
    gs = [torch.randn(n, device=device) * 10 for n in (1, 37, 5000)]
    return gs + [torch.randn(300, device=device).half(), torch.randn(9, device=device).bfloat16()]


def _samples(device):
    f = lambda: torch.zeros((), device=device)  # noqa: E731
    inv = lambda: torch.full((), 0.25, device=device)  # noqa: E731
    i32 = lambda v: torch.full((), v, dtype=torch.int32, device=device)  # noqa: E731
    return [
        (torch.ops.mixprec.unscale_and_check_.default, (_grads(device), f(), inv()), {}),
        (torch.ops.mixprec.unscale_and_check_.default, ([], f(), inv()), {}),
        (torch.ops.mixprec.check_finite_.default, (_grads(device), f()), {}),
        (torch.ops.mixprec.unscale_and_norm_.default, (_grads(device), f(), inv(), 2.0), {}),
        (torch.ops.mixprec.unscale_and_norm_.default, (_grads(device), f(), inv(),
                                                       float("inf")), {}),
        (torch.ops.mixprec.check_finite_and_norm_.default, (_grads(device), f(), inv(), 2.0), {}),
        (torch.ops.mixprec.check_finite_and_norm_.default, (_grads(device), f(), inv(), 1.5), {}),
        (torch.ops.mixprec.update_scale_.default,
         (torch.full((), 8.0, device=device), i32(1), torch.ones((), device=device), 2.0, 0.5, 2),
         {}),
        (torch.ops.mixprec.update_scale_ext_.default,
         (torch.full((), 8.0, device=device), i32(1), i32(2), torch.ones((), device=device), 2.0,
          0.5, 2), {"min_scale": 1.0, "max_scale": 1024.0, "hysteresis": 2}),
    ]


@pytest.mark.parametrize("index", range(9))
def test_opcheck(device, index):
    op, args, kwargs = _samples(device)[index]
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph(device):
    """A whole scaler step (unscale+check, norm, update) compiled as one graph."""

    def step(grads, found_inf, scale, tracker):
        found_inf.zero_()
        inv = scale.double().reciprocal().float()
        norm = torch.ops.mixprec.unscale_and_norm_(grads, found_inf, inv, 2.0)
        torch.ops.mixprec.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 1)
        return norm * 1.0

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    grads = [torch.randn(1000, device=device) * 64, torch.randn(33, device=device) * 64]
    ref_grads = [g.clone() for g in grads]
    state = (torch.zeros((), device=device), torch.full((), 64.0, device=device),
             torch.zeros((), dtype=torch.int32, device=device))
    ref_state = tuple(t.clone() for t in state)
    out = compiled(grads, *state)
    expected = step(ref_grads, *ref_state)
    assert_bitwise_equal(out, expected)
    for a, b in zip(grads + list(state), ref_grads + list(ref_state)):
        assert_bitwise_equal(a, b)
    assert state[1].item() == 128.0  # clean step with interval 1 grew the scale

    grads[0][5] = float("inf")
    compiled(grads, *state)
    assert state[0].item() == 1.0 and state[1].item() == 64.0


def test_torch_compile_check_finite(device):
    @torch.compile(fullgraph=True)
    def has_nonfinite(tensors, found_inf):
        torch.ops.mixprec.check_finite_(tensors, found_inf)
        return found_inf + 0

    found = torch.zeros((), device=device)
    ts = [torch.randn(10, device=device), torch.randn(5, device=device)]
    assert has_nonfinite(ts, found).item() == 0.0
    ts[1][4] = float("nan")
    assert has_nonfinite(ts, found).item() == 1.0
