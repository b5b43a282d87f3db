"""Fixtures: the ``device`` parametrization, a fresh seed per test, and the rule that
CUDA tests on a GPU machine need a build with CUDA kernels. Helpers live in _helpers.py."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

import mixprec
from _helpers import DEVICES, HAS_CUDA


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Every test with a ``device`` argument runs on "cpu", and on "cuda" where a GPU is."""
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed(request: pytest.FixtureRequest) -> None:
    # Fresh but reproducible random data per test: seed from the test's id.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A CUDA test on a machine with a GPU fails (it does not skip, and it does not
    quietly test the pure-PyTorch fallback) when mixprec was built without CUDA
    kernels. The CPU-only build's own run says so with MIXPREC_EXPECT_CUDA_KERNELS=0."""
    if (
        HAS_CUDA
        and item.get_closest_marker("cuda") is not None
        and not mixprec.has_cuda_kernels()
        and os.environ.get("MIXPREC_EXPECT_CUDA_KERNELS") != "0"
    ):
        pytest.fail(
            "a GPU is present but mixprec was built without CUDA kernels "
            f"(build_info: {mixprec.build_info()}); rebuild with MIXPREC_FORCE_CUDA=1, or set "
            "MIXPREC_EXPECT_CUDA_KERNELS=0 to test the CPU-only build's fallback on CUDA",
            pytrace=False,
        )
