"""How the ops are entered: the wrappers of mixprec.ops call torch.ops.mixprec.* (tensor
subclasses, TorchFunctionModes and TorchDispatchModes see the op), and the Autograd-key kernels
(python/mixprec/ops/_autograd.py; not differentiable: written tensors must not require grad
under grad mode; version counters are bumped), which lean on torch helpers named here."""

from __future__ import annotations

import functools
import gc
import re
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import mixprec
from _helpers import assert_bitwise_equal
from _op_cases import sample
from mixprec._extension import EXT as _C
from mixprec.ops import _autograd


def _args(device="cpu"):
    g = torch.Generator().manual_seed(3)
    grads = [(torch.randn(n, generator=g) * 8).to(device, dt)
             for n, dt in ((5000, torch.float32), (70, torch.float16), (33, torch.bfloat16))]
    return grads, torch.zeros((), device=device), torch.full((), 0.125, device=device)


class _Logged(torch.Tensor):
    """A tensor subclass with __torch_function__: must go through torch.ops."""

    seen: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(str(func))
        return super().__torch_function__(func, types, args, kwargs or {})


class _FnMode(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class _DispatchLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_subclass_and_function_mode_see_the_op_once_through_the_wrapper():
    grads, found, inv = _args()
    _Logged.seen.clear()
    sub = [g.as_subclass(_Logged) for g in grads]
    mixprec.ops.unscale_and_check_(sub, found, inv)
    assert [s for s in _Logged.seen if "mixprec" in s] == ["mixprec.unscale_and_check_"]
    mode = _FnMode()
    with mode:
        mixprec.ops.check_finite_(grads, found)
    assert [s for s in mode.seen if "mixprec" in s] == ["mixprec.check_finite_"]


def test_dispatch_mode_sees_the_op_once():
    grads, found, inv = _args()
    with _DispatchLog() as log:
        mixprec.ops.unscale_and_check_(grads, found, inv)
    assert log.seen == ["mixprec.unscale_and_check_.default"]


def test_op_calls_leave_reference_counts_alone():
    grads, found, inv = _args()
    counts = [sys.getrefcount(g) for g in grads] + [sys.getrefcount(found)]
    for _ in range(50):
        mixprec.ops.unscale_and_check_(grads, found, inv)
        mixprec.ops.check_finite_and_norm_(grads, found, inv, 2.0)
    with pytest.raises(RuntimeError):
        mixprec.ops.unscale_and_check_(grads + [torch.ones(2, dtype=torch.int32)], found, inv)
    gc.collect()  # (the error's traceback held the call's frames)
    assert [sys.getrefcount(g) for g in grads] + [sys.getrefcount(found)] == counts


@pytest.mark.parametrize("entry", ["mixprec.ops", "torch.ops"])
def test_written_tensor_requiring_grad_is_an_error_under_grad_mode(entry):
    grads, found, inv = _args()
    grads[1].requires_grad_(True)
    before = [g.detach().clone() for g in grads]
    fn = (mixprec.ops.unscale_and_check_ if entry == "mixprec.ops"
          else torch.ops.mixprec.unscale_and_check_)
    with pytest.raises(RuntimeError, match=r"unscale_and_check_: grads\[1\] requires grad"):
        fn(grads, found, inv)
    for g, b in zip(grads, before):
        assert_bitwise_equal(g.detach(), b)
    with torch.no_grad():  # what GradScaler does
        fn(grads, found, inv)
    assert_bitwise_equal(grads[1].detach(), (before[1].float() * 0.125).half())
    # read-only arguments may require grad; the result does not
    n = torch.ops.mixprec.check_finite_and_norm_(grads, found, inv, 2.0)
    assert not n.requires_grad


def test_written_tensors_get_their_version_bumped():
    grads, found, inv = _args()
    v = [g._version for g in grads] + [found._version, inv._version]
    mixprec.ops.unscale_and_check_(grads, found, inv)
    assert [g._version for g in grads] == [x + 1 for x in v[:3]]
    assert found._version == v[3] + 1 and inv._version == v[4]  # inv_scale is read only
    v_read = [g._version for g in grads]
    mixprec.ops.check_finite_(grads, found)
    assert [g._version for g in grads] == v_read
    # autograd notices an op that changed a tensor saved for backward
    w = torch.randn(4, requires_grad=True)
    saved = torch.randn(4)
    loss = (w * saved).sum()
    mixprec.ops.unscale_and_check_([saved], torch.zeros(()), torch.full((), 0.5))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _positional(op, args, kwargs):
    """The sample's arguments, all positional (as the wrappers pass them)."""
    schema = getattr(torch.ops.mixprec, op).default._schema
    rest = [kwargs[a.name] if a.name in kwargs else a.default_value
            for a in schema.arguments[len(args):]]
    return schema, [*args, *rest]


def _clone(args):
    return [[t.clone() for t in a] if isinstance(a, list)
            else a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


@pytest.mark.parametrize("op", list(_C.op_names))
def test_every_op_wrapper_matches_torch_ops(op):
    # The wrapper (its parameters passed on in the schema's order), with grad mode on, leaves
    # every argument and the result as torch.ops does under torch.no_grad().
    _, args = _positional(op, *sample(op)("cpu"))
    wrapper_args, ops_args = _clone(args), _clone(args)
    out_wrapper = getattr(mixprec.ops, op)(*wrapper_args)
    with torch.no_grad():
        out_ops = getattr(torch.ops.mixprec, op)(*ops_args)
    a, b = list(_tensors([out_wrapper, *wrapper_args])), list(_tensors([out_ops, *ops_args]))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_bitwise_equal(x, y)


@pytest.mark.parametrize("grad_mode", [True, False])
@pytest.mark.parametrize("op", list(_C.op_names))
def test_every_op_bumps_the_version_of_each_tensor_it_writes(op, grad_mode):
    schema, args = _positional(op, *sample(op)("cpu"))
    written = [list(_tensors([args[i]])) for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    read = [list(_tensors([args[i]])) for i, a in enumerate(schema.arguments)
            if a.alias_info is None]
    assert sum(map(len, written)) > 0, op
    before = [[t._version for t in ts] for ts in written + read]
    with torch.set_grad_enabled(grad_mode):
        getattr(torch.ops.mixprec, op)(*args)
    after = [[t._version for t in ts] for ts in written + read]
    bumps = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
    assert bumps == [[1] * len(ts) for ts in written] + [[0] * len(ts) for ts in read]


@pytest.mark.parametrize("grad_mode", [True, False])
def test_the_kernels_own_copies_run_below_autograd(grad_mode):
    # Strided written tensors, which the CPU kernels copy back into in place: bumped once
    # (by the Autograd-key kernel), not again by the copy.
    grads, params = [torch.randn(40)[::2]], [torch.randn(9, 4).t()]
    before = [grads[0]._version, params[0]._version]
    with torch.set_grad_enabled(grad_mode):
        mixprec.ops.unscale_and_check_(grads, torch.zeros(()), torch.full((), 0.5))
        mixprec.ops.fused_sgd_(params, [torch.randn(4, 9)], [], [], [torch.zeros(())],
                               torch.tensor(0.1), 0.0, 0.0, 0.0, False, False)
    assert [grads[0]._version, params[0]._version] == [v + 1 for v in before]


@pytest.mark.parametrize("op", list(_C.op_names))
def test_every_op_has_the_no_grad_autograd_kernel(op):
    # The first written floating-point argument requiring grad is refused, by name.
    schema, args = _positional(op, *sample(op)("cpu"))
    for i, a in enumerate(schema.arguments):
        t = args[i][0] if isinstance(args[i], list) and args[i] else args[i]
        if (a.alias_info is not None and a.alias_info.is_write
                and isinstance(t, torch.Tensor) and t.is_floating_point()):
            t.requires_grad_(True)
            break
    else:
        pytest.fail(f"{op} writes no floating-point tensor of its sample")
    with pytest.raises(RuntimeError, match=rf"mixprec\.{op}: {a.name}.* requires grad"):
        getattr(torch.ops.mixprec, op)(*args)


def test_each_op_has_one_autograd_kernel_registered_from_python():
    # the op library does not compile csrc/autograd.cpp (libmixprec's C++ kernels): a
    # second registration would show as an inactive line
    for op in _C.op_names:
        lines = [line for line in torch._C._dispatch_dump(f"mixprec::{op}").splitlines()
                 if line.startswith("Autograd")]
        assert len(lines) == 1 and "mixprec/ops/_autograd.py" in lines[0], (op, lines)


def test_the_autograd_kernels_lean_on_these_torch_helpers():
    # Named here so that a torch that drops or changes one fails loudly (its import of
    # mixprec fails too, naming the helper: the test below).
    assert _autograd.HELPERS == (
        "torch._C._AutoDispatchBelowADInplaceOrView", "torch._C._after_ADInplaceOrView_keyset",
        "torch._ops.OpOverload.redispatch", "torch.autograd.graph.increment_version")
    x, z = torch.ones(2, requires_grad=True), torch.zeros(2)
    with torch._C._AutoDispatchBelowADInplaceOrView():  # below autograd and ADInplaceOrView:
        y = x * 2  # nothing recorded
        z.add_(1)  # no version bump
    assert not y.requires_grad and z._version == 0
    assert (x * 2).requires_grad
    keys = torch._C.DispatchKey
    after = torch._C._after_ADInplaceOrView_keyset
    assert after.has(keys.CPU) and after.has(keys.CUDA) and after.has(keys.Python)
    assert not after.has(keys.AutogradCPU) and not after.has(keys.ADInplaceOrView)
    found = torch.zeros(())
    op = torch.ops.mixprec.check_finite_.default
    torch._ops.OpOverload.redispatch(op, torch._C.DispatchKeySet(keys.CPU),
                                     [torch.tensor([float("inf")])], found)
    assert found.item() == 1.0
    a, b = torch.zeros(2), torch.zeros(3)
    torch.autograd.graph.increment_version([a, b])  # a list: one call for all
    assert (a._version, b._version) == (1, 1)


@pytest.mark.parametrize("helper", _autograd.HELPERS)
def test_a_missing_helper_fails_the_import_naming_it(helper, monkeypatch):
    owner, name = helper.rsplit(".", 1)
    monkeypatch.delattr(functools.reduce(getattr, owner.split(".")[1:], torch), name)
    with pytest.raises(ImportError, match=rf"torch {re.escape(torch.__version__)} has no "
                                          rf"{re.escape(helper)}, which mixprec's Autograd"):
        _autograd._helper(helper)
    if helper == _autograd.HELPERS[0]:  # and the import itself, in a fresh process
        code = f"import torch\ndel {helper}\nimport mixprec"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode != 0 and f"has no {helper}" in proc.stderr, proc.stderr[-2000:]
