"""The trainer's per-step metrics: recorded on the device (:class:`StepResult`,
:class:`StepMetrics`, :class:`MetricsLog`), read at log steps (:func:`log_window`), plotted
(:func:`plot_history`); and :func:`memory_usage`, bytes in use on a device without a sync.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch
from torch import Tensor

from .config import HandlingAction, MixedPrecisionConfig

__all__ = ["StepResult", "StepMetrics", "MetricsLog", "COLS", "memory_usage", "log_window",
           "plot_history"]

logger = logging.getLogger("mixprec.trainer")


class StepResult:
    """What :meth:`mixprec.train.manager.MixedPrecisionManager.step` did. ``bool(result)``:
    whether the optimizer step was applied (one host sync the first time, cached; none with a
    disabled scaler, where every step is applied). The device values, no sync:

    Attributes:
        applied: 0-dim bool tensor, ``True`` when the step was applied.
        found_inf: 0-dim float32, 1.0 when the grads held inf/NaN (with a disabled
            scaler: when the computed grad norm was non-finite; the step ran anyway).
        scale: the loss scale after the update (1.0 without loss scaling).
        grad_norm: the unscaled L2 grad norm before clipping (0-dim float32), or ``None`` when
            neither clipping nor ``performance_monitoring`` computed it.
        underflow: 1.0 when more than ``underflow_threshold`` of the nonzero scaled grads flush
            to zero in the compute dtype (0.0 without monitoring).
        checked: whether an enabled GradScaler checked this step (else never skipped).
    """

    __slots__ = ("found_inf", "scale", "grad_norm", "underflow", "checked", "_applied", "_host")

    def __init__(self, found_inf: Tensor, scale: Tensor, grad_norm: Optional[Tensor],
                 underflow: Tensor, checked: bool) -> None:
        self.found_inf, self.scale, self.grad_norm = found_inf, scale, grad_norm
        self.underflow, self.checked = underflow, checked
        self._applied: Optional[Tensor] = None
        self._host: Optional[bool] = None if checked else True

    @property
    def applied(self) -> Tensor:
        """0-dim bool tensor (no sync)."""
        if self._applied is None:
            self._applied = (self.found_inf == 0 if self.checked else
                             torch.ones((), dtype=torch.bool, device=self.found_inf.device))
        return self._applied

    def __bool__(self) -> bool:
        if self._host is None:
            self._host = bool(self.applied.item())
        return self._host

    def __repr__(self) -> str:
        state = "pending" if self._host is None else str(self._host)
        return f"StepResult(applied={state})"

#: Columns of a per-step row (a float32 device tensor).
COLS = ("loss", "scale", "overflow", "underflow", "nan", "grad_norm", "grad_norm_ok")
C = {c: i for i, c in enumerate(COLS)}


def has_data(t: Any, shape: Any = None, dtype: Optional[torch.dtype] = None,
             floating: bool = False) -> bool:
    """``t`` is a tensor not on 'meta', of ``shape``, ``dtype``, a floating dtype when given."""
    return (isinstance(t, Tensor) and not t.is_meta
            and (shape is None or tuple(t.shape) == tuple(shape))
            and (dtype is None or t.dtype == dtype) and (not floating or t.is_floating_point()))


# ------------------------------------------------------------------------ memory
def memory_usage(device: Union[str, torch.device]) -> int:
    """Bytes in use on ``device``, without a device sync: CUDA: ``torch.cuda.memory_allocated``;
    CPU: the process's resident set size (``/proc/self/statm``, else the peak RSS of
    ``getrusage``)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def memory_capacity(device: torch.device) -> int:
    """Total bytes of ``device`` (CUDA: the GPU's memory; CPU: physical RAM; 0: unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


# ------------------------------------------------------------------------ one step
class StepMetrics(Mapping[str, Any]):
    """The result of :meth:`MixedPrecisionTrainer.train_step`; a lazy read-only dict.

    Values that live on the device (``loss``, ``current_scale``, ``overflow_detected``,
    ``underflow_detected``, ``nan_detected``, ``step_skipped``, ``grad_norm``) are read back -- one
    host sync -- the first time they are looked up, and cached; :meth:`tensor` returns them without
    a sync. ``None`` means "not computed at this step" (e.g. the step-related values of a
    micro-batch that did not end an accumulation, or ``grad_norm`` without clipping and monitoring).
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        v = self._values[key]
        if isinstance(v, Tensor):
            flag = v.dtype == torch.bool or key.endswith(("_detected", "_skipped"))
            v = bool(v.item()) if flag else float(v.item())
        self._cache[key] = v
        return v

    @classmethod
    def micro_batch(cls, loss: Tensor, memory: int, lr: Any) -> StepMetrics:
        """The metrics of a micro-batch that did not end an accumulation (no step)."""
        none = ("current_scale", "overflow_detected", "underflow_detected", "nan_detected",
                "step_skipped", "grad_norm")
        return cls({"loss": loss, **dict.fromkeys(none), "memory_usage": memory, "lr": lr,
                    "optimizer_step": False})

    def tensor(self, key: str) -> Any:
        """The raw value: a 0-dim device tensor for device metrics (no sync)."""
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "StepMetrics(" + ", ".join(f"{k}={self[k]!r}" for k in self) + ")"


def step_row(step_loss: Tensor, result: StepResult,
             device: torch.device) -> tuple[Tensor, dict[str, Any]]:
    """The :data:`COLS` row of an optimizer step and the device values of its :class:`StepMetrics`
    (all but ``memory_usage``, ``lr``, ``optimizer_step``); device work only, no sync.

    ``nan``: the loss or the grad norm is NaN; ``grad_norm_ok``: the grad norm was computed, is
    finite and the step was not skipped.
    """
    found, grad_norm = result.found_inf, result.grad_norm
    zero = torch.zeros((), device=device)
    nan = torch.isnan(step_loss).float()
    if grad_norm is not None:
        nan = torch.maximum(nan, torch.isnan(grad_norm).float())
    gn = grad_norm.float() if grad_norm is not None else torch.full((), math.nan, device=device)
    gn_ok = torch.isfinite(gn) & (found == 0)
    row = torch.stack([step_loss.float().to(device), result.scale.float().to(device),
                       found.to(device), result.underflow.to(device), nan.to(device),
                       torch.where(gn_ok, gn, zero), gn_ok.float()])
    skipped = found > 0 if result.checked else torch.zeros((), dtype=torch.bool)
    return row, {"loss": step_loss, "current_scale": result.scale, "overflow_detected": found > 0,
                 "underflow_detected": result.underflow > 0, "nan_detected": nan > 0,
                 "step_skipped": skipped, "grad_norm": grad_norm}


# ------------------------------------------------------------------------ the log
#: Rows kept pending before they are folded into the history.
FOLD_EVERY = 64


class MetricsLog:
    """One row (:data:`COLS`) per optimizer step (``count``), kept on the device.

    * ``totals``: the running column sums (window and epoch figures are differences of totals);
    * ``pending``: the newest rows (references, not modified), folded every :data:`FOLD_EVERY`
      rows (and at :meth:`history`) into ``hist`` / ``hist_steps``: the rows and their step
      numbers, at most ``history_size``: when full, the older half is thinned to every other row;
    * ``log_snapshot`` / ``log_step``: the totals and step at the last log step.
    """

    def __init__(self, history_size: int) -> None:
        self.history_size = int(history_size)
        self.count = 0
        self.pending: list[Tensor] = []
        self.totals: Optional[Tensor] = None
        self.log_snapshot: Optional[Tensor] = None
        self.log_step = 0
        self.hist: Optional[Tensor] = None
        self.hist_steps: list[int] = []

    def record(self, row: Tensor) -> None:
        """Add one step's row (no host sync)."""
        if self.totals is None:
            self.totals = torch.zeros(len(COLS), device=row.device)
            self.log_snapshot = self.totals.clone()
        self.totals.add_(row)
        self.pending.append(row)
        self.count += 1
        if len(self.pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Move the pending rows into the history (no host sync)."""
        if not self.pending:
            return
        block, first = torch.stack(self.pending), self.count - len(self.pending)
        self.pending = []
        self.hist = block if self.hist is None else torch.cat((self.hist, block))
        self.hist_steps.extend(range(first, first + block.shape[0]))
        while self.hist.shape[0] > self.history_size:
            half = self.hist.shape[0] // 2
            self.hist = torch.cat((self.hist[:half:2], self.hist[half:]))
            self.hist_steps = self.hist_steps[:half:2] + self.hist_steps[half:]

    def history(self) -> tuple[list[int], Optional[Tensor]]:
        """``(steps, rows)``: every kept row, ``[n, len(COLS)]`` on the device (or ``None``)."""
        self.fold()
        return list(self.hist_steps), self.hist

    def last(self) -> Optional[Tensor]:
        """The newest row, or ``None`` before the first step."""
        if self.pending:
            return self.pending[-1]
        return self.hist[-1] if self.hist is not None else None

    def read_window(self) -> tuple[list[float], list[float]]:
        """At a log step: ``(window sums since the previous log step, newest row)``,
        in one host sync; starts the next window."""
        assert self.totals is not None and self.log_snapshot is not None
        last = self.last()
        both = torch.stack([self.totals - self.log_snapshot,
                            last if last is not None else self.totals])
        window, cur = both.tolist()
        self.log_snapshot = self.totals.clone()
        self.log_step = self.count
        return window, cur

    def summary(self, steps: int) -> dict[str, Any]:
        """Over ``steps`` optimizer steps: ``skipped_steps``, ``overflow_rate``,
        ``underflow_steps``, ``nan_steps``, ``avg_grad_norm`` (over steps where it was
        computed and finite; NaN if none), ``scale_history`` (``(step, scale)`` pairs
        of the kept rows). One host sync."""
        hist_steps, hist = self.history()
        totals = self.read_totals()
        scale_hist = hist[:, C["scale"]].tolist() if hist is not None else []
        gn_count = totals[C["grad_norm_ok"]]
        return {"skipped_steps": int(totals[C["overflow"]]),
                "overflow_rate": totals[C["overflow"]] / steps if steps else 0.0,
                "underflow_steps": int(totals[C["underflow"]]), "nan_steps": int(totals[C["nan"]]),
                "avg_grad_norm": totals[C["grad_norm"]] / gn_count if gn_count else math.nan,
                "scale_history": ScaleHistory(zip(hist_steps, scale_hist))}

    def read_totals(self, since: Optional[Tensor] = None) -> list[float]:
        """The totals (minus ``since``) as floats; zeros before the first step. One sync."""
        if self.totals is None:
            return [0.0] * len(COLS)
        return (self.totals - since if since is not None else self.totals).tolist()

    # -- the checkpoint's parts (format of MixedPrecisionTrainer.save_state) ----------
    def state(self) -> dict[str, Any]:
        """``totals``, ``log_snapshot``, ``history``, ``history_steps`` (CPU tensors/lists)."""
        steps, hist = self.history()
        return {"totals": None if self.totals is None else self.totals.cpu(),
                "log_snapshot": None if self.log_snapshot is None else self.log_snapshot.cpu(),
                "history": None if hist is None else hist.cpu(), "history_steps": steps}

    def check_state(self, state: Mapping[str, Any], step: int) -> None:
        """Raise (``ValueError`` naming the key) when :meth:`state`'s keys in ``state``
        cannot be restored at optimizer step ``step``; changes nothing."""
        where = "MixedPrecisionTrainer.load_state: state"
        n = len(COLS)
        for key in ("totals", "log_snapshot"):
            if state[key] is not None and not has_data(state[key], (n,), torch.float32):
                raise ValueError(f"{where}[{key!r}]: expected None or a float32 tensor of "
                                 f"shape [{n}]")
        if (state["totals"] is None) != (state["log_snapshot"] is None):
            raise ValueError(f"{where}: 'totals' and 'log_snapshot' are both None or neither")
        hist, steps = state["history"], state["history_steps"]
        if hist is None:
            return
        if not (has_data(hist, dtype=torch.float32) and hist.dim() == 2 and hist.shape[1] == n):
            raise ValueError(f"{where}['history']: expected None or a float32 tensor of "
                             f"shape [rows, {n}]")
        if not (isinstance(steps, list) and len(steps) == hist.shape[0]
                and all(isinstance(k, int) and 0 <= k <= step for k in steps)):
            raise ValueError(f"{where}['history_steps']: expected a list of "
                             f"{hist.shape[0]} step numbers in [0, {step}]")

    def restore(self, state: Mapping[str, Any], step: int, log_step: int,
                device: torch.device) -> None:
        """Load :meth:`state`'s keys; row indices continue at ``step``."""
        self.count, self.log_step = int(step), int(log_step)
        if state["totals"] is not None:
            self.totals = state["totals"].to(device)
            self.log_snapshot = state["log_snapshot"].to(device)
        if state["history"] is not None:
            self.hist = state["history"].to(device)
            self.hist_steps = [int(s) for s in state["history_steps"]]


class ScaleHistory(list):  # type: ignore[type-arg]
    """The ``(step, scale)`` pairs of ``stats()["scale_history"]`` (up to ``history_size``): a
    list printed as a one-line summary, not thousands of tuples."""

    def summary(self) -> str:
        """``"<n> points, steps a..b, scale x -> y (min m, max M)"``."""
        if not self:
            return "0 points"
        scales = [s for _, s in self]
        return (f"{len(self)} points, steps {self[0][0]}..{self[-1][0]}, scale "
                f"{scales[0]:g} -> {scales[-1]:g} (min {min(scales):g}, max {max(scales):g})")

    def __repr__(self) -> str:
        return f"ScaleHistory({self.summary()})"

    __str__ = __repr__


# ------------------------------------------------------------------------ log steps
def last_values(step: int, window: list[float], cur: list[float], lr: Any) -> dict[str, Any]:
    """What a log step reports: ``step``, ``loss``/``scale``/``grad_norm`` of the newest
    row ``cur`` (grad norm NaN when not counted), ``overflows`` of the ``window``, ``lr``."""
    return {"step": step, "loss": cur[C["loss"]], "scale": cur[C["scale"]],
            "overflows": int(window[C["overflow"]]),
            "grad_norm": cur[C["grad_norm"]] if cur[C["grad_norm_ok"]] else math.nan, "lr": lr}


def log_window(config: MixedPrecisionConfig, step: int, steps: int, window: list[float],
               last: dict[str, Any]) -> None:
    """Write the log line of a log step and apply the handling actions.

    ``window``: the column sums of the ``steps`` optimizer steps since the previous log step;
    ``last``: the newest values (``loss``, ``scale``, ``grad_norm``, ``lr``). Raises
    ``FloatingPointError`` for a ``"raise"`` action whose event occurred in the window.
    """
    logger.info("step %d | loss %.4f | scale %g | lr %.3g | grad norm %.3g | overflows %d/%d "
                "| underflows %d | nan %d", step, last["loss"], last["scale"], float(last["lr"]),
                last["grad_norm"], int(window[C["overflow"]]), steps,
                int(window[C["underflow"]]), int(window[C["nan"]]))
    for col in ("nan", "overflow", "underflow"):
        n, key = int(window[C[col]]), f"{col}_handling"
        action = getattr(config, key) if n else HandlingAction.SKIP
        msg = f"{n} of the last {steps} optimizer steps had {col} (step {step})"
        if action is HandlingAction.RAISE:
            raise FloatingPointError(f"MixedPrecisionTrainer: {msg}; {key}='raise'")
        if action is HandlingAction.WARN:
            logger.warning("MixedPrecisionTrainer: %s", msg)


# ------------------------------------------------------------------------ plot
def plot_history(steps: list[int], hist: Optional[Tensor], title: str,
                 path: Union[str, os.PathLike[str]]) -> str:
    """Write a 2x2 PNG (loss, log2 scale, cumulative skipped steps, grad norm per optimizer step)
    with matplotlib's Agg backend. Returns the path."""
    try:
        import matplotlib
    except ImportError as exc:  # (only the demo extra installs it)
        raise ImportError("mixprec: plotting the training history needs matplotlib: "
                          "pip install matplotlib (or mixprec[demo])") from exc

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    fig.suptitle(title)
    if hist is None:
        for ax in axes.flat:
            ax.text(0.5, 0.5, "no steps yet", ha="center", va="center")
    else:
        h = hist.cpu()
        s = torch.tensor(steps, dtype=torch.float64)
        skipped = h[:, C["overflow"]] > 0
        ok = h[:, C["grad_norm_ok"]] > 0
        axes[0, 0].plot(s, h[:, C["loss"]], lw=1)
        axes[0, 1].plot(s, torch.log2(h[:, C["scale"]].clamp(min=1e-30)), lw=1,
                        color="tab:orange")
        axes[1, 0].plot(s, torch.cumsum(skipped.double(), 0), lw=1, color="tab:red")
        if skipped.any():
            axes[1, 0].scatter(s[skipped], torch.cumsum(skipped.double(), 0)[skipped], s=12,
                               color="tab:red", label="skipped step")
            axes[1, 0].legend(loc="lower right")
        if ok.any():
            axes[1, 1].plot(s[ok], h[ok, C["grad_norm"]], lw=1, color="tab:green")
        else:
            axes[1, 1].text(0.5, 0.5, "not computed", ha="center", va="center")
        from matplotlib.ticker import MaxNLocator

        # counts and step numbers: whole ticks, none below 0
        axes[1, 0].yaxis.set_major_locator(MaxNLocator(integer=True))
        axes[1, 0].set_ylim(bottom=0, top=max(1.0, float(skipped.sum()) * 1.05))
        for ax, name in zip(axes.flat, ("loss", "log2(loss scale)", "skipped steps (cumulative)",
                                        "gradient norm (unscaled)")):
            ax.set_title(name)
            ax.set_xlabel("optimizer step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
    return os.fspath(path)
