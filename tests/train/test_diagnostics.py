"""check_fp16_safe, health_report, compare_precisions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec


def test_check_fp16_safe_counts(device):
    t = torch.randn(1000, device=device)  # safe values
    t[:3] = torch.tensor([7e4, -1e6, 65504.0])  # two overflow, 65504 is the fp16 max
    t[3:7] = torch.tensor([1e-9, -1e-10, 2.0**-24, 0.0])  # two underflow (2^-24 is representable)
    t[7] = float("inf")  # already inf: not counted
    t[8] = float("nan")
    assert mixprec.check_fp16_safe(t) == (2, 2)
    assert mixprec.check_fp16_safe(t.double()) == (2, 2)
    # bf16 has float32's range: nothing overflows, 1e-9 survives
    assert mixprec.check_fp16_safe(t, torch.bfloat16) == (0, 0)


def test_check_fp16_safe_random_matches_definition():
    t = torch.randn(5000) * torch.logspace(-12, 8, 5000)
    over, under = mixprec.check_fp16_safe(t)
    h = t.half()
    assert over == int((torch.isinf(h) & torch.isfinite(t)).sum())
    assert under == int(((h == 0) & (t != 0)).sum())
    assert over > 0 and under > 0
    with pytest.raises(TypeError, match="floating-point"):
        mixprec.check_fp16_safe(torch.arange(3))


def test_health_report_warnings():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.Linear(2, 2))
    model(torch.randn(3, 4)).sum().backward()
    model[0].weight.grad.mul_(1e6)  # exploding
    model[2].weight.grad.mul_(1e-12)  # vanishing (and fp16 underflow)
    model[2].bias.grad[0] = float("nan")
    model[3].weight.grad = None
    report = mixprec.health_report(model)
    names = [p.name for p in report.params]
    assert names == [n for n, _ in model.named_parameters()]
    by = {p.name: p for p in report.params}
    assert by["3.weight"].grad_norm is None
    assert not by["2.bias"].grad_finite
    w = "\n".join(report.warnings)
    assert "0.weight: exploding" in w
    assert "2.weight: vanishing" in w
    assert "2.bias: non-finite" in w
    assert "2.weight" in w and "underflow" in w
    assert not report.ok
    assert "parameter" in str(report) and report.as_dict()["warnings"] == report.warnings


def test_health_report_healthy_and_norms():
    model = nn.Linear(5, 3)
    model(torch.randn(7, 5)).pow(2).mean().backward()
    report = mixprec.health_report(model)
    assert report.ok
    g = report.params[0]
    torch.testing.assert_close(g.grad_norm, float(model.weight.grad.norm()))
    torch.testing.assert_close(g.param_norm, float(model.weight.detach().norm()))


def test_compare_precisions(device):
    rows = mixprec.compare_precisions(sizes=(16, 128), device=device)
    assert [(r["size"], r["dtype"]) for r in rows] == [
        (16, "float16"), (16, "bfloat16"), (128, "float16"), (128, "bfloat16")]
    for r in rows:
        assert 0 < r["rel_error"] < 50 * r["eps"]
        assert r["max_abs_error"] >= r["mean_abs_error"] > 0
    # float16 has 3 more mantissa bits than bfloat16: smaller error on N(0,1) data
    for n in (16, 128):
        fp16, bf16 = (r["rel_error"] for r in rows if r["size"] == n)
        assert fp16 < bf16
    with pytest.raises(ValueError, match="sizes"):
        mixprec.compare_precisions(sizes=(0,))
