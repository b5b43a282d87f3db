"""mixprec.diagnostics: the fp16 safety counts, the health report and the precision
comparison, with the host syncs each one promises (none, one, one per dtype)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import mixprec
from mixprec import diagnostics

FP16_MAX = torch.finfo(torch.float16).max


def _syncs(device: str):  # type: ignore[no-untyped-def]
    """``torch.cuda.set_sync_debug_mode('error')`` on CUDA (a sync raises); nothing on CPU."""
    class Mode:
        def __enter__(self) -> None:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("error")

        def __exit__(self, *exc: object) -> None:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    return Mode()


def test_check_fp16_safe_counts_overflow_and_underflow(device: str) -> None:
    x = torch.tensor([1.0, 65504.0, 65519.0, 65520.0, -1e6, 1e-3, 2.0**-24, 2.0**-26,
                      -1e-30, 0.0, math.inf, math.nan], device=device)
    with _syncs(device):
        safety = mixprec.check_fp16_safe(x)  # no host sync
    assert safety.overflow.device == x.device and safety.overflow.dtype == torch.int64
    assert safety.overflow.dim() == 0
    # 65520 and -1e6 become inf (65519 rounds down to 65504); inf and NaN count nowhere
    assert int(safety.overflow) == 2
    # 2^-26 and -1e-30 flush to zero; 2^-24 is float16's smallest subnormal; 0 is no loss
    assert int(safety.underflow) == 2
    over, under = mixprec.check_fp16_safe(x, torch.bfloat16)  # a plain tuple too
    assert (int(over), int(under)) == (0, 0)


def test_check_fp16_safe_refuses_what_is_not_a_float_tensor() -> None:
    with pytest.raises(TypeError, match="expected a floating-point tensor, got torch.int64"):
        mixprec.check_fp16_safe(torch.arange(3))
    with pytest.raises(TypeError, match="got list"):
        mixprec.check_fp16_safe([1.0])  # type: ignore[arg-type]


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2, bias=False)).to(device)


def test_health_report_norms_and_flags(device: str) -> None:
    model = _model(device)
    model(torch.randn(5, 4, device=device)).sum().backward()
    w0, b0, w2 = model[0].weight, model[0].bias, model[2].weight
    w0.grad[0, 0] = math.inf
    w0.grad[1, 1] = math.nan
    b0.grad.fill_(1e-12)
    w2.grad.mul_(1e6)
    report = mixprec.health_report(model)
    names = [p.name for p in report.params]
    assert names == ["0.weight", "0.bias", "2.weight"]
    by = {p.name: p for p in report.params}
    finite = torch.where(torch.isfinite(w0.grad), w0.grad, torch.zeros_like(w0.grad))
    assert by["0.weight"].grad_nonfinite == 2
    assert by["0.weight"].grad_norm == pytest.approx(float(finite.norm()), rel=1e-6)
    assert by["0.weight"].param_norm == pytest.approx(float(w0.detach().norm()), rel=1e-6)
    assert by["0.bias"].vanishing and not by["0.bias"].exploding
    assert by["2.weight"].exploding and by["2.weight"].shape == (2, 3)
    assert not report.ok and len(report.warnings()) == 3
    assert "0.weight: 2 non-finite gradient values" in str(report)


def test_health_report_of_a_healthy_model_and_one_without_grads() -> None:
    model = _model("cpu")
    report = mixprec.health_report(model)
    assert report.ok and all(p.grad_norm is None for p in report.params)
    model(torch.randn(5, 4)).sum().backward()
    assert mixprec.health_report(model).ok
    assert mixprec.health_report(nn.ReLU()).params == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_health_report_reads_the_device_once() -> None:
    import warnings

    model = _model("cuda")
    model(torch.randn(5, 4, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            mixprec.health_report(model)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in seen if "synchroniz" in str(w.message)]) == 1


def test_compare_precisions_default_matmul(device: str) -> None:
    errors = mixprec.compare_precisions(device=device)
    assert set(errors) == {torch.float16, torch.bfloat16}
    fp16, bf16 = errors[torch.float16], errors[torch.bfloat16]
    # bfloat16 keeps 8 significand bits, float16 11: bfloat16's error is the larger
    assert 0 < fp16.rel_l2 < bf16.rel_l2 < 0.05
    assert fp16.nonfinite == 0 and bf16.nonfinite == 0 and fp16.max_abs > 0


def test_compare_precisions_on_a_workload_that_overflows_in_fp16() -> None:
    x = torch.full((4, 4), 300.0)

    def workload() -> torch.Tensor:
        return x @ x  # 360,000 per element: past float16's max, not bfloat16's

    errors = diagnostics.compare_precisions(workload)
    assert errors[torch.float16].nonfinite == 16
    assert errors[torch.bfloat16].nonfinite == 0
    assert errors[torch.bfloat16].rel_l2 < 1e-2
    assert FP16_MAX < 360000.0
