"""The optimizer variants, one row each, that tests/optim/test_variants.py runs through the
common checks (as torch's ``optim_db`` drives its test_optim.py).

A row says how to build mixprec's optimizer (``cls``, the hyper-parameters ``hyper`` that
torch.optim takes too, and the mixprec-only ``extra``), which params it steps (``dtype``,
and ``grad_dtype`` when the grads differ), which torch.optim class is its reference, and how
close it must stay after :data:`STEPS` steps:

* ``ref="torch"``: float32 params against ``torch.optim.<torch_cls>(foreach=False)`` on
  float32 copies, the same grads; params and moments within ``tol`` (relative error,
  ``_helpers.rel_err``).
* ``ref="float64"``: against the same torch.optim class run on float64 copies of the
  params with the grads in float64: torch's algorithm in float64, a reference with no
  rounding of its own. For 16-bit params with masters the float32 master is held to it
  and the param must be the master rounded to nearest; otherwise the param itself.

The tolerances are what each kind of row can promise: float32 rounding against torch's own
float32 step (1e-6), float32 masters against float64 (2e-5 over 30 steps), the block-wise
8-bit moments (their quantization error moves each step by a fraction of lr), and bfloat16
params rounded stochastically each step (a few bfloat16 spacings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import pytest
import torch

import mixprec.optim

#: steps of the reference comparison
STEPS = 30


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    cls: str  #: mixprec.optim.<cls>
    hyper: Dict[str, Any]  #: arguments torch.optim.<torch_cls> takes too
    dtype: torch.dtype = torch.float32  #: the params' dtype
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)  #: mixprec-only
    ref: str = "torch"  #: "torch" (float32 torch.optim) or "float64" (torch.optim on float64)
    tol: float = 1e-6  #: rel_err bound after STEPS steps
    torch_cls: Optional[str] = None  #: the reference class; default: cls
    grad_dtype: Optional[torch.dtype] = None  #: the grads' dtype; default: the params'
    compile: bool = False  #: also run the torch.compile(fullgraph=True) check

    def make(self, params: List[torch.Tensor]) -> torch.optim.Optimizer:
        return getattr(mixprec.optim, self.cls)(params, **self.hyper, **self.extra)

    def make_reference(self, params: List[torch.Tensor]) -> torch.optim.Optimizer:
        return getattr(torch.optim, self.torch_cls or self.cls)(params, foreach=False,
                                                                **self.hyper)

    @property
    def has_masters(self) -> bool:
        return self.dtype != torch.float32 and self.extra.get("master_weights", True)

    @property
    def eight_bit(self) -> bool:
        return self.extra.get("state_bits", 8 if self.cls.endswith("8bit") else 32) == 8


_ADAM = {"lr": 2e-3, "betas": (0.8, 0.99), "eps": 1e-6}
_ADAM_LOW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8}
_SGD = {"lr": 1e-2}
#: every param 8-bit (the default threshold would leave these small params at 32 bits)
_8BIT = {"state_bits": 8, "min_8bit_size": 0}
_SR = {"master_weights": False, "stochastic_rounding": True, "seed": 5}

VARIANTS = [
    # Adam: float32 against torch.optim.Adam
    Variant("adam-fp32", "Adam", _ADAM, compile=True),
    Variant("adam-fp32-wd-amsgrad", "Adam", {**_ADAM, "weight_decay": 0.1, "amsgrad": True}),
    Variant("adam-fp32-wd-maximize", "Adam", {**_ADAM, "weight_decay": 0.1, "maximize": True}),
    Variant("adam-fp32-bf16-grads", "Adam", _ADAM, grad_dtype=torch.bfloat16),
    # AdamW
    Variant("adamw-fp32-wd", "AdamW", {**_ADAM, "weight_decay": 0.1}),
    Variant("adamw-fp32-amsgrad-maximize", "AdamW",
            {**_ADAM, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
    Variant("adamw-fp32-beta1-below-half", "AdamW",  # torch's other lerp branch
            {"lr": 1e-2, "betas": (0.3, 0.9), "weight_decay": 0.02}),
    # 16-bit params with float32 masters, against float64
    Variant("adamw-fp16-masters", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.float16, ref="float64", tol=2e-5),
    Variant("adamw-bf16-masters", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, ref="float64", tol=2e-5, compile=True),
    Variant("adam-bf16-masters-amsgrad", "Adam",
            {**_ADAM_LOW, "weight_decay": 0.05, "amsgrad": True},
            dtype=torch.bfloat16, ref="float64", tol=2e-5),
    Variant("adamw-bf16-masters-fp32-grads", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, grad_dtype=torch.float32, ref="float64", tol=2e-5),
    # 8-bit moments, against float64
    Variant("adamw-fp32-8bit", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1}, extra=_8BIT,
            ref="float64", tol=5e-3),
    Variant("adam-fp32-8bit-wd-maximize", "Adam",
            {**_ADAM_LOW, "weight_decay": 0.05, "maximize": True}, extra=_8BIT,
            ref="float64", tol=5e-3),
    Variant("adamw8bit-bf16-masters", "AdamW8bit", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, extra={"min_8bit_size": 0}, torch_cls="AdamW",
            ref="float64", tol=5e-3),
    # split masters: bf16 params plus a 16-bit (float32 semantics) or 8-bit correction
    Variant("adamw-bf16-split16", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, extra={"master_correction_bits": 16}, ref="float64",
            tol=2e-5, compile=True),
    Variant("adamw-bf16-split8-fp32-grads", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, grad_dtype=torch.float32,
            extra={"master_correction_bits": 8}, ref="float64", tol=2e-3),
    Variant("adamw8bit-bf16-split8", "AdamW8bit", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, extra={"min_8bit_size": 0, "master_correction_bits": 8},
            torch_cls="AdamW", ref="float64", tol=5e-3, compile=True),
    Variant("sgd-bf16-split16-nesterov", "SGD",
            {"lr": 5e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
            dtype=torch.bfloat16, extra={"master_correction_bits": 16}, ref="float64",
            tol=2e-5),
    # bfloat16 params without masters, rounded stochastically, against float64
    Variant("adamw-bf16-stochastic-rounding", "AdamW", {**_ADAM_LOW, "weight_decay": 0.1},
            dtype=torch.bfloat16, extra=_SR, ref="float64", tol=5e-2),
    # SGD: float32 against torch.optim.SGD
    Variant("sgd-fp32", "SGD", _SGD),
    Variant("sgd-fp32-momentum-dampening-wd", "SGD",
            {**_SGD, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.05}),
    Variant("sgd-fp32-nesterov-wd-maximize", "SGD",
            {**_SGD, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05,
             "maximize": True}),
    Variant("sgd-fp32-fp16-grads", "SGD", {**_SGD, "momentum": 0.9},
            grad_dtype=torch.float16),
    # SGD: 16-bit params with masters, 8-bit momentum, stochastic rounding
    Variant("sgd-fp16-masters-nesterov", "SGD",
            {"lr": 5e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
            dtype=torch.float16, ref="float64", tol=2e-5),
    Variant("sgd-bf16-masters-momentum", "SGD", {"lr": 5e-2, "momentum": 0.9, "dampening": 0.1},
            dtype=torch.bfloat16, ref="float64", tol=2e-5),
    Variant("sgd-fp32-8bit-momentum", "SGD", {**_SGD, "momentum": 0.9, "weight_decay": 0.05},
            extra=_8BIT, ref="float64", tol=2e-2, compile=True),
    Variant("sgd-bf16-stochastic-rounding-momentum", "SGD", {**_SGD, "momentum": 0.9},
            dtype=torch.bfloat16, extra=_SR, ref="float64", tol=5e-2),
]


def params_of(variants: List[Variant]) -> List[Any]:
    """``pytest.mark.parametrize`` values: one per row, its name the test id."""
    return [pytest.param(v, id=v.name) for v in variants]
