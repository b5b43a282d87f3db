"""Shared fixtures: the devices to run on, bit-level comparison helpers."""

from __future__ import annotations

import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Parametrize over this to get CPU always and CUDA whenever a GPU is present.
DEVICE_PARAMS = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")),
]

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.int32: torch.int32,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (as a same-width integer tensor), for bitwise equality."""
    t = t.contiguous()
    return (t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t).cpu()


def assert_bitwise_equal(
    actual: torch.Tensor, expected: torch.Tensor, any_nan_payload: bool = False
) -> None:
    """Bit-for-bit equality; with ``any_nan_payload``, NaNs need only sit at the same places
    (float->bf16 conversions in different code paths canonicalise NaN payloads differently)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if any_nan_payload:
        nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
        assert torch.equal(nan_a, nan_e), "NaNs at different positions"
        actual = actual.masked_fill(nan_a, 0)
        expected = expected.masked_fill(nan_e, 0)
    assert torch.equal(bits(actual), bits(expected)), (
        f"not bitwise equal: max abs diff "
        f"{(actual.double() - expected.double()).abs().nan_to_num(0).max().item()}"
    )


@pytest.fixture(params=DEVICE_PARAMS)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed(request: pytest.FixtureRequest) -> None:
    # Fresh but reproducible random data per test: seed from the test's id.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
