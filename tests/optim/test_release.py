"""Gradient release (``mixprec.optim.release_gradients``): params stepped in buckets during
backward, their grads freed at once; the bits of the run without release; the settings
that cannot be correct refused with nothing changed."""

from __future__ import annotations

import copy
import os
import tempfile
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.distributed as dist
from torch import nn

import mixprec
from _helpers import assert_bitwise_equal
from mixprec.optim.release import GradientRelease, release_gradients


def _model() -> nn.Module:
    """bf16 layers (float32 masters) beside float32 ones; weights big enough for 8-bit
    state at ``min_8bit_size=256``."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                      nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 4))
    m[2].to(torch.bfloat16)
    m[4].to(torch.bfloat16)
    return m


class _Cast(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.inner:
            if isinstance(layer, nn.Linear):
                x = x.to(layer.weight.dtype)
            x = layer(x)
        return x.float()


OPTIMIZERS: Dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw8bit": lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=256),
    "adamw-split16": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, master_correction_bits=16),
    "adamw8bit-split8": lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=256,
                                                           master_correction_bits=8),
    "sgd": lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "sgd8bit": lambda ps: mixprec.optim.SGD8bit(ps, lr=1e-2, momentum=0.9, min_8bit_size=256),
}


def _train(make: Callable[[Any], torch.optim.Optimizer], bucket_bytes: int | None,
           steps: int = 4) -> tuple:
    model = _Cast(_model())
    opt = make(model.parameters())
    alive: List[int] = []
    for p in model.parameters():  # grads alive each time one appears (before release's hook)
        p.register_post_accumulate_grad_hook(lambda _p: alive.append(sum(
            q.grad.numel() * q.grad.element_size() for q in model.parameters()
            if q.grad is not None)))
    handle = None if bucket_bytes is None else release_gradients(model, opt,
                                                                 bucket_bytes=bucket_bytes)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 16, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt, handle, max(alive)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bucket_bytes", [1, 4096, 1 << 30])
def test_release_gives_the_bits_of_the_run_without(name: str, bucket_bytes: int) -> None:
    make = OPTIMIZERS[name]
    ref_model, ref_opt, _, ref_peak = _train(make, None)
    model, opt, handle, peak = _train(make, bucket_bytes)
    for (n, a), b in zip(model.named_parameters(), ref_model.parameters()):
        assert_bitwise_equal(a.detach(), b.detach(), n)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        st, ref = opt.state[p], ref_opt.state[q]
        assert set(st) == set(ref)
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                assert_bitwise_equal(v, ref[key], f"{name} {key}")
            else:
                assert v == ref[key], key
    if "8bit" in name:  # the weights' moments are 8-bit codes
        assert any(v.dtype == torch.uint8 for st in opt.state.values() for v in st.values()
                   if isinstance(v, torch.Tensor))
    assert isinstance(handle, GradientRelease)
    n_params = len(list(model.parameters()))
    if bucket_bytes == 1:  # every param its own bucket, stepped and freed during backward
        assert handle.buckets_stepped == 4 * n_params
        assert peak < ref_peak
    elif bucket_bytes == 1 << 30:  # one bucket, never full: the loop's step() does it all
        assert handle.buckets_stepped == 0 and peak == ref_peak
    else:
        assert 0 < handle.buckets_stepped < 4 * n_params and peak <= ref_peak


def test_grads_are_freed_during_backward_and_step_takes_the_rest() -> None:
    model = _Cast(_model())
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    release_gradients(model, opt, bucket_bytes=1)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(float(opt.state[p]["step"]) == 1 for p in model.parameters())
    opt.step()  # nothing left: no param stepped twice
    assert all(float(opt.state[p]["step"]) == 1 for p in model.parameters())
    big = _Cast(_model())
    opt = mixprec.optim.AdamW(big.parameters(), lr=1e-2)
    release_gradients(big, opt, bucket_bytes=1 << 30)
    big(torch.randn(8, 16)).pow(2).mean().backward()
    assert all(p.grad is not None for p in big.parameters()) and not opt.state
    opt.step()
    assert all(float(opt.state[p]["step"]) == 1 for p in big.parameters())


def test_remove_takes_the_hooks_off() -> None:
    model = _Cast(_model())
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt, bucket_bytes=1)
    handle.remove()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters()) and not opt.state
    release_gradients(model, opt)  # and it can be released again


def _hooks(model: nn.Module) -> int:
    return sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
               for p in model.parameters())


@pytest.mark.parametrize("kwargs,error,match", [
    ({"bucket_bytes": 0}, ValueError, "bucket_bytes must be a positive int, got 0"),
    ({"bucket_bytes": -5}, ValueError, "bucket_bytes must be a positive int"),
    ({"bucket_bytes": 1.5}, ValueError, "bucket_bytes must be a positive int, got 1.5"),
    ({"bucket_bytes": True}, ValueError, "bucket_bytes must be a positive int, got True"),
])
def test_bad_bucket_bytes_are_refused(kwargs: Dict[str, Any], error: type, match: str) -> None:
    model = _Cast(_model())
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(error, match=match):
        release_gradients(model, opt, **kwargs)
    assert _hooks(model) == 0


def test_what_cannot_be_correct_is_refused_at_setup() -> None:
    model = _Cast(_model())
    with pytest.raises(TypeError, match="optimizer must be a mixprec.optim optimizer.*AdamW"):
        release_gradients(model, torch.optim.AdamW(model.parameters()))
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        release_gradients(list(model.parameters()),  # type: ignore[arg-type]
                          mixprec.optim.AdamW(model.parameters()))
    sr = mixprec.optim.AdamW(model.parameters(), master_weights=False,
                             stochastic_rounding=True)
    with pytest.raises(ValueError, match=r"param_groups\[0\] uses stochastic_rounding"):
        release_gradients(model, sr)
    opt = mixprec.optim.AdamW(model.parameters())
    release_gradients(model, opt)
    hooks = _hooks(model)
    with pytest.raises(ValueError, match="already released"):
        release_gradients(model, opt)
    assert _hooks(model) == hooks


def test_ddp_is_refused_at_setup() -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo unavailable")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'init')}",
                                rank=0, world_size=1)
        try:
            model = nn.parallel.DistributedDataParallel(_Cast(_model()))
            opt = mixprec.optim.AdamW(model.parameters())
            with pytest.raises(ValueError, match="DDP is not supported.*FSDP2"):
                release_gradients(model, opt)
            assert _hooks(model) == 0
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("attr,match", [("grad_scale", "loss scaling cannot be combined"),
                                        ("clip_coef", "global gradient-norm clip")])
def test_a_scaler_or_clip_on_the_optimizer_is_refused_before_any_step(attr: str,
                                                                      match: str) -> None:
    model = _Cast(_model())
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    release_gradients(model, opt, bucket_bytes=1)
    before = copy.deepcopy(model.state_dict())
    setattr(opt, attr, torch.ones(()))
    with pytest.raises(RuntimeError, match=match):
        model(torch.randn(8, 16)).pow(2).mean().backward()
    for k, v in model.state_dict().items():
        assert_bitwise_equal(v, before[k], k)
    assert not opt.state


def test_an_enabled_grad_scaler_refuses_a_released_optimizer() -> None:
    model = _Cast(_model())
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt, bucket_bytes=1 << 30)
    scaler = mixprec.GradScaler("cpu", init_scale=4.0)
    scaler.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
    for call in (lambda: scaler.unscale_(opt), lambda: scaler.step(opt)):
        with pytest.raises(RuntimeError, match="gradients are released.*cannot be combined"):
            call()
    assert not opt.state  # (the grads were all in the pending bucket: nothing stepped)
    handle.remove()
    scaler.step(opt)  # a plain optimizer again
    assert all(float(opt.state[p]["step"]) == 1 for p in model.parameters())
