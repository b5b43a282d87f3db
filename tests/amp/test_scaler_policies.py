"""mixprec-only GradScaler features, the scale's update rule: the torch / deepspeed /
megatron policies, hysteresis, min/max bounds, fresh(), bad arguments."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

import mixprec
from _helpers import INF
from mixprec.amp.policies import POLICIES


# ------------------------------------------------------------------ policies
def _deepspeed_rule(found_seq, init, window, hysteresis, min_scale):
    """deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler.update_scale (defaults:
    scale_factor 2, consecutive_hysteresis False), re-stated."""
    scale, cur_iter, last_overflow, cur_h = init, 0, -1, hysteresis
    out = []
    for overflow in found_seq:
        if overflow:
            if hysteresis == 1 or cur_h == 1:
                scale = max(scale / 2.0, min_scale)
            else:
                cur_h -= 1
            last_overflow = cur_iter
        elif (cur_iter - last_overflow) % window == 0:
            cur_h = hysteresis
            scale *= 2.0
        cur_iter += 1
        out.append(scale)
    return out


def _megatron_rule(found_seq, init, interval, hysteresis, min_scale):
    """megatron.core.optimizer.grad_scaler.DynamicGradScaler.update, re-stated."""
    scale, growth, hyst = init, 0, hysteresis
    out = []
    for found in found_seq:
        if found:
            growth = 0
            hyst -= 1
            if hyst <= 0:
                scale = max(scale * 0.5, min_scale)
        else:
            growth += 1
            if growth == interval:
                growth = 0
                hyst = hysteresis
                scale = scale * 2.0
        out.append(scale)
    return out


def _drive(scaler, found_seq, device="cpu"):
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = torch.optim.SGD([p], lr=0.0)
    scales = []
    for found in found_seq:
        scaler.scale(torch.ones((), device=device))
        p.grad = torch.full((3,), INF if found else 1.0, device=device)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hysteresis", [1, 2, 3])
def test_deepspeed_rule(seed, hysteresis):
    rng = random.Random(seed)
    seq = [rng.random() < 0.3 for _ in range(80)]
    s = mixprec.GradScaler("cpu", init_scale=2.0**4, growth_interval=3, policy="deepspeed",
                           hysteresis=hysteresis)
    assert _drive(s, seq) == _deepspeed_rule(seq, 2.0**4, 3, hysteresis, 1.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hysteresis", [1, 2, 4])
def test_megatron_rule(seed, hysteresis):
    rng = random.Random(seed)
    seq = [rng.random() < 0.35 for _ in range(80)]
    s = mixprec.GradScaler("cpu", init_scale=8.0, growth_interval=4, policy="megatron",
                           hysteresis=hysteresis, min_scale=2.0)
    assert _drive(s, seq) == _megatron_rule(seq, 8.0, 4, hysteresis, 2.0)


def test_policy_presets():
    ds = mixprec.GradScaler("cpu", policy="deepspeed")
    assert (ds._init_scale, ds.get_growth_interval(), ds.hysteresis, ds.min_scale,
            ds.max_scale) == (2.0**16, 1000, 2, 1.0, None)
    mg = mixprec.GradScaler("cpu", policy="megatron")
    assert (mg._init_scale, mg.get_growth_interval(), mg.hysteresis, mg.min_scale) == (
        2.0**32, 1000, 2, 1.0)
    assert mg.policy == "megatron" and set(POLICIES) == {"torch", "deepspeed", "megatron"}
    t = mixprec.GradScaler("cpu")
    assert (t.hysteresis, t.min_scale, t.max_scale, t.policy) == (1, None, None, "torch")
    over = mixprec.GradScaler("cpu", 8.0, growth_interval=10, policy="megatron", hysteresis=1)
    assert (over._init_scale, over.get_growth_interval(), over.hysteresis) == (8.0, 10, 1)
    with pytest.raises(ValueError, match="policy must be one of"):
        mixprec.GradScaler("cpu", policy="apex")


class _Group:
    """Stands in for a process group: fresh() must hand the very object on."""


@pytest.mark.parametrize("enabled", [True, False])
def test_fresh_keeps_every_setting_and_starts_over(enabled):
    group = _Group()
    s = mixprec.GradScaler("cpu", 64.0, growth_factor=3.0, backoff_factor=0.25,
                           growth_interval=3, enabled=enabled, allow_fp16_grads=True,
                           min_scale=2.0, max_scale=1024.0, hysteresis=2, policy="megatron")
    assert mixprec.GradScaler("cpu", process_group=group).fresh().process_group is group
    if enabled:
        s.set_growth_factor(5.0)  # torch's setter: fresh() takes the factor as it stands
        _drive(s, [True, True, False])
        before = s.get_scale()
        assert before < 64.0
    f = s.fresh()
    assert f is not s and f.is_enabled() == enabled
    assert (f.policy, f.hysteresis, f.min_scale, f.max_scale, f._allow_fp16_grads,
            f._device) == ("megatron", 2, 2.0, 1024.0, True, "cpu")
    if enabled:
        assert (f.get_growth_factor(), f.get_backoff_factor(), f.get_growth_interval()) == (
            5.0, 0.25, 3)
        assert f.get_scale() == 64.0 and f.stats().scale_decreases == 0
        assert s.get_scale() == before  # the old scaler is untouched
        assert s.fresh(8.0).get_scale() == 8.0
        assert f.scale_tensor() is None  # no scale() yet
        f.scale(torch.ones(()))
        t = f.scale_tensor()
        assert t is f._scale and t.dtype == torch.float32 and t.item() == 64.0
    else:
        assert f.scale_tensor() is None


@pytest.mark.parametrize(
    "kwargs,message",
    [({"hysteresis": 0}, "hysteresis must be an int >= 1, got 0"),
     ({"hysteresis": 1.5}, "hysteresis must be an int >= 1, got 1.5"),
     ({"min_scale": 0.0}, "min_scale must be finite and > 0, got 0.0"),
     ({"max_scale": INF}, "max_scale must be finite and > 0, got inf"),
     ({"min_scale": 4.0, "max_scale": 2.0},
      r"min_scale \(4.0\) must not exceed max_scale \(2.0\)")],
)
def test_bad_extras(kwargs, message):
    with pytest.raises(ValueError, match=f"mixprec.GradScaler: {message}"):
        mixprec.GradScaler("cpu", **kwargs)


def test_bad_allow_fp16_grads():
    with pytest.raises(TypeError, match="allow_fp16_grads must be None, True or False, got 'yes'"):
        mixprec.GradScaler("cpu", allow_fp16_grads="yes")


def test_min_max_scale_bounds():
    s = mixprec.GradScaler("cpu", init_scale=4.0, growth_interval=1, min_scale=1.0,
                           max_scale=16.0)
    seq = [False] * 5 + [True] * 6
    assert _drive(s, seq) == [8.0, 16.0, 16.0, 16.0, 16.0, 8.0, 4.0, 2.0, 1.0, 1.0, 1.0]


def test_torch_policy_is_bitwise_torch_update():
    rng = random.Random(5)
    seq = [rng.random() < 0.2 for _ in range(60)]
    a = mixprec.GradScaler("cpu", init_scale=3.0, growth_factor=1.7, backoff_factor=0.3,
                           growth_interval=2)
    b = torch.amp.GradScaler("cpu", init_scale=3.0, growth_factor=1.7, backoff_factor=0.3,
                             growth_interval=2)
    assert _drive(a, seq) == _drive(b, seq)


def test_hysteresis_state_dict_round_trip():
    s = mixprec.GradScaler("cpu", init_scale=64.0, growth_interval=5, hysteresis=3)
    _drive(s, [True])
    sd = s.state_dict()
    assert sd["_hysteresis_left"] == 2 and sd["scale"] == 64.0
    s2 = mixprec.GradScaler("cpu", growth_interval=5, hysteresis=3)
    s2.load_state_dict(sd)
    assert _drive(s2, [True, True]) == _drive(s, [True, True]) == [64.0, 32.0]
    t = torch.amp.GradScaler("cpu")
    t.load_state_dict(sd)  # torch ignores the extra key
    assert t.get_scale() == 64.0
    s3 = pickle.loads(pickle.dumps(s))
    assert s3._get_hysteresis_left() == s._get_hysteresis_left() == 0
