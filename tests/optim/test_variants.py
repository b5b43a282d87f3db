"""Every optimizer variant of tests/optim/_variants.py through the same checks.

* its steps against torch.optim (float32) or torch.optim on float64 copies, on fresh random
  params of every edge shape (``_helpers.OPTIM_SHAPES``: zero-size, scalar, a chunk
  boundary, 2-D, and a transposed, non-contiguous param), params and moments;
* ``state_dict`` saved and loaded (through ``torch.save``/``torch.load(weights_only=True)``)
  into a fresh optimizer continues bit for bit as the uninterrupted one;
* an inf in one grad under ``mixprec.GradScaler``: the step is skipped and changes nothing
  (params, masters, moments, step counts), the scale backs off, the next clean step moves;
* ``zero_grad`` (both kinds) clears the grads and touches nothing else;
* for the rows marked ``compile``: ``torch.compile(opt.step, fullgraph=True)`` equals eager,
  bit for bit.
"""

from __future__ import annotations

import io
from typing import List, Tuple

import pytest
import torch

import mixprec
from _helpers import all_bitwise_equal, optim_params, rel_err
from _variants import STEPS, VARIANTS, Variant, params_of

ALL = params_of(VARIANTS)
COMPILED = params_of([v for v in VARIANTS if v.compile])


def _grads(v: Variant, params: List[torch.Tensor], gen: torch.Generator,
           scale: float = 1.0) -> List[torch.Tensor]:
    """One fresh grad per param, in the row's grad dtype, on the params' device."""
    return [(torch.randn(p.shape, generator=gen) * scale).to(p.device, v.grad_dtype or p.dtype)
            for p in params]


def _assign(params: List[torch.Tensor], grads: List[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        if g.dtype != p.dtype and hasattr(p, "grad_dtype"):
            p.grad_dtype = None  # newer torch checks grad dtypes; allow any
        p.grad = g.clone()


def _snapshot(opt: torch.optim.Optimizer) -> List[torch.Tensor]:
    """Each param, then its state tensors by name (a loaded state may hold its keys in
    another order than the state it came from)."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            out += [p.detach().clone()] + [state[k].clone() for k in sorted(state)
                                           if isinstance(state[k], torch.Tensor)]
    return out


def _setup(v: Variant, device: str, seed: int) -> Tuple[List[torch.Tensor], torch.optim.Optimizer,
                                                         torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    params = optim_params(device, v.dtype, gen)
    return params, v.make(params), gen


@pytest.mark.parametrize("v", ALL)
def test_steps_match_the_reference(device: str, v: Variant) -> None:
    params, opt, gen = _setup(v, device, 1234)
    ref_dtype = torch.float32 if v.ref == "torch" else torch.float64
    ref_params = [torch.nn.Parameter(p.detach().to(ref_dtype, copy=True)) for p in params]
    ref = v.make_reference(ref_params)
    for _ in range(STEPS):
        grads = _grads(v, params, gen)
        _assign(params, grads)
        _assign(ref_params, [g.to(ref_dtype) for g in grads])
        opt.step()
        ref.step()
    ours = opt.master_params() if v.has_masters else params
    for a, b in zip(ours, ref_params):
        assert rel_err(a, b) <= v.tol, (v.name, tuple(b.shape), rel_err(a, b))
    if v.has_masters:  # float32 masters, the param is its master rounded to nearest
        for p, m in zip(params, ours):
            rounded = m.to(v.dtype)
            c = opt.state[p].get("master_correction")
            if c is not None and c.dtype == torch.int8:
                # (8-bit split masters: the correction -128 under an odd param decodes to
                # the midpoint below it, which rounds to the value below: docs/optimizers.md)
                odd = (p.detach().contiguous().view(torch.int16) & 1) == 1
                rounded = torch.where((c == -128) & odd, p.detach(), rounded)
            assert m.dtype == torch.float32 and torch.equal(p.detach(), rounded)
    compared = 0
    for p, rp in zip(params, ref_params):
        for key, want in ref.state[rp].items():
            got = opt.state[p].get(key)
            if key == "step" or not isinstance(want, torch.Tensor) or \
                    not isinstance(got, torch.Tensor) or not got.is_floating_point():
                continue  # 8-bit moments are codes; step counts are compared below
            assert rel_err(got, want) <= v.tol, (v.name, key, rel_err(got, want))
            compared += 1
        assert float(opt.state[p]["step"]) == STEPS
    if not v.eight_bit and (v.cls != "SGD" or v.hyper.get("momentum")):
        assert compared > 0  # the moments were compared too


def _run(v: Variant, params: List[torch.Tensor], opt: torch.optim.Optimizer,
         steps: List[List[torch.Tensor]]) -> None:
    for grads in steps:
        _assign(params, grads)
        opt.step()


@pytest.mark.parametrize("v", ALL)
def test_state_dict_round_trip_continues_bitwise(device: str, v: Variant) -> None:
    params, opt, gen = _setup(v, device, 7)
    before = [_grads(v, params, gen) for _ in range(3)]
    after = [_grads(v, params, gen) for _ in range(3)]
    _run(v, params, opt, before)
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    new_params = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    new_opt = v.make(new_params)
    new_opt.load_state_dict(saved["opt"])
    assert all_bitwise_equal(_snapshot(opt), _snapshot(new_opt))
    _run(v, params, opt, after)
    _run(v, new_params, new_opt, after)
    assert all_bitwise_equal(_snapshot(opt), _snapshot(new_opt))
    assert all_bitwise_equal(opt.master_params(), new_opt.master_params())


@pytest.mark.parametrize("v", ALL)
def test_inf_grad_under_the_scaler_changes_nothing(device: str, v: Variant) -> None:
    params, opt, gen = _setup(v, device, 11)
    scaler = mixprec.GradScaler(device, init_scale=256.0, growth_interval=1000)

    def iteration(inf: bool) -> None:
        scaler.scale(torch.ones((), device=device))
        grads = _grads(v, params, gen, scale=256.0)
        if inf:
            grads[-1][0, 0] = float("inf")  # the transposed param's first element
        _assign(params, grads)
        scaler.step(opt)
        scaler.update()

    for _ in range(2):
        iteration(inf=False)
    before, masters = _snapshot(opt), [m.clone() for m in opt.master_params()]
    iteration(inf=True)
    assert scaler.step_was_skipped and scaler.get_scale() == 128.0
    assert all_bitwise_equal(before, _snapshot(opt))
    assert all_bitwise_equal(masters, opt.master_params())
    assert all(float(opt.state[p]["step"]) == 2 for p in params)
    iteration(inf=False)
    assert not scaler.step_was_skipped
    assert not all_bitwise_equal(before, _snapshot(opt))


@pytest.mark.parametrize("v", ALL)
def test_zero_grad(device: str, v: Variant) -> None:
    params, opt, gen = _setup(v, device, 5)
    _run(v, params, opt, [_grads(v, params, gen)])
    state = _snapshot(opt)
    dtypes = [p.grad.dtype for p in params]
    opt.zero_grad(set_to_none=False)
    for p, dt in zip(params, dtypes):
        assert p.grad is not None and p.grad.dtype == dt and not p.grad.any()
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    assert all_bitwise_equal(state, _snapshot(opt))


@pytest.mark.parametrize("v", COMPILED)
def test_compiled_step_equals_eager(device: str, v: Variant) -> None:
    """``torch.compile(opt.step, fullgraph=True)``, from the first step (state creation)
    on, leaves the same bits as eager steps."""
    torch._dynamo.reset()
    eager_p, eager, gen = _setup(v, device, 21)
    comp_p = [torch.nn.Parameter(p.detach().clone()) for p in eager_p]
    comp = v.make(comp_p)
    step = torch.compile(comp.step, fullgraph=True)
    for _ in range(3):
        grads = _grads(v, eager_p, gen)
        _assign(eager_p, grads)
        _assign(comp_p, grads)
        eager.step()
        step()
    assert all_bitwise_equal(_snapshot(eager), _snapshot(comp))
    assert all_bitwise_equal(eager.master_params(), comp.master_params())
    assert all(float(comp.state[p]["step"]) == 3 for p in comp_p)
