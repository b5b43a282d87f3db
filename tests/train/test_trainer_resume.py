"""Checkpoints of ``MixedPrecisionTrainer``, in one process: a torn file is refused by name
(never ``EOFError`` or a zip reader's words) and changes nothing; ``save_state`` replaces
its file atomically; ``train()``'s periodic checkpoints keep the newest ones; a run resumed
mid-epoch (a shuffled ``DataLoader``, a torchdata ``StatefulDataLoader``, gradient
accumulation) ends where the uninterrupted one does; bad arguments are refused by name."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mixprec
from _unchanged import assert_unchanged, snapshot
from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer
from mixprec.train.checkpoint import IncompleteCheckpointError, latest_checkpoint


def make(accum: int = 1) -> MixedPrecisionTrainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 3))
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    t = MixedPrecisionTrainer(MixedPrecisionConfig(
        mode="automatic", precision_level="fp16", gradient_accumulation_steps=accum,
        logging_frequency=1000), device="cpu")
    return t.setup_training(model, opt, nn.functional.cross_entropy)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(28, 4, generator=g), torch.randint(0, 3, (28,), generator=g))


def params(t: MixedPrecisionTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.model.parameters()]


# -- torn files ------------------------------------------------------------------------------
@pytest.mark.parametrize("keep,words", [(0, "is empty"), (30, "is cut short"),
                                        (0.5, "is cut short"), (-1, "is cut short"),
                                        ("flip", "is damaged")])
def test_a_torn_file_is_refused_by_name_and_changes_nothing(tmp_path, keep, words):
    t = make()
    t.train(DataLoader(data(), batch_size=4), 1, progress=False)
    path = tmp_path / "last.pt"
    t.save_state(path)
    raw = path.read_bytes()
    if keep == "flip":  # (a record's bytes changed: its CRC no longer matches)
        mid = raw.index(b"data/0") + 200
        raw = raw[:mid] + bytes(b ^ 0xFF for b in raw[mid:mid + 64]) + raw[mid + 64:]
    else:
        raw = raw[:int(len(raw) * keep) if isinstance(keep, float) else keep]
    path.write_bytes(raw)
    u = make()
    u.train(DataLoader(data(), batch_size=7), 1, progress=False)
    before, rng = snapshot(u), torch.get_rng_state()
    with pytest.raises(IncompleteCheckpointError) as e:
        u.load_state(path)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert f"MixedPrecisionTrainer.load_state: {path} {words}" in msg
    assert "EOFError" not in msg and "PytorchStreamReader" not in msg and "zip" not in msg
    assert_unchanged(before, snapshot(u))
    assert torch.equal(rng, torch.get_rng_state())


def test_save_state_replaces_its_file_atomically(tmp_path):
    """A reader holding the previous file still reads all of it; nothing is left beside."""
    t = make()
    path = tmp_path / "last.pt"
    t.save_state(path)
    old = path.read_bytes()
    with open(path, "rb") as held:
        t.train(DataLoader(data(), batch_size=4), 1, progress=False)
        t.save_state(path)
        assert held.read() == old  # (in place, the bytes would have been rewritten)
    assert os.listdir(tmp_path) == ["last.pt"] and path.read_bytes() != old


# -- periodic checkpoints and resuming ---------------------------------------------------------
def test_periodic_checkpoints_keep_the_newest(tmp_path):
    t = make()
    t.train(DataLoader(data(), batch_size=4), 2, progress=False, checkpoint_dir=tmp_path,
            checkpoint_every=3, keep_checkpoints=2)
    assert sorted(os.listdir(tmp_path)) == ["step-000000012.pt", "step-000000014.pt"]
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-000000014.pt")
    saved = torch.load(tmp_path / "step-000000012.pt", weights_only=True)
    assert saved["loop"]["epoch"] == 1 and saved["loop"]["batches"] == 5


def test_checkpoints_read_the_device_only_inside_their_saves(tmp_path):
    """Between saves, a run with checkpoints reads back what one without them does."""
    from _helpers import HostReads

    plain = make()
    with HostReads() as hr:
        plain.train(DataLoader(data(), batch_size=4), 2, progress=False)
    plain_reads = len(hr.ops)
    t = make()
    inside = []
    real_save = t.save_state

    def counted(path: Any) -> None:
        n = len(hr.ops)
        real_save(path)
        inside.append(len(hr.ops) - n)

    t.save_state = counted  # type: ignore[method-assign]
    with HostReads() as hr:
        t.train(DataLoader(data(), batch_size=4), 2, progress=False, checkpoint_dir=tmp_path,
                checkpoint_every=3, keep_checkpoints=None)
    assert len(inside) == 5  # (steps 3, 6, 9, 12 and the end, 14)
    assert len(hr.ops) - sum(inside) == plain_reads


def _resumed(tmp_path: Any, loader: Any, accum: int, stop_after: int) -> tuple[Any, Any]:
    """An uninterrupted run, and one stopped after ``stop_after`` checkpoints and resumed by
    a fresh trainer (and a fresh ``loader()``): their params; their per-epoch results match."""
    ref = make(accum)
    torch.manual_seed(3)
    ref_results = ref.train(loader(), 3, progress=False)
    first = make(accum)
    torch.manual_seed(3)
    calls = {"n": 0}
    real_save = first.save_state

    def save_then_stop(path: Any) -> None:
        real_save(path)
        calls["n"] += 1
        if calls["n"] == stop_after:
            raise KeyboardInterrupt  # (a Ctrl-C just after a checkpoint)

    first.save_state = save_then_stop  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        first.train(loader(), 3, progress=False, checkpoint_dir=tmp_path, checkpoint_every=2)
    second = make(accum)
    torch.manual_seed(99)  # (what the checkpoint holds must win)
    results = second.train(loader(), 3, progress=False, checkpoint_dir=tmp_path, resume=True)
    for r in ref_results + results:
        r.pop("time_s")
    assert results == ref_results
    return params(ref), params(second)


@pytest.mark.parametrize("accum", [1, 3])
def test_a_shuffled_dataloader_resumes_mid_epoch_with_the_same_order(tmp_path, accum):
    ref, resumed = _resumed(tmp_path, lambda: DataLoader(data(), batch_size=4, shuffle=True),
                            accum, 2)
    assert all(torch.equal(a, b) for a, b in zip(ref, resumed))


def test_a_stateful_dataloader_resumes_by_its_own_state(tmp_path):
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    ref, resumed = _resumed(
        tmp_path, lambda: tdl.StatefulDataLoader(data(), batch_size=4, shuffle=True), 1, 3)
    assert all(torch.equal(a, b) for a, b in zip(ref, resumed))
    mid = torch.load(tmp_path / "step-000000006.pt", weights_only=True)  # (in epoch 1)
    assert mid["loop"]["loader"]["_num_yielded"] == 6


def test_resume_needs_the_same_data(tmp_path):
    t = make()
    t.train(DataLoader(data(), batch_size=4), 1, progress=False, checkpoint_dir=tmp_path,
            checkpoint_every=5)
    os.unlink(tmp_path / "step-000000007.pt")  # (resume from step 5: 5 batches consumed)
    u = make()
    short = [(torch.randn(4, 4), torch.randint(0, 3, (4,)))] * 3
    with pytest.raises(ValueError, match="had consumed 5 batches, the loader yields only 3"):
        u.train(short, 1, progress=False, checkpoint_dir=tmp_path, resume=True)


@pytest.mark.parametrize("kwargs,match", [
    ({"checkpoint_every": 2}, "checkpoint_every and resume=True need checkpoint_dir"),
    ({"resume": True}, "checkpoint_every and resume=True need checkpoint_dir"),
    ({"checkpoint_dir": "x", "checkpoint_every": 0}, "checkpoint_every must be None or an int"),
    ({"checkpoint_dir": "x", "keep_checkpoints": 0}, "keep_checkpoints must be None or an int"),
    ({"checkpoint_dir": "x", "checkpoint_every": True}, "checkpoint_every must be None or an"),
])
def test_bad_checkpoint_arguments_are_refused_before_anything_changes(tmp_path, kwargs, match):
    t = make()
    before = snapshot(t)
    with pytest.raises(ValueError, match=match):
        t.train(DataLoader(data(), batch_size=4), 1, progress=False, **kwargs)
    assert_unchanged(before, snapshot(t))
    assert not os.path.exists("x")


def test_a_save_reads_the_device_once(tmp_path, monkeypatch):
    """Before: three reads per save (the scaler's state_dict() and stats(), each scalar on
    its own): the scaler's values now come back in one transfer."""
    from _helpers import HostReads

    t = make()
    t.train(DataLoader(data(), batch_size=4), 1, progress=False)
    assert t.scaler.is_enabled()
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or real(self))
    with HostReads() as hr:
        t.save_state(tmp_path / "one.pt")
    assert hr.ops == [] and len(calls) == 1, (hr.ops, calls)
