"""Gradient release on FSDP2, two gloo processes: each shard is stepped in FSDP2's
reduce-scatter (its post-accumulate-grad hook) and its grad freed; the params and optimizer
state equal the sharded run without release and the unsharded run, bit for bit."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import _fsdp2_cases

pytestmark = _fsdp2_cases.needs_fsdp2
WORLD = _fsdp2_cases.WORLD


@pytest.fixture(scope="module")
def results() -> Dict[int, Dict[str, Any]]:
    return _fsdp2_cases.spawn(WORLD, "_release_cases.run")


@pytest.mark.parametrize("case", ["bf16_adamw", "fp32_adamw8bit", "bf16_sgd"])
def test_release_on_fsdp2_gives_the_bits_of_the_run_without(results, case):
    for rank in range(WORLD):
        r = results[rank][case]
        assert r["params_vs_plain"] and r["state_vs_plain"], rank
        assert r["params_vs_unsharded"], rank
        assert r["freed_in_backward"] == [True] * 4, rank
        # bucket_bytes=1: a bucket per param with a non-empty shard (an empty one waits
        # for the next)
        assert r["buckets"] == 4 * r["nonempty_shards"], rank
        assert r["coded"] is ("8bit" in case)
