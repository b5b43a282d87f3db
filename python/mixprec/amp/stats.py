"""Loss-scaling statistics counted on the device, read lazily.

:class:`mixprec.GradScaler` records, at every :meth:`~mixprec.GradScaler.update`,
whether the iteration overflowed and what the scale became. Nothing is read
back to the host while training: each update appends two references (the
iteration's 0-dim ``found_inf`` tensor and a 0-dim copy of the new scale) to a
short pending list, and every :data:`FOLD_EVERY` updates the list is folded
into a handful of device-side counters with a few vectorised ops. Memory is
therefore bounded (at most ``FOLD_EVERY`` pairs of 0-dim tensors plus four
counters), the per-update cost is one tiny device copy, and a host sync happens
only when :meth:`mixprec.GradScaler.stats` is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

__all__ = ["ScalerStats", "FOLD_EVERY"]

#: Number of updates kept pending before they are folded into the counters.
FOLD_EVERY = 64


@dataclass(frozen=True)
class ScalerStats:
    """A snapshot of a scaler's history, as plain Python numbers.

    Attributes:
        steps: number of :meth:`~mixprec.GradScaler.update` calls (iterations).
        skipped_steps: iterations whose gradients held inf/NaN, so that every
            optimizer step of the iteration was skipped.
        overflow_rate: ``skipped_steps / steps`` (0.0 before the first update).
        scale_increases: updates after which the scale was larger than before.
        scale_decreases: updates after which the scale was smaller than before
            (an overflow absorbed by hysteresis, or one at ``min_scale``, does
            not decrease it).
        scale: the current scale (1.0 for a disabled scaler).
        last_overflow_step: 0-based index of the last iteration that saw
            inf/NaN (the first ``update()`` closes iteration 0), or ``None``.
    """

    steps: int
    skipped_steps: int
    overflow_rate: float
    scale_increases: int
    scale_decreases: int
    scale: float
    last_overflow_step: Optional[int]

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as a ``dict`` (for loggers)."""
        return {
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "overflow_rate": self.overflow_rate,
            "scale_increases": self.scale_increases,
            "scale_decreases": self.scale_decreases,
            "scale": self.scale,
            "last_overflow_step": self.last_overflow_step,
        }


class _StatsTracker:
    """Device-side counters behind :meth:`mixprec.GradScaler.stats`.

    Host state: ``steps`` (a Python int, known without a sync) and the values
    already read back (``_host``). Device state: the pending list and, once
    something was folded, ``_counts`` (int64 ``[skipped, increases,
    decreases]``) and ``_last`` (int64 0-dim, -1 for none), both on the
    scale's device. Pickles as plain numbers.
    """

    def __init__(self) -> None:
        self.steps = 0
        # skipped, increases, decreases, last overflow step (-1: none)
        self._host: list[int] = [0, 0, 0, -1]
        self._counts: Optional[Tensor] = None
        self._last: Optional[Tensor] = None
        self._prev_scale: Optional[Tensor] = None
        self._pending_found: list[Optional[Tensor]] = []
        self._pending_scale: list[Tensor] = []
        self._pending_base = 0

    # -- recording (no host sync) -------------------------------------------------
    def needs_baseline(self) -> bool:
        """True when the scale before the next update must be captured."""
        return self._prev_scale is None and not self._pending_scale

    def set_baseline(self, scale_before: Tensor) -> None:
        """Give the scale (a 0-dim copy) the next update starts from."""
        self._prev_scale = scale_before

    def record(self, found_inf: Optional[Tensor], scale_after: Tensor) -> None:
        """Record one update. ``found_inf``: the iteration's combined 0-dim
        float32 flag (``None`` when no inf check ran); ``scale_after``: a 0-dim
        copy of the new scale. Both must stay unmodified afterwards."""
        if not self._pending_scale:
            self._pending_base = self.steps
        self._pending_found.append(found_inf)
        self._pending_scale.append(scale_after)
        self.steps += 1
        if len(self._pending_scale) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Reduce the pending updates into the device counters (no host sync)."""
        if not self._pending_scale:
            return
        scales = torch.stack(self._pending_scale)
        dev = scales.device
        if self._prev_scale is None:  # baseline lost (e.g. after load_state_dict)
            prev0 = scales[:1]
        else:
            prev0 = self._prev_scale.reshape(1).to(dev)
        prev = torch.cat((prev0, scales[:-1]))
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        found = torch.stack(
            [zero if f is None else f.reshape(()).to(dev) for f in self._pending_found]
        )
        over = found != 0
        counts = torch.stack((over.sum(), (scales > prev).sum(), (scales < prev).sum()))
        index = torch.arange(self._pending_base, self._pending_base + scales.numel(), device=dev)
        last = torch.where(over, index, torch.full_like(index, -1)).max()
        if self._counts is None or self._last is None:
            self._counts, self._last = counts, last
        else:
            self._counts = self._counts + counts
            self._last = torch.maximum(self._last, last)
        self._prev_scale = scales[-1]
        self._pending_found.clear()
        self._pending_scale.clear()

    def rebaseline(self) -> None:
        """Forget the previous scale (it was changed outside an update)."""
        self.fold()
        self._prev_scale = None

    # -- reading (host sync) ------------------------------------------------------
    def read(self) -> tuple[int, int, int, int, Optional[int]]:
        """``(steps, skipped, increases, decreases, last_overflow_step)``; syncs."""
        self.fold()
        skipped, inc, dec, last = self._host
        if self._counts is not None and self._last is not None:
            c = self._counts.tolist()
            skipped, inc, dec = skipped + c[0], inc + c[1], dec + c[2]
            last = max(last, int(self._last.item()))
        return self.steps, skipped, inc, dec, (None if last < 0 else last)

    def __getstate__(self) -> dict[str, Any]:
        steps, skipped, inc, dec, last = self.read()
        prev = None if self._prev_scale is None else float(self._prev_scale.item())
        return {
            "steps": steps,
            "host": [skipped, inc, dec, -1 if last is None else last],
            "prev_scale": prev,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.steps = int(state["steps"])
        self._host = [int(v) for v in state["host"]]
        if state.get("prev_scale") is not None:
            self._prev_scale = torch.tensor(float(state["prev_scale"]), dtype=torch.float32)
