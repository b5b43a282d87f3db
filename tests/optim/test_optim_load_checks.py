"""An optimizer's ``load_state_dict`` checks the whole state dict against the
optimizer before it replaces anything (32-bit state as strictly as 8-bit); a refused dict
leaves the optimizer exactly as it was (every tensor and attribute, bit for bit); a valid
one still loads and resumes bit for bit. The constructors name a mistyped hyper-parameter."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec.optim
from _helpers import bits
from _unchanged import KINDS, corrupt, entries, get, refused_unchanged

CLASSES: List[Tuple[Any, Dict[str, Any]]] = [
    (mixprec.optim.AdamW, {"weight_decay": 0.01}),
    (mixprec.optim.Adam, {"amsgrad": True}),
    (mixprec.optim.SGD, {"momentum": 0.9}),
]
IDS = ["AdamW", "Adam-amsgrad", "SGD-momentum"]


def _grads(params: List[torch.Tensor], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def made(cls: Any, kwargs: Dict[str, Any], seed: int = 0, steps: int = 2
         ) -> Tuple[List[torch.Tensor], Any]:
    """A float16 param with a float32 master and a float32 param, in two groups, after
    ``steps`` steps."""
    torch.manual_seed(seed)
    params = [torch.randn(3, 4).half().requires_grad_(), torch.randn(4).requires_grad_()]
    opt = cls([{"params": params[:1]}, {"params": params[1:], "lr": 0.01}], **kwargs)
    for k in range(steps):
        _grads(params, k)
        opt.step()
    return params, opt


def _checked_case(valid: Dict[str, Any], path: tuple, kind: str) -> bool:
    """Whether corrupting ``path`` by ``kind`` must be refused (the rest is allowed on
    purpose: torch's extra group keys, a missing master rebuilt from the param...)."""
    top = path[0]
    if top == "state":
        if len(path) == 1:
            return kind in ("type", "missing", "extra")
        if len(path) == 2:
            return kind in ("type", "extra")
        name = path[2]
        if kind == "missing":
            return name != "master_param" and not (name == "step" and "momentum_buffer"
                                                   in get(valid, path[:2]))
        return kind != "extra"
    if len(path) == 1:
        return kind in ("type", "missing")
    if len(path) == 2:
        return kind == "type"
    key = path[2]
    if key == "params":
        if len(path) == 3:
            return kind in ("type", "missing")
        return kind in ("type", "range", "dtype")
    if key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if kind == "dtype" and key == "lr":
            return False  # a tensor lr is allowed
        return kind in ("type", "range", "dtype", "shape", "missing")
    if key == "betas":
        return kind in ("type", "missing")
    if key == "nesterov":
        return kind in ("type", "range", "missing")
    if key in ("amsgrad", "maximize", "master_weights", "stochastic_rounding",
               "decoupled_weight_decay", "seed", "min_8bit_size", "state_bits"):
        return kind in ("type", "range")
    return False


def cases(cls: Any, kwargs: Dict[str, Any]) -> List[Tuple[tuple, str]]:
    _, opt = made(cls, kwargs)
    valid = opt.state_dict()
    return [(p, k) for p in entries(valid) for k in KINDS
            if _checked_case(valid, p, k) and corrupt(valid, p, k) is not None]


def _names(path: tuple) -> List[str]:
    """The names one of which the error must contain: the string keys of ``path``."""
    return [str(k) for k in path if isinstance(k, str)]


def check_refused(cls: Any, kwargs: Dict[str, Any], path: tuple, kind: str) -> None:
    _, src = made(cls, kwargs)
    valid = copy.deepcopy(src.state_dict())
    bad = corrupt(valid, path, kind)
    assert bad is not None
    _, target = made(cls, kwargs, seed=1, steps=1)
    message = refused_unchanged(target, lambda: target.load_state_dict(bad))
    assert any(n in message for n in _names(path)), (path, kind, message)


@pytest.mark.parametrize("cls,kwargs", CLASSES, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_one_corrupted_entry_is_refused_and_changes_nothing(cls: Any, kwargs: Dict[str, Any],
                                                            data: Any) -> None:
    """Property: any one entry of a valid state dict corrupted (wrong type, shape, dtype,
    device 'meta', range, missing, extra) -> TypeError/ValueError naming it, and the
    optimizer loaded into exactly as it was."""
    path, kind = data.draw(st.sampled_from(cases(cls, kwargs)))
    check_refused(cls, kwargs, path, kind)


@pytest.mark.parametrize("cls,kwargs", CLASSES, ids=IDS)
def test_the_valid_state_dict_loads_and_resumes_bit_for_bit(cls: Any,
                                                            kwargs: Dict[str, Any]) -> None:
    params, src = made(cls, kwargs)
    saved = copy.deepcopy(src.state_dict())
    p2, target = made(cls, kwargs, seed=1, steps=1)
    with torch.no_grad():
        for a, b in zip(p2, params):
            a.copy_(b)
    target.load_state_dict(saved)
    for k in range(2, 5):
        for ps, o in ((params, src), (p2, target)):
            _grads(ps, k)
            o.step()
    for a, b in zip(p2, params):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
    for pa, pb in zip(p2, params):
        for name, t in src.state[pb].items():
            assert torch.equal(bits(target.state[pa][name]), bits(t)), name


# -- named cases, one by one --------------------------------------------------------
def _adam_dict() -> Tuple[Any, Dict[str, Any]]:
    params, opt = made(mixprec.optim.AdamW, {})
    return opt, copy.deepcopy(opt.state_dict())


def _set(d: Dict[str, Any], path: tuple, value: Any) -> Dict[str, Any]:
    get(d, path[:-1])[path[-1]] = value
    return d


NAMED_CASES: List[Tuple[str, Callable[[Dict[str, Any]], Dict[str, Any]], type, str]] = [
    ("step = 'two'", lambda d: _set(d, ("state", 0, "step"), "two"), TypeError,
     "state[0]['step']"),
    ("lr = 'fast'", lambda d: _set(d, ("param_groups", 0, "lr"), "fast"), TypeError,
     "param_groups[0]['lr']"),
    ("transposed exp_avg", lambda d: _set(d, ("state", 0, "exp_avg"),
                                          d["state"][0]["exp_avg"].t().contiguous()),
     ValueError, "state[0]['exp_avg']: expected the param's shape [3, 4]"),
    ("short master_param", lambda d: _set(d, ("state", 0, "master_param"),
                                          d["state"][0]["master_param"][:2]),
     ValueError, "state[0]['master_param']"),
    ("missing exp_avg_sq", lambda d: (d["state"][0].pop("exp_avg_sq"), d)[1], ValueError,
     "missing ['exp_avg_sq']"),
    ("step = -5", lambda d: _set(d, ("state", 0, "step"), torch.tensor(-5.0)), ValueError,
     "state[0]['step']: expected a whole number of steps >= 0"),
    ("negative exp_avg_sq", lambda d: _set(d, ("state", 1, "exp_avg_sq"),
                                           -d["state"][1]["exp_avg_sq"] - 1), ValueError,
     "state[1]['exp_avg_sq']: a second moment must be >= 0"),
    ("exp_avg on meta", lambda d: _set(d, ("state", 1, "exp_avg"),
                                       d["state"][1]["exp_avg"].to("meta")), ValueError,
     "state[1]['exp_avg']: a tensor on 'meta' has no data"),
    ("master on a float32 param", lambda d: _set(d, ("state", 1, "master_param"),
                                                 d["state"][1]["exp_avg"].clone()),
     ValueError, "state[1]['master_param']: this param keeps no master"),
    ("state of another param id", lambda d: _set(d, ("state", 7), d["state"][0]), ValueError,
     "state[7]: no param"),
]


@pytest.mark.parametrize("what,change,exc,message", NAMED_CASES, ids=[c[0] for c in NAMED_CASES])
def test_a_named_case_is_refused_before_anything_changes(what: str, change: Any, exc: type,
                                                       message: str) -> None:
    _, valid = _adam_dict()
    bad = change(valid)
    _, target = made(mixprec.optim.AdamW, {}, seed=1, steps=1)
    assert message in refused_unchanged(target, lambda: target.load_state_dict(bad), exc)


def test_a_wider_models_state_is_refused() -> None:
    _, wide = made(mixprec.optim.AdamW, {})
    sd = copy.deepcopy(wide.state_dict())
    sd["state"][0]["exp_avg"] = torch.zeros(3, 5)
    _, target = made(mixprec.optim.AdamW, {}, seed=1)
    message = refused_unchanged(target, lambda: target.load_state_dict(sd), ValueError)
    assert "state[0]['exp_avg']: expected the param's shape" in message


def test_a_failing_post_hook_leaves_the_optimizer_as_it_was() -> None:
    """The safety net behind the checks: whatever raises inside torch's load puts the
    state and the groups back."""
    _, valid = _adam_dict()
    _, target = made(mixprec.optim.AdamW, {}, seed=1)

    def hook(opt: Any) -> None:
        raise RuntimeError("boom")

    target.register_load_state_dict_post_hook(hook)
    assert refused_unchanged(target, lambda: target.load_state_dict(valid), RuntimeError) == "boom"


def test_eight_bit_state_still_loads_and_is_still_checked() -> None:
    """The 8-bit checks (the mixin's) still run beside the 32-bit ones."""
    torch.manual_seed(0)
    p = torch.randn(64, 8).requires_grad_()
    opt = mixprec.optim.AdamW([p], state_bits=8, min_8bit_size=1)
    p.grad = torch.randn_like(p)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    fresh = mixprec.optim.AdamW([torch.randn(64, 8).requires_grad_()], state_bits=8,
                                min_8bit_size=1)
    fresh.load_state_dict(sd)
    bad = copy.deepcopy(sd)
    bad["state"][0]["exp_avg_absmax"] = bad["state"][0]["exp_avg_absmax"][:1]
    assert "exp_avg_absmax" in refused_unchanged(fresh, lambda: fresh.load_state_dict(bad),
                                                 ValueError)


def test_a_mistyped_hyper_parameter_is_named() -> None:
    p = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(TypeError, match="weight_decay must be a float, got str '0.01'"):
        mixprec.optim.AdamW(p, weight_decay="0.01")
