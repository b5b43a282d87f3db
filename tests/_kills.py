"""Kill training processes with SIGKILL at chosen moments (the fault-injection tests).

A round forks ``world`` processes from the test process (torch is imported already, so a
round costs milliseconds, not an interpreter start), one torch thread each, joined by a gloo
group when ``world > 1``, and runs ``entry(rank, world, *args)`` in each. A :class:`Plan`
says how the round ends:

* ``"time"``: the test process kills every rank ``value`` seconds after the start;
* ``"call"``: rank ``rank`` kills itself at its ``value``-th call of ``os.fsync``,
  ``os.replace``, ``os.rename``, ``os.unlink`` or ``shutil.rmtree`` (before it, or just
  after it with ``after``): the steps of a save (torch's DCP writer calls them too);
* ``"bytes"``: rank ``rank`` kills itself once ``value`` bytes went into the files that
  ``mixprec.train._files`` writes (a file cut short mid-record);
* ``None``: no kill.

When one rank dies, the others (stuck in a collective) are killed at once, as a job
scheduler would. :func:`digest` is a sha256 of nested tensors and plain values.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, NamedTuple, Optional

import torch

_CALLS = ("fsync", "replace", "rename", "unlink")


class Plan(NamedTuple):
    kind: Optional[str] = None
    value: float = 0
    rank: int = 0
    after: bool = False


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(plan: Plan) -> None:
    """In the doomed child: wrap the calls or the writes (see the module)."""
    count = {"n": 0, "bytes": 0}
    if plan.kind == "call":
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                count["n"] += 1
                hit = count["n"] == int(plan.value)
                if hit and not plan.after:
                    _die()
                out = fn(*args, **kwargs)
                if hit:
                    _die()
                return out
            return call

        for name in _CALLS:
            setattr(os, name, wrap(getattr(os, name)))
        shutil.rmtree = wrap(shutil.rmtree)  # type: ignore[assignment]
    elif plan.kind == "bytes":
        import mixprec.train._files as files

        class Doomed(io.FileIO):
            def write(self, b: Any) -> int:
                n = memoryview(b).nbytes
                room = int(plan.value) - count["bytes"]
                if n >= room:
                    super().write(memoryview(b).cast("B")[:max(room, 0)])
                    self.flush()
                    _die()
                count["bytes"] += n
                return super().write(b)

        files.open = lambda path, mode="rb": Doomed(path, mode.replace("b", ""))  # type: ignore


def _child(entry: Callable[..., Any], rank: int, world: int, init: str, plan: Plan,
           args: tuple[Any, ...], group: bool) -> None:
    code = 0
    try:
        torch.set_num_threads(1)
        if plan.kind in ("call", "bytes") and plan.rank == rank:
            _arm(plan)
        if group:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank,
                                    world_size=world)
        entry(rank, world, *args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # (no interpreter shutdown: see _worker in tests/distributed/_fsdp2_cases.py)


NO_KILL = Plan()


def run(entry: Callable[..., Any], args: tuple[Any, ...], world: int = 1,
        plan: Plan = NO_KILL, timeout: float = 60.0, group: Optional[bool] = None) -> str:
    """One round: ``"done"`` (every rank returned), or ``"killed"``; a rank that raised
    fails the test, unless another was killed (its peers may then fail in a collective).
    ``group``: a gloo group (default: when ``world > 1``)."""
    group = world > 1 if group is None else group
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_child,
                             args=(entry, r, world, os.path.join(tmp, "init"), plan, args,
                                   group))
                 for r in range(world)]
        start = time.monotonic()
        for p in procs:
            p.start()
        killed = False
        while any(p.exitcode is None for p in procs):
            now = time.monotonic() - start
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or (plan.kind == "time" and now >= plan.value):
                killed = True
                for p in procs:
                    if p.exitcode is None:
                        os.kill(p.pid, signal.SIGKILL)
            if now > timeout:
                for p in procs:
                    if p.exitcode is None:
                        os.kill(p.pid, signal.SIGKILL)
                raise AssertionError(f"round {plan} ran past {timeout} s")
            time.sleep(0.002)
        for p in procs:
            p.join()
        codes = [p.exitcode for p in procs]
    if -signal.SIGKILL not in codes and any(c != 0 for c in codes):
        raise AssertionError(f"a rank failed (exit codes {codes}, plan {plan}): see its stderr")
    return "killed" if killed or any(c != 0 for c in codes) else "done"


def digest(obj: Any) -> str:
    """sha256 of nested dicts/lists/tuples of tensors (dtype, shape, bits) and plain values."""
    h = hashlib.sha256()

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{o.dtype}{list(o.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(o, dict):
            h.update(b"{")
            for k in sorted(o, key=repr):
                h.update(repr(k).encode())
                walk(o[k])
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for x in o:
                walk(x)
            h.update(b"]")
        else:
            h.update(repr(o).encode())

    walk(obj)
    return h.hexdigest()


def append_line(path: str, line: str) -> None:
    """Append ``line`` durably (a kill right after it keeps it)."""
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def save_result(obj: Any, path: str) -> None:
    """``torch.save`` beside ``path``, then rename (a test's own output, never torn)."""
    torch.save(obj, path + ".tmp")
    os.rename(path + ".tmp", path)
