"""Shared helpers for the GradScaler tests.

Used by tests/test_grad_scaler*.py, test_scaler*.py and test_patch*.py.

Behaviour shared with torch is parametrized over both scaler classes, so each
such test also runs against ``torch.amp.GradScaler`` as a control.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch

import mixprec

HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

SCALERS = [
    pytest.param(mixprec.GradScaler, id="mixprec"),
    pytest.param(torch.amp.GradScaler, id="torch"),
]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]

INF = float("inf")
NAN = float("nan")


def make_scaler(cls: type, device: str, **kwargs: Any) -> torch.amp.GradScaler:
    return cls(device, **kwargs)


def two_layer(device: str, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device)


def scaling_case(
    device: str,
    optimizer_ctor: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
    optimizer_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
) -> tuple[Any, ...]:
    """A control model and an identical model to train with scaling, their
    optimizers, 4 batches of random data, the loss and the iteration (2) at
    which an inf is injected."""
    kwargs = {"lr": 1.0} if optimizer_kwargs is None else optimizer_kwargs
    control = two_layer(device, seed)
    scaling = copy.deepcopy(control)
    opt_control = optimizer_ctor(control.parameters(), **kwargs)
    opt_scaling = optimizer_ctor(scaling.parameters(), **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    data = [
        (torch.randn(8, 8, generator=g).to(device), torch.randn(8, 8, generator=g).to(device))
        for _ in range(4)
    ]
    return control, scaling, opt_control, opt_scaling, data, torch.nn.MSELoss(), 2


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module, atol: float, rtol: float = 1e-5):
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=rtol)
        if pa.grad is not None or pb.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, atol=atol, rtol=rtol)


def assert_same_opt_state(oa: torch.optim.Optimizer, ob: torch.optim.Optimizer, atol: float):
    for pa, pb in zip(
        [p for g in oa.param_groups for p in g["params"]],
        [p for g in ob.param_groups for p in g["params"]],
    ):
        sa, sb = oa.state[pa], ob.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], atol=atol, rtol=1e-5)


class RecordingOptimizer(torch.optim.SGD):
    """SGD that records its step calls and supports AMP scaling itself.

    With ``supports_amp=True`` it plays a fused optimizer: it reads
    ``self.grad_scale``/``self.found_inf`` at step time, unscales, and skips the
    update when found_inf is set (on the device, no sync).
    """

    def __init__(self, params: Any, supports_amp: bool = False, **kwargs: Any) -> None:
        super().__init__(params, lr=kwargs.pop("lr", 0.1), **kwargs)
        self.calls: list[dict[str, Any]] = []
        if supports_amp:
            self._step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Any = None, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        gs = getattr(self, "grad_scale", "absent")
        fi = getattr(self, "found_inf", "absent")
        self.calls.append(
            {
                "closure": closure,
                "args": args,
                "kwargs": kwargs,
                "grad_scale": gs.clone() if isinstance(gs, torch.Tensor) else gs,
                "found_inf": fi.clone() if isinstance(fi, torch.Tensor) else fi,
            }
        )
        if getattr(self, "_step_supports_amp_scaling", False):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad if gs is None or gs == "absent" else p.grad / gs
                    if isinstance(fi, torch.Tensor):
                        g = torch.where(fi != 0, torch.zeros_like(g), g)
                    p.add_(g, alpha=-group["lr"])
            return "stepped"
        super().step()
        return "stepped"
