"""Tests of the fused_adam_ and fused_sgd_ ops (the kernels under mixprec.optim).

CPU always, CUDA where a GPU is present (the ``device`` fixture). References:
tests/_reference.py (the pure-PyTorch op) and a float64 step with an error bound
derived from float32 rounding; bad inputs; opcheck and torch.compile of the ops.
The optimizer classes are tested in test_optim_classes.py.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import pytest
import torch

import _reference
import mixprec
import mixprec.optim
from _helpers import all_bitwise_equal, cuda_only, snapshot_optimizer
from mixprec import ops


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
    assert all_bitwise_equal(outs[0], outs[1])
    assert not all_bitwise_equal(outs[0], [(b.float() - g).to(torch.bfloat16)
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
    assert all_bitwise_equal(before, after)


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


@cuda_only
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
    # (torch's wording: tests/optim/test_optim_torch_parity.py has the rest)
    with pytest.raises(ValueError, match="Invalid learning rate: -1.0"):
        mixprec.optim.AdamW(p, lr=-1.0)
    with pytest.raises(ValueError, match=r"Invalid beta parameter at index 0: 1.0 \(must be in"):
        mixprec.optim.AdamW(p, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match=r"Invalid beta parameter at index 1: -0.5"):
        mixprec.optim.Adam(p, betas=(0.9, -0.5))
    with pytest.raises(ValueError, match="Invalid epsilon value: -1.0"):
        mixprec.optim.Adam(p, eps=-1.0)
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        mixprec.optim.SGD(p, weight_decay=-0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        mixprec.optim.SGD(p, nesterov=True)
    with pytest.raises(ValueError, match="differentiable"):
        mixprec.optim.SGD(p, differentiable=True)
    opt = mixprec.optim.AdamW(p)
    p[0].grad = torch.randn(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    p[0].grad = torch.randn(3)
    before = snapshot_optimizer(opt)
    with pytest.raises(RuntimeError, match="grad_scale must be a float32"):
        opt.step(grad_scale=torch.ones(1, dtype=torch.float64))
    assert all_bitwise_equal(before, snapshot_optimizer(opt))


# ---------------------------------------------------------------------------
# torch.library.opcheck and torch.compile.


def test_opcheck_fused_adam(device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    d = _op_inputs(device, torch.bfloat16, torch.float16, True, True, gen)
    args = (*d.values(), torch.tensor(1e-3, device=device), 0.9, 0.999, 0.01, 1e-8, True, False,
            True, torch.full((1,), 2.0, device=device), torch.zeros(1, device=device), None,
            False, 0)
    torch.library.opcheck(torch.ops.mixprec.fused_adam_.default, args)


def test_opcheck_fused_sgd(device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    d = _op_inputs(device, torch.bfloat16, torch.float32, False, False, gen)
    args = (d["params"], d["grads"], d["exp_avgs"], [], d["state_steps"],
            torch.tensor(0.1, device=device), 0.0, 0.9, 0.0, True, False, None, None, None,
            True, 7)
    torch.library.opcheck(torch.ops.mixprec.fused_sgd_.default, args)


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
        assert all_bitwise_equal(eager[k], compiled[k]), k
