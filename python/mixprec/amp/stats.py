"""Statistics counted on the device, read lazily: :class:`ScalerStats` and ``_StatsTracker``.
Every :meth:`~mixprec.GradScaler.update` adds the iteration to int64 device counters in place
(also on graph replays): the scale update's own kernel does (``counts`` and ``prev_scale`` of
:func:`mixprec.ops.update_scale_`), an update to a given ``new_scale`` the tracker's ops. Only
:meth:`mixprec.GradScaler.stats` syncs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch import Tensor

__all__ = ["ScalerStats"]


@dataclass(frozen=True)
class ScalerStats:
    """A snapshot of a scaler's history, as plain Python numbers.

    Attributes:
        steps: number of :meth:`~mixprec.GradScaler.update` calls (iterations).
        skipped_steps: iterations whose grads held inf/NaN (their steps were skipped).
        overflow_rate: ``skipped_steps / steps`` (0.0 before the first update).
        scale_increases: updates after which the scale was larger than before.
        scale_decreases: updates after which it was smaller (an overflow absorbed by
            hysteresis or at ``min_scale`` does not count).
        scale: the current scale (1.0 for a disabled scaler).
        last_overflow_step: 0-based index of the last iteration with inf/NaN, or ``None``.
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


class _StatsTracker:
    """Device-side counters behind :meth:`mixprec.GradScaler.stats`, updated in place.

    On the scale's device, from the first update: ``_counts`` (int64 ``[steps, skipped,
    increases, decreases, last overflow index (-1: none)]``) and ``_prev`` (float32 0-dim, the
    scale before the next update); for :meth:`record`, ``_row`` (bool ``[1, overflowed, grew,
    shrank]``). Each keeps its storage (a captured ``update()`` replays into it). Pickles as
    plain numbers, held in ``_host`` until the next update.
    """

    def __init__(self) -> None:
        self._host: list[int] = [0, 0, 0, 0, -1]
        self._counts: Optional[Tensor] = None
        self._row: Optional[Tensor] = None
        self._prev: Optional[Tensor] = None

    def start(self, scale: Tensor) -> None:
        """Before an update: the scale it starts from, when none is known (no host sync)."""
        if self._prev is None:
            self._prev = scale.detach().reshape(()).clone()
        elif self._prev.device != scale.device:  # restored from a pickle
            self._prev = self._prev.to(scale.device)

    def _device_counts(self, device: torch.device) -> Tensor:
        """``_counts``, made on ``device`` at the first update (filled there: no copy)."""
        if self._counts is None:
            self._counts = torch.zeros(5, dtype=torch.int64, device=device)
            for k, v in enumerate(self._host):
                if v:
                    self._counts[k].fill_(v)
            self._host = [0, 0, 0, 0, -1]
        return self._counts

    def kernel_state(self, scale: Tensor) -> tuple[Tensor, Tensor]:
        """Before an update by the scale rule's kernel: ``(counts, prev_scale)`` for its
        ``counts`` and ``prev_scale`` arguments, which count the update there (as
        :meth:`record` would) and set ``prev_scale`` to the new scale."""
        self.start(scale)
        assert self._prev is not None
        return self._device_counts(scale.device), self._prev

    def record(self, found_inf: Optional[Tensor], scale: Tensor) -> None:
        """After an update not made by the rule's kernel (a given ``new_scale``):
        ``found_inf`` (the iteration's combined 0-dim float32 flag, or ``None`` when no inf
        check ran) and the new ``scale``."""
        after, prev = scale.detach().reshape(()), self._prev
        c = self._device_counts(after.device)
        if self._row is None:
            self._row = torch.zeros(4, dtype=torch.bool, device=after.device)
            self._row[0].fill_(True)
        row = self._row
        if found_inf is None:
            row[1].fill_(False)
        else:
            torch.ne(found_inf.reshape(()), 0, out=row[1])
        torch.where(row[1], c[0], c[4], out=c[4])  # the index of this update
        torch.gt(after, prev, out=row[2])
        torch.lt(after, prev, out=row[3])
        c[:4].add_(row)
        prev.copy_(after)

    def rebaseline(self, scale: Tensor) -> None:
        """The scale was set outside an update (a loaded state dict): count from it."""
        if self._prev is not None:
            self._prev.copy_(scale.detach().reshape(()))

    def device_counts(self) -> Optional[Tensor]:
        """The int64 counters on the device (``None`` before the first update): for a
        caller that reads them together with other values and hands them to :meth:`read`."""
        return self._counts

    def read(self, counts: Optional[list[int]] = None
             ) -> tuple[int, int, int, int, Optional[int]]:
        """``(steps, skipped, increases, decreases, last_overflow_step)``; syncs, unless
        ``counts`` gives :meth:`device_counts` already read."""
        c = counts if counts is not None else (
            self._host if self._counts is None else self._counts.tolist())
        return c[0], c[1], c[2], c[3], (None if c[4] < 0 else c[4])

    def __getstate__(self) -> dict[str, Any]:
        steps, skipped, inc, dec, last = self.read()
        prev = None if self._prev is None else float(self._prev.item())
        return {"steps": steps, "host": [skipped, inc, dec, -1 if last is None else last],
                "prev_scale": prev}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._host = [int(state["steps"]), *(int(v) for v in state["host"])]
        if state.get("prev_scale") is not None:
            self._prev = torch.tensor(float(state["prev_scale"]), dtype=torch.float32)
