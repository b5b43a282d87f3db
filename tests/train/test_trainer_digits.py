"""The demo's claim: mixed precision on sklearn digits lands within 1 point of FP32."""

from __future__ import annotations

import pytest
import torch

from _helpers import REPO, load_module, torch_threads

pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")

_DEMO = REPO / "examples" / "train_digits.py"


def _load_demo():
    return load_module("train_digits_demo", _DEMO)


@pytest.fixture(scope="module")
def demo():
    with torch_threads(1):
        yield _load_demo()


@pytest.fixture(scope="module")
def fp32_row(demo):
    return demo.run("fp32", epochs=6, seed=0, progress=False)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_mixed_precision_within_one_point_of_fp32(demo, fp32_row, name):
    row = demo.run(name, epochs=6, seed=0, progress=False)
    assert fp32_row["accuracy"] > 0.95  # the model does learn the task
    assert abs(row["accuracy"] - fp32_row["accuracy"]) <= 0.01
    trainer = row["trainer"]
    assert trainer.compute_dtype == (torch.bfloat16 if name == "bf16" else torch.float16)
    if name == "fp16":
        # the scaler visibly works: the short growth window makes the scale move
        assert row["scale_changes"][0] >= 1
    else:
        assert row["final_scale"] == 1.0


def test_table_and_report(demo, fp32_row, tmp_path):
    table = demo.format_table([fp32_row], "cpu")
    assert "fp32" in table and "accuracy" in table and "final scale" in table
    demo.write_report([fp32_row], str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
