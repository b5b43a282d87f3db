"""A list an op writes may not hold the same tensor twice or overlapping views of one (an
element would be written twice): the CPU kernel, the CUDA launcher (through the emulation)
and the reference refuse it with the same message, naming both entries, before anything
changes. Disjoint views of one tensor are fine."""

from __future__ import annotations

from typing import Any, Callable, Dict

import pytest
import torch

import _cuda_emulation
from _helpers import assert_bitwise_equal


def _backends(op: str) -> Dict[str, Callable[..., Any]]:
    return _cuda_emulation.backends(op, reference=True)


def _grads(case: str) -> list:
    base = torch.randn(16)
    g = torch.randn(4)
    return {"same tensor": [torch.randn(3), g, g],
            "overlapping views": [base[:8], torch.randn(2), base[4:12]],
            "disjoint views": [base[:8], torch.randn(2), base[8:16]]}[case]


@pytest.mark.parametrize("case", ["same tensor", "overlapping views", "disjoint views"])
def test_unscale_refuses_a_tensor_written_twice(case):
    for name, fn in _backends("unscale_and_check_").items():
        grads = _grads(case)
        before = [t.clone() for t in grads]
        found, inv = torch.zeros(()), torch.tensor(0.5)
        if case == "disjoint views":
            fn(grads, found, inv)
            assert_bitwise_equal(grads[0], before[0] * 0.5, name)
            continue
        first, second = (1, 2) if case == "same tensor" else (0, 2)
        with pytest.raises(RuntimeError, match=rf"grads\[{first}\] and grads\[{second}\] share "
                                               "memory"):
            fn(grads, found, inv)
        for a, b in zip(grads, before):
            assert_bitwise_equal(a, b, f"{name} {case}")


def test_check_finite_reads_only_so_a_repeat_is_fine():
    g = torch.randn(4)
    for name, fn in _backends("check_finite_").items():
        found = torch.zeros(())
        fn([g, g], found)
        assert float(found) == 0.0, name


def test_an_optimizer_step_refuses_a_param_given_twice():
    p = torch.randn(5)
    for name, fn in _backends("fused_sgd_").items():
        before = p.clone()
        with pytest.raises(RuntimeError, match=r"params\[0\] and params\[1\] share memory"):
            fn([p, p], [torch.ones(5), torch.ones(5)], [], [], [torch.zeros(()),
               torch.zeros(())], torch.tensor(0.1), 0.0, 0.0, 0.0, False, False)
        assert_bitwise_equal(p, before, name)
