"""benchmarks/bench_e2e.py: runs end to end on CPU in a tiny configuration, prints a row
for every variant, and its checks catch an optimizer
that does nothing and a loss far from FP32's. Timing is never asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest
import torch

import mixprec
from _helpers import REPO

ROOT = REPO
SCRIPT = ROOT / "benchmarks" / "bench_e2e.py"
if str(SCRIPT.parent) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parent))

import bench_e2e  # noqa: E402

TINY: List[str] = ["--device", "cpu", "--layers", "1", "--d-model", "64", "--heads", "4",
                   "--vocab", "256", "--batch", "2", "--seq", "16", "--ctx", "16",
                   "--warmup", "2", "--steps", "3", "--repeats", "1", "--threads", "1"]


@pytest.fixture
def one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _row(out: str, name: str) -> str:
    rows = [line for line in out.splitlines() if line.split("  ")[0].strip() == name]
    assert len(rows) == 1, f"no single row {name!r} in:\n{out}"
    return rows[0]


def test_tiny_cpu_run_prints_every_variant_and_passes() -> None:
    env = dict(os.environ)
    # the mixprec under test (the editable one, or a build of make's other targets)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(mixprec.__file__).resolve().parent.parent)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"torch {torch.__version__}" in out and f"mixprec {mixprec.__version__}" in out
    assert "--vocab 256" in out  # the command line is in the header
    per_param = {}
    for v in bench_e2e.VARIANTS:
        # name, ms, spread, tok/s, ratio, peak MiB, state MiB, B/param, syncs, loss, skipped
        cells = _row(out, v.key).split()
        assert [cells[5], cells[8]] == ["n/a", "n/a"], cells  # peak, syncs: n/a on CPU
        assert float(cells[9]) > 0  # loss after N steps
        per_param[v.key] = float(cells[7])
    assert "+flat" not in out
    # optimizer state: masters 4 + moments 8 bytes per param; 8-bit moments save most of 8
    assert 12 <= per_param["bf16-m"] < 12.5 and per_param["bf16-m8"] < 0.6 * per_param["bf16-m"]
    assert per_param["bf16-sr8"] < 0.5 * per_param["bf16-sr"]
    assert _row(out, "amp-torch").split()[4] == "1.00x"
    assert "FAIL" not in out and "all checks passed" in out


def test_an_optimizer_that_does_nothing_fails_the_checks(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        one_thread: None) -> None:
    monkeypatch.setattr(mixprec.ops, "fused_adam_", lambda *a, **k: None)
    argv = TINY + ["--variants", "fp32,bf16-m,bf16-sr"]
    assert bench_e2e.main(argv) == 1
    out = capsys.readouterr().out
    checks = [x.split(None, 1) for x in out.partition("checks (untimed):")[2].splitlines()]
    for key in ("bf16-m", "bf16-sr"):
        mine = [rest for first, rest in (c for c in checks if len(c) == 2) if first == key]
        assert any("changed 0/16: FAIL" in x for x in mine), mine
        assert any(x.startswith("drop") and "FAIL" in x for x in mine), mine
    fp32 = [rest for first, rest in (c for c in checks if len(c) == 2) if first == "fp32"]
    assert any("changed 16/16: ok" in x for x in fp32), fp32  # torch's AdamW still works
    assert "check(s) FAILED" in out


def _row_with(key: str, first: float, final: float) -> bench_e2e.Row:
    v = next(v for v in bench_e2e.VARIANTS if v.key == key)
    m = bench_e2e.Measurement(step_s=1.0, peak_bytes=None, syncs=None, first_loss=first,
                              final_loss=final, skipped=None, changed=(16, 16))
    return bench_e2e.Row(v, False, runs=[m])


def test_loss_agreement_tolerance() -> None:
    # fp32 5.0 -> 3.0, AMP 0.01 away: tolerance 16 x max(0.01, 0, 1e-3 x 5.0) = 0.16
    base = [_row_with("fp32", 5.0, 3.0), _row_with("amp-torch", 5.0, 3.01)]
    lines, failures = bench_e2e.run_checks(base + [_row_with("bf16-sr", 5.0, 3.15)])
    assert failures == 0, "\n".join(lines)
    lines, failures = bench_e2e.run_checks(base + [_row_with("bf16-sr", 5.0, 3.17)])
    assert failures == 1 and "0.17 <= 0.16: FAIL" in "\n".join(lines)
    # too little progress (and too far off)
    lines, failures = bench_e2e.run_checks(base + [_row_with("bf16-m", 5.0, 4.5)])
    assert failures == 2
    # a non-finite loss
    lines, failures = bench_e2e.run_checks(base + [_row_with("fp16-m", 5.0, float("nan"))])
    assert any("fp16-m" in x and "finite: FAIL" in x for x in lines)
    assert failures >= 1
