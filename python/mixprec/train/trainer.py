"""``MixedPrecisionTrainer``: a mixed-precision training loop done right, in five modes.

Typical use::

    config = mixprec.MixedPrecisionConfig(mode="automatic", precision_level="bf16")
    trainer = mixprec.MixedPrecisionTrainer(config)
    trainer.setup_training(model, optimizer, criterion, scheduler)
    trainer.train(train_loader, num_epochs=5, val_loader=val_loader)
    print(trainer.stats())
    trainer.save_state("run.pt")          # later: trainer.load_state("run.pt")
    trainer.plot("report.png")

Host syncs. A training step issues no device-to-host read, except:

* ``scaler.step`` with an optimizer that is not a mixprec/fused one (one
  ``.item()``, as torch's GradScaler; MANUAL mode always uses mixprec's);
* with an LR scheduler and a GradScaler: one read of "was the step skipped"
  per optimizer step, to step the scheduler only after real steps;
* every ``logging_frequency`` optimizer steps: one read for the log line, the
  ``nan/overflow/underflow_handling`` actions and the ADAPTIVE evaluation.

The dict :meth:`~MixedPrecisionTrainer.train_step` returns is lazy: reading
``loss``, ``current_scale``, ``overflow_detected``, ``underflow_detected``,
``nan_detected``, ``step_skipped`` or ``grad_norm`` syncs (once per key);
``memory_usage``, ``lr`` and ``optimizer_step`` are host values.
:meth:`~MixedPrecisionTrainer.train_epoch`, :meth:`~MixedPrecisionTrainer.evaluate`,
:meth:`~MixedPrecisionTrainer.stats`, :meth:`~MixedPrecisionTrainer.save_state`
and :meth:`~MixedPrecisionTrainer.plot` sync once each.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from ..amp.autocast import (
    DEFAULT_FP32_MODULES,
    PolicyHandle,
    PrecisionPolicy,
    apply_policy,
    cast_floating,
    resolve_precision,
)
from ..amp.grad_scaler import GradScaler
from .config import HandlingAction, MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel

__all__ = ["MixedPrecisionTrainer", "StepMetrics", "memory_usage"]

logger = logging.getLogger("mixprec.trainer")

_STATE_FORMAT = 1
# columns of a per-step row (device tensor)
_COLS = ("loss", "scale", "overflow", "underflow", "nan", "grad_norm", "grad_norm_ok")
_C = {c: i for i, c in enumerate(_COLS)}
_FOLD = 64
_PREC_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", None: "fp32"}
_NAME_PREC = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


# ------------------------------------------------------------------------ helpers
def memory_usage(device: Union[str, torch.device]) -> int:
    """Bytes in use on ``device``, without a device sync.

    CUDA: ``torch.cuda.memory_allocated`` (tensors of the caching allocator).
    CPU: the process's resident set size (``/proc/self/statm``; the peak RSS
    from ``getrusage`` where /proc is missing).
    """
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


def _memory_capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class StepMetrics(Mapping[str, Any]):
    """The result of :meth:`MixedPrecisionTrainer.train_step`; a lazy read-only dict.

    Values that live on the device (``loss``, ``current_scale``,
    ``overflow_detected``, ``underflow_detected``, ``nan_detected``,
    ``step_skipped``, ``grad_norm``) are read back -- one host sync -- the
    first time they are looked up, and cached; :meth:`tensor` returns them
    without a sync. ``None`` means "not computed at this step" (e.g. the
    step-related values of a micro-batch that did not end an accumulation, or
    ``grad_norm`` without clipping and monitoring).
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        v = self._values[key]
        if isinstance(v, Tensor):
            item = v.item()
            v = (
                bool(item)
                if v.dtype == torch.bool or key.endswith(("_detected", "_skipped"))
                else float(item)
            )
        self._cache[key] = v
        return v

    def tensor(self, key: str) -> Any:
        """The raw value: a 0-dim device tensor for device metrics (no sync)."""
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "StepMetrics(" + ", ".join(f"{k}={self[k]!r}" for k in self) + ")"


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _batch_size(obj: Any) -> int:
    if isinstance(obj, Tensor):
        return int(obj.shape[0]) if obj.dim() else 1
    if isinstance(obj, (list, tuple)) and obj:
        return _batch_size(obj[0])
    if isinstance(obj, dict) and obj:
        return _batch_size(next(iter(obj.values())))
    return 1


def _to_mixprec_optimizer(opt: torch.optim.Optimizer, master_weights: bool) -> Any:
    """A mixprec optimizer with ``opt``'s param groups and hyper-parameters."""
    from .. import optim as mo

    if isinstance(opt, mo.FusedOptimizer):
        for g in opt.param_groups:
            g["master_weights"] = master_weights
        return opt
    mapping = {torch.optim.AdamW: mo.AdamW, torch.optim.Adam: mo.Adam, torch.optim.SGD: mo.SGD}
    cls = mapping.get(type(opt))
    if cls is None:
        raise TypeError(
            f"MixedPrecisionTrainer (MANUAL mode): cannot convert {type(opt).__name__} to a "
            "mixprec master-weight optimizer; pass torch.optim.SGD/Adam/AdamW or a "
            "mixprec.optim optimizer"
        )
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted}
    defaults.pop("differentiable", None)
    groups = []
    for g in opt.param_groups:
        # keep accepted hyper-parameters and keys torch does not define
        # (initial_lr from a scheduler, user tags)
        groups.append(
            {k: v for k, v in g.items() if k == "params" or k in accepted or k not in opt.defaults}
        )
    defaults["master_weights"] = master_weights
    new = cls(groups, **defaults)
    if opt.state:
        new.load_state_dict(opt.state_dict())
    return new


def _rebind_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``scheduler`` at ``optimizer`` (and mark its step as tracked, as torch does)."""
    scheduler.optimizer = optimizer
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return
    func = step.__func__  # type: ignore[attr-defined]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return func.__get__(optimizer, type(optimizer))(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]


# ------------------------------------------------------------------------ trainer
class MixedPrecisionTrainer:
    """Mixed-precision training in one of five modes (see :class:`MixedPrecisionMode`).

    Args:
        config: the configuration (default ``MixedPrecisionConfig()``).
        device: where to train; default the device of the model's first param.
        history_size: at most this many per-step rows are kept for
            :meth:`plot` / ``stats()["scale_history"]``; when full, the older
            half is thinned to every other row (recent steps stay dense).

    Attributes set by :meth:`setup_training`:
        model, optimizer (possibly converted, MANUAL), criterion, scheduler,
        scaler (a :class:`mixprec.GradScaler`; disabled when not needed),
        compute_dtype (``torch.float16``/``bfloat16`` or ``None`` for float32),
        policy_handle (the :class:`mixprec.PolicyHandle` or ``None``),
        adaptive_decisions (list of dicts: step, module, from, to, reason).
    """

    def __init__(
        self,
        config: Optional[MixedPrecisionConfig] = None,
        *,
        device: Union[str, torch.device, None] = None,
        history_size: int = 4096,
    ) -> None:
        self.config = config if config is not None else MixedPrecisionConfig()
        if not isinstance(self.config, MixedPrecisionConfig):
            raise TypeError(
                f"MixedPrecisionTrainer: config must be a MixedPrecisionConfig, got "
                f"{type(self.config).__name__}"
            )
        self.config.validate()
        if history_size < 16:
            raise ValueError(
                f"MixedPrecisionTrainer: history_size must be >= 16, got {history_size}"
            )
        self._device_arg = None if device is None else torch.device(device)
        self.history_size = int(history_size)
        self.model: Optional[nn.Module] = None
        self.optimizer: Any = None
        self.criterion: Optional[Callable[..., Tensor]] = None
        self.scheduler: Any = None
        self.scaler: Optional[GradScaler] = None
        self.policy_handle: Optional[PolicyHandle] = None
        self.compute_dtype: Optional[torch.dtype] = None
        self.adaptive_decisions: list[dict[str, Any]] = []
        self._overrides: dict[str, str] = {}
        self._root_precision: Optional[str] = None
        self._hooks: list[Any] = []
        self._reset_counters()

    # ------------------------------------------------------------------ setup
    @property
    def mode(self) -> MixedPrecisionMode:
        """The configured mode (an enum member)."""
        return self.config.mode  # type: ignore[return-value]

    @property
    def device(self) -> torch.device:
        """The training device (after :meth:`setup_training`)."""
        self._require_setup()
        return self._device

    def _reset_counters(self) -> None:
        self.optimizer_steps = 0
        self.micro_steps = 0
        self.epochs_done = 0
        self._micro = 0
        self._step_loss: Optional[Tensor] = None
        self._totals: Optional[Tensor] = None
        self._rows: list[Tensor] = []
        self._row_steps: list[int] = []
        self._hist: Optional[Tensor] = None
        self._hist_steps: list[int] = []
        self._log_snapshot: Optional[Tensor] = None
        self._log_step = 0
        self._scaler_offsets = [0, 0, 0]  # steps, increases, decreases from a loaded run
        self.peak_memory: int = 0
        self.activation_memory: Optional[int] = None
        self._measure_activations = True
        self._last_log: dict[str, Any] = {}
        self._win_fwd: Optional[Tensor] = None
        self._win_bwd: Optional[Tensor] = None

    def _require_setup(self) -> None:
        if self.model is None:
            raise RuntimeError("MixedPrecisionTrainer: call setup_training(...) first")

    def _resolve_dtype(self) -> Optional[torch.dtype]:
        cfg = self.config
        if not cfg.enabled or cfg.mode is MixedPrecisionMode.GRADIENT_SCALING:
            return None
        level = cfg.precision_level
        if level is PrecisionLevel.FP16:
            return torch.float16
        if level is PrecisionLevel.BF16:
            return torch.bfloat16
        if level is PrecisionLevel.FP32:
            return None
        dtype, _ = resolve_precision(self._device.type, "auto")
        return dtype

    def setup_training(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Callable[..., Tensor],
        scheduler: Any = None,
    ) -> MixedPrecisionTrainer:
        """Prepare ``model``/``optimizer`` for the configured mode.

        Mutates ``model``: forwards wrapped by a precision policy (AUTOMATIC,
        SELECTIVE, ADAPTIVE, MANUAL), params converted to float16/bfloat16
        (MANUAL, except float32-policy modules such as norms). In MANUAL mode a
        ``torch.optim.SGD/Adam/AdamW`` is replaced by its mixprec master-weight
        equivalent with the same param groups and hyper-parameters (masters
        initialised from the float32 weights before conversion), and
        ``scheduler`` is re-pointed to it; use ``trainer.optimizer`` afterwards.
        Returns ``self``. Calling it again first undoes the previous policy.
        """
        cfg = self.config
        cfg.validate()
        if self.policy_handle is not None:
            self.policy_handle.remove()
            self.policy_handle = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._device_arg is not None:
            self._device = self._device_arg
            model.to(self._device)
        else:
            p = next(iter(model.parameters()), None)
            self._device = p.device if p is not None else torch.device("cpu")
        self.model, self.criterion, self.scheduler = model, criterion, scheduler
        self.compute_dtype = self._resolve_dtype()
        self._eventual_dtype = self.compute_dtype
        if cfg.mode is MixedPrecisionMode.ADAPTIVE and cfg.enabled and self.compute_dtype is None:
            # starts in float32; memory pressure may turn this on
            self._eventual_dtype, _ = resolve_precision(self._device.type, "auto")
        self.adaptive_decisions = []
        self._overrides = {}

        if cfg.mode is MixedPrecisionMode.MANUAL and cfg.enabled and self.compute_dtype is not None:
            optimizer = self._setup_manual(model, optimizer)
        self.optimizer = optimizer
        if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
            _rebind_scheduler(scheduler, optimizer)

        scaling = cfg.loss_scaling
        if scaling is None:
            scaling = (
                self._eventual_dtype == torch.float16
                or cfg.mode is MixedPrecisionMode.GRADIENT_SCALING
            )
        self.loss_scaling = bool(cfg.enabled and scaling)
        use_scaler = cfg.enabled and cfg.gradient_scaling
        if self.loss_scaling:
            self._fixed_scale = None if cfg.dynamic_loss_scaling else float(cfg.initial_scale)
            self.scaler = GradScaler(
                self._device.type,
                init_scale=cfg.initial_scale,
                growth_factor=cfg.scale_factor,
                backoff_factor=cfg.backoff_factor,
                growth_interval=cfg.scale_window,
                enabled=use_scaler,
                min_scale=cfg.min_scale,
                max_scale=cfg.max_scale,
                hysteresis=cfg.hysteresis,
            )
        else:
            # no loss scaling: scale pinned at 1.0, the scaler only checks and skips
            self._fixed_scale = 1.0
            self.scaler = GradScaler(self._device.type, init_scale=1.0, enabled=use_scaler)
        self._install_policy()
        if cfg.mode is MixedPrecisionMode.ADAPTIVE and cfg.enabled:
            self._setup_adaptive()
        self._reset_counters()
        return self

    def _setup_manual(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        dtype = self.compute_dtype
        assert dtype is not None
        masters: dict[int, Tensor] = {}
        for module in model.modules():
            if isinstance(module, DEFAULT_FP32_MODULES):
                continue
            for p in module.parameters(recurse=False):
                if p.is_floating_point() and p.dtype != dtype:
                    masters[id(p)] = p.detach().to(torch.float32, copy=True)
                    p.data = p.data.to(dtype)
            for name, b in module.named_buffers(recurse=False):
                if b is not None and b.is_floating_point():
                    module._buffers[name] = b.to(dtype)
        new_opt = _to_mixprec_optimizer(optimizer, self.config.master_weights)
        if self.config.master_weights:
            for group in new_opt.param_groups:
                for p in group["params"]:
                    m = masters.get(id(p))
                    if m is not None and "master_param" not in new_opt.state.get(p, {}):
                        new_opt.state[p]["master_param"] = m
        self._param_dtype = dtype
        return new_opt

    def _install_policy(self) -> None:
        cfg, model = self.config, self.model
        assert model is not None
        if self.policy_handle is not None:
            self.policy_handle.remove()
            self.policy_handle = None
        if not cfg.enabled or cfg.mode is MixedPrecisionMode.GRADIENT_SCALING:
            self._root_precision = "fp32"
            return
        dev = self._device.type
        if cfg.mode is MixedPrecisionMode.MANUAL:
            policy = PrecisionPolicy(
                precision=None,
                restore_input_dtype=True,
                device_type=dev,
                module_precisions=dict(self._overrides),
            )
            self._root_precision = _PREC_NAME[self.compute_dtype]
        else:
            if self._root_precision is None or self._root_precision not in _NAME_PREC:
                self._root_precision = _PREC_NAME[self.compute_dtype]
            policy = PrecisionPolicy(
                precision=self._root_precision,
                device_type=dev,
                low_precision_modules=(
                    tuple(cfg.selective_layers)
                    if cfg.mode is MixedPrecisionMode.SELECTIVE
                    else None
                ),
                module_precisions=dict(self._overrides),
            )
        self.policy_handle = apply_policy(model, policy)

    # ------------------------------------------------------------------ adaptive
    def _setup_adaptive(self) -> None:
        model = self.model
        assert model is not None
        # candidates: modules owning parameters, in registration order; the
        # forward order is learned at the first forward
        self._cand_names: list[str] = []
        self._cand_index: dict[int, int] = {}
        for name, module in model.named_modules():
            if name and any(True for _ in module.parameters(recurse=False)):
                self._cand_index[id(module)] = len(self._cand_names)
                self._cand_names.append(name)
        n = len(self._cand_names)
        self._fwd_order: list[int] = []
        self._fwd_seen: set[int] = set()
        self._param_owner: dict[int, int] = {}
        for module in model.modules():
            idx = self._cand_index.get(id(module))
            if idx is None:
                continue
            for p in module.parameters(recurse=False):
                self._param_owner[id(p)] = idx
            self._hooks.append(module.register_forward_hook(self._make_fwd_hook(idx)))
        self._fwd_counts = torch.zeros(n, device=self._device)
        self._bwd_counts = torch.zeros(n, device=self._device)
        self._owner_cache: dict[tuple[int, ...], Tensor] = {}

    def _make_fwd_hook(self, idx: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not module.training:
                return
            if idx not in self._fwd_seen:
                self._fwd_seen.add(idx)
                self._fwd_order.append(idx)
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(out, Tensor) and out.is_floating_point():
                with torch.no_grad():
                    self._fwd_counts[idx] += (~torch.isfinite(out)).any().float()

        return hook

    def _adaptive_record_grads(self, params: list[Tensor], norms: list[Tensor]) -> None:
        key = tuple(id(p) for p in params)
        index = self._owner_cache.get(key)
        if index is None:
            index = torch.tensor(
                [self._param_owner.get(id(p), -1) for p in params], device=self._device
            )
            self._owner_cache = {key: index}
        bad = (~torch.isfinite(torch.stack(norms).to(self._device))).float()
        keep = index >= 0
        self._bwd_counts.index_add_(0, index.clamp(min=0), bad * keep)

    def _current_precision(self, name: str) -> str:
        if name in self._overrides:
            return self._overrides[name]
        handle = self.policy_handle
        if handle is not None and name in handle.precisions:
            return handle.precisions[name]
        return self._root_precision or "fp32"

    def _adaptive_evaluate(self, window: list[float], steps: int) -> None:
        cfg = self.config
        fwd = self._fwd_counts.tolist()
        bwd = self._bwd_counts.tolist()
        self._fwd_counts.zero_()
        self._bwd_counts.zero_()
        overflows = window[_C["overflow"]]
        scale = window[_C["scale"]] / max(steps, 1)  # mean scale over the window
        last_scale = self._last_log.get("scale", scale)
        # memory pressure: turn low precision on
        cap = _memory_capacity(self._device)
        if self._root_precision == "fp32" and cap > 0 and self._eventual_dtype is not None:
            frac = memory_usage(self._device) / cap
            if frac > cfg.adaptive_threshold:
                new = _PREC_NAME[self._eventual_dtype]
                self._decide(
                    "<model>",
                    "fp32",
                    new,
                    f"memory use {frac:.1%} > adaptive_threshold {cfg.adaptive_threshold:.1%}",
                )
                self._root_precision = new
                self.compute_dtype = self._eventual_dtype
                self._install_policy()
                return
        rate = overflows / max(steps, 1)
        at_min = (
            self.loss_scaling
            and cfg.min_scale is not None
            and last_scale <= cfg.min_scale
            and overflows > 0
        )
        if not (rate > cfg.overflow_threshold or at_min):
            return
        reason = (
            f"overflow rate {rate:.0%} > overflow_threshold {cfg.overflow_threshold:.0%}"
            if rate > cfg.overflow_threshold
            else f"scale reached min_scale {cfg.min_scale}"
        )
        low = [
            i
            for i in self._fwd_order
            if self._current_precision(self._cand_names[i]) in ("fp16", "bf16")
        ]
        target: Optional[int] = None
        for i in low:  # forward origin: first module whose output was non-finite
            if fwd[i] > 0:
                target = i
                reason += "; its forward output was non-finite"
                break
        if target is None:  # backward origin: the overflowing module closest to the loss
            for i in reversed(low):
                if bwd[i] > 0:
                    target = i
                    reason += "; its gradients were non-finite"
                    break
        if target is None:
            logger.info("adaptive: %s, but no low-precision module overflowed", reason)
            return
        name = self._cand_names[target]
        old = self._current_precision(name)
        bf16_ok = resolve_precision(self._device.type, "bf16")[0] is not None and (
            self._device.type != "cuda" or torch.cuda.is_bf16_supported()
        )
        new = (
            "bf16"
            if (old == "fp16" and bf16_ok and self.config.mode is not MixedPrecisionMode.MANUAL)
            else "fp32"
        )
        self._decide(name, old, new, reason)
        self._overrides[name] = new
        self._install_policy()

    def _decide(self, module: str, old: str, new: str, reason: str) -> None:
        decision = {
            "step": self.optimizer_steps,
            "module": module,
            "from": old,
            "to": new,
            "reason": reason,
        }
        self.adaptive_decisions.append(decision)
        logger.warning(
            "adaptive: step %d: %s %s -> %s (%s)", self.optimizer_steps, module, old, new, reason
        )

    # ------------------------------------------------------------------ stepping
    def _forward_loss(self, data: Any, target: Any) -> Tensor:
        assert self.model is not None and self.criterion is not None
        data = _to_device(data, self._device)
        target = _to_device(target, self._device)
        if (
            self.config.mode is MixedPrecisionMode.MANUAL
            and self.compute_dtype is not None
            and self.config.enabled
        ):
            data = cast_floating(data, self.compute_dtype, only=(torch.float32, torch.float64))
        output = self.model(data)
        with torch.autocast(self._device.type, enabled=False):
            output = cast_floating(output, torch.float32)
            loss = self.criterion(output, target)
        return loss.float() if loss.dtype != torch.float32 else loss

    def _params(self) -> list[Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def train_step(self, data: Any, target: Any) -> StepMetrics:
        """Forward, backward and -- every ``gradient_accumulation_steps`` calls -- an
        optimizer step.

        Args:
            data: the model input (tensor or nested tuple/list/dict), moved to
                the training device (``non_blocking``); float32 inputs are cast
                to the param dtype in MANUAL mode.
            target: passed to ``criterion(output, target)`` after moving.

        Returns:
            :class:`StepMetrics` with ``loss`` (float32 loss of this call; of the
            whole accumulation on the call that steps), ``current_scale`` (after
            the update), ``overflow_detected`` (grads held inf/NaN),
            ``underflow_detected`` (more than ``underflow_threshold`` of the
            nonzero scaled gradient values flush to zero in the compute dtype;
            only with ``performance_monitoring``), ``nan_detected`` (NaN loss
            or grad norm), ``step_skipped`` (the optimizer step was skipped),
            ``grad_norm`` (unscaled L2 norm before clipping), ``memory_usage``
            (bytes, see :func:`memory_usage`), ``lr`` (of group 0) and
            ``optimizer_step`` (whether this call stepped).

        Mutates the model's grads, params, optimizer/scaler state and counters.
        Syncs only as described in the module docstring.
        """
        self._require_setup()
        assert self.model is not None
        cfg = self.config
        accum = cfg.gradient_accumulation_steps
        self.model.train()
        if self._micro == 0:
            # memory_efficiency: grads were set to None at the previous step
            self.optimizer.zero_grad(set_to_none=cfg.memory_efficiency)
        if self._measure_activations and cfg.performance_monitoring:
            loss = self._measured_forward(data, target)
        else:
            loss = self._forward_loss(data, target)
        scaled = loss / accum if accum > 1 else loss
        if self.scaler is not None and self.scaler.is_enabled():
            scaled = self.scaler.scale(scaled)
        scaled.backward()
        self.micro_steps += 1
        self._micro += 1
        detached = loss.detach()
        self._step_loss = detached if self._step_loss is None else self._step_loss + detached
        if self._micro < accum:
            return StepMetrics(
                {
                    "loss": detached,
                    "current_scale": None,
                    "overflow_detected": None,
                    "underflow_detected": None,
                    "nan_detected": None,
                    "step_skipped": None,
                    "grad_norm": None,
                    "memory_usage": memory_usage(self._device),
                    "lr": self._lr(),
                    "optimizer_step": False,
                }
            )
        return self._optimizer_step()

    def flush(self) -> Optional[StepMetrics]:
        """Step on the gradients of an unfinished accumulation (e.g. at epoch end).

        Returns the metrics of that step, or ``None`` when nothing was pending.
        """
        self._require_setup()
        if self._micro == 0:
            return None
        return self._optimizer_step()

    def _lr(self) -> float:
        lr = self.optimizer.param_groups[0]["lr"]
        return float(lr) if not isinstance(lr, Tensor) else lr  # type: ignore[return-value]

    def _optimizer_step(self) -> StepMetrics:
        cfg = self.config
        scaler = self.scaler
        assert scaler is not None and self._step_loss is not None
        step_loss = self._step_loss / self._micro if self._micro > 1 else self._step_loss
        params = [p for p in self._params() if p.grad is not None]
        grads = [p.grad for p in params]
        dev = self._device
        enabled = scaler.is_enabled()
        scale = scaler._get_scale_async() if enabled else None
        if scale is None:
            scale = torch.ones((), device=dev)
        scale_before = scale.clone()
        norms: Optional[list[Tensor]] = None
        adaptive = cfg.mode is MixedPrecisionMode.ADAPTIVE and cfg.enabled
        if grads and (adaptive or (cfg.performance_monitoring and not cfg.max_grad_norm)):
            with torch.no_grad():
                norms = list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
        if adaptive and norms is not None:
            self._adaptive_record_grads(params, norms)
        zero = torch.zeros((), device=dev)
        underflow = zero
        if cfg.performance_monitoring and grads:
            underflow = self._underflow_flag(grads)
        grad_norm: Optional[Tensor] = None
        if cfg.max_grad_norm:
            if enabled:
                grad_norm = scaler.clip_grad_norm_(self.optimizer, cfg.max_grad_norm)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        elif norms is not None:
            with torch.no_grad():
                total = torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))
                grad_norm = total * scale_before.double().reciprocal().float()
        if enabled:
            scaler.step(self.optimizer)
            state = scaler._per_optimizer_states.get(id(self.optimizer), {})
            flags = list(state.get("found_inf_per_device", {}).values())
            found = sum(f.to(dev) for f in flags) if flags else zero  # type: ignore[assignment]
            found = (found > 0).float()  # type: ignore[union-attr]
            if self._fixed_scale is not None:
                scaler.update(new_scale=self._fixed_scale)
            else:
                scaler.update()
            scale_after = scaler._get_scale_async()
            assert scale_after is not None
        else:
            self.optimizer.step()
            found = zero if grad_norm is None else (~torch.isfinite(grad_norm)).float()
            scale_after = torch.ones((), device=dev)
        if self.scheduler is not None:
            if not (enabled and scaler.step_was_skipped):
                self.scheduler.step()
        nan = torch.isnan(step_loss).float()
        if grad_norm is not None:
            nan = torch.maximum(nan, torch.isnan(grad_norm).float())
        gn = grad_norm.float() if grad_norm is not None else torch.full((), math.nan, device=dev)
        gn_ok = torch.isfinite(gn) & (found == 0)
        row = torch.stack(
            [
                step_loss.float().to(dev),
                scale_after.float().to(dev),
                found.to(dev),
                underflow.to(dev),
                nan.to(dev),
                torch.where(gn_ok, gn, zero),
                gn_ok.float(),
            ]
        )
        self._record(row)
        self.optimizer_steps += 1
        self._micro = 0
        self._step_loss = None
        mem = memory_usage(dev)
        self.peak_memory = max(
            self.peak_memory,
            mem if dev.type != "cuda" else int(torch.cuda.max_memory_allocated(dev)),
        )
        metrics = StepMetrics(
            {
                "loss": step_loss,
                "current_scale": scale_after,
                "overflow_detected": found > 0,
                "underflow_detected": underflow > 0,
                "nan_detected": nan > 0,
                "step_skipped": found > 0 if enabled else torch.zeros((), dtype=torch.bool),
                "grad_norm": grad_norm,
                "memory_usage": mem,
                "lr": self._lr(),
                "optimizer_step": True,
            }
        )
        if self.optimizer_steps % cfg.logging_frequency == 0:
            self._log_and_adapt()
        return metrics

    def _underflow_flag(self, grads: list[Tensor]) -> Tensor:
        """1.0 when the fraction of nonzero scaled grads that flush to zero in the
        compute dtype exceeds ``underflow_threshold`` (device, no sync)."""
        dtype = self.compute_dtype or torch.float32
        fi = torch.finfo(dtype)
        tiny = fi.tiny * fi.eps / 2  # values at or below this round to zero
        with torch.no_grad():
            small, nonzero = [], []
            for g in grads:
                a = g.detach().abs()
                nz = a != 0
                small.append((nz & (a <= tiny)).sum())
                nonzero.append(nz.sum())
            s = torch.stack([t.to(self._device) for t in small]).sum()
            n = torch.stack([t.to(self._device) for t in nonzero]).sum()
            frac = s.float() / n.clamp(min=1).float()
            return (frac > self.config.underflow_threshold).float()

    def _measured_forward(self, data: Any, target: Any) -> Tensor:
        """Forward while adding up the bytes autograd saves (activation memory)."""
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            try:
                key = t.untyped_storage().data_ptr()
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
            except (RuntimeError, NotImplementedError):
                pass
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = self._forward_loss(data, target)
        param_ptrs = {p.untyped_storage().data_ptr() for p in self._params()}
        self.activation_memory = sum(v for k, v in seen.items() if k not in param_ptrs)
        self._measure_activations = False
        return loss

    def _record(self, row: Tensor) -> None:
        if self._totals is None:
            self._totals = torch.zeros(len(_COLS), device=row.device)
            self._log_snapshot = self._totals.clone()
        self._totals.add_(row)
        self._rows.append(row)
        self._row_steps.append(self.optimizer_steps)
        if len(self._rows) >= _FOLD:
            self._fold()

    def _fold(self) -> None:
        if not self._rows:
            return
        block = torch.stack(self._rows)
        self._hist = block if self._hist is None else torch.cat((self._hist, block))
        self._hist_steps.extend(self._row_steps)
        self._rows, self._row_steps = [], []
        while self._hist.shape[0] > self.history_size:
            # thin the older half to every other row: recent steps stay dense,
            # the first and the last rows are always kept
            half = self._hist.shape[0] // 2
            self._hist = torch.cat((self._hist[:half:2], self._hist[half:]))
            self._hist_steps = self._hist_steps[:half:2] + self._hist_steps[half:]

    # ------------------------------------------------------------------ logging
    def _log_and_adapt(self) -> None:
        """At a log step: one sync, a log line, handling actions, ADAPTIVE."""
        assert self._totals is not None and self._log_snapshot is not None
        cfg = self.config
        last = (
            self._rows[-1] if self._rows else (self._hist[-1] if self._hist is not None else None)
        )
        both = (
            torch.stack([self._totals - self._log_snapshot, last])
            if last is not None
            else torch.stack([self._totals - self._log_snapshot, self._totals])
        )
        window, cur = both.tolist()
        steps = self.optimizer_steps - self._log_step
        self._log_snapshot = self._totals.clone()
        self._log_step = self.optimizer_steps
        self._last_log = {
            "step": self.optimizer_steps,
            "loss": cur[_C["loss"]],
            "scale": cur[_C["scale"]],
            "overflows": int(window[_C["overflow"]]),
            "grad_norm": cur[_C["grad_norm"]] if cur[_C["grad_norm_ok"]] else math.nan,
            "lr": self._lr(),
        }
        logger.info(
            "step %d | loss %.4f | scale %g | lr %.3g | grad norm %.3g | overflows %d/%d "
            "| underflows %d | nan %d",
            self.optimizer_steps,
            self._last_log["loss"],
            self._last_log["scale"],
            float(self._last_log["lr"]),
            self._last_log["grad_norm"],
            int(window[_C["overflow"]]),
            steps,
            int(window[_C["underflow"]]),
            int(window[_C["nan"]]),
        )
        for key, col in (
            ("nan_handling", "nan"),
            ("overflow_handling", "overflow"),
            ("underflow_handling", "underflow"),
        ):
            n = int(window[_C[col]])
            action = getattr(cfg, key)
            if not n:
                continue
            msg = f"{n} of the last {steps} optimizer steps had {col} (step {self.optimizer_steps})"
            if action is HandlingAction.RAISE:
                raise FloatingPointError(f"MixedPrecisionTrainer: {msg}; {key}='raise'")
            if action is HandlingAction.WARN:
                logger.warning("MixedPrecisionTrainer: %s", msg)
        if cfg.mode is MixedPrecisionMode.ADAPTIVE and cfg.enabled:
            self._adaptive_evaluate(window, steps)

    # ------------------------------------------------------------------ loops
    def train_epoch(self, loader: Iterable[Any], _bar: Any = None) -> dict[str, Any]:
        """One pass over ``loader`` (yielding ``(data, target)``); flushes a
        trailing partial accumulation at the end.

        Returns ``epoch_loss`` (mean loss over the epoch's optimizer steps),
        ``num_batches``, ``overflow_steps``, ``underflow_steps``, ``nan_steps``,
        ``average_scale`` and ``optimizer_steps``. One host sync at the end.
        """
        self._require_setup()
        start_totals = None if self._totals is None else self._totals.clone()
        start_steps = self.optimizer_steps
        batches = 0
        for data, target in loader:
            self.train_step(data, target)
            batches += 1
            if _bar is not None:
                _bar.update(1)
                if self._last_log and self._last_log.get("step") == self.optimizer_steps:
                    _bar.set_postfix(
                        loss=f"{self._last_log['loss']:.4f}", scale=f"{self._last_log['scale']:g}"
                    )
        self.flush()
        self.epochs_done += 1
        steps = self.optimizer_steps - start_steps
        if self._totals is None or steps == 0:
            vals = [0.0] * len(_COLS)
        else:
            delta = self._totals - (start_totals if start_totals is not None else 0)
            vals = delta.tolist()
        d = max(steps, 1)
        return {
            "epoch_loss": vals[_C["loss"]] / d,
            "num_batches": batches,
            "optimizer_steps": steps,
            "overflow_steps": int(vals[_C["overflow"]]),
            "underflow_steps": int(vals[_C["underflow"]]),
            "nan_steps": int(vals[_C["nan"]]),
            "average_scale": vals[_C["scale"]] / d,
        }

    def train(
        self,
        loader: Iterable[Any],
        num_epochs: int,
        val_loader: Optional[Iterable[Any]] = None,
        progress: bool = True,
    ) -> list[dict[str, Any]]:
        """Train for ``num_epochs`` with a tqdm progress bar (``progress``), a log
        line (logger ``"mixprec.trainer"``, INFO) every ``logging_frequency``
        optimizer steps and one per epoch. Returns the per-epoch dicts of
        :meth:`train_epoch`, with ``val_loss``/``val_accuracy`` and ``time_s``
        added (``val_*`` only with ``val_loader``).
        """
        self._require_setup()
        if num_epochs < 0:
            raise ValueError(
                f"MixedPrecisionTrainer.train: num_epochs must be >= 0, got {num_epochs}"
            )
        try:
            total = len(loader) * num_epochs  # type: ignore[arg-type]
        except TypeError:
            total = None
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=total,
                desc=f"train ({self._describe()})",
                unit="batch",
                dynamic_ncols=True,
                leave=True,
            )
        history = []
        try:
            for _ in range(num_epochs):
                t0 = time.perf_counter()
                result = self.train_epoch(loader, _bar=bar)
                result["time_s"] = time.perf_counter() - t0
                if val_loader is not None:
                    ev = self.evaluate(val_loader)
                    result["val_loss"] = ev["loss"]
                    result["val_accuracy"] = ev["accuracy"]
                result["epoch"] = self.epochs_done
                history.append(result)
                extra = (
                    f" | val loss {result['val_loss']:.4f} | val acc {result['val_accuracy']:.4f}"
                    if val_loader is not None and result.get("val_accuracy") is not None
                    else ""
                )
                logger.info(
                    "epoch %d | loss %.4f | overflow steps %d | avg scale %g | %.2fs%s",
                    self.epochs_done,
                    result["epoch_loss"],
                    result["overflow_steps"],
                    result["average_scale"],
                    result["time_s"],
                    extra,
                )
                if bar is not None:
                    bar.set_postfix(epoch=self.epochs_done, loss=f"{result['epoch_loss']:.4f}")
        finally:
            if bar is not None:
                bar.close()
        return history

    def _describe(self) -> str:
        return f"{self.mode.value}, {_PREC_NAME.get(self.compute_dtype, 'fp32')}"

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any]) -> dict[str, Any]:
        """Mean loss (weighted by batch size) and, for class-index targets with
        ``[N, C]`` outputs, accuracy, over ``loader``; in eval mode, with the
        training precision policy. Restores the previous train/eval mode. One
        host sync at the end.
        """
        self._require_setup()
        assert self.model is not None and self.criterion is not None
        was_training = self.model.training
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self._device)
        correct = torch.zeros((), dtype=torch.int64, device=self._device)
        n = 0
        classify = True
        try:
            for data, target in loader:
                data = _to_device(data, self._device)
                target = _to_device(target, self._device)
                if (
                    self.config.mode is MixedPrecisionMode.MANUAL
                    and self.config.enabled
                    and self.compute_dtype is not None
                ):
                    data = cast_floating(
                        data, self.compute_dtype, only=(torch.float32, torch.float64)
                    )
                out = cast_floating(self.model(data), torch.float32)
                bs = _batch_size(target)
                with torch.autocast(self._device.type, enabled=False):
                    loss_sum += self.criterion(out, target).double() * bs
                if (
                    classify
                    and isinstance(out, Tensor)
                    and isinstance(target, Tensor)
                    and out.dim() == 2
                    and not target.is_floating_point()
                    and target.dim() == 1
                ):
                    correct += (out.argmax(1) == target).sum()
                else:
                    classify = False
                n += bs
        finally:
            self.model.train(was_training)
        vals = torch.stack([loss_sum, correct.double()]).tolist()
        return {
            "loss": vals[0] / max(n, 1),
            "accuracy": (vals[1] / max(n, 1)) if classify and n else None,
            "num_samples": n,
        }

    # ------------------------------------------------------------------ reports
    def _history(self) -> tuple[list[int], Optional[Tensor]]:
        self._fold()
        return list(self._hist_steps), self._hist

    def stats(self) -> dict[str, Any]:
        """Counters since setup (or since the loaded run began). One host sync.

        Keys: ``total_steps`` (optimizer steps), ``micro_steps``,
        ``skipped_steps``, ``overflow_rate``, ``underflow_steps``,
        ``nan_steps``, ``current_scale``, ``avg_grad_norm`` (over steps where it
        was computed and finite; NaN if none), ``scale_increases``,
        ``scale_decreases``, ``scale_history`` (list of ``(step, scale)``, at
        most ``history_size``), ``compute_dtype``, ``mode``, ``peak_memory``,
        ``activation_memory``, ``adaptive_decisions``.
        """
        self._require_setup()
        assert self.scaler is not None
        steps, hist = self._history()
        totals = self._totals.tolist() if self._totals is not None else [0.0] * len(_COLS)
        scale_hist = hist[:, _C["scale"]].tolist() if hist is not None else []
        sst = self.scaler.stats()
        n = self.optimizer_steps
        gn_count = totals[_C["grad_norm_ok"]]
        return {
            "total_steps": n,
            "micro_steps": self.micro_steps,
            "skipped_steps": int(totals[_C["overflow"]]),
            "overflow_rate": totals[_C["overflow"]] / n if n else 0.0,
            "underflow_steps": int(totals[_C["underflow"]]),
            "nan_steps": int(totals[_C["nan"]]),
            "current_scale": sst.scale if self.scaler.is_enabled() else 1.0,
            "avg_grad_norm": totals[_C["grad_norm"]] / gn_count if gn_count else math.nan,
            "scale_increases": sst.scale_increases + self._scaler_offsets[1],
            "scale_decreases": sst.scale_decreases + self._scaler_offsets[2],
            "scale_history": list(zip(steps, scale_hist)),
            "compute_dtype": _PREC_NAME.get(self.compute_dtype, "fp32"),
            "mode": self.mode.value,
            "peak_memory": self.peak_memory,
            "activation_memory": self.activation_memory,
            "adaptive_decisions": [dict(d) for d in self.adaptive_decisions],
        }

    def reset(self) -> None:
        """Forget statistics, history, counters and a pending accumulation, and
        give the scaler its initial scale. The model, the optimizer state, the
        scheduler and ADAPTIVE decisions are kept."""
        self._require_setup()
        assert self.scaler is not None
        self.optimizer.zero_grad(set_to_none=True)
        old = self.scaler
        self.scaler = GradScaler(
            old._device,
            init_scale=old._init_scale if not old.is_enabled() else self._initial_scale(),
            growth_factor=getattr(old, "_growth_factor", 2.0),
            backoff_factor=getattr(old, "_backoff_factor", 0.5),
            growth_interval=getattr(old, "_growth_interval", 2000),
            enabled=old.is_enabled(),
            min_scale=old.min_scale,
            max_scale=old.max_scale,
            hysteresis=old.hysteresis,
        )
        self._reset_counters()

    def _initial_scale(self) -> float:
        return float(self.config.initial_scale) if self.loss_scaling else 1.0

    def plot(self, path: Union[str, os.PathLike[str]]) -> str:
        """Write a PNG of loss, log2 scale, skipped steps and grad norm per
        optimizer step (matplotlib, Agg backend: no display needed). One sync.
        Returns the path."""
        self._require_setup()
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        steps, hist = self._history()
        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        fig.suptitle(f"mixprec trainer: {self._describe()}")
        if hist is None:
            for ax in axes.flat:
                ax.text(0.5, 0.5, "no steps yet", ha="center", va="center")
        else:
            h = hist.cpu()
            s = torch.tensor(steps, dtype=torch.float64)
            ax = axes[0, 0]
            ax.plot(s, h[:, _C["loss"]], lw=1)
            ax.set_title("loss")
            ax = axes[0, 1]
            ax.plot(s, torch.log2(h[:, _C["scale"]].clamp(min=1e-30)), lw=1, color="tab:orange")
            ax.set_title("log2(loss scale)")
            ax = axes[1, 0]
            skipped = h[:, _C["overflow"]] > 0
            ax.plot(s, torch.cumsum(skipped.double(), 0), lw=1, color="tab:red")
            if skipped.any():
                ax.scatter(
                    s[skipped],
                    torch.cumsum(skipped.double(), 0)[skipped],
                    s=12,
                    color="tab:red",
                    label="skipped step",
                )
                ax.legend(loc="lower right")
            ax.set_title("skipped steps (cumulative)")
            ax = axes[1, 1]
            ok = h[:, _C["grad_norm_ok"]] > 0
            if ok.any():
                ax.plot(s[ok], h[ok, _C["grad_norm"]], lw=1, color="tab:green")
            else:
                ax.text(0.5, 0.5, "not computed", ha="center", va="center")
            ax.set_title("gradient norm (unscaled)")
            for ax in axes.flat:
                ax.set_xlabel("optimizer step")
                ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=100)
        plt.close(fig)
        return os.fspath(path)

    # ------------------------------------------------------------------ state
    def save_state(self, path: Union[str, os.PathLike[str]]) -> None:
        """Save everything needed to resume bitwise: model, optimizer (with
        masters), scaler, scheduler, counters, statistics/history, config,
        ADAPTIVE decisions and overrides, RNG states and the grads of an
        unfinished accumulation. Only tensors and plain Python values, so
        ``torch.load(path, weights_only=True)`` reads it. One host sync."""
        self._require_setup()
        assert self.model is not None and self.scaler is not None
        steps, hist = self._history()
        sst = self.scaler.stats()
        state: dict[str, Any] = {
            "format": _STATE_FORMAT,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "config": self.config.to_dict(),
            "counters": {
                "optimizer_steps": self.optimizer_steps,
                "micro_steps": self.micro_steps,
                "epochs_done": self.epochs_done,
                "micro": self._micro,
                "log_step": self._log_step,
                "scaler_steps": sst.steps + self._scaler_offsets[0],
                "scale_increases": sst.scale_increases + self._scaler_offsets[1],
                "scale_decreases": sst.scale_decreases + self._scaler_offsets[2],
                "peak_memory": self.peak_memory,
            },
            "totals": None if self._totals is None else self._totals.cpu(),
            "log_snapshot": None if self._log_snapshot is None else self._log_snapshot.cpu(),
            "history": None if hist is None else hist.cpu(),
            "history_steps": steps,
            "adaptive": {
                "decisions": [dict(d) for d in self.adaptive_decisions],
                "overrides": dict(self._overrides),
                "root_precision": self._root_precision,
            },
            "rng": {
                "cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            "pending_loss": None if self._step_loss is None else self._step_loss.cpu(),
            "pending_grads": (
                [None if p.grad is None else p.grad.detach().cpu() for p in self._params()]
                if self._micro
                else None
            ),
        }
        if self.config.mode is MixedPrecisionMode.ADAPTIVE and self.config.enabled:
            state["adaptive"]["fwd_counts"] = self._fwd_counts.cpu()
            state["adaptive"]["bwd_counts"] = self._bwd_counts.cpu()
        torch.save(state, os.fspath(path))

    def load_state(self, path: Union[str, os.PathLike[str]], strict_config: bool = False) -> None:
        """Restore a :meth:`save_state` file (``weights_only=True``) into this
        trainer, after :meth:`setup_training` with the same model architecture
        and optimizer type. A config that differs from the saved one is
        reported with a warning (``strict_config=True``: ``ValueError``).
        ADAPTIVE overrides are re-applied. Mutates model, optimizer, scaler,
        scheduler, counters and the global RNG states."""
        self._require_setup()
        assert self.model is not None and self.scaler is not None
        state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"MixedPrecisionTrainer.load_state: unknown format "
                f"{state.get('format')!r} in {path}"
            )
        saved_cfg = state["config"]
        mine = self.config.to_dict()
        diff = sorted(k for k in mine if saved_cfg.get(k) != mine[k])
        if diff:
            msg = f"MixedPrecisionTrainer.load_state: config differs from the saved one in {diff}"
            if strict_config:
                raise ValueError(msg)
            logger.warning(msg)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        c = state["counters"]
        self._reset_counters()
        self.optimizer_steps = int(c["optimizer_steps"])
        self.micro_steps = int(c["micro_steps"])
        self.epochs_done = int(c["epochs_done"])
        self._micro = int(c["micro"])
        self._log_step = int(c["log_step"])
        self._scaler_offsets = [
            int(c["scaler_steps"]),
            int(c["scale_increases"]),
            int(c["scale_decreases"]),
        ]
        self.peak_memory = int(c["peak_memory"])
        dev = self._device
        if state["totals"] is not None:
            self._totals = state["totals"].to(dev)
            self._log_snapshot = state["log_snapshot"].to(dev)
        if state["history"] is not None:
            self._hist = state["history"].to(dev)
            self._hist_steps = [int(s) for s in state["history_steps"]]
        ad = state["adaptive"]
        self.adaptive_decisions = [dict(d) for d in ad["decisions"]]
        self._overrides = dict(ad["overrides"])
        if ad.get("root_precision") is not None:
            self._root_precision = ad["root_precision"]
            if self.config.mode is not MixedPrecisionMode.MANUAL:
                self.compute_dtype = _NAME_PREC.get(self._root_precision, self.compute_dtype)
        self._install_policy()
        if "fwd_counts" in ad:
            self._fwd_counts = ad["fwd_counts"].to(dev)
            self._bwd_counts = ad["bwd_counts"].to(dev)
        torch.set_rng_state(state["rng"]["cpu"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        if state["pending_loss"] is not None:
            self._step_loss = state["pending_loss"].to(dev)
        if state["pending_grads"] is not None:
            for p, g in zip(self._params(), state["pending_grads"]):
                p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
        self._measure_activations = False
