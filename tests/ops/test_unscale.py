"""unscale_and_check_ / check_finite_: bitwise against torch's op, and against a
float64 reference for bf16 (which torch's op rejects)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import _reference
import mixprec
from _helpers import assert_bitwise_equal, bits

TORCH_DTYPES = [torch.float32, torch.float16, torch.float64]  # what torch's op accepts
ALL_DTYPES = TORCH_DTYPES + [torch.bfloat16]
INV_SCALES = [1.0 / 65536.0, 1.0, 3.0]

# Sizes: empty, tiny, odd, > one CPU chunk (32768) and > one CUDA chunk (65536).
SIZES = [0, 1, 3, 17, 1000, 40_000, 200_003]


def rand_grads(sizes: list[int], dtype: torch.dtype, device: str, scale: float = 1000.0):
    return [(torch.randn(n, dtype=torch.float64) * scale).to(dtype).to(device) for n in sizes]


def strided_views(dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """Non-contiguous grads: transposed, sliced with a step, channels-last, expanded-free."""
    base = (torch.randn(64, 96, dtype=torch.float64) * 100).to(dtype).to(device)
    t = base.t()  # dense but not contiguous
    s = (torch.randn(300, 8, dtype=torch.float64) * 100).to(dtype).to(device)[::3, 1:7]  # gappy
    cl = (torch.randn(2, 3, 5, 7, dtype=torch.float64) * 100).to(dtype).to(device)
    cl = cl.contiguous(memory_format=torch.channels_last)
    return [t, s, cl]


def run_both(
    grads: list[torch.Tensor],
    inv: float,
    found0: float = 0.0,
    torch_op: Callable = torch._amp_foreach_non_finite_check_and_unscale_,
):
    device = grads[0].device if grads else torch.device("cpu")
    ours = [g.clone() for g in grads]
    theirs = [g.clone() for g in grads]
    f_ours = torch.full((), found0, device=device)
    f_theirs = torch.full((), found0, device=device)
    inv_t = torch.full((), inv, device=device)
    mixprec.ops.unscale_and_check_(ours, f_ours, inv_t)
    if theirs:
        torch_op(theirs, f_theirs, inv_t)
    return ours, theirs, f_ours, f_theirs


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("inv", INV_SCALES)
def test_bitwise_equal_to_torch_contiguous(device, dtype, inv):
    grads = rand_grads(SIZES, dtype, device)
    ours, theirs, f_ours, f_theirs = run_both(grads, inv)
    for a, b in zip(ours, theirs):
        assert_bitwise_equal(a, b)
    assert f_ours.item() == f_theirs.item() == 0.0
    if inv != 1.0:  # the data really changed (a test on zeros would prove nothing)
        assert not torch.equal(bits(ours[-1]), bits(grads[-1]))


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_bitwise_equal_to_torch_strided(device, dtype):
    grads = strided_views(dtype, device)
    strides = [g.stride() for g in grads]
    ours, theirs, f_ours, f_theirs = run_both(grads, 1.0 / 1024)
    # run_both clones (clone keeps strides for dense tensors); also run in place on views
    f = torch.zeros((), device=device)
    mixprec.ops.unscale_and_check_(grads, f, torch.full((), 1.0 / 1024, device=device))
    for g, a, b, st_ in zip(grads, ours, theirs, strides):
        assert_bitwise_equal(a, b)
        assert_bitwise_equal(g, b)
        assert g.stride() == st_
    assert f.item() == 0.0 and f_ours.item() == f_theirs.item() == 0.0


def test_strided_view_writes_through_to_base(device):
    base = (torch.randn(50, 40) * 10).to(device)
    view = base[::2, ::3]
    expected = base.clone()
    expected[::2, ::3] *= 0.5
    mixprec.ops.unscale_and_check_(
        [view], torch.zeros((), device=device), torch.full((), 0.5, device=device)
    )
    assert torch.equal(base, expected)  # untouched elements stay untouched


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", ["first_of_first", "last_of_first", "first_of_last",
                                   "last_of_last"])
def test_nonfinite_positions(device, dtype, value, where):
    grads = rand_grads([70_001, 5, 131_075], dtype, device)
    idx_t = 0 if where.endswith("first") else -1
    idx_e = 0 if where.startswith("first") else -1
    grads[idx_t].view(-1)[idx_e] = value
    ours, theirs, f_ours, f_theirs = run_both(grads, 0.125)
    assert f_ours.item() == 1.0 and f_theirs.item() == 1.0
    for a, b in zip(ours, theirs):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_found_inf_already_set_stays_set(device, dtype):
    grads = rand_grads([10, 100_000], dtype, device)
    found = torch.ones((), device=device)
    mixprec.ops.unscale_and_check_(grads, found, torch.full((), 0.5, device=device))
    assert found.item() == 1.0
    mixprec.ops.check_finite_(grads, found)
    assert found.item() == 1.0


def test_found_inf_shape_one(device):
    """torch accepts found_inf of shape [1] too; so do we."""
    grads = rand_grads([100], torch.float32, device)
    grads[0][3] = float("nan")
    found = torch.zeros(1, device=device)
    mixprec.ops.unscale_and_check_(grads, found, torch.full((1,), 0.5, device=device))
    assert found.tolist() == [1.0]


def test_empty_list_and_zero_size(device):
    found = torch.zeros((), device=device)
    inv = torch.full((), 0.5, device=device)
    mixprec.ops.unscale_and_check_([], found, inv)
    mixprec.ops.check_finite_([], found)
    empties = [torch.empty(0, device=device), torch.empty(3, 0, device=device)]
    mixprec.ops.unscale_and_check_(empties, found, inv)
    assert found.item() == 0.0
    assert mixprec.ops.unscale_and_norm_(empties, found, inv).item() == 0.0


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_more_tensors_than_one_launch(device, dtype):
    # 2,000 tensors exceed one CUDA launch's table (~1,500) and split on CPU too.
    sizes = [int(s) for s in torch.randint(1, 700, (2000,))]
    grads = rand_grads(sizes, dtype, device)
    grads[1999][-1] = float("inf")
    ours, theirs, f_ours, f_theirs = run_both(grads, 1.0 / 8)
    assert f_ours.item() == f_theirs.item() == 1.0
    for a, b in zip(ours, theirs):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_mixed_dtype_list_in_one_call(device, dtype):
    """One call over fp32/fp16/bf16/fp64 equals torch per dtype (bf16: reference)."""
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, dtype]
    grads = [rand_grads([n], dt, device)[0] for n, dt in zip([5, 70_000, 1001, 33, 4097], dtypes)]
    grads[2][0] = float("nan")  # the bf16 one
    ours = [g.clone() for g in grads]
    found = torch.zeros((), device=device)
    inv = torch.full((), 1.0 / 32, device=device)
    mixprec.ops.unscale_and_check_(ours, found, inv)
    assert found.item() == 1.0
    for g, a in zip(grads, ours):
        ref = [g.clone()]
        f = torch.zeros((), device=device)
        if g.dtype == torch.bfloat16:
            _reference.unscale_and_check_(ref, f, inv)
        else:
            torch._amp_foreach_non_finite_check_and_unscale_(ref, f, inv)
        assert_bitwise_equal(a, ref[0], any_nan_payload=g.dtype == torch.bfloat16)


@pytest.mark.parametrize("inv", INV_SCALES)
def test_bf16_against_float64_reference(device, inv):
    grads = rand_grads(SIZES, torch.bfloat16, device)
    expected = [(g.double() * inv).to(torch.bfloat16) for g in grads]
    found = torch.zeros((), device=device)
    mixprec.ops.unscale_and_check_(grads, found, torch.full((), inv, device=device))
    for a, e in zip(grads, expected):
        # float32 math then one rounding equals the float64 rounding for a power-of-two
        # or exactly representable inv; for inv = 3 allow one bf16 ulp of double rounding.
        if inv == 3.0:
            torch.testing.assert_close(a, e, rtol=2**-7, atol=0)
        else:
            assert_bitwise_equal(a, e)
    assert found.item() == 0.0
    grads[-1][-1] = float("inf")
    mixprec.ops.unscale_and_check_(grads, found, torch.full((), inv, device=device))
    assert found.item() == 1.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inv", INV_SCALES + [2.0**-20, 1.5])
def test_every_16bit_pattern_against_torch_conversion(device, dtype, inv):
    """Every fp16 / bf16 bit pattern (zeros, subnormals, the overflow edge, inf, NaNs), through
    the vector loop and the scalar tail, rounds as torch's float32 -> dtype conversion."""
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    grads = [torch.cat([patterns, patterns[:7]]).view(dtype).to(device)]
    expected = (grads[0].float() * inv).to(dtype)
    found = torch.zeros((), device=device)
    mixprec.ops.unscale_and_check_(grads, found, torch.full((), inv, device=device))
    assert_bitwise_equal(grads[0], expected, any_nan_payload=True)
    assert found.item() == 1.0


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_matches_reference_bitwise(device, dtype):
    """The pure-PyTorch fallback is bitwise equal to the kernels (it is also the oracle)."""
    grads = rand_grads(SIZES + [7], dtype, device) + strided_views(dtype, device)
    grads[3][5] = float("-inf")
    ref = [g.clone() for g in grads]
    f1, f2 = torch.zeros((), device=device), torch.zeros((), device=device)
    inv = torch.full((), 1.0 / 3.0, device=device)
    mixprec.ops.unscale_and_check_(grads, f1, inv)
    _reference.unscale_and_check_(ref, f2, inv)
    assert f1.item() == f2.item() == 1.0
    for a, b in zip(grads, ref):
        assert_bitwise_equal(a, b, any_nan_payload=dtype == torch.bfloat16)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_check_finite_reads_only(device, dtype):
    grads = rand_grads(SIZES, dtype, device) + strided_views(dtype, device)
    before = [bits(g) for g in grads]
    found = torch.zeros((), device=device)
    mixprec.ops.check_finite_(grads, found)
    assert found.item() == 0.0
    grads[-2][-1, -1] = float("nan")  # last element of a gappy strided view
    before[-2] = bits(grads[-2])
    mixprec.ops.check_finite_(grads, found)
    assert found.item() == 1.0
    for g, b in zip(grads, before):
        assert torch.equal(bits(g), b)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=0, max_size=12),
    dtype=st.sampled_from(TORCH_DTYPES),
    inv=st.sampled_from([2.0**-16, 2.0**-3, 0.3, 1.0, 7.0]),
    bad=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 4999),
                                       st.sampled_from([float("inf"), float("-inf"),
                                                        float("nan")]))),
)
def test_property_against_torch_cpu(sizes, dtype, inv, bad):
    grads = rand_grads(sizes, dtype, "cpu")
    if bad is not None and grads:
        t, e, v = bad
        g = grads[t % len(grads)]
        if g.numel():
            g[e % g.numel()] = v
    ours, theirs, f_ours, f_theirs = run_both(grads, inv)
    assert f_ours.item() == f_theirs.item()
    for a, b in zip(ours, theirs):
        assert_bitwise_equal(a, b)
