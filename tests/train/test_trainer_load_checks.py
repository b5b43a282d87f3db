"""The trainer and the manager: every load checks first, then changes (a
refused checkpoint leaves trainer, model, optimizer, scaler and scheduler exactly as they
were); a setup that refuses does so before it converts anything; the manager keeps the
user's LR scheduler working in MANUAL mode; a setting that does nothing warns once, and
``stats()`` says what is in effect."""

from __future__ import annotations

import copy
import warnings
from functools import partial
from typing import Any, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mixprec
import mixprec.optim
from _helpers import bits
from _unchanged import KINDS, assert_unchanged, corrupt, entries, refused_unchanged, snapshot
from mixprec import MixedPrecisionConfig, MixedPrecisionManager, MixedPrecisionTrainer
from mixprec.amp.notices import IneffectiveSettingWarning


class Net(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, width)
        self.norm = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def batches(n: int = 4, seed: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(n)]


def trainer(mode: str = "manual", level: str = "fp16", width: int = 8, seed: int = 0,
            steps: int = 2, sgd: bool = False) -> MixedPrecisionTrainer:
    torch.manual_seed(seed)
    model = Net(width)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if sgd else
           torch.optim.AdamW(model.parameters(), lr=1e-2))
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
    t = MixedPrecisionTrainer(MixedPrecisionConfig(mode=mode, precision_level=level,
                                                   logging_frequency=1000))
    t.setup_training(model, opt, nn.CrossEntropyLoss(), sched)
    for x, y in batches(steps, seed=seed):
        t.train_step(x, y)
    return t


def checkpoint(tmp_path: Any, **kwargs: Any) -> dict:
    t = trainer(**kwargs)
    path = tmp_path / "saved.pt"
    t.save_state(path)
    return torch.load(path, weights_only=True)


def load_refused(tmp_path: Any, state: Any, target: MixedPrecisionTrainer,
                 exc: Any = (TypeError, ValueError, KeyError)) -> str:
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    rng = torch.get_rng_state()
    message = refused_unchanged(target, lambda: target.load_state(path), exc)
    assert torch.equal(rng, torch.get_rng_state())
    return message


# -- the cases -----------------------------------------------------------------
def test_a_checkpoint_without_optimizer_changes_nothing(tmp_path: Any) -> None:
    """Before: a bare KeyError after the model's weights were overwritten."""
    state = checkpoint(tmp_path)
    del state["optimizer"]
    msg = load_refused(tmp_path, state, trainer(seed=1, steps=1), KeyError)
    assert "'optimizer'" in msg


def test_a_wider_models_checkpoint_changes_nothing(tmp_path: Any) -> None:
    """Before: torch's size mismatch, with the matching tensors already loaded."""
    state = checkpoint(tmp_path, width=16)
    msg = load_refused(tmp_path, state, trainer(seed=1, steps=1), ValueError)
    assert "state['model']['fc1.weight']: expected torch.float16 of shape [8, 4]" in msg


def test_a_manual_fp16_checkpoint_is_refused_by_an_automatic_bf16_trainer(tmp_path: Any
                                                                          ) -> None:
    """Before: one log line, then float32 params with master_param state."""
    state = checkpoint(tmp_path, mode="manual", level="fp16")
    msg = load_refused(tmp_path, state, trainer(mode="automatic", level="bf16", seed=1,
                                                steps=1), ValueError)
    assert "expected torch.float32" in msg and "got torch.float16" in msg


# -- the property: one corrupted entry at a time ----------------------------------------
_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                "_growth_tracker")


def _refused(state: dict, path: tuple, kind: str) -> bool:
    top = path[0]
    if len(path) == 1:
        if kind == "missing":
            return True
        if kind == "type":
            return top != "scheduler" or state["scheduler"] is not None
        return kind == "extra" and top in ("model", "counters", "scheduler")
    if top == "model":
        return len(path) == 2 and kind in ("type", "shape", "dtype", "device", "missing")
    if top == "optimizer":
        if path[1] == "state" and len(path) == 4:
            if kind == "missing":
                return path[3] in ("step", "exp_avg", "exp_avg_sq")
            return kind != "extra"
        if path[1] == "param_groups" and len(path) == 4 and path[3] in ("lr", "eps"):
            return kind in ("type", "range", "shape", "missing") or (
                kind == "dtype" and path[3] == "eps")
        return False
    if top == "scaler":
        return len(path) == 2 and path[1] in _SCALER_KEYS and kind != "device"
    if top == "counters":
        return len(path) == 2 and kind in ("type", "range", "dtype", "shape", "missing")
    if top == "scheduler":
        return len(path) == 2 and kind == "missing"
    if top == "rng":
        return len(path) == 2 and (kind in ("type", "missing") or (
            path[1] == "cpu" and kind in ("shape", "dtype", "device")))
    if top in ("totals", "log_snapshot", "history"):
        return len(path) == 1 and kind in ("type", "shape", "dtype", "device")
    if top == "history_steps":
        return len(path) == 2 and kind in ("type", "range")
    if top == "adaptive":
        return len(path) == 2 and path[1] in ("decisions", "overrides", "root_precision") \
            and kind in ("type",) or (len(path) == 2 and path[1] == "decisions"
                                       and kind == "missing")
    return False


_STATE_CACHE: dict = {}


def _valid(tmp_path_factory: Any) -> dict:
    if "state" not in _STATE_CACHE:
        _STATE_CACHE["state"] = checkpoint(tmp_path_factory.mktemp("valid"))
    return _STATE_CACHE["state"]


def _cases(state: dict) -> List[Tuple[tuple, str]]:
    out = [(p, k) for p in entries(state) for k in KINDS
           if _refused(state, p, k) and corrupt(state, p, k) is not None]
    return out + [((), "extra")]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_one_corrupted_entry_of_a_checkpoint_is_refused_and_changes_nothing(
        tmp_path_factory: Any, data: Any) -> None:
    """Property: one entry of a valid trainer checkpoint corrupted (type, shape, dtype,
    device 'meta', range, missing, extra) -> an error naming it; trainer, model,
    optimizer, scaler, scheduler and the RNG exactly as they were."""
    state = _valid(tmp_path_factory)
    path, kind = data.draw(st.sampled_from(_cases(state)))
    bad = {**state, "bogus": 1} if path == () else corrupt(state, path, kind)
    tmp = tmp_path_factory.mktemp("bad")
    msg = load_refused(tmp, bad, trainer(seed=1, steps=1))
    names = [str(k) for k in path if isinstance(k, str)] or ["bogus"]
    assert any(n in msg for n in names), (path, kind, msg)


def test_the_valid_checkpoint_loads_and_resumes_bit_for_bit(tmp_path: Any) -> None:
    first = trainer(steps=2)
    first.save_state(tmp_path / "s.pt")
    second = trainer(seed=1, steps=1)
    second.load_state(tmp_path / "s.pt")
    for x, y in batches(3, seed=5):
        first.train_step(x, y)
        second.train_step(x, y)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
    assert first.scheduler.get_last_lr() == second.scheduler.get_last_lr()


def test_the_manager_checks_its_state_first() -> None:
    t = trainer(steps=2)
    manager = t.mixed_precision_manager
    good = manager.state_dict()
    for change, says in (
            ({"steps": -1}, "state['steps'] must be an int >= 0, got -1"),
            ({"scaler": {**good["scaler"], "scale": float("nan")}},
             "state_dict['scale'] must be finite and > 0, got nan"),
            ({"adaptive": "x"}, "state['adaptive']: expected a dict"),
            ({"bogus": 1}, "unexpected keys ['bogus']")):
        message = refused_unchanged(manager, partial(manager.load_state_dict, {**good, **change}))
        assert says in message, message
    manager.load_state_dict(good)


# -- setup refuses before it converts ---------------------------------------------------
def test_manual_setup_refuses_rmsprop_before_converting_the_model() -> None:
    model = Net()
    opt = torch.optim.RMSprop(model.parameters())
    before = snapshot(model)
    t = MixedPrecisionTrainer(MixedPrecisionConfig(mode="manual", precision_level="fp16"))
    with pytest.raises(TypeError, match="cannot convert RMSprop"):
        t.setup_training(model, opt, nn.CrossEntropyLoss())
    assert_unchanged(before, snapshot(model))
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("mode", ["manual", "automatic"])
def test_an_optimizer_of_another_model_is_refused(mode: str) -> None:
    """Before: MANUAL trained nothing; AUTOMATIC failed in torch's scaler."""
    model, other = Net(), Net()
    before = snapshot(model)
    with pytest.raises(ValueError, match="none of its 6 params is a param of model"):
        MixedPrecisionManager(model, torch.optim.AdamW(other.parameters()),
                              MixedPrecisionConfig(mode=mode, precision_level="fp16"))
    assert_unchanged(before, snapshot(model))


# -- the scheduler in MANUAL mode: docs/trainer.md's loop -------------------------------
def _loop(mode: str, pass_scheduler: bool) -> Tuple[List[float], List[float]]:
    """docs/trainer.md "In your own loop", with a warmup scheduler: the lr each step's
    kernels use (read from the optimizer that trains) and the scheduler's."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1e-4,
                                                  total_iters=3)
    config = MixedPrecisionConfig(mode=mode, precision_level="bf16")
    manager = MixedPrecisionManager(model, optimizer, config,
                                    scheduler=scheduler if pass_scheduler else None)
    optimizer = manager.optimizer
    used, scheduled = [], []
    for x, y in batches(5):
        optimizer.zero_grad(set_to_none=True)
        with manager.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        manager.backward(loss)
        used.append(float(optimizer.param_groups[0]["lr"]))
        scheduled.append(float(scheduler.get_last_lr()[0]))
        manager.step(optimizer)
        scheduler.step()
    return used, scheduled


@pytest.mark.parametrize("pass_scheduler", [True, False], ids=["scheduler=", "not passed"])
def test_manual_mode_trains_with_the_schedulers_lr(pass_scheduler: bool) -> None:
    """Before: MANUAL's optimizer stayed at 1e-3 while get_last_lr() said 1e-7."""
    with warnings.catch_warnings():
        warnings.simplefilter("error" if pass_scheduler else "ignore")
        used, scheduled = _loop("manual", pass_scheduler)
    assert used == scheduled
    assert (used, scheduled) == _loop("automatic", pass_scheduler)


def test_the_trainer_rebinds_without_private_markers() -> None:
    """The re-binding goes through public API: no mixprec module writes torch's
    scheduler markers (``_opt_called``, ``_wrapped_by_lr_sched``) any more."""
    from pathlib import Path

    pkg = Path(mixprec.__file__).parent
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        assert "_opt_called" not in text and "_wrapped_by_lr_sched" not in text, path
    t = trainer(steps=2)
    assert t.scheduler.optimizer is t.optimizer
    assert t.scheduler.get_last_lr() == [g["lr"] for g in t.optimizer.param_groups]


# -- settings that do nothing -----------------------------------------------------------
def test_a_selective_pattern_that_matches_nothing_warns_and_stats_say_fp32() -> None:
    model = Net()
    with pytest.warns(IneffectiveSettingWarning, match="'decoder.*' matches no module"):
        m = MixedPrecisionManager(model, torch.optim.AdamW(model.parameters()),
                                  MixedPrecisionConfig(mode="selective", precision_level="bf16",
                                                       selective_layers=["decoder.*"]))
    stats = m.stats()
    assert stats["compute_dtype"] == "fp32" and stats["low_precision_modules"] == 0
    model2 = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = MixedPrecisionManager(model2, torch.optim.AdamW(model2.parameters()),
                                   MixedPrecisionConfig(mode="selective",
                                                        precision_level="bf16",
                                                        selective_layers=["fc1"]))
    assert ok.stats()["compute_dtype"] == "bf16" and ok.stats()["low_precision_modules"] == 1


def test_stochastic_rounding_on_float16_params_warns() -> None:
    p = torch.zeros(4, dtype=torch.float16, requires_grad=True)
    opt = mixprec.optim.AdamW([p], master_weights=False, stochastic_rounding=True)
    p.grad = torch.ones_like(p)
    with pytest.warns(IneffectiveSettingWarning, match="float16 params are rounded to nearest"):
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # once


def test_sgd8bit_without_momentum_warns() -> None:
    with pytest.warns(IneffectiveSettingWarning, match="without momentum stores nothing"):
        mixprec.optim.SGD8bit([torch.zeros(4, requires_grad=True)], lr=0.1)


def test_lr_by_steps_taken_warns_once_past_num_steps() -> None:
    """Before: past num_steps the lr froze without a word."""
    p = torch.zeros(4, requires_grad=True)
    opt = mixprec.optim.AdamW([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    opt.lr_by_steps_taken(sched, 3)
    p.grad = torch.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            opt.step()
    with pytest.warns(IneffectiveSettingWarning, match=r"more times \(4\) than "
                      r"lr_by_steps_taken's num_steps \(3\)"):
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # once


def test_stats_summarize_the_scale_history() -> None:
    """Before: print(trainer.stats()) dumped up to 4,096 (step, scale) tuples."""
    t = trainer(steps=40)
    stats = t.stats()
    text = str(stats)
    assert "ScaleHistory(40 points, steps 0..39, scale 65536 -> " in text
    assert len(text) < 1500
    hist = stats["scale_history"]
    assert len(hist) == 40 and hist[0] == (0, 65536.0) and list(hist) == hist


def test_copy_of_a_state_is_not_aliased() -> None:
    """(the helper the tests above rely on: corrupt() never writes into the valid dict)"""
    state = {"a": {"b": torch.ones(2)}}
    bad = corrupt(state, ("a", "b"), "range")
    assert torch.equal(state["a"]["b"], torch.ones(2)) and bad is not None
    assert copy.deepcopy(state)["a"]["b"].sum() == 2


# -- output ------------------------------------------------------------------------------
def _loader() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return batches(4, seed=3)


def test_log_lines_show_without_logging_configured(capsys: Any) -> None:
    """Before: invisible unless logging was configured (INFO on a logger nobody set up)."""
    import logging

    assert logging.getLogger("mixprec.trainer").getEffectiveLevel() > logging.INFO
    t = trainer(mode="automatic", level="bf16", steps=0)
    t.config.logging_frequency = 2
    t.train(_loader(), 1, progress=False)
    out = capsys.readouterr().out
    assert "step 2 | loss" in out and "step 4 | loss" in out and "epoch 1 | loss" in out


class _Recorder:
    def __init__(self, total: Any, desc: str) -> None:
        self.postfixes: List[dict] = []
        self.written: List[str] = []

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, ordered_dict: Any = None, **values: Any) -> None:
        self.postfixes.append(dict(ordered_dict or {}, **values))

    def write(self, line: str) -> None:
        self.written.append(line)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("level,scaled", [("bf16", False), ("fp16", True)])
def test_the_progress_bar_has_one_postfix_format(monkeypatch: Any, level: str,
                                                 scaled: bool) -> None:
    """Before: two alternating formats, and scale=1 shown without loss scaling. The log
    lines go above the bar (its write), not onto its line."""
    from mixprec.train import trainer as trainer_module

    bars: List[_Recorder] = []
    monkeypatch.setattr(trainer_module, "_progress_bar",
                        lambda total, desc: bars.append(_Recorder(total, desc)) or bars[-1])
    t = trainer(mode="automatic", level=level, steps=0)
    t.config.logging_frequency = 2
    t.train(_loader(), 2)
    keys = {tuple(p) for p in bars[0].postfixes}
    assert keys == {("epoch", "loss", "scale") if scaled else ("epoch", "loss")}, keys
    assert any(line.startswith("step 2 | loss") for line in bars[0].written)


def test_the_skipped_steps_plot_has_whole_nonnegative_ticks(monkeypatch: Any,
                                                            tmp_path: Any) -> None:
    """Before: fractional and negative ticks on the skipped-steps axis."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures: List[Any] = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    t = trainer(mode="automatic", level="bf16", steps=5)
    t.plot(tmp_path / "h.png")
    ax = figures[0].axes[2]
    ticks = [float(v) for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
    assert ticks and all(v >= 0 and v == int(v) for v in ticks), ticks
    xticks = [float(v) for v in ax.get_xticks()]
    assert all(v == int(v) for v in xticks), xticks


def test_fp8_with_no_eligible_linear_warns_and_stats_say_what_runs() -> None:
    """Before: nothing converted while stats() said fp8."""
    from mixprec.train import fp8_unavailable

    if fp8_unavailable() is not None:
        pytest.skip(fp8_unavailable())
    model = Net()  # Linear(4, 8), Linear(8, 3): no dimension divisible by 16
    with pytest.warns(IneffectiveSettingWarning, match="no nn.Linear of the model is eligible"):
        m = MixedPrecisionManager(model, torch.optim.AdamW(model.parameters()),
                                  MixedPrecisionConfig(mode="automatic", precision_level="fp8"))
    stats = m.stats()
    assert stats["fp8_modules"] == 0 and stats["compute_dtype"] == "bf16", stats


def test_a_torch_optimizers_state_is_checked_as_strictly(tmp_path: Any) -> None:
    """AUTOMATIC keeps the user's torch.optim.AdamW: its state is held to the same 32-bit
    rules (before: a transposed exp_avg loaded and failed at the next step)."""
    state = checkpoint(tmp_path, mode="automatic", level="bf16")
    first = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][first]["exp_avg"] = (
        state["optimizer"]["state"][first]["exp_avg"].t().contiguous())
    target = trainer(mode="automatic", level="bf16", seed=1, steps=1)
    assert type(target.optimizer) is torch.optim.AdamW
    msg = load_refused(tmp_path, state, target, ValueError)
    assert "torch.optim.AdamW.load_state_dict: state[0]['exp_avg']: expected the param's shape" \
        in msg


def test_log_lines_go_once_to_a_handler_of_the_users(capsys: Any) -> None:
    """Before: with a handler on "mixprec.trainer" and its level left above INFO (the
    demo's setup), every line was written twice: by that handler and by the trainer's."""
    import logging

    got: List[str] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    log = logging.getLogger("mixprec.trainer")
    handler, level = Recording(), log.level
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    try:
        t = trainer(mode="automatic", level="bf16", steps=0)
        t.config.logging_frequency = 2
        t.train(_loader(), 2, progress=False)
    finally:
        log.removeHandler(handler)
    assert log.level == logging.WARNING and not log.handlers
    log.setLevel(level)
    out = capsys.readouterr().out
    epochs = [line for line in got if line.startswith("epoch ")]
    assert [line.split(" |")[0] for line in epochs] == ["epoch 1", "epoch 2"], got
    assert any(line.startswith("step 2 | loss") for line in got)
    assert "epoch 1 | loss" not in out and "step 2 | loss" not in out, out


def test_log_lines_go_once_to_the_roots_console_handler_beside_a_bar(capsys: Any) -> None:
    """Before: with INFO on through the root (``basicConfig(level=INFO)``) and a tqdm bar,
    tqdm's redirect gave "mixprec.trainer" a console handler of its own beside the root's,
    so each line was printed twice."""
    import logging
    import sys

    pytest.importorskip("tqdm")
    root = logging.getLogger()
    handler, level = logging.StreamHandler(sys.stderr), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        t = trainer(mode="automatic", level="bf16", steps=0)
        t.train(_loader(), 2, progress=True)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert text.count("epoch 1 | loss") == 1 and text.count("epoch 2 | loss") == 1, text
    assert not logging.getLogger("mixprec.trainer").handlers
