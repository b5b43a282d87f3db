"""A training run killed with SIGKILL at random moments (inside saves and between them) and
restarted each time with ``train(..., resume=True)`` ends with exactly the bits of the run
that was never killed: params, optimizer state (32-bit moments, or 8-bit codes and maxima),
scaler, scheduler, counters, per-epoch results and the RNG state. And a process that saves
over one path after every step, killed inside its saves, always leaves a file that loads
as the state of one finished save.

Fixed seeds: the moments of the kills are drawn from ``random.Random(seed)`` (the ones set
by a timer land where the machine's speed puts them, which the result must not depend on).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import _kills
import mixprec
from _helpers import assert_same_tree
from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the rounds are forked")

#: fp16: loss scaling with overflows (a start scale far too high, regrown every 3 steps),
#: accumulation over 2 batches (9 batches an epoch: the last step is the epoch's flush);
#: bf16: 8-bit AdamW moments
CASES = {"fp16_scaler": {"level": "fp16", "bits": 32, "accum": 2, "epochs": 4},
         "bf16_8bit": {"level": "bf16", "bits": 8, "accum": 1, "epochs": 3}}
KILLS = 9  # per case


def make_trainer(case: str, width: int = 16) -> MixedPrecisionTrainer:
    c = CASES[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, width), nn.Dropout(0.2), nn.ReLU(), nn.Linear(width, 3))
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2, state_bits=c["bits"],
                              min_8bit_size=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.7)
    config = MixedPrecisionConfig(
        mode="automatic", precision_level=c["level"], gradient_accumulation_steps=c["accum"],
        logging_frequency=4, initial_scale=2.0**24, scale_window=3)
    trainer = MixedPrecisionTrainer(config, device="cpu")
    trainer.setup_training(model, opt, nn.functional.cross_entropy, sched)
    return trainer


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(36, 6, generator=g), torch.randint(0, 3, (36,), generator=g))
    return DataLoader(data, batch_size=4, shuffle=True)  # (shuffled by the global RNG)


def final_state(t: MixedPrecisionTrainer, history: list[dict[str, Any]]) -> dict[str, Any]:
    sched = t.scheduler.state_dict()  # (first: reading it catches the host lrs up)
    stats = t.stats()
    for k in ("peak_memory", "activation_memory"):  # (the process's memory, not training's)
        stats.pop(k)
    return {"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(),
            "scaler": t.scaler.state_dict(), "scheduler": sched,
            "counters": [t.optimizer_steps, t.micro_steps, t.epochs_done], "stats": stats,
            "history": [{k: v for k, v in r.items() if k != "time_s"} for r in history],
            "rng": torch.get_rng_state()}


def train_entry(rank: int, world: int, case: str, ckpt: str | None, out: str) -> None:
    """Build, seed, train with resume (a killed round's successor picks up), save the end."""
    t = make_trainer(case)
    torch.manual_seed(7)  # (a resumed run's RNG comes from the checkpoint)
    kw: dict[str, Any] = {}
    if ckpt is not None:
        kw = {"checkpoint_dir": ckpt, "checkpoint_every": 2, "keep_checkpoints": 2,
              "resume": True}
    history = t.train(loader(), CASES[case]["epochs"], progress=False, **kw)
    _kills.save_result(final_state(t, history), out)


def kill_plan(rng: random.Random, n: int, seconds: float, save_bytes: int) -> _kills.Plan:
    """The ``n``-th kill's moment: by a timer (mostly between saves), at a step of a save
    (fsync, rename, removal), or inside a write, in turn; where in each, at random."""
    kind = ("time", "call", "bytes")[n % 3]
    if kind == "time":
        return _kills.Plan("time", rng.uniform(0.0, seconds))
    if kind == "call":
        return _kills.Plan("call", rng.randint(1, 20), after=rng.random() < 0.5)
    return _kills.Plan("bytes", rng.randint(1, 6 * save_bytes))


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_and_resumed_ends_with_the_bits_of_the_run_never_killed(tmp_path, case):
    import time

    ref_out, out = str(tmp_path / "ref.pt"), str(tmp_path / "out.pt")
    t0 = time.monotonic()
    assert _kills.run(train_entry, (case, None, ref_out)) == "done"
    seconds = time.monotonic() - t0
    reference = torch.load(ref_out, weights_only=False)
    if case == "fp16_scaler":
        assert reference["stats"]["skipped_steps"] >= 3  # (overflows, and the scale regrown)
        assert reference["stats"]["scale_increases"] >= 1
    else:
        codes = [v for st in reference["optimizer"]["state"].values() for v in st.values()
                 if isinstance(v, torch.Tensor) and v.dtype == torch.uint8]
        assert codes  # (8-bit moments)
    probe = make_trainer(case)
    probe.save_state(tmp_path / "probe.pt")
    save_bytes = os.path.getsize(tmp_path / "probe.pt")

    # episodes: rounds killed at random until one finishes, then the bits are compared;
    # again in a fresh directory until KILLS kills
    rng = random.Random(1234 + len(case))
    kinds = {"time": 0, "call": 0, "bytes": 0}
    reached: list[int] = []
    episodes = 0
    while sum(kinds.values()) < KILLS:
        episodes += 1
        assert episodes <= 2 * KILLS, kinds
        ckpt = str(tmp_path / f"ckpt{episodes}")
        for _ in range(3 * KILLS):
            plan = kill_plan(rng, sum(kinds.values()), 0.7 * seconds, save_bytes)
            if _kills.run(train_entry, (case, ckpt, out), plan=plan) == "done":
                break
            kinds[plan.kind] += 1
            last = mixprec.train.checkpoint.latest_checkpoint(ckpt)
            reached.append(-1 if last is None else int(os.path.basename(last)[5:14]))
        else:
            raise AssertionError(f"no round finished ({kinds}, checkpoints at {reached})")
        assert_same_tree(torch.load(out, weights_only=False), reference)
        os.unlink(out)
        # the last two checkpoints are kept, and nothing that a killed save left
        left = sorted(os.listdir(ckpt))
        assert len(left) == 2 and all(n.startswith("step-") for n in left), left
    print(f"{case}: {episodes} episodes, kills {kinds}, at checkpoints {reached}")
    assert kinds["call"] + kinds["bytes"] >= 2, kinds  # (some inside saves)
    assert len(set(reached)) >= 3, reached  # (kills at several points of the run)


# -- kills during saves over one path ------------------------------------------------------
def save_loop_entry(rank: int, world: int, path: str, log: str, steps: int) -> None:
    """From the file if there is one: a step, then a save over ``path``, ``steps`` times;
    each save's digest is logged before it starts, ``done`` after it returned."""
    t = make_trainer("fp16_scaler", width=256)
    if os.path.exists(path):
        t.load_state(path)
    g = torch.Generator().manual_seed(t.optimizer_steps)
    for _ in range(steps):
        t.train_step(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
        t.flush()
        _kills.append_line(log, f"save {t.optimizer_steps} {state_digest(t)}")
        t.save_state(path)
        _kills.append_line(log, f"done {t.optimizer_steps}")


def state_digest(t: MixedPrecisionTrainer) -> str:
    sched = t.scheduler.state_dict()  # (first: reading it catches the host lrs up)
    return _kills.digest([t.model.state_dict(), t.optimizer.state_dict(),
                          t.scaler.state_dict(), sched, t.optimizer_steps, t.micro_steps])


def check_whole(path: str, log: str) -> int:
    """The file loads, as the state of the save in flight at the kill or of the one before
    it (never older than the last that returned)."""
    saves: dict[int, str] = {}
    started = done = 0
    with open(log) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "save":
                started = int(parts[1])
                saves[started] = parts[2]
            elif parts[0] == "done":
                done = int(parts[1])
    t = make_trainer("fp16_scaler", width=256)
    t.load_state(path)
    steps = t.optimizer_steps
    assert steps in (started, started - 1) and steps >= done, (steps, started, done)
    assert state_digest(t) == saves[steps]
    return steps


def test_a_kill_inside_a_save_over_one_file_leaves_a_whole_checkpoint(tmp_path):
    path, log = str(tmp_path / "last.pt"), str(tmp_path / "log")
    assert _kills.run(save_loop_entry, (path, log, 1)) == "done"
    save_bytes = os.path.getsize(path)
    rng = random.Random(99)
    kills, rounds, loaded = 0, 0, []
    while kills < 6:
        rounds += 1
        assert rounds < 30
        plan = rng.choice((_kills.Plan("time", rng.uniform(0.05, 0.6)),
                           _kills.Plan("call", rng.randint(1, 8), after=rng.random() < 0.5),
                           _kills.Plan("bytes", rng.randint(1, 4 * save_bytes))))
        if _kills.run(save_loop_entry, (path, log, 40), plan=plan) == "killed":
            kills += 1
            loaded.append(check_whole(path, log))
    print(f"one file: {rounds} rounds, {kills} kills, loaded states after {loaded} steps")
    assert len(set(loaded)) > 1  # (the rounds went on from each other)
    assert _kills.run(save_loop_entry, (path, log, 1)) == "done"
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "log"]  # (what killed saves left: gone)
