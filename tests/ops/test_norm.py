"""unscale_and_norm_: one pass equals unscale_ followed by clip_grad_norm_'s norm.
check_finite_and_norm_: the same norm and found_inf, grads left untouched."""

from __future__ import annotations

import pytest
import torch

import _reference
import mixprec
from _helpers import assert_bitwise_equal

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


def _exact_scaled_norm(grads, inv, norm_type):
    """float64 norm of the grads times inv (a power of two, so g * inv is exact anyway)."""
    parts = [torch.linalg.vector_norm(g.double().cpu() * inv, norm_type)
             for g in grads if g.numel() > 0]
    return torch.linalg.vector_norm(torch.stack(parts), norm_type)


def _mixed_grads(device):
    g = torch.Generator().manual_seed(11)
    return [
        (torch.randn(70_001, generator=g) * 300).half().to(device),
        (torch.randn(5000, generator=g) * 10).bfloat16().to(device),
        (torch.randn(40, 30, generator=g) * 10).to(device).t(),          # strided
        torch.empty(0, device=device),                                     # zero-size
        (torch.randn(300_003, generator=g) * 10).to(device),              # > one chunk
        (torch.randn(90, 9, generator=g) * 10).double().to(device)[::2],  # strided fp64
    ]


@pytest.mark.parametrize("norm_type", NORMS)
def test_check_finite_and_norm_reads_only_and_matches_unscale_and_norm(device, norm_type):
    grads = _mixed_grads(device)
    before = [g.clone() for g in grads]
    inv = torch.full((), 1 / 512, device=device)
    found = torch.zeros((), device=device)
    norm = mixprec.ops.check_finite_and_norm_(grads, found, inv, norm_type)
    for a, b in zip(grads, before):
        assert_bitwise_equal(a, b)  # read only
    assert found.item() == 0.0
    assert norm.dtype == torch.float32 and norm.shape == () and norm.device == found.device
    # The same per-element math as the in-place op (u = g * inv in float32, not rounded back).
    in_place = mixprec.ops.unscale_and_norm_([g.clone() for g in grads],
                                             torch.zeros((), device=device), inv, norm_type)
    assert_bitwise_equal(norm, in_place)
    # And the float64 value of that math within 1e-6.
    exact = _exact_scaled_norm(grads, 1 / 512, norm_type)
    torch.testing.assert_close(norm.double().cpu(), exact, rtol=1e-6, atol=0)
    ref = _reference.check_finite_and_norm_(before, torch.zeros((), device=device), inv,
                                            norm_type)
    torch.testing.assert_close(norm, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_check_finite_and_norm_nonfinite(device, impl, where, value):
    fn = mixprec.ops.check_finite_and_norm_ if impl == "kernel" else \
        _reference.check_finite_and_norm_
    grads = [torch.randn(n, device=device).to(dt)
             for n, dt in ((9000, torch.float16), (77, torch.bfloat16), (100_000, torch.float32))]
    if where == "first":
        grads[0][0] = value
    else:
        grads[-1][-1] = value
    before = [g.clone() for g in grads]
    found = torch.zeros((), device=device)
    norm = fn(grads, found, torch.full((), 0.5, device=device), 2.0)
    assert found.item() == 1.0
    assert not torch.isfinite(norm).item()
    for a, b in zip(grads, before):
        assert_bitwise_equal(a, b)
    # found_inf already set stays set on clean input
    fn([torch.randn(10, device=device)], found, torch.full((), 0.5, device=device), 2.0)
    assert found.item() == 1.0


def test_check_finite_and_norm_empty_and_expanded(device):
    found = torch.zeros((), device=device)
    inv = torch.full((), 0.5, device=device)
    assert mixprec.ops.check_finite_and_norm_([], found, inv).item() == 0.0
    # Read only, so an expanded (overlapping) tensor is fine: each element counts once per
    # position, as in torch.linalg.vector_norm of the expanded tensor.
    base = torch.randn(1, 1000, device=device)
    norm = mixprec.ops.check_finite_and_norm_([base.expand(8, 1000)], found, inv)
    torch.testing.assert_close(norm, torch.linalg.vector_norm(base.expand(8, 1000) * 0.5),
                               rtol=1e-6, atol=0)
    assert found.item() == 0.0
