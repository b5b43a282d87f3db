"""``MixedPrecisionTrainer.save_state``/``load_state`` on a sharded
(FSDP2) model write and read a DCP directory, so a run resumes on another world size:
saved on 2 gloo ranks and loaded on 4, and 4 -> 2; 32-bit AdamW state, a scaler and an LR
scheduler. The state after the load equals the state at the save, bit for bit, and the
resumed run ends where the uninterrupted one does (bit for bit: every rank feeds the same
batch, so averaging the equal gradients is exact) -- and where the unsharded run does."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch

import _fsdp2_cases
import _trainer_dcp_cases as cases

pytestmark = _fsdp2_cases.needs_fsdp2


def _bitwise(a: Any, b: Any) -> bool:
    return _fsdp2_cases.bitwise(a, b)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"unsharded": cases.unsharded()}
    for save_world, load_world in ((2, 4), (4, 2)):
        ckpt = str(tmp_path_factory.mktemp(f"dcp{save_world}") / "ckpt")
        out[f"save{save_world}"] = cases.spawn(save_world, "save_and_go_on", ckpt)
        out[f"load{save_world}to{load_world}"] = cases.spawn(load_world, "load_and_go_on",
                                                             ckpt)
    return out


@pytest.mark.parametrize("save_world,load_world", [(2, 4), (4, 2)])
def test_the_checkpoint_is_a_dcp_directory(runs: Dict[str, Any], save_world: int,
                                           load_world: int) -> None:
    saved = runs[f"save{save_world}"][0]
    assert saved["isdir"]
    assert ".metadata" in saved["files"] and "trainer.pt" in saved["files"]


@pytest.mark.parametrize("save_world,load_world", [(2, 4), (4, 2)])
def test_the_loaded_state_is_the_saved_state_bit_for_bit(runs: Dict[str, Any],
                                                         save_world: int,
                                                         load_world: int) -> None:
    at_save = runs[f"save{save_world}"][0]["at_save"]
    for rank, r in runs[f"load{save_world}to{load_world}"].items():
        loaded = r["loaded"]
        assert _bitwise(loaded["params"], at_save["params"]), rank
        assert _bitwise(loaded["state"], at_save["state"]), rank
        assert loaded["scale"] == at_save["scale"] and loaded["lr"] == at_save["lr"]
        assert loaded["steps"] == at_save["steps"] == cases.SAVED_AT


@pytest.mark.parametrize("save_world,load_world", [(2, 4), (4, 2)])
def test_the_resumed_run_ends_where_the_uninterrupted_one_does(runs: Dict[str, Any],
                                                               save_world: int,
                                                               load_world: int) -> None:
    uninterrupted = runs[f"save{save_world}"][0]["final"]
    reference = runs["unsharded"]
    assert _bitwise(uninterrupted["params"], reference["params"])
    for rank, r in runs[f"load{save_world}to{load_world}"].items():
        final = r["final"]
        assert _bitwise(final["params"], uninterrupted["params"]), rank
        assert _bitwise(final["state"], uninterrupted["state"]), rank
        assert final["scale"] == uninterrupted["scale"] and final["lr"] == uninterrupted["lr"]


def test_a_dcp_directory_is_refused_by_an_unsharded_trainer(tmp_path: Any) -> None:
    from _unchanged import assert_unchanged, snapshot

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    t = cases.make_trainer(False)
    cases.train(t, 0, 1)
    before = snapshot(t)
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match="this trainer's model is not sharded"):
        t.load_state(ckpt)
    assert_unchanged(before, snapshot(t))
    assert torch.equal(rng, torch.get_rng_state())
