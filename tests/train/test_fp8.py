"""The FP8 precision level (``precision_level="fp8"``: torchao's Float8 linears, the rest in
bfloat16) on the CPU: conversion and its filter, CPU autocast, mixprec's optimizers,
scaler and clipping on the converted model, mixprec AdamW == torch AdamW there, checkpoint
round trips, torch.compile, the refusals, and the missing-torchao error. Everything but the
missing-torchao test skips without torchao. FSDP2: tests/distributed/test_fp8_fsdp2.py."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_map

import mixprec
import mixprec.optim
from _helpers import REPO, assert_bitwise_equal, torch_threads
from mixprec import MixedPrecisionConfig, MixedPrecisionManager, MixedPrecisionTrainer

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
ROOT = REPO


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def needs_torchao() -> Any:
    return pytest.importorskip("torchao.float8", reason="the FP8 level needs torchao")


class Net(nn.Module):
    """fc_in (first) and head (last) stay bfloat16 by default; odd (24 -> 20) is not a
    multiple of 16; fc1, fc2 are converted."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(16, 32)
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 32)
        self.odd = nn.Linear(32, 20)
        self.head = nn.Linear(20, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc_in(x))
        x = self.fc2(torch.relu(self.norm(self.fc1(x))))
        return self.head(torch.relu(self.odd(x)))


def data(n: int = 6, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g))
            for _ in range(n)]


def plain_state_types(opt: torch.optim.Optimizer) -> set[type]:
    return {type(v) for st in opt.state.values() for v in st.values()
            if isinstance(v, torch.Tensor)}


# ----------------------------------------------------------------------------- torchao absent

def test_missing_torchao_raises_an_error_naming_the_install(monkeypatch):
    for name in [n for n in sys.modules if n == "torchao" or n.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)
    from mixprec import info
    from mixprec.train import fp8

    why = mixprec.fp8_unavailable()
    assert why is not None and 'pip install "mixprec[fp8]"' in why and "torchao" in why
    assert mixprec.fp8_available() is False
    full = info.full_info()
    assert full["fp8"] is False and full["fp8_torchao"] is None and "torchao" in full["fp8_detail"]
    model = Net()
    cfg = MixedPrecisionConfig(precision_level="fp8")  # the config itself needs no torchao
    with pytest.raises(ImportError, match=r'needs torchao.*pip install "mixprec\[fp8\]"'):
        MixedPrecisionTrainer(cfg).setup_training(
            model, torch.optim.AdamW(model.parameters()), nn.functional.mse_loss)
    with pytest.raises(ImportError, match="mixprec.fp8"):
        fp8.convert_model(model)
    assert not fp8.float8_linears(model)  # nothing half-converted


# ----------------------------------------------------------------------------- config

def test_config_fields_and_refusals():
    cfg = MixedPrecisionConfig(precision_level="FP8", fp8_recipe="rowwise")
    assert cfg.precision_level is mixprec.PrecisionLevel.FP8
    back = MixedPrecisionConfig.from_dict(cfg.to_dict())
    assert back == cfg and back.to_dict()["precision_level"] == "fp8"
    with pytest.raises(ValueError, match="fp8_recipe.*'tensorwise', 'rowwise'"):
        MixedPrecisionConfig(precision_level="fp8", fp8_recipe="delayed")
    with pytest.raises(ValueError, match="FP8 runs in mode AUTOMATIC or MANUAL, got mode "
                       "SELECTIVE"):
        MixedPrecisionConfig(mode="selective", precision_level="fp8", selective_layers=["fc1"])
    with pytest.raises(ValueError, match="FP8 runs in mode AUTOMATIC or MANUAL"):
        MixedPrecisionConfig(mode="adaptive", precision_level="fp8")
    # FSDP2's float8 all-gather: refused, saying why
    with pytest.raises(ValueError, match=r"fp8_fsdp_all_gather=True is refused for now.*"
                       r"gloo cannot all-gather float8.*not been measured on a GPU"):
        MixedPrecisionConfig(precision_level="fp8", fp8_fsdp_all_gather=True)
    with pytest.raises(TypeError, match="fp8_keep_first_last"):
        MixedPrecisionConfig(fp8_keep_first_last=1)


# ----------------------------------------------------------------------------- conversion

def test_default_filter_keeps_first_last_and_non_multiples_of_16():
    needs_torchao()
    model = Net()
    manager = MixedPrecisionManager(model, torch.optim.AdamW(model.parameters()),
                                    MixedPrecisionConfig(precision_level="fp8"))
    assert manager.fp8 is not None and manager.fp8.modules == ["fc1", "fc2"]
    assert [type(m).__name__ for m in (model.fc_in, model.odd, model.head)] == ["Linear"] * 3
    assert manager.describe() == "automatic, fp8 (tensorwise)"
    assert manager.stats()["compute_dtype"] == "fp8"
    # the swap keeps the Parameter objects: the optimizer still holds the model's params
    assert {id(p) for p in model.parameters()} == {
        id(p) for g in manager.optimizer.param_groups for p in g["params"]}
    manager.close()
    assert "forward" not in model.fc1.__dict__  # the wrappers are off; the linears stay Float8
    assert type(model.fc1).__name__ == "Float8Linear"


def test_a_module_filter_replaces_the_first_last_rule_not_the_16_rule():
    needs_torchao()
    model = Net()
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(precision_level="fp8"))
    trainer.setup_training(model, torch.optim.AdamW(model.parameters()),
                           nn.functional.mse_loss, fp8_module_filter=lambda m, fqn: fqn != "fc2")
    assert trainer.mixed_precision_manager.fp8.modules == ["fc_in", "fc1"]
    assert trainer.stats()["compute_dtype"] == "fp8"
    # keep_first_last=False: every multiple-of-16 linear
    model = Net()
    MixedPrecisionManager(model, torch.optim.AdamW(model.parameters()),
                          MixedPrecisionConfig(precision_level="fp8", fp8_keep_first_last=False))
    assert mixprec.train.fp8.float8_linears(model) == ["fc_in", "fc1", "fc2"]


def test_refuses_weights_wrapped_for_the_float8_all_gather():
    f8 = needs_torchao()
    model = Net()
    f8.convert_to_float8_training(
        model, config=f8.Float8LinearConfig(enable_fsdp_float8_all_gather=True),
        module_filter_fn=lambda m, fqn: fqn in ("fc1", "fc2"))
    with pytest.raises(ValueError, match="WeightWithDynamicFloat8CastTensor.*float8 "
                       "all-gather is refused for now.*unmeasured on GPU"):
        MixedPrecisionManager(model, torch.optim.AdamW(model.parameters()),
                              MixedPrecisionConfig(precision_level="fp8"))


# ----------------------------------------------------------------------------- CPU autocast

def test_torchao_alone_fails_under_cpu_autocast():
    """The sharp edge the FP8 level works around (a canary: when torchao fixes its forward,
    this fails and the wrapper in mixprec.train.fp8 may go)."""
    f8 = needs_torchao()
    model = Net()
    f8.convert_to_float8_training(
        model, config=f8.Float8LinearConfig.from_recipe_name("rowwise_with_gw_hp"),
        module_filter_fn=lambda m, fqn: fqn in ("fc_in", "fc1"))
    x, y = data(1)[0]  # fc_in: a float32 input under CPU autocast
    with pytest.raises(RuntimeError, match="same dtype"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()


@pytest.mark.parametrize("mode", ["automatic", "manual"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_trains_under_cpu_autocast(recipe, mode):
    needs_torchao()
    model = Net()
    seen: list[torch.dtype] = []
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(
        mode=mode, precision_level="fp8", fp8_recipe=recipe, fp8_keep_first_last=False,
        logging_frequency=1000))
    trainer.setup_training(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                           nn.functional.mse_loss)
    # fc_in (converted here) gets the float32 input of the model: torchao alone fails on it
    assert type(model.fc_in).__name__ == "Float8Linear"
    for m in (model.fc_in, model.fc1):
        m.register_forward_hook(lambda m, a, out: seen.extend([a[0].dtype, out.dtype]))
    batches = data(8)
    losses = [float(trainer.train_step(x, y)["loss"]) for x, y in batches]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert trainer.stats()["skipped_steps"] == 0
    # the Float8 linears return bfloat16, on the CPU as on CUDA (fc_in from a float32 input)
    assert set(seen[1::2]) == {torch.bfloat16}
    assert seen[0] == (torch.float32 if mode == "automatic" else torch.bfloat16)
    want = torch.float32 if mode == "automatic" else torch.bfloat16
    assert model.fc1.weight.dtype == want
    assert all(type(p) is nn.Parameter for p in model.parameters())


# ----------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    # name: (mode, optimizer factory, config overrides)
    "adamw32": ("automatic", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2), {}),
    "adamw8": ("automatic", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, state_bits=8,
                                                           min_8bit_size=1), {}),
    "bf16_masters": ("manual", lambda ps: torch.optim.AdamW(ps, lr=1e-2), {}),
    "bf16_masters_8bit": ("manual", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2,
                                                                   min_8bit_size=1),
                          {"optimizer_state_bits": 8}),
    "bf16_stochastic_rounding": ("manual", lambda ps: mixprec.optim.AdamW(
        ps, lr=1e-2, master_weights=False, stochastic_rounding=True),
        {"master_weights": False}),
    "sgd_scaler_clip": ("automatic", lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9),
                        {"loss_scaling": True, "max_grad_norm": 0.5}),
    "adamw_scaler_clip_manual": ("manual", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2),
                                 {"loss_scaling": True, "max_grad_norm": 0.5}),
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mixprec_optimizers_scaler_and_clipping_on_the_converted_model(name, recipe):
    needs_torchao()
    mode, make, over = OPTIMIZERS[name]
    model = Net()
    cfg = MixedPrecisionConfig(mode=mode, precision_level="fp8", fp8_recipe=recipe,
                               logging_frequency=1000, **over)
    trainer = MixedPrecisionTrainer(cfg)
    trainer.setup_training(model, make(model.parameters()), nn.functional.mse_loss)
    opt = trainer.optimizer
    assert isinstance(opt, mixprec.optim.FusedOptimizer)
    before = [p.detach().clone() for p in model.parameters()]
    losses = [float(trainer.train_step(x, y)["loss"]) for x, y in data(8)]
    assert losses[-1] < losses[0], losses
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    st = trainer.stats()
    assert st["skipped_steps"] == 0
    if over.get("max_grad_norm"):
        assert st["avg_grad_norm"] > 0
    if over.get("loss_scaling"):
        assert st["current_scale"] > 1.0
    # optimizer state and masters are plain tensors
    assert plain_state_types(opt) == {torch.Tensor}
    masters = [st.get("master_param") for st in opt.state.values()]
    if mode == "manual" and cfg.master_weights:  # for every bfloat16 param (not the norm's)
        for p in model.parameters():
            m = opt.state[p].get("master_param")
            assert (m is not None and m.dtype == torch.float32) == (p.dtype == torch.bfloat16)
        assert model.fc1.weight.dtype == torch.bfloat16
    else:
        assert all(m is None for m in masters)
    if over.get("optimizer_state_bits") == 8 or name == "adamw8":
        assert opt.state[model.fc1.weight]["exp_avg"].dtype == torch.uint8


@pytest.mark.parametrize("recipe", RECIPES)
def test_mixprec_adamw_equals_torch_adamw_on_the_converted_model(recipe):
    """Fed the same gradients (those of the mixprec copy), mixprec's AdamW stays as close
    to torch's AdamW in float64 as torch's own float32 AdamW (foreach=False) does: equal
    within float32 rounding (distances in ulps of |p| + lr: an update of size lr rounds at
    its own scale)."""
    needs_torchao()
    from mixprec.train.fp8 import Fp8Handle

    base = Net()
    Fp8Handle(base, recipe, torch.bfloat16, "cpu")
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    ref = [p.detach().double().clone().requires_grad_(True) for p in base.parameters()]
    oa = mixprec.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    oref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    err = [0.0, 0.0]
    for x, y in data(20):
        oa.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = a(x)
        nn.functional.mse_loss(out.float(), y).backward()
        for p, q, r in zip(a.parameters(), b.parameters(), ref):
            q.grad = p.grad.clone()
            r.grad = p.grad.double()
        for o in (oa, ob, oref):
            o.step()
        for p, q, r in zip(a.parameters(), b.parameters(), ref):
            ulp = torch.finfo(torch.float32).eps * (r.detach().abs() + 1e-2)
            for k, t in enumerate((p, q)):
                err[k] = max(err[k], float(((t.detach().double() - r.detach()).abs()
                                             / ulp).max()))
    mine, theirs = err
    assert mine <= 2 * theirs + 4, (mine, theirs)
    moved = max(float((p.detach() - q.detach()).abs().max())
                for p, q in zip(a.parameters(), base.parameters()))
    assert moved > 1e-3  # it trained


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("mode,recipe,over", [
    ("automatic", "tensorwise", {}),
    ("automatic", "rowwise_with_gw_hp", {"max_grad_norm": 1.0}),
    ("manual", "rowwise", {"optimizer_state_bits": 8}),
])
def test_checkpoint_round_trip_continues_bit_for_bit(tmp_path, mode, recipe, over):
    needs_torchao()
    cfg = MixedPrecisionConfig(mode=mode, precision_level="fp8", fp8_recipe=recipe,
                               logging_frequency=1000, **over)

    def make() -> MixedPrecisionTrainer:
        torch.manual_seed(0)
        model = Net()
        trainer = MixedPrecisionTrainer(copy.deepcopy(cfg))
        trainer.setup_training(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                               nn.functional.mse_loss)
        return trainer

    batches = data(6)
    first = make()
    for x, y in batches[:3]:
        first.train_step(x, y)
    path = tmp_path / "fp8.pt"
    first.save_state(path)
    state = torch.load(path, weights_only=True)  # plain tensors and values only
    assert state["config"]["precision_level"] == "fp8"
    assert any(k.startswith("fc1.") for k in state["model"])
    second = make()
    second.load_state(path, strict_config=True)
    for t in (first, second):
        for x, y in batches[3:]:
            t.train_step(x, y)
    for p, q in zip(first.model.parameters(), second.model.parameters()):
        assert_bitwise_equal(p, q)
    for sa, sb in zip(first.optimizer.state.values(), second.optimizer.state.values()):
        for k, v in sa.items():
            if isinstance(v, torch.Tensor):
                assert_bitwise_equal(v, sb[k])
    # a converted model's state dict loads into a plain (unconverted) model too
    plain = Net()
    plain.load_state_dict(first.model.state_dict())


# ----------------------------------------------------------------------------- compile

@pytest.mark.slow
def test_torch_compile_on_the_cpu():
    """torchao's float8 under torch.compile on the CPU (inductor: about a minute here)."""
    needs_torchao()
    model = Net()
    manager = MixedPrecisionManager(model, mixprec.optim.AdamW(model.parameters(), lr=1e-2),
                                    MixedPrecisionConfig(precision_level="fp8"))
    eager = copy.deepcopy(model)  # (its wrappers call the copy)
    compiled = torch.compile(model)
    x, y = data(1)[0]
    with manager.autocast():
        out_c = compiled(x)
        out_e = eager(x)
    assert out_c.dtype == out_e.dtype == torch.float32
    torch.testing.assert_close(out_c, out_e, atol=0.05, rtol=0.05)
    before = model.fc1.weight.detach().clone()
    manager.backward(nn.functional.mse_loss(out_c, y))
    manager.step()
    assert not torch.equal(before, model.fc1.weight)


# ----------------------------------------------------------------------------- tensor subclasses

class Wrapped(torch.Tensor):
    """A stand-in for torchao's float8 all-gather weight (WeightWithDynamicFloat8CastTensor):
    a wrapper subclass without storage (``data_ptr()`` 0) whose ``clone()``, ``float()``/
    ``to()``, ``detach()`` keep the subclass; other ops return plain tensors."""

    KEEP = {torch.ops.aten.clone.default, torch.ops.aten._to_copy.default,
            torch.ops.aten.detach.default, torch.ops.aten.alias.default}

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapped:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, inner.shape, dtype=inner.dtype, device=inner.device, strides=inner.stride(),
            requires_grad=inner.requires_grad)

    def __init__(self, inner: torch.Tensor) -> None:
        self._inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Wrapped({self._inner!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, size: Any, stride: Any) -> Wrapped:
        return Wrapped(inner["_inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        def unwrap(t: Any) -> Any:
            return t._inner if isinstance(t, Wrapped) else t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if func in cls.KEEP:
            return tree_map(lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t, out)
        if not func._schema.returns:
            return None
        if func._schema.is_mutable:
            return args[0]
        return out


def _subclass_param_step(**kwargs: Any) -> tuple[torch.optim.Optimizer, nn.Parameter]:
    inner = torch.randn(64, 64, dtype=torch.bfloat16)
    p = nn.Parameter(Wrapped(inner))
    assert p.data_ptr() == 0 and type(p.detach().clone().float()) is Wrapped  # the stand-in
    opt = mixprec.optim.AdamW([p], lr=1e-2, **kwargs)
    before = inner.clone()
    p.grad = torch.randn(64, 64, dtype=torch.bfloat16)
    opt.step()
    assert not torch.equal(before, inner)  # the step reached the wrapped tensor
    return opt, p


SUBCLASS_KW = [dict(master_weights=True), dict(master_weights=True, state_bits=8,
                                               min_8bit_size=1),
               dict(master_weights=True, stochastic_rounding=True)]


@pytest.mark.parametrize("kwargs", SUBCLASS_KW, ids=["32bit", "8bit", "sr"])
def test_moments_of_a_tensor_subclass_param_are_plain(kwargs):
    opt, p = _subclass_param_step(**kwargs)
    moments = {k: type(v) for k, v in opt.state[p].items()
               if isinstance(v, torch.Tensor) and k != "master_param"}
    assert moments and set(moments.values()) == {torch.Tensor}, moments


@pytest.mark.parametrize("kwargs", SUBCLASS_KW, ids=["32bit", "8bit", "sr"])
def test_masters_of_a_tensor_subclass_param_are_plain(kwargs):
    opt, p = _subclass_param_step(**kwargs)
    master = opt.state[p]["master_param"]
    assert type(master) is torch.Tensor and master.dtype == torch.float32


# ----------------------------------------------------------------------------- info, bench

def test_info_reports_fp8():
    needs_torchao()
    from mixprec import info

    full = info.full_info()
    assert full["fp8"] is True and mixprec.fp8_available() and mixprec.fp8_unavailable() is None
    import torchao

    assert full["fp8_torchao"] == torchao.__version__
    assert "fp8" in info.format_info()


def test_bench_fp8_gpu_mode_code_runs_tiny_on_the_cpu(capsys):
    needs_torchao()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_fp8
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench_fp8.main(["--device", "cpu", "--tiny"]) == 0
    out = capsys.readouterr().out
    for part in ["bf16 + mixprec AdamW", *[f"fp8 {r} + mixprec AdamW" for r in RECIPES],
                 "torchao fp8 tensorwise + torch fused AdamW"]:
        assert part in out
    assert "check passed" in out


# ----------------------------------------------------------------------------- captured step

@pytest.mark.parametrize("recipe", RECIPES)
def test_capture_step_takes_a_converted_model(recipe: str) -> None:
    """``capture_step`` on a model with torchao's Float8 linears: its checks find no host
    sync and no refusal (torchao's scales stay on the device), and its CPU mode trains as
    the eager loop does, bit for bit over 6 steps with an overflow. (The dispatcher-level
    replay harness of tests/_replay.py cannot stand in for a CUDA graph here: torchao
    builds its float8 wrappers in Python, outside the dispatcher, so a recorded trace holds
    the recording step's wrappers; replayed, it diverges from the first replay. Replay
    correctness of an FP8 step is for the GPU check, tools/gpu_capture_check.py.)"""
    needs_torchao()
    from mixprec.capture import capture_step
    from mixprec.train.fp8 import convert_model

    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g))
            for _ in range(6)]

    def build() -> tuple:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        assert convert_model(model, recipe, keep_first_last=False)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)

        def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad(set_to_none=False)
            loss = nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach()

        return model, opt, scaler, body

    def batch(k: int) -> tuple:
        x, y = data[k]
        return (x * float("inf") if k == 3 else x), y  # one overflow: a skipped step

    model_e, _, scaler_e, body_e = build()
    eager = [body_e(*batch(k)) for k in range(len(data))]
    model_c, opt_c, scaler_c, body_c = build()
    step = capture_step(body_c, data[0], optimizers=[opt_c], scaler=scaler_c,
                        modules=[model_c], warmup=1)
    out = [step(*batch(k)) for k in range(len(data))]
    assert step.mode == "eager"  # (CPU)
    for a, b in zip(eager, out):
        assert_bitwise_equal(a, b)
    for p, q in zip(model_e.parameters(), model_c.parameters()):
        assert_bitwise_equal(p.detach(), q.detach())
    assert scaler_c.stats().skipped_steps == scaler_e.stats().skipped_steps == 1
