"""Split float32 masters in the fused ops: ``master_params`` of int16 / int8 corrections of
bf16 params (common/master_math.h). The CPU kernel (this CPU's ISA here, every ISA in a
subprocess each) and the CUDA launcher run by the emulation against the pure-PyTorch
reference of the spec (``tests/_split_reference.py``), bit for bit over several steps:
fused_adam_ (Adam, AdamW + amsgrad), fused_sgd_ (momentum, nesterov), fused_adam8_,
fused_sgd8_; fp32/bf16/fp16 grads; strided and zero-size params; chunk and block tails;
empty lists; more tensors than one launch holds; inf/NaN at the first and last element;
the scaler's skip (nothing written); clip_coef; midpoints placed on purpose; and the
refusals (nothing modified). With 16 bits the params are those of the float32-master
run except where that run's master hits the stated exception.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

import _cuda_emulation
import _split_reference as sr
from _helpers import REPO, assert_bitwise_equal
from mixprec.optim import _quant8 as q8

BITS = {16: torch.int16, 8: torch.int8}
GRADS = (torch.float32, torch.bfloat16, torch.float16)
ADAM = dict(beta1=0.9, beta2=0.999, eps=1e-8, maximize=False)
OPS: Dict[str, tuple[str, Dict[str, Any]]] = {
    "adam": ("fused_adam_", dict(ADAM, weight_decay=0.01, amsgrad=False,
                                 decoupled_weight_decay=False)),
    "adamw-amsgrad": ("fused_adam_", dict(ADAM, weight_decay=0.1, amsgrad=True,
                                          decoupled_weight_decay=True)),
    "sgd-momentum": ("fused_sgd_", dict(weight_decay=0.01, momentum=0.9, dampening=0.1,
                                        nesterov=False, maximize=False)),
    "sgd-nesterov": ("fused_sgd_", dict(weight_decay=0.0, momentum=0.9, dampening=0.0,
                                        nesterov=True, maximize=True)),
    "adam8": ("fused_adam8_", dict(ADAM, weight_decay=0.1, decoupled_weight_decay=True)),
    "sgd8": ("fused_sgd8_", dict(weight_decay=0.01, momentum=0.9, dampening=0.0,
                                 nesterov=True, maximize=False)),
}
# tails of a vector step, a 2-D param (rows for the 8-bit blocks), an empty one, one
# across a CPU chunk and 8-bit blocks; "T" marks a transposed (strided) param
SHAPES: List[Any] = [(1,), (37,), (129, 65), (0,), "T", (33000,)]


def _backends(op: str) -> Dict[str, Callable[..., Any]]:
    return _cuda_emulation.backends(op)


def _states(op: str, kw: Dict[str, Any], shapes: List[torch.Size], g: torch.Generator) -> None:
    """The op's state lists, nonzero, with a step count of 2 (past the first step)."""
    def rnd(s: torch.Size, scale: float) -> torch.Tensor:
        return torch.randn(s, generator=g) * scale

    if op == "fused_adam_":
        kw["exp_avgs"] = [rnd(s, 0.1) for s in shapes]
        kw["exp_avg_sqs"] = [rnd(s, 0.1) ** 2 for s in shapes]
        kw["max_exp_avg_sqs"] = ([v * 1.5 for v in kw["exp_avg_sqs"]]
                                 if kw["amsgrad"] else [])
    elif op == "fused_sgd_":
        kw["momentum_buffers"] = [rnd(s, 0.1) for s in shapes]
    elif op == "fused_adam8_":
        m = [q8.quantize(rnd(s, 0.1), q8.SIGNED) for s in shapes]
        v = [q8.quantize(rnd(s, 0.1) ** 2, q8.UNSIGNED) for s in shapes]
        kw["exp_avgs"], kw["exp_avg_absmax"] = [c for c, _ in m], [a for _, a in m]
        kw["exp_avg_sqs"], kw["exp_avg_sq_absmax"] = [c for c, _ in v], [a for _, a in v]
    else:
        b = [q8.quantize(rnd(s, 0.1), q8.SIGNED) for s in shapes]
        kw["momentum_buffers"], kw["momentum_absmax"] = [c for c, _ in b], [a for _, a in b]
    kw["state_steps"] = [torch.full((), 2.0) for _ in shapes]


def make_case(name: str, bits: int, grad_dtype: torch.dtype, seed: int = 0,
              shapes: Optional[List[Any]] = None, lr: float = 1e-2) -> Dict[str, Any]:
    """The keyword arguments of one call of op OPS[name] with split masters of `bits`."""
    op, hp = OPS[name]
    g = torch.Generator().manual_seed(seed)
    params, corr, sizes = [], [], []
    for s in SHAPES if shapes is None else shapes:
        if s == "T":  # a transposed param; its correction contiguous (other strides)
            p, c = sr.split(torch.randn(40, 24, generator=g), BITS[bits])
            params.append(p.t())
            corr.append(c.t().contiguous())
        else:
            p, c = sr.split(torch.randn(s, generator=g), BITS[bits])
            params.append(p)
            corr.append(c)
        sizes.append(params[-1].shape)
    kw: Dict[str, Any] = dict(hp, params=params, master_params=corr,
                              grads=[torch.randn(s, generator=g).to(grad_dtype) for s in sizes],
                              lr=torch.full((), lr))
    _states(op, kw, sizes, g)
    return kw


def clone(kw: Dict[str, Any]) -> Dict[str, Any]:
    def c(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, list):
            return [c(x) for x in v]
        return v
    return {k: c(v) for k, v in kw.items()}


def assert_same(a: Dict[str, Any], b: Dict[str, Any], where: str,
                any_nan: bool = False) -> None:
    """Every tensor of two calls' arguments bit for bit; NaN payloads may differ in the
    params (and, with `any_nan`, in the float states: the x86 maximum's NaN)."""
    for k, v in a.items():
        if isinstance(v, list):
            for i, (x, y) in enumerate(zip(v, b[k])):
                assert_bitwise_equal(x, y, f"{where} {k}[{i}]",
                                     any_nan_payload=k == "params" or (
                                         any_nan and x.is_floating_point()))
        elif isinstance(v, torch.Tensor):
            assert_bitwise_equal(v, b[k], f"{where} {k}")


def check_against_reference(name: str, kw: Dict[str, Any], steps: int = 2,
                            backends: Optional[List[str]] = None,
                            any_nan: bool = False) -> None:
    """`steps` calls of op OPS[name] (or the op `name`) on each backend and the
    reference, from the same arguments: the same bits everywhere."""
    op = OPS[name][0] if name in OPS else name
    for bname, fn in _backends(op).items():
        if backends is not None and bname not in backends:
            continue
        got, want = clone(kw), clone(kw)
        for _ in range(steps):
            fn(**got)
            sr.step(op, **want)
        assert_same(got, want, f"{name} {bname}", any_nan)


@pytest.mark.parametrize("grad_dtype", GRADS, ids=str)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", OPS)
def test_matches_the_reference(name: str, bits: int, grad_dtype: torch.dtype) -> None:
    check_against_reference(name, make_case(name, bits, grad_dtype))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", OPS)
def test_nonfinite_first_and_last_elements(name: str, bits: int) -> None:
    kw = make_case(name, bits, torch.float32, seed=1, shapes=[(37,), (300, 3), (1,)])
    for gr in kw["grads"]:
        gr.view(-1)[0] = float("inf")
        gr.view(-1)[-1] = float("nan")
    check_against_reference(name, kw, steps=1, any_nan=True)
    # the reference agrees on where the NaN params are and that their correction is 0
    op = OPS[name][0]
    for bname, fn in _backends(op).items():
        got = clone(kw)
        fn(**got)
        for p, c in zip(got["params"], got["master_params"]):
            assert torch.isnan(p.view(-1)[-1]) and int(c.view(-1)[-1]) == 0, bname


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", OPS)
def test_scaler_skip_writes_nothing_and_scale_and_clip_apply(name: str, bits: int) -> None:
    kw = make_case(name, bits, torch.bfloat16, seed=2, shapes=[(37,), (129, 65)])
    op = OPS[name][0]
    for bname, fn in _backends(op).items():
        skip = dict(clone(kw), grad_scale=torch.full((), 1024.0), found_inf=torch.ones(()))
        before = clone(skip)
        fn(**skip)
        assert_same(skip, before, f"{name} {bname} skipped")
    kw.update(grad_scale=torch.full((), 1024.0), found_inf=torch.zeros(()),
              clip_coef=torch.full((), 0.37))
    check_against_reference(name, kw)


@pytest.mark.parametrize("name", OPS)
def test_empty_lists(name: str) -> None:
    kw = make_case(name, 16, torch.float32, shapes=[])
    check_against_reference(name, kw, steps=1)


@pytest.mark.parametrize("name", ["adam", "sgd8"])
def test_more_tensors_than_one_launch_holds(name: str) -> None:
    kw = make_case(name, 8 if name == "sgd8" else 16, torch.bfloat16, seed=3,
                   shapes=[(1 + i % 5,) for i in range(700)])
    check_against_reference(name, kw, steps=1)


def _midpoint_masters(n: int, g: torch.Generator) -> torch.Tensor:
    """float32 masters exactly half a bf16 ulp above (in magnitude) even bf16 values."""
    p = torch.randn(n, generator=g).to(torch.bfloat16)
    pb = p.view(torch.int16).to(torch.int32) & ~1  # even
    return ((pb << 16) + 0x8000).view(torch.float32)


@pytest.mark.parametrize("bits", BITS)
def test_exception_midpoints_placed_on_purpose(bits: int) -> None:
    """SGD with lr 1 and float32 grads w - target lands each new master exactly on
    target: the upper half-ulp midpoint of an even param, which 16 bits decode one ulp
    toward the param and 8 bits clamp to 127 (the 256-pattern bound); some starting
    masters are such midpoints too."""
    g = torch.Generator().manual_seed(4)
    n = 513
    start = torch.where(torch.arange(n) % 2 == 0, _midpoint_masters(n, g),
                        torch.randn(n, generator=g))
    p, c = sr.split(start, BITS[bits])
    w = sr.decode(p, c)
    target = _midpoint_masters(n, g)
    # w - target exact: same binade where possible, else a plain target step
    grad = w - target
    exact = (w - grad) == target
    assert int(exact.sum()) > n // 2
    kw = dict(params=[p], grads=[grad], momentum_buffers=[], master_params=[c],
              state_steps=[torch.zeros(())], lr=torch.ones(()), weight_decay=0.0,
              momentum=0.0, dampening=0.0, nesterov=False, maximize=False)
    check_against_reference("fused_sgd_", kw, steps=1)
    for bname, fn in _backends("fused_sgd_").items():
        got = clone(kw)
        fn(**got)
        pn, cn = got["params"][0], got["master_params"][0]
        t_bits = target.view(torch.int32)
        back = sr.decode(pn, cn).view(torch.int32)
        assert torch.equal(pn[exact], target[exact].to(torch.bfloat16)), bname
        want_c = 0x7FFF if bits == 16 else 127
        assert bool((cn[exact] == want_c).all()), bname
        err = (back - t_bits)[exact]
        assert bool((err == (-1 if bits == 16 else -256)).all()), bname


def test_sixteen_bits_equal_the_float32_master_run_off_the_exceptions() -> None:
    """Five Adam steps with float32 masters and with int16 corrections of the same
    masters: the same params and decoded masters at every element whose float32 master
    never sat at an exception (elements are independent, so one exception changes only
    its own element's later steps)."""
    kw = make_case("adam", 16, torch.bfloat16, seed=5, shapes=[(4099,), (129, 65)])
    split = clone(kw)
    full = clone(kw)
    full["master_params"] = [sr.decode(p, c) for p, c in zip(kw["params"], kw["master_params"])]
    hit = [torch.zeros(p.shape, dtype=torch.bool) for p in kw["params"]]
    for _ in range(5):
        torch.ops.mixprec.fused_adam_(**split)
        torch.ops.mixprec.fused_adam_(**full)
        for i, (p, m) in enumerate(zip(full["params"], full["master_params"])):
            exact = sr.decode(p, sr.encode(m, p, torch.int16)).view(torch.int32)
            hit[i] |= exact != m.view(torch.int32)
            ok = ~hit[i]
            assert torch.equal(split["params"][i][ok].view(torch.int16),
                               p[ok].view(torch.int16))
            back = sr.decode(split["params"][i], split["master_params"][i])
            assert torch.equal(back[ok].view(torch.int32), m[ok].view(torch.int32))
    assert sum(int(h.sum()) for h in hit) < 10


def _refusal_case(kind: str) -> Dict[str, Any]:
    kw = make_case("adam", 16, torch.float32, seed=6, shapes=[(5,), (7,)])
    c = kw["master_params"]
    if kind == "fp16-params":
        kw["params"] = [p.to(torch.float16) for p in kw["params"]]
    elif kind == "mixed-int":
        c[1] = c[1].to(torch.int8)
    elif kind == "mixed-float":
        c[0] = sr.decode(kw["params"][0], c[0])
    elif kind == "int32":
        kw["master_params"] = [x.to(torch.int32) for x in c]
    elif kind == "fp32-params":
        kw["params"] = [p.float() for p in kw["params"]]
    elif kind == "stochastic-rounding":
        kw["stochastic_rounding"] = True
    return kw


REFUSALS = {
    "fp16-params": "split masters need bfloat16 params",
    "mixed-int": "every master of one call has one dtype",
    "mixed-float": "every master of one call has one dtype",
    "int32": "must be float32 (a float32 master) or int16 / int8",
    "fp32-params": "needs no master copy",
    "stochastic-rounding": "cannot be combined with master_params",
}


@pytest.mark.parametrize("kind", REFUSALS)
def test_refusals_name_master_params_and_modify_nothing(kind: str) -> None:
    for bname, fn in _backends("fused_adam_").items():
        kw = _refusal_case(kind)
        before = clone(kw)
        with pytest.raises(RuntimeError, match=re.escape(REFUSALS[kind])) as e:
            fn(**kw)
        assert "master_params" in str(e.value), bname
        assert_same(kw, before, f"{kind} {bname}")


def check_all_ops_against_reference() -> None:
    """The CPU kernel (the ISA MIXPREC_CPU_CAPABILITY picks) on every op and form."""
    for name in OPS:
        for bits in BITS:
            for gd in (torch.float32, torch.bfloat16):
                check_against_reference(name, make_case(name, bits, gd, seed=7), steps=2,
                                        backends=["cpu"])


ISAS = ["default", "avx2", "avx512"]


@pytest.mark.parametrize("isa", ISAS)
def test_every_cpu_isa_matches_the_reference(isa: str) -> None:
    import mixprec

    native = mixprec.build_info()["cpu_capability"]
    if native not in ISAS or ISAS.index(isa) > ISAS.index(native):
        pytest.skip(f"this CPU runs up to {native}")
    tests = REPO / "tests"
    code = ("import mixprec, test_split_masters as t; t.check_all_ops_against_reference(); "
            "print(mixprec.build_info()['cpu_capability'])")
    env = {**os.environ, "MIXPREC_CPU_CAPABILITY": isa,
           "PYTHONPATH": os.pathsep.join([str(tests / "ops"), str(tests),
                                          os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == isa


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", ["adam", "sgd-momentum", "adam8", "sgd8"])
def test_opcheck(name: str, bits: int) -> None:
    op = OPS[name][0]
    kw = make_case(name, bits, torch.bfloat16, seed=8, shapes=[(37,), (3, 5)])
    torch.library.opcheck(getattr(torch.ops.mixprec, op).default, (), kw)
