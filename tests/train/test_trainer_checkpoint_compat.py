"""Checkpoints written by the one-file trainer (before it was split into parts) still load.

``tests/data/trainer_<case>.pt`` were written by ``save_state`` at commit b6be011 (see
``tests/data/make_trainer_checkpoints.py``), with what that trainer reported at the save
and its parameters after training on from there in ``trainer_<case>_expected.pt``.

What those files hold was computed on another machine, partly through torch's CPU GEMMs
(the params, the losses, the grad norms), whose bits depend on the CPU. So the tests
compare the loaded state with the file (bits read back, not recomputed) and the values the
old trainer reported at the save; training on from the file is compared with training on,
here, from the same state saved in today's form, never with the stored params after.
"""

from __future__ import annotations

import pytest
import torch

from _helpers import (
    DATA,
    assert_bitwise_equal,
    assert_same_tree,
    load_module,
    load_stored,
    torch_threads,
)

CASES = ("automatic_fp16", "manual_bf16", "adaptive_fp16")


def _generator():
    return load_module("make_trainer_checkpoints", DATA / "make_trainer_checkpoints.py")


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


#: stats() keys newer than the files in tests/data (what is in effect)
_STATS_ADDED_SINCE = ("low_precision_modules", "fp8_modules")
#: optimizer hyper-parameters newer than the files in tests/data (state_bits: 8-bit state)
_ADDED_SINCE_FORMAT_1 = ("state_bits", "min_8bit_size", "master_correction_bits")


@pytest.mark.parametrize("case", CASES)
def test_old_checkpoint_loads(gen, case, tmp_path):
    state = load_stored(f"trainer_{case}.pt")
    expected = load_stored(f"trainer_{case}_expected.pt")
    assert state["format"] == 1
    trainer = gen.make(case, seed=123)  # a different init: everything must come from the file
    trainer.load_state(DATA / f"trainer_{case}.pt", strict_config=True)
    # model, optimizer (masters included), scaler, scheduler: exactly the saved ones
    assert_same_tree(trainer.model.state_dict(), state["model"], "model")
    loaded = trainer.optimizer.state_dict()
    # hyper-parameters added since the file was written come in at their defaults
    for group in loaded["param_groups"]:
        for key in _ADDED_SINCE_FORMAT_1:
            if key in group and key not in state["optimizer"]["param_groups"][0]:
                assert group.pop(key) == trainer.optimizer.defaults[key], key
    assert_same_tree(loaded, state["optimizer"], "optimizer")
    assert_same_tree(trainer.scaler.state_dict(), state["scaler"], "scaler")
    assert_same_tree(trainer.scheduler.state_dict(), state["scheduler"], "scheduler")
    assert trainer.scaler.get_scale() == expected["scale"]
    # counters and metrics: what the old trainer reported at the save
    stats = trainer.stats()
    assert stats.pop("activation_memory") is None  # not part of the file
    for key in _STATS_ADDED_SINCE:  # (what is in effect: counted on the model, not saved)
        stats.pop(key)
    assert_same_tree(stats, expected["stats_at_save"], "stats")
    assert trainer.optimizer_steps == state["counters"]["optimizer_steps"]
    assert trainer._micro == state["counters"]["micro"]
    if state["pending_grads"] is not None:  # saved mid-accumulation
        assert trainer._micro > 0
        for p, g in zip(trainer._params(), state["pending_grads"]):
            assert_bitwise_equal(p.grad.cpu(), g.to(p.dtype))
    assert trainer.adaptive_decisions == state["adaptive"]["decisions"]
    if case == "adaptive_fp16":
        assert trainer.adaptive_decisions and "mid" in trainer.mixed_precision_manager.overrides
        assert trainer.policy_handle.precisions["mid"] == trainer.adaptive_decisions[0]["to"]
        adaptive = trainer.mixed_precision_manager.adaptive
        assert_bitwise_equal(adaptive.fwd_counts, state["adaptive"]["fwd_counts"])
        assert_bitwise_equal(adaptive.bwd_counts, state["adaptive"]["bwd_counts"])
    # and it trains on exactly as the same state saved in today's form does, both here
    # (expected["params_after"] and ["stats_after"] came through another CPU's GEMMs:
    # their form only)
    trainer.save_state(tmp_path / "today.pt")
    today = gen.make(case, seed=7)
    batches = gen.batches()[gen.SAVE_AFTER:]
    for x, y in batches:
        trainer.train_step(x, y)
    after = trainer.stats()
    today.load_state(tmp_path / "today.pt", strict_config=True)
    for x, y in batches:
        today.train_step(x, y)
    assert set(expected["stats_after"]) <= set(after)
    assert {n: (t.dtype, t.shape) for n, t in expected["params_after"].items()} == \
        {n: (p.dtype, p.shape) for n, p in trainer.model.named_parameters()}
    today_stats = today.stats()
    for stats in (today_stats, after):  # the process's memory, not the training's state
        stats.pop("peak_memory")
    assert_same_tree(today_stats, after, "stats after")
    assert_same_tree(today.model.state_dict(), trainer.model.state_dict(), "model after")
    assert_same_tree(today.optimizer.state_dict(), trainer.optimizer.state_dict(),
                 "optimizer after")
    assert_same_tree(today.scaler.state_dict(), trainer.scaler.state_dict(), "scaler after")


def test_new_checkpoint_has_the_old_layout(gen, tmp_path):
    """A file written now has the keys (and counter keys) of an old one, and ``loop`` (format
    2: where a ``train()`` call stood, ``None`` outside one)."""
    old = load_stored("trainer_adaptive_fp16.pt")
    trainer = gen.make("adaptive_fp16")
    for x, y in gen.batches()[: gen.SAVE_AFTER]:
        trainer.train_step(x, y)
    trainer.save_state(tmp_path / "new.pt")
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert set(new) == set(old) | {"loop"} and new["loop"] is None
    assert (old["format"], new["format"]) == (1, 2)
    assert set(new["counters"]) == set(old["counters"])
    assert set(new["adaptive"]) == set(old["adaptive"])
    assert new["history_steps"] == old["history_steps"]
    # the params went through torch's GEMMs here and on the machine that wrote the file
    assert {k: (v.dtype, v.shape) for k, v in new["model"].items()} == \
        {k: (v.dtype, v.shape) for k, v in old["model"].items()}
