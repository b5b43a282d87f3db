"""MixedPrecisionConfig: fields, validation, presets, dict round trip."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

import mixprec
from mixprec import MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel

ISSUE_FIELDS = [
    "enabled", "mode", "precision_level", "gradient_scaling", "loss_scaling",
    "dynamic_loss_scaling", "initial_scale", "scale_factor", "scale_window", "backoff_factor",
    "min_scale", "max_scale", "hysteresis", "overflow_threshold", "underflow_threshold",
    "adaptive_threshold", "memory_efficiency", "performance_monitoring", "nan_handling",
    "overflow_handling", "underflow_handling", "selective_layers", "logging_frequency",
    "master_weights", "optimizer_state_bits",  # (the 8-bit state issue's field)
    "master_correction_bits",  # (split masters)
    "max_grad_norm", "gradient_accumulation_steps",
    "fp8_recipe", "fp8_keep_first_last", "fp8_fsdp_all_gather",  # (the FP8 issue's fields)
    "capture",  # (the trainer through capture_step)
    "gradient_release",  # (params stepped during backward)
]


def test_exactly_the_issue_fields():
    assert [f.name for f in dataclasses.fields(MixedPrecisionConfig)] == ISSUE_FIELDS


def test_enums():
    assert {m.name for m in MixedPrecisionMode} == {
        "AUTOMATIC", "MANUAL", "SELECTIVE", "ADAPTIVE", "GRADIENT_SCALING"}
    assert {m.name for m in PrecisionLevel} == {"FP16", "FP32", "BF16", "DYNAMIC", "MIXED",
                                                "FP8"}
    assert mixprec.MixedPrecisionMode is MixedPrecisionMode


def test_names_are_normalized_to_members():
    cfg = MixedPrecisionConfig(mode="ADAPTIVE", precision_level="bf16", nan_handling="raise")
    assert cfg.mode is MixedPrecisionMode.ADAPTIVE
    assert cfg.precision_level is PrecisionLevel.BF16
    assert cfg.nan_handling is mixprec.HandlingAction.RAISE


@pytest.mark.parametrize("name,scale,window", [
    ("conservative", 2.0**15, 5000), ("standard", 2.0**16, 2000), ("aggressive", 2.0**17, 1000)])
def test_presets(name, scale, window):
    for cfg in (getattr(MixedPrecisionConfig, name)(), MixedPrecisionConfig.preset(name)):
        assert cfg.initial_scale == scale and cfg.scale_window == window
    cfg = MixedPrecisionConfig.preset(name, max_grad_norm=1.0)
    assert cfg.max_grad_norm == 1.0 and cfg.initial_scale == scale
    with pytest.raises(ValueError, match="expected one of"):
        MixedPrecisionConfig.preset("reckless")


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"mode": "turbo"}, ValueError, "mode: expected one of"),
    ({"precision_level": "fp4"}, ValueError, "precision_level"),
    ({"nan_handling": "explode"}, ValueError, "nan_handling"),
    ({"enabled": 1}, TypeError, "enabled: expected a bool"),
    ({"loss_scaling": "yes"}, TypeError, "loss_scaling"),
    ({"loss_scaling": True, "gradient_scaling": False}, ValueError, "needs gradient_scaling"),
    ({"initial_scale": 0.0}, ValueError, "initial_scale: must be in"),
    ({"initial_scale": float("nan")}, TypeError, "initial_scale"),
    ({"scale_factor": 1.0}, ValueError, "scale_factor"),
    ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
    ({"scale_window": 0}, ValueError, "scale_window: must be >= 1"),
    ({"scale_window": 2.5}, TypeError, "scale_window: expected an int"),
    ({"hysteresis": 0}, ValueError, "hysteresis"),
    ({"min_scale": -1.0}, ValueError, "min_scale"),
    ({"min_scale": 8.0, "max_scale": 4.0, "initial_scale": 4.0}, ValueError, "must not exceed"),
    ({"initial_scale": 0.5}, ValueError, "below min_scale"),
    ({"initial_scale": 2.0**30}, ValueError, "above max_scale"),
    ({"overflow_threshold": 1.5}, ValueError, "overflow_threshold"),
    ({"underflow_threshold": -0.1}, ValueError, "underflow_threshold"),
    ({"adaptive_threshold": 0.0}, ValueError, "adaptive_threshold"),
    ({"logging_frequency": 0}, ValueError, "logging_frequency"),
    ({"gradient_accumulation_steps": 0}, ValueError, "gradient_accumulation_steps"),
    ({"max_grad_norm": -1.0}, ValueError, "max_grad_norm"),
    ({"selective_layers": "fc1"}, TypeError, "selective_layers"),
    ({"mode": "selective"}, ValueError, "SELECTIVE mode needs"),
    ({"mode": "gradient_scaling", "gradient_scaling": False}, ValueError, "GRADIENT_SCALING"),
    ({"master_correction_bits": 12}, ValueError, "master_correction_bits: expected None"),
    ({"master_correction_bits": True}, ValueError, "master_correction_bits: expected None"),
    ({"master_correction_bits": 16, "master_weights": False}, ValueError,
     "master_correction_bits=16 needs master_weights=True"),
])
def test_validation_errors_name_the_field(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MixedPrecisionConfig(**kwargs)


def test_validate_catches_later_mutation():
    cfg = MixedPrecisionConfig()
    cfg.scale_window = -3
    with pytest.raises(ValueError, match="scale_window"):
        cfg.validate()


def test_dict_round_trip_through_weights_only_load():
    cfg = MixedPrecisionConfig(mode="selective", selective_layers=["features.*"],
                               precision_level="fp16", max_grad_norm=2.0, min_scale=None)
    d = cfg.to_dict()
    assert d["mode"] == "selective" and d["precision_level"] == "fp16"
    buf = io.BytesIO()
    torch.save(d, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert MixedPrecisionConfig.from_dict(loaded) == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        MixedPrecisionConfig.from_dict({**d, "turbo": True})
