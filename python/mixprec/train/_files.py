"""How the trainer's checkpoints reach the disk whole, and how a reader tells a whole one
from one that a killed process left behind.

* A file (:func:`save_file`) is written beside its target (``.NAME.partial-*``), flushed and
  ``fsync``-ed, moved into place with ``os.replace`` (atomic) and its directory ``fsync``-ed:
  the path holds the previous file or the new one, never a part of either.
* A directory (the sharded form) is written under a new name (``NAME.partial-*``): every
  rank's DCP files, then ``trainer.pt``, then, last, the marker :data:`MARKER` listing every
  file with its size; only then is it renamed to ``NAME`` (over an existing checkpoint: the
  old one is first renamed to ``NAME.old-*``, removed after). A directory without its
  marker is a save that did not finish.
* A directory written by mixprec 0.1.0 (no marker, ``trainer.pt`` of format 1) still loads
  when every file its DCP metadata names is there and long enough, with a
  ``FutureWarning``; that path goes in :data:`LEGACY_REMOVED_IN`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import warnings
import zipfile
from typing import IO, Any, Callable, Optional

import torch

#: the last file of a finished sharded checkpoint (JSON: format, steps, world size, files)
MARKER = "COMPLETE"
#: the release that will stop loading sharded checkpoints without a marker
LEGACY_REMOVED_IN = "0.3.0"
#: periodic checkpoints: ``step-000000012.pt`` (a file) or ``step-000000012`` (a directory)
_STEP_RE = re.compile(r"^step-(\d{9,})(\.pt)?$")
_RANK_RE = re.compile(r"^__(\d+)_\d+\.distcp$")


class IncompleteCheckpointError(ValueError):
    """A checkpoint that is not whole: cut short, without its marker, or missing a file."""


def fsync_dir(path: str) -> None:
    """Make a rename or a removal in ``path`` durable (POSIX; elsewhere a no-op)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partial_name(path: str, token: str) -> str:
    """Where a save of ``path`` writes before it is moved into place."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}.partial-{token}")


def write_atomic(path: str, fill: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``fill(file)`` beside it, flush, fsync, ``os.replace``, fsync
    the directory. If anything raises, ``path`` is as it was and nothing is left."""
    path = os.path.abspath(path)
    tmp = partial_name(path, f"{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def save_file(obj: Any, path: str) -> None:
    """``torch.save(obj)`` to ``path``, atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda f: torch.save(obj, f))


def load_file(path: str, where: str) -> Any:
    """``torch.load(path, weights_only=True)`` of a checkpoint file; a file that is empty,
    cut short or damaged raises :class:`IncompleteCheckpointError` naming it (``where``: the
    caller, for the message)."""
    size = os.path.getsize(path)
    why = ("a save that was killed before it finished (mixprec 0.1.0 wrote in place; later "
           "releases write whole files or none), or a partial copy")
    if size == 0:
        raise IncompleteCheckpointError(f"{where}: {path} is empty: {why}")
    if not zipfile.is_zipfile(path):
        raise IncompleteCheckpointError(
            f"{where}: {path} is cut short: its {size} bytes end before the archive's end "
            f"record that torch.save writes last: {why}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise IncompleteCheckpointError(
            f"{where}: {path} is damaged: a record inside its archive cannot be read "
            f"({size} bytes): {why}") from e


def write_marker(directory: str, info: dict[str, Any]) -> None:
    """The marker, written last: ``info`` plus every file of ``directory`` with its size."""
    files = {n: os.path.getsize(os.path.join(directory, n)) for n in sorted(os.listdir(directory))
             if os.path.isfile(os.path.join(directory, n)) and not n.startswith(".")
             or n == ".metadata"}
    data = json.dumps({**info, "files": files}, indent=1, sort_keys=True).encode()
    write_atomic(os.path.join(directory, MARKER), lambda f: f.write(data))


def commit_dir(partial: str, path: str, token: str) -> None:
    """Make the finished ``partial`` the checkpoint ``path`` (renames; see the module)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(path):
        old = os.path.join(parent, f".{os.path.basename(path)}.old-{token}")
        os.rename(path, old)
        os.rename(partial, path)
        fsync_dir(parent)
        remove(old)
    else:
        os.rename(partial, path)
        fsync_dir(parent)


def remove(path: str) -> None:
    """Remove a checkpoint: a directory's marker first (a removal cut short leaves a directory
    that reads as unfinished, never one that reads as whole), then the rest."""
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, MARKER))
            fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def leftovers(path: str) -> list[str]:
    """The siblings that saves of ``path`` left (``.NAME.partial-*``, ``.NAME.old-*``)."""
    d, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(d):
        return []
    return [os.path.join(d, n) for n in sorted(os.listdir(d))
            if n.startswith((f".{name}.partial-", f".{name}.old-"))]


def _marker(directory: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(directory, MARKER), "rb") as f:
            info = json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return None  # (written atomically: only a hand-made one can be unreadable)
    return info if isinstance(info, dict) and isinstance(info.get("files"), dict) else None


def is_complete(path: str) -> bool:
    """Whether ``path`` is a finished checkpoint: a file, or a directory with its marker."""
    if os.path.isfile(path):
        return zipfile.is_zipfile(path)
    return os.path.isdir(path) and _marker(path) is not None


def stranded(path: str) -> Optional[str]:
    """When ``path`` is missing: the finished copy a save over it left between its two
    renames (the new one, ``.partial-*``, when finished; else the old one), or ``None``."""
    done = [p for p in leftovers(path) if os.path.isdir(p) and _marker(p) is not None]
    if not done:
        return None
    return max(done, key=lambda p: ((_marker(p) or {}).get("optimizer_steps", -1),
                                    ".partial-" in os.path.basename(p)))


def _rank_of(name: str) -> str:
    m = _RANK_RE.match(name)
    return f" (rank {m.group(1)}'s shards)" if m else ""


def check_dir(path: str, rest_file: str, where: str) -> dict[str, Any]:
    """Check a sharded checkpoint directory before anything is read from it; returns its
    marker's info (``{}`` for a 0.1.0 directory, which warns). Raises
    :class:`IncompleteCheckpointError` naming what is missing or cut short."""
    info = _marker(path)
    rest = os.path.join(path, rest_file)
    if info is None:
        if os.path.exists(os.path.join(path, MARKER)):
            raise IncompleteCheckpointError(f"{where}: {path}: its {MARKER} marker is unreadable")
        if not os.path.isfile(rest):
            raise IncompleteCheckpointError(
                f"{where}: {path} has no {MARKER} marker and no {rest_file}: a save that did "
                "not finish (the marker is written last, once every rank's files are written)")
        fmt = load_file(rest, where).get("format") if os.path.getsize(rest) else None
        if fmt != 1:
            raise IncompleteCheckpointError(
                f"{where}: {path} has no {MARKER} marker: a save that did not finish (every "
                f"rank's files and {rest_file} are written first, the marker last)")
        _check_dcp_files(path, where)
        warnings.warn(
            f"{where}: {path} has no {MARKER} marker (written by mixprec 0.1.0): loaded "
            "because every file it names is there, but a save of that release cut short can "
            "mix two saves' parts; such directories will not load from mixprec "
            f"{LEGACY_REMOVED_IN} on: save it again", FutureWarning, stacklevel=4)
        return {}
    for name, size in sorted(info["files"].items()):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise IncompleteCheckpointError(
                f"{where}: {path} is missing {name}{_rank_of(name)}, which its {MARKER} "
                "marker lists (a partial copy?)")
        if os.path.getsize(full) != size:
            raise IncompleteCheckpointError(
                f"{where}: {path}/{name}{_rank_of(name)} has {os.path.getsize(full)} bytes, "
                f"its {MARKER} marker says {size} (cut short or replaced)")
    _check_dcp_files(path, where)
    return info


def _check_dcp_files(path: str, where: str) -> None:
    """Every file the DCP metadata of ``path`` refers to is there and long enough."""
    from torch.distributed.checkpoint import FileSystemReader

    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise IncompleteCheckpointError(
            f"{where}: {path} has no .metadata (the DCP index rank 0 writes once every rank "
            "wrote its files): a save that did not finish")
    try:
        meta = FileSystemReader(path).read_metadata()
    except Exception as e:  # (a torn .metadata: pickle's or the reader's error)
        raise IncompleteCheckpointError(f"{where}: {path}/.metadata is damaged") from e
    need: dict[str, int] = {}
    for item in (meta.storage_data or {}).values():
        rel = item.relative_path
        need[rel] = max(need.get(rel, 0), int(item.offset) + int(item.length))
    for rel, size in sorted(need.items()):
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise IncompleteCheckpointError(
                f"{where}: {path} is missing {rel}{_rank_of(rel)}, which its .metadata names")
        if os.path.getsize(full) < size:
            raise IncompleteCheckpointError(
                f"{where}: {path}/{rel}{_rank_of(rel)} is cut short: {os.path.getsize(full)} "
                f"bytes, its .metadata needs {size}")


# -- a directory of periodic checkpoints ----------------------------------------------------
def step_name(steps: int, sharded: bool) -> str:
    """The name of the periodic checkpoint after ``steps`` optimizer steps."""
    return f"step-{steps:09d}" + ("" if sharded else ".pt")


def complete_checkpoints(root: str) -> list[tuple[int, str]]:
    """The finished checkpoints in ``root``, ``(steps, path)``, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        full = os.path.join(root, name)
        if m and is_complete(full):
            out.append((int(m.group(1)), full))
    return sorted(out)


def latest(root: str) -> Optional[str]:
    """The newest finished checkpoint in ``root``, or ``None``."""
    done = complete_checkpoints(root)
    return done[-1][1] if done else None


def prune(root: str, keep: int, newest: str) -> None:
    """Keep the ``keep`` newest finished checkpoints of ``root`` (``newest``, just finished,
    among them); remove the older ones and what killed saves left."""
    done = [p for _, p in complete_checkpoints(root)]
    assert os.path.abspath(newest) in map(os.path.abspath, done)
    for p in done[:-keep]:
        remove(p)
    for name in os.listdir(root):
        if name.startswith(".step-") and (".partial-" in name or ".old-" in name):
            remove(os.path.join(root, name))
    fsync_dir(root)
