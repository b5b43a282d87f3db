"""mixprec on FSDP2 (``fully_shard``, DTensor params and grads): two gloo processes on
CPU, spawned once for the module (tests/distributed/_fsdp2_cases.py runs every case in each), each
comparing a sharded model with an unsharded copy trained on the same data.

On a GPU machine, ``MIXPREC_FSDP2_DEVICE=cuda MIXPREC_FSDP2_WORLD=1`` runs the same cases
with nccl on one GPU (the tests that need a second rank skip)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import _fsdp2_cases

WORLD = _fsdp2_cases.WORLD
pytestmark = _fsdp2_cases.needs_fsdp2
needs_two = pytest.mark.skipif(WORLD < 2, reason="needs a second rank")


@pytest.fixture(scope="module")
def results() -> Dict[int, Dict[str, Any]]:
    return _fsdp2_cases.spawn(WORLD, "run_all")


BITWISE = ["bf16_adamw", "bf16_adam", "bf16_sgd", "fp16_adamw_scaler", "fp16_sgd_scaler",
           "fp32_adamw", "fp32_policy_bf16", "fp32_policy_fp16_scaler", "bf16_clip_folded",
           "fp32_clip_unfused", "fp16_inf_rank1", "fp16_inf_rank0_sgd"]


@pytest.mark.parametrize("case", BITWISE)
def test_sharded_params_equal_unsharded_bitwise(results, case):
    for rank in range(WORLD):
        r = results[rank][case]
        assert r["bitwise"], f"rank {rank}: max |diff| {r['max_diff']}"
        # the sharded optimizer's state is sharded: DTensors
        assert r["state_types"] == ["DTensor"]


@needs_two
def test_uneven_and_empty_shards(results):
    r0, r1 = results[0]["bf16_adamw"], results[1]["bf16_adamw"]
    # Linear(5,7): 7 rows -> 4+3; LayerNorm(7); Linear(7,3): 3 rows -> 2+1; Linear(3,1):
    # 1 row -> 1+0 (rank 1's shard is empty)
    assert r0["local_numels"] == [20, 4, 4, 4, 14, 2, 3, 1]
    assert r1["local_numels"] == [15, 3, 3, 3, 7, 1, 0, 0]


@pytest.mark.parametrize("case,step,rank", [("fp16_inf_rank1", 1, 1),
                                            ("fp16_inf_rank0_sgd", 2, 0)])
def test_inf_in_one_ranks_shard_skips_on_every_rank(results, case, step, rank):
    scales = None
    for k in range(WORLD):
        r = results[k][case]
        skipped = [s for s, _ in r["skipped"]]
        assert skipped == [i == step for i in range(4)], (k, skipped)
        scales = scales or r["scales"]
        assert r["scales"] == scales  # every rank backs off at the same step
    # backed off at that step (growth_interval=2: the scale doubles every second clean step)
    assert scales[step] < (scales[step - 1] if step else 2.0**10)
    # the unsharded twin, with the inf in its whole grad, skipped the same step
    assert [ref for _, ref in results[0][case]["skipped"]] == [i == step for i in range(4)]


@pytest.mark.parametrize("case", ["bf16_clip_folded", "fp32_clip_unfused"])
def test_clip_norm_is_the_unsharded_norm(results, case):
    for k in range(WORLD):
        for sharded, ref in results[k][case]["norms"]:
            assert sharded == pytest.approx(ref, rel=1e-6, abs=0)
    assert all(results[k][case]["norms"] == results[0][case]["norms"] for k in range(WORLD))


def test_the_op_takes_plain_local_shards(results):
    for k in range(WORLD):
        assert results[k]["plain_tensors_on_shards"]["plain"] == [True] * 4


def test_state_bytes_per_rank_are_one_nth(results):
    total = 0
    for k in range(WORLD):
        m = results[k]["memory"]
        total += m["sharded"]
        # (4 + 4 + 4) bytes of master and moments per element, plus a 4-byte step each
        assert m["sharded"] <= m["unsharded"] / WORLD + 4 * 4 + 12 * 64
    assert abs(total - results[0]["memory"]["unsharded"]) <= 4 * 4 * WORLD


def test_dcp_save_load_continues_bitwise(results):
    for k in range(WORLD):
        r = results[k]["dcp"]
        assert r["bitwise"] and r["masters"]
        assert r["loaded_types"] == ["DTensor"]
        assert r["from_unsharded"]  # a single-device state dict loads, sharded


def test_8bit_dcp_save_load_continues_bitwise(results):
    for k in range(WORLD):
        r = results[k]["dcp8"]
        assert r["bitwise"] and r["masters"]
        # codes, maxima, masters, 32-bit moments: DTensors; the empty maxima of the 1-D
        # params (float32 moments): plain; "quant"
        assert r["loaded_types"] == ["DTensor", "Tensor", "str"]
        assert r["from_unsharded"]  # a single-device 32-bit state dict loads, quantized


@pytest.mark.parametrize("cls", ["AdamW8bit", "SGD8bit"])
def test_8bit_state_sharded_equals_unsharded(results, cls):
    for k in range(WORLD):
        r = results[k]["eight_bit"][cls]
        assert r["bitwise"] and r["codes_dtensor"]


def test_ops_on_dtensor_lists(results):
    for k in range(WORLD):
        r = results[k]["ops"]
        # an inf in rank 1's shard only: both ranks see it, via mixprec.ops and torch.ops
        assert r["check_mixprec"] == 1.0 and r["check_torch"] == 1.0
        for via in ("mixprec", "torch"):
            norm, flag = r[f"norm_{via}"]
            assert flag == 0.0
            assert norm == pytest.approx(r["norm_ref"], rel=1e-6)
            assert r[f"norm_inf_{via}"] == pytest.approx(r["norm_inf_ref"], rel=1e-7)
        assert r["unscale_flag"] == 1.0 and r["unscale_ok"]
        assert r["adam_equal"]
        assert "mixprec.update_scale_ takes plain tensors" in r["update_scale_error"]


@pytest.mark.parametrize("case", ["automatic_bf16", "automatic_fp16", "gradient_scaling_fp32",
                                  "selective_bf16", "adaptive_bf16", "manual_bf16"])
def test_trainer_modes_on_a_sharded_model(results, case):
    for k in range(WORLD):
        r = results[k]["trainer"][case]
        assert r["bitwise"], r
        assert r["losses"][0] == r["losses"][1]


def test_manual_mode_says_to_convert_before_fully_shard(results):
    for k in range(WORLD):
        msg = results[k]["trainer"]["manual_after_shard"]
        assert msg is not None and "convert_params(model, torch.bfloat16)" in msg
        assert "before fully_shard" in msg


def test_manager_monitoring_measures_the_whole_grad(results):
    for k in range(WORLD):
        (sharded, under_s), (ref, under_r) = results[k]["trainer"]["monitor_norms"]
        assert sharded == pytest.approx(ref, rel=1e-6) and under_s == under_r


def test_trainer_checkpoint_of_a_sharded_model_resumes_bitwise(results):
    for k in range(WORLD):
        assert results[k]["trainer"]["trainer_checkpoint"]
