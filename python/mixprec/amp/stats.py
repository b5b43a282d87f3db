"""Statistics counted on the device, read lazily: :class:`FoldingLog` and the scaler's.

:class:`mixprec.GradScaler` records, at every :meth:`~mixprec.GradScaler.update`,
whether the iteration overflowed and what the scale became. Nothing is read
back to the host while training: each update appends two references (the
iteration's 0-dim ``found_inf`` tensor and a 0-dim copy of the new scale) to a
short pending list, and every :data:`FOLD_EVERY` updates the list is folded
into a handful of device-side counters with a few vectorised ops. Memory is
therefore bounded (at most ``FOLD_EVERY`` pairs of 0-dim tensors plus four
counters), the per-update cost is one tiny device copy, and a host sync happens
only when :meth:`mixprec.GradScaler.stats` is called.

The pending-list-and-fold mechanism is :class:`FoldingLog`; the scaler's tracker
and the trainer's per-step metrics (:mod:`mixprec.train.metrics`) are both built
on it, so there is one way to record per-step device values without a sync.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Generic, Optional, TypeVar

import torch
from torch import Tensor

__all__ = ["ScalerStats", "FOLD_EVERY", "FoldingLog"]

#: Number of rows (scaler: updates) kept pending before they are folded.
FOLD_EVERY = 64

Row = TypeVar("Row")


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
        return asdict(self)


class FoldingLog(Generic[Row]):
    """Per-step device values, recorded without a host sync and folded in blocks.

    :meth:`append` only keeps a reference to the step's row (a 1-D tensor, or a
    tuple of 0-dim tensors, already on the device; not to be modified afterwards).
    Every ``fold_every`` rows, and whenever a reader asks (:meth:`fold`), the
    pending rows are handed to :meth:`_fold_rows` with the index of the first
    one; a subclass reduces them with a few vectorised ops into device-side
    counters or history. So memory is bounded by ``fold_every`` rows plus what
    the subclass keeps, appending costs no device work, and nothing is read
    back to the host here: reading is the subclass's business.

    ``count`` is the number of rows appended so far (a host int, no sync); a
    restored log sets it so that row indices continue.
    """

    def __init__(self, fold_every: int = FOLD_EVERY) -> None:
        if fold_every < 1:
            raise ValueError(f"FoldingLog: fold_every must be >= 1, got {fold_every}")
        self.fold_every = int(fold_every)
        self.count = 0
        self._pending: list[Row] = []
        self._pending_base = 0

    @property
    def pending(self) -> list[Row]:
        """The rows not folded yet (oldest first); do not modify."""
        return self._pending

    def append(self, row: Row) -> None:
        """Record one row (index ``count``); folds when ``fold_every`` are pending."""
        if not self._pending:
            self._pending_base = self.count
        self._pending.append(row)
        self.count += 1
        if len(self._pending) >= self.fold_every:
            self.fold()

    def fold(self) -> None:
        """Reduce the pending rows (no host sync); a no-op when none are pending."""
        if not self._pending:
            return
        rows, base = self._pending, self._pending_base
        self._pending = []
        self._fold_rows(rows, base)

    def _fold_rows(self, rows: list[Row], first_index: int) -> None:
        """Reduce ``rows`` (indices ``first_index, first_index + 1, ...``)."""
        raise NotImplementedError


class _StatsTracker(FoldingLog[tuple[Optional[Tensor], Tensor]]):
    """Device-side counters behind :meth:`mixprec.GradScaler.stats`.

    A :class:`FoldingLog` whose rows are ``(found_inf, scale_after)`` of one
    update. Host state: ``count`` (the updates recorded, known without a sync) and the
    values already read back (``_host``). Device state: the pending rows and,
    once something was folded, ``_counts`` (int64 ``[skipped, increases,
    decreases]``) and ``_last`` (int64 0-dim, -1 for none), both on the
    scale's device. Pickles as plain numbers.
    """

    def __init__(self) -> None:
        super().__init__(FOLD_EVERY)
        # skipped, increases, decreases, last overflow step (-1: none)
        self._host: list[int] = [0, 0, 0, -1]
        self._counts: Optional[Tensor] = None
        self._last: Optional[Tensor] = None
        self._prev_scale: Optional[Tensor] = None

    # -- recording (no host sync) -------------------------------------------------
    def needs_baseline(self) -> bool:
        """True when the scale before the next update must be captured."""
        return self._prev_scale is None and not self._pending

    def set_baseline(self, scale_before: Tensor) -> None:
        """Give the scale (a 0-dim copy) the next update starts from."""
        self._prev_scale = scale_before

    def record(self, found_inf: Optional[Tensor], scale_after: Tensor) -> None:
        """Record one update. ``found_inf``: the iteration's combined 0-dim
        float32 flag (``None`` when no inf check ran); ``scale_after``: a 0-dim
        copy of the new scale. Both must stay unmodified afterwards."""
        self.append((found_inf, scale_after))

    def _fold_rows(self, rows: list[tuple[Optional[Tensor], Tensor]], first_index: int) -> None:
        scales = torch.stack([scale for _, scale in rows])
        dev = scales.device
        if self._prev_scale is None:  # baseline lost (e.g. after load_state_dict)
            prev0 = scales[:1]
        else:
            prev0 = self._prev_scale.reshape(1).to(dev)
        prev = torch.cat((prev0, scales[:-1]))
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        found = torch.stack([zero if f is None else f.reshape(()).to(dev) for f, _ in rows])
        over = found != 0
        counts = torch.stack((over.sum(), (scales > prev).sum(), (scales < prev).sum()))
        index = torch.arange(first_index, first_index + scales.numel(), device=dev)
        last = torch.where(over, index, torch.full_like(index, -1)).max()
        if self._counts is None or self._last is None:
            self._counts, self._last = counts, last
        else:
            self._counts = self._counts + counts
            self._last = torch.maximum(self._last, last)
        self._prev_scale = scales[-1]

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
        return self.count, skipped, inc, dec, (None if last < 0 else last)

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
        self.count = int(state["steps"])
        self._host = [int(v) for v in state["host"]]
        if state.get("prev_scale") is not None:
            self._prev_scale = torch.tensor(float(state["prev_scale"]), dtype=torch.float32)
