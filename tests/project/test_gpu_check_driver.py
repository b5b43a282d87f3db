"""tools/gpu_check.py's decisions, on CPU: estimates from measured part times, skips for the
budget and for missing libraries, the summary of a pytest run cut short, the refusal of a
mixprec built at another commit, the bounded wait for the C++ build, and no child process
outliving the driver."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _helpers import REPO

if str(REPO / "tools") not in sys.path:
    sys.path.insert(0, str(REPO / "tools"))

import gpu_check  # noqa: E402
import gpu_jobs  # noqa: E402
import gpu_times  # noqa: E402


def _args(tmp: Path, *argv: str):  # noqa: ANN202
    return gpu_check.parse_args(["--out", str(tmp / "out"), "--no-pack", "--times",
                                 str(tmp / "times.json"), *argv])


def _part(name: str) -> gpu_check.Part:
    return next(p for p in gpu_check.PARTS if p.name == name)


# --- estimates and the budget -----------------------------------------------------------------

def test_a_measured_time_replaces_the_guess_and_decides_what_fits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times = tmp_path / "times.json"
    gpu_times.record([times], "gpu", "e2e", 40.0, False, "PASS", "H200", "2.11", "abc")
    check = gpu_check.Check(_args(tmp_path))
    need, limit, source = check.expect(_part("e2e"))
    assert need == 46 and source.startswith("measured 40 s in ") and "H200" in source
    assert check.expect(_part("optim8"))[2] == "guess"
    # killed at its limit: at least the limit it had
    killed = ({"seconds": 100.0, "timed_out": True}, "x.json")
    need, source = gpu_times.estimate(90, 170, killed)
    assert need == 170 and source.startswith("killed at 100 s")
    # with the guess (150 s) e2e would not fit 420 s after tests and capture; measured, it does
    assert gpu_check.main(["--plan", "--times", str(times), "--wheel", str(_fake_wheel(
        tmp_path, "abc"))]) == 0
    out = capsys.readouterr().out
    e2e = next(line for line in out.splitlines() if " e2e " in line)
    assert "run:" in e2e and "[measured 40 s in " in e2e, out


def test_a_run_records_what_it_measured(tmp_path: Path) -> None:
    gpu_check.main(["--cpu-smoke", "--only", "tests", "--out", str(tmp_path / "out"),
                    "--times", str(tmp_path / "times.json"), "--allow-other-commit"])
    for path in (tmp_path / "times.json", tmp_path / "out" / "times.json"):
        rec = json.loads(path.read_text())["cpu-smoke"]["tests"]
        assert rec["seconds"] > 0 and rec["timed_out"] is False and rec["status"] == "PASS"
    check = gpu_check.Check(_args(tmp_path, "--cpu-smoke"))
    assert check.expect(_part("tests"))[2].startswith("measured ")


def test_a_part_without_its_peer_library_is_skipped_naming_gpu_peers(tmp_path: Path) -> None:
    check = gpu_check.Check(_args(tmp_path))
    check.info["modules"] = {"torchao": False, "transformers": True}
    why = check.missing(_part("fp8"))
    assert "torchao not installed" in why and "make gpu-peers" in why
    assert check.missing(_part("hf-overflow")) == ""
    check.info["modules"] = {"transformers": False}
    assert "carry it as wheels" in check.missing(_part("hf-overflow"))
    check.out.mkdir(parents=True)
    check.run_part(_part("hf-overflow"))
    assert check.results[-1].status == "SKIP" and not check.results[-1].budget


def test_several_wheels_are_refused_rather_than_picked_by_mtime(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check, "wheels", lambda: ["dist/mixprec-1.whl", "dist/mixprec-2.whl"])
    check = gpu_check.Check(_args(tmp_path))
    assert not check.install()
    assert "2 wheels in dist/" in check.results[-1].figure


# --- the summary of a pytest run cut short ----------------------------------------------------

TESTS = '''
import time
def test_a(): pass
def test_b(): pass
def test_c(): assert False
def test_hang(): time.sleep(120)
'''


@pytest.mark.parametrize("kill", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_pytest_run_killed_at_its_limit_still_reports_what_passed(
        tmp_path: Path, kill: int) -> None:
    (tmp_path / "test_cut.py").write_text(TESTS)
    step = _part("tests").steps(gpu_check.Check(_args(tmp_path, "--cpu-smoke")))[0]
    assert step.kill_signal == signal.SIGINT  # what the tests part sends at its limit
    cmd = [c for c in step.cmd if c != "tests/project/test_public_api.py"] + [
        "-p", "no:randomly", str(tmp_path / "test_cut.py")]
    log = tmp_path / "tests.log"
    job = gpu_jobs.Job(cmd, log, dict(os.environ), 12, cwd=tmp_path, kill_signal=kill,
                       grace=5)
    rc = job.wait()
    assert rc == 124
    ok, figure = gpu_check.judge_pytest([log.read_text()], [rc])
    assert not ok
    assert "2 passed" in figure and "1 failed" in figure, figure
    assert "test_cut.py::test_c" in figure
    if kill == signal.SIGKILL:  # no summary at all: the lines it printed test by test
        assert figure.startswith("cut short (exit 124), no pytest summary; so far: ")
        assert "stopped in " in figure and "test_cut.py::test_hang" in figure


def test_pytest_progress_lines_plain_and_xdist() -> None:
    text = ("tests/a.py::t[cuda] PASSED\ntests/a.py::u[cuda] FAILED\n"
            "[gw1] [ 50%] PASSED tests/b.py::v[cuda]\n[gw0] [ 75%] SKIPPED tests/b.py::w\n"
            "tests/c.py::x[cuda] ")
    counts, failed, current = gpu_check.parse_pytest_progress(text)
    assert counts == {"passed": 2, "failed": 1, "skipped": 1}
    assert failed == ["tests/a.py::u[cuda]"] and current == "tests/c.py::x[cuda]"


# --- the commit stamp -------------------------------------------------------------------------

def _fake_wheel(where: Path, commit: str) -> Path:
    """A wheel of a package named mixprec, stamped with ``commit``, importable without torch."""
    import zipfile

    wheel = where / "mixprec-9.9-py3-none-any.whl"
    init = ("__version__ = '9.9'\n"
            "def has_cuda_kernels():\n    return True\n"
            f"def build_info():\n    return {{'git_commit': {commit!r}}}\n")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mixprec/__init__.py", init)
        z.writestr("mixprec-9.9.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: mixprec\nVersion: 9.9\n")
        z.writestr("mixprec-9.9.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("mixprec-9.9.dist-info/RECORD", "")
    return wheel


@pytest.mark.parametrize("allow", [False, True])
def test_a_wheel_of_another_commit_is_refused_unless_allowed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, allow: bool) -> None:
    wheel = _fake_wheel(tmp_path, "0123456789ab")
    monkeypatch.setattr(gpu_check, "WHEEL_SITE", tmp_path / "site")
    monkeypatch.setattr(gpu_times, "tree_commit", lambda: "fedcba987654")
    check = gpu_check.Check(_args(tmp_path, "--wheel", str(wheel),
                                  *(["--allow-other-commit"] if allow else [])))
    check.out.mkdir(parents=True)
    assert check.install() is allow
    figure = check.results[-1].figure
    assert "built at 0123456789ab, the tree is at fedcba987654" in figure
    assert ("allowed by --allow-other-commit" in figure) is allow
    # the same commit: no flag needed; the summary credits the wheel's own commit
    monkeypatch.setattr(gpu_times, "tree_commit", lambda: "0123456789ab")
    check = gpu_check.Check(_args(tmp_path, "--wheel", str(wheel)))
    assert check.install() and "0123456789ab, the tree's commit" in check.results[-1].figure
    assert "built at 0123456789ab" in check.summary()[0]


def test_build_info_names_the_commit_it_was_built_at() -> None:
    import re

    import mixprec

    commit = mixprec.build_info()["git_commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{12}(\+dirty\.[0-9a-f]{8})?|\S+", commit)


def test_commit_verdicts() -> None:
    assert gpu_times.commit_verdict("abc", "abc", False)[0]
    assert not gpu_times.commit_verdict(None, "abc", False)[0]
    assert "no commit stamp" in gpu_times.commit_verdict(None, "abc", False)[1]
    assert not gpu_times.commit_verdict("abc", "", False)[0]
    assert not gpu_times.commit_verdict("abc", "abc+dirty.1234abcd", False)[0]
    assert gpu_times.commit_verdict("abc", "def", True)[0]


def test_setup_stamps_the_commit_the_check_expects() -> None:
    """setup.py's source_commit() (what build_info() carries) and the check's tree_commit()
    agree on this tree, local changes included."""
    tree = ast.parse((REPO / "setup.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "source_commit")
    import commit_stamp

    space: dict = {"os": os, "Path": Path, "ROOT": REPO, "_commit_stamp": commit_stamp}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), space)
    env = os.environ.pop("MIXPREC_GIT_COMMIT", None)
    try:
        assert space["source_commit"](REPO) == gpu_times.tree_commit(REPO) != ""
    finally:
        if env is not None:
            os.environ["MIXPREC_GIT_COMMIT"] = env


# --- the C++ build and the children ---------------------------------------------------------

def test_the_wait_for_the_cpp_build_is_bounded_by_the_budget(tmp_path: Path) -> None:
    check = gpu_check.Check(_args(tmp_path, "--budget-s", "8"))
    check.out.mkdir(parents=True)
    check.cpp_job = gpu_jobs.Job([sys.executable, "-c", "import time; time.sleep(60)"],
                                 check.out / "cpp-build.log", dict(os.environ), 60, cwd=tmp_path)
    t0 = time.monotonic()
    why = check.wait_cpp_build(need=5)
    assert time.monotonic() - t0 < 6
    assert "still running" in why
    check.cpp_job.kill()


DRIVER = '''
import sys, time
sys.path.insert(0, {tools!r})
import gpu_jobs
from pathlib import Path
if sys.argv[1] == "signals":
    gpu_jobs.children().handle_signals()
job = gpu_jobs.Job(["sh", "-c", "sleep 120 & sleep 120"], Path({log!r}), {{}}, 300, cwd=Path("."))
print(job.proc.pid, flush=True)
time.sleep(120)
'''


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_children_die_with_the_driver(tmp_path: Path, how: str) -> None:
    script = DRIVER.format(tools=str(REPO / "tools"), log=str(tmp_path / "child.log"))
    driver = subprocess.Popen([sys.executable, "-c", script,
                               "signals" if how == "SIGTERM" else "plain"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pgid = int(driver.stdout.readline())  # type: ignore[union-attr]
    assert _group_alive(pgid)
    driver.send_signal(getattr(signal, how))
    driver.wait(timeout=10)
    if how == "SIGTERM":  # the driver's own handler killed them (the watchdog is the backstop)
        assert "SIGTERM: killing 1 child process group(s)" in driver.stderr.read()  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _group_alive(pgid)
    if alive:
        os.killpg(pgid, signal.SIGKILL)
    assert not alive, f"the child group outlived a driver killed by {how}"


def test_a_stale_child_of_a_dead_driver_is_killed_at_start() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = dict(os.environ, **{gpu_jobs.MARK: str(dead.pid)})
    stale = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    live = subprocess.Popen(["sleep", "120"], start_new_session=True,
                            env=dict(os.environ, **{gpu_jobs.MARK: str(os.getpid())}))
    try:
        time.sleep(0.2)
        # (only the marks of these two drivers: other runs on a shared machine are theirs)
        killed = gpu_jobs.kill_stale(drivers={dead.pid, os.getpid()})
        assert killed == [stale.pid]
        assert stale.wait(timeout=5) == -signal.SIGKILL
        assert live.poll() is None  # a child of a driver still alive is left alone
    finally:
        for p in (stale, live):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_torch_compile_runs_once_in_its_own_process(tmp_path: Path) -> None:
    check = gpu_check.Check(_args(tmp_path))
    main, compiled = gpu_check.PARTS[[p.name for p in gpu_check.PARTS].index(
        "capture-speed")].steps(check)
    assert "compile" not in main.cmd[main.cmd.index("--variants") + 1].split(",")
    assert compiled.cmd[compiled.cmd.index("--variants") + 1] == "compile"
    assert compiled.cmd[compiled.cmd.index("--workloads") + 1] == "gpt2_1x128"
    text = ("timing gpt2_1x128  -  captured  2.00 ms 1.0 GiB | eager  6.00 ms 1.0 GiB\n",
            "timing gpt2_1x128  -  compile  3.00 ms 1.0 GiB\n")
    assert gpu_check.parse_timings("".join(text))["gpt2_1x128"] == {
        "captured": 2.0, "eager": 6.0, "compile": 3.0}
    ok, figure = gpu_check.judge_speed(list(text), [0, 124])
    assert ok and "compile" not in figure.split(";")[0] and "timed out" in figure


def test_the_summary_ends_with_the_second_call(tmp_path: Path) -> None:
    check = gpu_check.Check(_args(tmp_path, "--cpu-smoke", "--budget-s", "1"))
    check.results.append(gpu_check.Result("e2e", "2.4", "SKIP", "does not fit", budget=True))
    line = check.summary()[-1]
    assert line.startswith("did not fit") and "--only e2e --budget-s 240" in line


def test_the_driver_runs_without_make() -> None:
    out = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), "--plan",
                          "--cpu-smoke", "--times", "/nonexistent"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gpu-check plan (--cpu-smoke)" in textwrap.dedent(out.stdout)
