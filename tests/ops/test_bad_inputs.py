"""Every op rejects bad arguments with an error naming the argument, and then has
modified nothing. Table-driven: each case builds fresh tensors and says which argument
the message must name. Run against the kernels and the pure-PyTorch reference."""

from __future__ import annotations

import pytest
import torch

import _reference
import mixprec
from _helpers import bits
from _op_cases import CASES


def _snapshot(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a.to_dense().clone() if a.is_sparse else a.clone())
        elif isinstance(a, (list, tuple)):
            out.extend(t.to_dense().clone() if t.is_sparse else t.clone() for t in a)
    return out


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_rejected_and_nothing_modified(device, impl, case):
    _, build, needle = case
    if device == "cpu" and case[0] in {"grads_other_device", "found_inf_on_cpu",
                                       "cnorm_grads_other_device",
                                       "inv_scale_on_cpu", "tracker_on_cpu"}:
        pytest.skip("cross-device cases need the tensors' device to be CUDA")
    name, args = build(device)
    fn = getattr(mixprec.ops if impl == "kernel" else _reference, name)
    before = _snapshot(args)
    with pytest.raises((RuntimeError, TypeError)) as info:
        fn(*args)
    message = str(info.value)
    assert needle in message, message
    assert "mixprec" in message, message
    for old, new in zip(before, _snapshot(args)):
        assert torch.equal(bits(old), bits(new))


def test_every_op_has_a_bad_input_case():
    """Every op of the table (csrc/op_table.h, _C.op_names) needs a case here."""
    from mixprec._extension import EXT as _C

    covered = {build("cpu")[0] for _, build, _ in CASES}
    missing = set(_C.op_names) - covered
    assert not missing, f"ops without a bad-input case: {sorted(missing)}"
