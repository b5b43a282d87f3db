"""Tests of the optimizer classes mixprec.optim.AdamW, Adam and SGD.

CPU always, CUDA where a GPU is present (the ``device`` fixture). References:
torch.optim (foreach=False) for float32 params, and a float64 implementation of
the same algorithm for float16/bfloat16 params. The fused_adam_/fused_sgd_ ops
themselves are tested in test_optim_ops.py.
"""

from __future__ import annotations

import copy
import io
import itertools
from typing import Any, Callable, Dict, Iterable, List, Optional

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

import mixprec
import mixprec.optim
from _helpers import (
    all_bitwise_equal,
    assert_within_one_ulp,
    assign_grad,
    cuda_only,
    optim_params,
    rel_err,
    set_grads,
    snapshot_optimizer,
)

LOW = (torch.float16, torch.bfloat16)

# ---------------------------------------------------------------------------
# float32 params: torch.optim parity over every option combination.

ADAM_CASES = list(itertools.product(["Adam", "AdamW"], [False, True], [False, True],
                                    [0.0, 0.1]))
SGD_CASES = [
    (mom, damp, nest, wd, mx)
    for mom, damp, nest, wd, mx in itertools.product([0.0, 0.9], [0.0, 0.3], [False, True],
                                                     [0.0, 0.05], [False, True])
    if not (nest and (mom == 0.0 or damp != 0.0))
]


def _run_pair(make_ours: Callable, make_torch: Callable, device: str, steps: int = 100,
              grad_dtype: Optional[torch.dtype] = None) -> tuple:
    gen = torch.Generator().manual_seed(1234)
    ours_p = optim_params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours, ref = make_ours(ours_p), make_torch(torch_p)
    for _ in range(steps):
        set_grads(ours_p, gen, grad_dtype)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad.float().clone()
        ours.step()
        ref.step()
    return ours_p, torch_p



def _same_grads(src: List[torch.Tensor], dst: List[torch.Tensor],
                gen: torch.Generator) -> None:
    """Fresh grads on ``src`` (drawn from ``gen``), copied onto ``dst``."""
    set_grads(src, gen)
    for a, b in zip(src, dst):
        b.grad = a.grad.clone()


def _step_both(a: torch.optim.Optimizer, b: torch.optim.Optimizer, src: List[torch.Tensor],
               dst: List[torch.Tensor], gen: torch.Generator, steps: int) -> None:
    """``steps`` steps of both optimizers on the same fresh grads (see :func:`_same_grads`)."""
    for _ in range(steps):
        _same_grads(src, dst, gen)
        a.step()
        b.step()


def _assert_matches(ours: Iterable[torch.Tensor], ref: Iterable[torch.Tensor]) -> None:
    """Every tensor within 1e-6 relative error of its reference."""
    for a, b in zip(ours, ref):
        assert rel_err(a, b) <= 1e-6


@pytest.mark.parametrize("name,amsgrad,maximize,wd", ADAM_CASES)
def test_adam_matches_torch_fp32(device: str, name: str, amsgrad: bool, maximize: bool,
                                 wd: float) -> None:
    kw: Dict[str, Any] = dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd,
                              amsgrad=amsgrad, maximize=maximize)
    ours_cls, torch_cls = getattr(mixprec.optim, name), getattr(torch.optim, name)
    ours_p, torch_p = _run_pair(lambda ps: ours_cls(ps, **kw),
                                lambda ps: torch_cls(ps, foreach=False, **kw), device)
    _assert_matches(ours_p, torch_p)


def test_adam_default_betas_large_weight_lerp(device: str) -> None:
    # beta1 < 0.5 takes torch's other lerp branch.
    kw: Dict[str, Any] = dict(lr=1e-2, betas=(0.3, 0.9), weight_decay=0.02)
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.AdamW(ps, **kw),
                                lambda ps: torch.optim.AdamW(ps, foreach=False, **kw),
                                device)
    _assert_matches(ours_p, torch_p)


@pytest.mark.parametrize("momentum,dampening,nesterov,wd,maximize", SGD_CASES)
def test_sgd_matches_torch_fp32(device: str, momentum: float, dampening: float,
                                nesterov: bool, wd: float, maximize: bool) -> None:
    kw: Dict[str, Any] = dict(lr=1e-2, momentum=momentum, dampening=dampening,
                              nesterov=nesterov, weight_decay=wd, maximize=maximize)
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.SGD(ps, **kw),
                                lambda ps: torch.optim.SGD(ps, foreach=False, **kw), device)
    _assert_matches(ours_p, torch_p)


@pytest.mark.parametrize("grad_dtype", LOW)
def test_fp32_params_low_precision_grads(device: str, grad_dtype: torch.dtype) -> None:
    # fp16/bf16 grads of fp32 params are read as they are (converted in-kernel).
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.AdamW(ps, lr=1e-3),
                                lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
                                device, steps=20, grad_dtype=grad_dtype)
    _assert_matches(ours_p, torch_p)


# ---------------------------------------------------------------------------
# fp16/bf16 params with masters: a float64 reference of the same algorithm.


def _adam64(w: torch.Tensor, g: torch.Tensor, st: Dict[str, Any], lr: float, b1: float,
            b2: float, eps: float, wd: float, decoupled: bool, amsgrad: bool) -> torch.Tensor:
    st["t"] = st.get("t", 0) + 1
    t = st["t"]
    m = st.setdefault("m", torch.zeros_like(w))
    v = st.setdefault("v", torch.zeros_like(w))
    if wd:
        if decoupled:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
    m.mul_(b1).add_((1 - b1) * g)
    v.mul_(b2).add_((1 - b2) * g * g)
    vh = v
    if amsgrad:
        vm = st.setdefault("vm", torch.zeros_like(w))
        torch.maximum(vm, v, out=vm)
        vh = vm
    denom = vh.sqrt() / (1 - b2 ** t) ** 0.5 + eps
    return w - lr / (1 - b1 ** t) * m / denom


def _sgd64(w: torch.Tensor, g: torch.Tensor, st: Dict[str, Any], lr: float, mom: float,
           damp: float, nesterov: bool, wd: float) -> torch.Tensor:
    if wd:
        g = g + wd * w
    if mom:
        if "b" not in st:
            st["b"] = g.clone()
        else:
            st["b"] = st["b"] * mom + (1 - damp) * g
        g = g + mom * st["b"] if nesterov else st["b"]
    return w - lr * g


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("grad_kind", ["same", "float32"])
@pytest.mark.parametrize("kind", ["AdamW", "Adam-amsgrad", "SGD-nesterov"])
def test_low_precision_masters_vs_float64(device: str, dtype: torch.dtype, grad_kind: str,
                                          kind: str) -> None:
    gen = torch.Generator().manual_seed(7)
    params = optim_params(device, dtype, gen)
    scale = 1024.0
    if kind == "AdamW":
        opt: torch.optim.Optimizer = mixprec.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    elif kind == "Adam-amsgrad":
        opt = mixprec.optim.Adam(params, lr=1e-2, weight_decay=0.05, amsgrad=True)
    else:
        opt = mixprec.optim.SGD(params, lr=5e-2, momentum=0.9, nesterov=True,
                                weight_decay=1e-3)
    w64 = [p.detach().double().cpu() for p in params]
    states: List[Dict[str, Any]] = [{} for _ in params]
    grad_scale = torch.full((1,), scale, device=device)
    for _ in range(30):
        set_grads(params, gen, dtype if grad_kind == "same" else torch.float32, scale)
        for i, p in enumerate(params):
            g64 = p.grad.double().cpu() * (1.0 / scale)
            if kind == "AdamW":
                w64[i] = _adam64(w64[i], g64, states[i], 1e-2, 0.9, 0.999, 1e-8, 0.1, True,
                                 False)
            elif kind == "Adam-amsgrad":
                w64[i] = _adam64(w64[i], g64, states[i], 1e-2, 0.9, 0.999, 1e-8, 0.05, False,
                                 True)
            else:
                w64[i] = _sgd64(w64[i], g64, states[i], 5e-2, 0.9, 0.0, True, 1e-3)
        opt.step(grad_scale=grad_scale)
    masters = opt.master_params()
    for p, m, ref in zip(params, masters, w64):
        assert m.dtype == torch.float32
        # float32 rounding accumulated over 30 steps
        assert rel_err(m, ref) <= 2e-5
        # the param is the master rounded to nearest
        assert torch.equal(p.detach(), m.to(dtype))


# ---------------------------------------------------------------------------
# found_inf: a skipped step changes nothing, bitwise.


def _make(kind: str, params: List[torch.Tensor], **kw: Any) -> torch.optim.Optimizer:
    if kind == "AdamW":
        return mixprec.optim.AdamW(params, lr=1e-2, **{"amsgrad": True, **kw})
    if kind == "Adam":
        return mixprec.optim.Adam(params, lr=1e-2, weight_decay=0.1, **kw)
    return mixprec.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.1, **kw)


@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("how", ["kwarg", "attribute"])
def test_found_inf_skips_bitwise(device: str, kind: str, dtype: torch.dtype, how: str) -> None:
    gen = torch.Generator().manual_seed(3)
    params = optim_params(device, dtype, gen)
    opt = _make(kind, params)
    for skip_first in (True, False):
        # also before any step (SGD's buffer must stay uninitialised)
        if not skip_first:
            for _ in range(3):
                set_grads(params, gen)
                opt.step()
        set_grads(params, gen)
        before = snapshot_optimizer(opt)
        params_before = [p.detach().clone() for p in params]
        found = torch.ones(1, device=device)
        if how == "kwarg":
            opt.step(grad_scale=torch.full((1,), 8.0, device=device), found_inf=found)
        else:
            opt.grad_scale = torch.full((1,), 8.0, device=device)  # type: ignore[attr-defined]
            opt.found_inf = found  # type: ignore[attr-defined]
            opt.step()
            del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
        if skip_first:
            # state was created, but nothing was stepped: params keep their bits,
            # step counts stay 0 (so SGD's buffer still starts from the grad)
            assert all_bitwise_equal(params_before, [p.detach().clone() for p in params])
            for p in params:
                assert float(opt.state[p]["step"]) == 0.0
        else:
            assert all_bitwise_equal(before, snapshot_optimizer(opt))
    # a clean step does change the params
    before = snapshot_optimizer(opt)
    opt.step(found_inf=torch.zeros(1, device=device))
    assert not all_bitwise_equal(before, snapshot_optimizer(opt))


def test_skipped_first_sgd_step_then_real_step_matches_torch(device: str) -> None:
    gen = torch.Generator().manual_seed(11)
    ours_p = optim_params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.SGD(ours_p, lr=0.1, momentum=0.9, dampening=0.2)
    ref = torch.optim.SGD(torch_p, lr=0.1, momentum=0.9, dampening=0.2, foreach=False)
    set_grads(ours_p, gen)
    ours.step(found_inf=torch.ones(1, device=device))  # skipped: buffer stays "first"
    for _ in range(3):
        _same_grads(ours_p, torch_p, gen)
        ours.step(found_inf=torch.zeros(1, device=device))
        ref.step()
    _assert_matches(ours_p, torch_p)


# ---------------------------------------------------------------------------
# Under torch.amp.GradScaler (the _step_supports_amp_scaling contract).


def test_torch_grad_scaler_control(device: str) -> None:
    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 4)).to(device)
    model_b = copy.deepcopy(model_a)
    opt_a = mixprec.optim.AdamW(model_a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(model_b.parameters(), lr=1e-2, foreach=False)
    sc_a = torch.amp.GradScaler(device, init_scale=256.0, growth_interval=2)
    sc_b = torch.amp.GradScaler(device, init_scale=256.0, growth_interval=2)
    x, y = torch.randn(32, 8, device=device), torch.randn(32, 4, device=device)
    for it in range(8):
        for model, opt, sc in ((model_a, opt_a, sc_a), (model_b, opt_b, sc_b)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            sc.scale(loss).backward()
            if it == 3:  # an overflow: the step must be skipped
                next(model.parameters()).grad[0, 0] = float("inf")
            sc.step(opt)
            sc.update()
        assert sc_a.get_scale() == sc_b.get_scale()
    _assert_matches(model_a.parameters(), model_b.parameters())
    assert not hasattr(opt_a, "found_inf")


def test_clip_coef_folded(device: str) -> None:
    gen = torch.Generator().manual_seed(5)
    ours_p = optim_params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.AdamW(ours_p, lr=1e-2)
    ref = torch.optim.AdamW(torch_p, lr=1e-2, foreach=False)
    for _ in range(5):
        set_grads(ours_p, gen, scale=64.0)
        coef = torch.rand((), generator=gen).to(device)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad * (1.0 / torch.tensor(64.0, dtype=torch.float64)).float() * coef
        ours.step(grad_scale=torch.full((1,), 64.0, device=device), clip_coef=coef.reshape(1))
        ref.step()
    _assert_matches(ours_p, torch_p)


# ---------------------------------------------------------------------------
# State: save -> load -> continue is bitwise an uninterrupted run.


def _train(kind: str, device: str, dtype: torch.dtype, steps: int, seed: int,
           opt_kw: Dict[str, Any], params: Optional[List[torch.Tensor]] = None,
           opt: Optional[torch.optim.Optimizer] = None) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    if params is None:
        params = optim_params(device, dtype, torch.Generator().manual_seed(99))
        opt = _make(kind, params, **opt_kw)
    assert opt is not None
    for _ in range(steps):
        set_grads(params, gen)
        opt.step()
    return params, opt


@pytest.mark.parametrize("kind,dtype,opt_kw", [
    ("AdamW", torch.float16, {}),
    ("AdamW", torch.bfloat16, {}),
    ("Adam", torch.float32, {}),
    ("SGD", torch.bfloat16, {}),
    ("SGD", torch.bfloat16, {"master_weights": False, "stochastic_rounding": True, "seed": 5}),
    ("AdamW", torch.bfloat16, {"master_weights": False, "stochastic_rounding": True}),
])
def test_save_load_continue_bitwise(device: str, kind: str, dtype: torch.dtype,
                                    opt_kw: Dict[str, Any]) -> None:
    full_p, full_opt = _train(kind, device, dtype, 6, 1, opt_kw)
    _train(kind, device, dtype, 4, 2, opt_kw, full_p, full_opt)

    half_p, half_opt = _train(kind, device, dtype, 6, 1, opt_kw)
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in half_p], "opt": half_opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    new_p = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    new_opt = _make(kind, new_p, **opt_kw)
    new_opt.load_state_dict(saved["opt"])
    if dtype != torch.float32 and opt_kw.get("master_weights", True):
        assert all("master_param" in new_opt.state[p] for p in new_p if p.numel() or True)
    _train(kind, device, dtype, 4, 2, opt_kw, new_p, new_opt)
    assert all_bitwise_equal(snapshot_optimizer(full_opt), snapshot_optimizer(new_opt))


@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD"])
def test_load_torch_state_dict(device: str, name: str) -> None:
    kw: Dict[str, Any] = {"lr": 1e-2}
    if name == "SGD":
        kw["momentum"] = 0.9
    gen = torch.Generator().manual_seed(21)
    torch_p = optim_params(device, torch.float32, gen)
    ref = getattr(torch.optim, name)(torch_p, foreach=False, **kw)
    for _ in range(4):
        set_grads(torch_p, gen)
        ref.step()
    ours_p = [torch.nn.Parameter(p.detach().clone()) for p in torch_p]
    ours = getattr(mixprec.optim, name)(ours_p, **kw)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    _step_both(ref, ours, torch_p, ours_p, gen, 4)
    _assert_matches(ours_p, torch_p)


def test_load_torch_state_dict_builds_masters(device: str) -> None:
    gen = torch.Generator().manual_seed(4)
    torch_p = optim_params(device, torch.float32, gen, transposed=False)
    ref = torch.optim.AdamW(torch_p, lr=1e-3, foreach=False)
    set_grads(torch_p, gen)
    ref.step()
    half = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in torch_p]
    ours = mixprec.optim.AdamW(half, lr=1e-3)
    ours.load_state_dict(ref.state_dict())
    for p in half:
        st = ours.state[p]
        assert st["master_param"].dtype == torch.float32
        assert torch.equal(st["master_param"], p.detach().float())
        assert st["exp_avg"].dtype == torch.float32
        assert st["step"].device == p.device and st["step"].dtype == torch.float32
    # moments were kept in float32 (not rounded to the bf16 param dtype)
    for p_t, p_o in zip(torch_p, half):
        assert torch.equal(ours.state[p_o]["exp_avg_sq"], ref.state[p_t]["exp_avg_sq"])


# ---------------------------------------------------------------------------
# Stochastic rounding.


def test_stochastic_rounding_unbiased(device: str) -> None:
    n = 200_000
    frac = 0.3
    ulp = 2.0 ** -7  # bfloat16 spacing in [1, 2)
    p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16, device=device))
    opt = mixprec.optim.SGD([p], lr=1.0, master_weights=False, stochastic_rounding=True, seed=3)
    assign_grad(p, torch.full((n,), -frac * ulp, dtype=torch.float32, device=device))
    opt.step()
    vals = p.detach().double().cpu()
    assert set(vals.unique().tolist()) == {1.0, 1.0 + ulp}
    exact = 1.0 + frac * ulp
    sigma = ulp * (frac * (1 - frac) / n) ** 0.5
    assert abs(float(vals.mean()) - exact) < 5 * sigma
    # round-to-nearest would be biased: every element stays at 1.0
    q = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16, device=device))
    assign_grad(q, p.grad.clone())
    mixprec.optim.SGD([q], lr=1.0, master_weights=False).step()
    assert float(q.detach().double().mean()) == 1.0


def test_stochastic_rounding_unbiased_over_steps(device: str) -> None:
    # one element drawn at 4000 steps: each step's draw is independent
    p = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16, device=device))
    opt = mixprec.optim.SGD([p], lr=1.0, master_weights=False, stochastic_rounding=True)
    ups = 0
    steps = 4000
    for _ in range(steps):
        p.data.fill_(1.0)
        assign_grad(p, torch.full((1,), -0.25 * 2.0 ** -7, device=device))
        opt.step()
        ups += int(p.detach().item() != 1.0)
    assert abs(ups / steps - 0.25) < 5 * (0.25 * 0.75 / steps) ** 0.5


def test_stochastic_rounding_reproducible(device: str) -> None:
    def run(seed: int) -> List[torch.Tensor]:
        params, _ = _train("AdamW", device, torch.bfloat16, 5, 8,
                           {"master_weights": False, "stochastic_rounding": True, "seed": seed})
        return [p.detach().clone() for p in params]

    a, b, c = run(1), run(1), run(2)
    assert all_bitwise_equal(a, b)
    assert not all_bitwise_equal(a, c)



@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [32, 8])
def test_compile_optimizer_step_fullgraph(device: str, kind: str, dtype: torch.dtype,
                                          bits: int) -> None:
    """optimizer.step itself (state creation on the first call, grad_scale/found_inf/clip_coef,
    a skipped step, a tensor lr changed between steps) under torch.compile(fullgraph=True)
    equals eager, bit for bit; also with 8-bit state (every param of two or more dims
    quantized)."""
    if bits == 8 and dtype == torch.float16:
        pytest.skip("8-bit: fp32 and bf16 cover the op; fp16 adds only compile time")
    torch._dynamo.reset()  # the compiled function's code object is shared by the cases
    gen = torch.Generator().manual_seed(21)
    eager_p = optim_params(device, dtype, gen)
    comp_p = [torch.nn.Parameter(p.detach().clone()) for p in eager_p]
    lr_e = torch.tensor(1e-2, dtype=torch.float64, device=device)
    lr_c = lr_e.clone()
    kw: Dict[str, Any] = ({"state_bits": 8, "min_8bit_size": 0, "amsgrad": False}
                          if bits == 8 else {})
    if kind == "SGD":
        kw.pop("amsgrad", None)
    eager, comp = _make(kind, eager_p, **kw), _make(kind, comp_p, **kw)
    for o, lr in ((eager, lr_e), (comp, lr_c)):
        o.param_groups[0]["lr"] = lr

    @torch.compile(fullgraph=True)
    def compiled_step(scale: torch.Tensor, found: torch.Tensor, coef: torch.Tensor) -> None:
        comp.step(grad_scale=scale, found_inf=found, clip_coef=coef)

    scale = torch.full((), 32.0, device=device)
    coef = torch.full((), 0.75, device=device)
    for it in range(4):
        set_grads(eager_p, gen, scale=32.0)
        for a, b in zip(eager_p, comp_p):
            b.grad = a.grad.clone()
        found = torch.full((), 1.0 if it == 2 else 0.0, device=device)
        eager.step(grad_scale=scale, found_inf=found, clip_coef=coef)
        compiled_step(scale, found, coef)
        lr_e.mul_(0.5)
        lr_c.mul_(0.5)
    assert all_bitwise_equal(list(eager_p), list(comp_p))
    assert all_bitwise_equal(eager.master_params(), comp.master_params())
    for a, b in zip(eager_p, comp_p):
        sa, sb = eager.state[a], comp.state[b]
        assert sa.keys() == sb.keys()
        tensors = [k for k in sa if isinstance(sa[k], torch.Tensor)]
        assert all_bitwise_equal([sa[k] for k in tensors], [sb[k] for k in tensors])
        assert all(sa[k] == sb[k] for k in sa if k not in tensors)  # 8-bit: "quant"
        assert float(sb["step"]) == 3.0  # 4 steps, one skipped
        if bits == 8 and kind != "SGD":
            assert (sb["exp_avg"].dtype == torch.uint8) == (b.dim() >= 2)


# ---------------------------------------------------------------------------
# Optimizer-class behaviour.


def _mixed_groups(device: str) -> tuple[Any, ...]:
    """An AdamW over fp32, fp16 (master) and bf16 (no master) params in two groups,
    plus a third group added later with a param that never gets a grad; one step."""
    gen = torch.Generator().manual_seed(31)
    p32 = torch.nn.Parameter(torch.randn(10, generator=gen).to(device))
    p16 = torch.nn.Parameter(torch.randn(10, generator=gen).to(device).half())
    pbf = torch.nn.Parameter(torch.randn(10, generator=gen).to(device).bfloat16())
    frozen = torch.nn.Parameter(torch.randn(10, generator=gen).to(device))
    opt = mixprec.optim.AdamW([{"params": [p32, p16]}, {"params": [pbf], "lr": 1e-2,
                                                          "master_weights": False}])
    opt.add_param_group({"params": [frozen], "weight_decay": 0.5})
    for p in (p32, p16, pbf):
        p.grad = torch.randn(10, generator=gen).to(device=device, dtype=p.dtype)
    before_frozen = frozen.detach().clone()
    opt.step()
    return opt, p32, p16, pbf, frozen, before_frozen


def test_param_group_defaults_and_amp_flag(device: str) -> None:
    opt, *_ = _mixed_groups(device)
    assert opt.master_weights is True
    assert opt._step_supports_amp_scaling is True
    assert opt.param_groups[2]["lr"] == 1e-3 and opt.param_groups[2]["weight_decay"] == 0.5


def test_param_without_grad_untouched_and_stateless(device: str) -> None:
    opt, _, _, _, frozen, before_frozen = _mixed_groups(device)
    assert torch.equal(frozen.detach(), before_frozen)
    assert frozen not in opt.state


def test_masters_only_for_fp16_and_bf16_with_master_weights(device: str) -> None:
    opt, p32, p16, pbf, _, _ = _mixed_groups(device)
    assert "master_param" in opt.state[p16] and "master_param" not in opt.state[pbf]
    assert "master_param" not in opt.state[p32]
    assert opt.state[p16]["step"].device.type == torch.device(device).type


def test_master_params_lists_the_float32_copies(device: str) -> None:
    opt, p32, p16, pbf, _, _ = _mixed_groups(device)
    masters = opt.master_params()
    assert masters[0] is p32 and masters[1] is opt.state[p16]["master_param"]
    assert masters[2] is pbf
    assert masters[3].dtype == torch.float32


def test_zero_grad_sets_none(device: str) -> None:
    opt, p32, p16, pbf, _, _ = _mixed_groups(device)
    opt.zero_grad()
    assert all(p.grad is None for p in (p32, p16, pbf))


def test_state_dict_holds_the_masters(device: str) -> None:
    opt, *_ = _mixed_groups(device)
    sd = opt.state_dict()
    assert any("master_param" in s for s in sd["state"].values())


def test_lr_changes_and_tensor_lr(device: str) -> None:
    gen = torch.Generator().manual_seed(41)
    ours_p = optim_params(device, torch.float32, gen, transposed=False)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    lr_t = torch.tensor(1e-2, device=device)
    ours = mixprec.optim.Adam(ours_p, lr=lr_t, capturable=True)
    ref = torch.optim.Adam(torch_p, lr=1e-2, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    for _ in range(4):
        _same_grads(ours_p, torch_p, gen)
        ours.step()
        ref.step()
        sched.step()
        lr_t.mul_(0.5)  # in-place: the optimizer reads it on the device
    _assert_matches(ours_p, torch_p)
    # float lr changed by a scheduler
    opt = mixprec.optim.SGD(ours_p, lr=1.0)
    s2 = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    p0 = ours_p[2]
    for lr in (1.0, 0.1):
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)
        before = p0.detach().clone()
        p0.grad = torch.ones_like(p0)
        opt.step()
        s2.step()
        torch.testing.assert_close(p0.detach(), before - lr)


def test_closure_and_return_value() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = mixprec.optim.SGD([p], lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss.detach()) == 5.0
    torch.testing.assert_close(p.detach(), torch.tensor([0.8, -1.6]))


# step() is wrapped by torch.optim.Optimizer as every torch optimizer's is: hooks, the
# profiler and grad mode must see it as they see torch's optimizers.


def _hook_log(opt_cls: Callable[..., torch.optim.Optimizer], register: str
              ) -> List[Any]:
    """The (pre/post, optimizer class, args[0] is the optimizer, the other args, kwargs)
    calls of a step hook registered with
    ``register`` ("instance" or "global"), for one step(closure=None, ...)."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.25])
    opt = opt_cls([p], lr=0.1)
    log: List[Any] = []

    def pre(o: Any, args: Any, kwargs: Any) -> None:  # args: (self, *step's args)
        log.append(("pre", type(o).__name__, args[0] is o, args[1:], dict(kwargs)))

    def post(o: Any, args: Any, kwargs: Any) -> None:
        log.append(("post", type(o).__name__, args[0] is o, args[1:], dict(kwargs)))

    if register == "instance":
        handles = [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
    else:
        handles = [register_optimizer_step_pre_hook(pre),
                   register_optimizer_step_post_hook(post)]
    try:
        opt.step(None)
    finally:
        for h in handles:
            h.remove()
    opt.step()  # hooks removed: not called
    return log


@pytest.mark.parametrize("register", ["instance", "global"])
def test_step_hooks_called_as_torch_calls_them(register: str) -> None:
    ours = _hook_log(mixprec.optim.SGD, register)
    ref = _hook_log(torch.optim.SGD, register)
    assert [(w, s, a, k) for w, _, s, a, k in ours] == [(w, s, a, k) for w, _, s, a, k in ref]
    assert [(w, s, a) for w, _, s, a, _ in ours] == [("pre", True, (None,)),
                                                     ("post", True, (None,))]
    assert {c for _, c, *_ in ours} == {"SGD"}


def test_step_pre_hook_replaces_arguments() -> None:
    """A pre hook may return new (args, kwargs): here it skips the step via found_inf."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.25])
    opt = mixprec.optim.AdamW([p], lr=0.1)
    skip = torch.ones((), dtype=torch.float32)
    handle = opt.register_step_pre_hook(lambda o, a, k: (a, {**k, "found_inf": skip}))
    opt.step()
    assert torch.equal(p.detach(), torch.tensor([1.0, -2.0]))
    handle.remove()
    opt.step()
    assert not torch.equal(p.detach(), torch.tensor([1.0, -2.0]))


def test_step_record_function_as_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step runs in one record_function block labelled as torch labels its own
    optimizers' steps, with or without a hook, and torch wraps the class once."""
    names: List[str] = []
    real = torch.autograd.profiler.record_function

    def counting(name: str, *args: Any) -> Any:
        names.append(name)
        return real(name, *args)

    monkeypatch.setattr(torch.autograd.profiler, "record_function", counting)
    for cls in (mixprec.optim.AdamW, torch.optim.AdamW):
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        p.grad = torch.tensor([0.5, 0.25])
        opt = cls([p], lr=0.1)
        opt.step()
        handle = opt.register_step_post_hook(lambda *a: None)
        opt.step()
        handle.remove()
        assert type(opt).step.hooked  # type: ignore[attr-defined]
    assert names == ["Optimizer.step#AdamW.step"] * 4


def test_step_seen_by_the_profiler() -> None:
    ps = [torch.nn.Parameter(torch.tensor([1.0, -2.0])) for _ in range(2)]
    for p in ps:
        p.grad = torch.tensor([0.5, 0.25])
    opt, ref = mixprec.optim.Adam([ps[0]], lr=0.1), mixprec.optim.Adam([ps[1]], lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    ref.step()
    assert "Optimizer.step#Adam.step" in {e.name for e in prof.events()}
    assert torch.equal(ps[0], ps[1]) and not torch.equal(ps[0], torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize("grad_enabled", [True, False])
def test_step_grad_mode_restored(grad_enabled: bool) -> None:
    """The step runs without grad (its op writes params that require grad), the closure
    with grad, and the caller's mode comes back, also when the step raises."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = mixprec.optim.AdamW([p], lr=0.1)
    seen: List[bool] = []

    def closure() -> torch.Tensor:
        seen.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    with torch.set_grad_enabled(grad_enabled):
        opt.step(closure)
        assert torch.is_grad_enabled() is grad_enabled
        with pytest.raises(RuntimeError, match="grad_scale"):
            opt.step(grad_scale=torch.ones(2))
        assert torch.is_grad_enabled() is grad_enabled
    assert seen == [True]
    assert p.grad is not None and not torch.equal(p.detach(), torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize("base", [mixprec.optim.SGD, torch.optim.SGD])
def test_subclass_overriding_step_gets_torchs_wrapper(base: Any) -> None:
    """A user subclass's own step is wrapped by torch as usual, and its hooks run as they
    do for the same subclass of torch's SGD: once around the subclass's step, and once
    more around the base class's (torch wraps that too, once an instance of the base
    class exists)."""
    base([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # (the base class's step wrapped)

    class Counting(base):  # type: ignore[misc, valid-type]
        calls = 0

        def step(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            type(self).calls += 1
            return super().step(*args, **kwargs)

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.25])
    opt = Counting([p], lr=0.1)
    log: List[str] = []
    opt.register_step_pre_hook(lambda *a: log.append("pre"))
    opt.step()
    assert Counting.calls == 1 and log == ["pre", "pre"]
    torch.testing.assert_close(p.detach(), torch.tensor([0.95, -2.025]))


@cuda_only
def test_cuda_matches_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        params, opt = _train("AdamW", device, torch.bfloat16, 5, 3,
                             {"master_weights": False, "stochastic_rounding": True})
        results.append([p.detach().cpu() for p in params])
    # same element math and SR numbering; pow() may differ in the last bit
    for a, b in zip(*results):
        assert_within_one_ulp(a.contiguous(), b.contiguous())


@cuda_only
def test_cuda_graph_capture_no_sync() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(1000, device="cuda").half()) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    lr = torch.tensor(1e-3, device="cuda")
    opt = mixprec.optim.AdamW(params, lr=lr, capturable=True)
    found = torch.zeros(1, device="cuda")
    scale = torch.full((1,), 4.0, device="cuda")
    opt.step(grad_scale=scale, found_inf=found)  # warm-up: state creation
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            opt.step(grad_scale=scale, found_inf=found)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    step_before = float(opt.state[params[0]]["step"])
    graph.replay()
    assert float(opt.state[params[0]]["step"]) == step_before + 1
    found.fill_(1.0)
    snap = snapshot_optimizer(opt)
    graph.replay()
    assert all_bitwise_equal(snap, snapshot_optimizer(opt))


def test_adamw_matches_torch_multi_chunk(device: str) -> None:
    # tensors spanning several CPU work items / CUDA blocks, and odd tails
    gen = torch.Generator().manual_seed(77)
    ours_p = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device))
              for s in [(70_001,), (300, 257)]]
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.AdamW(ours_p, lr=1e-3, amsgrad=True)
    ref = torch.optim.AdamW(torch_p, lr=1e-3, amsgrad=True, foreach=False)
    _step_both(ours, ref, ours_p, torch_p, gen, 10)
    _assert_matches(ours_p, torch_p)


def test_mixprec_grad_scaler_fp16_grads(device: str) -> None:
    # fp16 params + masters under mixprec.GradScaler: the fp16 grads are
    # accepted (master_weights), unscaled in the kernel, and an overflow skips
    # the step on the device. A power-of-two scale makes the scaled run equal
    # bit for bit to an unscaled one.
    gen = torch.Generator().manual_seed(12)
    a = optim_params(device, torch.float16, gen, transposed=False)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a, opt_b = mixprec.optim.AdamW(a, lr=1e-2), mixprec.optim.AdamW(b, lr=1e-2)
    scaler = mixprec.GradScaler(device, init_scale=256.0, growth_interval=1000)
    scaler.scale(torch.ones((), device=device))
    for it in range(4):
        # fp16 values, so that scaling by a power of two is exact
        grads = [(torch.randn(p.shape, generator=gen) * 1e-2).half().float().to(device)
                 for p in a]
        for p, g in zip(a, grads):
            p.grad = (g * 256.0 if it < 2 else g * scaler.get_scale()).half()
        if it == 2:
            a[3].grad[0] = float("inf")
        for p, g in zip(b, grads):
            p.grad = g.half()
        scaler.step(opt_a)
        scaler.update()
        if it != 2:
            opt_b.step()
    assert scaler.get_scale() == 128.0
    assert all_bitwise_equal([p.detach() for p in a], [p.detach() for p in b])
    assert all_bitwise_equal(opt_a.master_params(), opt_b.master_params())
