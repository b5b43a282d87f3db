"""One signature truth: every ``mixprec.ops`` wrapper and every ``_reference`` function has
its op's schema arguments: the same names, in the same order, with the same defaults (an
argument without a default in the schema has none in Python either)."""

from __future__ import annotations

import inspect
from typing import Any, List, Tuple

import pytest
import torch

import _reference
import mixprec
from _helpers import REPO

REQUIRED = "<no default>"


def _schema_args(name: str) -> List[Tuple[str, Any]]:
    schema = getattr(torch.ops.mixprec, name).default._schema
    return [(a.name, a.default_value if a.has_default_value() else REQUIRED)
            for a in schema.arguments]


def _python_args(fn: Any) -> List[Tuple[str, Any]]:
    return [(k, REQUIRED if v.default is inspect.Parameter.empty else v.default)
            for k, v in inspect.signature(fn).parameters.items()]


def _op_names() -> List[str]:
    from mixprec._extension import EXT as _C

    return list(_C.op_names) if _C is not None else []


@pytest.mark.parametrize("where", ["mixprec.ops", "tests/_reference.py"])
@pytest.mark.parametrize("name", _op_names())
def test_python_signature_is_the_schema(name, where):
    module = mixprec.ops if where == "mixprec.ops" else _reference
    assert _python_args(getattr(module, name)) == _schema_args(name), f"{where}.{name}"


def test_the_check_sees_a_changed_default(monkeypatch):
    """The comparison itself: a wrapper whose default differs from the schema's fails."""
    def fused_sgd_(params, grads, momentum_buffers, master_params, state_steps, lr,
                   weight_decay, momentum, dampening, nesterov, maximize, grad_scale=None,
                   found_inf=None, clip_coef=None, stochastic_rounding=True, seed=0):
        pass

    assert _python_args(fused_sgd_) != _schema_args("fused_sgd_")
    assert _python_args(mixprec.ops.fused_sgd_) == _schema_args("fused_sgd_")


def test_cpp_optimizers_name_every_op_argument() -> None:
    """The C++ optimizers (csrc/api/optim.cpp) call the fused ops with every argument
    named, ``/*name=*/value``, in the schema's order and with the schema's names."""
    import re

    src = (REPO / "csrc" / "api" / "optim.cpp").read_text()
    for op in ("fused_adam_", "fused_sgd_"):
        call = src[src.index(f"mixprec::{op}("):]
        call = call[:call.index(");") + 1]
        named = re.findall(r"/\*(\w+)=\*/", call)
        assert named == [n for n, _ in _schema_args(op)], op
