"""Training-loop parity: a scaled run equals an unscaled control run.

Both models start equal; the scaled one goes through the GradScaler API with an
inf injected at iteration 2 (its step skipped), the control skips that
iteration's step by hand. Init scale 128, growth 2 every iteration, so after 4
iterations (3 clean, 1 skipped) the scale is 128 * 2**3 * 0.5 = 512.
Every case runs with mixprec's scaler and with torch's as a control, enabled
and disabled.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import mixprec
from _helpers import (
    INF,
    SCALERS,
    assert_same_opt_state,
    assert_same_params,
    scaling_case,
)

Run = Callable[..., Any]


def run_scaling_case(
    scaler_cls: type,
    device: str,
    run: Run,
    unskipped: int,
    skipped: int,
    atol: float = 1e-7,
    optimizer_ctor: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
    optimizer_kwargs: dict[str, Any] | None = None,
) -> None:
    for enabled in (True, False):
        control, scaling, opt_c, opt_s, data, loss_fn, skip_iter = scaling_case(
            device, optimizer_ctor, optimizer_kwargs
        )
        scaler = scaler_cls(
            device, init_scale=128.0, growth_factor=2.0, enabled=enabled, growth_interval=1
        )
        run(device, data, control, opt_c, scaler, loss_fn, skip_iter, False)
        run(device, data, scaling, opt_s, scaler, loss_fn, skip_iter, True)
        if enabled:
            expected = 128.0 * 2.0**unskipped * 0.5**skipped
            assert scaler.get_scale() == expected
        else:
            assert scaler.get_scale() == 1.0
        assert_same_params(control, scaling, atol=atol)
        assert_same_opt_state(opt_c, opt_s, atol=atol)


def _inject(model: torch.nn.Module, i: int, skip_iter: int, scaler: Any) -> None:
    if i == skip_iter and scaler.is_enabled():
        with torch.no_grad():
            model[1].weight.grad.fill_(INF)


def _backward_and_step(
    loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: Any,
    i: int, skip_iter: int, try_scaling_api: bool,
) -> None:
    """One step's backward and step: scaled, with inf injected at ``skip_iter``, on the
    scaling run; plain, skipping the step the scaling run skips, on the control run."""
    if try_scaling_api:
        scaler.scale(loss).backward()
        _inject(model, i, skip_iter, scaler)
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        if not scaler.is_enabled() or i != skip_iter:
            opt.step()


def _run_basic(device, data, model, opt, scaler, loss_fn, skip_iter, try_scaling_api):
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        _backward_and_step(loss, model, opt, scaler, i, skip_iter, try_scaling_api)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_basic_parity_final_scale_512(scaler_cls, device):
    run_scaling_case(scaler_cls, device, _run_basic, unskipped=3, skipped=1)


@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize(
    "ctor,kwargs",
    [
        (torch.optim.SGD, {"lr": 0.5, "momentum": 0.9}),
        (torch.optim.Adam, {"lr": 0.01}),
        (torch.optim.AdamW, {"lr": 0.01, "foreach": True}),
    ],
    ids=["sgd-momentum", "adam", "adamw-foreach"],
)
def test_parity_other_optimizers(scaler_cls, device, ctor, kwargs):
    run_scaling_case(
        scaler_cls, device, _run_basic, 3, 1, atol=1e-6, optimizer_ctor=ctor,
        optimizer_kwargs=kwargs,
    )


@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize("ctor", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_parity_fused_optimizers(scaler_cls, device, ctor):
    """Fused optimizers unscale and skip inside their kernel (_step_supports_amp_scaling)."""
    kw_s: dict[str, Any] = {"lr": 0.01, "fused": True}
    kw_c: dict[str, Any] = {"lr": 0.01, "foreach": False}
    for enabled in (True, False):
        control, scaling, _, _, data, loss_fn, skip_iter = scaling_case(device)
        opt_c, opt_s = ctor(control.parameters(), **kw_c), ctor(scaling.parameters(), **kw_s)
        assert opt_s._step_supports_amp_scaling
        scaler = scaler_cls(device, init_scale=128.0, enabled=enabled, growth_interval=1)
        _run_basic(device, data, control, opt_c, scaler, loss_fn, skip_iter, False)
        _run_basic(device, data, scaling, opt_s, scaler, loss_fn, skip_iter, True)
        assert scaler.get_scale() == (512.0 if enabled else 1.0)
        for pc, ps in zip(control.parameters(), scaling.parameters()):
            torch.testing.assert_close(pc, ps, atol=1e-6, rtol=1e-5)


def _run_accumulation(device, data, model, opt, scaler, loss_fn, skip_iter, try_scaling_api):
    accumulate = 2
    for i, (x, y) in enumerate(data):
        loss = loss_fn(model(x), y) / accumulate
        if try_scaling_api:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (i + 1) % accumulate == 0:
            if try_scaling_api:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_parity_gradient_accumulation(scaler_cls, device):
    run_scaling_case(scaler_cls, device, _run_accumulation, unskipped=2, skipped=0, atol=1e-6)


def _make_run_clipping(mode: str) -> Run:
    max_norm = 0.2  # small enough that clipping is active

    def run(device, data, model, opt, scaler, loss_fn, skip_iter, try_scaling_api):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            if try_scaling_api:
                scaler.scale(loss).backward()
                if mode == "scaled-norm":
                    scaled_max = max_norm * scaler.get_scale()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), scaled_max)
                    _inject(model, i, skip_iter, scaler)
                elif mode == "unscale":
                    _inject(model, i, skip_iter, scaler)
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                else:  # mixprec's fused clip_grad_norm_, inf injected before it
                    _inject(model, i, skip_iter, scaler)
                    scaler.clip_grad_norm_(opt, max_norm)
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if not scaler.is_enabled() or i != skip_iter:
                    opt.step()

    return run


@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize("mode", ["scaled-norm", "unscale"])
def test_parity_clipping(scaler_cls, device, mode):
    run_scaling_case(scaler_cls, device, _make_run_clipping(mode), 3, 1, atol=1e-5)


def test_parity_clipping_fused_clip_grad_norm(device):
    run_scaling_case(
        mixprec.GradScaler, device, _make_run_clipping("fused"), 3, 1, atol=1e-6
    )


def _run_penalty(device, data, model, opt, scaler, loss_fn, skip_iter, try_scaling_api):
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if try_scaling_api:
            grads = torch.autograd.grad(
                scaler.scale(loss), list(model.parameters()), create_graph=True
            )
            inv = 1.0 / scaler.get_scale()
            grads = [g * inv for g in grads]
        else:
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        penalty = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
        loss = loss + penalty
        _backward_and_step(loss, model, opt, scaler, i, skip_iter, try_scaling_api)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_parity_gradient_penalty(scaler_cls, device):
    run_scaling_case(scaler_cls, device, _run_penalty, 3, 1, atol=1e-6)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_parity_two_models_two_optimizers_two_losses(scaler_cls, device):
    for enabled in (True, False):
        c0, s0, oc0, os0, data, loss_fn, skip_iter = scaling_case(device, seed=0)
        c1, s1, oc1, os1, _, _, _ = scaling_case(device, seed=7)
        scaler = scaler_cls(device, init_scale=128.0, growth_factor=2.0, enabled=enabled,
                            growth_interval=1)

        def run(m0, m1, o0, o1, try_scaling_api, scaler=scaler, data=data, loss_fn=loss_fn,
                skip_iter=skip_iter):
            for i, (x, y) in enumerate(data):
                o0.zero_grad()
                o1.zero_grad()
                out0, out1 = m0(x), m1(x)
                loss0 = loss_fn(0.3 * out0 + 0.7 * out1, y)
                loss1 = loss_fn(0.6 * out0 - 0.4 * out1, y)
                if try_scaling_api:
                    scaler.scale(loss0).backward(retain_graph=True)
                    scaler.scale(loss1).backward()
                    _inject(m1, i, skip_iter, scaler)
                    scaler.unscale_(o0)  # explicit for one optimizer, implicit for the other
                    scaler.step(o0)
                    scaler.step(o1)
                    scaler.update()
                else:
                    loss0.backward(retain_graph=True)
                    loss1.backward()
                    o0.step()  # its grads stay finite: never skipped
                    if not scaler.is_enabled() or i != skip_iter:
                        o1.step()

        run(c0, c1, oc0, oc1, False)
        run(s0, s1, os0, os1, True)
        # the skipped iteration backs off once for the whole iteration
        assert scaler.get_scale() == (512.0 if enabled else 1.0)
        assert_same_params(c0, s0, atol=1e-6)
        assert_same_params(c1, s1, atol=1e-6)


@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize("sparse_dtype", [torch.float32, torch.float64])
def test_parity_sparse_embedding(scaler_cls, device, sparse_dtype):
    for enabled in (True, False):
        torch.manual_seed(3)
        emb_c = torch.nn.Embedding(16, 8, sparse=True).to(device, sparse_dtype)
        emb_s = torch.nn.Embedding(16, 8, sparse=True).to(device, sparse_dtype)
        emb_s.load_state_dict(emb_c.state_dict())
        opt_c = torch.optim.SGD(emb_c.parameters(), lr=0.5)
        opt_s = torch.optim.SGD(emb_s.parameters(), lr=0.5)
        scaler = scaler_cls(device, init_scale=128.0, enabled=enabled, growth_interval=1)
        idx = [torch.randint(0, 16, (12,), device=device) for _ in range(4)]  # duplicates
        for i, ix in enumerate(idx):
            for emb, opt, scaled in ((emb_c, opt_c, False), (emb_s, opt_s, True)):
                opt.zero_grad()
                loss = emb(ix).pow(2).sum()
                if scaled:
                    scaler.scale(loss).backward()
                    assert emb.weight.grad.is_sparse
                    if i == 2 and enabled:
                        emb.weight.grad = torch.sparse_coo_tensor(
                            emb.weight.grad._indices(),
                            torch.full_like(emb.weight.grad._values(), INF),
                            emb.weight.grad.shape,
                            check_invariants=True,
                        )
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    if not enabled or i != 2:
                        opt.step()
        assert scaler.get_scale() == (512.0 if enabled else 1.0)
        torch.testing.assert_close(emb_c.weight, emb_s.weight, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_parity_fp16_autocast(scaler_cls, device):
    def run(device, data, model, opt, scaler, loss_fn, skip_iter, try_scaling_api):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                out = model(x)
                assert out.dtype == torch.float16
                loss = loss_fn(out.float(), y)
            _backward_and_step(loss, model, opt, scaler, i, skip_iter, try_scaling_api)

    run_scaling_case(scaler_cls, device, run, 3, 1, atol=1e-3)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_nan_is_treated_like_inf(scaler_cls, device):
    control, scaling, opt_c, opt_s, data, loss_fn, _ = scaling_case(device)
    scaler = scaler_cls(device, init_scale=128.0, growth_interval=1)
    for i, (x, y) in enumerate(data):
        opt_s.zero_grad()
        scaler.scale(loss_fn(scaling(x), y)).backward()
        if i == 1:
            with torch.no_grad():
                scaling[0].bias.grad[3] = float("nan")
        scaler.step(opt_s)
        scaler.update()
    assert scaler.get_scale() == 512.0
