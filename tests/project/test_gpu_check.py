"""tools/gpu_check.py (`make gpu-check`): the plan lists every part in priority order, a CPU
smoke run writes the summary, and the driver reads its parts' output right. Runs on CPU."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from _helpers import REPO

if str(REPO / "tools") not in sys.path:
    sys.path.insert(0, str(REPO / "tools"))

import gpu_check  # noqa: E402

PRIORITY = ["tests", "capture", "optim8", "e2e", "capture-speed", "cpp-capture", "demo", "fp8",
            "memcheck", "fsdp2", "bench", "hf-overflow", "cpp"]


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert gpu_check.main(["--plan", "--times", "/nonexistent/times.json", *argv]) == 0
    return capsys.readouterr().out


def test_the_plan_lists_every_part_in_priority_order(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    out = _plan(capsys, "--out", str(tmp_path))
    rows = re.findall(r"^\s*(\d+) (\S+)\s+(\S+)\s+(\d+)s", out, re.M)
    assert [name for _, name, _, _ in rows] == ["install"] + PRIORITY
    assert [int(n) for n, _, _, _ in rows] == list(range(len(PRIORITY) + 1))
    items = [item for _, _, item, _ in rows]
    assert items[:11] == ["2.1", "2.1", "2.2", "2.6", "2.4", "2.3", "2.2", "2.2", "2.5", "2.7",
                          "2.8"]
    # within the default budget: what fits runs, the rest is named as skipped, with the
    # second call's command
    assert "budget 420 s" in out and "SKIP: does not fit the budget" in out
    assert "then a second call: python3 tools/gpu_check.py --only " in out
    assert "[guess]" in out  # where each estimate comes from
    assert "$ " + sys.executable + " tools/gpu_capture_check.py --only correctness" in out
    assert not any(tmp_path.iterdir())  # --plan runs nothing


def test_the_plan_follows_only_skip_and_the_budget(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    out = _plan(capsys, "--out", str(tmp_path), "--only", "fsdp2,memcheck", "--budget-s", "590")
    runs = re.findall(r"^\s*\d+ (\S+).*\brun: ", out, re.M)
    assert runs == ["memcheck", "fsdp2"]
    assert "PYTHONFAULTHANDLER=1" in out and "tools/gpu_workload.py" in out
    out = _plan(capsys, "--out", str(tmp_path), "--cpu-smoke")
    assert "SKIP: needs a GPU" in out and "--device cpu" in out
    with pytest.raises(SystemExit):
        gpu_check.main(["--plan", "--only", "nothing"])


def test_a_carried_wheel_is_installed_and_the_tree_left_off_the_path(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    wheel = str(tmp_path / "mixprec-1.0-cp312-cp312-linux_x86_64.whl")
    monkeypatch.setattr(gpu_check, "wheels", lambda: [wheel])
    out = _plan(capsys, "--out", str(tmp_path))
    assert "pip install the wheel mixprec-1.0" in out and "--no-index" in out
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    check = gpu_check.Check(_args(tmp_path))
    assert check.wheel == wheel
    path = check.env["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(gpu_check.WHEEL_SITE) and str(gpu_check.ROOT / "python") not in path
    assert "--target" in check.install_steps()[0].cmd
    monkeypatch.setattr(gpu_check, "wheels", lambda: [])
    check = gpu_check.Check(_args(tmp_path))
    assert check.env["PYTHONPATH"].split(os.pathsep)[0] == str(gpu_check.ROOT / "python")
    assert "setup.py" in " ".join(check.install_steps()[0].cmd)


def _fake_wheel(where: Path) -> Path:
    """A wheel of a package named mixprec that imports without torch (pip installs it
    offline)."""
    import zipfile

    wheel = where / "mixprec-9.9-py3-none-any.whl"
    init = ("__version__ = '9.9'\n"
            "def has_cuda_kernels():\n    return True\n")
    meta = "Metadata-Version: 2.1\nName: mixprec\nVersion: 9.9\n"
    info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mixprec/__init__.py", init)
        z.writestr("mixprec-9.9.dist-info/METADATA", meta)
        z.writestr("mixprec-9.9.dist-info/WHEEL", info)
        z.writestr("mixprec-9.9.dist-info/RECORD", "")
    return wheel


def test_the_carried_wheel_is_what_the_parts_import(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path)
    monkeypatch.setattr(gpu_check, "wheels", lambda: [str(wheel)])
    monkeypatch.setattr(gpu_check, "WHEEL_SITE", tmp_path / "site")
    check = gpu_check.Check(_args(tmp_path / "out", "--allow-other-commit"))
    check.out.mkdir()
    assert check.install()
    result = check.results[-1]
    assert result.status == "PASS", result.figure
    assert "wheel mixprec-9.9" in result.figure and str(tmp_path / "site") in result.figure


def _args(out: Path, *argv: str) -> object:
    return gpu_check.parse_args(["--out", str(out), "--no-pack", "--jobs", "2", "--times",
                                 str(out.parent / "times.json"), *argv])


def test_a_cpu_smoke_run_writes_the_summary(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # two cheap parts (the whole smoke run is `make gpu-check-smoke`, a step of `make test`)
    rc = gpu_check.main(["--cpu-smoke", "--only", "optim8,memcheck", "--out", str(tmp_path),
                         "--pack", "--allow-other-commit", "--times", str(tmp_path / "t.json")])
    summary = (tmp_path / "summary.md").read_text()
    assert rc == 0, summary + capsys.readouterr().out
    rows = re.findall(r"^\| (\S+) \| ([\d.]+) \| (\S+) \|", summary, re.M)
    assert [(p, s) for p, _, s in rows] == [("install", "PASS"), ("optim8", "PASS"),
                                            ("memcheck", "PASS")]
    assert "ratio 8-bit / 32-bit" in summary and "odd: 26 passed, 0 failed" in summary
    # the logs packed into one file (a device call brings back 8 files at most)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-check-logs.tar.gz",
                                                          "summary.md", "t.json", "times.json"]


def test_a_part_that_does_not_fit_is_skipped_and_a_hung_one_killed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hang = gpu_check.Part("hang", "x", "sleeps", 1, 1,
                          lambda c: [gpu_check.Step([sys.executable, "-c",
                                                     "import time; time.sleep(60)"])],
                          gpu_check.judge_rc(), smoke=1)
    big = gpu_check.Part("big", "y", "too long", 10**6, 10, lambda c: [], gpu_check.judge_rc(),
                         smoke=10**6)
    monkeypatch.setattr(gpu_check, "PARTS", (hang, big))
    monkeypatch.setattr(gpu_check, "PART_NAMES", ("install", "hang", "big"))
    assert gpu_check.main(["--cpu-smoke", "--out", str(tmp_path), "--budget-s", "30",
                           "--allow-other-commit", "--times", str(tmp_path / "t.json")]) == 1
    summary = (tmp_path / "summary.md").read_text()
    assert re.search(r"\| hang \| x \| FAIL \| \d+ \| timed out", summary), summary
    assert re.search(r"\| big \| y \| SKIP \| 0 \| does not fit", summary), summary


def test_gpu_check_reads_pytest_sanitizer_and_ctest_summaries() -> None:
    out = "....F\nFAILED tests/test_x.py::test_y - AssertionError\n" \
          "3 failed, 1200 passed, 41 skipped, 2 errors in 98.76s (0:01:38)\n"
    assert gpu_check.parse_pytest(out) == {"failed": 3, "passed": 1200, "skipped": 41,
                                           "errors": 2}
    assert gpu_check.parse_pytest("Segmentation fault\n") == {}
    assert gpu_check.parse_pytest("22 deselected in 2.31s\n") == {"deselected": 22}
    assert gpu_check.parse_sanitizer("========= ERROR SUMMARY: 0 errors\n") == 0
    assert gpu_check.parse_sanitizer("========= ERROR SUMMARY: 12 errors\n") == 12
    assert gpu_check.parse_sanitizer("killed\n") is None
    assert gpu_check.parse_workload("gpu_workload: 300 passed, 2 failed, 0 skipped\n") == (
        300, 2, 0)
    assert gpu_check.parse_ctest("92% tests passed, 1 tests failed out of 12\n") == (1, 12)
    # newer ctest, nothing failed
    assert gpu_check.parse_ctest("100% tests passed out of 12\n\nTotal Test time") == (0, 12)
    ctest = ("100% tests passed, 0 tests failed out of 12\n\nThe following tests did not run:"
             "\n\t 11 - mixprec_example_twin_cuda_fp16 (Skipped)\n")
    assert gpu_check.parse_ctest(ctest) == (0, 12)
    assert gpu_check.ctest_skipped(ctest) == ["mixprec_example_twin_cuda_fp16"]


def test_gpu_check_reads_train_mlp() -> None:
    steps = [f"step {i} loss {1.0 - i / 100:.9e} scale 1024.0" + (" skipped" if i == 7 else "")
             for i in range(1, 31)]
    good = "\n".join(steps + ["done: 30 steps, 1 skipped"]) + "\n"
    assert gpu_check.check_train_mlp(good, 30, 7) == (
        True, "30 steps, 1 skipped (at [7]), loss 0.99 -> 0.7")
    # NaN from step 2 on, 29 of 30 steps skipped
    h100 = "\n".join(["step 1 loss 9.2e-01 scale 1024.0"]
                     + [f"step {i} loss nan scale 0.0 skipped" for i in range(2, 31)]
                     + ["done: 30 steps, 29 skipped"])
    assert gpu_check.check_train_mlp(h100, 30, 7)[0] is False
    assert gpu_check.check_train_mlp(good.replace(" skipped\n", "\n", 1), 30, 7)[0] is False
    assert gpu_check.check_train_mlp("crashed", 30, 7) == (False, "no 'done:' line")


def test_gpu_check_stops_at_once_without_a_gpu(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check, "probe", lambda *a: {"torch": "2.x", "cuda": False})
    assert gpu_check.main(["--out", str(tmp_path), "--times", str(tmp_path / "t.json")]) == 2
    assert "no GPU visible (torch.cuda.is_available() is False" in capsys.readouterr().err


def test_gpu_check_reads_its_parts() -> None:
    timings = ("timing gpt2_1x128              -     captured     4.00 ms  1.10 GiB | eager    "
               "10.00 ms  1.20 GiB | torch-graph     5.00 ms  1.00 GiB\n")
    assert gpu_check.parse_timings(timings) == {
        "gpt2_1x128": {"captured": 4.0, "eager": 10.0, "torch-graph": 5.0}}
    ok, figure = gpu_check.judge_speed([timings], [0])
    assert ok and "eager 2.50x" in figure and "torch-graph 1.25x" in figure
    capture = ("correctness fp16_scaler      ok    bitwise equal\n"
               "correctness bf16_8bit        FAIL  AssertionError: 1 mismatch(es)\n") * 2
    assert gpu_check.judge_capture([capture], [1]) == (
        False, "replay == eager bitwise, no host sync: 1/2 configs (fp16_scaler ok, "
               "bf16_8bit FAIL)")
    assert gpu_check.judge_hf(["ModuleNotFoundError: No module named 'transformers'"], [1]) == (
        None, "transformers is not installed on this machine")
    agree = "mixprec vs torch: schedules DIFFER\nmixprec+table vs torch: schedules AGREE\n"
    assert gpu_check.judge_hf([agree], [0])[0] is True
    hung = gpu_check.judge_fsdp2(["step 59 loss 1.0", "Fatal Python error: Aborted"], [0, 124])
    assert hung == (False, "A-bf16 step 59 loss 1.0; B-bf16 hung: killed, stacks in the log")


def test_gpu_check_reads_the_memcheck_sets() -> None:
    text = ("$ compute-sanitizer ... tools/gpu_workload.py --device cuda --sets 2^26\n"
            "     (device memory: peak 1.50 GiB, after 0 MiB; in use after 2.00 GiB)\n"
            "     (device memory: peak 3.25 GiB, after 0 MiB; in use after 2.10 GiB)\n"
            "gpu_workload: 40 passed, 0 failed, 0 skipped\n"
            "========= ERROR SUMMARY: 0 errors\n")
    ok, figure = gpu_check.judge_memcheck([text, text.replace("2^26", "gpt2-small")
                                           .replace("0 failed", "1 failed")], [0, 1])
    assert not ok
    assert figure == ("2^26: memcheck 0 errors, 40 passed, 0 failed, peak 3.2 GiB per check, "
                      "in use after a check 2.0-2.1 GiB; gpt2-small: memcheck 0 errors, "
                      "40 passed, 1 failed, peak 3.2 GiB per check, in use after a check "
                      "2.0-2.1 GiB")
