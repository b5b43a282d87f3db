"""`make gpu-check`: the open GPU items, most important first, on a GPU machine without
network, within one device call.

It installs the carried wheel (``dist/*.whl``; none carried: builds from source in place),
then runs the parts below in this order, each in its own time limit, skipping a part whose
expected time no longer fits the total budget (``--budget-s``, default 540 s: one device
call is at most 600 s). One summary table (``summary.md``) and one log per part go to
``--out`` (default ``$OUT`` when set, else build/gpu-check).

``--plan`` prints the parts, their commands and expected times, and exits.
``--cpu-smoke`` runs every part that can run without a GPU on the CPU at tiny sizes (the
others are SKIP): it is a step of ``make test``, so the driver and its scripts keep working.
``--only`` / ``--skip`` pick parts (e.g. a second call for what did not fit the first).

Exit status: 0 when every part that ran passed, 1 when one failed, 2 when no GPU is
visible (without ``--cpu-smoke``) or the arguments are wrong.

    python tools/gpu_check.py [--python PY] [--plan] [--cpu-smoke] [--budget-s S]
                              [--only PART,...] [--skip PART,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
# torchao and bitsandbytes for a machine without network (`make gpu-peers`)
PEERS = ROOT / ".gpu_peers"
DEFAULT_BUDGET_S = 540.0
SMOKE_BUDGET_S = 120.0
CPP_TESTS_DIR = "build/gpu-check-cmake-tests"
# where a carried wheel is installed (pip --target): first on every part's PYTHONPATH, so the
# wheel is what the parts import, whatever else the interpreter has; nothing system-wide
WHEEL_SITE = ROOT / "build" / "gpu-check-wheel"


# ---------------------------------------------------------------------------------------------
# output parsers (pure functions; tests/project/test_benchmarks.py covers them)


def parse_pytest(text: str) -> Dict[str, int]:
    """Counts from pytest's final summary line ("3 failed, 1200 passed, 4 skipped in 9s")."""
    counts: Dict[str, int] = {}
    lines = [line for line in text.splitlines()
             if re.search(r"\d+ (passed|failed|error|skipped|deselected)|no tests ran", line)
             and re.search(r" in [\d.]+s", line)]
    if not lines:
        return counts
    for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)",
                              lines[-1]):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def parse_sanitizer(text: str) -> Optional[int]:
    """The error count of compute-sanitizer's "ERROR SUMMARY: N errors" line, or None."""
    m = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    return int(m[-1]) if m else None


def parse_workload(text: str) -> Optional[Tuple[int, int, int]]:
    """(passed, failed, skipped) from gpu_workload's last line, or None."""
    m = re.findall(r"gpu_workload: (\d+) passed, (\d+) failed, (\d+) skipped", text)
    return tuple(int(x) for x in m[-1]) if m else None  # type: ignore[return-value]


def parse_ctest(text: str) -> Optional[Tuple[int, int]]:
    """(failed, total) from ctest's "N% tests passed, F tests failed out of T" (or, when
    none failed, newer ctest's "100% tests passed out of T")."""
    m = re.findall(r"tests passed(?:, (\d+) tests? failed)? out of (\d+)", text)
    return (int(m[-1][0] or 0), int(m[-1][1])) if m else None


def ctest_skipped(text: str) -> List[str]:
    """Names of the tests ctest lists as "(Skipped)" (it counts them as passed)."""
    return re.findall(r"^\s*\d+ - (\S+) \(Skipped\)", text, re.M)


def check_train_mlp(text: str, steps: int, inject_inf: int) -> Tuple[bool, str]:
    """train_mlp's output: ``steps`` steps, exactly one skipped and it is ``inject_inf``,
    every loss finite, the last loss below the first. Returns (ok, what was seen)."""
    done = re.search(r"^done: (\d+) steps, (\d+) skipped", text, re.M)
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)", text, re.M)]
    skipped = [int(x) for x in re.findall(r"^step (\d+) loss \S+ scale \S+ skipped", text, re.M)]
    if not done:
        return False, "no 'done:' line"
    seen = (f"{done[1]} steps, {done[2]} skipped (at {skipped or 'none'}), loss "
            f"{losses[0] if losses else float('nan'):.4g} -> "
            f"{losses[-1] if losses else float('nan'):.4g}")
    ok = (int(done[1]) == steps and int(done[2]) == 1 and skipped == [inject_inf]
          and len(losses) == steps and all(math.isfinite(x) for x in losses)
          and losses[-1] < losses[0])
    return ok, seen


# ---------------------------------------------------------------------------------------------
# running commands


class Job:
    """A command in its own process group, its output appended to a log file. At its time
    limit the group gets ``kill_signal`` (SIGABRT makes PYTHONFAULTHANDLER print every
    thread's stack), then SIGKILL."""

    def __init__(self, cmd: Sequence[str], log: Path, env: Dict[str, str], timeout: float,
                 cwd: Path = ROOT, kill_signal: int = signal.SIGTERM) -> None:
        self.cmd = list(cmd)
        self.log = log
        self.timeout = max(timeout, 1.0)
        self.kill_signal = kill_signal
        self.start = time.monotonic()
        self.timed_out = False
        with open(log, "a") as f:
            f.write(f"\n$ {' '.join(self.cmd)}\n")
        self._out = open(log, "a")
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> int:
        """Wait for the command (killing its group at the limit); its exit status, 124 when
        it ran out of time."""
        try:
            rc = self.proc.wait(timeout=max(self.timeout - (time.monotonic() - self.start), 0))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            rc = 124
        self._out.close()
        with open(self.log, "a") as f:
            killed = f", killed at its {self.timeout:.0f} s limit" if self.timed_out else ""
            f.write(f"[exit {rc}{killed}, {self.seconds:.1f} s]\n")
        return rc

    def kill(self) -> None:
        for sig in (self.kill_signal, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start


def tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    | " + line for line in lines[-n:])


def which_sanitizer() -> Optional[str]:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        for sub in ("bin", "compute-sanitizer"):
            p = Path(home) / sub / "compute-sanitizer"
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def probe(python: str, env: Dict[str, str], code: str) -> Dict[str, object]:
    """Run ``code`` (which prints one JSON object) in ``python``; {} when it fails."""
    try:
        out = subprocess.run([python, "-c", code], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (out.stderr or out.stdout).strip()[-500:]}


TORCH_PROBE = """
import json, torch
d = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
     "cuda_version": torch.version.cuda}
if d["cuda"]:
    major, minor = torch.cuda.get_device_capability()
    d.update(arch=f"{major}.{minor}", gpu=torch.cuda.get_device_name())
try:
    import xdist  # noqa: F401
    d["xdist"] = True
except ImportError:
    d["xdist"] = False
print(json.dumps(d))
"""
MIXPREC_PROBE = """
import json, mixprec
print(json.dumps({"version": mixprec.__version__, "cuda_kernels": mixprec.has_cuda_kernels(),
                  "file": mixprec.__file__}))
"""


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (sha + ("+local changes" if dirty.strip() else "")) if sha else "unknown"


# ---------------------------------------------------------------------------------------------
# the parts


@dataclasses.dataclass
class Step:
    """One command of a part; ``share`` of the part's limit is its own limit."""

    cmd: List[str]
    share: float = 1.0
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    kill_signal: int = signal.SIGTERM
    cwd: Optional[str] = None


# (the output of each step, the exit status of each) -> (passed, or None: could not run
# here, e.g. a library missing on the GPU machine; the figure)
Judge = Callable[[List[str], List[int]], Tuple[Optional[bool], str]]


@dataclasses.dataclass
class Part:
    """One GPU item: its commands, how its outcome is read, its expected time on one H100
    (what decides whether it still fits) and its hard limit. ``smoke`` is its expected
    time in ``--cpu-smoke`` (0: it needs a GPU and is SKIP there)."""

    name: str
    item: str
    what: str
    estimate: float
    limit: float
    steps: Callable[[Check], List[Step]]
    judge: Judge
    smoke: float = 0.0
    cpp_build: bool = False  # waits for the C++ build started in the background


def _last_line(text: str, pattern: str = r"\S") -> str:
    lines = [" ".join(line.split()) for line in text.splitlines()
             if re.search(pattern, line) and not line.startswith(("[exit ", "$ "))]
    return lines[-1][:160] if lines else ""


def judge_rc(pattern: str = r"\S") -> Judge:
    """Every step exited 0; the figure is the last line matching ``pattern``."""
    def judge(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
        bad = [f"step {i + 1} exit {rc}" for i, rc in enumerate(rcs) if rc != 0]
        figure = "; ".join(filter(None, (_last_line(t, pattern) for t in texts)))
        return not bad, ("; ".join(bad) + ": " if bad else "") + figure
    return judge


def judge_lines(*patterns: str) -> Judge:
    """Every step exited 0; the figure is the last line matching each of ``patterns``."""
    def judge(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
        text = "\n".join(texts)
        figure = "; ".join(filter(None, (_last_line(text, p) for p in patterns)))
        bad = [f"step {i + 1} exit {rc}" for i, rc in enumerate(rcs) if rc != 0]
        return not bad, ("; ".join(bad) + ": " if bad else "") + figure
    return judge


def judge_pytest(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    c = parse_pytest(texts[-1])
    figure = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "errors", "skipped",
                                               "deselected") if k in c) or "no pytest summary"
    return rcs[-1] == 0 and c.get("passed", 0) > 0, figure


def judge_capture(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    rows = re.findall(r"^correctness (\S+)\s+(ok|FAIL)", texts[-1], re.M)
    n = len(rows) // 2 or len(rows)  # (each row is printed as it comes and in the table)
    ok = sum(s == "ok" for _, s in rows[:n])
    return rcs[-1] == 0 and ok == n > 0, (
        f"replay == eager bitwise, no host sync: {ok}/{n} configs ("
        + ", ".join(f"{c} {s}" for c, s in rows[:n]) + ")")


def parse_timings(text: str) -> Dict[str, Dict[str, float]]:
    """{workload: {variant: ms}} from gpu_capture_check's timing rows."""
    out: Dict[str, Dict[str, float]] = {}
    for work, cells in re.findall(r"^timing (\S+)\s+-\s+(.*)$", text, re.M):
        out[work] = {v: float(ms) for v, ms in re.findall(r"(\S+)\s+([\d.]+) ms", cells)}
    return out


def judge_speed(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    rows = parse_timings(texts[-1])
    parts = []
    for work, ms in rows.items():
        cap = ms.get("captured")
        parts.append(work + ": " + ", ".join(
            f"{v} {cap and ms[v] / cap:.2f}x" for v in ms if v != "captured" and cap))
    return rcs[-1] == 0 and bool(rows), ("speed-up of mixprec captured over: "
                                         + "; ".join(parts) if rows else "no timings")


def judge_ctest(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    counts, skipped = parse_ctest(texts[0]), ctest_skipped(texts[0])
    ok = rcs[0] == 0 and counts is not None and counts[0] == 0 and not skipped
    parts = [f"ctest {counts[1] - counts[0]}/{counts[1]} passed" if counts
             else f"ctest: no summary (exit {rcs[0]})"]
    if skipped:
        parts.append(f"skipped on a GPU machine: {', '.join(skipped)}")
    for (dtype, steps, inject), text, rc in zip(TRAIN_MLP, texts[1:], rcs[1:]):
        good, seen = check_train_mlp(text, steps, inject)
        ok = ok and good and rc == 0
        parts.append(f"train_mlp {dtype}: {seen}")
    return ok, "; ".join(parts)


def judge_memcheck(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    ok, parts = True, []
    for text, rc in zip(texts, rcs):
        name = (re.findall(r"--sets (\S+)", text) or ["?"])[0]
        errors, work = parse_sanitizer(text), parse_workload(text)
        peaks = [float(x) for x in re.findall(r"device memory: peak ([\d.]+) GiB", text)]
        used = [float(x) for x in re.findall(r"in use after ([\d.]+) GiB", text)]
        good = rc == 0 and work is not None and work[1] == 0 and errors in (0, None)
        ok = ok and good
        parts.append(f"{name}: " + ("memcheck " + ("?" if errors is None else str(errors))
                                    + " errors, " if errors is not None or rc else "")
                     + (f"{work[0]} passed, {work[1]} failed" if work else f"exit {rc}")
                     + (f", peak {max(peaks):.1f} GiB per check" if peaks else "")
                     + (f", in use after a check {min(used):.1f}-{max(used):.1f} GiB"
                        if used else ""))
    return ok, "; ".join(parts)


def judge_fsdp2(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    parts = []
    for recipe, text, rc in zip(FSDP2_RECIPES, texts, rcs):
        seen = "hung: killed, stacks in the log" if rc == 124 else f"exit {rc}"
        if rc == 0:
            seen = _last_line(text, r"step|loss") or "ok"
        parts.append(f"{recipe} {seen}")
    return all(rc == 0 for rc in rcs), "; ".join(parts)


def judge_hf(texts: List[str], rcs: List[int]) -> Tuple[Optional[bool], str]:
    missing = re.findall(r"No module named '(\w+)'", texts[0])
    if missing:
        return None, f"{missing[0]} is not installed on this machine"
    agree = re.findall(r"^(mixprec\S* vs torch: schedules \w+)", texts[0], re.M)
    return rcs[0] == 0 and "mixprec+table vs torch: schedules AGREE" in agree, "; ".join(agree)


TRAIN_MLP = (("bf16", 40, 20), ("fp16", 30, 7))
MEMCHECK_SETS = ("2^26", "gpt2-small")
FSDP2_RECIPES = ("A-bf16", "B-bf16")
E2E_VARIANTS = "amp-torch,amp-mpopt,fp16-m,bf16-m,bf16-sr,bf16-m8"


def _py(c: Check, *args: str) -> List[str]:
    return [c.py, *args]


def steps_tests(c: Check) -> List[Step]:
    if c.smoke:
        return [Step(_py(c, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "tests/project/test_public_api.py"))]
    cmd = _py(c, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "-m", "cuda",
              *c.args.tests.split())
    if c.info.get("xdist"):
        cmd += ["-n", "8"]
    return [Step(cmd)]


def steps_capture(c: Check) -> List[Step]:
    extra = ["--device", "cpu", "--dry-run", "--steps", "6"] if c.smoke else \
        ["--correctness-limit", "50"]
    return [Step(_py(c, "tools/gpu_capture_check.py", "--only", "correctness", *extra))]


def steps_cpp_capture(c: Check) -> List[Step]:
    return [Step(["ctest", "--test-dir", CPP_TESTS_DIR, "-L", "gpu", "--output-on-failure",
                  "--no-tests=error"])]


def steps_demo(c: Check) -> List[Step]:
    return [Step(_py(c, "examples/train_digits.py", "--capture", "--no-progress", "--out",
                     os.path.join(tempfile.gettempdir(), "gpu-check-demo.png")))]


def steps_speed(c: Check) -> List[Step]:
    if c.smoke:
        extra = ["--device", "cpu", "--dry-run", "--workloads", "gpt2_1x128",
                 "--variants", "captured,eager,torch-graph"]
    else:
        extra = ["--workloads", "gpt2_1x128,gpt2_8x1024,convnet", "--timing-limit", "40"]
    return [Step(_py(c, "tools/gpu_capture_check.py", "--only", "timings", *extra))]


def steps_e2e(c: Check) -> List[Step]:
    if c.smoke:
        return [Step(_py(c, "benchmarks/bench_e2e.py", "--device", "cpu", "--layers", "1",
                         "--d-model", "64", "--heads", "4", "--vocab", "256", "--batch", "2",
                         "--seq", "16", "--ctx", "16", "--warmup", "2", "--steps", "3",
                         "--repeats", "1", "--threads", "1", "--variants", "fp32,bf16-m"))]
    steps = []
    for preset in ("small", "large"):
        cmd = _py(c, "benchmarks/bench_e2e.py", "--device", "cuda", "--preset", preset,
                  "--repeats", "2", "--warmup", "3", "--steps", "15", "--variants",
                  E2E_VARIANTS)
        steps.append(Step(cmd, share=0.5 if not c.args.baseline else 0.25))
        if c.args.baseline:  # the same, with the package under DIR (e.g. the last release)
            steps.append(Step(cmd, share=0.25, env={"PYTHONPATH": c.args.baseline}))
    return steps


def steps_fp8(c: Check) -> List[Step]:
    if c.smoke:
        return [Step(_py(c, "benchmarks/bench_fp8.py", "--device", "cpu", "--tiny"))]
    return [Step(_py(c, "benchmarks/bench_fp8.py", "--device", "cuda", "--time-limit", "20",
                     "--steps", "20"))]


def steps_optim8(c: Check) -> List[Step]:
    extra = ["--device", "cpu", "--small"] if c.smoke else []
    return [Step(_py(c, "tools/gpu_profile8.py", *extra))]


def steps_memcheck(c: Check) -> List[Step]:
    if c.smoke:  # the workload itself, on CPU, without the sanitizer
        return [Step(_py(c, "tools/gpu_workload.py", "--device", "cpu", "--sets", "odd",
                         "--max-numel", "33000"))]
    sanitizer = which_sanitizer() or "compute-sanitizer"
    return [Step([sanitizer, "--tool", "memcheck", "--error-exitcode", "99", "--leak-check",
                  "no", "--print-limit", "20", "--kernel-name", "kns=mixprec", c.py,
                  "tools/gpu_workload.py", "--device", "cuda", "--sets", s,
                  "--max-check-gib", str(c.args.max_check_gib)],
                 share=1 / len(MEMCHECK_SETS), env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
            for s in MEMCHECK_SETS]


def steps_fsdp2(c: Check) -> List[Step]:
    recipes = FSDP2_RECIPES[:1] if c.smoke else FSDP2_RECIPES  # (on CPU: the same code path)
    return [Step(_py(c, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                     "examples/fsdp2_train.py", "--device", c.device, "--recipe", r,
                     "--steps", "2" if c.smoke else "60"),
                 share=1 / len(recipes), env={"PYTHONFAULTHANDLER": "1"},
                 kill_signal=signal.SIGABRT)
            for r in recipes]


def steps_bench(c: Check) -> List[Step]:
    if c.smoke:
        return [Step(_py(c, "benchmarks/bench_unscale.py", "--device", "cpu", "--quick"))]
    return [Step(_py(c, "benchmarks/bench_unscale.py", "--device", "cuda", "--min-run-time",
                     "0.1"), share=0.3),
            Step(_py(c, "benchmarks/bench_scaler.py", "--device", "cuda", "--rounds", "1",
                     "--min-run-time", "0.2"), share=0.25),
            Step(_py(c, "benchmarks/bench_optim.py", "--device", "cuda", "--rounds", "2",
                     "--min-run-time", "0.2"), share=0.45)]


def steps_hf(c: Check) -> List[Step]:
    return [Step(_py(c, "tools/gpu_hf_overflow.py", "--steps", "12", "--overflow", "3,7"))]


def steps_cpp(c: Check) -> List[Step]:
    exe = str(ROOT / CPP_TESTS_DIR / "example" / "train_mlp")
    return [Step(["ctest", "--test-dir", CPP_TESTS_DIR, "--output-on-failure", "-j", "8"],
                 share=0.6)] + [
        Step([exe, "--device", "cuda", "--dtype", d, "--steps", str(n), "--inject-inf", str(i)],
             share=0.2) for d, n, i in TRAIN_MLP]


# In priority order (issue list of the GPU items): the install is part 0, run first.
PARTS: Tuple[Part, ...] = (
    Part("tests", "2.1", "the CUDA tests (pytest -m cuda) on the installed package",
         180, 240, steps_tests, judge_pytest, smoke=5),
    Part("capture", "2.2", "capture correctness: replay == eager bitwise over 50 steps under "
         "sync debug mode 'error' (fp16+masters+scaler+overflows, bf16+8-bit, bf16+SR)",
         90, 170, steps_capture, judge_capture, smoke=6),
    Part("cpp-capture", "2.2", "the C++ CapturedStep GPU test (ctest -L gpu)",
         30, 90, steps_cpp_capture, judge_rc(r"tests passed|tests failed"), cpp_build=True),
    Part("demo", "2.2", "make demo's captured run on CUDA (examples/train_digits.py "
         "--capture)", 60, 120, steps_demo, judge_rc(r"acc|captur|step")),
    Part("capture-speed", "2.3", "GPT-2 small 1x128 and 8x1024, conv net batch 8: mixprec "
         "captured | mixprec eager | torch eager AMP | torch.compile reduce-overhead | torch's "
         "hand-written whole-step capture; ms and peak memory",
         150, 220, steps_speed, judge_speed, smoke=6),
    Part("e2e", "2.4", "GPT-2 small end to end at 1x128 and 8x1024 (--baseline DIR: the same "
         "with the package under DIR, e.g. the last release)",
         150, 200, steps_e2e, judge_lines(r"^amp-torch ", r"^bf16-m ", r"checks passed|FAILED"),
         smoke=7),
    Part("fp8", "2.5", "FP8 on the ~1B stack: per recipe vs BF16 + mixprec vs torchao + "
         "torch fused AdamW, tokens/s and peak memory",
         150, 220, steps_fp8,
         judge_lines(r"^fp8 rowwise \+ mixprec", r"^torchao fp8", r"^check"), smoke=10),
    Part("optim8", "2.6", "the 8-bit CUDA step profiled beside the 32-bit one at GPT-2 small "
         "(ratio, share of the copy bandwidth, kernel table)",
         40, 90, steps_optim8, judge_lines(r"^ratio", r"of the copy"), smoke=6),
    Part("memcheck", "2.7", "compute-sanitizer memcheck over the 2^26 and gpt2-small sets, "
         "one process per set, device memory bounded per check",
         300, 320, steps_memcheck, judge_memcheck, smoke=8),
    Part("fsdp2", "2.8", "examples/fsdp2_train.py recipes A and B, world size 1, nccl, "
         "PYTHONFAULTHANDLER=1, SIGABRT at the limit",
         80, 130, steps_fsdp2, judge_fsdp2, smoke=6),
    Part("bench", "-", "bench_unscale, bench_scaler, bench_optim (8-bit beside torchao and "
         "bitsandbytes from .gpu_peers)", 120, 150, steps_bench,
         judge_rc(r"verified|error"), smoke=7),
    Part("hf-overflow", "-", "HF Trainer fp16 with forced overflows: the lr each optimizer "
         "gets", 60, 90, steps_hf, judge_hf),
    Part("cpp", "-", "ctest (all of tests/cpp) and examples/cpp train_mlp on CUDA",
         60, 120, steps_cpp, judge_ctest, cpp_build=True),
)
PART_NAMES = ("install",) + tuple(p.name for p in PARTS)


# ---------------------------------------------------------------------------------------------
# the driver


@dataclasses.dataclass
class Result:
    """The outcome of one part, for the summary."""

    part: str
    item: str
    status: str = "SKIP"  # PASS / FAIL / SKIP
    figure: str = ""
    seconds: float = 0.0
    log: str = ""


def wheels() -> List[str]:
    """The carried wheels (``dist/*.whl``), newest first."""
    return sorted(glob.glob(str(ROOT / "dist" / "mixprec-*.whl")), key=os.path.getmtime,
                  reverse=True)


class Check:
    """The install, then the parts in priority order within the budget."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke: bool = args.cpu_smoke
        self.device = "cpu" if self.smoke else "cuda"
        # absolute: ctest runs the interpreter from its own folders
        self.py: str = os.path.abspath(shutil.which(args.python) or args.python)
        self.out = Path(args.out).resolve()
        self.budget: float = args.budget_s or (SMOKE_BUDGET_S if self.smoke
                                               else DEFAULT_BUDGET_S)
        self.wheel: Optional[str] = None if self.smoke or "install" in args.skip \
            else (wheels() or [None])[0]
        self.selected = [p for p in PARTS
                         if (not args.only or p.name in args.only) and p.name not in args.skip]
        self.env = self._environment()
        self.info: Dict[str, object] = {}
        self.results: List[Result] = []
        self.cpp_job: Optional[Job] = None
        self.t0 = time.monotonic()

    def _environment(self) -> Dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        for name, default in (("CXX", "/usr/bin/g++"), ("CC", "/usr/bin/gcc")):
            if Path(default).exists() and name not in os.environ:
                env[name] = default
        if "CXX" in env:
            env.setdefault("CUDAHOSTCXX", env["CXX"])
        env["MAX_JOBS"] = str(self.args.jobs)
        env.pop("MIXPREC_FORCE_CPU", None)
        if self.smoke:
            env["MIXPREC_EXPECT_CUDA_KERNELS"] = "0"
            env.setdefault("OMP_NUM_THREADS", "1")  # tiny sizes; a shared machine
        else:
            env["MIXPREC_FORCE_CUDA"] = "1"
            env["MIXPREC_EXPECT_CUDA_KERNELS"] = "1"
        path = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        if self.wheel is None:  # the source tree's package (built in place, or as it is)
            path.insert(0, str(ROOT / "python"))
        else:
            path.insert(0, str(WHEEL_SITE))
        if PEERS.is_dir():  # torchao and bitsandbytes for bench_optim and fp8
            path.append(str(PEERS))
        if path:
            env["PYTHONPATH"] = os.pathsep.join(path)
        return env

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def say(self, text: str) -> None:
        print(f"[gpu-check {time.monotonic() - self.t0:5.0f} s] {text}", flush=True)

    def run_steps(self, name: str, steps: List[Step], limit: float
                  ) -> Tuple[List[str], List[int], float]:
        """Run ``steps`` one after the other in ``limit`` seconds; (the output of each, the
        exit status of each, seconds)."""
        log = self.out / f"{name}.log"
        t0 = time.monotonic()
        texts, rcs = [], []
        for step in steps:
            left = limit - (time.monotonic() - t0)
            if left < 1:
                texts.append("")
                rcs.append(124)
                continue
            start = log.stat().st_size if log.exists() else 0
            job = Job(step.cmd, log, dict(self.env, **step.env),
                      min(limit * step.share, left) if len(steps) > 1 else left,
                      cwd=Path(step.cwd) if step.cwd else ROOT, kill_signal=step.kill_signal)
            rcs.append(job.wait())
            with open(log, errors="replace") as f:
                f.seek(start)
                texts.append(f.read())
        return texts, rcs, time.monotonic() - t0

    def record(self, r: Result) -> None:
        self.results.append(r)
        self.say(f"{r.status} {r.part} ({r.seconds:.0f} s): {r.figure}")
        if r.status == "FAIL" and r.log:
            print(tail(self.out / r.log), flush=True)

    # -- install ----------------------------------------------------------------------------

    def preflight(self) -> int:
        info = probe(self.py, self.env, TORCH_PROBE)
        if "torch" not in info:
            print(f"gpu_check: {self.py} cannot import torch: {info.get('error', '')}\n"
                  "  give the interpreter that has torch: make gpu-check PYTHON=/path/to/python",
                  file=sys.stderr)
            return 2
        self.info.update(info)
        if not self.smoke and not info.get("cuda"):
            print("gpu_check: no GPU visible (torch.cuda.is_available() is False in "
                  f"{self.py}, torch {info['torch']}).\n  make gpu-check needs a CUDA GPU; "
                  "to try the driver itself on CPU: make gpu-check GPU_CHECK_ARGS=--cpu-smoke",
                  file=sys.stderr)
            return 2
        if not self.smoke:
            self.env.setdefault("TORCH_CUDA_ARCH_LIST", str(info["arch"]))
        self.say(f"python {self.py}, torch {info['torch']}, "
                 f"{info.get('gpu', 'no GPU (--cpu-smoke)')}, budget {self.budget:.0f} s, "
                 f"logs in {self.out}")
        return 0

    def install_steps(self) -> List[Step]:
        if self.smoke or "install" in self.args.skip:
            return []
        if self.wheel:
            return [Step([self.py, "-m", "pip", "install", "--no-index", "--no-deps",
                          "--target", str(WHEEL_SITE), self.wheel])]
        return [Step([self.py, "setup.py", "build_ext", "--inplace"])]

    def install(self) -> bool:
        steps = self.install_steps()
        if self.wheel:
            shutil.rmtree(WHEEL_SITE, ignore_errors=True)
        what = (f"wheel {os.path.basename(self.wheel)}" if self.wheel else
                "source build (setup.py build_ext --inplace)" if steps else
                "the package the interpreter imports (not installed)")
        texts, rcs, seconds = self.run_steps("install", steps, 60 if self.wheel else 300)
        info = probe(self.py, self.env, MIXPREC_PROBE)
        self.info["mixprec"] = info
        ok = all(rc == 0 for rc in rcs) and "version" in info
        if ok:  # (on a GPU, the build must have its CUDA kernels; a wheel must be imported)
            ok = (self.smoke or bool(info["cuda_kernels"])) and (
                not self.wheel or str(info["file"]).startswith(str(WHEEL_SITE)))
            figure = (f"{what}: mixprec {info['version']} from {info['file']}, CUDA kernels "
                      f"{info['cuda_kernels']}")
        else:
            figure = f"{what} failed: " + (f"exit {rcs}" if any(rcs) else
                                           f"mixprec does not import: {info.get('error', '')}")
        self.record(Result("install", "2.1", "PASS" if ok else "FAIL", figure, seconds,
                           "install.log" if steps else ""))
        return ok

    def start_cpp_build(self) -> None:
        """The C++ library and tests/cpp build in the background (it takes the cores, the
        Python parts mostly wait on the GPU) when a part needs them."""
        if self.smoke or not any(p.cpp_build for p in self.selected):
            return
        cmd = ["make", "cpp-tests-build", f"PYTHON={self.py}",
               f"CPP_JOBS={max(self.args.jobs - 4, 1)}",
               "CPP_BUILD_DIR=build/gpu-check-cmake",
               "CPP_PREFIX=build/gpu-check-cmake-install", f"CPP_TESTS_DIR={CPP_TESTS_DIR}"]
        self.cpp_job = Job(cmd, self.out / "cpp-build.log", self.env, max(self.left(), 1))

    # -- the parts --------------------------------------------------------------------------

    def run_part(self, part: Part) -> None:
        need = part.smoke if self.smoke else part.estimate
        if self.smoke and not part.smoke:
            self.record(Result(part.name, part.item, "SKIP", "needs a GPU (--cpu-smoke)"))
            return
        if need > self.left():
            self.record(Result(part.name, part.item, "SKIP",
                               f"does not fit: ~{need:.0f} s expected, {self.left():.0f} s "
                               "left of the budget (run it with --only)"))
            return
        t0 = time.monotonic()
        if part.cpp_build and self.cpp_job is not None:
            if self.cpp_job.proc.returncode is None:
                self.cpp_job.wait()
            if self.cpp_job.proc.returncode != 0 or self.cpp_job.timed_out:
                self.record(Result(part.name, part.item, "FAIL",
                                   "the C++ build failed or timed out", time.monotonic() - t0,
                                   "cpp-build.log"))
                return
        # (a smoke part gets 4x its expected time, 30 s at least: a slow shared CI machine)
        limit = min(max(4 * need, 30) if self.smoke else part.limit, max(self.left(), 1))
        texts, rcs, _ = self.run_steps(part.name, part.steps(self), limit)
        ok, figure = part.judge(texts, rcs)
        if any(rc == 124 for rc in rcs):
            figure = f"timed out ({limit:.0f} s limit); " + figure
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.record(Result(part.name, part.item, status, figure, time.monotonic() - t0,
                           f"{part.name}.log"))

    def summary(self) -> List[str]:
        mp = self.info.get("mixprec") or {}
        head = (f"make gpu-check{' --cpu-smoke' if self.smoke else ''}: "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                f"{self.info.get('gpu', 'CPU')}, torch {self.info.get('torch', '?')}, mixprec "
                f"{mp.get('version', '?') if isinstance(mp, dict) else '?'} at {git_commit()}, "
                f"{time.monotonic() - self.t0:.0f} s of a {self.budget:.0f} s budget")
        lines = [f"# {head}", "", "| part | item | status | s | result | log |",
                 "| --- | --- | --- | ---: | --- | --- |"]
        for r in self.results:
            figure = r.figure.replace("|", "/")
            lines.append(f"| {r.part} | {r.item} | {r.status} | {r.seconds:.0f} | {figure} | "
                         f"{r.log} |")
        return lines

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        rc = self.preflight()
        if rc:
            return rc
        try:
            if self.install():
                self.start_cpp_build()
                for part in PARTS:
                    if part in self.selected:
                        self.run_part(part)
            else:
                for part in self.selected:
                    self.results.append(Result(part.name, part.item, "SKIP", "no install"))
        finally:
            if self.cpp_job is not None and self.cpp_job.proc.poll() is None:
                self.cpp_job.kill()
        lines = self.summary()
        text = "\n".join(lines) + "\n"
        (self.out / "summary.md").write_text(text)
        print("\n" + text, flush=True)
        if self.args.pack:
            pack_logs(self.out)
        return 1 if any(r.status == "FAIL" for r in self.results) else 0


def pack_logs(out: Path) -> None:
    """Replace the logs in ``out`` by one ``gpu-check-logs.tar.gz`` (a device call brings
    back at most 8 files from $OUT)."""
    import tarfile

    logs = sorted(out.glob("*.log"))
    with tarfile.open(out / "gpu-check-logs.tar.gz", "w:gz") as tar:
        for log in logs:
            tar.add(log, arcname=log.name)
    for log in logs:
        log.unlink()


def plan(args: argparse.Namespace) -> int:
    """Print what a run with these arguments would do, with expected times; run nothing."""
    check = Check(args)
    steps = check.install_steps()
    install = ("pip install the wheel " + os.path.basename(check.wheel) if check.wheel
               else "build from source" if steps else "none (--cpu-smoke: the package as it is)")
    est = 0.0 if not steps else (30.0 if check.wheel else 150.0)
    print(f"gpu-check plan{' (--cpu-smoke)' if check.smoke else ''}: budget "
          f"{check.budget:.0f} s, logs and summary.md in {check.out}")
    print(f"{'#':>2} {'part':<14}{'item':<5}{'expect':>7}{'limit':>7}{'total':>7}  run")
    print(f"{0:>2} {'install':<14}{'2.1':<5}{est:>6.0f}s{'':>7}{est:>6.0f}s  {install}")
    for cmd in steps:
        print(f"{'':>36}$ {' '.join(cmd.cmd)}")
    for n, part in enumerate(PARTS, 1):
        need = part.smoke if check.smoke else part.estimate
        if part not in check.selected:
            verdict = "not selected (--only/--skip)"
        elif check.smoke and not part.smoke:
            verdict = "SKIP: needs a GPU"
        elif est + need > check.budget:
            verdict = "SKIP: does not fit the budget"
        else:
            est += need
            verdict = "run"
        print(f"{n:>2} {part.name:<14}{part.item:<5}{need:>6.0f}s{part.limit:>6.0f}s"
              f"{est:>6.0f}s  {verdict}: {part.what}")
        if verdict == "run":
            for step in part.steps(check):
                env = " ".join(f"{k}={v}" for k, v in step.env.items())
                print(f"{'':>36}$ {env + ' ' if env else ''}{' '.join(step.cmd)}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with torch (default: this one)")
    ap.add_argument("--plan", action="store_true", help="print the plan and exit")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: the parts that can, on CPU at tiny sizes")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help=f"total seconds (default {DEFAULT_BUDGET_S:.0f}; --cpu-smoke "
                         f"{SMOKE_BUDGET_S:.0f})")
    ap.add_argument("--only", default="", help=f"parts to run, of {','.join(PART_NAMES[1:])}")
    ap.add_argument("--skip", default="", help="parts to leave out (install: use the "
                                               "package the interpreter imports)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "gpu-check"),
                    help="logs and summary.md (default $OUT, else build/gpu-check)")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                    help="pack the logs into gpu-check-logs.tar.gz at the end (default: when "
                         "--out is $OUT, whose files a device call brings back, 8 at most)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tests", default="tests",
                    help="the pytest paths of the tests part (its -m cuda subset)")
    ap.add_argument("--baseline", default="",
                    help="e2e: also time the package under this folder (PYTHONPATH)")
    ap.add_argument("--max-check-gib", type=float, default=60.0,
                    help="memcheck: device memory bound per check (allocator peak, and the "
                         "driver's in-use figure after the check)")
    args = ap.parse_args(argv)
    if args.pack is None:
        args.pack = bool(os.environ.get("OUT")) and Path(args.out) == Path(os.environ["OUT"])
    args.only = [s for s in args.only.split(",") if s]
    args.skip = [s for s in args.skip.split(",") if s]
    bad = [s for s in args.only + args.skip if s not in PART_NAMES]
    if bad:
        ap.error(f"{','.join(bad)}: parts are {','.join(PART_NAMES)}")
    return plan(args) if args.plan else Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
