"""capture_step's usage errors name the argument (and a body without
``scaler.update()`` gets the documented CaptureError at the default warmup, not torch's
message from inside the scaler); op lists with a meta tensor say so."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import mixprec
from mixprec.capture import CaptureError, capture_step


def _setup() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
    return model, opt, scaler


def test_a_body_without_update_is_refused_at_the_default_warmup() -> None:
    """Before: torch's "step() has already been called since the last update()"."""
    model, opt, scaler = _setup()

    def body(x: Tensor) -> Tensor:
        opt.zero_grad(set_to_none=False)
        loss = model(x).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        return loss.detach()

    step = capture_step(body, (torch.ones(3, 4),), optimizers=[opt], scaler=scaler)
    with pytest.raises(CaptureError, match=r"end the step body with scaler.update\(\)"):
        step(torch.ones(3, 4))


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"optimizers": "opt"}, TypeError, "optimizers must be a list .* got a AdamW"),
    ({"modules": "model"}, TypeError, "modules must be a list .* got a Linear"),
    ({"warmup": -1}, ValueError, "warmup must be >= 0, got -1"),
    ({"warmup": 1.5}, TypeError, "warmup must be an int"),
], ids=["optimizers=opt", "modules=model", "warmup=-1", "warmup=1.5"])
def test_capture_step_names_the_argument(kwargs: Any, exc: type, match: str) -> None:
    """Before: "'AdamW' object is not iterable"; one message for the ints."""
    model, opt, scaler = _setup()
    given = {"optimizers": [opt], "scaler": scaler}
    for k, v in kwargs.items():
        given[k] = {"opt": opt, "model": model}.get(v, v) if isinstance(v, str) else v
    with pytest.raises(exc, match=match):
        capture_step(lambda x: x, (torch.ones(1),), **given)


def test_a_meta_tensor_in_an_op_list_is_named() -> None:
    """Before: torch's "no fake impl" advice."""
    found_inf = torch.zeros(1)
    with pytest.raises(RuntimeError, match=r"unscale_and_check_: grads\[1\] is on the 'meta'"):
        mixprec.ops.unscale_and_check_([torch.ones(2), torch.ones(2, device="meta")],
                                       found_inf, torch.ones(1))
    assert float(found_inf) == 0.0
