"""torch.library.opcheck on every op, and the ops inside torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

import _reference
import mixprec
from _helpers import assert_bitwise_equal
from _op_cases import SAMPLES
from mixprec._extension import EXT as _C


@pytest.mark.parametrize(("op_name", "build"), [pytest.param(op, build, id=name)
                                                for name, op, build in SAMPLES])
def test_opcheck(device, op_name, build):
    args, kwargs = build(device)
    torch.library.opcheck(getattr(torch.ops.mixprec, op_name).default, args, kwargs)


def test_every_op_has_an_opcheck_sample():
    """Every op of the table (csrc/op_table.h, exported as _C.op_names) needs a sample."""
    sampled = {op for _, op, _ in SAMPLES}
    assert set(_C.op_names) == sampled, (
        f"without an opcheck sample: {sorted(set(_C.op_names) - sampled)}; "
        f"sampled but not in the op table: {sorted(sampled - set(_C.op_names))}")


def test_op_table_is_every_registered_op_with_every_entry():
    """The one list of the ops: what is registered, wrapped and given kernels."""
    table = list(_C.op_names)
    assert table and len(set(table)) == len(table)
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("mixprec::")}
    assert registered == set(table)
    assert set(mixprec.ops.__all__) == set(table)
    keys = ["CPU", "Autograd"] + (["CUDA"] if mixprec.has_cuda_kernels() else [])
    for op in table:
        assert callable(getattr(_reference, op)), op
        for key in keys:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mixprec::{op}", key), (op, key)


def test_torch_compile_fullgraph(device):
    """A whole scaler step (unscale+check, norm, update) compiled as one graph."""

    def step(grads, found_inf, scale, tracker):
        found_inf.zero_()
        inv = scale.double().reciprocal().float()
        norm = torch.ops.mixprec.unscale_and_norm_(grads, found_inf, inv, 2.0)
        torch.ops.mixprec.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 1)
        return norm * 1.0

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    grads = [torch.randn(1000, device=device) * 64, torch.randn(33, device=device) * 64]
    ref_grads = [g.clone() for g in grads]
    state = (torch.zeros((), device=device), torch.full((), 64.0, device=device),
             torch.zeros((), dtype=torch.int32, device=device))
    ref_state = tuple(t.clone() for t in state)
    out = compiled(grads, *state)
    expected = step(ref_grads, *ref_state)
    assert_bitwise_equal(out, expected)
    for a, b in zip(grads + list(state), ref_grads + list(ref_state)):
        assert_bitwise_equal(a, b)
    assert state[1].item() == 128.0  # clean step with interval 1 grew the scale

    grads[0][5] = float("inf")
    compiled(grads, *state)
    assert state[0].item() == 1.0 and state[1].item() == 64.0


def test_torch_compile_check_finite(device):
    @torch.compile(fullgraph=True)
    def has_nonfinite(tensors, found_inf):
        torch.ops.mixprec.check_finite_(tensors, found_inf)
        return found_inf + 0

    found = torch.zeros((), device=device)
    ts = [torch.randn(10, device=device), torch.randn(5, device=device)]
    assert has_nonfinite(ts, found).item() == 0.0
    ts[1][4] = float("nan")
    assert has_nonfinite(ts, found).item() == 1.0
