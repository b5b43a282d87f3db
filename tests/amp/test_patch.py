"""mixprec.patch_torch() / unpatch_torch()."""

from __future__ import annotations

import inspect
import pickle
import warnings

import pytest
import torch
from torch.amp import GradScaler as EarlyImportedGradScaler

import mixprec
from _helpers import HAS_CUDA, INF, REPO, two_layer
from mixprec.amp._legacy import CudaGradScaler


@pytest.fixture(autouse=True)
def _always_unpatch():
    mixprec.unpatch_torch()
    yield
    mixprec.unpatch_torch()


def _train(scaler_factory, n=6):
    torch.manual_seed(0)
    model = two_layer("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = scaler_factory()
    losses, scales = [], []
    for i in range(n):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if i == 2:
            model[0].bias.grad[0] = INF
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales, scaler


def test_patch_and_unpatch():
    assert type(torch.amp.GradScaler("cpu")) is torch.amp.GradScaler
    handle = mixprec.patch_torch()
    assert mixprec.is_torch_patched()
    s = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert type(s) is mixprec.GradScaler
    assert isinstance(s, torch.amp.GradScaler)
    assert s.get_scale() == 8.0
    assert type(torch.GradScaler("cpu")) is mixprec.GradScaler
    assert type(EarlyImportedGradScaler(device="cpu")) is mixprec.GradScaler
    assert "patch_torch" in repr(handle)
    mixprec.unpatch_torch()
    assert not mixprec.is_torch_patched()
    assert type(torch.amp.GradScaler("cpu")) is torch.amp.GradScaler
    mixprec.unpatch_torch()  # idempotent


def test_context_manager_and_nesting():
    with mixprec.patch_torch():
        assert type(torch.amp.GradScaler("cpu")) is mixprec.GradScaler
        with mixprec.patch_torch():
            pass
        assert mixprec.is_torch_patched()  # the inner block leaves the outer patch
    assert type(torch.amp.GradScaler("cpu")) is torch.amp.GradScaler
    mixprec.patch_torch()
    with mixprec.patch_torch():
        pass
    assert mixprec.is_torch_patched()  # was patched before the block: stays


def test_subclasses_and_mixprec_itself_unaffected():
    class MyScaler(torch.amp.GradScaler):
        pass

    with mixprec.patch_torch():
        assert type(MyScaler("cpu")) is MyScaler
        assert type(mixprec.GradScaler("cpu")) is mixprec.GradScaler
        assert inspect.signature(torch.amp.GradScaler).parameters.keys() == inspect.signature(
            mixprec.GradScaler.__init__
        ).parameters.keys() - {"self", "allow_fp16_grads", "min_scale", "max_scale",
                               "hysteresis", "policy", "process_group"}


def test_cuda_and_cpu_amp_classes():
    with mixprec.patch_torch():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            s = torch.cuda.amp.GradScaler(16.0, 4.0, 0.25, 7)
        msgs = [str(x.message) for x in w]
        assert any("torch.cuda.amp.GradScaler(args...)` is deprecated" in m for m in msgs)
        assert type(s) is CudaGradScaler
        assert isinstance(s, torch.cuda.amp.GradScaler) and isinstance(s, mixprec.GradScaler)
        assert s._device == "cuda"
        assert s.is_enabled() == HAS_CUDA
        if HAS_CUDA:
            assert (s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(),
                    s.get_growth_interval()) == (16.0, 4.0, 0.25, 7)
        with pytest.warns(FutureWarning, match="torch.cpu.amp.GradScaler"):
            c = torch.cpu.amp.GradScaler(32.0)
        assert isinstance(c, mixprec.GradScaler) and isinstance(c, torch.cpu.amp.GradScaler)
        assert c._device == "cpu" and c.get_scale() == 32.0
    with pytest.warns(FutureWarning):
        assert type(torch.cuda.amp.GradScaler(enabled=False)) is torch.cuda.amp.GradScaler


def test_torch_cuda_amp_positional_order():
    with mixprec.patch_torch(), pytest.warns(FutureWarning):
        s = torch.cuda.amp.GradScaler(8.0, 3.0, 0.25, 11, False, policy="megatron")
    assert not s.is_enabled() and s.policy == "megatron"
    assert list(inspect.signature(CudaGradScaler.__init__).parameters)[1:6] == [
        "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"]


def test_unpatched_training_equals_patched():
    ref = _train(lambda: torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2))
    assert type(ref[2]) is torch.amp.GradScaler
    with mixprec.patch_torch():
        got = _train(lambda: torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2))
    assert type(got[2]) is mixprec.GradScaler
    assert got[0] == ref[0] and got[1] == ref[1]


def test_pickled_torch_scaler_loads_while_patched():
    blob = pickle.dumps(torch.amp.GradScaler("cpu", init_scale=4.0))
    with mixprec.patch_torch():
        s = pickle.loads(blob)
    assert isinstance(s, mixprec.GradScaler)
    assert s.get_scale() == 4.0
    losses, scales, _ = _train(lambda: s, n=3)
    assert scales == [4.0, 4.0, 2.0]


def test_drop_in_example_runs(monkeypatch, capsys):
    import runpy
    import sys

    path = REPO / "examples" / "drop_in.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--device", "cpu", "--iters", "8"])
    runpy.run_path(str(path), run_name="__main__")
    assert "identical loss and scale sequences: OK" in capsys.readouterr().out
    assert not mixprec.is_torch_patched()
