"""mixprec-only GradScaler features: fused unscale, bf16/fp16 grads, policies,
hysteresis and bounds, clip_grad_norm_, stats, step_was_skipped, CUDA syncs."""

from __future__ import annotations

import math
import pickle
import random
import re

import pytest
import torch
from torch.amp.grad_scaler import OptState

import mixprec
from _helpers import INF, RecordingOptimizer, cuda_only, two_layer
from mixprec import ops
from mixprec.amp.policies import POLICIES
from mixprec.amp.stats import FOLD_EVERY


def _params(device, dtypes, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = []
    for k, dt in enumerate(dtypes):
        p = torch.nn.Parameter(torch.randn(5 + k, 3, generator=g).to(device, dt))
        p.grad = (torch.randn(5 + k, 3, generator=g) * 1024).to(device, dt)
        ps.append(p)
    return ps


# ------------------------------------------------------------------ fused unscale
def test_one_op_call_per_device_for_all_dtypes(device, monkeypatch):
    calls = []
    real = ops.unscale_and_check_

    def counting(grads, found_inf, inv_scale):
        calls.append(sorted(str(g.dtype) for g in grads))
        real(grads, found_inf, inv_scale)

    monkeypatch.setattr(ops, "unscale_and_check_", counting)
    ps = _params(device, [torch.float32, torch.bfloat16, torch.float16, torch.float32,
                          torch.float64])
    opt = torch.optim.SGD(ps, lr=0.1)
    s = mixprec.GradScaler(device, init_scale=1024.0, allow_fp16_grads=True)
    s.scale(torch.ones((), device=device))
    expected = [(p.grad.float() / 1024).to(p.dtype) for p in ps]
    s.unscale_(opt)
    assert len(calls) == 1 and len(calls[0]) == 5
    for p, e in zip(ps, expected):
        assert torch.equal(p.grad, e), p.dtype


def test_bitwise_equal_to_torch_unscale(device):
    ps = _params(device, [torch.float32, torch.float32, torch.float64])
    ref = [p.grad.clone() for p in ps]
    opt = torch.optim.SGD(ps, lr=0.1)
    s = mixprec.GradScaler(device, init_scale=3.0)
    s.scale(torch.ones((), device=device))
    s.unscale_(opt)
    inv = torch.tensor(3.0, device=device).double().reciprocal().float()
    fi = torch.zeros((), device=device)
    for dt in (torch.float32, torch.float64):
        torch._amp_foreach_non_finite_check_and_unscale_([r for r in ref if r.dtype == dt], fi, inv)
    for p, r in zip(ps, ref):
        assert torch.equal(p.grad, r)


def test_bf16_grads_train_and_skip(device):
    model = two_layer(device).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = mixprec.GradScaler(device, init_scale=256.0, growth_interval=1)
    for i in range(3):
        opt.zero_grad()
        x = torch.randn(4, 8, device=device, dtype=torch.bfloat16)
        s.scale(model(x).float().mean()).backward()
        if i == 1:
            model[1].bias.grad[0] = INF
        before = [p.detach().clone() for p in model.parameters()]
        s.step(opt)
        s.update()
        changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert changed == (i != 1)
    assert s.get_scale() == 512.0


def test_check_only_path_leaves_grads_untouched(monkeypatch):
    used = []
    monkeypatch.setattr(ops, "unscale_and_check_", lambda *a: used.append(a))
    ps = _params("cpu", [torch.float32, torch.bfloat16])
    ps[0].grad[0, 0] = -0.0
    ref = [p.grad.clone() for p in ps]
    opt = RecordingOptimizer(ps, supports_amp=True)
    s = mixprec.GradScaler("cpu")
    s.scale(torch.ones(()))
    res = s._check_inf_per_device(opt)
    assert not used  # read-only check, no unscale by 1.0
    assert all(torch.equal(p.grad, r) for p, r in zip(ps, ref))
    assert torch.signbit(ps[0].grad[0, 0])
    assert [v.item() for v in res.values()] == [0.0]


# ------------------------------------------------------------------ fp16 grads
def _fp16_opt(**attrs):
    p = torch.nn.Parameter(torch.randn(4).half())  # fp16 model weights
    opt = torch.optim.SGD([p], lr=0.1)
    for k, v in attrs.items():
        setattr(opt, k, v)
    p.grad = torch.full((4,), 8.0).half()
    return p, opt


@pytest.mark.parametrize(
    "allow,attrs,ok",
    [
        (True, {}, True),
        (None, {}, False),
        (False, {}, False),
        (None, {"master_weights": True}, True),
        (None, {"_mixprec_master_weights": True}, True),
        (False, {"master_weights": True}, False),
        (None, {"master_weights": "yes"}, False),
    ],
)
def test_allow_fp16_grads(allow, attrs, ok):
    p, opt = _fp16_opt(**attrs)
    s = mixprec.GradScaler("cpu", init_scale=4.0, allow_fp16_grads=allow)
    s.scale(torch.ones(()))
    if ok:
        s.unscale_(opt)
        assert p.grad.dtype == torch.float16 and p.grad.tolist() == [2.0] * 4
    else:
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            s.unscale_(opt)


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
    "kwargs",
    [{"hysteresis": 0}, {"hysteresis": 1.5}, {"min_scale": 0.0}, {"max_scale": INF},
     {"min_scale": 4.0, "max_scale": 2.0}],
)
def test_bad_extras(kwargs):
    with pytest.raises(ValueError):
        mixprec.GradScaler("cpu", **kwargs)
    with pytest.raises(TypeError):
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


# ------------------------------------------------------------------ clip_grad_norm_
def _clip_pair(device, norm_type, dtypes, max_norm=0.5, inf=False, seed=0):
    ps_a = _params(device, dtypes, seed)
    ps_b = _params(device, dtypes, seed)
    if inf:
        ps_a[0].grad[0, 0] = INF
        ps_b[0].grad[0, 0] = INF
    a = mixprec.GradScaler(device, init_scale=1024.0)
    b = mixprec.GradScaler(device, init_scale=1024.0)
    oa, ob = torch.optim.SGD(ps_a, lr=0.1), torch.optim.SGD(ps_b, lr=0.1)
    for s in (a, b):
        s.scale(torch.ones((), device=device))
    norm_a = a.clip_grad_norm_(oa, max_norm, norm_type)
    b.unscale_(ob)
    norm_b = torch.nn.utils.clip_grad_norm_(ps_b, max_norm, norm_type)
    return a, oa, ps_a, norm_a, ps_b, norm_b


@pytest.mark.parametrize("norm_type", [2.0, 1.0, INF, 3.0, 0.5])
@pytest.mark.parametrize("dtypes", [[torch.float32] * 3, [torch.float32, torch.float64]],
                         ids=["fp32", "fp32+fp64"])
def test_clip_grad_norm_matches_unscale_then_torch_clip(device, norm_type, dtypes):
    a, oa, ps_a, norm_a, ps_b, norm_b = _clip_pair(device, norm_type, dtypes)
    assert isinstance(norm_a, torch.Tensor) and norm_a.dim() == 0
    assert norm_a.dtype == torch.float32 and norm_a.device.type == device
    torch.testing.assert_close(norm_a, norm_b.float(), rtol=1e-6, atol=0)
    for pa, pb in zip(ps_a, ps_b):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=2e-6, atol=0)
    st = a._per_optimizer_states[id(oa)]
    assert st["stage"] is OptState.UNSCALED
    assert [v.item() for v in st["found_inf_per_device"].values()] == [0.0]
    with pytest.raises(RuntimeError, match=re.escape("unscale_() has already been called")):
        a.unscale_(oa)


def test_clip_grad_norm_with_inf_skips_step(device):
    a, oa, ps_a, norm_a, _, _ = _clip_pair(device, 2.0, [torch.float32, torch.float32], inf=True)
    assert not torch.isfinite(norm_a)
    before = [p.detach().clone() for p in ps_a]
    a.step(oa)
    a.update()
    assert all(torch.equal(x, y) for x, y in zip(before, ps_a))
    assert a.get_scale() == 512.0 and a.step_was_skipped


def test_clip_grad_norm_after_unscale_and_after_step():
    ps = _params("cpu", [torch.float32, torch.float32])
    ref = [p.grad.clone() / 8 for p in ps]
    opt = torch.optim.SGD(ps, lr=0.1)
    s = mixprec.GradScaler("cpu", init_scale=8.0)
    s.scale(torch.ones(()))
    s.unscale_(opt)
    n = s.clip_grad_norm_(opt, 1e9)
    torch.testing.assert_close(n, torch.nn.utils.get_total_norm(ref), rtol=1e-6, atol=0)
    s.step(opt)
    msg = re.escape("clip_grad_norm_() is being called after step().")
    with pytest.raises(RuntimeError, match=msg):
        s.clip_grad_norm_(opt, 1.0)


def test_clip_grad_norm_sparse_and_disabled():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    s = mixprec.GradScaler("cpu", init_scale=4.0)
    s.scale(emb(torch.tensor([1, 1, 2])).sum()).backward()
    dense = emb.weight.grad.to_dense() / 4
    n = s.clip_grad_norm_(opt, 1e9)
    torch.testing.assert_close(n, torch.linalg.vector_norm(dense), rtol=1e-6, atol=0)
    d = mixprec.GradScaler("cpu", enabled=False)
    ps = _params("cpu", [torch.float32])
    ref = ps[0].grad.clone()
    n2 = d.clip_grad_norm_(torch.optim.SGD(ps, lr=0.1), 1.0)
    torch.testing.assert_close(n2, torch.linalg.vector_norm(ref))


# ------------------------------------------------------------------ stats / step_was_skipped
@pytest.mark.parametrize("amp_aware", [False, True])
def test_stats_and_step_was_skipped(device, amp_aware):
    n = FOLD_EVERY * 2 + 9  # crosses two folds
    rng = random.Random(1)
    seq = [rng.random() < 0.1 for _ in range(n)]
    seq[-3] = True
    s = mixprec.GradScaler(device, init_scale=2.0**10, growth_interval=4)
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = RecordingOptimizer([p], supports_amp=amp_aware, lr=0.0)
    assert not s.step_was_skipped
    prev, inc, dec = s.get_scale(), 0, 0
    for i, found in enumerate(seq):
        s.scale(torch.ones((), device=device))
        p.grad = torch.full((3,), INF if found else 1.0, device=device)
        s.step(opt)
        s.update()
        assert s.step_was_skipped == found
        cur = s.get_scale()
        inc += cur > prev
        dec += cur < prev
        prev = cur
        if i == 70:
            mid = s.stats()
            assert mid.steps == 71 and mid.skipped_steps == sum(seq[:71])
    st = s.stats()
    assert st.steps == n and st.skipped_steps == sum(seq)
    assert st.overflow_rate == pytest.approx(sum(seq) / n)
    assert (st.scale_increases, st.scale_decreases) == (inc, dec)
    assert st.scale == s.get_scale()
    assert st.last_overflow_step == max(i for i, f in enumerate(seq) if f)
    assert st.as_dict()["steps"] == n
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.stats() == st


def test_stats_bounded_memory_and_disabled():
    s = mixprec.GradScaler("cpu", init_scale=1.0, growth_interval=2)
    n = FOLD_EVERY * 3 + 1
    for _ in range(n):
        _drive_one(s)
        assert len(s._mp_stats._pending_scale) < FOLD_EVERY
    assert s.stats().scale_increases == n // 2
    d = mixprec.GradScaler("cpu", enabled=False)
    assert d.stats().steps == 0 and d.stats().scale == 1.0 and not d.step_was_skipped
    fresh = mixprec.GradScaler("cpu")
    assert fresh.stats().last_overflow_step is None and fresh.stats().overflow_rate == 0.0


def _drive_one(s):
    p = torch.nn.Parameter(torch.zeros(1))
    s.scale(torch.ones(()))
    p.grad = torch.ones(1)
    s.step(torch.optim.SGD([p], lr=0.0))
    s.update()


# ------------------------------------------------------------------ CUDA: no host syncs
@cuda_only
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("policy", ["torch", "megatron"])
@pytest.mark.parametrize("optim", ["torch-fused", "mixprec-fp32", "mixprec-fp16-masters"])
def test_zero_host_syncs_with_fused_optimizer(clip, policy, optim):
    torch.manual_seed(0)
    model = two_layer("cuda")
    if optim == "torch-fused":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        if optim == "mixprec-fp16-masters":
            model = model.half()
        # clip=True then folds the clip into the optimizer's kernel
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    s = mixprec.GradScaler("cuda", policy=policy)
    x, y = torch.randn(16, 8, device="cuda"), torch.randn(16, 8, device="cuda")

    def iteration():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        s.scale(loss).backward()
        if clip:
            s.clip_grad_norm_(opt, 1.0)
        s.step(opt)
        s.update()

    iteration()  # lazy init, autograd warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(FOLD_EVERY + 2):  # includes a stats fold
            iteration()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert s.stats().steps == FOLD_EVERY + 3


@cuda_only
def test_bf16_and_mixed_grads_on_cuda():
    ps = _params("cuda", [torch.bfloat16, torch.float32, torch.float16])
    expected = [(p.grad.float() / 64).to(p.dtype) for p in ps]
    s = mixprec.GradScaler("cuda", init_scale=64.0, allow_fp16_grads=True)
    s.scale(torch.ones((), device="cuda"))
    s.unscale_(torch.optim.SGD(ps, lr=0.1))
    for p, e in zip(ps, expected):
        assert torch.equal(p.grad, e)


def test_norm_combination_is_exact_for_one_device():
    # sanity of the test oracle itself: torch's total norm equals the p-norm of norms
    gs = [torch.randn(7), torch.randn(3)]
    tn = torch.nn.utils.get_total_norm(gs, 3.0)
    manual = sum(g.abs().pow(3).sum() for g in gs) ** (1 / 3)
    assert math.isclose(tn.item(), manual.item(), rel_tol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, INF, 0.0])
def test_clip_grad_norm_unfused_fallback(monkeypatch, norm_type):
    """Without the fused op (or for norm_type 0) clip_grad_norm_ = unscale_ + torch's norm."""
    import mixprec.amp.clipping as clipping

    if norm_type != 0.0:
        monkeypatch.setattr(clipping, "_op_available", lambda name: False)
    a, oa, ps_a, norm_a, ps_b, norm_b = _clip_pair("cpu", norm_type, [torch.float32] * 2)
    torch.testing.assert_close(norm_a, norm_b.float(), rtol=1e-6, atol=0)
    for pa, pb in zip(ps_a, ps_b):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-6, atol=0)
    assert a._per_optimizer_states[id(oa)]["stage"] is OptState.UNSCALED


def test_with_mixprec_master_weight_optimizer(device):
    """fp16 params + fp32 masters: fp16 grads accepted automatically, skip on device."""
    mo = pytest.importorskip("mixprec.optim")
    model = torch.nn.Linear(8, 8).to(device, torch.float16)
    opt = mo.AdamW(model.parameters(), lr=1e-3, master_weights=True)
    assert opt.master_weights is True and opt._step_supports_amp_scaling
    s = mixprec.GradScaler(device, init_scale=1024.0)
    for i in range(3):
        opt.zero_grad()
        x = torch.randn(4, 8, device=device, dtype=torch.float16)
        s.scale(model(x).float().pow(2).mean()).backward()
        if i == 1:
            model.weight.grad[0, 0] = INF
        before = model.weight.detach().clone()
        norm = s.clip_grad_norm_(opt, 1.0) if i == 2 else None
        s.step(opt)
        s.update()
        assert s.step_was_skipped == (i == 1)
        assert torch.equal(before, model.weight) == (i == 1)
        if norm is not None:
            assert torch.isfinite(norm)
    assert s.get_scale() == 512.0


# ------------------------------------------------------------------ clip folded into the step
def _fold_setup(device, kind, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*shape, generator=g).to(device, dtype))
          for shape in ((37, 5), (1000,), (3,))]
    if kind == "AdamW":
        opt = mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)
    else:
        opt = mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True)
    return ps, opt


def _scaled_grads(ps, gen, scale, inf=False):
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=gen) * 3 * scale).to(p.device, p.dtype)
    if inf:
        ps[-1].grad[-1] = INF


@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
@pytest.mark.parametrize("norm_type", [2.0, INF, 1.0])
def test_clip_folded_into_mixprec_step_matches_unfolded(device, kind, norm_type):
    """fp32 params: folded clip == unscale_ + torch's clip + step, within 1e-6; grads untouched."""
    ps_a, opt_a = _fold_setup(device, kind, torch.float32, 0)
    ps_b, opt_b = _fold_setup(device, kind, torch.float32, 0)
    sa = mixprec.GradScaler(device, init_scale=256.0, growth_interval=2)
    sb = mixprec.GradScaler(device, init_scale=256.0, growth_interval=2)
    ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    calls = []
    real_cnorm = ops.check_finite_and_norm_
    for it in range(6):
        scale = sa.get_scale()
        _scaled_grads(ps_a, ga, scale, inf=it == 2)
        _scaled_grads(ps_b, gb, scale, inf=it == 2)
        grads_before = [p.grad.clone() for p in ps_a]
        params_before = [p.detach().clone() for p in ps_a]
        sa.scale(torch.ones((), device=device))
        sb.scale(torch.ones((), device=device))
        ops.check_finite_and_norm_ = lambda *a, **k: calls.append(1) or real_cnorm(*a, **k)
        try:
            na = sa.clip_grad_norm_(opt_a, 0.5, norm_type)
        finally:
            ops.check_finite_and_norm_ = real_cnorm
        sb.unscale_(opt_b)
        nb = torch.nn.utils.clip_grad_norm_(ps_b, 0.5, norm_type)
        for p, g in zip(ps_a, grads_before):
            assert torch.equal(p.grad, g)  # folded: the grads were only read
        with pytest.raises(RuntimeError, match=re.escape("unscale_() has already been called")):
            sa.unscale_(opt_a)
        sa.step(opt_a)
        sb.step(opt_b)
        assert not hasattr(opt_a, "clip_coef") and not hasattr(opt_a, "grad_scale")
        sa.update()
        sb.update()
        if it == 2:
            assert not torch.isfinite(na) and sa.step_was_skipped
            for p, q in zip(ps_a, params_before):
                assert torch.equal(p, q)
        else:
            torch.testing.assert_close(na, nb.float(), rtol=1e-6, atol=0)
        assert sa.get_scale() == sb.get_scale()
    assert len(calls) == 6  # one read-only pass per iteration
    for a, b in zip(ps_a, ps_b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_clip_folded_hands_scale_and_coef_to_the_kernel(device, dtype):
    """16-bit params with masters: the scaler's folded step is exactly the optimizer's step
    with grad_scale=scale and clip_coef=min(1, max_norm / (norm + 1e-6))."""
    ps_a, opt_a = _fold_setup(device, "AdamW", dtype, 3)
    ps_b, opt_b = _fold_setup(device, "AdamW", dtype, 3)
    s = mixprec.GradScaler(device, init_scale=1024.0)
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        _scaled_grads(ps_a, gen, 1024.0)
        for a, b in zip(ps_a, ps_b):
            b.grad = a.grad.clone()
        s.scale(torch.ones((), device=device))
        norm = s.clip_grad_norm_(opt_a, 1.0)
        exact = torch.linalg.vector_norm(torch.cat([p.grad.double().flatten() / 1024
                                                    for p in ps_a]))
        torch.testing.assert_close(norm.double().cpu(), exact.cpu(), rtol=1e-6, atol=0)
        assert norm.item() > 1.0  # the clip is active
        coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
        scale_t = s._scale.clone()
        s.step(opt_a)
        s.update()
        opt_b.step(grad_scale=scale_t, found_inf=torch.zeros((), device=device), clip_coef=coef)
    for a, b in zip(ps_a, ps_b):
        assert torch.equal(a, b)
    for a, b in zip(opt_a.master_params(), opt_b.master_params()):
        assert torch.equal(a, b)


def test_clip_folded_twice_and_opt_out():
    ps_a, opt_a = _fold_setup("cpu", "SGD", torch.float32, 5)
    ps_b, opt_b = _fold_setup("cpu", "SGD", torch.float32, 5)
    ps_c, opt_c = _fold_setup("cpu", "SGD", torch.float32, 5)
    gen = torch.Generator().manual_seed(6)
    _scaled_grads(ps_a, gen, 64.0)
    for p, q, r in zip(ps_a, ps_b, ps_c):
        q.grad, r.grad = p.grad.clone(), p.grad.clone()
    scalers = [mixprec.GradScaler("cpu", init_scale=64.0) for _ in range(3)]
    for sc in scalers:
        sc.scale(torch.ones(()))
    # two clips in one iteration, folded (a), unfolded by opt-out (b), by torch's clip (c)
    na = [scalers[0].clip_grad_norm_(opt_a, m) for m in (4.0, 1.0)]
    nb = [scalers[1].clip_grad_norm_(opt_b, m, fold_into_step=False) for m in (4.0, 1.0)]
    scalers[2].unscale_(opt_c)
    nc = [torch.nn.utils.clip_grad_norm_(ps_c, m) for m in (4.0, 1.0)]
    for x, y, z in zip(na, nb, nc):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=0)
        torch.testing.assert_close(x, z, rtol=1e-6, atol=0)
    for q, r in zip(ps_b, ps_c):  # opt-out leaves unscaled, clipped grads like torch's
        torch.testing.assert_close(q.grad, r.grad, rtol=1e-6, atol=0)
    for sc, opt in zip(scalers, (opt_a, opt_b, opt_c)):
        sc.step(opt)
        sc.update()
    for a, b, c in zip(ps_a, ps_b, ps_c):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("order", ["folded, then opt-out", "opt-out, then folded"])
def test_clip_folded_and_opt_out_in_one_iteration(order: str):
    """A folded clip leaves the grads scaled with its coefficient pending; a later
    ``fold_into_step=False`` clip in the same iteration must measure and clip the grads the
    step would see (unscaled, the first clip applied), as torch's ``unscale_`` + two
    ``clip_grad_norm_`` calls do, and the step must not unscale or clip them again."""
    ps_a, opt_a = _fold_setup("cpu", "SGD", torch.float32, 5)
    ps_c, opt_c = _fold_setup("cpu", "SGD", torch.float32, 5)
    gen = torch.Generator().manual_seed(8)
    _scaled_grads(ps_a, gen, 64.0)
    for p, r in zip(ps_a, ps_c):
        r.grad = p.grad.clone()
    sa, sc = (mixprec.GradScaler("cpu", init_scale=64.0) for _ in range(2))
    for s in (sa, sc):
        s.scale(torch.ones(()))
    folds = (True, False) if order.startswith("folded") else (False, True)
    na = [sa.clip_grad_norm_(opt_a, m, fold_into_step=f) for m, f in zip((4.0, 1.0), folds)]
    sc.unscale_(opt_c)
    nc = [torch.nn.utils.clip_grad_norm_(ps_c, m) for m in (4.0, 1.0)]
    assert nc[0].item() > 4.0 and nc[1].item() > 1.0  # both clips are active
    for x, z in zip(na, nc):
        torch.testing.assert_close(x, z, rtol=1e-6, atol=0)
    for s, opt in ((sa, opt_a), (sc, opt_c)):
        s.step(opt)
        s.update()
    for a, c in zip(ps_a, ps_c):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-7)


def test_clip_folded_keeps_a_user_clip_coef():
    """A clip_coef the user set on a mixprec optimizer is multiplied into the folded one,
    passed as step()'s argument; the attribute is left as the user set it."""
    ps, opt = _fold_setup("cpu", "SGD", torch.float32, 7)
    opt.clip_coef = torch.full((), 0.5)
    seen = []
    real_step = type(opt).step

    def spy(self, *args, **kwargs):
        seen.append((kwargs["clip_coef"].clone(), self.clip_coef.clone()))
        return real_step(self, *args, **kwargs)

    type(opt).step = spy
    try:
        for p in ps:
            p.grad = torch.full_like(p, 8.0)
        s = mixprec.GradScaler("cpu", init_scale=2.0)
        s.scale(torch.ones(()))
        norm = s.clip_grad_norm_(opt, 1.0)
        s.step(opt)
    finally:
        type(opt).step = real_step
    expected = 0.5 * torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    torch.testing.assert_close(seen[0][0], expected)
    assert torch.equal(seen[0][1], torch.full((), 0.5))  # not overwritten during the step
    assert torch.equal(opt.clip_coef, torch.full((), 0.5))
