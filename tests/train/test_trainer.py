"""MixedPrecisionTrainer: each mode's dtypes, the step API, ADAPTIVE, save/resume."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
from torch import nn

import mixprec
import mixprec.optim
from _helpers import HostReads, assert_bitwise_equal
from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer
from mixprec.train.metrics import COLS


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention
    yield
    torch.set_num_threads(n)


def low_dtype(device: str) -> torch.dtype:
    return torch.float16 if device == "cuda" else torch.bfloat16


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.fc2(self.act(self.norm(self.fc1(x))))))


def data(n: int = 64, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].argmax(1)).long()
    return x.to(device), y.to(device)


def loader(n_batches: int = 4, bs: int = 16, seed: int = 0, device: str = "cpu"):
    x, y = data(n_batches * bs, seed, device)
    return [(x[i:i + bs], y[i:i + bs]) for i in range(0, n_batches * bs, bs)]


def record(model: nn.Module):
    acts: dict[str, torch.dtype] = {}
    for name, m in model.named_modules():
        if name:
            m.register_forward_hook(lambda mod, i, o, name=name: acts.__setitem__(name, o.dtype))
    return acts


def make(config: MixedPrecisionConfig, device: str = "cpu", opt: str = "adamw", seed: int = 0,
         scheduler: bool = False, model: nn.Module | None = None):
    torch.manual_seed(seed)
    model = (model or Net()).to(device)
    if opt == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5) if scheduler else None
    trainer = MixedPrecisionTrainer(config)
    trainer.setup_training(model, optimizer, nn.CrossEntropyLoss(), sched)
    return trainer


def grad_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {n: p.grad.dtype for n, p in model.named_parameters() if p.grad is not None}


def step_keeping_grads(trainer: MixedPrecisionTrainer, x, y):
    """train_step, but capture the grads before the next step clears them."""
    captured = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p, n=n: captured.__setitem__(n, p.grad.dtype))
        for n, p in trainer.model.named_parameters()]
    m = trainer.train_step(x, y)
    for h in hooks:
        h.remove()
    return m, captured


# ------------------------------------------------------------------------ modes
@pytest.mark.parametrize("level", ["fp16", "bf16"])
def test_automatic_mode_dtypes(device, level):
    trainer = make(MixedPrecisionConfig(mode="automatic", precision_level=level), device)
    low = torch.float16 if level == "fp16" else torch.bfloat16
    acts = record(trainer.model)
    x, y = data(16, device=device)
    m, grads = step_keeping_grads(trainer, x, y)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert acts["fc1"] == low and acts["fc2"] == low and acts["head"] == low
    assert acts["norm"] == torch.float32  # policy: norms in float32
    assert set(grads.values()) == {torch.float32}
    assert isinstance(trainer.scaler, mixprec.GradScaler) and trainer.scaler.is_enabled()
    # fp16 scales the loss; bf16 does not, but still checks and skips
    assert m["current_scale"] == (65536.0 if level == "fp16" else 1.0)
    assert trainer.loss_scaling is (level == "fp16")
    assert m["step_skipped"] is False and math.isfinite(m["loss"])


@pytest.mark.parametrize("level", ["fp16", "bf16"])
def test_manual_mode_dtypes_and_optimizer_conversion(device, level):
    low = torch.float16 if level == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    model = Net().to(device)
    fp32_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), weight_decay=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(mode="manual", precision_level=level))
    trainer.setup_training(model, opt, nn.CrossEntropyLoss(), sched)
    new = trainer.optimizer
    assert isinstance(new, mixprec.optim.AdamW) and new is not opt
    g = new.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (3e-3, (0.8, 0.95), 0.05)
    assert sched.optimizer is new
    # masters are the float32 weights from before the conversion, not rounded copies
    for n, p in model.named_parameters():
        if p.dtype == low:
            assert_bitwise_equal(new.state[p]["master_param"], fp32_weights[n])
    acts = record(model)
    x, y = data(16, device=device)
    losses = []
    orig_criterion = trainer.criterion
    trainer.criterion = lambda out, t: losses.append(out.dtype) or orig_criterion(out, t)
    m, grads = step_keeping_grads(trainer, x, y)
    assert model.fc1.weight.dtype == low and model.head.bias.dtype == low
    assert model.norm.weight.dtype == torch.float32  # norms stay float32
    assert acts["fc1"] == low and acts["fc2"] == low and acts["head"] == low
    assert acts["norm"] == low  # the float32 island hands back the 16-bit dtype
    assert grads["fc1.weight"] == low and grads["norm.weight"] == torch.float32
    assert losses == [torch.float32]  # loss computed in float32
    assert all(st["master_param"].dtype == torch.float32
               for p, st in new.state.items() if p.dtype == low)
    assert math.isfinite(m["loss"]) and m["lr"] == pytest.approx(1.5e-3)  # scheduler stepped


def test_manual_mode_rejects_unconvertible_optimizer():
    model = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(mode="manual", precision_level="bf16"))
    with pytest.raises(TypeError, match="cannot convert RMSprop"):
        trainer.setup_training(model, torch.optim.RMSprop(model.parameters()),
                               nn.CrossEntropyLoss())


def test_selective_mode_only_selected_low(device):
    cfg = MixedPrecisionConfig(mode="selective", precision_level="fp16", selective_layers=["fc2"])
    trainer = make(cfg, device)
    acts = record(trainer.model)
    x, y = data(16, device=device)
    _, grads = step_keeping_grads(trainer, x, y)
    assert acts["fc2"] == torch.float16
    assert acts["fc1"] == torch.float32 and acts["head"] == torch.float32
    assert acts["norm"] == torch.float32
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert set(grads.values()) == {torch.float32}
    assert trainer.loss_scaling


def test_gradient_scaling_mode_fp32_with_scaling(device):
    trainer = make(MixedPrecisionConfig(mode="gradient_scaling", initial_scale=1024.0), device)
    acts = record(trainer.model)
    x, y = data(16, device=device)
    m, grads = step_keeping_grads(trainer, x, y)
    assert set(acts.values()) == {torch.float32}
    assert set(grads.values()) == {torch.float32}
    assert m["current_scale"] == 1024.0 and trainer.scaler.is_enabled()
    assert trainer.compute_dtype is None


def test_disabled_is_plain_fp32():
    trainer = make(MixedPrecisionConfig(enabled=False))
    acts = record(trainer.model)
    m = trainer.train_step(*data(16))
    assert set(acts.values()) == {torch.float32}
    assert not trainer.scaler.is_enabled() and m["current_scale"] == 1.0
    assert trainer.policy_handle is None


# ------------------------------------------------------------------------ ADAPTIVE
class Overflowing(nn.Module):
    """``big``'s outputs exceed float16's range (weights x 1e6); a LayerNorm follows."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.big = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)
        with torch.no_grad():
            self.big.weight.mul_(1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.big(torch.relu(self.fc1(x))))))


def test_adaptive_promotes_the_overflowing_layer(tmp_path, caplog):
    cfg = MixedPrecisionConfig(mode="adaptive", precision_level="fp16", logging_frequency=4,
                               overflow_threshold=0.5)
    trainer = make(cfg, model=Overflowing())
    acts = record(trainer.model)
    batches = loader(4, 16)
    with caplog.at_level(logging.WARNING, logger="mixprec.trainer"):
        first = [trainer.train_step(x, y) for x, y in batches]
    assert all(m["step_skipped"] for m in first)  # fp16 forward overflows: every step skipped
    decisions = trainer.adaptive_decisions
    assert len(decisions) == 1
    d = decisions[0]
    assert d["module"] == "big" and d["from"] == "fp16" and d["to"] in ("bf16", "fp32")
    assert d["step"] == 4 and "non-finite" in d["reason"]
    assert "adaptive" in caplog.text and "big" in caplog.text
    # afterwards: big runs promoted, the rest still fp16, steps are real again
    later = [trainer.train_step(x, y) for x, y in batches]
    assert acts["big"] == (torch.bfloat16 if d["to"] == "bf16" else torch.float32)
    assert acts["fc1"] == torch.float16 and acts["head"] == torch.float16
    assert not any(m["step_skipped"] for m in later[1:])
    assert trainer.stats()["adaptive_decisions"] == decisions
    # saved with the state, and re-applied on load
    path = tmp_path / "adaptive.pt"
    trainer.save_state(path)
    assert torch.load(path, weights_only=True)["adaptive"]["decisions"] == decisions
    other = make(cfg, model=Overflowing())
    acts2 = record(other.model)
    other.load_state(path)
    other.train_step(*batches[0])
    assert other.adaptive_decisions == decisions and acts2["big"] == acts["big"]


class _GradBoost(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by 1e8 (overflows in float16)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1e8


class BackwardOverflowing(nn.Module):
    """Forward is finite everywhere; the gradient reaching ``big`` (and all before it)
    overflows, while ``head``'s own gradients stay finite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.big = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_GradBoost.apply(self.big(torch.relu(self.fc1(x)))))


def test_adaptive_promotes_the_module_whose_grads_overflowed():
    cfg = MixedPrecisionConfig(mode="adaptive", precision_level="fp16", logging_frequency=4,
                               overflow_threshold=0.5)
    trainer = make(cfg, model=BackwardOverflowing())
    acts = record(trainer.model)
    first = [trainer.train_step(x, y) for x, y in loader(4, 16)]
    assert all(m["step_skipped"] for m in first)
    decisions = trainer.adaptive_decisions
    assert len(decisions) == 1
    d = decisions[0]
    assert d["module"] == "big" and "gradients were non-finite" in d["reason"]
    trainer.train_step(*data(16))
    assert acts["big"] in (torch.bfloat16, torch.float32) and acts["head"] == torch.float16


def test_adaptive_promotes_when_the_scale_reaches_min_scale():
    """The second trigger: the overflow rate stays at the threshold (never above it), but the
    scale has backed off down to min_scale -- the overflowing layer is promoted all the same."""
    cfg = MixedPrecisionConfig(mode="adaptive", precision_level="fp16", logging_frequency=4,
                               overflow_threshold=1.0, initial_scale=4.0, min_scale=1.0)
    trainer = make(cfg, model=Overflowing())
    acts = record(trainer.model)
    scales = [trainer.train_step(x, y)["current_scale"] for x, y in loader(4, 16)]
    assert scales == [2.0, 1.0, 1.0, 1.0]  # backed off to min_scale and held there
    decisions = trainer.adaptive_decisions
    assert len(decisions) == 1
    assert decisions[0]["module"] == "big" and "min_scale" in decisions[0]["reason"]
    trainer.train_step(*data(16))
    assert acts["big"] in (torch.bfloat16, torch.float32) and acts["fc1"] == torch.float16


def test_adaptive_turns_low_precision_on_under_memory_pressure():
    cfg = MixedPrecisionConfig(mode="adaptive", precision_level="fp32", logging_frequency=2,
                               adaptive_threshold=1e-9)
    trainer = make(cfg)
    acts = record(trainer.model)
    trainer.train_step(*data(16))
    assert acts["fc1"] == torch.float32
    trainer.train_step(*data(16))  # evaluation: memory use > threshold
    trainer.train_step(*data(16))
    assert acts["fc1"] == torch.bfloat16  # CPU's preferred 16-bit type
    assert trainer.adaptive_decisions[0]["module"] == "<model>"
    assert "memory" in trainer.adaptive_decisions[0]["reason"]


def test_adaptive_reads_its_counts_with_one_sync(monkeypatch):
    """An ADAPTIVE evaluation reads the forward and backward counts back in one transfer,
    as its docstring says (one ``tolist``; two would be two syncs on CUDA)."""
    trainer = make(MixedPrecisionConfig(mode="adaptive", precision_level="fp16",
                                        logging_frequency=2))
    controller = trainer._manager().adaptive
    calls = []
    tolist = torch.Tensor.tolist

    def counted(self):
        calls.append(tuple(self.shape))
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    controller.evaluate(overflows=0.0, steps=2, last_scale=1.0, step=2)
    assert calls == [(2, len(controller.names))]


def test_adaptive_leaves_a_healthy_model_alone():
    trainer = make(MixedPrecisionConfig(mode="adaptive", precision_level="fp16",
                                        logging_frequency=2))
    for x, y in loader(6):
        trainer.train_step(x, y)
    assert trainer.adaptive_decisions == []


# ------------------------------------------------------------------------ step API
STEP_KEYS = {"loss", "current_scale", "overflow_detected", "underflow_detected", "nan_detected",
             "step_skipped", "grad_norm", "memory_usage", "lr"}


def test_train_step_keys_and_laziness():
    """The step's dict holds device values: nothing is read until a key is, and each read
    key is read once (then kept)."""
    trainer = make(MixedPrecisionConfig(precision_level="fp16"))
    m = trainer.train_step(*data(16))
    reads = HostReads()
    with reads:
        assert STEP_KEYS <= set(m)
        loss = m.tensor("loss")
        assert reads.ops == []
        assert isinstance(m["loss"], float) and len(reads.ops) == 1
        m["loss"]
        assert len(reads.ops) == 1
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and m["loss"] == loss.item()
    assert isinstance(m["loss"], float) and isinstance(m["overflow_detected"], bool)
    assert isinstance(m["memory_usage"], int) and m["memory_usage"] > 0
    assert m["lr"] == 1e-2 and m["optimizer_step"] is True
    assert m["grad_norm"] > 0 and not m["nan_detected"] and not m["underflow_detected"]


def test_nonfinite_step_is_skipped_and_scheduler_not_stepped():
    trainer = make(MixedPrecisionConfig(precision_level="bf16"), scheduler=True)
    x, y = data(16)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    bad = x.clone()
    bad[0, 0] = float("nan")
    m = trainer.train_step(bad, y)
    assert m["step_skipped"] and m["overflow_detected"] and m["nan_detected"]
    assert trainer.scheduler.last_epoch == 0 and m["lr"] == 1e-2
    for n, p in trainer.model.named_parameters():
        assert_bitwise_equal(p.detach(), before[n])
    m = trainer.train_step(x, y)
    assert not m["step_skipped"] and trainer.scheduler.last_epoch == 1 and m["lr"] == 5e-3


def test_fp16_overflow_backs_off_the_scale():
    trainer = make(MixedPrecisionConfig(precision_level="fp16", initial_scale=2.0**24))
    x, y = data(16)
    scales = [trainer.train_step(x * 100, y)["current_scale"] for _ in range(12)]
    assert scales[-1] < 2.0**24
    st = trainer.stats()
    assert st["skipped_steps"] >= 1 and st["scale_decreases"] >= 1
    assert st["overflow_rate"] == st["skipped_steps"] / 12


def test_gradient_accumulation_matches_big_batch():
    x, y = data(32)
    cfg_acc = MixedPrecisionConfig(enabled=False, gradient_accumulation_steps=2)
    acc = make(cfg_acc, opt="sgd")
    ref = make(MixedPrecisionConfig(enabled=False), opt="sgd")
    m1 = acc.train_step(x[:16], y[:16])
    assert m1["optimizer_step"] is False and m1["step_skipped"] is None
    m2 = acc.train_step(x[16:], y[16:])
    ref.train_step(x, y)
    assert m2["optimizer_step"] is True and acc.optimizer_steps == 1 and acc.micro_steps == 2
    for pa, pr in zip(acc.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(pa, pr, rtol=1e-5, atol=1e-6)


def test_accumulation_with_scheduler_steps_once_per_optimizer_step():
    trainer = make(MixedPrecisionConfig(precision_level="bf16", gradient_accumulation_steps=3),
                   scheduler=True)
    res = trainer.train_epoch(loader(7))  # 7 micro-batches: 2 full steps + 1 flushed
    assert res["num_batches"] == 7 and res["optimizer_steps"] == 3
    assert trainer.scheduler.last_epoch == 3


def test_clipping_goes_through_the_fused_scaler_clip(monkeypatch):
    calls = []
    orig = mixprec.GradScaler.clip_grad_norm_

    def spy(self, optimizer, max_norm, norm_type=2.0):
        calls.append(max_norm)
        return orig(self, optimizer, max_norm, norm_type)

    monkeypatch.setattr(mixprec.GradScaler, "clip_grad_norm_", spy)
    cfg = MixedPrecisionConfig(mode="gradient_scaling", max_grad_norm=0.01)
    trainer = make(cfg, opt="sgd")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    m = trainer.train_step(*data(16))
    assert calls == [0.01]
    assert m["grad_norm"] > 0.01  # the norm before clipping
    update = torch.linalg.vector_norm(torch.stack([
        torch.linalg.vector_norm(p.detach() - b) for p, b in zip(trainer.model.parameters(),
                                                                 before)]))
    torch.testing.assert_close(float(update), 0.1 * 0.01, rtol=1e-3, atol=0)  # lr * max_norm


def test_nan_handling_raise_acts_at_log_step():
    cfg = MixedPrecisionConfig(precision_level="bf16", nan_handling="raise", logging_frequency=2)
    trainer = make(cfg)
    x, y = data(16)
    bad = x.clone()
    bad[0] = float("nan")
    trainer.train_step(bad, y)
    with pytest.raises(FloatingPointError, match="nan"):
        trainer.train_step(x, y)


# ------------------------------------------------------------------------ loops, reports
def _trained_two_epochs(caplog=None):
    """fp16 trainer, 2 epochs of 6 batches (12 steps) with validation, logging every 3."""
    cfg = MixedPrecisionConfig(precision_level="fp16", logging_frequency=3)
    trainer = make(cfg, scheduler=False)
    train, val = loader(6, seed=1), loader(2, seed=2)
    if caplog is None:
        return trainer, trainer.train(train, 2, val_loader=val, progress=True), val
    with caplog.at_level(logging.INFO, logger="mixprec.trainer"):
        hist = trainer.train(train, 2, val_loader=val, progress=True)
    return trainer, hist, val


def test_train_returns_one_history_entry_per_epoch():
    _, hist, _ = _trained_two_epochs()
    assert len(hist) == 2
    for h in hist:
        assert {"epoch_loss", "num_batches", "overflow_steps", "underflow_steps", "nan_steps",
                "average_scale", "val_loss", "val_accuracy", "time_s"} <= set(h)
        assert h["num_batches"] == 6 and h["average_scale"] > 1
    assert hist[1]["epoch_loss"] < hist[0]["epoch_loss"]


def test_train_logs_every_logging_frequency_steps_and_shows_a_bar(caplog, capsys):
    pytest.importorskip("tqdm")  # the bar; without tqdm the trainer prints plain lines
    _trained_two_epochs(caplog)
    log_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(log_lines) == 4  # 12 optimizer steps / logging_frequency 3
    assert "scale 65536" in log_lines[0]
    assert "train (automatic, fp16)" in capsys.readouterr().err  # the tqdm bar


def test_evaluate_reports_accuracy_samples_and_loss():
    trainer, _, val = _trained_two_epochs()
    ev = trainer.evaluate(val)
    assert 0 <= ev["accuracy"] <= 1 and ev["num_samples"] == 32 and ev["loss"] > 0


def test_stats_after_training():
    trainer, _, _ = _trained_two_epochs()
    st = trainer.stats()
    assert {"total_steps", "overflow_rate", "current_scale", "avg_grad_norm",
            "scale_increases", "scale_decreases", "scale_history"} <= set(st)
    assert st["total_steps"] == 12 and st["current_scale"] == 65536.0
    assert len(st["scale_history"]) == 12 and st["scale_history"][0] == (0, 65536.0)
    assert st["avg_grad_norm"] > 0


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    trainer, _, _ = _trained_two_epochs()
    png = trainer.plot(tmp_path / "report.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_reset_clears_the_statistics_but_keeps_the_scale():
    trainer, _, _ = _trained_two_epochs()
    trainer.reset()
    st = trainer.stats()
    assert st["total_steps"] == 0 and st["scale_history"] == [] and st["current_scale"] == 65536.0


def test_history_rows_are_the_steps_metrics():
    """``history()``: one row per optimizer step, in COLS order, equal to the step's metrics."""
    trainer = make(MixedPrecisionConfig(precision_level="fp16", max_grad_norm=1.0))
    assert trainer.history() == ([], None)
    metrics = [trainer.train_step(x, y) for x, y in loader(3, 16)]
    steps, rows = trainer.history()
    assert steps == [0, 1, 2] and rows.shape == (3, len(COLS)) and rows.dtype == torch.float32
    for m, row in zip(metrics, rows.tolist()):
        got = dict(zip(COLS, row))
        assert got["loss"] == m["loss"] and got["scale"] == m["current_scale"]
        assert got["overflow"] == float(m["overflow_detected"])
        assert got["grad_norm"] == pytest.approx(m["grad_norm"])


def test_history_is_bounded():
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(precision_level="bf16"),
                                    history_size=16)
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    trainer.setup_training(model, torch.optim.SGD(model.parameters(), lr=0.01),
                           nn.CrossEntropyLoss())
    x, y = data(4)
    for _ in range(200):
        trainer.train_step(x, y)
    hist = trainer.stats()["scale_history"]
    assert len(hist) <= 16 and hist[-1][0] == 199 and hist[0][0] == 0
    steps = [s for s, _ in hist]
    assert steps == sorted(steps) and steps[-2] == 198  # recent steps dense


# ------------------------------------------------------------------------ save / resume
@pytest.mark.parametrize("mode,level,opt", [
    ("automatic", "fp16", "adamw"), ("manual", "bf16", "adamw"), ("adaptive", "fp16", "sgd")])
def test_resume_is_bitwise_identical(tmp_path, mode, level, opt):
    cfg = MixedPrecisionConfig(mode=mode, precision_level=level, scale_window=2,
                               gradient_accumulation_steps=2, logging_frequency=2,
                               max_grad_norm=1.0)
    batches = loader(12, 8, seed=3)
    full = make(cfg, opt=opt, scheduler=True)
    for i, (x, y) in enumerate(batches):
        full.train_step(x, y)
        if i == 4:  # mid-accumulation (5 micro-batches): pending grads are saved too
            full.save_state(tmp_path / "ckpt.pt")
    resumed = make(cfg, opt=opt, scheduler=True, seed=123)  # different init: overwritten
    resumed.load_state(tmp_path / "ckpt.pt")
    for x, y in batches[5:]:
        resumed.train_step(x, y)
    for pf, pr in zip(full.model.parameters(), resumed.model.parameters()):
        assert_bitwise_equal(pr.detach(), pf.detach())
    assert resumed.scaler.get_scale() == full.scaler.get_scale()
    assert resumed.scheduler.last_epoch == full.scheduler.last_epoch
    a, b = full.stats(), resumed.stats()
    for k in ("total_steps", "skipped_steps", "current_scale", "scale_increases",
              "scale_decreases", "scale_history"):
        assert a[k] == b[k], k
    if mode == "manual":
        for pf, pr in zip(full.model.parameters(), resumed.model.parameters()):
            mf = full.optimizer.state[pf].get("master_param")
            if mf is not None:
                assert_bitwise_equal(resumed.optimizer.state[pr]["master_param"], mf)


def test_save_copies_grads_only_mid_accumulation(tmp_path, monkeypatch):
    """After a whole step the grads are not part of the state: save_state does not copy them
    to the host (a model-sized transfer for nothing); mid-accumulation it saves them."""
    cfg = MixedPrecisionConfig(precision_level="fp16", gradient_accumulation_steps=2)
    trainer = make(cfg)
    copied = []
    cpu = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        copied.append(tuple(self.shape))
        return cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    grad_shapes = {tuple(p.shape) for p in trainer._params()}
    for x, y in loader(2, 16):
        trainer.train_step(x, y)
    assert all(p.grad is not None for p in trainer._params())
    copied.clear()
    trainer.save_state(tmp_path / "whole.pt")
    assert torch.load(tmp_path / "whole.pt", weights_only=True)["pending_grads"] is None
    assert not grad_shapes & set(copied)
    trainer.train_step(*data(16))
    copied.clear()
    trainer.save_state(tmp_path / "mid.pt")
    pending = torch.load(tmp_path / "mid.pt", weights_only=True)["pending_grads"]
    assert len(pending) == len(trainer._params()) and grad_shapes <= set(copied)


def test_state_file_is_weights_only_loadable_and_config_checked(tmp_path, caplog):
    trainer = make(MixedPrecisionConfig(mode="manual", precision_level="fp16"), scheduler=True)
    trainer.train_step(*data(16))
    trainer.save_state(tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    assert {"model", "optimizer", "scaler", "scheduler", "counters", "config",
            "adaptive"} <= set(state)
    assert any("master_param" in s for s in state["optimizer"]["state"].values())
    assert state["config"]["mode"] == "manual" and state["scaler"]["scale"] == 65536.0
    other = make(MixedPrecisionConfig(mode="manual", precision_level="fp16", max_grad_norm=3.0),
                 scheduler=True)
    with pytest.warns(UserWarning, match="config differs from the saved one in "
                      r"\['max_grad_norm'\]"):
        other.load_state(tmp_path / "s.pt")
    with pytest.raises(ValueError, match="config differs"):
        other.load_state(tmp_path / "s.pt", strict_config=True)


def test_documented_script_end_to_end(tmp_path):
    """config -> setup_training -> train -> stats -> save_state -> load_state."""
    config = MixedPrecisionConfig.standard(mode="automatic", precision_level="fp16",
                                           max_grad_norm=1.0, logging_frequency=5)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    trainer = MixedPrecisionTrainer(config)
    trainer.setup_training(model, optimizer, nn.CrossEntropyLoss(), scheduler)
    history = trainer.train(loader(5, seed=4), num_epochs=2, val_loader=loader(2, seed=5),
                            progress=False)
    stats = trainer.stats()
    assert stats["total_steps"] == 10 and history[-1]["val_accuracy"] is not None
    trainer.save_state(tmp_path / "run.pt")
    trainer2 = MixedPrecisionTrainer(config)
    torch.manual_seed(1)
    model2 = Net()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    trainer2.setup_training(model2, opt2, nn.CrossEntropyLoss(),
                            torch.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=20))
    trainer2.load_state(tmp_path / "run.pt")
    assert trainer2.stats()["total_steps"] == 10
    assert trainer2.evaluate(loader(2, seed=5)) == trainer.evaluate(loader(2, seed=5))


def test_setup_required():
    with pytest.raises(RuntimeError, match="setup_training"):
        MixedPrecisionTrainer().train_step(torch.zeros(1), torch.zeros(1))
    with pytest.raises(TypeError, match="MixedPrecisionConfig"):
        MixedPrecisionTrainer(config={"mode": "automatic"})  # type: ignore[arg-type]


# ------------------------------------------------------------------------ manager, aliases
def test_trainer_holds_its_manager():
    trainer = make(MixedPrecisionConfig(mode="manual", precision_level="bf16"))
    manager = trainer.mixed_precision_manager
    assert isinstance(manager, mixprec.MixedPrecisionManager)
    assert manager.model is trainer.model and manager.optimizer is trainer.optimizer
    assert trainer.scaler is manager.scaler and trainer.policy_handle is manager.policy_handle
    assert trainer.compute_dtype is manager.compute_dtype is torch.bfloat16
    assert MixedPrecisionTrainer().mixed_precision_manager is None


def test_mixed_precision_aliases(tmp_path):
    """save_/load_mixed_precision_state and get_mixed_precision_stats are save_state,
    load_state and stats under the names of the system mixprec replaces."""
    cfg = MixedPrecisionConfig(precision_level="fp16", scale_window=2)
    trainer = make(cfg, scheduler=True)
    for x, y in loader(3):
        trainer.train_step(x, y)
    assert trainer.get_mixed_precision_stats() == trainer.stats()
    trainer.save_mixed_precision_state(tmp_path / "alias.pt")
    trainer.save_state(tmp_path / "plain.pt")
    a = torch.load(tmp_path / "alias.pt", weights_only=True)
    b = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert a.keys() == b.keys() and a["counters"] == b["counters"]
    other = make(cfg, scheduler=True, seed=5)
    other.load_mixed_precision_state(tmp_path / "alias.pt")
    assert other.get_mixed_precision_stats()["total_steps"] == 3
    assert other.scaler.get_scale() == trainer.scaler.get_scale()
    for p, q in zip(trainer.model.parameters(), other.model.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())
    with pytest.raises(ValueError, match="config differs"):
        make(MixedPrecisionConfig(precision_level="fp16")).load_mixed_precision_state(
            tmp_path / "alias.pt", strict_config=True)
    for alias, name in (("save_mixed_precision_state", "save_state"),
                        ("load_mixed_precision_state", "load_state"),
                        ("get_mixed_precision_stats", "stats")):
        assert name in getattr(MixedPrecisionTrainer, alias).__doc__


def test_train_without_tqdm_prints_plain_progress(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """tqdm is only in the ``demo`` extra: with it not importable, the README's trainer
    quickstart runs as it is and ``train`` prints one line at the start and one per epoch
    instead of a bar."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "project"))
    from test_docs import ROOT, runnable_blocks

    monkeypatch.setitem(sys.modules, "tqdm", None)  # (import tqdm raises ImportError)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError):
        import tqdm.auto  # noqa: F401
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    setup = blocks[0]
    quickstart = next(b for b in blocks if "trainer.train(" in b)
    namespace: Dict[str, Any] = {"__name__": "readme"}
    exec(compile(setup + "\n" + quickstart, "README.md trainer quickstart", "exec"),  # noqa: S102
         namespace)
    assert len(namespace["history"]) == 2
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("train (")]
    assert lines[0].endswith(": 16 batches"), lines
    assert [x.split("|")[0].split(": ", 1)[1].strip() for x in lines[1:]] == [
        "8/16 batches", "16/16 batches"], lines
    assert "epoch 1" in lines[1] and "epoch 2" in lines[2], lines


def test_plot_without_matplotlib_names_the_install(monkeypatch, tmp_path) -> None:
    """matplotlib is only in the demo extra: plotting without it says what to install."""
    import sys

    from mixprec.train.metrics import plot_history

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="needs matplotlib: pip install matplotlib"):
        plot_history([0], None, "t", tmp_path / "x.png")
