"""The benchmarks and tools/gpu_workload.py cannot lie: each one verifies the work it
times, flags figures above the copy bandwidth, prints n/a where torch's control cannot
run a case, and its exit status says so. Run in-process on CPU, in tiny configurations
(one torch thread: the checks are about correctness, not speed)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest
import torch

import _cuda_emulation
import mixprec
from _helpers import REPO

ROOT = REPO
for sub in ("benchmarks", "tools"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

import gpu_workload  # noqa: E402

import _common  # noqa: E402
import bench_8bit_accuracy  # noqa: E402
import bench_fsdp2  # noqa: E402
import bench_host_cost  # noqa: E402
import bench_optim  # noqa: E402
import bench_release  # noqa: E402
import bench_scaler  # noqa: E402
import bench_split_masters  # noqa: E402
import bench_unscale  # noqa: E402
from _common import NA, CheckFailed  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _noop(*args: object, **kwargs: object) -> None:
    return None


NoopRun = Callable[[str, Callable[[List[str]], int], List[str]], str]


@pytest.fixture
def fails_with_noop(monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> NoopRun:
    """``run(op, main, argv)``: ``main(argv)`` with ``mixprec.ops.<op>`` doing nothing must
    fail (exit 1); returns its stdout."""
    def run(op: str, main: Callable[[List[str]], int], argv: List[str]) -> str:
        monkeypatch.setattr(mixprec.ops, op, _noop)
        assert main(argv) == 1
        return capsys.readouterr().out

    return run


def _raise_not_implemented(*args: object, **kwargs: object) -> None:
    raise NotImplementedError('"_amp_foreach_non_finite_check_and_unscale_cuda" not '
                              "implemented for 'BFloat16'")


# ---------------------------------------------------------------------------------------------
# bench_unscale

UNSCALE_QUICK: List[str] = ["--quick", "--device", "cpu"]


def test_bench_unscale_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_unscale.main(UNSCALE_QUICK) == 0
    out = capsys.readouterr().out
    assert "all results verified" in out
    assert out.count("quick (3 t, 263K)") == 3  # one row per dtype


def test_bench_unscale_catches_an_op_that_does_nothing(fails_with_noop: NoopRun) -> None:
    out = fails_with_noop("unscale_and_check_", bench_unscale.main,
                          UNSCALE_QUICK + ["--dtypes", "fp16"])
    assert "verification failed" in out and "VERIFICATION FAILED: not timed" in out


def test_bench_unscale_catches_a_skipped_tail(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = mixprec.ops.unscale_and_check_
    # every tensor but the last (3 elements of 263K): only the verification can see it
    monkeypatch.setattr(mixprec.ops, "unscale_and_check_",
                        lambda grads, found, inv: real(grads[:-1], found, inv))
    assert bench_unscale.main(UNSCALE_QUICK + ["--dtypes", "fp32"]) == 1
    assert "3 of 263147 elements off the reference" in capsys.readouterr().out


def test_bench_unscale_flags_a_figure_above_the_copy_bandwidth(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_unscale, "copy_bandwidth", lambda *a: 1e-3)
    assert bench_unscale.main(UNSCALE_QUICK + ["--dtypes", "fp32"]) == 1
    out = capsys.readouterr().out
    table, _, errors = out.partition("1 error(s)")
    assert " !!" in table  # marked in the row, the table printed in full
    assert "of the copy bandwidth" in errors and "skipped work" in errors


def test_bench_unscale_control_without_a_kernel_is_na(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_",
                        _raise_not_implemented)
    assert bench_unscale.main(UNSCALE_QUICK + ["--dtypes", "bf16"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("quick"))
    assert row.split()[6:8] == ["n/a", "n/a"]  # torch ms, ratio
    assert "n/a (quick (3 t, 263K) bf16): torch's op -- NotImplementedError" in out


# ---------------------------------------------------------------------------------------------
# bench_optim

OPTIM_QUICK = ["--quick", "--device", "cpu"]


def test_bench_optim_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_optim.main(OPTIM_QUICK) == 0
    out = capsys.readouterr().out
    assert "all results verified" in out
    for name in ("mixprec AdamW fp16+master, scaler", "torch AdamW(foreach) fp32 + GradScaler"):
        assert any(line.startswith(name) and "x " in line for line in out.splitlines())


def test_bench_optim_state_bytes_counts_the_state_tensors(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """The split masters save 2 and 3 bytes per param against float32 masters, exactly,
    and meet the goals with 8-bit moments (<= 4.04 and <= 3.04)."""
    import _state_bytes

    assert bench_optim.main(["--state-bytes"]) == 0
    out = capsys.readouterr().out
    rows = dict(_state_bytes.table())
    for name, value in rows.items():
        assert f"| {name} | {value:.3f} |" in out
    f32, s16, s8 = (rows[f"mixprec AdamW bf16 + {m}, 8-bit moments"] for m in (
        "float32 masters", "16-bit correction", "8-bit correction"))
    assert f32 - s16 == pytest.approx(2.0, abs=1e-9) and f32 - s8 == pytest.approx(3.0, abs=1e-9)
    assert s16 <= 4.04 and s8 <= 3.04
    assert rows["mixprec AdamW bf16 + float32 masters, 32-bit moments"] == pytest.approx(12.0,
                                                                                     abs=1e-4)
    assert rows["FlashOptim master_weight_bits=24 (8-bit correction), 8-bit moments"] == \
        pytest.approx(3.125, abs=1e-3)


def test_bench_optim_catches_an_optimizer_that_does_nothing(fails_with_noop: NoopRun) -> None:
    out = fails_with_noop("fused_adam_", bench_optim.main, OPTIM_QUICK)
    # the three mixprec cases, and the three 8-bit ones (their small params take fused_adam_)
    assert out.count("VERIFICATION FAILED") == 6
    assert "master weights vs float64 reference" in out


def test_bench_optim_catches_an_8bit_step_that_does_nothing(fails_with_noop: NoopRun) -> None:
    out = fails_with_noop("fused_adam8_", bench_optim.main, OPTIM_QUICK)
    assert out.count("VERIFICATION FAILED") == 3  # the three mixprec 8-bit cases
    assert "AdamW8bit fp32, no scaler" in out


def test_bench_optim_flags_a_figure_above_the_copy_bandwidth(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_optim, "copy_bandwidth", lambda *a: 1e-3)
    assert bench_optim.main(OPTIM_QUICK) == 1
    out = capsys.readouterr().out
    # every timed case (the library controls are n/a where they are not installed)
    timed = [line for line in out.splitlines() if "GB/s" not in line and " !!" in line]
    assert len(timed) >= 9 and out.count(" !!") == len(timed)


def test_bench_optim_control_without_a_kernel_is_na(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = torch.optim.AdamW

    def adamw(*args: object, fused: object = None, **kwargs: object) -> torch.optim.Optimizer:
        if fused:
            raise RuntimeError("`fused=True` is not supported for this device/dtype")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    assert bench_optim.main(OPTIM_QUICK) == 0
    out = capsys.readouterr().out
    assert "torch AdamW(fused) fp32 + GradScaler       n/a: RuntimeError" in out
    assert "mixprec AdamW fp16+master, scaler / torch fused+scaler: n/a" in out
    assert "(no scaler): n/a" in out
    fp16_row = next(line for line in out.splitlines()
                    if line.startswith("mixprec AdamW fp16+master, scaler"))
    assert " n/a " in fp16_row  # its ratio to the missing control


# ---------------------------------------------------------------------------------------------
# bench_scaler

SCALER_QUICK = ["--quick", "--device", "cpu", "--specs", "fp32+bf16-mixed"]


def test_bench_scaler_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_scaler.main(SCALER_QUICK) == 0
    out = capsys.readouterr().out
    assert "all results verified" in out
    assert sum(line.startswith("cpu    fp32+bf16-mixed") for line in out.splitlines()) == 3


def test_bench_scaler_catches_an_unscale_that_does_nothing(fails_with_noop: NoopRun) -> None:
    out = fails_with_noop("unscale_and_check_", bench_scaler.main,
                          SCALER_QUICK + ["--cases", "sgd"])
    assert "VERIFICATION FAILED" in out and "vs torch's" in out


def test_bench_scaler_catches_a_scaler_that_skips_a_step_it_should_take(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def always_inf(tensors: List[torch.Tensor], found: torch.Tensor) -> None:
        found.fill_(1.0)

    monkeypatch.setattr(mixprec.ops, "check_finite_", always_inf)
    assert bench_scaler.main(SCALER_QUICK + ["--cases", "adamw-fused"]) == 1
    assert "VERIFICATION FAILED" in capsys.readouterr().out


def test_bench_scaler_torch_without_bf16_is_na(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # what torch's CUDA unscale does with bf16 grads (it crashes)
    real = torch._amp_foreach_non_finite_check_and_unscale_

    def no_bf16(grads: List[torch.Tensor], found: torch.Tensor, inv: torch.Tensor) -> None:
        if any(g.dtype == torch.bfloat16 for g in grads):
            _raise_not_implemented()
        real(grads, found, inv)

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", no_bf16)
    assert bench_scaler.main(SCALER_QUICK) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu    fp32+bf16")]
    assert len(rows) == 3
    for r in rows:
        assert r[3] == "n/a" and r[6] == "n/a" and r[7] == "n/a"  # torch us, ratios
        assert r[8].startswith("n/a/")  # syncs t/m
    assert "torch's GradScaler -- NotImplementedError" in out


# ---------------------------------------------------------------------------------------------
# the verification helpers on wrong results


def test_bench_host_cost_checks_pass_and_catch_work_not_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_host_cost times CUDA only, but its cases and their checks are device-generic:
    on CPU every check passes, an unscale or an optimizer step that does nothing fails
    its check, and the fit recovers a line."""
    for call, check in bench_host_cost.cases(3, 8, "cpu").values():
        check()
        call()
    # ...unless told to time the CPU path (one-element fp16 params: their masters move)
    assert bench_host_cost.main(["--device", "cpu", "--allow-cpu", "--sizes", "2,5",
                                 "--numel", "1", "--calls", "2", "--rounds", "1"]) == 0
    monkeypatch.setattr(mixprec.ops, "unscale_and_check_", _noop)
    monkeypatch.setattr(mixprec.optim.AdamW, "step", _noop)
    cases = bench_host_cost.cases(3, 8, "cpu")
    for name in ("unscale mixprec.ops", "adamw mixprec", "iter mixprec", "adamw mixprec bf16+m"):
        with pytest.raises(CheckFailed):
            cases[name][1]()
    fixed, per = _common.fit_fixed_per_tensor([10, 100, 1000], [7.0, 16.0, 106.0])
    assert fixed == pytest.approx(6.0) and per == pytest.approx(0.1)
    assert bench_host_cost.main(["--device", "cpu"]) == 2  # times CUDA only...


def test_bench_host_cost_repeats_interleave_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    """--repeats with --baseline: every run has the baseline's rows (a child process on the
    package under the given folder, here this one), and the spread is printed."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(mixprec.__file__)))
    args = "--device cpu --allow-cpu --sizes 2 --numel 1 --calls 2 --rounds 1 --cpu-time"
    repeated = ["--cases", "adamw mixprec", "--repeats", "2", "--baseline", package_root]
    assert bench_host_cost.main(args.split() + repeated) == 0
    out = capsys.readouterr().out
    assert "thread CPU us per call" in out and "spread over 2 repeats" in out
    spread = out.split("spread over 2 repeats")[1]
    assert "adamw mixprec (baseline)" in spread and "nan" not in spread


def test_check_unscaled_tolerance_is_tight() -> None:
    g = torch.randn(1000).to(torch.float16)
    exact = (g.float() * 0.3).to(torch.float16)
    _common.check_unscaled([g], [exact], 0.3, "exact")
    off = exact.clone()
    off.view(torch.int16)[17] += 1  # one float16 ulp further from zero
    with pytest.raises(CheckFailed, match=r"1 of 1000 elements off the reference; worst at \[17\]"):
        _common.check_unscaled([g], [off], 0.3, "one element one ulp off")
    with pytest.raises(CheckFailed):
        _common.check_unscaled([g], [g.clone()], 0.3, "not unscaled")


def test_check_optimizer_result_catches_a_master_that_never_moves() -> None:
    """A broken step: the fp16 master never moved and the param held the update
    computed from w = 0."""
    w0 = [torch.randn(4096) * 0.02]
    g = [torch.randn(4096) * 1e-3]
    ref, movement, _ = _common.reference_run(torch.optim.AdamW, {"lr": 1e-3},
                                             _common.flat64(w0), [_common.flat64(g)])
    good_master = [ref.float()]
    _common.check_optimizer_result("good", [good_master[0].half()], good_master, ref,
                                   movement, 1)
    stale_master = [w0[0].clone()]
    with pytest.raises(CheckFailed, match="master weights vs float64 reference"):
        _common.check_optimizer_result("bug", [(ref - w0[0].double()).half()], stale_master,
                                       ref, movement, 1)
    # a param that is not its master rounded to nearest
    with pytest.raises(CheckFailed, match="rounded to nearest"):
        _common.check_optimizer_result("param", [w0[0].half()], good_master, ref, movement, 1)


def test_check_stochastic_rounding_catches_no_update() -> None:
    # steps (1e-3) well below the bfloat16 spacing (2**-7 in [1, 2)): a do-nothing kernel
    # stays within a spacing of the reference everywhere; only the aggregate sees it
    n = 20000
    p0 = [(1.0 + 0.1 * torch.randn(n)).to(torch.bfloat16)]
    g = [torch.randn(n).clamp(-2, 2)]  # steps <= 2e-3 < 2**-8, the spacing below 1
    ref, movement, _ = _common.reference_run(torch.optim.SGD, {"lr": 1e-3},
                                             _common.flat64(p0), [_common.flat64(g)])
    with pytest.raises(CheckFailed, match=r"moved 0.000 of the reference's way"):
        _common.check_stochastic_rounding("no-op", p0, [p0[0].clone()], ref, movement, 1)
    # unbiased rounding of the reference passes
    lo = ref.to(torch.bfloat16).double()
    lo = torch.where(lo > ref, lo - _common.spacing(ref, torch.bfloat16), lo)
    hi = lo + _common.spacing(lo, torch.bfloat16)
    up = torch.rand(n, dtype=torch.float64) < (ref - lo) / (hi - lo)
    sr = torch.where(up, hi, lo).to(torch.bfloat16)
    note = _common.check_stochastic_rounding("sr", p0, [sr], ref, movement, 1)
    assert note is not None and note.startswith("moved")


def test_report_and_run_control() -> None:
    report = _common.Report("t")
    assert report.check_bandwidth("ok", 104.0, 100.0, "cuda") == ""
    assert report.check_bandwidth("bad", 106.0, 100.0, "cuda") == " !!"
    assert report.check_bandwidth("cpu ok", 140.0, 100.0, "cpu") == ""
    assert report.check_bandwidth("cpu bad", 151.0, 100.0, "cpu") == " !!"
    assert len(report.errors) == 2 and report.finish() == 1
    assert _common.Report("strict", 0.0).check_bandwidth("x", 100.5, 100.0, "cpu") == " !!"
    assert isinstance(_common.run_control(_raise_not_implemented), NA)

    def unsupported() -> None:
        raise RuntimeError("\"foo_cuda\" not implemented for 'BFloat16'")

    def real_error() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert str(_common.run_control(unsupported)) == "n/a"
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _common.run_control(real_error)
    assert _common.fmt(NA("x"), ".2f", 6) == "   n/a"
    assert _common.ratio(1.0, NA("x")) is None


# ---------------------------------------------------------------------------------------------
# tools/gpu_workload.py (what `make gpu-check` runs under compute-sanitizer), on CPU

WORKLOAD_QUICK = ["--device", "cpu", "--sets", "odd,gpt2-tiny", "--max-numel", "40000"]


def test_gpu_workload_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_workload.main(WORKLOAD_QUICK) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out
    for line in ("ok   odd optim.AdamW bf16+sr", "ok   gpt2-tiny optim.SGD fp16+masters",
                 "ok   gpt2-tiny fused_adam_/fused_sgd_ direct",
                 "ok   gpt2-tiny fused_adam8_/fused_sgd8_ direct",
                 "ok   odd bf16 unscale_and_norm_ + check_finite_and_norm_",
                 "ok   odd mixed dtypes unscale_and_check_",
                 "ok   update_scale_ / update_scale_ext_"):
        assert line in out


def test_gpu_workload_catches_a_broken_optimizer(fails_with_noop: NoopRun) -> None:
    out = fails_with_noop("fused_sgd_", gpu_workload.main, ["--device", "cpu", "--sets", "odd"])
    assert "4 failed" in out  # SGD in its four configurations
    assert "FAIL odd optim.SGD fp16+masters" in out


# ---------------------------------------------------------------------------------------------
# bench_8bit_accuracy (the 8-bit accuracy study; --quick is its smoke run)

def test_bench_8bit_accuracy_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn", reason="the digits task needs scikit-learn")
    assert bench_8bit_accuracy.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for task in ("digits", "tiny LM"):
        assert re.search(rf"verdict \({task}\).*\n.*mixprec AdamW8bit .*(WITHIN|below)", out)


def test_bench_8bit_accuracy_master_rows_quick_pass(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn", reason="the digits task needs scikit-learn")
    assert bench_8bit_accuracy.main(["--quick", "--settings", "masters"]) == 0
    out = capsys.readouterr().out
    for task in ("digits", "tiny LM"):
        verdict = out.split(f"verdict ({task}): 'bf16 masters f32' spread")[1]
        for name in bench_8bit_accuracy.MASTER_ROWS:
            if name != bench_8bit_accuracy.BF16_REF:
                assert re.search(rf"  {re.escape(name)} +mean final loss", verdict), name
    assert "mixprec AdamW8bit" not in out


def test_bench_8bit_accuracy_catches_an_8bit_step_that_does_nothing(
        fails_with_noop: NoopRun) -> None:
    pytest.importorskip("sklearn", reason="the digits task needs scikit-learn")
    out = fails_with_noop("fused_adam8_", bench_8bit_accuracy.main, ["--quick"])
    failed = out.split("FAILED:")[1]
    assert "mixprec AdamW8bit" in failed and "mixprec AdamW 32-bit" not in failed


# ---------------------------------------------------------------------------------------------
# bench_host_cost --emulated (the CUDA ops' host path on the CPU) and bench_fsdp2


@pytest.mark.skipif(not _cuda_emulation.available(), reason="needs the test extension")
def test_bench_host_cost_emulated_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_host_cost.main(["--emulated", "--sizes", "1,30", "--min-run-time", "0.01"]) == 0
    out = capsys.readouterr().out
    for row in bench_host_cost.emulated_cases(1):
        assert row in out


@pytest.mark.skipif(mixprec._dtensor.fsdp2_unavailable() is not None or sys.platform == "win32",
                    reason="needs FSDP2 and gloo")
def test_bench_fsdp2_quick_passes(capfd: pytest.CaptureFixture[str]) -> None:
    # two tiny sizes, one round: the cases run, their checks pass (every param moved)
    assert bench_fsdp2.main(["--sizes", "2,4", "--calls", "2", "--rounds", "1"]) == 0
    out = capfd.readouterr().out
    for row in ("adamw mixprec", "iter mixprec", "adamw torch", "all-reduce (MAX)",
                "per-param ratio"):
        assert row in out


def test_adam_l2_cancellation_is_within_the_slack() -> None:
    """Adam's L2 decay nearly cancelling the grad (g ~ -wd * w): the float32 rounding of
    wd * w, divided by a tiny sqrt(v_hat) + eps, moves mixprec's float32 step far past
    the plain bound (one element in 2^24 random ones did on a GPU); reference_run's
    slack covers it. AdamW (decoupled decay) gets no slack."""
    torch.manual_seed(0)
    n, wd, lr = 1 << 14, 0.01, 1e-3
    w = torch.rand(n) + 0.5
    g = (-(wd * w.double()) + torch.randn(n, dtype=torch.float64) * 1e-7).float()
    p = torch.nn.Parameter(w.clone())
    opt = mixprec.optim.Adam([p], lr=lr, weight_decay=wd)
    p.grad = g.clone()
    opt.step()
    ref, movement, slack = _common.reference_run(
        torch.optim.Adam, {"lr": lr, "weight_decay": wd}, w.double(), [g.double()])
    err = (p.detach().double() - ref).abs()
    assert int((err > _common.optimizer_tolerance(ref, movement, 1)).sum()) > n // 10
    _common.check_optimizer_result("adam l2", [p.detach()], [], ref, movement, 1, slack)
    _, _, none = _common.reference_run(torch.optim.AdamW, {"lr": lr, "weight_decay": wd},
                                       w.double(), [g.double()])
    assert not none.any()


# ---------------------------------------------------------------------------------------------
# bench_builds (two builds side by side; here the same build twice)


def test_bench_builds_runs_both_builds(capsys: pytest.CaptureFixture[str]) -> None:
    import bench_builds

    other = str(Path(mixprec.__file__).resolve().parent.parent)  # the build under test
    argv = ["--other", other, "--rounds", "1", "--row", "256", "--steps", "2",
            "--cases", "adamw8-fp32-4096,adamw-bf16-4096,unscale-3x1024"]
    assert bench_builds.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("this/other") == 3


def test_bench_builds_catches_a_step_that_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_builds

    monkeypatch.setattr(mixprec.ops, "fused_adam8_", _noop)
    with pytest.raises(SystemExit, match="did not run"):
        bench_builds.run_case("adamw8-fp32-4096", 256, 2)


def test_bench_builds_catches_an_unscale_that_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_builds

    monkeypatch.setattr(mixprec.ops, "unscale_and_check_", _noop)
    with pytest.raises(SystemExit, match="did not multiply"):
        bench_builds.run_case("unscale-3x1024", 256, 2)


# ---------------------------------------------------------------------------------------------
# bench_release

RELEASE_QUICK = ["--layers", "1", "--d", "64", "--heads", "2", "--tokens", "8",
                 "--bucket-mib", "0.01"]


def test_bench_release_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_release.main(RELEASE_QUICK) == 0
    out = capsys.readouterr().out
    assert "layer stack: peak release / without" in out and "bitwise equal: True" in out


def test_bench_release_catches_a_release_that_steps_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mixprec.optim.release import GradientRelease

    def free_only(self: GradientRelease) -> None:  # frees the grads, steps nothing
        for p in self._pending:
            p.grad = None
        self._pending.clear()
        self._pending_bytes = 0

    monkeypatch.setattr(GradientRelease, "flush", free_only)
    assert bench_release.main(RELEASE_QUICK) == 1
    assert "bitwise equal: False" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# bench_split_masters

SPLIT_QUICK = ["--log2", "10", "--tensors", "2", "--rounds", "1"]


def test_bench_split_masters_quick_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_split_masters.main(SPLIT_QUICK) == 0
    out = capsys.readouterr().out
    assert "2^10 elements: float32" in out and "split16" in out and "split8" in out


def test_bench_split_masters_catches_a_correction_narrower_than_asked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = bench_split_masters._make

    def eight_for_sixteen(n: int, tensors: int, bits: Optional[int], state_bits: int,
                          seed: int) -> mixprec.optim.AdamW:
        # the 16-bit form built with 8 bits: its masters are off by more than one ulp
        return real(n, tensors, 8 if bits == 16 else bits, state_bits, seed)

    monkeypatch.setattr(bench_split_masters, "_make", eight_for_sixteen)
    assert bench_split_masters.main(SPLIT_QUICK) == 1
    assert "masters are off" in capsys.readouterr().out
