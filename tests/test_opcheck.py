"""torch.library.opcheck on every op, and the ops inside torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

import mixprec
from _helpers import assert_bitwise_equal

if not mixprec.has_extension():
    pytest.skip("opcheck needs the compiled extension", allow_module_level=True)


def _grads(device):
    gs = [torch.randn(n, device=device) * 10 for n in (1, 37, 5000)]
    return gs + [torch.randn(300, device=device).half(), torch.randn(9, device=device).bfloat16()]


def _f(device):
    return torch.zeros((), device=device)


def _inv(device):
    return torch.full((), 0.25, device=device)


def _i32(device, v):
    return torch.full((), v, dtype=torch.int32, device=device)


# (test id, op, args builder(device) -> (args, kwargs)). One entry per case: each
# gets its own test id, and none can be left out of the parametrization.
_SAMPLES = [
    ("unscale_and_check_", "unscale_and_check_",
     lambda d: ((_grads(d), _f(d), _inv(d)), {})),
    ("unscale_and_check_-empty", "unscale_and_check_", lambda d: (([], _f(d), _inv(d)), {})),
    ("check_finite_", "check_finite_", lambda d: ((_grads(d), _f(d)), {})),
    ("unscale_and_norm_-p2", "unscale_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 2.0), {})),
    ("unscale_and_norm_-pinf", "unscale_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), float("inf")), {})),
    ("check_finite_and_norm_-p2", "check_finite_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 2.0), {})),
    ("check_finite_and_norm_-p1.5", "check_finite_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 1.5), {})),
    ("update_scale_", "update_scale_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), torch.ones((), device=d), 2.0, 0.5,
                 2), {})),
    ("update_scale_ext_", "update_scale_ext_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), _i32(d, 2),
                 torch.ones((), device=d), 2.0, 0.5, 2),
                {"min_scale": 1.0, "max_scale": 1024.0, "hysteresis": 2})),
]


@pytest.mark.parametrize(("op_name", "build"), [pytest.param(op, build, id=name)
                                                for name, op, build in _SAMPLES])
def test_opcheck(device, op_name, build):
    args, kwargs = build(device)
    torch.library.opcheck(getattr(torch.ops.mixprec, op_name).default, args, kwargs)


# The ops whose opcheck lives elsewhere (tests/test_optim.py).
_OPCHECKED_ELSEWHERE = {"fused_adam_", "fused_sgd_"}


def test_every_op_has_an_opcheck_sample():
    """A new op registered in csrc/registration.cpp needs a sample here (or in test_optim)."""
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("mixprec::")}
    sampled = {op for _, op, _ in _SAMPLES}
    assert registered, "no mixprec op is registered"
    assert registered == sampled | _OPCHECKED_ELSEWHERE, (
        f"without an opcheck sample: {sorted(registered - sampled - _OPCHECKED_ELSEWHERE)}; "
        f"sampled but not registered: {sorted((sampled | _OPCHECKED_ELSEWHERE) - registered)}")


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
