"""mixprec-only GradScaler features, clip_grad_norm_: the fused norm against unscale_ then
torch's clip, inf, the call order, the unfused fallback, and the clip folded into a mixprec
optimizer's step."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.amp.grad_scaler import OptState

import mixprec
from _helpers import INF, scaled_grad_params
from mixprec import ops


# ------------------------------------------------------------------ clip_grad_norm_
def _clip_pair(device, norm_type, dtypes, max_norm=0.5, inf=False, seed=0):
    ps_a = scaled_grad_params(device, dtypes, seed)
    ps_b = scaled_grad_params(device, dtypes, seed)
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
    ps = scaled_grad_params("cpu", [torch.float32, torch.float32])
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
    """A sparse grad is unscaled and clipped as its dense form would be; a disabled scaler
    clips the grads as they are. Both norms are above max_norm, so both grads are clipped."""
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    s = mixprec.GradScaler("cpu", init_scale=4.0)
    s.scale(emb(torch.tensor([1, 1, 2])).sum()).backward()
    dense = emb.weight.grad.to_dense() / 4
    want = torch.linalg.vector_norm(dense)
    n = s.clip_grad_norm_(opt, 1.0)
    torch.testing.assert_close(n, want, rtol=1e-6, atol=0)
    assert want > 1.0
    torch.testing.assert_close(emb.weight.grad.to_dense(), dense * (1.0 / (want + 1e-6)))
    d = mixprec.GradScaler("cpu", enabled=False)
    ps = scaled_grad_params("cpu", [torch.float32])
    ref = ps[0].grad.clone()
    want2 = torch.linalg.vector_norm(ref)
    n2 = d.clip_grad_norm_(torch.optim.SGD(ps, lr=0.1), 1.0)
    torch.testing.assert_close(n2, want2)
    assert want2 > 1.0
    torch.testing.assert_close(ps[0].grad, ref * (1.0 / (want2 + 1e-6)))


def test_norm_combination_is_exact_for_one_device():
    # sanity of the test oracle itself: torch's total norm equals the p-norm of norms
    gs = [torch.randn(7), torch.randn(3)]
    tn = torch.nn.utils.get_total_norm(gs, 3.0)
    manual = sum(g.abs().pow(3).sum() for g in gs) ** (1 / 3)
    assert math.isclose(tn.item(), manual.item(), rel_tol=1e-5)


def test_clip_grad_norm_unfused_for_norm_type_zero():
    """For norm_type 0 (no fused op takes it) clip_grad_norm_ = unscale_ + torch's norm."""
    norm_type = 0.0
    a, oa, ps_a, norm_a, ps_b, norm_b = _clip_pair("cpu", norm_type, [torch.float32] * 2)
    torch.testing.assert_close(norm_a, norm_b.float(), rtol=1e-6, atol=0)
    for pa, pb in zip(ps_a, ps_b):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-6, atol=0)
    assert a._per_optimizer_states[id(oa)]["stage"] is OptState.UNSCALED


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
    assert nc[0].item() > 4.0 and nc[1].item() > 1.0  # both clips are active
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
