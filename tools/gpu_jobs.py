"""The child processes of tools/gpu_check.py: each command in its own process group, and
none of them outliving the driver.

Every child gets ``MIXPREC_GPU_CHECK_DRIVER=<driver pid>`` in its environment; the driver
keeps the process groups it started in a file, and a watchdog in its own session (it
survives the driver, as the children do) kills those groups when the driver dies, however it
dies (SIGKILL at a device call's limit included). On SIGTERM, SIGINT or SIGHUP and at exit the
driver kills them itself. At start, :func:`kill_stale` kills every process marked by a driver
that is no longer alive (a watchdog that died too, or a run from before this one).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set

MARK = "MIXPREC_GPU_CHECK_DRIVER"

WATCHDOG = """
import os, signal, sys, time
driver, path = int(sys.argv[1]), sys.argv[2]
while os.path.exists(path):
    try:
        os.kill(driver, 0)
        time.sleep(0.5)
        continue
    except ProcessLookupError:
        pass
    except PermissionError:
        time.sleep(0.5)
        continue
    try:
        groups = [int(x) for x in open(path).read().split()]
    except (OSError, ValueError):
        groups = []
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.unlink(path)
    except OSError:
        pass
    break
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marked_processes() -> Dict[int, int]:
    """{pid: the driver pid it is marked with} of the processes this user can read."""
    found: Dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(MARK.encode() + b"="):
                try:
                    found[int(entry.name)] = int(item.split(b"=", 1)[1])
                except ValueError:
                    pass
    return found


def kill_stale(own: Optional[int] = None, drivers: Optional[Set[int]] = None) -> List[int]:
    """Kill (SIGKILL, by process group) every process marked by a driver that is not alive
    and is not ``own`` (default: this process); with ``drivers``, only those marked by one
    of them (a test leaves other runs on a shared machine alone). The pids killed."""
    own = os.getpid() if own is None else own
    ancestors: Set[int] = set()
    pid = os.getpid()
    while pid > 1:
        ancestors.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    killed = []
    for pid, driver in marked_processes().items():
        if driver == own or pid in ancestors or _alive(driver) or (
                drivers is not None and driver not in drivers):
            continue
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        killed.append(pid)
    return killed


class Children:
    """The process groups this driver started: written to a file a watchdog reads, killed
    on a signal and at exit."""

    def __init__(self) -> None:
        self.groups: Dict[int, subprocess.Popen[Any]] = {}
        fd, name = tempfile.mkstemp(prefix="mixprec-gpu-check-", suffix=".pgids")
        os.close(fd)
        self.path = Path(name)
        self.watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()),
                                          str(self.path)], start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        atexit.register(self.close)

    def handle_signals(self) -> None:
        """On SIGTERM, SIGINT and SIGHUP: kill the children, then die of the signal (the
        driver's ``main`` when run as a script; not inside a test runner)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _write(self) -> None:
        if self.path.exists():
            self.path.write_text(" ".join(str(g) for g in self.groups))

    def add(self, proc: subprocess.Popen[Any]) -> None:
        self.groups[proc.pid] = proc
        self._write()

    def discard(self, proc: subprocess.Popen[Any]) -> None:
        self.groups.pop(proc.pid, None)
        self._write()

    def kill_all(self) -> None:
        for pgid in list(self.groups):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
            self.groups.pop(pgid, None)

    def close(self) -> None:
        """Kill what is left, end the watchdog (it exits when the file is gone)."""
        self.kill_all()
        try:
            self.path.unlink()
        except OSError:
            pass
        if self.watchdog.poll() is None:
            try:
                self.watchdog.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()

    def _on_signal(self, sig: int, _frame: Any) -> None:
        print(f"gpu_check: {signal.Signals(sig).name}: killing {len(self.groups)} child "
              "process group(s)", file=sys.stderr, flush=True)
        self.close()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


_CHILDREN: Optional[Children] = None


def children() -> Children:
    """This process's :class:`Children` (created, with its watchdog, on first use)."""
    global _CHILDREN
    if _CHILDREN is None:
        _CHILDREN = Children()
    return _CHILDREN


class Job:
    """A command in its own process group, its output appended to a log file. At its time
    limit the group gets ``kill_signal`` (SIGINT: pytest prints its summary; SIGABRT makes
    PYTHONFAULTHANDLER print every thread's stack), ``grace`` seconds later SIGKILL."""

    def __init__(self, cmd: Sequence[str], log: Path, env: Dict[str, str], timeout: float,
                 cwd: Path, kill_signal: int = signal.SIGTERM, grace: float = 10.0) -> None:
        self.cmd = list(cmd)
        self.log = log
        self.timeout = max(timeout, 1.0)
        self.kill_signal = kill_signal
        self.grace = grace
        self.start = time.monotonic()
        self.timed_out = False
        with open(log, "a") as f:
            f.write(f"\n$ {' '.join(self.cmd)}\n")
        self._out = open(log, "a")
        env = dict(env, **{MARK: str(os.getpid())})
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        children().add(self.proc)

    def wait(self, limit: Optional[float] = None) -> Optional[int]:
        """Wait for the command, killing its group at its time limit; its exit status (124
        when it ran out of time). With ``limit``: wait at most that long and return None if
        it is still running then (it keeps its own limit)."""
        left = max(self.timeout - self.seconds, 0)
        try:
            rc = self.proc.wait(timeout=left if limit is None else min(left, max(limit, 0)))
        except subprocess.TimeoutExpired:
            if limit is not None and self.seconds < self.timeout:
                return None
            self.timed_out = True
            self.kill()
            rc = 124
        self._finish(rc)
        return rc

    def _finish(self, rc: int) -> None:
        if self._out.closed:
            return
        self._out.close()
        children().discard(self.proc)
        with open(self.log, "rb") as f:  # (on a line of its own: the output may stop mid-line)
            size = f.seek(0, os.SEEK_END)
            ends = size == 0 or (f.seek(size - 1) >= 0 and f.read(1) == b"\n")
        with open(self.log, "a") as f:
            killed = f", killed at its {self.timeout:.0f} s limit" if self.timed_out else ""
            f.write(("" if ends else "\n") + f"[exit {rc}{killed}, {self.seconds:.1f} s]\n")

    def kill(self) -> None:
        for sig, wait in ((self.kill_signal, self.grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # whatever of the group outlived its leader
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start
