"""`make gpu-check`: the open GPU items, most important first, on a GPU machine without
network, within one device call, leaving room for a second, warm one.

It installs the carried wheel (``dist/*.whl``, or ``--wheel``; none carried: builds from
source in place), refuses it when it was built from another commit than the tree's
(``--allow-other-commit`` lets it), then runs the parts (gpu_parts.py) in priority order,
each in its own time limit and process group, skipping a part whose expected time no longer
fits the budget (``--budget-s``, default 420 s: with the machine's start that leaves a warm
second call of about 240 s in a 15-minute allotment). Expected times are measured ones where
a run recorded them (gpu_times.py), else the built-in guesses; ``--plan`` says which. One
summary table (``summary.md``), ``times.json`` and one log per part go to ``--out`` (default
``$OUT`` when set, else build/gpu-check); the summary ends with the command for what did not
fit. No child outlives the driver (gpu_jobs.py).

``--plan`` prints the parts, their commands, expected times and where those come from.
``--cpu-smoke`` runs every part that can run without a GPU on the CPU at tiny sizes (the
others are SKIP): it is a step of ``make test``, so the driver and its scripts keep working.
``--only`` / ``--skip`` pick parts (e.g. a second call for what did not fit the first).

Exit status: 0 when every part that ran passed, 1 when one failed, 2 when no GPU is
visible (without ``--cpu-smoke``) or the arguments are wrong.

    python3 tools/gpu_check.py [--python PY] [--plan] [--cpu-smoke] [--budget-s S]
                               [--only PART,...] [--skip PART,...] [--out DIR] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_jobs  # noqa: E402
import gpu_times  # noqa: E402
from gpu_jobs import Job  # noqa: E402
from gpu_parts import (  # noqa: E402,F401
    CPP_TESTS_DIR,
    DEFAULT_TESTS,
    PARTS,
    PEER_MODULES,
    Part,
    Step,
    check_train_mlp,
    ctest_skipped,
    judge_capture,
    judge_fsdp2,
    judge_hf,
    judge_memcheck,
    judge_optim8,
    judge_pytest,
    judge_rc,
    judge_speed,
    parse_ctest,
    parse_pytest,
    parse_pytest_progress,
    parse_sanitizer,
    parse_timings,
    parse_workload,
    tail,
    which_sanitizer,
)

ROOT = Path(__file__).resolve().parent.parent
# torchao and bitsandbytes for a machine without network (`make gpu-peers`)
PEERS = ROOT / ".gpu_peers"
DEFAULT_BUDGET_S = 420.0
SECOND_CALL_S = 240.0  # what a warm second call has left, after a first of 420 s
SMOKE_BUDGET_S = 120.0
CPP_BUILD_LIMIT_S = 300.0  # the background C++ build's own limit
INSTALL_GUESS = {"wheel": 30.0, "build": 150.0, "none": 5.0}
INSTALL_LIMIT = {"wheel": 60.0, "build": 300.0, "none": 60.0}
# where a carried wheel is installed (pip --target): first on every part's PYTHONPATH, so the
# wheel is what the parts import, whatever else the interpreter has; nothing system-wide
WHEEL_SITE = ROOT / "build" / "gpu-check-wheel"
PART_NAMES = ("install",) + tuple(p.name for p in PARTS)


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
import json, torch, importlib.util as u, sys
d = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
     "cuda_version": torch.version.cuda}
if d["cuda"]:
    major, minor = torch.cuda.get_device_capability()
    d.update(arch=f"{major}.{minor}", gpu=torch.cuda.get_device_name())
d["modules"] = {m: u.find_spec(m) is not None for m in sys.argv[1:]}
d["xdist"] = d["modules"].get("xdist", False)
print(json.dumps(d))
"""
MIXPREC_PROBE = """
import json, mixprec
info = getattr(mixprec, "build_info", dict)()
print(json.dumps({"version": mixprec.__version__, "cuda_kernels": mixprec.has_cuda_kernels(),
                  "file": mixprec.__file__, "git_commit": info.get("git_commit")}))
"""


@dataclasses.dataclass
class Result:
    """The outcome of one part, for the summary."""

    part: str
    item: str
    status: str = "SKIP"  # PASS / FAIL / SKIP
    figure: str = ""
    seconds: float = 0.0
    log: str = ""
    budget: bool = False  # skipped because it did not fit


def wheels() -> List[str]:
    """The carried wheels (``dist/mixprec-*.whl``)."""
    return sorted(glob.glob(str(ROOT / "dist" / "mixprec-*.whl")))


class Check:
    """The install, then the parts in priority order within the budget."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke: bool = args.cpu_smoke
        self.mode = "cpu-smoke" if self.smoke else "gpu"
        self.device = "cpu" if self.smoke else "cuda"
        # absolute: ctest runs the interpreter from its own folders
        self.py: str = os.path.abspath(shutil.which(args.python) or args.python)
        self.out = Path(args.out).resolve()
        self.budget: float = args.budget_s or (SMOKE_BUDGET_S if self.smoke
                                               else DEFAULT_BUDGET_S)
        self.wheel_error = ""
        self.wheel: Optional[str] = None
        if not self.smoke and "install" not in args.skip:
            found = [args.wheel] if args.wheel else wheels()
            if len(found) > 1:
                self.wheel_error = (f"{len(found)} wheels in dist/ ("
                                    + ", ".join(os.path.basename(w) for w in found)
                                    + "): carry one, or name it with --wheel")
            self.wheel = found[0] if found else None
        self.selected = [p for p in PARTS
                         if (not args.only or p.name in args.only) and p.name not in args.skip]
        self.times_files = [Path(args.times), gpu_times.COMMITTED_TIMES]
        self.records = gpu_times.load(self.times_files, self.mode)
        self.env = self._environment()
        self.info: Dict[str, object] = {}
        self.results: List[Result] = []
        self.cpp_job: Optional[Job] = None
        self.tree = gpu_times.tree_commit()
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

    # -- what to expect ---------------------------------------------------------------------

    @property
    def install_kind(self) -> str:
        if self.smoke or "install" in self.args.skip:
            return "none"
        return "wheel" if self.wheel else "build"

    def expect(self, part: Optional[Part]) -> Tuple[float, float, str]:
        """(expected seconds, limit, where the expectation comes from) of ``part`` (None:
        the install) in this mode."""
        if part is None:
            kind = self.install_kind
            guess, limit, name = INSTALL_GUESS[kind], INSTALL_LIMIT[kind], f"install-{kind}"
        elif self.smoke:
            guess, limit, name = part.smoke, max(4 * part.smoke, 30), part.name
        else:
            guess, limit, name = part.guess, part.limit, part.name
        need, source = gpu_times.estimate(guess, limit, self.records.get(name))
        if self.smoke and part is not None and not part.smoke:
            return 0.0, 0.0, "-"
        return need, limit, source

    def missing(self, part: Part) -> str:
        """Why ``part`` cannot run on this machine ("" when it can)."""
        mods = self.info.get("modules") or {}
        lost = [m for m in part.needs if isinstance(mods, dict) and not mods.get(m, True)]
        if lost:
            peers = [m for m in lost if m in PEER_MODULES]
            return (", ".join(lost) + " not installed for " + self.py
                    + ("; run `make gpu-peers` where pip can download and carry .gpu_peers"
                       if peers else "; carry it as wheels (docs/gpu_check.md)"))
        if self.smoke:
            return ""
        for prog in part.programs:
            found = which_sanitizer() if prog == "compute-sanitizer" else shutil.which(prog)
            if not found:
                return f"{prog} not found on this machine"
        return ""

    # -- running ------------------------------------------------------------------------------

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
            rc = job.wait()
            rcs.append(124 if rc is None else rc)
            with open(log, errors="replace") as f:
                f.seek(start)
                texts.append(f.read())
        return texts, rcs, time.monotonic() - t0

    def record(self, r: Result, timed_out: bool = False, key: str = "") -> None:
        self.results.append(r)
        self.say(f"{r.status} {r.part} ({r.seconds:.0f} s): {r.figure}")
        if r.status == "FAIL" and r.log:
            print(tail(self.out / r.log), flush=True)
        if r.seconds > 0 and key:  # measured: the next run's estimate
            gpu_times.record([Path(self.args.times), self.out / "times.json"], self.mode,
                             key, r.seconds, timed_out, r.status,
                             str(self.info.get("gpu", "CPU")), str(self.info.get("torch", "?")),
                             self.credited_commit())

    def credited_commit(self) -> str:
        """The commit the installed mixprec was built at (its stamp), or "no stamp"."""
        mp = self.info.get("mixprec")
        built = mp.get("git_commit") if isinstance(mp, dict) else None
        return str(built or "no stamp")

    # -- install ------------------------------------------------------------------------------

    def preflight(self) -> int:
        killed = gpu_jobs.kill_stale()
        if killed:
            self.say(f"killed {len(killed)} process(es) left by an earlier run: {killed}")
        modules = sorted({m for p in self.selected for m in p.needs} | {"xdist"})
        info = probe(self.py, self.env, TORCH_PROBE.replace("sys.argv[1:]", repr(modules)))
        if "torch" not in info:
            print(f"gpu_check: {self.py} cannot import torch: {info.get('error', '')}\n"
                  "  give the interpreter that has torch: python3 tools/gpu_check.py "
                  "--python /path/to/python", file=sys.stderr)
            return 2
        self.info.update(info)
        if not self.smoke and not info.get("cuda"):
            print("gpu_check: no GPU visible (torch.cuda.is_available() is False in "
                  f"{self.py}, torch {info['torch']}).\n  make gpu-check needs a CUDA GPU; "
                  "to try the driver itself on CPU: python3 tools/gpu_check.py --cpu-smoke",
                  file=sys.stderr)
            return 2
        if not self.smoke:
            self.env.setdefault("TORCH_CUDA_ARCH_LIST", str(info["arch"]))
        self.say(f"python {self.py}, torch {info['torch']}, "
                 f"{info.get('gpu', 'no GPU (--cpu-smoke)')}, tree at {self.tree or '?'}, "
                 f"budget {self.budget:.0f} s, logs in {self.out}")
        return 0

    def install_steps(self) -> List[Step]:
        kind = self.install_kind
        if kind == "wheel":
            return [Step([self.py, "-m", "pip", "install", "--no-index", "--no-deps",
                          "--target", str(WHEEL_SITE), str(self.wheel)])]
        if kind == "build":
            return [Step([self.py, "setup.py", "build_ext", "--inplace"])]
        return []

    def install(self) -> bool:
        if self.wheel_error:
            self.record(Result("install", "2.1", "FAIL", self.wheel_error))
            return False
        steps = self.install_steps()
        if self.wheel:
            shutil.rmtree(WHEEL_SITE, ignore_errors=True)
        what = (f"wheel {os.path.basename(self.wheel)}" if self.wheel else
                "source build (setup.py build_ext --inplace)" if steps else
                "the package the interpreter imports (not installed)")
        limit = self.expect(None)[1]
        texts, rcs, seconds = self.run_steps("install", steps, limit)
        info = probe(self.py, self.env, MIXPREC_PROBE)
        self.info["mixprec"] = info
        ok = all(rc == 0 for rc in rcs) and "version" in info
        if ok:  # (on a GPU, the build must have its CUDA kernels; a wheel must be imported)
            ok = (self.smoke or bool(info["cuda_kernels"])) and (
                not self.wheel or str(info["file"]).startswith(str(WHEEL_SITE)))
            built = info.get("git_commit")
            # (--cpu-smoke credits no figure to any commit: said, not refused; a build that
            # `make test` did not redo after a commit that changed no C++ source is older)
            same, said = gpu_times.commit_verdict(
                built, self.tree,  # type: ignore[arg-type]
                self.args.allow_other_commit or self.smoke)
            ok = ok and same
            figure = (f"{what}: mixprec {info['version']} from {info['file']}, CUDA kernels "
                      f"{info['cuda_kernels']}; {said}")
        else:
            figure = f"{what} failed: " + (f"exit {rcs}" if any(rcs) else
                                           f"mixprec does not import: {info.get('error', '')}")
        self.record(Result("install", "2.1", "PASS" if ok else "FAIL", figure, seconds,
                           "install.log" if steps else ""),
                    timed_out=124 in rcs, key=f"install-{self.install_kind}" if steps else "")
        return ok

    def start_cpp_build(self) -> None:
        """The C++ library and tests/cpp build in the background (it takes the cores, the
        Python parts mostly wait on the GPU) when a part needs them and can run."""
        if self.smoke or not any(p.cpp_build and not self.missing(p) for p in self.selected):
            return
        cmd = ["make", "cpp-tests-build", f"PYTHON={self.py}",
               f"CPP_JOBS={max(self.args.jobs - 4, 1)}",
               "CPP_BUILD_DIR=build/gpu-check-cmake",
               "CPP_PREFIX=build/gpu-check-cmake-install", f"CPP_TESTS_DIR={CPP_TESTS_DIR}"]
        self.cpp_job = Job(cmd, self.out / "cpp-build.log", self.env,
                           min(CPP_BUILD_LIMIT_S, max(self.left(), 1)), cwd=ROOT)

    def wait_cpp_build(self, need: float) -> str:
        """Wait for the background C++ build, at most until only ``need`` seconds of the
        budget are left; "" when it has built, else why the part cannot run."""
        job = self.cpp_job
        if job is None:
            return "the C++ build did not start"
        if job.proc.returncode is None:
            rc = job.wait(limit=self.left() - need)
            if rc is None:
                return (f"the C++ build was still running after {job.seconds:.0f} s, and "
                        f"only {self.left():.0f} s of the budget were left (cpp-build.log)")
        if job.proc.returncode != 0 or job.timed_out:
            return (f"the C++ build failed (exit {job.proc.returncode}"
                    f"{', timed out' if job.timed_out else ''}; cpp-build.log)")
        return ""

    # -- the parts ----------------------------------------------------------------------------

    def run_part(self, part: Part) -> None:
        need, limit, source = self.expect(part)
        if self.smoke and not part.smoke:
            self.record(Result(part.name, part.item, "SKIP", "needs a GPU (--cpu-smoke)"))
            return
        why = self.missing(part)
        if why:
            self.record(Result(part.name, part.item, "SKIP", why))
            return
        if need > self.left():
            self.record(Result(part.name, part.item, "SKIP",
                               f"does not fit: ~{need:.0f} s expected ({source}), "
                               f"{self.left():.0f} s left of the budget", budget=True))
            return
        t0 = time.monotonic()
        if part.cpp_build:
            why = self.wait_cpp_build(need)
            if why:
                failed = self.cpp_job is not None and self.cpp_job.proc.returncode not in (None, 0)
                self.record(Result(part.name, part.item, "FAIL" if failed else "SKIP", why,
                                   time.monotonic() - t0, "cpp-build.log", budget=not failed))
                return
        limit = min(limit, max(self.left(), 1))
        texts, rcs, _ = self.run_steps(part.name, part.steps(self), limit)
        ok, figure = part.judge(texts, rcs)
        if any(rc == 124 for rc in rcs):
            figure = f"timed out ({limit:.0f} s limit); " + figure
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.record(Result(part.name, part.item, status, figure, time.monotonic() - t0,
                           f"{part.name}.log"), timed_out=124 in rcs, key=part.name)

    def next_call(self) -> str:
        """The command for the parts that did not fit ("" when all did)."""
        rest = [r.part for r in self.results if r.budget]
        if not rest:
            return ""
        total = sum(self.expect(p)[0] for p in PARTS if p.name in rest)
        return (f"did not fit ({total:.0f} s expected): python3 tools/gpu_check.py --python "
                f"{self.args.python} --only {','.join(rest)} --budget-s "
                f"{SECOND_CALL_S:.0f}" + (" --cpu-smoke" if self.smoke else ""))

    def summary(self) -> List[str]:
        mp = self.info.get("mixprec") or {}
        head = (f"make gpu-check{' --cpu-smoke' if self.smoke else ''}: "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                f"{self.info.get('gpu', 'CPU')}, torch {self.info.get('torch', '?')}, mixprec "
                f"{mp.get('version', '?') if isinstance(mp, dict) else '?'} built at "
                f"{self.credited_commit()} (tree {self.tree or '?'}), "
                f"{time.monotonic() - self.t0:.0f} s of a {self.budget:.0f} s budget")
        lines = [f"# {head}", "", "| part | item | status | s | result | log |",
                 "| --- | --- | --- | ---: | --- | --- |"]
        for r in self.results:
            figure = r.figure.replace("|", "/")
            lines.append(f"| {r.part} | {r.item} | {r.status} | {r.seconds:.0f} | {figure} | "
                         f"{r.log} |")
        nxt = self.next_call()
        if nxt:
            lines += ["", nxt]
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
            gpu_jobs.children().kill_all()
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
    """Print what a run with these arguments would do, with expected times and where they
    come from; run nothing."""
    check = Check(args)
    steps = check.install_steps()
    install = (check.wheel_error or "pip install the wheel " + os.path.basename(check.wheel)
               if check.wheel else "build from source" if steps
               else "none (the package the interpreter imports)")
    est, _, source = check.expect(None)
    print(f"gpu-check plan{' (--cpu-smoke)' if check.smoke else ''}: budget "
          f"{check.budget:.0f} s, logs, summary.md and times.json in {check.out}")
    print(f"tree at {check.tree or 'unknown (no git)'}; the installed mixprec must have been "
          "built there (build_info()['git_commit'])"
          + (": --allow-other-commit lets another" if not args.allow_other_commit
             else ": --allow-other-commit given"))
    print(f"{'#':>2} {'part':<14}{'item':<5}{'expect':>7}{'limit':>7}{'total':>7}  run")
    print(f"{0:>2} {'install':<14}{'2.1':<5}{est:>6.0f}s{'':>7}{est:>6.0f}s  {install}"
          f"  [{source}]")
    for cmd in steps:
        print(f"{'':>36}$ {' '.join(cmd.cmd)}")
    rest = []
    for n, part in enumerate(PARTS, 1):
        need, limit, source = check.expect(part)
        why = check.missing(part) if part in check.selected else ""
        if part not in check.selected:
            verdict = "not selected (--only/--skip)"
        elif check.smoke and not part.smoke:
            verdict = "SKIP: needs a GPU"
        elif est + need > check.budget:
            verdict = "SKIP: does not fit the budget"
            rest.append(part.name)
        else:
            est += need
            verdict = "run"
        note = f" (SKIP where, as here, {why})" if why and verdict == "run" else ""
        print(f"{n:>2} {part.name:<14}{part.item:<5}{need:>6.0f}s{limit:>6.0f}s"
              f"{est:>6.0f}s  {verdict}: {part.what}  [{source}]{note}")
        if verdict == "run":
            for step in part.steps(check):
                env = " ".join(f"{k}={v}" for k, v in step.env.items())
                print(f"{'':>36}$ {env + ' ' if env else ''}{' '.join(step.cmd)}")
    print("estimates: 'guess' = built in (gpu_parts.py: for an H100, before the stable-ABI "
          "rewrite; no GPU run of this code has measured them); 'measured' = a run's record "
          f"({Path(args.times).name}, else tools/gpu_check_times.json) plus "
          f"{100 * (gpu_times.MARGIN - 1):.0f} %")
    if rest:
        print(f"then a second call: python3 tools/gpu_check.py --only {','.join(rest)} "
              f"--budget-s {SECOND_CALL_S:.0f}")
    return 0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (``--only``/``--skip`` as lists, ``--pack`` decided)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with torch (default: this one)")
    ap.add_argument("--plan", action="store_true", help="print the plan and exit")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: the parts that can, on CPU at tiny sizes")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help=f"total seconds (default {DEFAULT_BUDGET_S:.0f}; --cpu-smoke "
                         f"{SMOKE_BUDGET_S:.0f}; a warm second call: {SECOND_CALL_S:.0f})")
    ap.add_argument("--only", default="", help=f"parts to run, of {','.join(PART_NAMES[1:])}")
    ap.add_argument("--skip", default="", help="parts to leave out (install: use the "
                                               "package the interpreter imports)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "gpu-check"),
                    help="logs and summary.md (default $OUT, else build/gpu-check)")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                    help="pack the logs into gpu-check-logs.tar.gz at the end (default: when "
                         "--out is $OUT, whose files a device call brings back, 8 at most)")
    ap.add_argument("--wheel", default="", help="the wheel to install (default: the one "
                                                "dist/mixprec-*.whl; several: an error)")
    ap.add_argument("--allow-other-commit", action="store_true",
                    help="use a mixprec built from another commit than the tree's (or with "
                         "no stamp); the summary names the commit it was built at")
    ap.add_argument("--times", default=str(gpu_times.LOCAL_TIMES),
                    help="measured part times, read and updated (default "
                         "build/gpu-check-times.json; then tools/gpu_check_times.json is read)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tests", default=DEFAULT_TESTS,
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
    if args.budget_s < 0:
        ap.error(f"--budget-s: {args.budget_s} is negative")
    if args.wheel and not Path(args.wheel).is_file():
        ap.error(f"--wheel: {args.wheel} is not a file")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return plan(args) if args.plan else Check(args).run()


if __name__ == "__main__":
    if "--plan" not in sys.argv:  # (a run: its children die with it, whatever kills it)
        gpu_jobs.children().handle_signals()
    sys.exit(main())
