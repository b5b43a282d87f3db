"""``mixprec.patch_torch()``: make torch's GradScaler classes construct mixprec's.

After it, ``torch.amp.GradScaler(...)``, ``torch.cuda.amp.GradScaler(...)`` and
``torch.cpu.amp.GradScaler(...)`` return :class:`mixprec.GradScaler` instances (the last two
with their classes' argument order, still instances of them), even where the class was
imported before. The torch classes are not replaced: each gets a ``__new__`` that allocates
the mixprec class when exactly that class is instantiated (subclasses such as FSDP's
``ShardedGradScaler`` are not affected; unpickling a torch scaler while patched yields a
mixprec one). ``mixprec.unpatch_torch()`` switches the hooks off;
``with mixprec.patch_torch(): ...`` restores the previous state on exit.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from ._legacy import CpuGradScaler, CudaGradScaler
from .grad_scaler import GradScaler

__all__ = ["patch_torch", "unpatch_torch", "is_torch_patched"]

# The hooks stay once installed (deleting an assigned ``__new__`` breaks construction with
# arguments in CPython); ``_active`` switches them.
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

    Lasts until :func:`unpatch_torch`, or, as ``with mixprec.patch_torch(): ...``, until
    the block exits (staying patched if it was before). Idempotent.
    """
    handle = _TorchPatch(is_torch_patched())
    _apply()
    return handle
