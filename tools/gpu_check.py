"""`make gpu-check`: everything a GPU machine without network access can tell about mixprec,
in one command and under ten minutes on a 16-core H100.

Parts (each runs even if an earlier one failed, except that nothing runs without a build):

1. build      ``make build`` (editable install; ``--inplace``: ``setup.py build_ext
              --inplace`` + PYTHONPATH) with the interpreter that has torch, a safe
              compiler (CXX=/usr/bin/g++ CC=/usr/bin/gcc unless --cxx/--cc), MAX_JOBS = the
              cores, TORCH_CUDA_ARCH_LIST = the visible GPU's arch, MIXPREC_FORCE_CUDA=1,
              PIP_NO_INDEX=1 (nothing is downloaded).
2. tests      the whole pytest suite with the GPU visible (``-n`` when pytest-xdist is
              installed); failures are counted, not stopped at.
3. sanitizer  ``compute-sanitizer --tool memcheck`` on tools/gpu_workload.py: every op and
              optimizer up to 2^26 elements per tensor, 2,000 x 4,096 and GPT-2 small, each
              result checked against torch / float64. PYTORCH_NO_CUDA_MEMORY_CACHING=1, so
              every tensor is its own allocation and an access past its end is caught.
4. bench      bench_unscale, bench_scaler, bench_optim on CUDA (each verifies its work and
              fails on impossible figures); output appended, with device, torch, commit,
              date and command, to build/gpu-check/bench.log, ready for benchmarks/README.md.
              torchao and bitsandbytes are found in .gpu_peers/ (``make gpu-peers``) when
              that folder is there: it is put on every part's PYTHONPATH.
5. cpp        libmixprec + tests/cpp with CMake (``make cpp-tests-build`` into
              build/gpu-check/), ctest, and examples/cpp's train_mlp on the GPU (bf16 40
              steps, fp16 30 steps): exactly one skipped step, the injected one; finite,
              decreasing loss.

Time budget on one H100 with 16 cores (hard limits; expected times from the H100 runs in
parentheses). The parts no longer fit one 10-minute device call together: on 2026-11-25
the build took 128 s and the suite alone 406 s; run them as separate calls (``--skip``)
and the sanitizer by set (``--sanitizer-sets``), as the H100 runs of 2026-11-25 needed:

    build                        160 s  (58 s with 16 jobs, one arch, 2026-11-22; 128 s
                                        2026-11-25, with the emulation and 8-bit code)
    tests | sanitizer | C++ build 300 s  run side by side: tests and sanitizer mostly wait
                                        on the GPU, the C++ compile takes the cores
    ctest + train_mlp             80 s  (ctest -j; the example build inside it took 28 s)
    bench                        120 s  (three benchmarks, short timing: ~70 s expected;
                                        30 / 25 / 45 % of it for unscale / scaler / optim)

``--cpu-smoke`` runs the same driver on a machine without a GPU: a CPU-only build,
tests/project/test_benchmarks.py, the benchmarks with ``--quick``, ctest and train_mlp on CPU;
the sanitizer and the CUDA example are SKIP. Its limits are 30 minutes a part.

Logs: build/gpu-check/<part>.log (one per part, overwritten), bench.log (appended),
summary.log (one summary per run, appended). Exit status 1 if a part failed, 2 when no GPU
is visible (without --cpu-smoke) or the arguments are wrong.

    python tools/gpu_check.py [--python PY] [--cpu-smoke] [--inplace] [--jobs N]
                              [--skip PART,...] [--budget PART=SECONDS ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("build", "tests", "sanitizer", "bench", "cpp")
# torchao and bitsandbytes, installed for the GPU machine by `make gpu-peers`
PEERS = ROOT / ".gpu_peers"
# Hard limits in seconds on one 16-core H100 (see the module docstring). "parallel" is the
# phase where tests, sanitizer and the C++ build run side by side; "cpp-run" is ctest and
# the example runs after it.
BUDGET: Dict[str, float] = {"build": 160, "parallel": 300, "cpp-run": 80, "bench": 120}
SMOKE_BUDGET = 1800.0
BENCH_TIMEOUT_SHARE = {"bench_unscale": 0.3, "bench_scaler": 0.25, "bench_optim": 0.45}


@dataclasses.dataclass
class Result:
    """The outcome of one part, for the summary."""

    part: str
    status: str = "SKIP"  # PASS / FAIL / SKIP
    figure: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status:<4} {self.part:<9} {self.seconds:7.1f}s  {self.figure}"


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
    """A command running in its own process group, its output going to a log file."""

    def __init__(self, cmd: Sequence[str], log: Path, env: Dict[str, str], timeout: float,
                 cwd: Path = ROOT, append: bool = False, echo: bool = True) -> None:
        self.cmd = list(cmd)
        self.log = log
        self.timeout = timeout
        self.start = time.monotonic()
        self.timed_out = False
        with open(log, "a" if append else "w") as f:
            if echo:
                f.write(f"$ {' '.join(self.cmd)}\n")
        self._out = open(log, "a")
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> int:
        """Wait for the command (killing its process group at the time limit); returns the
        exit status (124 when it ran out of time)."""
        try:
            rc = self.proc.wait(timeout=max(self.timeout - (time.monotonic() - self.start), 0))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            rc = 124
        self._out.close()
        if self.timed_out:
            with open(self.log, "a") as f:
                f.write(f"\n[gpu-check: killed after its {self.timeout:.0f} s limit]\n")
        return rc

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
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


def workload_args(args: argparse.Namespace, device: str) -> List[str]:
    """tools/gpu_workload.py and its arguments: on CUDA up to ``--max-numel``, on CPU
    (``--cpu-smoke``) small; only the ``--sanitizer-sets`` when given."""
    out = ["tools/gpu_workload.py", "--device", device]
    out += (["--max-numel", str(args.max_numel)] if device == "cuda"
            else ["--max-numel", "40000", "--max-total", "200000"])
    if args.sanitizer_sets:
        out += ["--sets", args.sanitizer_sets]
    return out


class Check:
    """The driver: the parts, in order, with their limits."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke: bool = args.cpu_smoke
        # absolute: CMake's tests run the interpreter from their own folders, where a bare
        # "python3" is looked up as a path and not found (ctest "Not Run")
        self.py: str = os.path.abspath(shutil.which(args.python) or args.python)
        self.out = (ROOT / args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.jobs: int = args.jobs
        self.results: Dict[str, Result] = {p: Result(p) for p in PARTS}
        for p in args.skip:
            self.results[p].figure = "--skip"
        self.budget = dict(BUDGET)
        if self.smoke:
            self.budget = {k: SMOKE_BUDGET for k in BUDGET}
        for item in args.budget:
            key, _, value = item.partition("=")
            if key not in self.budget:
                raise SystemExit(f"gpu_check: --budget {item}: parts are {sorted(self.budget)}")
            self.budget[key] = float(value)
        self.device = "cpu" if self.smoke else "cuda"
        self.env = self._environment()
        self.info: Dict[str, object] = {}
        self.running: List[Job] = []

    def _environment(self) -> Dict[str, str]:
        env = dict(os.environ)
        cxx = self.args.cxx or ("/usr/bin/g++" if Path("/usr/bin/g++").exists() else None)
        cc = self.args.cc or ("/usr/bin/gcc" if Path("/usr/bin/gcc").exists() else None)
        if cxx:
            env["CXX"] = env["CUDAHOSTCXX"] = cxx
        if cc:
            env["CC"] = cc
        env["MAX_JOBS"] = str(self.jobs)
        env["PIP_NO_INDEX"] = "1"  # no network: pip must not try
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env.pop("MIXPREC_FORCE_CUDA", None)
        env.pop("MIXPREC_FORCE_CPU", None)
        if self.smoke:
            env["MIXPREC_FORCE_CPU"] = "1"
            env["MIXPREC_EXPECT_CUDA_KERNELS"] = "0"
            env.setdefault("OMP_NUM_THREADS", "1")  # tiny sizes; a shared machine
        else:
            env["MIXPREC_FORCE_CUDA"] = "1"
            env["MIXPREC_EXPECT_CUDA_KERNELS"] = "1"
        path = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        if self.args.inplace:
            path.insert(0, str(ROOT / "python"))
        if PEERS.is_dir():  # `make gpu-peers`: torchao and bitsandbytes for bench_optim
            path.append(str(PEERS))
        if path:
            env["PYTHONPATH"] = os.pathsep.join(path)
        return env

    def say(self, text: str) -> None:
        print(f"[gpu-check {datetime.datetime.now():%H:%M:%S}] {text}", flush=True)

    def start(self, part: str, cmd: Sequence[str], timeout: float, log: Optional[str] = None,
              append: bool = False, cwd: Path = ROOT) -> Job:
        job = Job(cmd, self.out / (log or f"{part}.log"), self.env, timeout, cwd, append)
        self.running.append(job)
        return job

    def finish_job(self, job: Job) -> int:
        rc = job.wait()
        self.running.remove(job)
        return rc

    def done(self, part: str, ok: bool, figure: str, seconds: float,
             log: Optional[Path] = None) -> None:
        r = self.results[part]
        r.status, r.figure, r.seconds = ("PASS" if ok else "FAIL"), figure, seconds
        self.say(r.line())
        if not ok and log is not None:
            print(tail(log), flush=True)

    # -- the parts ------------------------------------------------------------------------

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
                 f"{info.get('gpu', 'no GPU (--cpu-smoke)')}"
                 f"{', arch ' + self.env['TORCH_CUDA_ARCH_LIST'] if not self.smoke else ''}, "
                 f"CXX={self.env.get('CXX')} CC={self.env.get('CC')}, {self.jobs} jobs, "
                 f"logs in {self.out}")
        return 0

    def build(self) -> bool:
        if "build" in self.args.skip:
            self.say("SKIP build (--skip): using the mixprec the interpreter imports")
        else:
            if self.args.inplace:
                cmd = [self.py, "setup.py", "build_ext", "--inplace"]
            else:
                cmd = ["make", "build", f"PYTHON={self.py}", f"MAX_JOBS={self.jobs}"]
            self.say(f"build: {' '.join(cmd)} (limit {self.budget['build']:.0f} s)")
            job = self.start("build", cmd, self.budget["build"])
            rc = self.finish_job(job)
            if rc != 0:
                why = "timed out" if job.timed_out else f"exit {rc}"
                self.done("build", False, f"{why}; nothing else can run", job.seconds,
                          job.log)
                return False
            seconds = job.seconds
        info = probe(self.py, self.env, MIXPREC_PROBE)
        self.info["mixprec"] = info
        if "version" not in info:
            self.done("build", False, f"mixprec does not import: {info.get('error', '')}",
                      0.0 if "build" in self.args.skip else seconds)
            return False
        want_cuda = not self.smoke
        ok = bool(info["cuda_kernels"]) == want_cuda
        figure = (f"mixprec {info['version']} from {info['file']}, CUDA kernels "
                  f"{info['cuda_kernels']}" + ("" if ok else f" (expected {want_cuda})"))
        if "build" in self.args.skip:
            self.results["build"].figure = figure + " (not rebuilt)"
            self.say(f"SKIP build: {figure}")
            return ok
        self.done("build", ok, figure, seconds, self.out / "build.log")
        return ok

    def parallel_phase(self) -> None:
        """tests, sanitizer and the C++ build side by side; then ctest and the example."""
        limit = self.budget["parallel"]
        jobs: Dict[str, Job] = {}
        if "tests" not in self.args.skip:
            cmd = [self.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
            if self.smoke:
                cmd += ["tests/project/test_benchmarks.py"]
            else:
                cmd += ["tests"]
                if self.info.get("xdist"):
                    cmd += ["-n", str(min(8, max(self.jobs // 2, 1)))]
            cmd += self.args.pytest_args
            jobs["tests"] = self.start("tests", cmd, limit)
        if "sanitizer" not in self.args.skip and not self.smoke:
            sanitizer = which_sanitizer()
            if sanitizer is None:
                self.done("sanitizer", False, "compute-sanitizer not found (PATH, CUDA_HOME)",
                          0.0)
            else:
                env = dict(self.env, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
                cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "99",
                       "--leak-check", "no", "--print-limit", "20", self.py,
                       *workload_args(self.args, "cuda")]
                job = Job(cmd, self.out / "sanitizer.log", env, limit)
                self.running.append(job)
                jobs["sanitizer"] = job
        elif self.smoke and "sanitizer" not in self.args.skip:
            self.results["sanitizer"].figure = "no GPU (--cpu-smoke)"
            # the workload itself still runs, on CPU and small, without the sanitizer
            jobs["workload"] = self.start(
                "workload", [self.py, *workload_args(self.args, "cpu")], limit)
        if "cpp" not in self.args.skip:
            cpp_dir = self.out.relative_to(ROOT) if self.out.is_relative_to(ROOT) else self.out
            cmd = ["make", "cpp-tests-build", f"PYTHON={self.py}",
                   f"CPP_JOBS={max(self.jobs - 4, 1) if not self.smoke else self.jobs}",
                   f"CPP_BUILD_DIR={cpp_dir}/cmake", f"CPP_PREFIX={cpp_dir}/cmake-install",
                   f"CPP_TESTS_DIR={cpp_dir}/cmake-tests"]
            jobs["cpp"] = self.start("cpp", cmd, limit)
        self.say(f"running side by side (limit {limit:.0f} s): {', '.join(jobs)}")
        for name, job in jobs.items():
            rc = self.finish_job(job)
            getattr(self, f"_after_{name}")(job, rc)

    def _after_tests(self, job: Job, rc: int) -> None:
        text = job.log.read_text(errors="replace")
        c = parse_pytest(text)
        figure = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "errors", "skipped",
                                                   "deselected") if k in c) or "no pytest summary"
        if rc != 0:
            figure += f" (pytest exit {rc})"
        if job.timed_out:
            figure = f"timed out after {job.timeout:.0f} s; " + figure
        self.done("tests", rc == 0 and c.get("passed", 0) > 0, figure, job.seconds, job.log)

    def _after_sanitizer(self, job: Job, rc: int) -> None:
        text = job.log.read_text(errors="replace")
        errors = parse_sanitizer(text)
        work = parse_workload(text)
        figure = (f"memcheck {'?' if errors is None else errors} errors; workload "
                  + (f"{work[0]} checks passed, {work[1]} failed, {work[2]} skipped" if work
                     else "did not finish"))
        if job.timed_out:
            figure = f"timed out after {job.timeout:.0f} s; " + figure
        ok = rc == 0 and errors == 0 and work is not None and work[1] == 0
        self.done("sanitizer", ok, figure, job.seconds, job.log)

    def _after_workload(self, job: Job, rc: int) -> None:
        work = parse_workload(job.log.read_text(errors="replace"))
        self.say(f"SKIP sanitizer: no GPU (--cpu-smoke); gpu_workload on CPU without it: "
                 f"exit {rc}, " + (f"{work[0]} passed, {work[1]} failed" if work else
                                   "no summary"))
        r = self.results["sanitizer"]
        r.figure = ("no GPU (--cpu-smoke); workload on CPU: "
                    + (f"{work[0]} passed, {work[1]} failed" if work else "no summary"))
        r.seconds = job.seconds
        if rc != 0:
            r.status = "FAIL"
            print(tail(job.log), flush=True)

    def _after_cpp(self, job: Job, rc: int) -> None:
        if rc != 0:
            why = "timed out" if job.timed_out else f"exit {rc}"
            self.done("cpp", False, f"C++ build {why}", job.seconds, job.log)
            return
        build_seconds = job.seconds
        cpp_dir = self.out / "cmake-tests"
        limit = self.budget["cpp-run"]
        run_start = time.monotonic()
        deadline = run_start + limit
        ctest = self.start("cpp", ["ctest", "--output-on-failure", "-j",
                                   str(max(self.jobs // 2, 1))], limit, append=True, cwd=cpp_dir)
        rc = self.finish_job(ctest)
        text = ctest.log.read_text(errors="replace")
        counts, skipped = parse_ctest(text), ctest_skipped(text)
        parts = [f"ctest {counts[1] - counts[0]}/{counts[1]} passed" if counts else
                 f"ctest: no summary (exit {rc})"]
        ok = rc == 0 and counts is not None and counts[0] == 0
        if skipped:
            parts[0] += f" ({len(skipped)} skipped: {', '.join(skipped)})"
            if not self.smoke and any("cuda" in name for name in skipped):
                parts[0] += " -- a CUDA test skipped on a GPU machine"
                ok = False
        exe = cpp_dir / "example" / "train_mlp"
        for dtype, steps, inject in (("bf16", 40, 20), ("fp16", 30, 7)):
            if not exe.exists():
                parts.append("train_mlp not built")
                ok = False
                break
            log = self.out / f"train_mlp_{self.device}_{dtype}.log"
            run = Job([str(exe), "--device", self.device, "--dtype", dtype, "--steps",
                       str(steps), "--inject-inf", str(inject)], log, self.env,
                      max(deadline - time.monotonic(), 1))
            self.running.append(run)
            rc = self.finish_job(run)
            good, seen = check_train_mlp(log.read_text(errors="replace"), steps, inject)
            parts.append(f"train_mlp {self.device} {dtype}: {seen}")
            if rc != 0 or not good:
                ok = False
                print(tail(log), flush=True)
        if self.smoke:
            parts.append("train_mlp --device cuda SKIP (no GPU)")
        self.done("cpp", ok, "; ".join(parts),
                  build_seconds + time.monotonic() - run_start, ctest.log)

    def bench(self) -> None:
        if "bench" in self.args.skip:
            return
        log = self.out / "bench.log"
        limit = self.budget["bench"]
        t0 = time.monotonic()
        device = self.device
        commands = {
            "bench_unscale": ["--device", device] + (["--quick"] if self.smoke else
                                                     ["--min-run-time", "0.1"]),
            "bench_scaler": ["--device", device] + (["--quick"] if self.smoke else
                                                    ["--rounds", "1", "--min-run-time", "0.2"]),
            "bench_optim": ["--device", device] + (["--quick"] if self.smoke else
                                                   ["--rounds", "2", "--min-run-time", "0.2"]),
        }
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        gpu = self.info.get("gpu", "CPU (--cpu-smoke)")
        mp = self.info.get("mixprec", {})
        passed, figures = 0, []
        for name, extra in commands.items():
            cmd = [self.py, f"benchmarks/{name}.py"] + extra
            shown = " ".join(["python", f"benchmarks/{name}.py"] + extra)
            with open(log, "a") as f:
                f.write(f"\n## {name} -- {stamp}\n\nDevice: {gpu} | torch {self.info['torch']} "
                        f"| mixprec {mp.get('version', '?') if isinstance(mp, dict) else '?'} "
                        f"at {git_commit()} | `make gpu-check` | command: `{shown}`\n\n```text\n")
            job = Job(cmd, log, self.env, limit * BENCH_TIMEOUT_SHARE[name], append=True,
                      echo=False)
            self.running.append(job)
            rc = self.finish_job(job)
            with open(log, "a") as f:
                f.write(f"```\n(exit status {rc}{', timed out' if job.timed_out else ''})\n")
            if rc == 0:
                passed += 1
            else:
                figures.append(f"{name} {'timed out' if job.timed_out else f'exit {rc}'}")
                print(tail(log), flush=True)
        figure = f"{passed}/3 benchmarks verified, no impossible figure" + (
            f" ({'; '.join(figures)})" if figures else "") + f"; appended to {log}"
        self.done("bench", passed == 3, figure, time.monotonic() - t0)

    def run(self) -> int:
        t0 = time.monotonic()
        rc = self.preflight()
        if rc:
            return rc
        try:
            if self.build():
                self.parallel_phase()
                self.bench()
            else:
                for p in PARTS[1:]:
                    self.results[p].figure = "not run: no build"
        except KeyboardInterrupt:
            for job in list(self.running):
                job.kill()
            raise
        lines = [f"# make gpu-check {'--cpu-smoke ' if self.smoke else ''}-- "
                 f"{datetime.datetime.now():%Y-%m-%d %H:%M} -- {self.info.get('gpu', 'CPU')} "
                 f"-- torch {self.info['torch']} -- {git_commit()}"]
        lines += [self.results[p].line() for p in PARTS]
        failed = [p for p in PARTS if self.results[p].status == "FAIL"]
        lines.append(f"{'FAIL' if failed else 'PASS'} gpu-check in {time.monotonic() - t0:.0f} s"
                     + (f": {', '.join(failed)} failed" if failed else ""))
        print("\n" + "\n".join(lines), flush=True)
        with open(self.out / "summary.log", "a") as f:
            f.write("\n".join(lines) + "\n\n")
        return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with torch (default: this one)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: run the driver end to end on CPU at tiny sizes")
    ap.add_argument("--inplace", action="store_true",
                    help="build with setup.py build_ext --inplace and PYTHONPATH=python "
                         "instead of an editable install")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cxx", default=os.environ.get("GPU_CHECK_CXX"),
                    help="C++ compiler (default /usr/bin/g++; env GPU_CHECK_CXX)")
    ap.add_argument("--cc", default=os.environ.get("GPU_CHECK_CC"),
                    help="C compiler (default /usr/bin/gcc; env GPU_CHECK_CC)")
    ap.add_argument("--out", default="build/gpu-check", help="log folder")
    ap.add_argument("--skip", default="", help=f"parts to leave out, of {','.join(PARTS)}")
    ap.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                    help=f"override a limit; parts: {', '.join(BUDGET)}")
    ap.add_argument("--max-numel", type=int, default=2**26,
                    help="largest tensor of the sanitizer workload (default 2^26)")
    ap.add_argument("--sanitizer-sets", default="",
                    help="comma-separated gpu_workload sets for the sanitizer (default all; "
                         "the whole workload does not fit one 10-minute call, see README)")
    ap.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[],
                    help="extra pytest arguments (last on the line)")
    args = ap.parse_args(argv)
    args.skip = [s for s in args.skip.split(",") if s]
    bad = [s for s in args.skip if s not in PARTS]
    if bad:
        ap.error(f"--skip {','.join(bad)}: parts are {','.join(PARTS)}")
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
