"""The parts of tools/gpu_check.py (`make gpu-check`): their commands, how their output is
read, their built-in time guesses and limits, in priority order. The driver is gpu_check.py."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from gpu_check import Check

ROOT = Path(__file__).resolve().parent.parent
CPP_TESTS_DIR = "build/gpu-check-cmake-tests"
# the named CUDA test subset of the tests part (every file with tests marked cuda): the
# kernels against the CPU kernels, the optimizers (8-bit included), the scaler, the trainer
DEFAULT_TESTS = ("tests/ops tests/optim tests/amp tests/train/test_trainer.py "
                 "tests/test_diagnostics.py")
# modules of `make gpu-peers` (.gpu_peers/, carried to the machine)
PEER_MODULES = ("torchao", "bitsandbytes")


# ---------------------------------------------------------------------------------------------
# output parsers (pure functions; tests/project/test_gpu_check.py covers them)

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
    """One GPU item: its commands, how its outcome is read, its built-in time guess (used
    until a GPU run has measured the part: gpu_times.py) and its hard limit. ``smoke`` is its
    expected time in ``--cpu-smoke`` (0: it needs a GPU and is SKIP there). ``needs``: the
    Python modules it cannot run without (a part whose module is missing is SKIP, naming
    ``make gpu-peers`` for those it installs); ``programs``: the programs likewise."""

    name: str
    item: str
    what: str
    guess: float
    limit: float
    steps: Callable[[Check], List[Step]]
    judge: Judge
    smoke: float = 0.0
    cpp_build: bool = False  # waits for the C++ build started in the background
    needs: Tuple[str, ...] = ()
    programs: Tuple[str, ...] = ()


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


RESULT_WORDS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors",
                "SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "xpassed"}


def parse_pytest_progress(text: str) -> Tuple[Dict[str, int], List[str], Optional[str]]:
    """What a ``pytest -v`` run printed test by test, for a run cut short before its final
    summary: (counts, the failed/errored test ids, the test it was in when it stopped, or
    None). Reads plain lines ("tests/ops/test_norm.py::t[cuda] PASSED") and pytest-xdist's
    ("[gw0] [  3%] PASSED tests/ops/test_norm.py::t[cuda]")."""
    counts: Dict[str, int] = {}
    failed: List[str] = []
    seen: Dict[str, str] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        m = (re.match(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
             or re.match(r"^\[gw\d+\]\s+\[\s*\d+%\]\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
                         r"\s+(\S+::\S+)", line))
        if m:
            node, word = (m[1], m[2]) if "::" in m[1] else (m[2], m[1])
            if node in seen and word != "ERROR":  # (an ERROR at teardown follows PASSED)
                continue
            seen[node] = word
            key = RESULT_WORDS[word]
            counts[key] = counts.get(key, 0) + 1
            if word in ("FAILED", "ERROR"):
                failed.append(node)
            current = None
        else:
            started = re.match(r"^(\S+::\S+)\s*(\[exit .*)?$", line)
            if started:
                current = started[1]
    return counts, failed, current


def judge_pytest(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    """pytest's final summary line; when there is none (killed at its limit, crashed), the
    results it printed test by test (``-v``), and the test it was in."""
    text = texts[-1]
    c = parse_pytest(text)
    progress, failed, current = parse_pytest_progress(text)
    cut = not c
    if cut:
        c = progress
    figure = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "errors", "skipped",
                                               "xfailed", "xpassed", "deselected") if k in c)
    if cut:
        figure = (f"cut short (exit {rcs[-1]}), no pytest summary; so far: "
                  + (figure or "nothing reported")
                  + (f"; stopped in {current}" if current else ""))
    if failed:
        figure += "; failed: " + ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
    return rcs[-1] == 0 and not cut and c.get("passed", 0) > 0, figure


def judge_capture(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    rows = re.findall(r"^correctness (\S+)\s+(ok|FAIL)", texts[-1], re.M)
    n = len(rows) // 2 or len(rows)  # (each row is printed as it comes and in the table)
    ok = sum(s == "ok" for _, s in rows[:n])
    return rcs[-1] == 0 and ok == n > 0, (
        f"replay == eager bitwise, no host sync: {ok}/{n} configs ("
        + ", ".join(f"{c} {s}" for c, s in rows[:n]) + ")")


def parse_timings(text: str) -> Dict[str, Dict[str, float]]:
    """{workload: {variant: ms}} from gpu_capture_check's timing rows (the rows of several
    runs, e.g. torch.compile's own process, merged)."""
    out: Dict[str, Dict[str, float]] = {}
    for work, cells in re.findall(r"^timing (\S+)\s+-\s+(.*)$", text, re.M):
        out.setdefault(work, {}).update(
            {v: float(ms) for v, ms in re.findall(r"(\S+)\s+([\d.]+) ms", cells)})
    return out


def judge_speed(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    """The speed-up rows; torch.compile's own process (the second step) may fail or time
    out without failing the part: its cell then says so."""
    rows = parse_timings("\n".join(texts))
    if len(rcs) > 1 and rcs[1] != 0:
        for ms in rows.values():
            ms.pop("compile", None)
    parts = []
    for work, ms in rows.items():
        cap = ms.get("captured")
        parts.append(work + ": " + ", ".join(
            f"{v} {cap and ms[v] / cap:.2f}x" for v in ms if v != "captured" and cap))
    compile_note = ("" if len(rcs) < 2 or rcs[1] == 0 else
                    f"; torch.compile's own process: {'timed out' if rcs[1] == 124 else 'exit'}"
                    f"{'' if rcs[1] == 124 else ' ' + str(rcs[1])}")
    return rcs[0] == 0 and bool(rows), ("speed-up of mixprec captured over: "
                                        + "; ".join(parts) if rows else "no timings"
                                        ) + compile_note


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


def judge_optim8(texts: List[str], rcs: List[int]) -> Tuple[bool, str]:
    """The step table's rows (device ms, % of copy), its ratio and share lines, the rows it
    skipped, and the Nsight Compute pass (second step, when there is one) in a few words."""
    text = texts[0]
    rows = [f"{n} {d} {ms} ms {pct} %" for n, d, ms, pct in re.findall(
        r"^row (\S+)\s+(\S+)\s+device\s+([\d.]+) ms.*?([\d.]+) % of copy", text, re.M)]
    skipped = re.findall(r"^row (\S+) SKIP", text, re.M)
    figure = "; ".join(filter(None, [", ".join(rows), _last_line(text, r"^ratio"),
                                     _last_line(text, r"of the copy")]))
    if skipped:
        figure += f"; rows skipped (option not in this build): {', '.join(skipped)}"
    if len(texts) > 1:
        ncu = texts[1]
        if rcs[1] == 0 and re.search(r"==PROF==|Section:|dram__|DRAM Throughput", ncu):
            dram = re.findall(r"DRAM Throughput\s+%?\s*([\d.]+)", ncu)
            figure += "; ncu: " + (f"DRAM throughput {dram[-1]} %" if dram else "ran")
        else:
            figure += f"; ncu: exit {rcs[1]} (see the log)"
    return rcs[0] == 0 and bool(rows), figure


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
    """pytest -v (each result on its own line, read back if the run is cut short); at its
    limit SIGINT, on which pytest still prints its summary, then SIGKILL."""
    base = _py(c, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE",
               "-o", "console_output_style=classic")
    if c.smoke:
        return [Step(base + ["tests/project/test_public_api.py"], kill_signal=signal.SIGINT)]
    cmd = base + ["-m", "cuda", *c.args.tests.split()]
    if c.info.get("xdist"):
        cmd += ["-n", "8"]
    return [Step(cmd, kill_signal=signal.SIGINT)]


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
    """The timings, then torch.compile(mode="reduce-overhead") once (GPT-2 small 1 x 128) in
    a process of its own with its own limit (its compile can take minutes)."""
    if c.smoke:
        return [Step(_py(c, "tools/gpu_capture_check.py", "--only", "timings", "--device",
                         "cpu", "--dry-run", "--workloads", "gpt2_1x128", "--variants",
                         "captured,eager,torch-graph"))]
    main = _py(c, "tools/gpu_capture_check.py", "--only", "timings", "--workloads",
               "gpt2_1x128,gpt2_8x1024,convnet", "--timing-limit", "40", "--variants",
               "captured,eager-mixprec,eager,torch-graph")
    compiled = _py(c, "tools/gpu_capture_check.py", "--only", "timings", "--workloads",
                   "gpt2_1x128", "--variants", "compile", "--timing-limit", "95")
    return [Step(main, share=0.55), Step(compiled, share=0.45)]


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


def which_ncu() -> Optional[str]:
    """Nsight Compute's command line, or None."""
    found = shutil.which("ncu")
    if found:
        return found
    for home in filter(None, [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]):
        p = Path(home) / "bin" / "ncu"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def steps_optim8(c: Check) -> List[Step]:
    """The step table; then, where Nsight Compute is installed, its pass over the fp32
    8-bit step's mixprec kernels."""
    if c.smoke:
        return [Step(_py(c, "tools/gpu_profile8.py", "--device", "cpu", "--small"))]
    steps = [Step(_py(c, "tools/gpu_profile8.py"), share=0.7)]
    ncu = which_ncu()
    if ncu:
        steps.append(Step([ncu, "--nvtx", "--nvtx-include", "step8/", "--kernel-name-base",
                           "demangled", "--kernel-name", "regex:mixprec", "--launch-count",
                           "4", "--section",
                           "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", c.py,
                           "tools/gpu_profile8.py", "--ncu", "--iters", "4"], share=0.3))
    return steps


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


# In priority order (the install is part 0, run first): the CUDA tests; bitwise correctness
# on the device; the optimizer step table; the e2e and capture-speed rows; the C++ capture
# test and the demo; FP8, memcheck, FSDP2; the rest. Guesses: for an H100, from before the
# stable-ABI rewrite (no GPU run of the current code had measured them); gpu_times.py
# replaces each by a measured time once a run has one.
PARTS: Tuple[Part, ...] = (
    Part("tests", "2.1", "the named CUDA test subset (pytest -m cuda, --tests) on the "
         "installed package: kernels vs the CPU kernels, optimizers incl. 8-bit, scaler",
         150, 200, steps_tests, judge_pytest, smoke=5),
    Part("capture", "2.2", "capture correctness: replay == eager bitwise over 50 steps under "
         "sync debug mode 'error' (fp16+masters+scaler+overflows, bf16+8-bit, bf16+SR)",
         90, 170, steps_capture, judge_capture, smoke=6),
    Part("optim8", "2.6", "the optimizer step table at GPT-2 small: 32-bit, 8-bit, split "
         "masters, gradient release; fp32/bf16/fp16; device ms and % of copy (back to back, "
         "profiler); Nsight Compute pass of the 8-bit kernel where ncu exists",
         60, 120, steps_optim8, judge_optim8, smoke=8),
    Part("e2e", "2.4", "GPT-2 small end to end at 1x128 and 8x1024 (--baseline DIR: the same "
         "with the package under DIR, e.g. the last release)",
         150, 200, steps_e2e, judge_lines(r"^amp-torch ", r"^bf16-m ", r"checks passed|FAILED"),
         smoke=7),
    Part("capture-speed", "2.3", "GPT-2 small 1x128 and 8x1024, conv net batch 8: mixprec "
         "captured | mixprec eager | torch eager AMP | torch's hand-written whole-step capture; "
         "then torch.compile reduce-overhead at 1x128 in its own process; ms, peak memory",
         170, 240, steps_speed, judge_speed, smoke=6),
    Part("cpp-capture", "2.2", "the C++ CapturedStep GPU test (ctest -L gpu; the C++ build "
         "runs in the background from the start)",
         30, 90, steps_cpp_capture, judge_rc(r"tests passed|tests failed"), cpp_build=True,
         programs=("make", "cmake", "ctest")),
    Part("demo", "2.2", "make demo's captured run on CUDA (examples/train_digits.py "
         "--capture)", 60, 120, steps_demo, judge_rc(r"acc|captur|step")),
    Part("fp8", "2.5", "FP8 on the ~1B stack: per recipe vs BF16 + mixprec vs torchao + "
         "torch fused AdamW, tokens/s and peak memory (torchao: make gpu-peers)",
         150, 220, steps_fp8,
         judge_lines(r"^fp8 rowwise \+ mixprec", r"^torchao fp8", r"^check"), smoke=10,
         needs=("torchao",)),
    Part("memcheck", "2.7", "compute-sanitizer memcheck over the 2^26 and gpt2-small sets, "
         "one process per set, device memory bounded per check",
         300, 320, steps_memcheck, judge_memcheck, smoke=8, programs=("compute-sanitizer",)),
    Part("fsdp2", "2.8", "examples/fsdp2_train.py recipes A and B, world size 1, nccl, "
         "PYTHONFAULTHANDLER=1, SIGABRT at the limit",
         80, 130, steps_fsdp2, judge_fsdp2, smoke=6),
    Part("bench", "-", "bench_unscale, bench_scaler, bench_optim (8-bit beside torchao and "
         "bitsandbytes: make gpu-peers; without them those rows are left out)", 120, 150,
         steps_bench, judge_rc(r"verified|error"), smoke=7),
    Part("hf-overflow", "-", "HF Trainer fp16 with forced overflows: the lr each optimizer "
         "gets (transformers and accelerate: not in make gpu-peers; carry them as wheels)",
         60, 90, steps_hf, judge_hf, needs=("transformers",)),
    Part("cpp", "-", "ctest (all of tests/cpp) and examples/cpp train_mlp on CUDA",
         60, 120, steps_cpp, judge_ctest, cpp_build=True, programs=("make", "cmake", "ctest")),
)
