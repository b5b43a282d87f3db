"""unscale_and_norm_: one pass equals unscale_ followed by clip_grad_norm_'s norm."""

from __future__ import annotations

import pytest
import torch

import mixprec
from conftest import assert_bitwise_equal
from mixprec import _reference

NORMS = [2.0, 1.0, float("inf"), 3.0, 0.5]


def torch_norm_after_unscale(grads, inv, norm_type):
    grads = [g.clone() for g in grads]
    f = torch.zeros((), device=grads[0].device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, f, torch.full((), inv,
                                                                          device=grads[0].device))
    # torch's own clip_grad_norm_ on the unscaled grads, once as they are (its native
    # precision) and once in float64 (the exact value of the same formula).
    totals = []
    for dtype in (None, torch.float64):
        params = [torch.nn.Parameter(torch.empty_like(g, dtype=dtype or g.dtype)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone().to(p.dtype)
        totals.append(torch.nn.utils.clip_grad_norm_(params, max_norm=float("inf"),
                                                     norm_type=norm_type))
    return grads, f, totals


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm_type", NORMS)
def test_matches_torch_unscale_then_clip_norm(device, dtype, norm_type):
    sizes = [3, 1000, 70_001, 200_003, 17]
    grads = [(torch.randn(n, dtype=torch.float64) * 300).to(dtype).to(device) for n in sizes]
    expected_grads, f_t, (native, exact) = torch_norm_after_unscale(grads, 1 / 256, norm_type)
    found = torch.zeros((), device=device)
    norm = mixprec.ops.unscale_and_norm_(grads, found, torch.full((), 1 / 256, device=device),
                                         norm_type)
    assert norm.dtype == torch.float32 and norm.shape == () and norm.device == grads[0].device
    torch.testing.assert_close(norm.double(), exact, rtol=1e-6, atol=0)
    # Against torch's native path too, where that path is itself accurate to 1e-6: fp32 grads
    # with norm 2 or inf. (Its fp16 norms are fp16-accurate, and its fp32 L1/Lp sums over
    # 270k elements drift by ~5e-6 from the exact value that we do match.)
    if dtype == torch.float32 and norm_type in (2.0, float("inf")):
        torch.testing.assert_close(norm, native, rtol=1e-6, atol=0)
    for a, b in zip(grads, expected_grads):
        assert_bitwise_equal(a, b)  # the unscale part is still bitwise torch's
    assert found.item() == f_t.item() == 0.0


@pytest.mark.parametrize("norm_type", NORMS)
def test_bf16_mixed_and_strided_vs_reference(device, norm_type):
    grads = [
        (torch.randn(5000) * 10).to(torch.bfloat16).to(device),
        (torch.randn(40, 30) * 10).to(device).t(),
        (torch.randn(70_000) * 10).half().to(device),
        (torch.randn(90, 9) * 10).double().to(device)[::2],
    ]
    ref = [g.clone() for g in grads]
    f1, f2 = torch.zeros((), device=device), torch.zeros((), device=device)
    inv = torch.full((), 0.25, device=device)
    n1 = mixprec.ops.unscale_and_norm_(grads, f1, inv, norm_type)
    n2 = _reference.unscale_and_norm_(ref, f2, inv, norm_type)
    torch.testing.assert_close(n1, n2, rtol=1e-6, atol=0)
    for a, b in zip(grads, ref):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_nonfinite_sets_found_inf_and_norm(device, value, norm_type):
    grads = [torch.randn(100_000, device=device), torch.randn(7, device=device)]
    grads[1][-1] = value
    found = torch.zeros((), device=device)
    norm = mixprec.ops.unscale_and_norm_(grads, found, torch.full((), 0.5, device=device),
                                         norm_type)
    assert found.item() == 1.0
    assert not torch.isfinite(norm).item()
    if value != value:
        assert torch.isnan(norm).item()


def test_deterministic(device):
    grads = [torch.randn(300_000, device=device) for _ in range(3)]
    norms = []
    for _ in range(3):
        gs = [g.clone() for g in grads]
        norms.append(mixprec.ops.unscale_and_norm_(gs, torch.zeros((), device=device),
                                                   torch.full((), 0.5, device=device)))
    assert norms[0].item() == norms[1].item() == norms[2].item()
