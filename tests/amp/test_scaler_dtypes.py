"""mixprec-only GradScaler features, grad dtypes: one fused unscale op call for grads of
every dtype, bitwise torch's unscale; bf16 grads; fp16 grads (allow_fp16_grads, fp16 params
with fp32 masters)."""

from __future__ import annotations

import pytest
import torch

import mixprec
from _helpers import INF, RecordingOptimizer, cuda_only, scaled_grad_params, two_layer
from mixprec import ops


# ------------------------------------------------------------------ fused unscale
def test_one_op_call_per_device_for_all_dtypes(device, monkeypatch):
    calls = []
    real = ops.unscale_and_check_

    def counting(grads, found_inf, inv_scale):
        calls.append(sorted(str(g.dtype) for g in grads))
        real(grads, found_inf, inv_scale)

    monkeypatch.setattr(ops, "unscale_and_check_", counting)
    ps = scaled_grad_params(device, [torch.float32, torch.bfloat16, torch.float16, torch.float32,
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
    ps = scaled_grad_params(device, [torch.float32, torch.float32, torch.float64])
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
    ps = scaled_grad_params("cpu", [torch.float32, torch.bfloat16])
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


@cuda_only
def test_bf16_and_mixed_grads_on_cuda():
    ps = scaled_grad_params("cuda", [torch.bfloat16, torch.float32, torch.float16])
    expected = [(p.grad.float() / 64).to(p.dtype) for p in ps]
    s = mixprec.GradScaler("cuda", init_scale=64.0, allow_fp16_grads=True)
    s.scale(torch.ones((), device="cuda"))
    s.unscale_(torch.optim.SGD(ps, lr=0.1))
    for p, e in zip(ps, expected):
        assert torch.equal(p.grad, e)


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
