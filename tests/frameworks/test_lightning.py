"""Lightning with mixprec's optimizers: ``gradient_clip_val`` under ``16-mixed``,
``bf16-mixed`` and ``bf16-true`` through ``mixprec.integrations.lightning`` (Lightning's
own plugins refuse it), the clip equal to a hand-written loop's, a skipped overflow
step, 8-bit state, BF16 params with masters, and a resume bit for bit. CPU, a tiny MLP."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import pytest
import torch
from torch import nn

import mixprec

L = pytest.importorskip("lightning")
from lightning.pytorch.plugins.precision import (  # noqa: E402
    HalfPrecision as LightningHalfPrecision,
)
from lightning.pytorch.plugins.precision import (  # noqa: E402
    MixedPrecision as LightningMixedPrecision,
)

from mixprec.integrations.lightning import (  # noqa: E402
    HalfPrecision,
    MixedPrecision,
    precision_plugin,
)

MakeOpt = Callable[[Any], torch.optim.Optimizer]
OPTIMIZERS: Dict[str, MakeOpt] = {
    "AdamW": lambda params: mixprec.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
    "AdamW8bit": lambda params: mixprec.optim.AdamW8bit(params, lr=1e-2, min_8bit_size=64),
    "AdamW-state_bits8": lambda params: mixprec.optim.AdamW(params, lr=1e-2, state_bits=8,
                                                             min_8bit_size=64),
    "SGD": lambda params: mixprec.optim.SGD(params, lr=0.1, momentum=0.9),
}
CLIP = 0.05  # below every grad norm of these runs: every step clips


def batches(n: int = 4) -> torch.utils.data.DataLoader:
    """``n`` batches of 16, in order (the same every call)."""
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(16 * n, 8, generator=g),
                                          torch.randint(0, 3, (16 * n,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=16)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))


class Module(L.LightningModule):
    def __init__(self, make_opt: MakeOpt, overflow_at: Optional[int] = None) -> None:
        super().__init__()
        self.net = net()
        self.make_opt = make_opt
        self.overflow_at = overflow_at

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x).float(), y)
        if index == self.overflow_at:
            loss = loss * float("inf")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_opt(self.parameters())


def trainer(plugin: Any, **kw: Any) -> Any:
    kw.setdefault("max_epochs", 1)
    return L.Trainer(plugins=[plugin], accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def fit(precision: str, opt: str, clip: float = CLIP, epochs: int = 1,
        overflow_at: Optional[int] = None) -> Tuple[Module, Any]:
    module = Module(OPTIMIZERS[opt], overflow_at)
    t = trainer(precision_plugin(precision, "cpu"), gradient_clip_val=clip, max_epochs=epochs)
    t.fit(module, batches())
    return module, t


def reference(precision: str, opt: str, clip: float = CLIP) -> nn.Module:
    """The loop Lightning runs, by hand: autocast or 16-bit params, torch's scaler
    protocol with unscale_ + torch's clip (no folding), the optimizer's step."""
    model = net()
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    optimizer = OPTIMIZERS[opt](model.parameters())
    scaler = mixprec.GradScaler("cpu") if precision == "16-mixed" else None
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    for x, y in batches():
        optimizer.zero_grad(set_to_none=True)
        if precision.endswith("-mixed"):
            with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
                out = model(x)
        else:
            out = model(x.to(dtype))
        loss = nn.functional.cross_entropy(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        assert norm > clip
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return model


def test_lightnings_own_plugin_refuses_clipping() -> None:
    """Why the plugin exists (Lightning 2.6): its MixedPrecision refuses every optimizer
    with ``_step_supports_amp_scaling``, even under bf16-mixed, which has no scaler (and
    under 16-mixed, which Lightning turns into bf16-mixed on a CPU)."""
    module = Module(OPTIMIZERS["AdamW"])
    t = L.Trainer(precision="bf16-mixed", gradient_clip_val=CLIP, accelerator="cpu",
                  max_steps=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        t.fit(module, batches(1))


def test_precision_plugin_kinds() -> None:
    assert type(precision_plugin("16-mixed", "cpu")) is MixedPrecision
    assert isinstance(precision_plugin("16-mixed", "cpu").scaler, mixprec.GradScaler)
    assert precision_plugin("bf16-mixed", "cpu").scaler is None
    assert isinstance(precision_plugin("bf16-mixed"), LightningMixedPrecision)
    assert type(precision_plugin("bf16-true")) is HalfPrecision
    assert isinstance(precision_plugin("16-true"), LightningHalfPrecision)
    # the checkpoint key of Lightning's plugins (the class's __qualname__) is kept
    assert MixedPrecision.__qualname__ == LightningMixedPrecision.__qualname__
    with pytest.raises(ValueError):
        precision_plugin("bf16-mixed", scaler=mixprec.GradScaler("cpu"))
    with pytest.raises(ValueError):
        precision_plugin("64-true")


@pytest.mark.parametrize("precision,opt", [
    ("bf16-mixed", "AdamW"),
    ("16-mixed", "AdamW"),
    ("16-mixed", "AdamW8bit"),
    ("bf16-true", "AdamW"),
    ("bf16-true", "AdamW-state_bits8"),
    ("16-mixed", "SGD"),
])
def test_clip_equals_the_hand_written_loop(precision: str, opt: str) -> None:
    module, t = fit(precision, opt)
    plugin = t.precision_plugin
    assert plugin.grad_norm is not None and float(plugin.grad_norm) > CLIP
    want = reference(precision, opt)
    got = module.net
    optimizer = t.optimizers[0]
    if precision == "bf16-true":  # BF16 params, FP32 masters in the optimizer
        assert all(p.dtype == torch.bfloat16 for p in got.parameters())
        assert all(optimizer.state[p]["master_param"].dtype == torch.float32
                   for p in got.parameters())
    if precision == "16-mixed":
        # the clip was folded into the step (the grads are left scaled and unclipped):
        # equal to the unscale_ + clip of the reference within float32 rounding
        for a, b in zip(got.parameters(), want.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert plugin.scaler.stats().steps == len(batches())
    else:  # clipped in place as the reference: the same bits
        for a, b in zip(got.parameters(), want.parameters()):
            assert torch.equal(a, b)
    if "8" in opt:
        assert optimizer.state[next(got.parameters())]["exp_avg"].dtype == torch.uint8
    unclipped, _ = fit(precision, opt, clip=0.0)
    assert any(not torch.equal(a, b)
               for a, b in zip(unclipped.net.parameters(), got.parameters()))


def test_clip_by_value_under_16_mixed() -> None:
    """``gradient_clip_algorithm="value"``: the grads are unscaled first (scaler.unscale_)."""
    module = Module(OPTIMIZERS["AdamW"])
    t = trainer(precision_plugin("16-mixed", "cpu"), gradient_clip_val=1e-3,
                gradient_clip_algorithm="value")
    t.fit(module, batches())
    model = net()
    optimizer = OPTIMIZERS["AdamW"](model.parameters())
    scaler = mixprec.GradScaler("cpu")
    for x, y in batches():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)
        scaler.step(optimizer)
        scaler.update()
    for a, b in zip(module.net.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_overflow_step_is_skipped_under_16_mixed() -> None:
    module, t = fit("16-mixed", "AdamW", overflow_at=1)
    stats = t.precision_plugin.scaler.stats()
    assert (stats.steps, stats.skipped_steps) == (4, 1)
    assert stats.scale == 2.0**15
    assert all(torch.isfinite(p).all() for p in module.net.parameters())
    # the optimizer counted 3 steps, not 4 (the skip happened on the device)
    state = t.optimizers[0].state[next(module.net.parameters())]
    assert float(state["step"]) == 3


@pytest.mark.parametrize("precision,opt", [("16-mixed", "AdamW-state_bits8"),
                                           ("bf16-true", "AdamW")])
def test_resume_bit_for_bit(precision: str, opt: str, tmp_path: Path) -> None:
    straight, _ = fit(precision, opt, epochs=2)
    first, t1 = fit(precision, opt, epochs=1)
    ckpt = tmp_path / "epoch1.ckpt"
    t1.save_checkpoint(ckpt)
    resumed = Module(OPTIMIZERS[opt])
    with torch.no_grad():
        for p in resumed.parameters():
            p.zero_()
    t2 = trainer(precision_plugin(precision, "cpu"), gradient_clip_val=CLIP, max_epochs=2)
    t2.fit(resumed, batches(), ckpt_path=str(ckpt))
    for a, b in zip(straight.net.parameters(), resumed.net.parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b)
    if precision == "16-mixed":
        assert t2.precision_plugin.scaler.get_scale() == 2.0**16
        state = t2.optimizers[0].state[next(resumed.net.parameters())]
        assert state["exp_avg"].dtype == torch.uint8  # 8-bit moments, resumed as such
