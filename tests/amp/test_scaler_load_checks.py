"""mixprec.GradScaler's ``load_state_dict`` is at least as strict as its
constructor and checks everything before it changes anything; the constructor refuses
what it cannot use; ``clip_grad_norm_`` refuses a negative or NaN ``max_norm``."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec
from _unchanged import KINDS, corrupt, entries, refused_unchanged


def stepped(**kwargs: Any) -> Any:
    """A CPU scaler after a few iterations (its scale and tracker on the device)."""
    scaler = mixprec.GradScaler("cpu", init_scale=2.0**8, growth_interval=3, **kwargs)
    p = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    for k in range(4):
        opt.zero_grad()
        scaler.scale((p * (k + 1)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    return scaler


def _refused(path: tuple, kind: str) -> bool:
    if len(path) != 1:
        return False
    if kind == "missing":
        return path[0] != "_hysteresis_left"
    return kind in ("type", "range", "dtype", "shape", "extra") or kind == "device"


def _cases() -> list:
    valid = stepped(hysteresis=2).state_dict()
    out = [(p, k) for p in entries(valid) for k in KINDS
           if _refused(p, k) and corrupt(valid, p, k) is not None]
    out += [((), "extra")]
    return out


def _load_corrupted(path: tuple, kind: str) -> None:
    valid = stepped(hysteresis=2).state_dict()
    if path == ():
        bad: Dict[str, Any] = {**valid, "bogus": 1}
    else:
        bad = corrupt(valid, path, kind)
    target = mixprec.GradScaler("cpu", init_scale=2.0**4, growth_interval=5, hysteresis=2)
    message = refused_unchanged(target, lambda: target.load_state_dict(bad))
    name = path[0] if path else "bogus"
    assert name in message, (path, kind, message)
    target2 = stepped(hysteresis=2)  # (with its device tensors created)
    refused_unchanged(target2, lambda: target2.load_state_dict(bad))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_one_corrupted_entry_is_refused_and_changes_nothing(data: Any) -> None:
    """Property: one entry of a valid state dict corrupted (type, shape, dtype, range,
    missing, extra) -> an error naming it, the scaler exactly as it was."""
    path, kind = data.draw(st.sampled_from(_cases()))
    _load_corrupted(path, kind)


def test_the_valid_state_dict_loads_and_resumes_bit_for_bit() -> None:
    src = stepped(hysteresis=2)
    saved = copy.deepcopy(src.state_dict())
    target = stepped(hysteresis=2)
    target.update(new_scale=3.0)
    target.load_state_dict(saved)
    assert target.state_dict() == saved
    for s in (src, target):
        p = torch.ones(3, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        for k in range(5):
            opt.zero_grad()
            s.scale((p * (float("inf") if k == 2 else 1.0)).sum()).backward()
            s.step(opt)
            s.update()
    assert src.state_dict() == target.state_dict()


CASES = [
    ("scale = NaN", {"scale": math.nan}, ValueError, "state_dict['scale'] must be finite and > 0"),
    ("scale = -2", {"scale": -2.0}, ValueError, "state_dict['scale'] must be finite and > 0"),
    ("growth_factor = 0.1", {"growth_factor": 0.1}, ValueError,
     "state_dict['growth_factor'] must be finite and > 1.0"),
    ("scale = 'big'", {"scale": "big"}, TypeError, "state_dict['scale'] must be a float"),
    ("growth_interval = 0", {"growth_interval": 0}, ValueError,
     "state_dict['growth_interval'] must be >= 1"),
    ("above max_scale", {"scale": 2.0**30}, ValueError, "above this scaler's max_scale"),
]


@pytest.mark.parametrize("what,change,exc,message", CASES, ids=[c[0] for c in CASES])
def test_a_named_case_is_refused_before_anything_changes(what: str, change: Dict[str, Any],
                                                       exc: type, message: str) -> None:
    saved = {**stepped().state_dict(), **change}
    target = stepped(max_scale=2.0**20)
    assert message in refused_unchanged(target, lambda: target.load_state_dict(saved), exc)


def test_a_missing_key_changes_nothing() -> None:
    saved = stepped().state_dict()
    del saved["_growth_tracker"]
    saved["growth_factor"] = 4.0
    target = stepped()
    assert "_growth_tracker" in refused_unchanged(
        target, lambda: target.load_state_dict(saved), ValueError
    )


@pytest.mark.parametrize("kwargs,exc,message", [
    ({"init_scale": -1.0}, ValueError, "init_scale must be finite and > 0"),
    ({"init_scale": math.inf}, ValueError, "init_scale must be finite and > 0"),
    ({"growth_interval": 0}, ValueError, "growth_interval must be >= 1"),
    ({"growth_interval": 2.5}, TypeError, "growth_interval must be an int"),
    ({"device": "tpu"}, ValueError, "device must be a device type"),
], ids=["init_scale<0", "init_scale=inf", "growth_interval=0", "growth_interval=2.5", "tpu"])
def test_the_constructor_refuses_what_it_cannot_use(kwargs: Dict[str, Any], exc: type,
                                                    message: str) -> None:
    kwargs = {"device": "cpu", **kwargs}
    with pytest.raises(exc, match=message):
        mixprec.GradScaler(**kwargs)


def test_the_constructor_keeps_torchs_assertion_for_the_factors() -> None:
    with pytest.raises(AssertionError, match="growth factor must be > 1.0"):
        mixprec.GradScaler("cpu", growth_factor=0.5)
    with pytest.raises(AssertionError, match="backoff factor must be < 1.0"):
        mixprec.GradScaler("cpu", backoff_factor=1.5)


@pytest.mark.parametrize("max_norm", [-1.0, math.nan])
@pytest.mark.parametrize("optimizer", ["mixprec", "torch"])
def test_clip_grad_norm_refuses_a_negative_or_nan_max_norm(max_norm: float,
                                                          optimizer: str) -> None:
    """Before: -1 flipped the grads' sign, NaN made the params NaN (folded path too)."""
    p = torch.ones(4, requires_grad=True)
    opt = (mixprec.optim.AdamW if optimizer == "mixprec" else torch.optim.AdamW)([p])
    scaler = mixprec.GradScaler("cpu", init_scale=4.0)
    scaler.scale((p * 3).sum()).backward()
    grad = p.grad.clone()
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        scaler.clip_grad_norm_(opt, max_norm)
    assert torch.equal(p.grad, grad)
