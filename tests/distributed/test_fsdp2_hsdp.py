"""mixprec on HSDP (``fully_shard`` over a 2 x 2 (replicate, shard) mesh): four gloo
processes on CPU, spawned once for the module (tests/distributed/_fsdp2_cases.py ``run_hsdp``).
The clip norm counts each shard once (reduced over the shard dimension only), an inf in
one process's shard makes all four skip, the params match an unsharded run, and so does
8-bit state, its maxima laid out as the params (replicated over the replicate dimension)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import _fsdp2_cases

WORLD = 4
pytestmark = [_fsdp2_cases.needs_fsdp2,
              pytest.mark.skipif(_fsdp2_cases.DEVICE != "cpu",
                                 reason="the 2 x 2 mesh runs on CPU (4 gloo processes)")]


@pytest.fixture(scope="module")
def results() -> Dict[int, Dict[str, Any]]:
    return _fsdp2_cases.spawn(WORLD, "run_hsdp")


@pytest.mark.parametrize("case", ["clip_folded", "clip_unfused", "inf_rank3"])
def test_hsdp_params_equal_unsharded_bitwise(results, case):
    for k in range(WORLD):
        r = results[k][case]
        assert r["placements"] == ["(Replicate(), Shard(dim=0))"]
        assert r["bitwise"], (k, r["max_diff"])


@pytest.mark.parametrize("case", ["clip_folded", "clip_unfused"])
def test_hsdp_clip_norm_counts_each_shard_once(results, case):
    for k in range(WORLD):
        for sharded, ref in results[k][case]["norms"]:
            assert sharded == pytest.approx(ref, rel=1e-6, abs=0)


def test_hsdp_inf_in_one_shard_skips_everywhere(results):
    for k in range(WORLD):
        r = results[k]["inf_rank3"]
        assert [s for s, _ in r["skipped"]] == [False, True, False, False]
        assert r["scales"] == results[0]["inf_rank3"]["scales"]


@pytest.mark.parametrize("cls", ["AdamW8bit", "SGD8bit"])
def test_hsdp_8bit_state_sharded_equals_unsharded(results, cls):
    for k in range(WORLD):
        r = results[k]["eight_bit"][cls]
        assert r["bitwise"] and r["codes_dtensor"], k
        assert r["absmax_placements"] == "(Replicate(), Shard(dim=0))"
