"""The optimizers' tensor lists are reused across steps only while nothing they were built
from changed (``FusedOptimizer._reuse``), and the scaler's grad collection takes its
C-speed path only for what the per-param loop would give the same answer for.

Each case runs two optimizers on identical params side by side: one as shipped (reuse
on) and a twin whose ``_reuse`` always answers None (the lists rebuilt every step, the
path every step took before reuse existed). Between step 1 and step 2 the same change is
made to both; after step 2 (and step 3, unchanged) the params and the whole optimizer
state must be bitwise equal, and the reuse must have happened exactly where it is
allowed. Any change the check missed would make the shipped optimizer update stale
tensors, and these comparisons fail.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

import mixprec
from _helpers import all_bitwise_equal
from mixprec.amp import grads as grads_mod

Params = List[torch.nn.Parameter]
Change = Callable[[torch.optim.Optimizer, Params, torch.Generator], None]

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float32)
SHAPES = ((5, 3), (7,), (2, 2, 2), (0,))


def _randn(shape: Any, gen: torch.Generator, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(device)


def _setup(device: str, seed: int) -> Params:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(_randn(s, gen, device).to(dt)) for s, dt in zip(SHAPES, DTYPES)]


def _set_grads(params: Params, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = _randn(p.shape, gen, str(p.device)).to(p.dtype)


class Spy:
    """Counts the steps whose lists were reused."""

    def __init__(self, opt: mixprec.optim.FusedOptimizer) -> None:
        self.hits = 0
        inner = opt._reuse

        def reuse(index: int, group: Dict[str, Any]) -> Optional[Any]:
            out = inner(index, group)
            self.hits += out is not None
            return out
        opt._reuse = reuse  # type: ignore[method-assign]


def _pair(make: Callable[[Params], mixprec.optim.FusedOptimizer], device: str):
    a, b = _setup(device, 0), _setup(device, 0)
    oa, ob = make(a), make(b)
    ob._reuse = lambda index, group: None  # type: ignore[method-assign]
    return a, oa, b, ob


def _state_tensors(opt: torch.optim.Optimizer, params: Params) -> List[torch.Tensor]:
    out = []
    for p in params:
        st = opt.state.get(p, {})
        out += [st[k] for k in sorted(st) if isinstance(st[k], torch.Tensor)]
    return out


def _assert_same(a: Params, oa: torch.optim.Optimizer, b: Params,
                 ob: torch.optim.Optimizer) -> None:
    assert all_bitwise_equal([p.detach() for p in a], [p.detach() for p in b])
    assert all_bitwise_equal(_state_tensors(oa, a), _state_tensors(ob, b))


def _steps(a: Params, oa: Any, b: Params, ob: Any, seeds: Any,
           set_to_none: bool = False) -> None:
    """Both optimizers: (zero_grad(set_to_none=True),) the same fresh grads, a step, and the
    same params and state after it; once per seed."""
    for seed in seeds:
        if set_to_none:
            oa.zero_grad(set_to_none=True)
            ob.zero_grad(set_to_none=True)
        _set_grads(a, seed)
        _set_grads(b, seed)
        oa.step()
        ob.step()
        _assert_same(a, oa, b, ob)


def _params_of(opt: torch.optim.Optimizer) -> Params:
    return [p for g in opt.param_groups for p in g["params"]]


# -- the changes made between two steps -------------------------------------------------


def _nothing(opt: Any, params: Params, gen: torch.Generator) -> None:
    pass


def _state_in_place(opt: Any, params: Params, gen: torch.Generator) -> None:
    for p in params:
        for t in opt.state[p].values():
            if isinstance(t, torch.Tensor) and t.numel():
                t.mul_(0.5)


def _first_state_name(opt: Any) -> str:
    return "momentum_buffer" if isinstance(opt, mixprec.optim.SGD) else "exp_avg"


def _state_tensor_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    name = _first_state_name(opt)
    st = opt.state[params[0]]
    st[name] = st[name] * 2 + 1


def _step_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.state[params[0]]["step"] = torch.full((), 40.0, device=params[0].device)


def _master_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    st = opt.state[params[1]]  # the float16 param
    st["master_param"] = st["master_param"] + 0.25


def _state_dict_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    p = params[2]
    opt.state[p] = {k: (v * 3 if isinstance(v, torch.Tensor) and k != "step" else v.clone())
                    for k, v in opt.state[p].items()}


def _state_cleared(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.state.clear()


def _one_state_deleted(opt: Any, params: Params, gen: torch.Generator) -> None:
    del opt.state[params[0]]


def _data_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    params[0].data = params[0].data.clone() + 1


def _dtype_changed(opt: Any, params: Params, gen: torch.Generator) -> None:
    p = params[0]  # float32 -> bfloat16: from now on it needs a master
    p.data = p.data.to(torch.bfloat16)
    p.grad = None


def _grad_none(opt: Any, params: Params, gen: torch.Generator) -> None:
    params[1].grad = None


def _param_appended(opt: Any, params: Params, gen: torch.Generator) -> None:
    p = torch.nn.Parameter(_randn((4,), gen, str(params[0].device)))
    opt.param_groups[0]["params"].append(p)


def _param_removed(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.param_groups[0]["params"].pop(2)


def _param_object_replaced(opt: Any, params: Params, gen: torch.Generator) -> None:
    # another Parameter over the same storage: same data pointer, new object, no state
    ps = opt.param_groups[0]["params"]
    ps[0] = torch.nn.Parameter(ps[0].data)
    ps[0].grad = params[0].grad


def _params_reordered(opt: Any, params: Params, gen: torch.Generator) -> None:
    ps = opt.param_groups[0]["params"]
    ps[0], ps[2] = ps[2], ps[0]


def _group_added(opt: Any, params: Params, gen: torch.Generator) -> None:
    p = torch.nn.Parameter(_randn((3, 3), gen, str(params[0].device)).half())
    opt.add_param_group({"params": [p]})


def _master_weights_off(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.param_groups[0]["master_weights"] = False


def _amsgrad_on(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.param_groups[0]["amsgrad"] = True


def _momentum_on(opt: Any, params: Params, gen: torch.Generator) -> None:
    opt.param_groups[0]["momentum"] = 0.9


def _state_dict_loaded(opt: Any, params: Params, gen: torch.Generator) -> None:
    sd = copy.deepcopy(opt.state_dict())
    for st in sd["state"].values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and k != "step":
                v.add_(0.125)
    opt.load_state_dict(sd)


COMMON: Dict[str, Change] = {
    "nothing": _nothing,
    "state changed in place": _state_in_place,
    "state tensor replaced": _state_tensor_replaced,
    "step count replaced": _step_replaced,
    "master replaced": _master_replaced,
    "state dict replaced": _state_dict_replaced,
    "state cleared": _state_cleared,
    "one state deleted": _one_state_deleted,
    "param data replaced": _data_replaced,
    "param dtype changed": _dtype_changed,
    "a grad set to None": _grad_none,
    "param appended": _param_appended,
    "param removed": _param_removed,
    "params reordered": _params_reordered,
    "param object replaced, same storage": _param_object_replaced,
    "param group added": _group_added,
    "master_weights switched off": _master_weights_off,
    "state dict loaded": _state_dict_loaded,
}
# the changes after which the lists may (must) be reused
REUSED = {"nothing", "state changed in place"}

OPTIMIZERS: Dict[str, Callable[[Params], mixprec.optim.FusedOptimizer]] = {
    "AdamW": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "Adam amsgrad": lambda ps: mixprec.optim.Adam(ps, lr=1e-2, amsgrad=True),
    "SGD momentum": lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
}
EXTRA: Dict[str, Dict[str, Change]] = {
    "AdamW": {"amsgrad switched on": _amsgrad_on},
    "SGD momentum": {},
    "Adam amsgrad": {},
}

CASES = [(o, c, f) for o in OPTIMIZERS for c, f in {**COMMON, **EXTRA[o]}.items()]


@pytest.mark.parametrize("opt_name,change_name,change", CASES,
                         ids=[f"{o}-{c}" for o, c, _ in CASES])
def test_a_change_is_never_missed(device: str, opt_name: str, change_name: str,
                                  change: Change) -> None:
    a, oa, b, ob = _pair(OPTIMIZERS[opt_name], device)
    spy = Spy(oa)
    _steps(a, oa, b, ob, (1, 2))  # the second step may reuse step 1's lists
    assert spy.hits == 1
    change(oa, a, torch.Generator().manual_seed(7))
    change(ob, b, torch.Generator().manual_seed(7))
    spy.hits = 0
    for seed in (3, 4):
        for pa, pb in zip(_params_of(oa), _params_of(ob)):
            if pa.grad is not None or seed == 4 or change_name != "a grad set to None":
                g = torch.Generator().manual_seed(seed * 1000 + pa.numel())
                gr = _randn(pa.shape, g, device)
                pa.grad, pb.grad = gr.to(pa.dtype), gr.clone().to(pb.dtype)
        oa.step()
        ob.step()
        _assert_same(_params_of(oa), oa, _params_of(ob), ob)
    groups = len(oa.param_groups)
    if change_name in REUSED:
        assert spy.hits == 2 * groups, "an unchanged group must reuse its lists"
    else:
        # the step right after the change rebuilt (at least for the changed group)
        assert spy.hits < 2 * groups, f"{change_name}: the stale lists were reused"


def test_sgd_momentum_switched_on(device: str) -> None:
    a, oa, b, ob = _pair(lambda ps: mixprec.optim.SGD(ps, lr=1e-2), device)
    _steps(a, oa, b, ob, (1, 2))
    for opt, ps in ((oa, a), (ob, b)):
        _momentum_on(opt, ps, torch.Generator())
    _steps(a, oa, b, ob, (3, 4))
    assert "momentum_buffer" in oa.state[a[0]]


def test_new_grad_objects_every_step_still_reuse(device: str) -> None:
    """``zero_grad(set_to_none=True)`` gives new grad tensors each step: the lists are
    reused and the new grads read."""
    a, oa, b, ob = _pair(OPTIMIZERS["AdamW"], device)
    spy = Spy(oa)
    _steps(a, oa, b, ob, range(1, 6), set_to_none=True)
    assert spy.hits == 4


def test_a_removed_group_releases_its_lists() -> None:
    """The stored lists of a param group that was removed from ``param_groups`` are dropped
    at the next step (they would keep its state tensors alive)."""
    a, oa, _, _ = _pair(OPTIMIZERS["AdamW"], "cpu")
    extra = torch.nn.Parameter(torch.randn(3, 3))
    oa.add_param_group({"params": [extra]})
    extra.grad = torch.randn(3, 3)
    _set_grads(a, 1)
    oa.step()
    assert sorted(oa._plans) == [0, 1]
    oa.param_groups.pop()
    oa.step()
    assert sorted(oa._plans) == [0]


def test_sparse_grad_after_reuse_is_refused(device: str) -> None:
    a, oa, _, _ = _pair(OPTIMIZERS["AdamW"], device)
    for seed in (1, 2):
        _set_grads(a, seed)
        oa.step()
    before = [p.detach().clone() for p in a]
    a[0].grad = a[0].grad.to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        oa.step()
    assert all_bitwise_equal([p.detach() for p in a], before)


def test_no_reuse_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile the lists are built in the traced code, never taken from (or
    stored in) the cache, which dynamo could not guard."""
    a, oa, _, _ = _pair(OPTIMIZERS["AdamW"], "cpu")
    _set_grads(a, 1)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    oa.step()
    oa.step()
    assert oa._plans == {}


# -- the scaler's grad collection ---------------------------------------------------------


class _MyParam(torch.nn.Parameter):
    pass


def _collect(opt: torch.optim.Optimizer, allow_fp16: bool, loop: bool,
             monkeypatch: pytest.MonkeyPatch) -> Dict[torch.device, List[Any]]:
    with monkeypatch.context() as m:
        if loop:
            m.setattr(grads_mod, "_dense_one_device", lambda *args: None)
        per_device = grads_mod.collect_grads(opt, allow_fp16)
    return {d: [(g.data_ptr(), tuple(g.shape), g.dtype) for g in gs]
            for d, gs in per_device.items()}


GROUPS: Dict[str, Callable[[str], List[Dict[str, Any]]]] = {
    "dense fp32": lambda dev: [{"params": _setup(dev, 1)[:1] + _setup(dev, 2)[3:]}],
    "mixed dtypes": lambda dev: [{"params": _setup(dev, 1)}],
    "some grads None": lambda dev: [{"params": _setup(dev, 1)}, {"params": _setup(dev, 2)}],
    "empty group": lambda dev: [{"params": []}, {"params": _setup(dev, 3)}],
    "sparse grad": lambda dev: [{"params": _setup(dev, 4)}],
    "a Parameter subclass": lambda dev: [{"params": _setup(dev, 5)[:2] + [_MyParam(
        torch.randn(3, device=dev))]}],
}


@pytest.mark.parametrize("name", sorted(GROUPS))
@pytest.mark.parametrize("allow_fp16", [True, False])
def test_collect_grads_fast_path_equals_the_loop(device: str, name: str, allow_fp16: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    groups = GROUPS[name](device)
    for i, g in enumerate(groups):
        _set_grads(g["params"], i)
    if name == "some grads None":
        groups[0]["params"][1].grad = None
        groups[1]["params"][0].grad = None
    if name == "sparse grad":
        p = groups[0]["params"][0]
        p.grad = p.grad.to_sparse()
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=0.1)
    opt.param_groups = groups
    outcomes = []
    for loop in (False, True):
        try:
            outcomes.append(_collect(opt, allow_fp16, loop, monkeypatch))
        except ValueError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    if name == "mixed dtypes" and not allow_fp16:
        assert outcomes[0] == "Attempting to unscale FP16 gradients."


# ---------------------------------------------------------------------------
# The snapshots and checks behind _reuse (csrc/python/list_watch.h), one change at a time.

_WATCH = mixprec.optim._base._WATCH
needs_watch = pytest.mark.skipif(_WATCH is None, reason="needs mixprec._C")


def _watched() -> List[torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(2, 3).half()),
          torch.nn.Parameter(torch.randn(3))]
    ps[0].grad = torch.randn(4)
    ps[1].grad = torch.randn(2, 3).half()
    return ps


def _retype(ps: Params) -> None:
    ps[2].data = ps[2].data.double()


def _resize(ps: Params) -> None:
    ps[2].data = torch.randn(2)


def _replace_param(ps: Params) -> None:
    ps[1] = torch.nn.Parameter(ps[1].detach())  # same storage, another object


PARAM_CHANGES: Dict[str, Callable[[Params], None]] = {
    "data replaced": lambda ps: setattr(ps[0], "data", torch.randn(4)),
    "data retyped": _retype,
    "data resized": _resize,
    "grad added": lambda ps: setattr(ps[2], "grad", torch.randn(3)),
    "grad removed": lambda ps: setattr(ps[0], "grad", None),
    "param replaced": _replace_param,
    "param appended": lambda ps: ps.append(torch.nn.Parameter(torch.randn(1))),
    "param removed": lambda ps: ps.pop(),
    "params reordered": lambda ps: ps.reverse(),
}


@needs_watch
@pytest.mark.parametrize("change", list(PARAM_CHANGES))
def test_params_watch_sees_each_change(change: str) -> None:
    ps = _watched()
    snap = _WATCH.watch_tensors(ps, False)
    grads = _WATCH.tensors_grads(ps, snap, True)
    assert grads[0] is ps[0].grad and grads[1] is ps[1].grad and grads[2] is None
    ps[0].grad = torch.randn(4)  # a new grad object: still the same lists
    ps[0].data.add_(1.0)  # changed in place: the same
    assert _WATCH.tensors_grads(ps, snap, True)[0] is ps[0].grad
    PARAM_CHANGES[change](ps)
    assert _WATCH.tensors_grads(ps, snap, True) is None


@needs_watch
def test_params_watch_refuses_tensor_subclasses() -> None:
    class Sub(torch.Tensor):
        pass

    ps = _watched() + [torch.randn(3).as_subclass(Sub)]
    assert _WATCH.watch_tensors(ps, False) is None
    with pytest.raises(TypeError):
        _WATCH.tensors_grads(ps, "not a snapshot", True)


class _SlottedDT(torch.Tensor):
    """Stands in for DTensor: ``_local_tensor`` and ``_spec`` in slots, as torch's."""

    __slots__ = ("_local_tensor", "_spec")


class _AttrDT(torch.Tensor):
    """Stands in for a DTensor class whose ``_local_tensor`` is no slot (a property)."""

    @property
    def _local_tensor(self) -> torch.Tensor:
        return self.__dict__["local"]

    @property
    def _spec(self) -> str:
        return self.__dict__["spec"]


def _fake_dtensor(cls: type, local: torch.Tensor, spec: str) -> torch.Tensor:
    t = torch.Tensor._make_subclass(cls, torch.empty(local.shape), local.requires_grad)
    if cls is _SlottedDT:
        t._local_tensor, t._spec = local, spec
    else:
        t.__dict__.update(local=local, spec=spec)
    return t


@needs_watch
@pytest.mark.parametrize("cls", [_SlottedDT, _AttrDT])
def test_dtensor_locals_read_from_the_slot_or_by_name(cls: type) -> None:
    """The list passes read a DTensor's ``_local_tensor``/``_spec`` from its slot when the
    class declares slots (csrc/python/list_watch.h ``DTensorSlot``), by name otherwise: the
    same answers either way, and an unset slot takes the per-param path (None)."""
    from mixprec import _dtensor

    real = _dtensor.dtensor_class() if _dtensor.fsdp2_unavailable() is None else None
    try:
        _WATCH.set_dtensor_type(cls)
        params = [_fake_dtensor(cls, torch.randn(3, requires_grad=True), f"p{i}")
                  for i in range(3)]
        for i, p in enumerate(params):
            p.grad = _fake_dtensor(cls, torch.randn(3), f"g{i}")
        snap = _WATCH.watch_tensors(params, False)
        assert snap is not None
        got = _WATCH.tensors_grads(params, snap, True)
        assert [g is p.grad._local_tensor for g, p in zip(got, params)] == [True] * 3
        specs: List[Any] = []
        got = _WATCH.dense_grads(params, True, specs)
        assert [g is p.grad._local_tensor for g, p in zip(got, params)] == [True] * 3
        assert specs == ["g0", "g1", "g2"]
        if cls is _SlottedDT:
            del params[1].grad._local_tensor  # an unset slot
            assert _WATCH.tensors_grads(params, snap, True) is None
            assert _WATCH.dense_grads(params, True, []) is None
            del params[2]._local_tensor
            assert _WATCH.watch_tensors(params, False) is None
    finally:
        if real is not None:
            _WATCH.set_dtensor_type(real)


ITEM_CHANGES: Dict[str, Callable[[List[Dict[str, Any]]], None]] = {
    "value replaced": lambda ds: ds[0].__setitem__("exp_avg", torch.zeros(3)),
    "key added": lambda ds: ds[1].__setitem__("extra", 1),
    "key removed": lambda ds: ds[1].pop("step"),
    "reordered": lambda ds: ds[0].__setitem__("step", ds[0].pop("step")),
    "equal key, other object": lambda ds: ds[0].__setitem__(
        "".join(["exp", "_avg"]), ds[0].pop("exp_avg")),
    "dict cleared": lambda ds: ds[1].clear(),
}


@needs_watch
@pytest.mark.parametrize("change", list(ITEM_CHANGES))
def test_items_watch_sees_each_change(change: str) -> None:
    ds = [{"step": torch.zeros(()), "exp_avg": torch.randn(3)}, {"step": torch.zeros(())}]
    snap = _WATCH.watch_items(ds)
    ds[0]["exp_avg"].add_(1.0)  # changed in place: the same
    assert _WATCH.items_unchanged(ds, snap)
    ITEM_CHANGES[change](ds)
    assert not _WATCH.items_unchanged(ds, snap)
    assert not _WATCH.items_unchanged(ds[:1], snap)  # another list of dicts
    assert _WATCH.watch_items([{}, 3]) is None


def test_state_mapping_change_drops_every_plan(device: str) -> None:
    """A param's state dict replaced in ``optimizer.state`` (checked once per step for the
    whole mapping): every group rebuilds, and both optimizers agree."""
    a, oa, b, ob = _pair(OPTIMIZERS["AdamW"], device)
    spy = Spy(oa)
    _steps(a, oa, b, ob, (1, 2))
    for opt, ps in ((oa, a), (ob, b)):
        opt.state[ps[0]] = copy.deepcopy(opt.state[ps[0]])
    spy.hits = 0
    _steps(a, oa, b, ob, (3, 4))
    assert spy.hits == 1  # step 3 rebuilt, step 4 reused


@needs_watch
@pytest.mark.parametrize("change", ["nothing", "grad replaced", "grad data replaced",
                                    "grad removed", "grad added", "grad shrunk in place",
                                    "grad dtype changed in place"])
def test_params_watch_with_grads_sees_grad_changes(change: str) -> None:
    """Snapshots taken with_grads (flat-buffer mode: the grads are kept views) also hold
    each grad object and its data pointer, numel, dtype and device."""
    ps = _watched()
    snap = _WATCH.watch_tensors(ps, True)
    ps[0].grad.add_(1.0)  # changed in place: the same
    if change == "grad replaced":
        ps[0].grad = ps[0].grad.clone()
    elif change == "grad data replaced":
        ps[1].grad.data = ps[1].grad.data.clone()
    elif change == "grad removed":
        ps[1].grad = None
    elif change == "grad added":
        ps[2].grad = torch.randn(3)
    elif change == "grad shrunk in place":  # the same object and data pointer
        ps[1].grad.data = ps[1].grad.data[:1]
    elif change == "grad dtype changed in place":
        ps[1].grad.data = ps[1].grad.data.view(torch.int16)
    same = _WATCH.tensors_grads(ps, snap, False)
    assert same is (True if change == "nothing" else None)
    grads = _WATCH.tensors_grads(ps, snap, True)
    assert (grads is not None) == (change == "nothing")


@needs_watch
def test_dense_grads_refuses_two_devices_sparse_and_fp16() -> None:
    """``_C.dense_grads``: None (the per-param loop decides) for grads on two devices, a
    sparse grad, or a float16 grad when not allowed; the grads themselves otherwise."""
    ps = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2).half()),
          torch.nn.Parameter(torch.randn(4))]
    ps[0].grad, ps[1].grad = torch.randn(3), torch.randn(2).half()
    got = _WATCH.dense_grads(ps, True)
    assert len(got) == 2 and got[0] is ps[0].grad and got[1] is ps[1].grad
    assert _WATCH.dense_grads(ps, False) is None  # float16 not allowed
    meta = torch.nn.Parameter(torch.empty(5, device="meta"))
    meta.grad = torch.empty(5, device="meta")
    assert _WATCH.dense_grads(ps + [meta], True) is None  # two devices
    ps[2].grad = torch.randn(4).to_sparse()
    assert _WATCH.dense_grads(ps, True) is None
    assert _WATCH.dense_grads([], True) == []


@needs_watch
def test_watch_functions_leak_no_references() -> None:
    """The C checks hand back new references only in what they return: repeated calls
    leave every object's reference count as it was."""
    import sys

    ps = _watched()
    ds = [{"step": torch.zeros(()), "exp_avg": torch.randn(3)}]
    snaps = (_WATCH.watch_tensors(ps, False), _WATCH.watch_tensors(ps, True),
             _WATCH.watch_items(ds))
    objs = ps + [p.grad for p in ps if p.grad is not None] + list(ds[0].values()) + ds
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(100):
        _WATCH.tensors_grads(ps, snaps[0], True)
        _WATCH.tensors_grads(ps, snaps[1], False)
        _WATCH.tensors_grads(ps[:1], snaps[0], True)  # a miss
        _WATCH.dense_grads(ps, True)
        _WATCH.dense_grads(ps, False)  # a miss (float16)
        _WATCH.items_unchanged(ds, snaps[2])
    assert [sys.getrefcount(o) for o in objs] == before
