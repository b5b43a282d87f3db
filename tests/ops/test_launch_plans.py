"""Sequences of optimizer calls through the emulated CUDA launchers, each call against the
CPU kernel.

The CUDA launchers build their launch plan from every call's tensors (csrc/cuda/launch_plan.h
``LaunchPlanner``); these tests run them (``tests/_cuda_emulation.py``) call after call on
the same state: repeated steps, the device scalars (found_inf, lr) read at every call, the
checks run at every call, and random sequences of calls whose tensors change in between (a
tensor replaced, the same address with another size, dtype or strides, tensors added,
removed or reordered, a buffer freed and reallocated), so that nothing of one call's
tensors is carried into the next.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _cuda_emulation
from _helpers import assert_bitwise_equal
from _helpers import ulps as ulp_distance

# (MIXPREC_BUILD_TEST_EXT=1, as make test sets it: the tests run, and fail without it)
pytestmark = pytest.mark.skipif(
    not _cuda_emulation.available() and os.environ.get("MIXPREC_BUILD_TEST_EXT") != "1",
    reason="needs the test library mixprec/_cuda_emulation (MIXPREC_BUILD_TEST_EXT=1)",
)

CAP = 64  # capacity of the buffers the tensors view (room for resizes in place)


def emu() -> Any:
    return _cuda_emulation.ops()


def _view(buf: torch.Tensor, dtype: torch.dtype, n: int, stride: int = 1) -> torch.Tensor:
    """n elements of `dtype` at the start of `buf` (the same data pointer for any n,
    dtype or stride)."""
    flat = buf.view(dtype)
    return flat[: n * stride : stride] if stride > 1 else flat[:n]


def _fill(t: torch.Tensor, gen: torch.Generator, positive: bool = False) -> None:
    v = torch.rand(t.shape, generator=gen) if positive else torch.randn(t.shape, generator=gen)
    t.copy_(v)


# ---------------------------------------------------------------------------
# The optimizer state, kept twice: `emu` (run by the emulated CUDA launcher) and
# `cpu` (the CPU kernel), each tensor a view of its own buffer, same values.

LISTS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "master_params",
         "state_steps")


class OptState:
    """fused_adam_ / fused_sgd_ arguments as views of per-tensor buffers, twice."""

    def __init__(self, sizes: List[int], pdt: torch.dtype, gdt: torch.dtype, masters: bool,
                 amsgrad: bool, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.pdt, self.masters, self.amsgrad = pdt, masters, amsgrad
        self.sides: Dict[str, Dict[str, List[torch.Tensor]]] = {"emu": {}, "cpu": {}}
        self.bufs: Dict[str, Dict[str, List[torch.Tensor]]] = {"emu": {}, "cpu": {}}
        for side in self.sides:
            for name in LISTS:
                self.sides[side][name] = []
                self.bufs[side][name] = []
        for n in sizes:
            self.append(n, gdt)

    def used(self, name: str) -> bool:
        return {"max_exp_avg_sqs": self.amsgrad, "master_params": self.masters}.get(name, True)

    def dtype_of(self, name: str, gdt: torch.dtype) -> torch.dtype:
        return {"params": self.pdt, "grads": gdt}.get(name, torch.float32)

    def append(self, n: int, gdt: torch.dtype) -> None:
        for name in LISTS:
            if not self.used(name):
                continue
            shape_n = 1 if name == "state_steps" else n
            dtype = self.dtype_of(name, gdt)
            for side in ("emu", "cpu"):
                buf = torch.zeros(CAP)  # float32: room for CAP elements of any dtype
                self.bufs[side][name].append(buf)
                t = _view(buf, dtype, shape_n)
                if name == "state_steps":
                    t = t.view(())
                self.sides[side][name].append(t)
        self.refill(len(self.sides["emu"]["params"]) - 1)

    def refill(self, i: int) -> None:
        """Fresh, equal values for param i on both sides."""
        for name in LISTS:
            if not self.used(name):
                continue
            a = self.sides["emu"][name][i]
            if name == "state_steps":
                a.fill_(float(torch.randint(0, 4, (), generator=self.gen)))
            else:
                _fill(a, self.gen, positive=name in ("exp_avg_sqs", "max_exp_avg_sqs"))
            if name == "master_params":  # the param is its master, rounded
                self.sides["emu"]["params"][i].copy_(a)
            self.sides["cpu"][name][i].copy_(a)
        if self.masters:
            self.sides["cpu"]["params"][i].copy_(self.sides["emu"]["params"][i])

    def lists(self, side: str) -> List[List[torch.Tensor]]:
        d = self.sides[side]
        return [d[name] if self.used(name) else [] for name in LISTS]

    def sync(self) -> None:
        """cpu := emu (each step starts from equal values)."""
        for name in LISTS:
            for a, b in zip(self.sides["emu"][name], self.sides["cpu"][name]):
                b.copy_(a)

    def check_equal(self, ulps: int = 1) -> None:
        """Equal results, and nothing written past any tensor's last element."""
        for name in LISTS:
            sides = zip(self.sides["emu"][name], self.sides["cpu"][name],
                        self.bufs["emu"][name], self.bufs["cpu"][name])
            for i, (a, b, buf_a, buf_b) in enumerate(sides):
                assert a.dtype == b.dtype and a.shape == b.shape, (name, i)
                assert ulp_distance(a, b) <= ulps, (name, i)
                # the bytes of the buffer beyond the view: untouched on both sides
                end = 0
                if a.numel() > 0:
                    last = sum((n - 1) * st for n, st in zip(a.shape, a.stride()))
                    end = (a.storage_offset() + last + 1) * a.element_size()
                assert torch.equal(buf_a.view(torch.uint8)[end:], buf_b.view(torch.uint8)[end:])


def adam(fn: Callable[..., Any], lists: List[List[torch.Tensor]], amsgrad: bool,
         skip: bool = False, lr: float = 1e-2, sr: bool = False, beta1: float = 0.9,
         found_inf: Optional[torch.Tensor] = None) -> None:
    """fn (an emulated or a CPU fused_adam_) with grad_scale 64, clip_coef 0.75."""
    found = torch.full((1,), float(skip)) if found_inf is None else found_inf
    fn(*lists, torch.tensor(lr), beta1, 0.999, 0.01, 1e-8, amsgrad, False, True,
       torch.full((1,), 64.0), found, torch.full((1,), 0.75), sr, 7)


def adam_call(s: OptState, side: str, skip: bool = False, lr: float = 1e-2,
              sr: bool = False) -> None:
    fn = emu().fused_adam_ if side == "emu" else torch.ops.mixprec.fused_adam_
    adam(fn, s.lists(side), s.amsgrad, skip=skip, lr=lr, sr=sr)


def sgd_call(s: OptState, side: str, momentum: float = 0.9) -> None:
    fn = emu().fused_sgd_ if side == "emu" else torch.ops.mixprec.fused_sgd_
    lists = s.lists(side)
    fn(lists[0], lists[1], lists[2] if momentum else [], lists[5], lists[6],
       torch.tensor(0.05, dtype=torch.float64), 1e-2, momentum, 0.0, False, False,
       torch.full((1,), 4.0), torch.zeros(1), None, False, 0)


def step_both(s: OptState, call: Callable[..., None] = adam_call, **kw: Any) -> None:
    """One step on both sides, then the comparison and the sync."""
    call(s, "emu", **kw)
    call(s, "cpu", **kw)
    s.check_equal()
    s.sync()


# ---------------------------------------------------------------------------
# Repeated calls with the same tensors.

@pytest.mark.parametrize("pdt,gdt,masters,amsgrad", [
    (torch.float32, torch.float32, False, False),
    (torch.float16, torch.float16, True, True),
    (torch.bfloat16, torch.float32, True, False),
])
def test_adam_repeated_calls_match_the_cpu_kernel(pdt: torch.dtype, gdt: torch.dtype,
                                                  masters: bool, amsgrad: bool) -> None:
    s = OptState([5, 17, 0, 33], pdt, gdt, masters, amsgrad)
    for _ in range(4):
        step_both(s)


def test_sgd_repeated_calls_match_the_cpu_kernel() -> None:
    s = OptState([5, 17, 0, 33], torch.float16, torch.float16, True, amsgrad=False)
    for _ in range(3):
        step_both(s, sgd_call)


def test_scalars_are_read_every_call() -> None:
    # lr, found_inf and the rest are read on the device every call
    s = OptState([5, 17, 33], torch.float16, torch.float16, True, amsgrad=False)
    step_both(s)
    before = {k: [t.clone() for t in v] for k, v in s.sides["emu"].items()}
    step_both(s, skip=True)  # found_inf set: nothing changes, step counts included
    for k, v in s.sides["emu"].items():
        for x, y in zip(v, before[k]):
            assert_bitwise_equal(x, y)
    step_both(s, lr=0.5)


# ---------------------------------------------------------------------------
# Errors after good calls: the checks of every call run.

def test_bad_input_after_good_calls_raises_the_cpu_error() -> None:
    s = OptState([6, 12], torch.float32, torch.float32, False, amsgrad=False)
    step_both(s)
    step_both(s)

    def both_raise(change: Callable[[List[List[torch.Tensor]]], None]) -> str:
        """The lists with `change` applied: both kernels raise the same error."""
        msgs = []
        for side, fn in (("emu", emu().fused_adam_), ("cpu", torch.ops.mixprec.fused_adam_)):
            lists = [list(x) for x in s.lists(side)]
            change(lists)
            with pytest.raises(RuntimeError) as err:
                adam(fn, lists, False)
            msgs.append(str(err.value).splitlines()[0])
        assert msgs[0] == msgs[1]
        return msgs[0]

    def reshaped_grad(lists: List[List[torch.Tensor]]) -> None:
        lists[1][1] = lists[1][1].view(3, 4)  # same address and numel, another shape

    def half_state(lists: List[List[torch.Tensor]]) -> None:
        t = lists[2][0]
        lists[2][0] = t.view(torch.float16)[: t.numel()]  # same address, float16

    def expanded_param(lists: List[List[torch.Tensor]]) -> None:
        lists[0][0] = lists[0][0][:1].expand(6)  # same address, stride 0

    def amsgrad_list(lists: List[List[torch.Tensor]]) -> None:
        lists[4] = [t.clone() for t in lists[3]]  # max_exp_avg_sqs without amsgrad

    assert "grads[1]" in both_raise(reshaped_grad)
    assert "exp_avgs[0]" in both_raise(half_state)
    assert "params[0]" in both_raise(expanded_param)
    assert "max_exp_avg_sqs" in both_raise(amsgrad_list)
    # a bad hyper-parameter with the same tensors
    with pytest.raises(RuntimeError, match="beta1"):
        adam(emu().fused_adam_, s.lists("emu"), False, beta1=1.5)
    # a bad scalar with the same tensors: found_inf of two elements
    with pytest.raises(RuntimeError, match="found_inf"):
        adam(emu().fused_adam_, s.lists("emu"), False, found_inf=torch.zeros(2))
    # nothing was modified, and the good call still matches the CPU kernel
    step_both(s)


# ---------------------------------------------------------------------------
# Random sequences of changes.

MUTATIONS = ["none", "none", "replace", "grow", "dtype", "add", "remove", "reorder",
             "swap-slots", "strided", "contiguous", "realloc", "skip", "lr"]


def _mutate(s: OptState, kind: str, i: int, n: int) -> Dict[str, Any]:
    """Applies one change to both sides; returns the call's keyword arguments."""
    count = len(s.sides["emu"]["params"])
    i = i % max(count, 1)
    tensors = [name for name in LISTS if s.used(name) and name != "state_steps"]
    if kind == "replace" and count:
        name = tensors[n % len(tensors)]
        for side in ("emu", "cpu"):
            s.sides[side][name][i] = s.sides[side][name][i].clone()
    elif kind in ("grow", "strided", "contiguous") and count:
        numel = 1 + n % 30
        stride = 2 if kind == "strided" else 1
        for side in ("emu", "cpu"):
            for name in tensors:
                old = s.sides[side][name][i]
                s.sides[side][name][i] = _view(s.bufs[side][name][i], old.dtype,
                                               numel if kind != "contiguous" else old.numel(),
                                               stride)
        s.refill(i)
    elif kind == "dtype" and count:
        dtype = (torch.float32, torch.float16, torch.bfloat16)[n % 3]
        for side in ("emu", "cpu"):
            old = s.sides[side]["grads"][i]
            s.sides[side]["grads"][i] = _view(s.bufs[side]["grads"][i], dtype, old.numel())
        s.refill(i)
    elif kind == "add" and count < 6:
        s.append(n % 40, (torch.float32, torch.float16)[n % 2])
    elif kind == "remove" and count > 1:
        for side in ("emu", "cpu"):
            for name in LISTS:
                if s.used(name):
                    del s.sides[side][name][i]
                    del s.bufs[side][name][i]
    elif kind == "reorder" and count > 1:
        j = (i + 1 + n) % count
        for side in ("emu", "cpu"):
            for name in LISTS:
                if s.used(name):
                    for d in (s.sides[side], s.bufs[side]):
                        d[name][i], d[name][j] = d[name][j], d[name][i]
    elif kind == "swap-slots" and count:
        for side in ("emu", "cpu"):
            for d in (s.sides[side], s.bufs[side]):
                d["exp_avgs"][i], d["exp_avg_sqs"][i] = d["exp_avg_sqs"][i], d["exp_avgs"][i]
        s.refill(i)
    elif kind == "realloc" and count:
        for side in ("emu", "cpu"):
            for name in tensors:
                old = s.sides[side][name][i]
                shape, dtype, stride = old.shape, old.dtype, old.stride()
                del old  # free the tensor and its buffer, then allocate anew
                s.sides[side][name][i] = s.bufs[side][name][i] = torch.empty(0)
                s.bufs[side][name][i] = torch.zeros(CAP)
                s.sides[side][name][i] = torch.as_strided(
                    s.bufs[side][name][i].view(dtype), shape, stride)
        s.refill(i)
    return {"skip": kind == "skip", "lr": 0.3 if kind == "lr" else 1e-2}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    config=st.sampled_from([
        (torch.float32, False, False), (torch.float16, True, True),
        (torch.bfloat16, True, False), (torch.bfloat16, False, True),
    ]),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    steps=st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 5),
                             st.integers(0, 100)), min_size=1, max_size=8),
)
def test_random_changes_match_the_cpu_kernel(
        config: Tuple[torch.dtype, bool, bool], sizes: List[int],
        steps: List[Tuple[str, int, int]]) -> None:
    pdt, masters, amsgrad = config
    s = OptState(sizes, pdt, torch.float32, masters, amsgrad)
    step_both(s)
    for kind, i, n in steps:
        kw = _mutate(s, kind, i, n)
        step_both(s, **kw)
