"""``mixprec.patch_torch()``: make torch's GradScaler classes construct mixprec's.

After ``mixprec.patch_torch()``, ``torch.amp.GradScaler(...)`` (also reached as
``torch.GradScaler``), ``torch.cuda.amp.GradScaler(...)`` and
``torch.cpu.amp.GradScaler(...)`` return :class:`mixprec.GradScaler` instances
(for the last two, subclasses with those classes' argument order that are also
instances of the torch class), so unmodified scripts and frameworks -- including
code that did ``from torch.amp import GradScaler`` before the patch -- use
mixprec's scaler.

How: the torch classes themselves are not replaced (``isinstance`` checks and
earlier imports keep working); each gets a ``__new__`` that, when *exactly*
that class is instantiated, allocates the mixprec class instead. Python then
runs the mixprec ``__init__`` with the caller's arguments. Subclasses of torch's
scaler (e.g. FSDP's ``ShardedGradScaler``) are not affected. Unpickling a
torch scaler while patched also yields a mixprec one (its state is accepted).

``mixprec.unpatch_torch()`` switches the hooks off (they stay installed and
then just allocate the class being instantiated, as ``object.__new__`` does).
``patch_torch()`` can be used as a context manager, restoring the previous
state on exit::

    with mixprec.patch_torch():
        run_unmodified_training_script()
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from ._legacy import CpuGradScaler, CudaGradScaler
from .grad_scaler import GradScaler

__all__ = ["patch_torch", "unpatch_torch", "is_torch_patched"]

# The hooks are installed on first use and then stay; ``_active`` switches them.
# (Deleting a ``__new__`` assigned to a class does not give it back
# ``object.__new__``'s slot in CPython, so "unpatching" by deletion breaks
# construction with arguments.)
_installed: set[type] = set()
_active = False


def _make_new(target: type, replacement: type) -> Callable[..., Any]:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _active and cls is target:
            return object.__new__(replacement)
        return object.__new__(cls)

    # keep inspect.signature(torch.amp.GradScaler) showing the real arguments
    __new__.__signature__ = inspect.signature(target.__init__)  # type: ignore[attr-defined]
    return __new__


def is_torch_patched() -> bool:
    """Whether :func:`patch_torch` is in effect."""
    return _active


def _apply() -> None:
    global _active
    for target, replacement in ((torch.amp.GradScaler, GradScaler),
                                (torch.cuda.amp.GradScaler, CudaGradScaler),
                                (torch.cpu.amp.GradScaler, CpuGradScaler)):
        # (a class whose __new__ is torch's own is left alone)
        if target in _installed or "__new__" in target.__dict__:
            continue
        target.__new__ = staticmethod(_make_new(target, replacement))  # type: ignore[assignment]
        _installed.add(target)
    _active = True


def unpatch_torch() -> None:
    """Restore torch's GradScaler classes (no-op when not patched)."""
    global _active
    _active = False


class _TorchPatch:
    """Returned by :func:`patch_torch`; a context manager undoing the patch on exit."""

    def __init__(self, was_patched: bool) -> None:
        self._was_patched = was_patched

    def __enter__(self) -> _TorchPatch:
        _apply()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._was_patched:
            unpatch_torch()

    def __repr__(self) -> str:
        return f"<mixprec.patch_torch active={is_torch_patched()}>"


def patch_torch() -> _TorchPatch:
    """Make ``torch.amp.GradScaler`` / ``torch.cuda.amp.GradScaler`` /
    ``torch.cpu.amp.GradScaler`` construct :class:`mixprec.GradScaler`.

    Takes effect immediately and lasts until :func:`unpatch_torch`; used as
    ``with mixprec.patch_torch(): ...`` it lasts until the block exits (if
    torch was already patched before, it stays patched). Idempotent.
    """
    handle = _TorchPatch(is_torch_patched())
    _apply()
    return handle
