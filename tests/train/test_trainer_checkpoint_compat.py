"""Checkpoints written by the one-file trainer (before it was split into parts) still load.

``tests/data/trainer_<case>.pt`` were written by ``save_state`` at commit b6be011 (see
``tests/data/make_trainer_checkpoints.py``), with what that trainer reported at the save
and its parameters after training on from there in ``trainer_<case>_expected.pt``.
"""

from __future__ import annotations

import pytest
import torch

from _helpers import DATA, assert_bitwise_equal, load_module, torch_threads

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
_ADDED_SINCE_FORMAT_1 = ("state_bits", "min_8bit_size")


def _assert_same(a, b, where: str) -> None:
    """Nested dicts/lists of tensors and plain values, tensors bitwise."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert_bitwise_equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("case", CASES)
def test_old_checkpoint_loads(gen, case):
    state = torch.load(DATA / f"trainer_{case}.pt", weights_only=True)
    expected = torch.load(DATA / f"trainer_{case}_expected.pt", weights_only=True)
    assert state["format"] == 1
    trainer = gen.make(case, seed=123)  # a different init: everything must come from the file
    trainer.load_state(DATA / f"trainer_{case}.pt", strict_config=True)
    # model, optimizer (masters included), scaler, scheduler: exactly the saved ones
    _assert_same(trainer.model.state_dict(), state["model"], "model")
    loaded = trainer.optimizer.state_dict()
    # hyper-parameters added since the file was written come in at their defaults
    for group in loaded["param_groups"]:
        for key in _ADDED_SINCE_FORMAT_1:
            if key in group and key not in state["optimizer"]["param_groups"][0]:
                assert group.pop(key) == trainer.optimizer.defaults[key], key
    _assert_same(loaded, state["optimizer"], "optimizer")
    _assert_same(trainer.scaler.state_dict(), state["scaler"], "scaler")
    _assert_same(trainer.scheduler.state_dict(), state["scheduler"], "scheduler")
    assert trainer.scaler.get_scale() == expected["scale"]
    # counters and metrics: what the old trainer reported at the save
    stats = trainer.stats()
    assert stats.pop("activation_memory") is None  # not part of the file
    for key in _STATS_ADDED_SINCE:  # (what is in effect: counted on the model, not saved)
        stats.pop(key)
    _assert_same(stats, expected["stats_at_save"], "stats")
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
    # and training on gives what the old trainer gave
    for x, y in gen.batches()[gen.SAVE_AFTER:]:
        trainer.train_step(x, y)
    after = trainer.stats()
    for key, value in expected["stats_after"].items():
        assert after[key] == value, key
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p.detach(), expected["params_after"][name],
                                   rtol=1e-4, atol=1e-5, msg=name)


def test_new_checkpoint_has_the_old_layout(gen, tmp_path):
    """A file written now has exactly the keys (and counter keys) of an old one."""
    old = torch.load(DATA / "trainer_adaptive_fp16.pt", weights_only=True)
    trainer = gen.make("adaptive_fp16")
    for x, y in gen.batches()[: gen.SAVE_AFTER]:
        trainer.train_step(x, y)
    trainer.save_state(tmp_path / "new.pt")
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert set(new) == set(old)
    assert set(new["counters"]) == set(old["counters"])
    assert set(new["adaptive"]) == set(old["adaptive"])
    assert new["history_steps"] == old["history_steps"]
    _assert_same(new["model"], old["model"], "model")
