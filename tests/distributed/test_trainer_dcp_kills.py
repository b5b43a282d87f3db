"""The sharded (FSDP2, 2 gloo ranks, one thread each) form of tests/train/test_trainer_kills.py:
a run killed with SIGKILL at random moments (a timer; a rank at a step of a save, its DCP
files' fsyncs included; a rank inside a write) and restarted each time with
``train(..., resume=True)``, the last restart on 1 rank (2 -> 1), ends with the bits of the
run never killed; a process group saving over one directory, killed inside its saves, always
leaves a directory that loads as one finished save's state; and a directory without its
marker, or missing a rank's files, is refused by name (one of mixprec 0.1.0, without a
marker, still loads when whole, with a warning).

The model, the optimizer (32-bit AdamW), fp16 with loss scaling and the scheduler are
``_trainer_dcp_cases.make_trainer``'s; every rank feeds the same shuffled batches.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import _fsdp2_cases
import _kills
import _trainer_dcp_cases as cases
import mixprec
from _helpers import assert_same_tree

pytestmark = [_fsdp2_cases.needs_fsdp2,
              pytest.mark.skipif(not hasattr(os, "fork"), reason="the rounds are forked")]

EPOCHS, KILLS = 3, 5


def sharded_trainer(world: int) -> Any:
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    return cases.make_trainer(True, mesh)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(24, 5, generator=g), torch.randn(24, 1, generator=g))
    return DataLoader(data, batch_size=4, shuffle=True)


def final_state(t: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    out = cases.result(t)  # (full tensors: every rank takes part)
    out["scaler"] = t.scaler.state_dict()
    out["counters"] = [t.optimizer_steps, t.micro_steps, t.epochs_done,
                       t.stats()["skipped_steps"]]
    out["history"] = [{k: v for k, v in r.items() if k != "time_s"} for r in history]
    out["rng"] = torch.get_rng_state()
    return out


def train_entry(rank: int, world: int, ckpt: str | None, out: str) -> None:
    t = sharded_trainer(world)
    torch.manual_seed(7)
    kw: dict[str, Any] = {}
    if ckpt is not None:
        kw = {"checkpoint_dir": ckpt, "checkpoint_every": 2, "keep_checkpoints": 2,
              "resume": True}
    result = final_state(t, t.train(loader(), EPOCHS, progress=False, **kw))
    if rank == 0:
        _kills.save_result(result, out)
    dist.barrier()


def kill_plan(rng: random.Random, n: int, seconds: float) -> _kills.Plan:
    kind = ("time", "call", "bytes")[n % 3]
    if kind == "time":
        return _kills.Plan("time", rng.uniform(0.4 * seconds, 1.1 * seconds))
    if kind == "call":  # (rank 1 calls fsync once a save, for its DCP file)
        rank = rng.randint(0, 1)
        return _kills.Plan("call", rng.randint(1, 90 if rank == 0 else 8), rank=rank,
                           after=rng.random() < 0.5)
    return _kills.Plan("bytes", rng.randint(1, 60_000))


def test_killed_and_resumed_sharded_ends_with_the_bits_of_the_run_never_killed(tmp_path):
    import time

    ref, out, ckpt = str(tmp_path / "ref.pt"), str(tmp_path / "out.pt"), str(tmp_path / "c")
    t0 = time.monotonic()
    assert _kills.run(train_entry, (None, ref), world=2) == "done"
    seconds = time.monotonic() - t0
    print(f"sharded: the run never killed took {seconds:.2f} s")
    reference = torch.load(ref, weights_only=False)
    assert reference["counters"][3] >= 1  # (the scaler skipped a step)
    rng = random.Random(4321)
    kinds = {"time": 0, "call": 0, "bytes": 0}
    reached: list[int] = []
    total, last = reference["counters"][0], None
    for _ in range(6 * KILLS):
        plan = kill_plan(rng, sum(kinds.values()), seconds)
        if _kills.run(train_entry, (ckpt, out), world=2, plan=plan) == "done":
            # (finished before its kill: the bits, then again from the start)
            assert_same_tree(torch.load(out, weights_only=False), reference)
            os.unlink(out)
            shutil.rmtree(ckpt)
            continue
        kinds[plan.kind] += 1
        last = mixprec.train.checkpoint.latest_checkpoint(ckpt)
        reached.append(-1 if last is None else int(os.path.basename(last)[5:14]))
        if sum(kinds.values()) >= KILLS and 0 < reached[-1] < total:
            break
    print(f"sharded: kills {kinds}, at checkpoints {reached}")
    assert sum(kinds.values()) >= KILLS and kinds["call"] + kinds["bytes"] >= 2, kinds
    assert 0 < reached[-1] < total, reached  # (the 2 -> 1 resume starts mid-run)
    # the last restart on one rank: the DCP checkpoint of 2 ranks, resharded
    assert _kills.run(train_entry, (ckpt, out), world=1, group=True) == "done"
    assert_same_tree(torch.load(out, weights_only=False), reference)


# -- kills during saves over one directory -------------------------------------------------
def _digest(t: Any) -> str:
    r = cases.result(t)
    return _kills.digest([r["params"], r["state"], r["scale"], r["lr"], r["steps"],
                          t.scaler.state_dict()])


def save_loop_entry(rank: int, world: int, path: str, log: str, steps: int) -> None:
    t = sharded_trainer(world)
    if os.path.exists(path) or os.path.exists(os.path.dirname(path)) and any(
            n.startswith(f".{os.path.basename(path)}.") for n in os.listdir(
                os.path.dirname(path))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a copy stranded between two renames)
            t.load_state(path)
    for _ in range(steps):
        k = t.optimizer_steps
        cases.train(t, k, k + 1)
        d = _digest(t)
        if rank == 0:
            _kills.append_line(log, f"save {t.optimizer_steps} {d}")
        t.save_state(path)
        if rank == 0:
            _kills.append_line(log, f"done {t.optimizer_steps}")


def load_entry(rank: int, world: int, path: str, out: str) -> None:
    t = sharded_trainer(world)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t.load_state(path)
    _kills.save_result({"steps": t.optimizer_steps, "digest": _digest(t),
                        "warnings": [str(x.message) for x in w]}, out)


def test_a_kill_inside_a_save_over_one_directory_leaves_a_whole_checkpoint(tmp_path):
    path, log, out = str(tmp_path / "ckpt"), str(tmp_path / "log"), str(tmp_path / "out.pt")
    assert _kills.run(save_loop_entry, (path, log, 1), world=2) == "done"  # (a first one)
    rng = random.Random(77)
    kills, loaded, stranded = 0, [], 0
    for n in range(30):
        if kills >= 4:
            break
        plan = (_kills.Plan("time", rng.uniform(1.5, 3.0)) if n % 3 == 0 else
                _kills.Plan("call", rng.randint(1, 40), rank=0, after=rng.random() < 0.5)
                if n % 3 == 1 else _kills.Plan("bytes", rng.randint(1, 40_000)))
        if _kills.run(save_loop_entry, (path, log, 12), world=2, plan=plan) == "done":
            continue
        kills += 1
        assert _kills.run(load_entry, (path, out), world=1, group=True) == "done"
        got = torch.load(out, weights_only=False)
        stranded += bool(got["warnings"])
        saves, started, done = {}, 0, 0
        with open(log) as f:
            for line in f:
                parts = line.split()
                if parts[0] == "save":
                    started = int(parts[1])
                    saves[started] = parts[2]
                else:
                    done = int(parts[1])
        s = got["steps"]
        assert s in (started, started - 1) and s >= done, (s, started, done)
        assert got["digest"] == saves[s]
        loaded.append(s)
    print(f"one directory: {kills} kills, loaded states after {loaded} steps, "
          f"{stranded} from a copy stranded between two renames")
    assert kills >= 4, loaded


# -- the errors --------------------------------------------------------------------------
def errors_entry(rank: int, world: int, root: str, out: str) -> None:
    t = sharded_trainer(world)
    cases.train(t, 0, 2)
    good = os.path.join(root, "good")
    t.save_state(good)
    if rank == 0:
        files = sorted(os.listdir(good))
        for name in ("no_marker", "no_rank1", "legacy", "legacy_no_rank1", "torn_rest"):
            shutil.copytree(good, os.path.join(root, name))
        with contextlib.suppress(FileNotFoundError):  # (a save without markers: refused)
            os.unlink(os.path.join(root, "no_marker", "COMPLETE"))
        os.unlink(os.path.join(root, "no_rank1", "__1_0.distcp"))
        for name in ("legacy", "legacy_no_rank1"):  # (as mixprec 0.1.0 wrote them)
            d = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(d, "COMPLETE"))
            rest = torch.load(os.path.join(d, "trainer.pt"), weights_only=True)
            rest["format"] = 1
            del rest["loop"]
            torch.save(rest, os.path.join(d, "trainer.pt"))
        os.unlink(os.path.join(root, "legacy_no_rank1", "__1_0.distcp"))
        with open(os.path.join(root, "torn_rest", "trainer.pt"), "r+b") as f:
            f.truncate(100)
        # killed between the two renames of a save over "gone": both copies finished
        shutil.copytree(good, os.path.join(root, ".gone.partial-abc"))
        shutil.copytree(good, os.path.join(root, ".gone.old-abc"))
    dist.barrier()
    u = sharded_trainer(world)
    cases.train(u, 7, 8)
    result: dict[str, Any] = {"files": files if rank == 0 else None}
    for name in ("no_marker", "no_rank1", "legacy_no_rank1", "torn_rest"):
        before = (_digest(u), u.optimizer_steps, torch.get_rng_state())
        try:
            u.load_state(os.path.join(root, name))
        except Exception as e:  # noqa: BLE001 (what is raised is the result)
            result[name] = (type(e).__name__, str(e))
        after = (_digest(u), u.optimizer_steps, torch.get_rng_state())
        result[name + "_unchanged"] = before[:2] == after[:2] and torch.equal(before[2], after[2])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        u.load_state(os.path.join(root, "legacy"))
    result["legacy"] = [(x.category.__name__, str(x.message)) for x in w]
    result["legacy_loaded"] = cases.result(u)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        u.load_state(os.path.join(root, "gone"))
    result["stranded"] = [str(x.message) for x in w]
    result["stranded_loaded"] = cases.result(u)
    result["good"] = cases.result(t)
    if rank == 0:
        _kills.save_result(result, out)
    dist.barrier()


@pytest.fixture(scope="module")
def errors(tmp_path_factory: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dirs")
    assert _kills.run(errors_entry, (str(root), str(root / "out.pt")), world=2) == "done"
    return {"root": str(root), **torch.load(root / "out.pt", weights_only=False)}


def test_a_directory_has_every_rank_files_trainer_pt_and_the_marker(errors):
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "trainer.pt",
            "COMPLETE"} <= set(errors["files"])


def test_a_directory_without_its_marker_is_refused_by_name(errors):
    assert "no_marker" in errors, "it loaded"
    kind, msg = errors["no_marker"]
    assert errors["no_marker_unchanged"]
    assert kind == "IncompleteCheckpointError"
    assert os.path.join(errors["root"], "no_marker") in msg
    assert "has no COMPLETE marker: a save that did not finish" in msg


@pytest.mark.parametrize("name", ["no_rank1", "legacy_no_rank1"])
def test_a_directory_missing_a_rank_files_is_refused_by_name(errors, name):
    kind, msg = errors[name]
    assert errors[name + "_unchanged"]
    assert kind == "IncompleteCheckpointError"
    assert f"{os.path.join(errors['root'], name)} is missing __1_0.distcp (rank 1's shards)" in msg


def test_a_torn_trainer_pt_is_refused_by_name(errors):
    kind, msg = errors["torn_rest"]
    assert errors["torn_rest_unchanged"]
    assert kind == "IncompleteCheckpointError"
    assert "torn_rest/trainer.pt has 100 bytes, its COMPLETE marker says" in msg


def test_a_whole_directory_of_the_previous_release_loads_with_a_warning(errors):
    (kind, msg), = errors["legacy"]
    assert kind == "FutureWarning" and "mixprec 0.1.0" in msg and "0.3.0" in msg
    loaded, good = errors["legacy_loaded"], errors["good"]
    assert _fsdp2_cases.bitwise(loaded["params"], good["params"])
    assert _fsdp2_cases.bitwise(loaded["state"], good["state"])
    assert loaded["scale"] == good["scale"] and loaded["steps"] == good["steps"]


def test_a_save_killed_between_its_two_renames_leaves_a_copy_that_loads(errors):
    (msg,) = errors["stranded"]
    assert "gone is missing: a save over it was cut short between its two renames" in msg
    assert ".gone.partial-abc" in msg
    loaded, good = errors["stranded_loaded"], errors["good"]
    assert _fsdp2_cases.bitwise(loaded["params"], good["params"])
    assert _fsdp2_cases.bitwise(loaded["state"], good["state"])
