"""Tests of mixprec.optim (AdamW, Adam, SGD) and the fused_adam_/fused_sgd_ ops.

CPU always; the same tests on CUDA when a GPU is present (skipped otherwise).
References: torch.optim (foreach=False) for float32 params, a float64
implementation of the same algorithm for float16/bfloat16 params, and
mixprec.ops._reference (the pure-PyTorch op) for the kernels.
"""

from __future__ import annotations

import copy
import io
import itertools
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

import mixprec
import mixprec.optim
from mixprec import ops
from mixprec.ops import _reference

CUDA = torch.cuda.is_available() and mixprec.has_cuda_kernels()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a GPU"))]
LOW = (torch.float16, torch.bfloat16)

# Edge sizes: empty, scalar, below/above one vector, a chunk boundary, 2-D,
# and a non-contiguous (transposed) param.
SHAPES = [(0,), (), (1,), (7,), (33,), (300,), (17, 31)]


def _params(device: str, dtype: torch.dtype, gen: torch.Generator,
            transposed: bool = True) -> List[torch.nn.Parameter]:
    ps = [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in SHAPES]
    if transposed:
        ps.append(torch.randn(9, 13, generator=gen).to(device=device, dtype=dtype).t())
    return [torch.nn.Parameter(p) for p in ps]


def _set_grads(params: List[torch.Tensor], gen: torch.Generator,
               dtype: Optional[torch.dtype] = None, scale: float = 1.0) -> None:
    for p in params:
        g = torch.randn(p.shape, generator=gen) * scale
        _assign_grad(p, g.to(device=p.device, dtype=dtype or p.dtype))


def _assign_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    if g.dtype != p.dtype and hasattr(p, "grad_dtype"):
        p.grad_dtype = None  # newer torch checks grad dtypes; allow any
    p.grad = g


def _rel_err(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> float:
    """max |a - b| relative to the tensor's magnitude: max(|b|), and at least
    `scale` (the magnitude the params started at: after many steps a value
    that drifted towards 0 carries the absolute rounding error of the larger
    values it was computed from)."""
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    if a64.numel() == 0:
        return 0.0
    return float((a64 - b64).abs().max() / max(float(b64.abs().max()), scale))


def _snapshot(opt: torch.optim.Optimizer) -> List[torch.Tensor]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            out.append(p.detach().clone())
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    out.append(v.detach().clone())
    return out


def _bitwise_equal(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        xb = x.reshape(-1).view(torch.uint8) if x.numel() else x
        yb = y.reshape(-1).view(torch.uint8) if y.numel() else y
        if not torch.equal(xb.cpu(), yb.cpu()):
            return False
    return True


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
    ours_p = _params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours, ref = make_ours(ours_p), make_torch(torch_p)
    for _ in range(steps):
        _set_grads(ours_p, gen, grad_dtype)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad.float().clone()
        ours.step()
        ref.step()
    return ours_p, torch_p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,amsgrad,maximize,wd", ADAM_CASES)
def test_adam_matches_torch_fp32(device: str, name: str, amsgrad: bool, maximize: bool,
                                 wd: float) -> None:
    kw: Dict[str, Any] = dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd,
                              amsgrad=amsgrad, maximize=maximize)
    ours_cls, torch_cls = getattr(mixprec.optim, name), getattr(torch.optim, name)
    ours_p, torch_p = _run_pair(lambda ps: ours_cls(ps, **kw),
                                lambda ps: torch_cls(ps, foreach=False, **kw), device)
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_adam_default_betas_large_weight_lerp(device: str) -> None:
    # beta1 < 0.5 takes torch's other lerp branch.
    kw: Dict[str, Any] = dict(lr=1e-2, betas=(0.3, 0.9), weight_decay=0.02)
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.AdamW(ps, **kw),
                                lambda ps: torch.optim.AdamW(ps, foreach=False, **kw),
                                device)
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum,dampening,nesterov,wd,maximize", SGD_CASES)
def test_sgd_matches_torch_fp32(device: str, momentum: float, dampening: float,
                                nesterov: bool, wd: float, maximize: bool) -> None:
    kw: Dict[str, Any] = dict(lr=1e-2, momentum=momentum, dampening=dampening,
                              nesterov=nesterov, weight_decay=wd, maximize=maximize)
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.SGD(ps, **kw),
                                lambda ps: torch.optim.SGD(ps, foreach=False, **kw), device)
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_dtype", LOW)
def test_fp32_params_low_precision_grads(device: str, grad_dtype: torch.dtype) -> None:
    # fp16/bf16 grads of fp32 params are read as they are (converted in-kernel).
    ours_p, torch_p = _run_pair(lambda ps: mixprec.optim.AdamW(ps, lr=1e-3),
                                lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
                                device, steps=20, grad_dtype=grad_dtype)
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("grad_kind", ["same", "float32"])
@pytest.mark.parametrize("kind", ["AdamW", "Adam-amsgrad", "SGD-nesterov"])
def test_low_precision_masters_vs_float64(device: str, dtype: torch.dtype, grad_kind: str,
                                          kind: str) -> None:
    gen = torch.Generator().manual_seed(7)
    params = _params(device, dtype, gen)
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
        _set_grads(params, gen, dtype if grad_kind == "same" else torch.float32, scale)
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
        assert _rel_err(m, ref) <= 2e-5
        # the param is the master rounded to nearest
        assert torch.equal(p.detach(), m.to(dtype))


# ---------------------------------------------------------------------------
# found_inf: a skipped step changes nothing, bitwise.


def _make(kind: str, params: List[torch.Tensor], **kw: Any) -> torch.optim.Optimizer:
    if kind == "AdamW":
        return mixprec.optim.AdamW(params, lr=1e-2, amsgrad=True, **kw)
    if kind == "Adam":
        return mixprec.optim.Adam(params, lr=1e-2, weight_decay=0.1, **kw)
    return mixprec.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.1, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("how", ["kwarg", "attribute"])
def test_found_inf_skips_bitwise(device: str, kind: str, dtype: torch.dtype, how: str) -> None:
    gen = torch.Generator().manual_seed(3)
    params = _params(device, dtype, gen)
    opt = _make(kind, params)
    for skip_first in (True, False):
        # also before any step (SGD's buffer must stay uninitialised)
        if not skip_first:
            for _ in range(3):
                _set_grads(params, gen)
                opt.step()
        _set_grads(params, gen)
        before = _snapshot(opt)
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
            assert _bitwise_equal(params_before, [p.detach().clone() for p in params])
            for p in params:
                assert float(opt.state[p]["step"]) == 0.0
        else:
            assert _bitwise_equal(before, _snapshot(opt))
    # a clean step does change the params
    before = _snapshot(opt)
    opt.step(found_inf=torch.zeros(1, device=device))
    assert not _bitwise_equal(before, _snapshot(opt))


@pytest.mark.parametrize("device", DEVICES)
def test_skipped_first_sgd_step_then_real_step_matches_torch(device: str) -> None:
    gen = torch.Generator().manual_seed(11)
    ours_p = _params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.SGD(ours_p, lr=0.1, momentum=0.9, dampening=0.2)
    ref = torch.optim.SGD(torch_p, lr=0.1, momentum=0.9, dampening=0.2, foreach=False)
    _set_grads(ours_p, gen)
    ours.step(found_inf=torch.ones(1, device=device))  # skipped: buffer stays "first"
    for _ in range(3):
        _set_grads(ours_p, gen)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad.clone()
        ours.step(found_inf=torch.zeros(1, device=device))
        ref.step()
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


# ---------------------------------------------------------------------------
# Under torch.amp.GradScaler (the _step_supports_amp_scaling contract).


@pytest.mark.parametrize("device", DEVICES)
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
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert _rel_err(a, b) <= 1e-6
    assert not hasattr(opt_a, "found_inf")


@pytest.mark.parametrize("device", DEVICES)
def test_clip_coef_folded(device: str) -> None:
    gen = torch.Generator().manual_seed(5)
    ours_p = _params(device, torch.float32, gen)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.AdamW(ours_p, lr=1e-2)
    ref = torch.optim.AdamW(torch_p, lr=1e-2, foreach=False)
    for _ in range(5):
        _set_grads(ours_p, gen, scale=64.0)
        coef = torch.rand((), generator=gen).to(device)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad * (1.0 / torch.tensor(64.0, dtype=torch.float64)).float() * coef
        ours.step(grad_scale=torch.full((1,), 64.0, device=device), clip_coef=coef.reshape(1))
        ref.step()
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


# ---------------------------------------------------------------------------
# State: save -> load -> continue is bitwise an uninterrupted run.


def _train(kind: str, device: str, dtype: torch.dtype, steps: int, seed: int,
           opt_kw: Dict[str, Any], params: Optional[List[torch.Tensor]] = None,
           opt: Optional[torch.optim.Optimizer] = None) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    if params is None:
        params = _params(device, dtype, torch.Generator().manual_seed(99))
        opt = _make(kind, params, **opt_kw)
    assert opt is not None
    for _ in range(steps):
        _set_grads(params, gen)
        opt.step()
    return params, opt


@pytest.mark.parametrize("device", DEVICES)
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
    assert _bitwise_equal(_snapshot(full_opt), _snapshot(new_opt))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD"])
def test_load_torch_state_dict(device: str, name: str) -> None:
    kw: Dict[str, Any] = {"lr": 1e-2}
    if name == "SGD":
        kw["momentum"] = 0.9
    gen = torch.Generator().manual_seed(21)
    torch_p = _params(device, torch.float32, gen)
    ref = getattr(torch.optim, name)(torch_p, foreach=False, **kw)
    for _ in range(4):
        _set_grads(torch_p, gen)
        ref.step()
    ours_p = [torch.nn.Parameter(p.detach().clone()) for p in torch_p]
    ours = getattr(mixprec.optim, name)(ours_p, **kw)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    for _ in range(4):
        _set_grads(torch_p, gen)
        for a, b in zip(ours_p, torch_p):
            a.grad = b.grad.clone()
        ref.step()
        ours.step()
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_load_torch_state_dict_builds_masters(device: str) -> None:
    gen = torch.Generator().manual_seed(4)
    torch_p = _params(device, torch.float32, gen, transposed=False)
    ref = torch.optim.AdamW(torch_p, lr=1e-3, foreach=False)
    _set_grads(torch_p, gen)
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


@pytest.mark.parametrize("device", DEVICES)
def test_stochastic_rounding_unbiased(device: str) -> None:
    n = 200_000
    frac = 0.3
    ulp = 2.0 ** -7  # bfloat16 spacing in [1, 2)
    p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16, device=device))
    opt = mixprec.optim.SGD([p], lr=1.0, master_weights=False, stochastic_rounding=True, seed=3)
    _assign_grad(p, torch.full((n,), -frac * ulp, dtype=torch.float32, device=device))
    opt.step()
    vals = p.detach().double().cpu()
    assert set(vals.unique().tolist()) == {1.0, 1.0 + ulp}
    exact = 1.0 + frac * ulp
    sigma = ulp * (frac * (1 - frac) / n) ** 0.5
    assert abs(float(vals.mean()) - exact) < 5 * sigma
    # round-to-nearest would be biased: every element stays at 1.0
    q = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16, device=device))
    _assign_grad(q, p.grad.clone())
    mixprec.optim.SGD([q], lr=1.0, master_weights=False).step()
    assert float(q.detach().double().mean()) == 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_stochastic_rounding_unbiased_over_steps(device: str) -> None:
    # one element drawn at 4000 steps: each step's draw is independent
    p = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16, device=device))
    opt = mixprec.optim.SGD([p], lr=1.0, master_weights=False, stochastic_rounding=True)
    ups = 0
    steps = 4000
    for _ in range(steps):
        p.data.fill_(1.0)
        _assign_grad(p, torch.full((1,), -0.25 * 2.0 ** -7, device=device))
        opt.step()
        ups += int(p.detach().item() != 1.0)
    assert abs(ups / steps - 0.25) < 5 * (0.25 * 0.75 / steps) ** 0.5


@pytest.mark.parametrize("device", DEVICES)
def test_stochastic_rounding_reproducible(device: str) -> None:
    def run(seed: int) -> List[torch.Tensor]:
        params, _ = _train("AdamW", device, torch.bfloat16, 5, 8,
                           {"master_weights": False, "stochastic_rounding": True, "seed": seed})
        return [p.detach().clone() for p in params]

    a, b, c = run(1), run(1), run(2)
    assert _bitwise_equal(a, b)
    assert not _bitwise_equal(a, c)


def test_stochastic_rounding_kernel_equals_reference() -> None:
    # Values exactly representable in float32, so the float result is exact and
    # only the SR bits decide: kernel and reference must agree bit for bit.
    gen = torch.Generator().manual_seed(2)
    shapes = [(70000,), (5,), (3, 33)]
    base = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
    grads = [(torch.randint(-64, 64, s, generator=gen).float() * 2.0 ** -12) for s in shapes]
    outs = []
    for impl in (torch.ops.mixprec.fused_sgd_, _reference.fused_sgd_):
        ps = [b.clone() for b in base]
        steps = [torch.full((), 3.0) for _ in ps]
        impl(ps, grads, [], [], steps, torch.tensor(1.0, dtype=torch.float64), 0.0, 0.0, 0.0,
             False, False, None, None, None, True, 12345)
        outs.append(ps)
    assert _bitwise_equal(outs[0], outs[1])
    assert not _bitwise_equal(outs[0], [(b.float() - g).to(torch.bfloat16)
                                        for b, g in zip(base, grads)])


# ---------------------------------------------------------------------------
# Kernels vs the pure-PyTorch reference, all dtype combinations.


def _op_inputs(device: str, pdt: torch.dtype, gdt: torch.dtype, masters: bool,
               amsgrad: bool, gen: torch.Generator) -> Dict[str, Any]:
    shapes = [(0,), (1,), (15,), (40, 3), (65536 + 9,)]
    params = [torch.randn(s, generator=gen).to(device=device, dtype=pdt) for s in shapes]
    return {
        "params": params,
        "grads": [torch.randn(s, generator=gen).to(device=device, dtype=gdt) for s in shapes],
        "exp_avgs": [torch.randn(s, generator=gen).to(device) * 0.1 for s in shapes],
        "exp_avg_sqs": [torch.rand(s, generator=gen).to(device) for s in shapes],
        "max_exp_avg_sqs": [torch.rand(s, generator=gen).to(device) for s in shapes]
        if amsgrad else [],
        "master_params": [p.float() + 1e-3 for p in params] if masters else [],
        "state_steps": [torch.full((), float(i), device=device) for i in range(len(shapes))],
    }


def _clone_inputs(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: [t.clone() for t in v] for k, v in d.items()}


# Error bound of one fused Adam step, from the arithmetic.
#
# The step is computed in float32; the same step in float64 from the same
# inputs and the hyper-parameters as given is exact for this purpose (its own
# rounding, ~2^-53 relative, is far below the float32 bound). Every float32
# operation rounds once, fl(a op b) = (a op b)(1 + d) with |d| <= u = 2^-24,
# and every hyper-parameter reaches the kernel rounded to float32 once (one
# more (1 + d)). Carrying first-order bounds E_x on |computed x - exact x|
# through the update, elementwise (x' = new value, w = 1 - beta1):
#   g  = grad * (1/scale) * clip [* -1]   1/scale rounded, 2 products: E_g = 3u|g|
#   Adam:  g = g + wd*p                   wd, product, sum:   E_g += 2u|wd p| + u|g|
#   AdamW: p0 = p * (1 - lr*wd)           constant, product:  E_p0 = 2u|p0|
#   m' = m + w*(g - m)  (w < 0.5)         difference, w, product, sum:
#                                         E_m = w (E_g + 3u|g - m|) + u|m'|
#   m' = g - (g - m)*(1 - w)  (w >= 0.5, torch's lerp; 1 - w is off by <= u):
#                                         E_m = (2 - w) E_g + (3 - 2w) u|g - m| + u|m'|
#   v' = v*beta2 + ((1 - beta2)*g)*g      2 constants, 3 products, sum:
#                                         E_v = 2u beta2 v + (1 - beta2)(3u g^2 + 2|g| E_g) + u v'
#   vh = max(vmax, v') (amsgrad) or v'    max is exact and 1-Lipschitz: E_vh = E_v
#   s  = sqrt(vh)                         |sqrt(a) - sqrt(b)| = |a - b| / (sqrt(a) + sqrt(b)),
#                                         plus the sqrt's own rounding, allowed one ulp (2u,
#                                         a faithful sqrt, as torch's own CPU sqrt is on some
#                                         CPUs): E_s = E_vh / (s + sqrt(max(vh - E_vh, 0))) + 2u s
#   q  = s / sqrt(1 - beta2^t)            constant, quotient: E_q = E_s / b + 2u q
#   den = q + eps                         constant, sum:      E_den = E_q + u eps + u den
#   n  = (-lr / (1 - beta1^t)) * m'       constant, product:  E_n = |step| E_m + 2u|n|
#   U  = n / den                          E_U = (E_n + |U| E_den) / (den - E_den) + u|U|
#   p' = p0 + U                           E_p = E_p0 + E_U + u|p'|
#   a 16-bit param is p' rounded to nearest: + half an ulp of its dtype at |p'| + E_p.
# The bound is on |p'| + |U| + ... (the operands), not on |p'|: where p0 and U
# nearly cancel, one rounding of U is many ulps of p' (e.g. -7.4e-5 + 7.1e-5:
# one ulp of U is 32 ulps of the result). Dropped O(u^2) terms are covered by a
# factor 1 + 2^-10. Assumes no underflow (every intermediate here is normal).
_U32 = 2.0 ** -24
_SLACK = 1.0 + 2.0 ** -10


def _half_ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of `dtype` at the magnitudes x (float64)."""
    fi = torch.finfo(dtype)
    return 0.5 * fi.eps * torch.exp2(torch.floor(torch.log2(x.clamp_min(fi.tiny))))


def _adam_exact_and_bound(x: Dict[str, List[torch.Tensor]], i: int, hp: Dict[str, Any],
                          pdt: torch.dtype) -> Dict[str, Any]:
    """Exact (float64) outputs of one Adam step on tensor i of the op inputs x, each
    with the bound on a float32 kernel's error derived above: {name: (exact, bound)}."""
    u = _U32
    lr, b1, b2, wd, eps = (float(hp["lr"]), hp["beta1"], hp["beta2"], hp["weight_decay"],
                           hp["eps"])
    t = float(x["state_steps"][i]) + 1.0
    p = (x["master_params"][i] if x["master_params"] else x["params"][i]).double()
    g = x["grads"][i].double() * (1.0 / float(hp["grad_scale"])) * float(hp["clip_coef"])
    g = -g if hp["maximize"] else g
    e_g = 3 * u * g.abs()
    e_p0 = torch.zeros_like(p)
    if wd != 0 and hp["decoupled"]:
        p = p * (1.0 - lr * wd)
        e_p0 = 2 * u * p.abs()
    elif wd != 0:
        g = g + wd * p
        e_g = e_g + 2 * u * (wd * p).abs() + u * g.abs()
    m, v = x["exp_avgs"][i].double(), x["exp_avg_sqs"][i].double()
    w = 1.0 - b1
    m_new = b1 * m + w * g
    d = (g - m).abs()
    if w < 0.5:
        e_m = w * (e_g + 3 * u * d) + u * m_new.abs()
    else:
        e_m = (2 - w) * e_g + (3 - 2 * w) * u * d + u * m_new.abs()
    v_new = b2 * v + (1.0 - b2) * g * g
    e_v = 2 * u * b2 * v + (1.0 - b2) * (3 * u * g * g + 2 * g.abs() * e_g) + u * v_new
    vh = torch.maximum(x["max_exp_avg_sqs"][i].double(), v_new) if hp["amsgrad"] else v_new
    s = vh.sqrt()
    e_s = e_v / (s + (vh - e_v).clamp_min(0).sqrt()) + 2 * u * s
    b = (1.0 - b2 ** t) ** 0.5
    q = s / b
    e_q = e_s / b + 2 * u * q
    den = q + eps
    e_den = e_q + u * eps + u * den
    step = -lr / (1.0 - b1 ** t)
    n = step * m_new
    e_n = abs(step) * e_m + 2 * u * n.abs()
    upd = n / den
    e_upd = (e_n + upd.abs() * e_den) / (den - e_den) + u * upd.abs()
    p_new = p + upd
    e_p = e_p0 + e_upd + u * p_new.abs()
    e_param = e_p if pdt == torch.float32 else e_p + _half_ulp(p_new.abs() + e_p, pdt)
    out = {"params": (p_new, e_param), "master_params": (p_new, e_p),
           "exp_avgs": (m_new, e_m), "exp_avg_sqs": (v_new, e_v),
           "max_exp_avg_sqs": (vh, e_v)}
    return {k: out[k] for k in out if x[k]}


def _adam_error_ratio(out: Dict[str, List[torch.Tensor]], x: Dict[str, List[torch.Tensor]],
                      hp: Dict[str, Any], pdt: torch.dtype) -> float:
    """max over every output element of |out - exact| / bound (<= 1: within rounding)."""
    worst = 0.0
    for i in range(len(x["params"])):
        assert torch.equal(out["state_steps"][i], x["state_steps"][i] + 1)
        assert torch.equal(out["grads"][i], x["grads"][i])
        if x["params"][i].numel() == 0:
            continue
        for k, (exact, bound) in _adam_exact_and_bound(x, i, hp, pdt).items():
            err = (out[k][i].double() - exact).abs()
            worst = max(worst, float((err / (bound * _SLACK)).max()))
    return worst


_ADAM_HP: Dict[str, Any] = dict(beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8,
                                maximize=True, grad_scale=128.0, clip_coef=0.5)


def _adam_call(f: Callable[..., None], x: Dict[str, List[torch.Tensor]],
               hp: Dict[str, Any], device: str) -> Dict[str, List[torch.Tensor]]:
    """Runs the op (kernel or reference) f on a copy of the inputs x with the
    hyper-parameters hp; returns the copy."""
    y = _clone_inputs(x)
    f(*y.values(), torch.tensor(hp["lr"], device=device), hp["beta1"], hp["beta2"],
      hp["weight_decay"], hp["eps"], hp["amsgrad"], hp["maximize"], hp["decoupled"],
      torch.full((1,), hp["grad_scale"], device=device), torch.zeros(1, device=device),
      torch.full((1,), hp["clip_coef"], device=device))
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pdt,gdt,masters", [
    (p, g, m) for p in (torch.float32, torch.float16, torch.bfloat16)
    for g in (torch.float32, torch.float16, torch.bfloat16)
    for m in (False, True) if not (m and p == torch.float32)
])
@pytest.mark.parametrize("amsgrad,decoupled", [(False, True), (True, False)])
def test_fused_adam_kernel_vs_reference(device: str, pdt: torch.dtype, gdt: torch.dtype,
                                        masters: bool, amsgrad: bool, decoupled: bool) -> None:
    """The kernel and the pure-PyTorch reference both stay within the derived
    float32 rounding bound of the exact (float64) step, on every ISA."""
    gen = torch.Generator().manual_seed(17)
    inputs = _op_inputs(device, pdt, gdt, masters, amsgrad, gen)
    hp = dict(_ADAM_HP, lr=torch.tensor(3e-3).item(), amsgrad=amsgrad, decoupled=decoupled)
    for f in (torch.ops.mixprec.fused_adam_, _reference.fused_adam_):
        assert _adam_error_ratio(_adam_call(f, inputs, hp, device), inputs, hp, pdt) <= 1.0


@pytest.mark.parametrize("bug", ["beta1", "beta2", "bias_correction_step", "no_bias_correction",
                                 "no_weight_decay", "no_grad_scale"])
def test_fused_adam_bound_catches_wrong_math(bug: str) -> None:
    """Negative controls: the bound of test_fused_adam_kernel_vs_reference is
    tight enough to reject a step with wrong math (here the kernel run with a
    wrong hyper-parameter or step count stands in for a kernel bug), down to a
    weight decay of lr*wd = 3e-5 relative."""
    gen = torch.Generator().manual_seed(17)
    inputs = _op_inputs("cpu", torch.float32, torch.float32, False, False, gen)
    hp = dict(_ADAM_HP, lr=torch.tensor(3e-3).item(), amsgrad=False, decoupled=True)
    wrong, x = dict(hp), _clone_inputs(inputs)
    if bug == "beta1":
        wrong["beta1"] = 0.8
    elif bug == "beta2":
        wrong["beta2"] = 0.99
    elif bug == "bias_correction_step":  # corrections of step t + 1
        x["state_steps"] = [s + 1 for s in x["state_steps"]]
    elif bug == "no_bias_correction":  # beta^t == 0 in float64: corrections of 1
        x["state_steps"] = [s + 1e6 for s in x["state_steps"]]
    elif bug == "no_weight_decay":
        wrong["weight_decay"] = 0.0
    else:
        wrong["grad_scale"] = 1.0
    out = _adam_call(torch.ops.mixprec.fused_adam_, x, wrong, "cpu")
    out["state_steps"] = [s + 1 for s in inputs["state_steps"]]  # judge the values only
    assert _adam_error_ratio(out, inputs, hp, torch.float32) > 1.0
    # and the same call with the right arguments passes
    good = _adam_call(torch.ops.mixprec.fused_adam_, inputs, hp, "cpu")
    assert _adam_error_ratio(good, inputs, hp, torch.float32) <= 1.0


def _assert_within_one_ulp(x: torch.Tensor, y: torch.Tensor) -> None:
    assert x.dtype == y.dtype and x.shape == y.shape
    if x.numel() == 0 or torch.equal(x, y):
        return
    ints = {4: torch.int32, 2: torch.int16}[x.element_size()]
    bits_x = x.contiguous().view(ints).long()
    bits_y = y.contiguous().view(ints).long()
    assert int((bits_x - bits_y).abs().max()) <= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pdt,gdt,masters", [
    (torch.float32, torch.float32, False), (torch.float16, torch.bfloat16, True),
    (torch.bfloat16, torch.float16, False), (torch.bfloat16, torch.float32, True),
])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_fused_sgd_kernel_vs_reference(device: str, pdt: torch.dtype, gdt: torch.dtype,
                                       masters: bool, momentum: float, nesterov: bool) -> None:
    gen = torch.Generator().manual_seed(23)
    inputs = _op_inputs(device, pdt, gdt, masters, False, gen)
    del inputs["exp_avg_sqs"], inputs["max_exp_avg_sqs"]
    if momentum == 0.0:
        inputs["exp_avgs"] = []
    order = ["params", "grads", "exp_avgs", "master_params", "state_steps"]
    a, b = _clone_inputs(inputs), _clone_inputs(inputs)
    scalars = (torch.tensor(0.05, dtype=torch.float64, device=device), 1e-2, momentum, 0.0,
               nesterov, False, torch.full((1,), 4.0, device=device), None, None)
    torch.ops.mixprec.fused_sgd_(*[a[k] for k in order], *scalars)
    _reference.fused_sgd_(*[b[k] for k in order], *scalars)
    for k in order:
        for x, y in zip(a[k], b[k]):
            assert torch.equal(x, y), k


# ---------------------------------------------------------------------------
# Bad inputs: clear errors naming the argument, nothing modified.


def _adam_args(device: str = "cpu") -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    d = _op_inputs(device, torch.float16, torch.float16, True, False, gen)
    d.update(lr=torch.tensor(1e-3, device=device), beta1=0.9, beta2=0.999, weight_decay=0.0,
             eps=1e-8, amsgrad=False, maximize=False, decoupled_weight_decay=True,
             grad_scale=None, found_inf=None, clip_coef=None, stochastic_rounding=False, seed=0)
    return d


def _sparse_grad(d: Dict[str, Any]) -> None:
    d["grads"][2] = d["grads"][2].to_sparse()


def _shape_mismatch(d: Dict[str, Any]) -> None:
    d["grads"][3] = d["grads"][3].reshape(-1)


def _wrong_grad_scale_dtype(d: Dict[str, Any]) -> None:
    d["grad_scale"] = torch.ones(1, dtype=torch.float64)


def _bad_beta1(d: Dict[str, Any]) -> None:
    d["beta1"] = 1.0


def _bad_beta2(d: Dict[str, Any]) -> None:
    d["beta2"] = -0.1


def _list_length(d: Dict[str, Any]) -> None:
    d["exp_avgs"] = d["exp_avgs"][:-1]


def _moment_dtype(d: Dict[str, Any]) -> None:
    d["exp_avg_sqs"][4] = d["exp_avg_sqs"][4].half()


def _master_dtype(d: Dict[str, Any]) -> None:
    d["master_params"][1] = d["master_params"][1].double()


def _sr_with_masters(d: Dict[str, Any]) -> None:
    d["stochastic_rounding"] = True


def _step_dtype(d: Dict[str, Any]) -> None:
    d["state_steps"][0] = d["state_steps"][0].long()


def _lr_shape(d: Dict[str, Any]) -> None:
    d["lr"] = torch.ones(2)


def _found_inf_shape(d: Dict[str, Any]) -> None:
    d["found_inf"] = torch.zeros(3)


def _param_dtype(d: Dict[str, Any]) -> None:
    d["params"][0] = d["params"][0].double()


BAD = [
    (_sparse_grad, r"(grads\[2\].*(dense|sparse))|SparseCPU"),
    (_shape_mismatch, r"grads\[3\] has shape"),
    (_wrong_grad_scale_dtype, r"grad_scale must be a float32"),
    (_bad_beta1, r"beta1 must be in \[0, 1\)"),
    (_bad_beta2, r"beta2 must be in \[0, 1\)"),
    (_list_length, r"exp_avgs must have"),
    (_moment_dtype, r"exp_avg_sqs\[4\] must be float32"),
    (_master_dtype, r"master_params\[1\] must be float32"),
    (_sr_with_masters, r"stochastic_rounding"),
    (_step_dtype, r"state_steps\[0\]"),
    (_lr_shape, r"lr must be a one-element"),
    (_found_inf_shape, r"found_inf must be a one-element"),
    (_param_dtype, r"params\[0\] must be float32, float16 or bfloat16"),
]


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("mutate,pattern", BAD, ids=[f.__name__ for f, _ in BAD])
def test_bad_inputs_raise_and_modify_nothing(impl: str, mutate: Callable, pattern: str) -> None:
    d = _adam_args()
    mutate(d)
    tensors = [t for v in d.values() if isinstance(v, list) for t in v]
    before = [t.clone() if t.layout == torch.strided else t.to_dense().clone() for t in tensors]
    fn = torch.ops.mixprec.fused_adam_ if impl == "kernel" else _reference.fused_adam_
    with pytest.raises(RuntimeError, match=pattern):
        fn(*d.values())
    after = [t if t.layout == torch.strided else t.to_dense() for t in tensors]
    assert _bitwise_equal(before, after)


def test_bad_sgd_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    p = [torch.randn(4, generator=gen)]
    g = [torch.randn(4, generator=gen)]
    st = [torch.zeros(())]
    lr = torch.tensor(0.1)
    with pytest.raises(RuntimeError, match="nesterov requires momentum"):
        torch.ops.mixprec.fused_sgd_(p, g, [], [], st, lr, 0.0, 0.0, 0.0, True, False)
    with pytest.raises(RuntimeError, match="momentum_buffers must have 1"):
        torch.ops.mixprec.fused_sgd_(p, g, [], [], st, lr, 0.0, 0.9, 0.0, False, False)
    with pytest.raises(RuntimeError, match=r"params\[0\] is float32 and needs no master"):
        torch.ops.mixprec.fused_sgd_(p, g, [], [torch.zeros(4)], st, lr, 0.0, 0.0, 0.0, False,
                                     False)
    with pytest.raises(RuntimeError, match="weight_decay must be"):
        torch.ops.mixprec.fused_sgd_(p, g, [], [], st, lr, -1.0, 0.0, 0.0, False, False)
    assert float(st[0]) == 0.0


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_device_mismatch_raises() -> None:
    d = _adam_args("cuda")
    d["grads"][1] = d["grads"][1].cpu()
    with pytest.raises(RuntimeError, match=r"grads\[1\] is on cpu"):
        torch.ops.mixprec.fused_adam_(*d.values())
    d = _adam_args("cuda")
    d["found_inf"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="found_inf must be on cuda"):
        torch.ops.mixprec.fused_adam_(*d.values())


def test_reference_device_mismatch_raises() -> None:
    d = _adam_args()
    d["grads"][1] = torch.empty(d["grads"][1].shape, dtype=torch.float16, device="meta")
    with pytest.raises(RuntimeError, match=r"grads\[1\] is on meta"):
        _reference.fused_adam_(*d.values())


def test_class_argument_errors() -> None:
    p = [torch.nn.Parameter(torch.randn(3))]
    with pytest.raises(ValueError, match="lr must be"):
        mixprec.optim.AdamW(p, lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[0\] must be in \[0, 1\)"):
        mixprec.optim.AdamW(p, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match=r"betas\[1\] must be in \[0, 1\)"):
        mixprec.optim.Adam(p, betas=(0.9, -0.5))
    with pytest.raises(ValueError, match="eps must be"):
        mixprec.optim.Adam(p, eps=-1.0)
    with pytest.raises(ValueError, match="weight_decay must be"):
        mixprec.optim.SGD(p, weight_decay=-0.1)
    with pytest.raises(ValueError, match="nesterov"):
        mixprec.optim.SGD(p, nesterov=True)
    with pytest.raises(ValueError, match="differentiable"):
        mixprec.optim.SGD(p, differentiable=True)
    opt = mixprec.optim.AdamW(p)
    p[0].grad = torch.randn(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    p[0].grad = torch.randn(3)
    before = _snapshot(opt)
    with pytest.raises(RuntimeError, match="grad_scale must be a float32"):
        opt.step(grad_scale=torch.ones(1, dtype=torch.float64))
    assert _bitwise_equal(before, _snapshot(opt))


# ---------------------------------------------------------------------------
# torch.library.opcheck and torch.compile.


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fused_adam(device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    d = _op_inputs(device, torch.bfloat16, torch.float16, True, True, gen)
    args = (*d.values(), torch.tensor(1e-3, device=device), 0.9, 0.999, 0.01, 1e-8, True, False,
            True, torch.full((1,), 2.0, device=device), torch.zeros(1, device=device), None,
            False, 0)
    torch.library.opcheck(torch.ops.mixprec.fused_adam_.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fused_sgd(device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    d = _op_inputs(device, torch.bfloat16, torch.float32, False, False, gen)
    args = (d["params"], d["grads"], d["exp_avgs"], [], d["state_steps"],
            torch.tensor(0.1, device=device), 0.0, 0.9, 0.0, True, False, None, None, None,
            True, 7)
    torch.library.opcheck(torch.ops.mixprec.fused_sgd_.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device: str) -> None:
    gen = torch.Generator().manual_seed(9)
    d = _op_inputs(device, torch.float16, torch.float32, True, False, gen)
    lr = torch.tensor(1e-3, device=device)
    found = torch.zeros(1, device=device)

    def step(inputs: Dict[str, List[torch.Tensor]]) -> None:
        ops.fused_adam_(inputs["params"], inputs["grads"], inputs["exp_avgs"],
                        inputs["exp_avg_sqs"], [], inputs["master_params"],
                        inputs["state_steps"], lr, 0.9, 0.999, 0.01, 1e-8, False, False, True,
                        None, found, None)

    eager, compiled = _clone_inputs(d), _clone_inputs(d)
    step(eager)
    torch.compile(step, fullgraph=True)(compiled)
    for k in d:
        assert _bitwise_equal(eager[k], compiled[k]), k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_compile_optimizer_step_fullgraph(device: str, kind: str, dtype: torch.dtype) -> None:
    """optimizer.step itself (state creation on the first call, grad_scale/found_inf/clip_coef,
    a skipped step, a tensor lr changed between steps) under torch.compile(fullgraph=True)
    equals eager, bit for bit."""
    torch._dynamo.reset()  # the compiled function's code object is shared by the cases
    gen = torch.Generator().manual_seed(21)
    eager_p = _params(device, dtype, gen)
    comp_p = [torch.nn.Parameter(p.detach().clone()) for p in eager_p]
    lr_e = torch.tensor(1e-2, dtype=torch.float64, device=device)
    lr_c = lr_e.clone()
    eager, comp = _make(kind, eager_p), _make(kind, comp_p)
    for o, lr in ((eager, lr_e), (comp, lr_c)):
        o.param_groups[0]["lr"] = lr

    @torch.compile(fullgraph=True)
    def compiled_step(scale: torch.Tensor, found: torch.Tensor, coef: torch.Tensor) -> None:
        comp.step(grad_scale=scale, found_inf=found, clip_coef=coef)

    scale = torch.full((), 32.0, device=device)
    coef = torch.full((), 0.75, device=device)
    for it in range(4):
        _set_grads(eager_p, gen, scale=32.0)
        for a, b in zip(eager_p, comp_p):
            b.grad = a.grad.clone()
        found = torch.full((), 1.0 if it == 2 else 0.0, device=device)
        eager.step(grad_scale=scale, found_inf=found, clip_coef=coef)
        compiled_step(scale, found, coef)
        lr_e.mul_(0.5)
        lr_c.mul_(0.5)
    assert _bitwise_equal(list(eager_p), list(comp_p))
    assert _bitwise_equal(eager.master_params(), comp.master_params())
    for a, b in zip(eager_p, comp_p):
        sa, sb = eager.state[a], comp.state[b]
        assert sa.keys() == sb.keys()
        assert _bitwise_equal([sa[k] for k in sa], [sb[k] for k in sa])
        assert float(sb["step"]) == 3.0  # 4 steps, one skipped


# ---------------------------------------------------------------------------
# Optimizer-class behaviour.


@pytest.mark.parametrize("device", DEVICES)
def test_param_groups_mixed_dtypes_and_api(device: str) -> None:
    gen = torch.Generator().manual_seed(31)
    p32 = torch.nn.Parameter(torch.randn(10, generator=gen).to(device))
    p16 = torch.nn.Parameter(torch.randn(10, generator=gen).to(device).half())
    pbf = torch.nn.Parameter(torch.randn(10, generator=gen).to(device).bfloat16())
    frozen = torch.nn.Parameter(torch.randn(10, generator=gen).to(device))
    opt = mixprec.optim.AdamW([{"params": [p32, p16]}, {"params": [pbf], "lr": 1e-2,
                                                          "master_weights": False}])
    assert opt.master_weights is True
    assert opt._step_supports_amp_scaling is True
    opt.add_param_group({"params": [frozen], "weight_decay": 0.5})
    assert opt.param_groups[2]["lr"] == 1e-3 and opt.param_groups[2]["weight_decay"] == 0.5
    for p in (p32, p16, pbf):
        p.grad = torch.randn(10, generator=gen).to(device=device, dtype=p.dtype)
    before_frozen = frozen.detach().clone()
    opt.step()
    assert torch.equal(frozen.detach(), before_frozen)  # no grad: untouched, no state
    assert frozen not in opt.state
    assert "master_param" in opt.state[p16] and "master_param" not in opt.state[pbf]
    assert "master_param" not in opt.state[p32]
    masters = opt.master_params()
    assert masters[0] is p32 and masters[1] is opt.state[p16]["master_param"]
    assert masters[2] is pbf
    assert masters[3].dtype == torch.float32
    opt.zero_grad()
    assert all(p.grad is None for p in (p32, p16, pbf))
    assert opt.state[p16]["step"].device.type == torch.device(device).type
    sd = opt.state_dict()
    assert any("master_param" in s for s in sd["state"].values())


@pytest.mark.parametrize("device", DEVICES)
def test_lr_changes_and_tensor_lr(device: str) -> None:
    gen = torch.Generator().manual_seed(41)
    ours_p = _params(device, torch.float32, gen, transposed=False)
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    lr_t = torch.tensor(1e-2, device=device)
    ours = mixprec.optim.Adam(ours_p, lr=lr_t, capturable=True)
    ref = torch.optim.Adam(torch_p, lr=1e-2, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    for _ in range(4):
        _set_grads(ours_p, gen)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad.clone()
        ours.step()
        ref.step()
        sched.step()
        lr_t.mul_(0.5)  # in-place: the optimizer reads it on the device
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6
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


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_cuda_matches_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        params, opt = _train("AdamW", device, torch.bfloat16, 5, 3,
                             {"master_weights": False, "stochastic_rounding": True})
        results.append([p.detach().cpu() for p in params])
    # same element math and SR numbering; pow() may differ in the last bit
    for a, b in zip(*results):
        _assert_within_one_ulp(a.contiguous(), b.contiguous())


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
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
    snap = _snapshot(opt)
    graph.replay()
    assert _bitwise_equal(snap, _snapshot(opt))


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_matches_torch_multi_chunk(device: str) -> None:
    # tensors spanning several CPU work items / CUDA blocks, and odd tails
    gen = torch.Generator().manual_seed(77)
    ours_p = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device))
              for s in [(70_001,), (300, 257)]]
    torch_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = mixprec.optim.AdamW(ours_p, lr=1e-3, amsgrad=True)
    ref = torch.optim.AdamW(torch_p, lr=1e-3, amsgrad=True, foreach=False)
    for _ in range(10):
        _set_grads(ours_p, gen)
        for a, b in zip(ours_p, torch_p):
            b.grad = a.grad.clone()
        ours.step()
        ref.step()
    for a, b in zip(ours_p, torch_p):
        assert _rel_err(a, b) <= 1e-6


@pytest.mark.skipif(not hasattr(mixprec, "GradScaler"), reason="mixprec.GradScaler not built in")
@pytest.mark.parametrize("device", DEVICES)
def test_mixprec_grad_scaler_fp16_grads(device: str) -> None:
    # fp16 params + masters under mixprec.GradScaler: the fp16 grads are
    # accepted (master_weights), unscaled in the kernel, and an overflow skips
    # the step on the device. A power-of-two scale makes the scaled run equal
    # bit for bit to an unscaled one.
    gen = torch.Generator().manual_seed(12)
    a = _params(device, torch.float16, gen, transposed=False)
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
    assert _bitwise_equal([p.detach() for p in a], [p.detach() for p in b])
    assert _bitwise_equal(opt_a.master_params(), opt_b.master_params())
