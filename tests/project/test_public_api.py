"""The public API: every name users import from ``mixprec`` and its subpackages.

The list is written out here on purpose. A name that disappears, moves without a
re-export, or appears without being added here fails this test, so a change of the
public surface is always a deliberate edit of this file; the ops of ``mixprec.ops`` are
the op table's (``csrc/op_table.h``), whose edit is the deliberate one.
"""

from __future__ import annotations

import importlib

import pytest

import mixprec

#: The ops of csrc/op_table.h, as the extension exports them (``_C.op_names``); the
#: ops ``mixprec.ops`` wraps are that list exactly (without the extension, its own list).
OP_TABLE = list(mixprec._extension.EXT.op_names)

# Names of mixprec itself; the rest of the top level is what the layers below export.
TOP_ONLY = {
    "__version__",
    "build_info",
    "cmake_prefix_path",
    "has_cpp_package",
    "has_cuda_kernels",
    "ops",
    "amp",
    "optim",
    "train",
    "capture",
    "capture_step",
    "diagnostics",
}

# subpackage -> its __all__
SUBPACKAGES = {
    # the op table (csrc/op_table.h): adding an op there is the deliberate edit
    "mixprec.ops": set(OP_TABLE),
    "mixprec.amp": {
        "GradScaler",
        "ScalerStats",
        "autocast",
        "resolve_precision",
        "PrecisionPolicy",
        "PolicyHandle",
        "apply_policy",
        "remove_policy",
        "DEFAULT_FP32_MODULES",
        "patch_torch",
        "unpatch_torch",
        "is_torch_patched",
    },
    "mixprec.optim": {"Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit",
                      "FusedOptimizer", "check_checkpoint", "release_gradients",
                      "GradientRelease", "decode_master"},
    "mixprec.train": {
        "MixedPrecisionConfig",
        "MixedPrecisionMode",
        "PrecisionLevel",
        "HandlingAction",
        "MixedPrecisionManager",
        "MixedPrecisionTrainer",
        "StepMetrics",
        "fp8_available",
        "fp8_unavailable",
        "latest_checkpoint",
        "IncompleteCheckpointError",
    },
    "mixprec.diagnostics": {"check_fp16_safe", "Fp16Safety", "health_report", "HealthReport",
                            "ParamHealth", "compare_precisions", "PrecisionError"},
}
LAYERS = ("mixprec.ops", "mixprec.amp", "mixprec.optim", "mixprec.train", "mixprec.diagnostics")
# what mixprec re-exports from its layers: all of amp, train and diagnostics
TOP_LEVEL = TOP_ONLY | SUBPACKAGES["mixprec.amp"] | SUBPACKAGES["mixprec.train"] | \
    SUBPACKAGES["mixprec.diagnostics"]


def test_top_level_all_is_the_public_list() -> None:
    assert set(mixprec.__all__) == TOP_LEVEL
    for name in TOP_LEVEL:
        assert hasattr(mixprec, name), name


@pytest.mark.parametrize("module", sorted(SUBPACKAGES))
def test_subpackage_all_is_the_public_list(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == SUBPACKAGES[module]
    for name in SUBPACKAGES[module]:
        assert getattr(mod, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize("name", sorted(TOP_LEVEL - {"__version__"}))
def test_top_level_names_are_the_subpackages_objects(name: str) -> None:
    """A name exported at the top and by a subpackage is the same object, not a copy."""
    obj = getattr(mixprec, name)
    owners = [m for m in LAYERS if name in SUBPACKAGES[m]]
    for module in owners:
        assert getattr(importlib.import_module(module), name) is obj, (module, name)


def test_scaler_is_still_a_torch_grad_scaler() -> None:
    import torch

    assert issubclass(mixprec.GradScaler, torch.amp.GradScaler)
    assert not hasattr(mixprec, "cuda")  # the torch.cuda.amp shim lives in amp/_legacy.py
