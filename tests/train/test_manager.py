"""MixedPrecisionManager in a hand-written loop: every mode, skipped steps, state, stats."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import mixprec
import mixprec.optim
from _helpers import assert_bitwise_equal, torch_threads
from mixprec import MixedPrecisionConfig, MixedPrecisionManager, MixedPrecisionTrainer
from mixprec.train.manager import StepResult


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class Overflowing(nn.Module):
    """``big``'s outputs exceed float16's range."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.big = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.big.weight.mul_(1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.big(torch.relu(self.fc1(x))))))


def batches(n: int = 6, bs: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(bs, 8, generator=g)
        out.append((x, x[:, :4].argmax(1)))
    return out


# every mode, and mixed precision off
CONFIGS = {
    "automatic_fp16": dict(mode="automatic", precision_level="fp16"),
    "automatic_bf16": dict(mode="automatic", precision_level="bf16"),
    "manual_bf16": dict(mode="manual", precision_level="bf16"),
    "selective_fp16": dict(mode="selective", precision_level="fp16", selective_layers=["fc2"]),
    "adaptive_fp16": dict(mode="adaptive", precision_level="fp16", logging_frequency=2),
    "gradient_scaling": dict(mode="gradient_scaling", initial_scale=1024.0),
    "disabled": dict(enabled=False),
}


def make_manager(name: str, model: nn.Module | None = None, seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = model if model is not None else Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager = MixedPrecisionManager(model, opt, MixedPrecisionConfig(**{**CONFIGS[name], **kw}))
    return model, manager


def hand_step(model, manager, x, y):
    """The hand-written loop's body."""
    manager.optimizer.zero_grad(set_to_none=True)
    with manager.autocast():
        out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    manager.backward(loss)
    return loss.detach(), manager.step()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hand_written_loop_trains_in_every_mode(name):
    model, manager = make_manager(name)
    losses = []
    for _ in range(3):
        for x, y in batches():
            loss, result = hand_step(model, manager, x, y)
            assert isinstance(result, StepResult)
            assert bool(result) is True and result.applied.dtype == torch.bool
            losses.append(float(loss))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]  # it learns
    assert manager.steps == 18
    st = manager.stats()
    assert st["steps"] == 18 and st["skipped_steps"] == 0
    assert st["mode"] == MixedPrecisionConfig(**CONFIGS[name]).mode.value
    if name == "manual_bf16":
        assert isinstance(manager.optimizer, mixprec.optim.AdamW)
        assert model.fc1.weight.dtype == torch.bfloat16
        assert model.norm.weight.dtype == torch.float32
    else:
        assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trainer_is_the_manager_loop(name):
    """The trainer is built on the manager: the same steps give the same bits."""
    model, manager = make_manager(name)
    for x, y in batches():
        hand_step(model, manager, x, y)
    torch.manual_seed(0)
    model2 = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(**CONFIGS[name]))
    trainer.setup_training(model2, torch.optim.AdamW(model2.parameters(), lr=1e-2),
                           nn.CrossEntropyLoss())
    assert isinstance(trainer.mixed_precision_manager, MixedPrecisionManager)
    assert trainer.scaler is trainer.mixed_precision_manager.scaler
    for x, y in batches():
        trainer.train_step(x, y)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())
    assert trainer.scaler.get_scale() == manager.scaler.get_scale()


def test_manual_autocast_casts_inputs_only_inside():
    model, manager = make_manager("manual_bf16")
    x, _ = batches(1)[0]
    seen = []
    model.fc1.register_forward_hook(lambda m, i, o: seen.append(i[0].dtype))
    with manager.autocast():
        out = model(x)
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert not model._forward_pre_hooks  # the cast hook is gone after the context
    with pytest.raises(RuntimeError, match="dtype"):
        model(x)  # float32 input, bfloat16 weights: the cast is the context's job


@pytest.mark.parametrize("name", ["automatic_fp16", "automatic_bf16", "manual_bf16",
                                  "gradient_scaling"])
def test_one_step_with_an_inf_is_skipped(name):
    model, manager = make_manager(name)
    data = batches(3)
    hand_step(model, manager, *data[0])
    before = [p.detach().clone() for p in model.parameters()]
    masters = {id(p): s["master_param"].clone() for p, s in manager.optimizer.state.items()
               if "master_param" in s}
    scale_before = manager.scaler.get_scale()
    x, y = data[1]
    bad = x.clone()
    bad[0, 0] = float("inf")
    _, result = hand_step(model, manager, bad, y)
    assert result.found_inf.item() == 1.0 and not result.applied.item()
    assert bool(result) is False and manager.step_was_skipped
    for p, b in zip(model.parameters(), before):
        assert_bitwise_equal(p.detach(), b)
    for p, s in manager.optimizer.state.items():
        if id(p) in masters:
            assert_bitwise_equal(s["master_param"], masters[id(p)])
    if manager.loss_scaling:
        assert manager.scaler.get_scale() == scale_before * 0.5  # backed off
    else:
        assert manager.scaler.get_scale() == 1.0
    _, result = hand_step(model, manager, *data[2])
    assert bool(result) and not manager.step_was_skipped
    st = manager.stats()
    assert st["steps"] == 3 and st["skipped_steps"] == 1 and st["last_overflow_step"] == 1
    assert st["overflow_rate"] == pytest.approx(1 / 3)


def test_disabled_scaler_steps_are_applied_without_a_sync():
    model, manager = make_manager("disabled")
    x, y = batches(1)[0]
    bad = x.clone()
    bad[0, 0] = float("nan")
    _, result = hand_step(model, manager, bad, y)
    assert not result.checked and result._host is True  # known on the host
    assert bool(result) and not manager.step_was_skipped  # nothing checks, nothing skips
    assert result.found_inf.item() == 1.0  # but the non-finite grad norm is reported


def test_state_dict_round_trip(tmp_path):
    model, manager = make_manager("automatic_fp16", scale_window=2)
    for x, y in batches():
        hand_step(model, manager, x, y)
    path = tmp_path / "mp.pt"
    torch.save(manager.state_dict(), path)
    state = torch.load(path, weights_only=True)
    assert state["format"] == 1 and state["steps"] == 6
    _, other = make_manager("automatic_fp16", scale_window=2, seed=1)
    other.load_state_dict(state)
    assert manager.scaler.get_scale() > 65536.0  # grew
    assert other.scaler.get_scale() == manager.scaler.get_scale()
    assert other.steps == 6 and other.state_dict()["scaler"] == state["scaler"]
    with pytest.raises(ValueError, match="format"):
        other.load_state_dict({**state, "format": 99})


def test_adaptive_in_a_hand_written_loop_and_its_state(tmp_path):
    """ADAPTIVE evaluates inside step() every logging_frequency steps; the plan is saved
    and re-applied by load_state_dict."""
    model, manager = make_manager("adaptive_fp16", model=Overflowing(), logging_frequency=2,
                                  overflow_threshold=0.5)
    results = [hand_step(model, manager, x, y)[1] for x, y in batches(2)]
    assert not any(bool(r) for r in results)  # the fp16 forward overflows
    decisions = manager.stats()["adaptive_decisions"]
    assert len(decisions) == 1 and decisions[0]["module"] == "big"
    assert decisions[0]["step"] == 2 and manager.overrides == {"big": decisions[0]["to"]}
    later = [hand_step(model, manager, x, y)[1] for x, y in batches(3, seed=1)]
    assert all(bool(r) for r in later[1:])
    torch.save(manager.state_dict(), tmp_path / "a.pt")
    other_model, other = make_manager("adaptive_fp16", model=Overflowing(), seed=1)
    other.load_state_dict(torch.load(tmp_path / "a.pt", weights_only=True))
    assert other.adaptive_decisions == decisions
    assert other.policy_handle.precisions["big"] == decisions[0]["to"]


def test_close_takes_policy_and_hooks_off():
    model, manager = make_manager("adaptive_fp16")
    assert getattr(model, "_mixprec_policy", None) is not None
    assert model.fc1._forward_hooks
    manager.close()
    assert getattr(model, "_mixprec_policy", None) is None
    assert not model.fc1._forward_hooks


def test_bad_config_type():
    model = Net()
    with pytest.raises(TypeError, match="MixedPrecisionConfig"):
        MixedPrecisionManager(model, torch.optim.SGD(model.parameters(), lr=0.1),
                              {"mode": "automatic"})  # type: ignore[arg-type]


def test_manual_converts_the_float_buffers_of_converted_modules() -> None:
    class WithBuffers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.norm = nn.BatchNorm1d(4)
            self.register_buffer("shift", torch.ones(4))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.lin(x) + self.shift)

    m = WithBuffers()
    MixedPrecisionManager(m, torch.optim.AdamW(m.parameters()),
                          MixedPrecisionConfig(mode="manual", precision_level="bf16"))
    assert m.shift.dtype == torch.bfloat16 and "shift" in dict(m.named_buffers())
    assert m.count.dtype == torch.int64  # not floating: left alone
    assert m.norm.running_mean.dtype == torch.float32  # a float32 module: left alone


@pytest.mark.parametrize("bits", [16, 8])
def test_manual_keeps_split_masters(bits):
    """MixedPrecisionConfig(master_correction_bits=...): MANUAL's optimizer keeps the bf16
    params' masters as corrections from the start (the converted float32 weights encoded);
    with 16 bits it trains as float32 masters do, bit for bit (no midpoint hit here)."""
    model, manager = make_manager("manual_bf16", master_correction_bits=bits)
    ref_model, ref = make_manager("manual_bf16")
    opt = manager.optimizer
    w = model.fc1.weight
    want = torch.int16 if bits == 16 else torch.int8
    assert opt.state[w]["master_correction"].dtype == want  # before any step
    for x, y in batches():
        hand_step(model, manager, x, y)
        hand_step(ref_model, ref, x, y)
    assert opt.param_groups[0]["master_correction_bits"] == bits
    assert opt.state[w]["master_correction"].dtype == want
    assert "master_param" not in opt.state[w]
    assert not {"master_param", "master_correction"} & set(opt.state[model.norm.weight])
    if bits == 16:
        for p, q in zip(model.parameters(), ref_model.parameters()):
            assert_bitwise_equal(p.detach(), q.detach())
    torch.manual_seed(0)
    model2 = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(**CONFIGS["manual_bf16"],
                                                         master_correction_bits=bits))
    trainer.setup_training(model2, torch.optim.AdamW(model2.parameters(), lr=1e-2),
                           nn.CrossEntropyLoss())
    for x, y in batches():
        trainer.train_step(x, y)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())  # the trainer passes it through


def test_trainer_checkpoint_with_split_masters_resumes(tmp_path):
    def make():
        torch.manual_seed(0)
        m = Net()
        t = MixedPrecisionTrainer(MixedPrecisionConfig(**CONFIGS["manual_bf16"],
                                                       master_correction_bits=8))
        return m, t.setup_training(m, torch.optim.AdamW(m.parameters(), lr=1e-2),
                                   nn.CrossEntropyLoss())

    m, t = make()
    data = batches()
    for x, y in data[:3]:
        t.train_step(x, y)
    t.save_state(tmp_path / "split.pt")
    for x, y in data[3:]:
        t.train_step(x, y)
    m2, t2 = make()
    t2.load_state(tmp_path / "split.pt")
    for x, y in data[3:]:
        t2.train_step(x, y)
    for p, q in zip(m.parameters(), m2.parameters()):
        assert_bitwise_equal(q.detach(), p.detach())
    assert t2.optimizer.state[m2.fc1.weight]["master_correction"].dtype == torch.int8


def test_manual_refuses_split_masters_for_float16_compute():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="master_correction_bits=16: the params are "
                                         "converted to float16 here"):
        MixedPrecisionManager(model, opt, MixedPrecisionConfig(
            mode="manual", precision_level="fp16", master_correction_bits=16))
    assert all(p.dtype == torch.float32 for p in model.parameters())
