"""The FP8 level on FSDP2 (``fully_shard``): two gloo processes on CPU, spawned once for the
module (tests/distributed/_fp8_fsdp2_cases.py), each comparing a converted, sharded model with its
unsharded twin, per recipe, in AUTOMATIC and MANUAL mode, with mixprec's AdamW (32- and
8-bit moments), the scaler and clipping. FSDP2's float8 all-gather is refused (gloo cannot
all-gather float8; tests/train/test_fp8.py tests the refusal)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import _fp8_fsdp2_cases
import _fsdp2_cases

pytestmark = _fsdp2_cases.needs_fsdp2
WORLD = 2


@pytest.fixture(scope="module")
def results() -> Dict[int, Dict[str, Any]]:
    pytest.importorskip("torchao.float8", reason="the FP8 level needs torchao")
    if _fsdp2_cases.DEVICE != "cpu":
        pytest.skip("the FP8 FSDP2 cases run on the CPU (gloo)")
    return _fp8_fsdp2_cases.spawn(WORLD)


@pytest.mark.parametrize("case", sorted(_fp8_fsdp2_cases.CASES))
def test_sharded_fp8_model_equals_unsharded_bitwise(results, case):
    for rank in range(WORLD):
        r = results[rank][case]
        assert r["bitwise"], f"rank {rank}: max |diff| {r['max_diff']}"
        assert r["losses"][0] == r["losses"][1]
        # converted: the middle linears, sharded and unsharded alike
        assert r["float8"] == [["2", "5"], ["2", "5"]]
        # sharded: the state is DTensors (plain local shards); unsharded: plain tensors
        assert r["state_types"] == [["DTensor"], ["Tensor"]]
        # 8-bit: the moments of the 4 weights are uint8 codes (2 each), sharded or not
        assert r["codes8"] == ([8, 8] if "8bit" in case else [0, 0])
    assert results[0][case]["losses"] == results[1][case]["losses"]


def test_converting_after_fully_shard_is_refused_with_the_order(results):
    for rank in range(WORLD):
        msg = results[rank]["convert_after_shard"]
        assert msg is not None and "sharded (fully_shard) and not converted" in msg
        assert "convert_model(model, recipe)" in msg and "then fully_shard" in msg
