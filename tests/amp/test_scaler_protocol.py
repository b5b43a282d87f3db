"""The scaler <-> optimizer protocol and GradScaler.found_inf().

* mixprec.GradScaler calls mixprec's optimizers as step(grad_scale=, found_inf=, clip_coef=)
  and sets no attribute on them;
* foreign optimizers with _step_supports_amp_scaling (torch's fused ones) get torch's
  attribute protocol;
* torch.amp.GradScaler still drives mixprec's optimizers (through the attributes);
* found_inf(optimizer=None) answers without a host sync.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

import mixprec
from _helpers import INF, NAN
from mixprec.amp import protocol

_SCALARS = ("grad_scale", "found_inf", "clip_coef")


@pytest.fixture(autouse=True)
def _shared_default_record_stays_default():
    """``protocol.peek_record`` hands out one shared default record to states without
    their own: after every test of this module, nothing has written to it."""
    yield
    assert protocol._NO_RECORD == protocol.OptimizerRecord()


class SpyAdamW(mixprec.optim.AdamW):
    """mixprec AdamW recording, per step, its keyword arguments and its attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[dict[str, Any]] = []

    def step(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append({
            "kwargs": {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                       for k, v in kwargs.items()},
            "attrs": {k: getattr(self, k) for k in _SCALARS if k in vars(self)},
        })
        return super().step(*args, **kwargs)


class SpyFusedTorchAdamW(torch.optim.AdamW):
    """torch's fused AdamW recording what the scaler hands it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, fused=True, **kwargs)
        self.calls: list[dict[str, Any]] = []

    def step(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append({
            "kwargs": dict(kwargs),
            "attrs": {k: getattr(self, k) for k in _SCALARS if k in vars(self)},
        })
        return super().step(*args, **kwargs)


def _model(device: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3)).to(device)


def _backward(model: torch.nn.Module, scaler: Any, device: str, poison: Any = None,
              where: str = "first") -> None:
    x = torch.randn(4, 6, device=device, generator=None)
    scaler.scale(model(x).pow(2).mean()).backward()
    if poison is not None:
        params = [p for p in model.parameters() if p.grad is not None]
        if where == "first":
            params[0].grad.view(-1)[0] = poison
        else:
            params[-1].grad.view(-1)[-1] = poison


def _cpu_case(
    opt_cls: type = mixprec.optim.AdamW, **scaler_kwargs: Any
) -> tuple[torch.nn.Module, Any, mixprec.GradScaler]:
    """A CPU model, an ``opt_cls`` (lr 1e-2) over it, and a CPU scaler."""
    model = _model("cpu")
    return model, opt_cls(model.parameters(), lr=1e-2), mixprec.GradScaler("cpu", **scaler_kwargs)


def _attr_names(opt: torch.optim.Optimizer) -> set[str]:
    return set(vars(opt))


# ------------------------------------------------------------------ the direct protocol
def test_mixprec_optimizer_gets_the_scalars_as_arguments(device):
    model = _model(device)
    opt = SpyAdamW(model.parameters(), lr=1e-2)
    s = mixprec.GradScaler(device, init_scale=64.0)
    names = _attr_names(opt)

    # READY: grad_scale = the scale, found_inf 0, no clip
    _backward(model, s, device)
    s.step(opt)
    call = opt.calls[-1]
    assert call["attrs"] == {}  # nothing set on the optimizer during the call
    assert set(call["kwargs"]) == set(_SCALARS)
    assert call["kwargs"]["grad_scale"].item() == 64.0
    assert call["kwargs"]["found_inf"].item() == 0.0
    assert call["kwargs"]["found_inf"].dtype == torch.float32
    assert call["kwargs"]["clip_coef"] is None
    assert _attr_names(opt) == names  # and nothing left after it
    s.update()

    # after unscale_: grad_scale None
    opt.zero_grad()
    _backward(model, s, device)
    s.unscale_(opt)
    s.step(opt)
    assert opt.calls[-1]["kwargs"]["grad_scale"] is None
    assert opt.calls[-1]["attrs"] == {}
    s.update()

    # folded clip: grad_scale = the scale and the clip coefficient
    opt.zero_grad()
    _backward(model, s, device)
    norm = s.clip_grad_norm_(opt, 1e-3)
    s.step(opt)
    kw = opt.calls[-1]["kwargs"]
    assert kw["grad_scale"].item() == s.get_scale()
    torch.testing.assert_close(kw["clip_coef"], torch.clamp(1e-3 / (norm + 1e-6), max=1.0))
    assert opt.calls[-1]["attrs"] == {}
    s.update()

    # inf: still called, with found_inf set; the params do not move
    opt.zero_grad()
    _backward(model, s, device, poison=INF)
    before = [p.detach().clone() for p in model.parameters()]
    s.step(opt)
    assert opt.calls[-1]["kwargs"]["found_inf"].item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    s.update()
    assert s.step_was_skipped
    assert _attr_names(opt) == names


def test_mixprec_optimizer_without_grads_is_stepped():
    """No grads: found_inf is a zero tensor (not torch's int 0, which the step rejects)."""
    model, opt, s = _cpu_case(SpyAdamW)
    s.scale(torch.ones(()))
    s.step(opt)
    assert torch.equal(opt.calls[-1]["kwargs"]["found_inf"], torch.zeros(()))
    assert s.found_inf(opt).item() == 0.0


def test_user_kwargs_win_over_the_scalers():
    model, opt, s = _cpu_case(SpyAdamW, init_scale=8.0)
    _backward(model, s, "cpu")
    mine = torch.full((), 4.0)
    s.step(opt, grad_scale=mine)
    assert opt.calls[-1]["kwargs"]["grad_scale"].item() == 4.0


def test_step_error_leaves_no_attribute():
    model, opt, s = _cpu_case()
    _backward(model, s, "cpu")
    names = _attr_names(opt)
    with pytest.raises(TypeError):
        s.step(opt, bogus=1)
    assert _attr_names(opt) == names


# ------------------------------------------------------------------ torch's attribute protocol
def test_foreign_fused_optimizer_gets_attributes():
    """torch's fused AdamW: grad_scale/found_inf set as attributes for the call, then deleted;
    the result equals torch's own GradScaler driving it."""
    model_a, model_b = _model("cpu"), _model("cpu")
    opt_a = SpyFusedTorchAdamW(model_a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(model_b.parameters(), lr=1e-2, fused=True)
    assert opt_a._step_supports_amp_scaling
    sa = mixprec.GradScaler("cpu", init_scale=32.0)
    sb = torch.amp.GradScaler("cpu", init_scale=32.0)
    names = _attr_names(opt_a)
    for it in range(4):
        for model, opt, sc in ((model_a, opt_a, sa), (model_b, opt_b, sb)):
            opt.zero_grad()
            torch.manual_seed(10 + it)
            _backward(model, sc, "cpu", poison=INF if it == 2 else None)
            sc.step(opt)
            sc.update()
        call = opt_a.calls[-1]
        assert call["kwargs"] == {}
        assert set(call["attrs"]) == {"grad_scale", "found_inf"}
        assert call["attrs"]["found_inf"].item() == (1.0 if it == 2 else 0.0)
        assert _attr_names(opt_a) == names
        assert sa.get_scale() == sb.get_scale()
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


def test_clip_is_not_folded_into_a_foreign_optimizer():
    model, opt, s = _cpu_case(SpyFusedTorchAdamW, init_scale=32.0)
    _backward(model, s, "cpu")
    s.clip_grad_norm_(opt, 1e-3)
    s.step(opt)
    assert "clip_coef" not in opt.calls[-1]["attrs"]
    assert opt.calls[-1]["attrs"]["grad_scale"] is None  # unscaled by the clip


def test_torch_grad_scaler_drives_a_mixprec_optimizer(device):
    """torch.amp.GradScaler uses the attribute protocol; the result is bitwise that of
    mixprec.GradScaler's direct call."""
    model_a, model_b = _model(device), _model(device)
    opt_a = SpyAdamW(model_a.parameters(), lr=1e-2)
    opt_b = mixprec.optim.AdamW(model_b.parameters(), lr=1e-2)
    sa = torch.amp.GradScaler(device, init_scale=256.0, growth_interval=2)
    sb = mixprec.GradScaler(device, init_scale=256.0, growth_interval=2)
    for it in range(6):
        for model, opt, sc in ((model_a, opt_a, sa), (model_b, opt_b, sb)):
            opt.zero_grad()
            torch.manual_seed(20 + it)
            _backward(model, sc, device, poison=NAN if it == 3 else None)
            sc.step(opt)
            sc.update()
        call = opt_a.calls[-1]
        assert call["kwargs"] == {} and set(call["attrs"]) == {"grad_scale", "found_inf"}
        assert float(call["attrs"]["found_inf"]) == (1.0 if it == 3 else 0.0)
        assert not hasattr(opt_a, "grad_scale") and not hasattr(opt_a, "found_inf")
        assert sa.get_scale() == sb.get_scale()
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ found_inf()
def _two_optimizers(device: str):
    m1, m2 = _model(device, 1), _model(device, 2)
    o1 = mixprec.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = torch.optim.SGD(m2.parameters(), lr=1e-2)  # an ordinary optimizer: host-synced step
    return m1, m2, o1, o2


def _trainer_value(scaler: mixprec.GradScaler, opt: torch.optim.Optimizer) -> torch.Tensor:
    """What python/mixprec/train/trainer.py computes from _per_optimizer_states."""
    state = scaler._per_optimizer_states.get(id(opt), {})
    flags = list(state.get("found_inf_per_device", {}).values())
    found = sum(f.to(scaler._scale.device) for f in flags) if flags else torch.zeros(())
    return (found > 0).float()


@pytest.mark.parametrize("poison,where", [(None, "first"), (INF, "first"), (-INF, "last"),
                                          (NAN, "first"), (NAN, "last")])
def test_found_inf_values(device, poison, where):
    model = _model(device)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    s = mixprec.GradScaler(device, init_scale=16.0)
    _backward(model, s, device, poison=poison, where=where)
    s.step(opt)
    expected = 0.0 if poison is None else 1.0
    out = s.found_inf(opt)
    assert out.dtype == torch.float32 and out.dim() == 0 and out.device == s._scale.device
    assert out.item() == expected and s.found_inf().item() == expected
    assert torch.equal(out, _trainer_value(s, opt))
    s.update()
    assert s.found_inf(opt).item() == expected and s.found_inf().item() == expected
    assert s.step_was_skipped == bool(expected)


def test_found_inf_per_optimizer_and_across_update(device):
    m1, m2, o1, o2 = _two_optimizers(device)
    s = mixprec.GradScaler(device, init_scale=16.0)
    with pytest.raises(RuntimeError, match="no inf check has run yet"):
        s.found_inf()
    # iteration 0: inf only in o2's grads
    _backward(m1, s, device)
    _backward(m2, s, device, poison=INF, where="last")
    s.step(o1)
    assert s.found_inf(o1).item() == 0.0
    with pytest.raises(RuntimeError, match="had no inf check in this iteration"):
        s.found_inf(o2)  # not stepped yet
    assert s.found_inf().item() == 0.0  # so far
    s.step(o2)
    assert s.found_inf(o2).item() == 1.0 and s.found_inf().item() == 1.0
    for o in (o1, o2):
        assert torch.equal(s.found_inf(o), _trainer_value(s, o))
    s.update()
    # after update: the iteration update() closed (o1's flag not overwritten by the sum)
    assert s.found_inf(o1).item() == 0.0
    assert s.found_inf(o2).item() == 1.0
    assert s.found_inf().item() == 1.0 and s.step_was_skipped
    # iteration 1: once o1 is checked, the question is about this iteration
    for o in (o1, o2):
        o.zero_grad()
    _backward(m1, s, device, poison=NAN)
    s.unscale_(o1)
    assert s.found_inf(o1).item() == 1.0 and s.found_inf().item() == 1.0
    with pytest.raises(RuntimeError, match="had no inf check in this iteration"):
        s.found_inf(o2)
    s.step(o1)
    s.update()
    assert s.found_inf(o1).item() == 1.0 and s.found_inf().item() == 1.0
    with pytest.raises(RuntimeError, match="had no inf check in the last iteration"):
        s.found_inf(o2)
    other = torch.optim.SGD(_model(device).parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="SGD had no inf check"):
        s.found_inf(other)


@pytest.mark.parametrize("fold", [True, False])
def test_found_inf_after_clip_grad_norm(fold):
    model, opt, s = _cpu_case()
    _backward(model, s, "cpu", poison=INF, where="last")
    s.clip_grad_norm_(opt, 1.0, fold_into_step=fold)
    assert s.found_inf(opt).item() == 1.0
    s.step(opt)
    assert s.found_inf(opt).item() == 1.0


def test_found_inf_after_update_with_new_scale():
    model, opt, s = _cpu_case()
    _backward(model, s, "cpu", poison=INF)
    s.step(opt)
    s.update(new_scale=8.0)
    assert s.found_inf(opt).item() == 1.0 and s.step_was_skipped
    s.scale(torch.ones(()))
    s.update(new_scale=4.0)  # no check at all in this iteration
    assert s.found_inf().item() == 0.0 and not s.step_was_skipped


def test_found_inf_on_a_disabled_scaler():
    model, opt, s = _cpu_case(enabled=False)
    out = s.found_inf(opt)
    assert torch.equal(out, torch.zeros(())) and out.dtype == torch.float32
    assert out.device.type == "cpu" and torch.equal(s.found_inf(), torch.zeros(()))


def test_found_inf_survives_pickling():
    model, opt, s = _cpu_case()
    _backward(model, s, "cpu", poison=INF)
    s.step(opt)
    s.update()
    t = pickle.loads(pickle.dumps(s))
    assert t.step_was_skipped and t.found_inf().item() == 1.0


class _SyncCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
            real = getattr(torch.Tensor, name)

            def counting(t: torch.Tensor, *a: Any, _real: Any = real, **k: Any) -> Any:
                self.count += 1
                return _real(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counting)


def test_found_inf_does_not_sync(device, monkeypatch):
    model = _model(device)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    s = mixprec.GradScaler(device, init_scale=16.0)
    _backward(model, s, device, poison=INF)
    s.step(opt)
    sync_mode = torch.cuda.get_sync_debug_mode() if device == "cuda" else None
    counter = _SyncCounter(monkeypatch)
    if device == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        during = s.found_inf(opt)
        during_all = s.found_inf()
        s.update()
        after = s.found_inf(opt)
        after_all = s.found_inf()
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(sync_mode)
    assert counter.count == 0
    assert s.step_was_skipped  # the read is the sync
    assert counter.count == 1
    for t in (during, during_all, after, after_all):
        assert t.item() == 1.0


def test_record_is_typed_and_reset_by_update():
    from mixprec.amp.protocol import RECORD_KEY, OptimizerRecord

    model, opt, s = _cpu_case()
    _backward(model, s, "cpu")
    s.clip_grad_norm_(opt, 1e-3)
    record = s._per_optimizer_states[id(opt)][RECORD_KEY]
    assert isinstance(record, OptimizerRecord)
    assert record.deferred_unscale and record.clip_coef is not None
    assert not any(k.startswith("mixprec_") for k in s._per_optimizer_states[id(opt)])
    s.step(opt)
    s.update()
    assert len(s._per_optimizer_states) == 0
