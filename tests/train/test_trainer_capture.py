"""``MixedPrecisionConfig(capture=True)``: the trainer's and the manager's steps through
``mixprec.capture_step``. On CPU the captured step runs eagerly after the same checks
(``mode == "eager"``), so these tests prove: the setting routes every step through
``capture_step`` (its checked call refuses a host sync), training is the same bits as
with the setting off, a checkpoint resumes bit for bit, and what cannot be captured is
refused with an error naming the setting. (Replay on a GPU: ``make demo``,
``tools/gpu_capture_check.py``.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec
import mixprec.optim
from _helpers import assert_bitwise_equal, torch_threads
from mixprec import MixedPrecisionConfig, MixedPrecisionManager, MixedPrecisionTrainer
from mixprec.capture import CapturedStep, CaptureError


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def batches(n: int = 8, bs: int = 8, seed: int = 3, overflow_at: int = 4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(bs, 8, generator=g)
        y = x[:, :4].argmax(1)
        out.append((x * 1e6 if i == overflow_at else x, y))  # an fp16 overflow step
    return out


# fp16 with the scaler (clipping, growth every 2 steps), bf16 MANUAL (a torch AdamW swapped
# for mixprec's, masters), plain fp32 (a disabled scaler)
CONFIGS = {
    "fp16_scaler": dict(precision_level="fp16", initial_scale=2.0**12, scale_window=2,
                        max_grad_norm=1.0, logging_frequency=3),
    "manual_bf16": dict(mode="manual", precision_level="bf16", logging_frequency=3),
    "disabled": dict(enabled=False, logging_frequency=3),
}


def make(name: str, capture: bool, seed: int = 0) -> MixedPrecisionTrainer:
    torch.manual_seed(seed)
    model = Net()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(**CONFIGS[name], capture=capture))
    return trainer.setup_training(model, opt, nn.CrossEntropyLoss(), sched)


def assert_same_run(a: MixedPrecisionTrainer, b: MixedPrecisionTrainer) -> None:
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())
        for key, v in a.optimizer.state[p].items():
            if isinstance(v, torch.Tensor):
                assert_bitwise_equal(b.optimizer.state[q][key], v)
    assert b.scheduler.last_epoch == a.scheduler.last_epoch
    sa, sb = a.stats(), b.stats()
    for k in ("total_steps", "skipped_steps", "current_scale", "scale_increases",
              "scale_decreases", "scale_history", "nan_steps", "avg_grad_norm"):
        assert sa[k] == sb[k] or (sa[k] != sa[k] and sb[k] != sb[k]), k
    assert b.mixed_precision_manager.steps == a.mixed_precision_manager.steps


def step_values(m) -> dict:
    """The step's metrics but ``memory_usage`` (the process's RSS), NaN as a string."""
    return {k: "nan" if v != v else v for k, v in m.items() if k != "memory_usage"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_captured_trainer_is_the_eager_run_bit_for_bit(name):
    eager, captured = make(name, False), make(name, True)
    for x, y in batches():
        me, mc = eager.train_step(x, y), captured.train_step(x, y)
        assert step_values(mc) == step_values(me)
    assert_same_run(eager, captured)
    # the steps went through capture_step (CPU: its validation mode)
    (step,) = captured._step_fn.captured  # one input signature: one captured step
    assert isinstance(step, CapturedStep) and step.mode == "eager"
    assert eager._step_fn is None
    if name == "fp16_scaler":  # the overflow step was skipped and the scale backed off
        assert captured.stats()["skipped_steps"] >= 1
        assert captured.stats()["scale_decreases"] >= 1


def test_captured_trainer_resumes_bit_for_bit(tmp_path):
    data = batches(10)
    full = make("fp16_scaler", True)
    for i, (x, y) in enumerate(data):
        full.train_step(x, y)
        if i == 4:  # right after the overflow step
            full.save_state(tmp_path / "ckpt.pt")
    resumed = make("fp16_scaler", True, seed=123)  # other init: overwritten by the load
    resumed.train_step(*data[0])  # a captured step already built: the load re-makes it
    resumed.load_state(tmp_path / "ckpt.pt", strict_config=True)
    for x, y in data[5:]:
        resumed.train_step(x, y)
    assert_same_run(full, resumed)
    eager = make("fp16_scaler", False)
    for x, y in data:
        eager.train_step(x, y)
    assert_same_run(eager, resumed)


def test_handling_actions_act_at_log_steps_with_capture():
    """A log step reads the metrics between captured calls: nan_handling='raise' acts."""
    trainer = make("fp16_scaler", True)
    trainer.config.nan_handling = "raise"
    trainer.config.validate()
    x, y = batches(1)[0]
    bad = x.clone()
    bad[0] = float("nan")
    trainer.train_step(x, y)
    trainer.train_step(bad, y)
    with pytest.raises(FloatingPointError, match="nan"):
        trainer.train_step(x, y)


# ------------------------------------------------------------------------ refusals
def test_config_round_trip_and_validation():
    cfg = MixedPrecisionConfig(capture=True, precision_level="fp16")
    assert cfg.to_dict()["capture"] is True
    assert MixedPrecisionConfig.from_dict(cfg.to_dict()) == cfg
    assert MixedPrecisionConfig().capture is False
    with pytest.raises(TypeError, match="capture"):
        MixedPrecisionConfig(capture=1)
    with pytest.raises(ValueError, match="capture=True is refused in mode ADAPTIVE"):
        MixedPrecisionConfig(capture=True, mode="adaptive")
    with pytest.raises(ValueError, match="capture=True needs gradient_accumulation_steps=1"):
        MixedPrecisionConfig(capture=True, gradient_accumulation_steps=2)
    MixedPrecisionConfig(capture=True, mode="adaptive", enabled=False)  # nothing adapts


def test_checkpoint_carries_the_setting(tmp_path, caplog):
    trainer = make("fp16_scaler", True)
    trainer.train_step(*batches(1)[0])
    trainer.save_state(tmp_path / "c.pt")
    saved = torch.load(tmp_path / "c.pt", weights_only=True)["config"]
    assert saved["capture"] is True
    with pytest.raises(ValueError, match="capture"):
        make("fp16_scaler", False).load_state(tmp_path / "c.pt", strict_config=True)


def test_an_optimizer_that_reads_the_host_is_refused_naming_the_setting():
    torch.manual_seed(0)
    model = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(precision_level="fp16", capture=True))
    trainer.setup_training(model, torch.optim.AdamW(model.parameters()), nn.CrossEntropyLoss())
    x, y = batches(1)[0]
    with pytest.raises(CaptureError, match=r"MixedPrecisionConfig.capture=True: .*found_inf"):
        trainer.train_step(x, y)


def test_a_host_sync_in_the_step_is_refused_at_the_checked_call():
    """The third call is capture_step's checked one: a criterion reading the loss on the
    host is refused there, naming the setting and the op."""

    def criterion(out, y):
        loss = nn.functional.cross_entropy(out, y)
        if loss.item() > 1e9:  # host logic in the step
            return loss * 0
        return loss

    torch.manual_seed(0)
    model = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(precision_level="bf16", capture=True))
    trainer.setup_training(model, mixprec.optim.AdamW(model.parameters()), criterion)
    x, y = batches(1)[0]
    trainer.train_step(x, y)
    trainer.train_step(x, y)  # warm-up calls
    with pytest.raises(CaptureError, match=r"capture=True: .*syncs with the host.*local_scalar"):
        trainer.train_step(x, y)


# ------------------------------------------------------------------------ the manager
def _manager(capture: bool) -> tuple[nn.Module, MixedPrecisionManager]:
    torch.manual_seed(0)
    model = Net()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = MixedPrecisionConfig(precision_level="fp16", initial_scale=2.0**12, scale_window=2,
                               capture=capture)
    return model, MixedPrecisionManager(model, opt, cfg)


def test_manager_make_step_is_the_eager_loop_bit_for_bit():
    runs = []
    for capture in (False, True):
        model, manager = _manager(capture)

        def train_step(x, y, model=model, manager=manager):
            manager.optimizer.zero_grad(set_to_none=False)
            with manager.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            manager.backward(loss)
            manager.step()
            return loss.detach()

        data = batches()
        step = manager.make_step(train_step, data[0])
        assert (step is train_step) is not capture
        losses = [step(x, y) for x, y in data[:3]]
        first = list(getattr(step, "captured", []))
        manager.reset_scaler()  # a new scaler: the made step re-captures with it
        losses += [step(x, y) for x, y in data[3:]]
        assert manager.steps == len(data)
        if capture:
            (before,), (after,) = first, step.captured  # one signature: one captured step
            assert isinstance(before, CapturedStep) and isinstance(after, CapturedStep)
            assert after is not before
        runs.append((model, manager, losses))
    (m0, g0, l0), (m1, g1, l1) = runs
    for p, q in zip(m0.parameters(), m1.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())
    for a, b in zip(l0, l1):
        assert_bitwise_equal(b, a)
    assert g1.stats()["skipped_steps"] == g0.stats()["skipped_steps"] >= 1


def test_manager_step_outside_a_made_step_is_refused():
    model, manager = _manager(True)
    x, y = batches(1)[0]
    with manager.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    manager.backward(loss)
    with pytest.raises(RuntimeError, match=r"capture=True: .*make_step"):
        manager.step()
