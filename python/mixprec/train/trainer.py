"""``MixedPrecisionTrainer``: a mixed-precision training loop in five modes, built on a
:class:`~mixprec.train.manager.MixedPrecisionManager` (``trainer.mixed_precision_manager``),
which holds the per-mode logic and can be used without the trainer.

Host syncs. A training step reads nothing back from the device, except:

* ``scaler.step`` with an optimizer that is not a mixprec/fused one (one ``.item()``, as
  torch's GradScaler; MANUAL mode always uses mixprec's);
* every ``logging_frequency`` optimizer steps: one read for the log line, the
  ``nan/overflow/underflow_handling`` actions and the ADAPTIVE evaluation, and one for the
  LR scheduler (stepped over the steps taken since the last log step).

With a mixprec optimizer an LR scheduler costs no read per step: its lrs reach the kernels
from a table (:meth:`mixprec.optim.FusedOptimizer.lr_by_steps_taken`, remade at each log
step) indexed on the device by the steps taken; the host scheduler catches up at log steps
and whenever :attr:`~MixedPrecisionTrainer.scheduler` is read. With another optimizer the
scheduler is stepped after each step taken (the scaler reads "was the step skipped" anyway).

The dict :meth:`~MixedPrecisionTrainer.train_step` returns is lazy: reading ``loss``,
``current_scale``, ``overflow_detected``, ``underflow_detected``, ``nan_detected``, ``step_skipped``
or ``grad_norm`` syncs (once per key); ``memory_usage`` and ``optimizer_step`` are host values,
and ``lr`` is one too, except with a scheduler on the device route, where reading it syncs.
``train_epoch``, ``evaluate``, ``stats``, ``save_state`` and ``plot`` sync once each.

Checkpoints (:meth:`~MixedPrecisionTrainer.save_state`, ``load_state``, the periodic ones of
:meth:`~MixedPrecisionTrainer.train` and resuming): :mod:`mixprec.train.checkpoint`, which
also gives the file's layout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .. import _dtensor
from ..amp.autocast import cast_floating
from ..amp.grad_scaler import GradScaler
from ..amp.module_policy import PolicyHandle
from .checkpoint import STATE_FORMAT, CheckpointMixin, TrainRun
from .config import MixedPrecisionConfig, MixedPrecisionMode, as_config
from .manager import MixedPrecisionManager, check_setup
from .metrics import (
    COLS,
    C,
    MetricsLog,
    StepMetrics,
    last_values,
    log_window,
    logger,
    memory_usage,
    plot_history,
    step_row,
)

__all__ = ["MixedPrecisionTrainer", "StepMetrics", "memory_usage", "STATE_FORMAT"]


def to_device(obj: Any, device: torch.device) -> Any:
    """The tensors of a (nested) batch moved to ``device`` (``non_blocking``)."""
    return pytree.tree_map_only(Tensor, lambda t: t.to(device, non_blocking=True), obj)


def batch_size(obj: Any) -> int:
    """The first dimension of the first leaf of a (nested) batch, if it is a tensor; else 1."""
    leaf = next(iter(pytree.tree_leaves(obj)), None)
    return int(leaf.shape[0]) if isinstance(leaf, Tensor) and leaf.dim() else 1


def measured_forward(forward: Callable[[], Tensor], params: list[Tensor]) -> tuple[Tensor, int]:
    """Run ``forward()`` adding up the bytes autograd saves for backward, except the
    ``params``' storages; returns ``(loss, activation bytes)``."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        with contextlib.suppress(RuntimeError, NotImplementedError):
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    # (a DTensor param, FSDP2's, has no storage of its own: its local shard's is read)
    param_ptrs = {_dtensor.local(p).untyped_storage().data_ptr() for p in params}
    return loss, sum(v for k, v in seen.items() if k not in param_ptrs)


class _PlainProgress:
    """The progress display without tqdm: the tqdm methods the trainer calls, printing one
    line at the start and one per epoch (:meth:`epoch_end`)."""

    def __init__(self, total: Optional[int], desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0
        print(f"{desc}: {total if total is not None else '?'} batches", flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, ordered_dict: Optional[dict[str, Any]] = None, refresh: bool = True,
                    **values: Any) -> None:
        """tqdm's signature; prints nothing."""

    def epoch_end(self, values: dict[str, Any]) -> None:
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        extra = " | ".join(f"{k} {v}" for k, v in values.items())
        print(f"{self.desc}: {done} batches | {extra}", flush=True)

    def close(self) -> None:
        pass


class _LineHandler(logging.Handler):
    """Writes the trainer's log lines above the progress bar (``tqdm.write``), or prints them."""

    def __init__(self, bar: Any) -> None:
        super().__init__(logging.INFO)
        self._write = getattr(bar, "write", None) or (lambda line: print(line, flush=True))

    def emit(self, record: logging.LogRecord) -> None:
        self._write(self.format(record))


@contextlib.contextmanager
def _log_lines(bar: Any) -> Iterator[None]:
    """While training, the "mixprec.trainer" lines are shown, each once. Unless INFO is
    enabled for that logger or it has handlers of its own, they go above the bar (or are
    printed) through a handler of ours for the call (not propagated). Otherwise the user's
    handlers write them, INFO enabled on the logger for the call if it was not (a handler
    on the logger is where the user sends its lines: ours beside it would print each line
    twice); with a tqdm bar, ``logging_redirect_tqdm`` moves the console handlers among
    them off the bar's line."""
    if logger.getEffectiveLevel() > logging.INFO and not logger.handlers:
        handler = _LineHandler(bar)
        level, propagate = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        return
    redirect: Any = contextlib.nullcontext()
    # only the loggers that write to the console: tqdm's redirect gives every logger it is
    # handed a handler of its own, so handing it one without would print each line again
    consoles = [lg for lg in (logging.getLogger(), logger) if any(
        isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
        for h in lg.handlers)]
    if consoles and bar is not None and hasattr(bar, "write"):
        with contextlib.suppress(ImportError):
            from tqdm.contrib.logging import logging_redirect_tqdm

            redirect = logging_redirect_tqdm(consoles)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        with redirect:
            yield
    finally:
        logger.setLevel(level)


def _progress_bar(total: Optional[int], desc: str) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainProgress(total, desc)
    return tqdm(total=total, desc=desc, unit="batch", dynamic_ncols=True, leave=True)


class MixedPrecisionTrainer(CheckpointMixin):
    """Mixed-precision training in one of five modes (see :class:`MixedPrecisionMode`).

    Args:
        config: the configuration (default ``MixedPrecisionConfig()``).
        device: where to train; default the device of the model's first param.
        history_size: at most this many per-step rows are kept for :meth:`plot` /
            ``stats()["scale_history"]``; when full, the older half is thinned to every
            other row (recent steps stay dense). >= 16.

    Attributes set by :meth:`setup_training`:
        model, optimizer (converted in MANUAL mode), criterion, scheduler, mixed_precision_manager
        (the :class:`~mixprec.MixedPrecisionManager` the loop is built on), and, read from it:
        scaler, compute_dtype, loss_scaling, policy_handle, adaptive_decisions.

    :meth:`save_mixed_precision_state`, :meth:`load_mixed_precision_state` and
    :meth:`get_mixed_precision_stats` (the names of the system mixprec replaces) are
    aliases of :meth:`save_state`, :meth:`load_state` and :meth:`stats`.
    """

    def __init__(self, config: Optional[MixedPrecisionConfig] = None, *,
                 device: Union[str, torch.device, None] = None,
                 history_size: int = 4096) -> None:
        self.config = as_config(config, "MixedPrecisionTrainer")
        if history_size < 16:
            raise ValueError(
                f"MixedPrecisionTrainer: history_size must be >= 16, got {history_size}")
        self._device_arg = None if device is None else torch.device(device)
        self.history_size = int(history_size)
        self.model: Optional[nn.Module] = None
        self.optimizer: Any = None
        self.criterion: Optional[Callable[..., Tensor]] = None
        self._scheduler: Any = None
        self.mixed_precision_manager: Optional[MixedPrecisionManager] = None
        self._reset_counters()

    # ------------------------------------------------------------------ setup
    @property
    def mode(self) -> MixedPrecisionMode:
        """The configured mode (an enum member)."""
        return self.config.mode  # type: ignore[return-value]

    @property
    def device(self) -> torch.device:
        """The training device (after :meth:`setup_training`)."""
        return self._manager().device

    @property
    def scaler(self) -> Optional[GradScaler]:
        """The manager's :class:`mixprec.GradScaler` (disabled when not needed; ``None``
        before setup)."""
        return getattr(self.mixed_precision_manager, "scaler", None)

    @scaler.setter
    def scaler(self, scaler: GradScaler) -> None:
        self._manager().scaler = scaler

    @property
    def compute_dtype(self) -> Optional[torch.dtype]:
        """The low-precision dtype in use (``None``: float32, or before setup)."""
        return getattr(self.mixed_precision_manager, "compute_dtype", None)

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is multiplied by the scale."""
        return self._manager().loss_scaling

    @property
    def policy_handle(self) -> Optional[PolicyHandle]:
        """The precision policy on the model, or ``None``."""
        return getattr(self.mixed_precision_manager, "policy_handle", None)

    @property
    def adaptive_decisions(self) -> list[dict[str, Any]]:
        """ADAPTIVE decisions so far (dicts: step, module, from, to, reason)."""
        return getattr(self.mixed_precision_manager, "adaptive_decisions", [])

    @property
    def scheduler(self) -> Any:
        """The LR scheduler given to :meth:`setup_training` (or ``None``), caught up with
        the steps taken: reading it after steps since the last log step costs one host
        read (see the module docstring)."""
        self._catch_up_scheduler()
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._lr_route = None

    def _route(self) -> bool:
        """Whether the scheduler's lr reaches the kernels by a device table: a scheduler
        (not ``ReduceLROnPlateau``) of a mixprec optimizer."""
        if self._lr_route is None:
            sched = self._scheduler
            self._lr_route = (
                sched is not None and callable(getattr(self.optimizer, "lr_by_steps_taken", None))
                and getattr(sched, "optimizer", None) is self.optimizer
                and not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau))
        return self._lr_route

    def _tabulate(self) -> None:
        """(Re)make the optimizer's lr table from the scheduler as it stands: one row per
        step up to the next log step, row 0 the next step's."""
        rows = self.config.logging_frequency + 1
        table = self.optimizer.lr_by_steps_taken(self._scheduler, rows, restart=True)
        self._lr_rows = table[:, 0].to(self._manager().device)
        self._taken.zero_()
        self._pending_steps = 0

    def _catch_up_scheduler(self) -> None:
        """Step the host scheduler over the steps taken since the table was made (one
        host read), then remake the table."""
        if self._pending_steps == 0 or not self._route():
            return
        for _ in range(int(self._taken.item())):
            self._scheduler.step()
        self._tabulate()

    def _current_lr(self) -> Any:
        """The lr of group 0: a 0-dim device tensor (read lazily by :class:`StepMetrics`)
        on the device route with steps since the table was made; else a float."""
        if self._pending_steps and self._route():
            i = self._taken.to(torch.long).clamp(0, self._lr_rows.numel() - 1).reshape(1)
            return self._lr_rows.index_select(0, i).reshape(())
        lr = self.optimizer.param_groups[0]["lr"]
        return float(lr) if not isinstance(lr, Tensor) else lr

    def _manager(self) -> MixedPrecisionManager:
        if self.mixed_precision_manager is None or self.model is None:
            raise RuntimeError("MixedPrecisionTrainer: call setup_training(...) first")
        return self.mixed_precision_manager

    def _reset_counters(self) -> None:
        self.optimizer_steps = 0
        self.micro_steps = 0
        self.epochs_done = 0
        self._micro = 0
        self._step_loss: Optional[Tensor] = None
        self._metrics = MetricsLog(self.history_size)
        self._scaler_offsets = [0, 0, 0]  # steps, increases, decreases from a loaded run
        self.peak_memory: int = 0
        self.activation_memory: Optional[int] = None
        self._measure_activations = True
        self._last_log: dict[str, Any] = {}
        self._step_fn: Optional[Callable[..., Any]] = None  # config.capture: made at step 1
        # the device route (_route): the steps taken since the optimizer's lr table was
        # made (device), the optimizer steps since (host), group 0's rows
        self._lr_route: Optional[bool] = None
        self._taken = torch.zeros(())
        self._pending_steps = 0
        self._lr_rows: Optional[Tensor] = None
        if self.mixed_precision_manager is not None:
            self.mixed_precision_manager.steps = 0

    def setup_training(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                       criterion: Callable[..., Tensor], scheduler: Any = None, *,
                       fp8_module_filter: Optional[Callable[[nn.Module, str], bool]] = None,
                       ) -> MixedPrecisionTrainer:
        """Prepare ``model``/``optimizer`` for the configured mode; returns ``self``.

        Mutates ``model`` as :class:`~mixprec.MixedPrecisionManager` does (policy wrappers; MANUAL:
        16-bit params, a ``torch.optim.SGD/Adam/AdamW`` replaced by its mixprec master-weight
        equivalent and ``scheduler`` re-pointed to it: use ``trainer.optimizer`` afterwards; FP8:
        Float8 linears picked by ``fp8_module_filter(module, fqn)``, see :mod:`mixprec.train.fp8`).
        Calling it again first undoes the previous policy.
        """
        check_setup(model, optimizer, self.config, self._device_arg, scheduler)
        if self.mixed_precision_manager is not None:
            self.mixed_precision_manager.close()
            self.mixed_precision_manager = None
        manager = MixedPrecisionManager(
            model, optimizer, self.config, device=self._device_arg, adapt_in_step=False,
            fp8_module_filter=fp8_module_filter, scheduler=scheduler)
        self.mixed_precision_manager = manager
        self.model, self.criterion, self._scheduler = model, criterion, scheduler
        self.optimizer = manager.optimizer
        self._reset_counters()
        return self

    # ------------------------------------------------------------------ stepping
    def _forward_loss(self, data: Any, target: Any) -> Tensor:
        """The forward's float32 loss; the first one also measures the activation memory."""
        manager, model, criterion = self._manager(), self.model, self.criterion
        assert model is not None and criterion is not None

        def forward() -> Tensor:
            with manager.autocast():
                output = model(to_device(data, manager.device))
            with torch.autocast(manager.device.type, enabled=False):
                loss = criterion(cast_floating(output, torch.float32),
                                 to_device(target, manager.device))
            return loss.float() if loss.dtype != torch.float32 else loss

        if not (self._measure_activations and self.config.performance_monitoring):
            return forward()
        loss, self.activation_memory = measured_forward(forward, self._params())
        self._measure_activations = False
        return loss

    def _params(self) -> list[Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def train_step(self, data: Any, target: Any) -> StepMetrics:
        """Forward, backward and -- every ``gradient_accumulation_steps`` calls -- an
        optimizer step.

        Args:
            data: the model input (tensor or nested tuple/list/dict), moved to the training device
                (``non_blocking``); float32 inputs are cast to the param dtype in MANUAL mode.
            target: passed to ``criterion(output, target)`` after moving.

        Returns:
            :class:`StepMetrics` with ``loss`` (float32, of this call; of the whole
            accumulation on the call that steps), ``current_scale`` (after the update),
            ``overflow_detected`` (grads held inf/NaN), ``underflow_detected`` (more than
            ``underflow_threshold`` of the nonzero scaled grad values flush to zero in the
            compute dtype; with ``performance_monitoring``), ``nan_detected`` (NaN loss
            or grad norm), ``step_skipped``, ``grad_norm`` (unscaled L2 norm before
            clipping), ``memory_usage`` (bytes, :func:`memory_usage`), ``lr`` (of group
            0) and ``optimizer_step`` (whether this call stepped).

        Mutates grads, params, optimizer/scaler state and counters. Syncs only as the
        module docstring says. With ``config.capture`` the step runs through
        :meth:`MixedPrecisionManager.make_step` (one CUDA graph, replayed; grads zeroed
        in place, never freed; a refused setup raises
        :class:`mixprec.capture.CaptureError` at the first step).
        """
        manager = self._manager()
        assert self.model is not None
        accum = self.config.gradient_accumulation_steps
        self.model.train()
        if self._route() and self._lr_rows is None:
            self._taken = torch.zeros((), device=manager.device)
            self._tabulate()
        if self.config.capture:
            return self._captured_step(data, target)
        if self._micro == 0:
            self.optimizer.zero_grad(set_to_none=self.config.memory_efficiency)
        loss = self._forward_loss(data, target)
        manager.backward(loss / accum if accum > 1 else loss)
        self.micro_steps += 1
        self._micro += 1
        detached = loss.detach()
        self._step_loss = detached if self._step_loss is None else self._step_loss + detached
        if self._micro < accum:
            return StepMetrics.micro_batch(detached, memory_usage(manager.device),
                                           self._current_lr())
        return self._optimizer_step()

    def _captured_step(self, data: Any, target: Any) -> StepMetrics:
        manager = self._manager()
        inputs = (to_device(data, manager.device), to_device(target, manager.device))
        if self._step_fn is None:
            scheds = [] if self._scheduler is None else [self._scheduler]
            self._step_fn = manager.make_step(self._step_body, inputs, schedulers=scheds)
        row, values = self._step_fn(*inputs)
        self.micro_steps += 1
        return self._finish_step(row, values)

    def _step_body(self, data: Any, target: Any) -> tuple[Tensor, dict[str, Any]]:
        """The captured step: device work only, no host read."""
        manager = self._manager()
        self.optimizer.zero_grad(set_to_none=False)  # a graph's grads keep their storage
        loss = self._forward_loss(data, target)
        manager.backward(loss)
        return step_row(loss.detach(), manager.step(self.optimizer), manager.device)

    def flush(self) -> Optional[StepMetrics]:
        """Step on the gradients of an unfinished accumulation (e.g. at epoch end);
        returns that step's metrics, or ``None`` when nothing was pending."""
        self._manager()
        return None if self._micro == 0 else self._optimizer_step()

    def _optimizer_step(self) -> StepMetrics:
        manager = self._manager()
        assert self._step_loss is not None
        step_loss = self._step_loss / self._micro if self._micro > 1 else self._step_loss
        result = manager.step(self.optimizer)
        self._micro = 0
        self._step_loss = None
        return self._finish_step(*step_row(step_loss, result, manager.device))

    def _finish_step(self, row: Tensor, values: dict[str, Any]) -> StepMetrics:
        """After an optimizer step: the scheduler, the metrics row, memory, a log step."""
        manager = self._manager()
        dev = manager.device
        if self._route():  # on the device: the table's row for the steps taken
            self._taken += values["step_skipped"].logical_not().to(self._taken.device)
            self._pending_steps += 1
        elif self._scheduler is not None and not manager.step_was_skipped:
            self._scheduler.step()
        self._metrics.record(row)
        self.optimizer_steps += 1
        mem = memory_usage(dev)
        peak = mem if dev.type != "cuda" else int(torch.cuda.max_memory_allocated(dev))
        self.peak_memory = max(self.peak_memory, peak)
        metrics = StepMetrics(
            {**values, "memory_usage": mem, "lr": self._current_lr(), "optimizer_step": True})
        if self.optimizer_steps % self.config.logging_frequency == 0:
            # a log step: the scheduler caught up; one sync, a log line, handling, ADAPTIVE
            self._catch_up_scheduler()
            steps = self.optimizer_steps - self._metrics.log_step
            window, cur = self._metrics.read_window()
            self._last_log = last_values(self.optimizer_steps, window, cur, self._current_lr())
            log_window(self.config, self.optimizer_steps, steps, window, self._last_log)
            manager.adapt(window[C["overflow"]], steps, cur[C["scale"]], self.optimizer_steps)
        return metrics

    # ------------------------------------------------------------------ loops
    def train_epoch(self, loader: Iterable[Any], _bar: Any = None,
                    _run: Optional[TrainRun] = None) -> dict[str, Any]:
        """One pass over ``loader`` (yielding ``(data, target)``); flushes a trailing
        partial accumulation at the end. One host sync, at the end.

        Returns ``epoch_loss`` (mean loss over the epoch's optimizer steps),
        ``num_batches``, ``overflow_steps``, ``underflow_steps``, ``nan_steps``,
        ``average_scale`` and ``optimizer_steps``.
        """
        self._manager()
        if _run is not None:  # (train(): an epoch that may resume, and checkpoints)
            batches_in, start_totals, start_steps, batches = _run.begin_epoch(loader)
        else:
            totals = self._metrics.totals
            start_totals = None if totals is None else totals.clone()
            start_steps, batches, batches_in = self.optimizer_steps, 0, iter(loader)
        for data, target in batches_in:
            self.train_step(data, target)
            batches += 1
            if _run is not None:
                _run.batch_done(batches)
            if _bar is not None:
                _bar.update(1)
                last = self._last_log
                if last and last.get("step") == self.optimizer_steps:
                    _bar.set_postfix(self._postfix(last["loss"], last["scale"]))
        if self.flush() is not None and _run is not None:
            _run.batch_done(batches)
        self.epochs_done += 1
        steps = self.optimizer_steps - start_steps
        vals = self._metrics.read_totals(since=start_totals) if steps else [0.0] * len(COLS)
        d = max(steps, 1)
        return {"epoch_loss": vals[C["loss"]] / d, "num_batches": batches,
                "optimizer_steps": steps, "overflow_steps": int(vals[C["overflow"]]),
                "underflow_steps": int(vals[C["underflow"]]), "nan_steps": int(vals[C["nan"]]),
                "average_scale": vals[C["scale"]] / d}

    def train(self, loader: Iterable[Any], num_epochs: int,
              val_loader: Optional[Iterable[Any]] = None,
              progress: bool = True, *,
              checkpoint_dir: Union[str, os.PathLike[str], None] = None,
              checkpoint_every: Optional[int] = None,
              keep_checkpoints: Optional[int] = 2,
              resume: Union[bool, str, os.PathLike[str]] = False) -> list[dict[str, Any]]:
        """Train for ``num_epochs`` with a progress bar (``progress``: tqdm's when installed,
        the ``demo`` extra; else a printed line per epoch), a log line (logger
        ``"mixprec.trainer"``, INFO) every ``logging_frequency`` optimizer steps and one
        per epoch. Returns the per-epoch dicts of :meth:`train_epoch`, with ``epoch``,
        ``time_s`` and, with ``val_loader``, ``val_loss``/``val_accuracy`` added.

        Checkpoints (see docs/trainer.md, "Checkpoints and resuming"): with
        ``checkpoint_dir``, a checkpoint (:meth:`save_state`, atomic) every
        ``checkpoint_every`` optimizer steps (``None``: none on the way) and one at the end,
        named ``step-N.pt`` (a ``step-N`` directory for a sharded model); the
        ``keep_checkpoints`` newest are kept (``None``: all), an older one removed only once a
        newer one is finished. A checkpoint is taken only between optimizer steps, never
        inside a gradient accumulation. No host read between checkpoints; each one is a save.

        ``resume=True`` loads the newest finished checkpoint of ``checkpoint_dir`` (none
        there: a fresh start) and continues the call it was written by, mid-epoch; a path
        loads that checkpoint. ``num_epochs`` counts from where that call began. A loader
        with ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) is
        restored by its own state; another one is iterated again from the RNG state its
        epoch began with, skipping the batches already consumed: it must yield the same
        batches in the same order for the same RNG state.
        """
        manager = self._manager()
        if num_epochs < 0:
            raise ValueError(
                f"MixedPrecisionTrainer.train: num_epochs must be >= 0, got {num_epochs}")
        run = TrainRun(self, num_epochs, checkpoint_dir, checkpoint_every, keep_checkpoints,
                       resume)
        todo = run.end - self.epochs_done
        try:
            total = len(loader) * todo  # type: ignore[arg-type]
        except TypeError:
            total = None
        bar = _progress_bar(total, f"train ({manager.describe()})") if progress else None
        history = run.results
        try:
            with _log_lines(bar):
                while self.epochs_done < run.end:
                    t0 = time.perf_counter()
                    result = self.train_epoch(loader, _bar=bar, _run=run)
                    result["time_s"] = time.perf_counter() - t0
                    extra = ""
                    if val_loader is not None:
                        ev = self.evaluate(val_loader)
                        result["val_loss"], result["val_accuracy"] = ev["loss"], ev["accuracy"]
                        if ev["accuracy"] is not None:
                            extra = f" | val loss {ev['loss']:.4f} | val acc {ev['accuracy']:.4f}"
                    result["epoch"] = self.epochs_done
                    history.append(result)
                    run.end_epoch()
                    logger.info("epoch %d | loss %.4f | overflow steps %d | avg scale %g | "
                                "%.2fs%s", self.epochs_done, result["epoch_loss"],
                                result["overflow_steps"], result["average_scale"],
                                result["time_s"], extra)
                    if bar is not None:
                        values = self._postfix(result["epoch_loss"], result["average_scale"],
                                               self.epochs_done)
                        if isinstance(bar, _PlainProgress):
                            bar.epoch_end(values)
                        else:
                            bar.set_postfix(values)
            run.finish()
        finally:
            if bar is not None:
                bar.close()
        return list(history)

    def _postfix(self, loss: float, scale: float, epoch: Optional[int] = None) -> dict[str, str]:
        """The progress bar's postfix: ``epoch`` (the one running, or at its end the one done),
        ``loss`` (the last log step's, or the epoch's mean), ``scale`` only with loss scaling."""
        out = {"epoch": str(self.epochs_done + 1 if epoch is None else epoch),
               "loss": f"{loss:.4f}"}
        if self.loss_scaling:
            out["scale"] = f"{scale:g}"
        return out

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any]) -> dict[str, Any]:
        """Mean loss (weighted by batch size) and, for class-index targets with ``[N, C]``
        outputs, accuracy over ``loader``, in eval mode with the training precision policy
        (the train/eval mode is restored). One host sync, at the end."""
        manager = self._manager()
        model, criterion, dev = self.model, self.criterion, manager.device
        assert model is not None and criterion is not None
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        correct = torch.zeros((), dtype=torch.int64, device=dev)
        n = 0
        classify = True
        try:
            for data, target in loader:
                data, target = to_device(data, dev), to_device(target, dev)
                with manager.autocast():
                    out = model(data)
                out = cast_floating(out, torch.float32)
                bs = batch_size(target)
                with torch.autocast(dev.type, enabled=False):
                    loss_sum += criterion(out, target).double() * bs
                classify = (classify and isinstance(out, Tensor) and isinstance(target, Tensor)
                            and out.dim() == 2 and not target.is_floating_point()
                            and target.dim() == 1)
                if classify:
                    correct += (out.argmax(1) == target).sum()
                n += bs
        finally:
            model.train(was_training)
        loss, right = torch.stack([loss_sum, correct.double()]).tolist()
        accuracy = right / max(n, 1) if classify and n else None
        return {"loss": loss / max(n, 1), "accuracy": accuracy, "num_samples": n}

    # ------------------------------------------------------------------ reports
    def history(self) -> tuple[list[int], Optional[Tensor]]:
        """The per-step records :meth:`plot` draws: ``(steps, rows)``, the optimizer step of
        each kept row and a float32 ``[len(steps), 7]`` tensor on the training device (``None``
        before the first step), columns :data:`mixprec.train.metrics.COLS`: loss, scale (after
        the step's update), then 0/1 flags overflow, underflow, nan, then grad_norm (0 where
        not grad_norm_ok) and grad_norm_ok (:class:`~mixprec.train.metrics.StepResult`).
        Up to ``history_size`` rows (older ones thinned, as ``stats()["scale_history"]``).
        No host sync: read ``rows`` when you need the values."""
        return self._metrics.history()

    def stats(self) -> dict[str, Any]:
        """Counters since setup (or since the loaded run began). One host sync.

        Keys: ``total_steps`` (optimizer steps), ``micro_steps``, ``skipped_steps``,
        ``overflow_rate``, ``underflow_steps``, ``nan_steps``, ``current_scale``, ``avg_grad_norm``
        (over steps where it was computed and finite; NaN if none), ``scale_increases``,
        ``scale_decreases``, ``scale_history`` (up to ``history_size`` ``(step, scale)`` pairs,
        :class:`~mixprec.train.metrics.ScaleHistory`), ``compute_dtype`` (what is in effect),
        ``low_precision_modules``, ``fp8_modules`` (see :meth:`MixedPrecisionManager.stats`),
        ``mode``, ``peak_memory``, ``activation_memory``, ``adaptive_decisions``.
        """
        ms = self._manager().stats()
        n = self.optimizer_steps
        return {"total_steps": n, "micro_steps": self.micro_steps, **self._metrics.summary(n),
                "current_scale": ms["current_scale"],
                "scale_increases": ms["scale_increases"] + self._scaler_offsets[1],
                "scale_decreases": ms["scale_decreases"] + self._scaler_offsets[2],
                "compute_dtype": ms["compute_dtype"],
                "low_precision_modules": ms["low_precision_modules"],
                "fp8_modules": ms["fp8_modules"], "mode": ms["mode"],
                "peak_memory": self.peak_memory, "activation_memory": self.activation_memory,
                "adaptive_decisions": ms["adaptive_decisions"]}

    def get_mixed_precision_stats(self) -> dict[str, Any]:
        """Alias of :meth:`stats` (the name used by the system mixprec replaces)."""
        return self.stats()

    def reset(self) -> None:
        """Forget statistics, history, counters and a pending accumulation, and give the
        scaler its initial scale; keep the model, the optimizer state, the scheduler (its
        steps taken so far) and ADAPTIVE decisions."""
        manager = self._manager()
        self.optimizer.zero_grad(set_to_none=True)
        self._catch_up_scheduler()
        manager.reset_scaler()
        self._reset_counters()

    def plot(self, path: Union[str, os.PathLike[str]]) -> str:
        """Write a PNG of loss, log2 scale, skipped steps and grad norm per optimizer step
        (matplotlib, Agg backend: no display needed); returns the path. One sync."""
        manager = self._manager()
        steps, hist = self.history()
        return plot_history(steps, hist, f"mixprec trainer: {manager.describe()}", path)
