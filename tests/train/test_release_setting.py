"""``MixedPrecisionConfig(gradient_release=True)``: the trainer and the manager step the
params during backward (``mixprec.optim.release_gradients``) and end with the bits of the
same run without release; what release cannot honour is refused at setup, nothing changed."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch import nn

import mixprec
from _helpers import assert_bitwise_equal
from mixprec import MixedPrecisionConfig, MixedPrecisionManager, MixedPrecisionTrainer


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(),
                         nn.Linear(32, 3))


def _batches(n: int = 5) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(n)]


def _run(release: bool, mode: str, make_opt: Any) -> MixedPrecisionTrainer:
    model = _net()
    opt = make_opt(model.parameters())
    t = MixedPrecisionTrainer(MixedPrecisionConfig(
        mode=mode, precision_level="bf16", gradient_release=release, logging_frequency=1000))
    t.setup_training(model, opt, nn.CrossEntropyLoss(),
                     torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9))
    if release:  # a bucket per param: stepped in backward, not by the trainer's step()
        t.mixed_precision_manager.release.bucket_bytes = 1
    for x, y in _batches():
        t.train_step(x, y)
    return t


@pytest.mark.parametrize("mode,make_opt", [
    ("automatic", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2)),
    ("automatic", lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=256)),
    ("manual", lambda ps: torch.optim.AdamW(ps, lr=1e-2)),  # converted: bf16 + masters
    ("manual", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
])
def test_the_trainer_with_release_ends_with_the_bits_of_the_run_without(mode: str,
                                                                        make_opt: Any) -> None:
    plain, released = _run(False, mode, make_opt), _run(True, mode, make_opt)
    manager = released.mixed_precision_manager
    n_params = len(list(released.model.parameters()))
    assert manager.release is not None and manager.release.buckets_stepped == 5 * n_params
    assert not manager.scaler.is_enabled()
    assert all(p.grad is None for p in released.model.parameters())
    for (name, a), b in zip(released.model.named_parameters(), plain.model.parameters()):
        assert_bitwise_equal(a.detach(), b.detach(), name)
    sa, sb = released.optimizer.state_dict(), plain.optimizer.state_dict()
    for k, st in sa["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                assert_bitwise_equal(v, sb["state"][k][key], f"{k} {key}")
    assert released.optimizer_steps == plain.optimizer_steps == 5
    assert released.scheduler.get_last_lr() == plain.scheduler.get_last_lr()


def test_the_manager_steps_during_backward_and_close_takes_the_hooks_off() -> None:
    model = _net().to(torch.bfloat16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    m = MixedPrecisionManager(model, opt, MixedPrecisionConfig(
        mode="automatic", precision_level="bf16", gradient_release=True))
    assert m.release is not None
    m.release.bucket_bytes = 1  # a bucket per param: every grad freed in backward
    x, y = _batches(1)[0]
    with m.autocast():
        loss = nn.functional.cross_entropy(model(x.to(torch.bfloat16)), y)
    m.backward(loss)
    assert all(p.grad is None for p in model.parameters())
    assert all(float(opt.state[p]["step"]) == 1 for p in model.parameters())
    result = m.step()
    assert result.grad_norm is None and bool(result)
    m.close()
    assert m.release is None
    model(x.to(torch.bfloat16)).float().sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("kwargs,match", [
    ({"loss_scaling": True}, "cannot be combined with loss_scaling=True: an overflow"),
    ({"max_grad_norm": 1.0}, "cannot be combined with max_grad_norm: the global norm"),
    ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps > 1: every backward"),
    ({"capture": True}, "cannot be combined with capture=True"),
    ({"mode": "adaptive"}, "cannot be combined with mode ADAPTIVE"),
    ({"mode": "gradient_scaling"}, "cannot be combined with mode GRADIENT_SCALING"),
])
def test_the_config_refuses_what_release_cannot_honour(kwargs: Dict[str, Any],
                                                       match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MixedPrecisionConfig(gradient_release=True, **kwargs)
    MixedPrecisionConfig(gradient_release=False, **kwargs)  # (each is fine without release)


@pytest.mark.parametrize("config,make_opt,error,match", [
    (MixedPrecisionConfig(mode="automatic", precision_level="fp16", gradient_release=True),
     lambda ps: mixprec.optim.AdamW(ps), ValueError, "loss scaling, on here for float16"),
    (MixedPrecisionConfig(mode="automatic", precision_level="bf16", gradient_release=True),
     lambda ps: torch.optim.AdamW(ps), TypeError, "optimizer must be a mixprec.optim"),
    (MixedPrecisionConfig(mode="manual", precision_level="bf16", gradient_release=True),
     lambda ps: mixprec.optim.AdamW(ps, master_weights=False, stochastic_rounding=True),
     ValueError, "uses stochastic_rounding"),
])
def test_the_manager_refuses_at_setup_changing_nothing(config: MixedPrecisionConfig,
                                                       make_opt: Any, error: type,
                                                       match: str) -> None:
    model = _net()
    before = copy.deepcopy(model.state_dict())
    opt = make_opt(model.parameters())
    with pytest.raises(error, match=match):
        MixedPrecisionManager(model, opt, config)
    for k, v in model.state_dict().items():
        assert_bitwise_equal(v, before[k], k)
    assert not any(getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
