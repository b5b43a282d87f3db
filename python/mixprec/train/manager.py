"""``MixedPrecisionManager``: the per-mode mixed-precision logic, for any training loop.

:class:`~mixprec.MixedPrecisionTrainer` is built on it (``trainer.mixed_precision_manager``);
a hand-written loop is in ``docs/trainer.md``.

Host syncs: :meth:`~MixedPrecisionManager.autocast` and :meth:`~MixedPrecisionManager.backward`
never sync; :meth:`~MixedPrecisionManager.step` neither, except (as :meth:`mixprec.GradScaler.step`)
with an optimizer that is not a mixprec/fused one (one ``.item()``), and in ADAPTIVE mode with
``adapt_in_step`` one read every ``logging_frequency`` steps. ``bool()`` of its result syncs once
(cached); :attr:`~MixedPrecisionManager.step_was_skipped` once per step unless the scaler already
did; :meth:`~MixedPrecisionManager.stats` and :meth:`~MixedPrecisionManager.state_dict` once each.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from .. import _dtensor
from ..amp.autocast import cast_floating
from ..amp.grad_scaler import GradScaler
from ..amp.module_policy import PolicyHandle, apply_policy, modules_matching
from ..amp.notices import warn_ineffective
from ..capture import CapturedStep, CaptureError, capture_step
from ..optim.release import GradientRelease, check_release, release_gradients
from .config import MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel, as_config
from .fp8 import Fp8Handle, ModuleFilter
from .metrics import StepResult, logger
from .modes import NAME_PREC, PREC_NAME, ModeStrategy, strategy_for

__all__ = ["MixedPrecisionManager", "StepResult"]

_MANAGER_FORMAT = 1


def _underflow_flag(grads: list[Tensor], dtype: Optional[torch.dtype], threshold: float,
                    device: torch.device, groups: list[Any]) -> Tensor:
    """1.0 when the fraction of nonzero scaled grads that flush to zero in ``dtype``
    (float32 for ``None``) exceeds ``threshold`` (device, no sync). For the local shards of
    DTensor grads the counts are summed over ``groups`` (the Shard dimensions) first."""
    fi = torch.finfo(dtype or torch.float32)
    tiny = fi.tiny * fi.eps / 2  # values at or below this round to zero
    with torch.no_grad():
        small, nonzero = [], []
        for g in grads:
            a = g.detach().abs()
            nz = a != 0
            small.append((nz & (a <= tiny)).sum())
            nonzero.append(nz.sum())
        counts = torch.stack([torch.stack([t.to(device) for t in ts]).sum()
                              for ts in (small, nonzero)])
        if groups:
            _dtensor.all_reduce(counts, torch.distributed.ReduceOp.SUM, groups)
        return (counts[0].float() / counts[1].clamp(min=1).float() > threshold).float()


def _grad_norms(grads: list[Tensor], groups: list[Any]) -> list[Tensor]:
    """The L2 norm of each grad (float32): of the whole tensor for DTensor grads, whose
    local shards' squared norms are summed over ``groups`` (the Shard dimensions)."""
    if not groups:
        return list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
    local = torch._foreach_norm(_dtensor.locals_of(grads), 2.0, dtype=torch.float32)
    sq = torch.stack([n.double().square() for n in local])
    _dtensor.all_reduce(sq, torch.distributed.ReduceOp.SUM, groups)
    return list(sq.sqrt().float().unbind())


def check_setup(model: nn.Module, optimizer: Any, config: MixedPrecisionConfig,
                device: Union[str, torch.device, None] = None, scheduler: Any = None
                ) -> tuple[torch.device, ModeStrategy, Optional[torch.dtype]]:
    """Every refusal of :class:`MixedPrecisionManager`'s setup, changing nothing: the config, the
    optimizer (a torch optimizer over params of ``model``; in MANUAL mode one it can convert), the
    scheduler (one of ``optimizer``), a sharded model MANUAL cannot convert. Returns
    ``(device, strategy, compute_dtype)``."""
    as_config(config, "MixedPrecisionManager")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"MixedPrecisionManager: optimizer must be a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")
    mine = {id(p) for p in model.parameters()}
    theirs = [p for g in optimizer.param_groups for p in g["params"]]
    if theirs and mine and not any(id(p) in mine for p in theirs):
        raise ValueError(
            f"MixedPrecisionManager: optimizer: none of its {len(theirs)} params is a param "
            f"of model (an optimizer of another model, or built before the model was "
            f"replaced?); build the optimizer over model.parameters()")
    if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
        raise ValueError("MixedPrecisionManager: scheduler must be an LR scheduler of "
                         "optimizer (its .optimizer), got one of another optimizer")
    if device is not None:
        dev = torch.device(device)
    else:
        p = next(iter(model.parameters()), None)
        dev = p.device if p is not None else torch.device("cpu")
    strategy = strategy_for(config)
    dtype = strategy.compute_dtype(dev)
    strategy.check(model, dtype, optimizer)
    if config.gradient_release:
        if strategy.loss_scaling(strategy.eventual_dtype(dtype, dev)):
            raise ValueError(
                "MixedPrecisionConfig.gradient_release=True cannot be combined with loss "
                "scaling, on here for float16 compute (an overflow found in a later gradient "
                "would need updates already applied to be undone): compute in bfloat16, or "
                "set gradient_release=False")
        manual = config.enabled and config.mode is MixedPrecisionMode.MANUAL
        check_release(model, optimizer, optimizer_converted=manual)
    return dev, strategy, dtype


def check_plan(plan: Any, where: str) -> None:
    """``plan`` (at ``where``) is a precision plan :meth:`~MixedPrecisionManager.load_plan_state`
    takes; ValueError otherwise."""
    if not (isinstance(plan, dict) and isinstance(plan.get("decisions"), list)
            and isinstance(plan.get("overrides"), dict)
            and all(isinstance(d, dict) for d in plan["decisions"])):
        raise ValueError(f"{where}: expected a dict with 'decisions' (a list of dicts) and "
                         f"'overrides' (a dict)")
    root = plan.get("root_precision")
    if root is not None and root not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"{where}['root_precision']: expected 'fp16', 'bf16', 'fp32' or None, "
                         f"got {root!r}")


def rebind_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point LR ``scheduler`` at ``optimizer`` (the one MANUAL mode trains), public API
    only: its ``optimizer`` attribute, and torch's step tracking installed on
    ``optimizer.step`` by a ``LambdaLR`` (whose lr writes are undone), so that torch's
    "lr_scheduler.step() before optimizer.step()" check sees the steps that train."""
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        lrs = [g["lr"] for g in optimizer.param_groups]
        initial = [g.get("initial_lr") for g in optimizer.param_groups]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        for g, lr, init in zip(optimizer.param_groups, lrs, initial):
            g["lr"] = lr
            if init is None:
                g.pop("initial_lr", None)
    scheduler.optimizer = optimizer


class MixedPrecisionManager:
    """Mixed precision for a model and its optimizer, in one of the five modes.

    Construction prepares them for ``config.mode`` (see :class:`MixedPrecisionMode`): a precision
    policy on ``model`` (forward wrappers; AUTOMATIC, SELECTIVE, ADAPTIVE, MANUAL); in MANUAL the
    params converted to float16/bfloat16 (except float32-policy modules such as norms) and a
    ``torch.optim.SGD/Adam/AdamW`` replaced by its mixprec master-weight equivalent (use
    :attr:`optimizer` afterwards); and the :class:`mixprec.GradScaler` (:attr:`scaler`).

    Args:
        model: the model (mutated as described; moved to ``device`` when given).
        optimizer: its optimizer.
        config: default ``MixedPrecisionConfig()``.
        device: the training device; default the device of the model's first param.
        adapt_in_step: ADAPTIVE: evaluate every ``config.logging_frequency`` steps inside
            :meth:`step` (one host sync each); the trainer turns it off and calls
            :meth:`adapt` at its log steps.
        fp8_module_filter: FP8 level: ``(module, fqn) -> bool``, which eligible linears torchao
            converts (replaces ``config.fp8_keep_first_last``); see :mod:`mixprec.train.fp8`.
        scheduler: an LR scheduler of ``optimizer`` (optional), re-bound to :attr:`optimizer` when
            MANUAL mode replaces it (public API only); either way the lr it sets is the lr that
            trains (the new optimizer shares the param-group dicts).

    Every refusal (:func:`check_setup`) comes before anything is changed. A setting that does
    nothing with this model warns once (:class:`~mixprec.amp.notices.IneffectiveSettingWarning`).

    Attributes:
        model, optimizer, config, device, scaler, strategy (the mode's
        :class:`~mixprec.train.modes.ModeStrategy`), compute_dtype (``torch.float16`` /
        ``bfloat16``, ``None`` for float32), loss_scaling, policy_handle, adaptive (the
        :class:`~mixprec.train.adaptive.AdaptiveController` or ``None``),
        adaptive_decisions (dicts: step, module, from, to, reason), overrides
        (``{module: precision}`` ADAPTIVE promotions), steps (calls of :meth:`step`),
        fp8 (the :class:`~mixprec.train.fp8.Fp8Handle` of the FP8 level, else ``None``).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: Optional[MixedPrecisionConfig] = None, *,
                 device: Union[str, torch.device, None] = None, adapt_in_step: bool = True,
                 fp8_module_filter: Optional[ModuleFilter] = None,
                 scheduler: Any = None) -> None:
        cfg = as_config(config, "MixedPrecisionManager")
        # every check before the first change (the model moved, params converted)
        self.device, self.strategy, self.compute_dtype = check_setup(
            model, optimizer, cfg, device, scheduler)
        self.config, self.model = cfg, model
        if device is not None:
            model.to(self.device)
        self.eventual_dtype = self.strategy.eventual_dtype(self.compute_dtype, self.device)
        self.adaptive_decisions: list[dict[str, Any]] = []
        self.overrides: dict[str, str] = {}
        self.root_precision: Optional[str] = None
        self.policy_handle: Optional[PolicyHandle] = None
        self.plan_version = 0  # counts install_policy calls: a captured step re-captures
        self._in_made_step = False
        self.fp8: Optional[Fp8Handle] = None
        if cfg.enabled and cfg.precision_level is PrecisionLevel.FP8:
            # before MANUAL's conversion: the swap keeps the Parameter objects
            assert self.compute_dtype is not None
            self.fp8 = Fp8Handle(model, cfg.fp8_recipe, self.compute_dtype, self.device.type,
                                 fp8_module_filter, cfg.fp8_keep_first_last)
        self.optimizer: Any = self.strategy.prepare(self, optimizer)
        #: the LR scheduler given, re-bound to :attr:`optimizer` when MANUAL replaced it
        self.scheduler = scheduler
        if scheduler is not None and self.optimizer is not optimizer:
            rebind_scheduler(scheduler, self.optimizer)
        self.loss_scaling = self.strategy.loss_scaling(self.eventual_dtype)
        self._fixed_scale: Optional[float] = None
        self.scaler = self._make_scaler()
        #: the gradient release on :attr:`optimizer` (``config.gradient_release``), or None
        self.release: Optional[GradientRelease] = (
            release_gradients(model, self.optimizer) if cfg.gradient_release else None)
        self.install_policy()
        self._warn_ineffective()
        self.adaptive = self.strategy.controller(self)
        self.adapt_in_step = adapt_in_step
        self.steps = 0
        self._window: Optional[Tensor] = None
        self._window_start = 0

    @property
    def mode(self) -> MixedPrecisionMode:
        """The configured mode (an enum member)."""
        return self.config.mode  # type: ignore[return-value]

    def _warn_ineffective(self) -> None:
        """Warn for a SELECTIVE pattern matching no module, and for the FP8 level with no
        linear converted."""
        cfg = self.config
        if not cfg.enabled:
            return
        if cfg.mode is MixedPrecisionMode.SELECTIVE and self.compute_dtype is not None:
            for spec in cfg.selective_layers:
                if not modules_matching(self.model, spec):
                    what = ("no module runs in low precision: the model trains in fp32"
                            if not self.low_precision_modules else "it selects nothing")
                    warn_ineffective(
                        f"MixedPrecisionConfig.selective_layers: {spec!r} matches no module "
                        f"of the model (a glob over qualified names such as 'encoder.*', or "
                        f"a class name); {what}", stacklevel=4)
        if self.fp8 is not None and not self.fp8.modules:
            warn_ineffective(
                "MixedPrecisionConfig(precision_level='fp8'): no nn.Linear of the model is "
                "eligible (torchao's Float8 linears need both dimensions divisible by 16, and "
                "fp8_keep_first_last / fp8_module_filter may exclude some); the model trains "
                f"in {PREC_NAME.get(self.compute_dtype, 'fp32')} only", stacklevel=4)

    @property
    def low_precision_modules(self) -> int:
        """How many modules (the root included) run their forward in float16/bfloat16 under
        the policy on the model (MANUAL: hold 16-bit params; 0 without a policy)."""
        if self.mode is MixedPrecisionMode.MANUAL and self.config.enabled:
            dt = self.compute_dtype
            return sum(any(p.dtype == dt for p in m.parameters(recurse=False))
                       for m in self.model.modules())
        h = self.policy_handle
        return 0 if h is None else sum(p in ("fp16", "bf16") for p in h.precisions.values())

    def _make_scaler(self) -> GradScaler:
        cfg = self.config
        enabled = self.strategy.uses_scaler() and not cfg.gradient_release
        if not self.loss_scaling:  # scale pinned at 1.0: the scaler only checks and skips
            self._fixed_scale = 1.0
            return GradScaler(self.device.type, init_scale=1.0, enabled=enabled)
        self._fixed_scale = None if cfg.dynamic_loss_scaling else float(cfg.initial_scale)
        return GradScaler(
            self.device.type, init_scale=cfg.initial_scale, growth_factor=cfg.scale_factor,
            backoff_factor=cfg.backoff_factor, growth_interval=cfg.scale_window,
            enabled=enabled, min_scale=cfg.min_scale, max_scale=cfg.max_scale,
            hysteresis=cfg.hysteresis)

    def reset_scaler(self) -> None:
        """Replace the scaler by a fresh one (initial scale, no statistics)."""
        old = self.scaler
        scale = float(self.config.initial_scale) if self.loss_scaling else 1.0
        self.scaler = old.fresh(scale if old.is_enabled() else None)

    def _remove_policy(self) -> None:
        if self.policy_handle is not None:
            self.policy_handle.remove()
            self.policy_handle = None

    def install_policy(self) -> None:
        """(Re)apply the precision policy for the current plan (root precision, overrides)."""
        self._remove_policy()
        self.root_precision, policy = self.strategy.policy(self)
        if policy is not None:
            self.policy_handle = apply_policy(self.model, policy)
        self.plan_version += 1

    def close(self) -> None:
        """Take the policy, the FP8 forward wrappers, the ADAPTIVE hooks and the gradient
        release's hooks off the model (params and Float8 linears stay converted)."""
        self._remove_policy()
        if self.release is not None:
            self.release.remove()
            self.release = None
        if self.fp8 is not None:
            self.fp8.remove()
            self.fp8 = None
        if self.adaptive is not None:
            self.adaptive.remove()

    # ------------------------------------------------------------------ the loop
    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward context: run the model's forward (and the loss) inside it.

        The policy on the model does the per-module work; in MANUAL mode this context also casts the
        float32/float64 inputs of the model's forward to the 16-bit param dtype (a forward pre-hook
        while inside). The model's floating outputs come out in float32. No host sync.
        """
        dtype = self.strategy.input_dtype(self)
        if dtype is None:
            yield
            return
        only = (torch.float32, torch.float64)

        def cast(module: nn.Module, args: Any, kwargs: Any) -> Any:
            return cast_floating(args, dtype, only=only), cast_floating(kwargs, dtype, only=only)

        hook = self.model.register_forward_pre_hook(cast, with_kwargs=True)
        try:
            yield
        finally:
            hook.remove()

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``, the loss multiplied by the scale when loss scaling is on
        (for gradient accumulation pass ``loss / accumulation_steps``). No host sync."""
        if self.scaler.is_enabled():
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> StepResult:
        """Unscale, check, (clip,) step ``optimizer`` (default :attr:`optimizer`) unless the grads
        are non-finite, update the scale, and run the mode's monitoring on the device (per-param
        grad norms and the underflow check with ``performance_monitoring`` and in ADAPTIVE mode).
        Clipping to ``config.max_grad_norm`` is fused with the unscale. Returns a
        :class:`StepResult`, true when the step was applied (lazily synced). Host syncs: see the
        module docstring. With ``config.capture``: only inside a step of :meth:`make_step`
        (``RuntimeError`` otherwise).
        """
        cfg = self.config
        if cfg.capture and not self._in_made_step:
            raise RuntimeError(
                "MixedPrecisionConfig.capture=True: MixedPrecisionManager.step() was called "
                "outside a captured step; write the whole step as a function and run it "
                "through manager.make_step(step_fn, example_inputs) (or set capture=False)")
        opt = optimizer if optimizer is not None else self.optimizer
        scaler, dev, adaptive = self.scaler, self.device, self.adaptive
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        # DTensor grads (FSDP2): the monitoring reads the local shards and sums over these
        shard_groups = []
        # (with gradient release the grads of all but the last bucket are gone: no monitoring)
        monitoring = cfg.performance_monitoring and self.release is None
        if monitoring or adaptive is not None:
            shard_groups = _dtensor.reduce_groups(_dtensor.specs_of(grads), True)
        enabled = scaler.is_enabled()
        scale = scaler.scale_tensor() if enabled else None
        scale_before = torch.ones((), device=dev) if scale is None else scale.clone()
        norms: Optional[list[Tensor]] = None
        monitor = monitoring and not cfg.max_grad_norm
        if grads and (adaptive is not None or monitor):
            with torch.no_grad():
                norms = _grad_norms(grads, shard_groups)
            if adaptive is not None:
                adaptive.record_grads(params, norms)
        zero = torch.zeros((), device=dev)
        underflow = zero
        if monitoring and grads:
            underflow = _underflow_flag(_dtensor.locals_of(grads), self.compute_dtype,
                                        cfg.underflow_threshold, dev, shard_groups)
        grad_norm: Optional[Tensor] = None
        if cfg.max_grad_norm:  # (a disabled scaler: torch's clip_grad_norm_)
            grad_norm = scaler.clip_grad_norm_(opt, cfg.max_grad_norm)
            if _dtensor.is_dtensor(grad_norm):  # torch's answer for DTensor grads
                grad_norm = grad_norm.full_tensor()
        elif norms is not None:
            with torch.no_grad():
                total = torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))
                grad_norm = total * scale_before.double().reciprocal().float()
        if enabled:
            scaler.step(opt)
            found = scaler.found_inf(opt).to(dev)  # no sync
            scaler.update(new_scale=self._fixed_scale)  # None: by the scale rule
            scale_after = scaler.scale_tensor()
            assert scale_after is not None
        else:
            opt.step()
            found = zero if grad_norm is None else (~torch.isfinite(grad_norm)).float()
            scale_after = torch.ones((), device=dev)
        self.steps += 1
        result = StepResult(found, scale_after, grad_norm, underflow, enabled)
        if adaptive is not None and self.adapt_in_step:
            self._adapt_window(result)
        return result

    def make_step(self, step_fn: Callable[..., Any], example_inputs: tuple[Any, ...],
                  **capture_kwargs: Any) -> Callable[..., Any]:
        """The training step ``step_fn`` as the manager runs it: ``step_fn`` itself, or with
        ``config.capture`` a callable running it through :func:`mixprec.capture_step` (over
        :attr:`optimizer`, :attr:`scaler` and :attr:`model`; one captured step, one CUDA graph,
        per input signature, all sharing one memory pool; on CPU eager after the same checks).

        ``step_fn(*inputs)`` is one whole step (``optimizer.zero_grad(set_to_none=False)``, the
        forward in :meth:`autocast`, :meth:`backward`, :meth:`step`) returning tensors, not host
        values. ``example_inputs``: a tuple of inputs on :attr:`device`, as the calls will pass
        them. ``capture_kwargs``: keyword arguments of :func:`~mixprec.capture_step`
        (``schedulers``, ``warmup``, ``clone_outputs``, ``pool``), and ``max_graphs`` (default
        4): the most input signatures captured (one more raises). What cannot be captured
        raises :class:`mixprec.capture.CaptureError` naming the setting. The callable counts
        :attr:`steps` (a replay runs no Python) and captures anew after a new scaler
        (:meth:`reset_scaler`) or policy (:meth:`load_plan_state`, :meth:`load_state_dict`).
        No host sync per call once captured.
        """
        if not self.config.capture:
            return step_fn
        return _MadeStep(self, step_fn, example_inputs, capture_kwargs)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last :meth:`step` was skipped (``False`` with a disabled scaler).
        One host sync unless the scaler already did."""
        return self.scaler.is_enabled() and self.scaler.step_was_skipped

    # ------------------------------------------------------------------ ADAPTIVE
    def _adapt_window(self, result: StepResult) -> None:
        if self._window is None:
            self._window = torch.zeros(2, device=self.device)
        self._window[0] += result.found_inf.to(self.device)
        self._window[1] = result.scale.float()
        if self.steps % self.config.logging_frequency == 0:
            overflows, scale = self._window.tolist()
            self._window.zero_()
            steps, self._window_start = self.steps - self._window_start, self.steps
            self.adapt(overflows, steps, scale)

    def adapt(self, overflows: float, steps: int, last_scale: float,
              step: Optional[int] = None) -> None:
        """ADAPTIVE: evaluate a window of ``steps`` optimizer steps, ``overflows`` of which
        overflowed, that ended with scale ``last_scale`` at optimizer step ``step`` (default
        :attr:`steps`); may promote a module or turn low precision on. A no-op in the other
        modes. One host sync."""
        if self.adaptive is not None:
            self.adaptive.evaluate(overflows, steps, last_scale,
                                   self.steps if step is None else step)

    # ------------------------------------------------------------------ state, stats
    def plan_state(self) -> dict[str, Any]:
        """The precision plan as checkpoints save it: ``decisions``, ``overrides``,
        ``root_precision`` and, in ADAPTIVE mode, ``fwd_counts`` / ``bwd_counts``."""
        state: dict[str, Any] = {"decisions": [dict(d) for d in self.adaptive_decisions],
                                 "overrides": dict(self.overrides),
                                 "root_precision": self.root_precision}
        if self.adaptive is not None:
            state["fwd_counts"] = self.adaptive.fwd_counts.cpu()
            state["bwd_counts"] = self.adaptive.bwd_counts.cpu()
        return state

    def load_plan_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`plan_state` (decisions, promotions); re-applies the policy."""
        self.adaptive_decisions = [dict(d) for d in state["decisions"]]
        self.overrides = dict(state["overrides"])
        root = state.get("root_precision")
        if root is not None:
            self.root_precision = root
            if self.strategy.dtype_follows_plan:
                self.compute_dtype = NAME_PREC.get(root, self.compute_dtype)
        self.install_policy()
        if "fwd_counts" in state and self.adaptive is not None:
            self.adaptive.load_counts(state["fwd_counts"], state["bwd_counts"])

    def state_dict(self) -> dict[str, Any]:
        """``format``, ``scaler`` (the GradScaler's state dict), ``adaptive``
        (:meth:`plan_state`), ``steps`` and ``config``: plain values and CPU tensors, for
        ``torch.load(weights_only=True)``. Not the model's and the optimizer's state dicts
        (save them as usual). One host sync."""
        return {"format": _MANAGER_FORMAT, "scaler": self.scaler.state_dict(),
                "adaptive": self.plan_state(), "steps": self.steps, "config": self.config.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (scaler, plan, step count; the manager keeps its own config).
        Everything is checked first: a bad state raises naming the key and changes nothing."""
        where = "MixedPrecisionManager.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: state must be a dict, got {type(state).__name__}")
        if state.get("format") != _MANAGER_FORMAT:
            raise ValueError(f"{where}: unknown format {state.get('format')!r}")
        keys = {"format", "scaler", "adaptive", "steps", "config"}
        if set(state) != keys:
            raise ValueError(f"{where}: missing keys {sorted(keys - set(state))}, unexpected "
                             f"keys {sorted(map(str, set(state) - keys))}")
        if state["scaler"]:
            self.scaler.check_state_dict(state["scaler"])
        check_plan(state["adaptive"], f"{where}: state['adaptive']")
        steps = state["steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"{where}: state['steps'] must be an int >= 0, got {steps!r}")
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.load_plan_state(state["adaptive"])
        self.steps = steps
        self._window = None
        self._window_start = self.steps

    def stats(self) -> dict[str, Any]:
        """``steps`` (calls of :meth:`step`), ``skipped_steps``, ``overflow_rate``,
        ``current_scale``, ``scale_increases``, ``scale_decreases``, ``last_overflow_step`` (the
        scaler's, see :class:`mixprec.ScalerStats`), ``loss_scaling``, ``compute_dtype``
        (:attr:`precision_name`), ``low_precision_modules``, ``fp8_modules`` (Float8 linears),
        ``mode``, ``adaptive_decisions``. One host sync."""
        sst = self.scaler.stats()
        return {"steps": self.steps, "skipped_steps": sst.skipped_steps,
                "overflow_rate": sst.overflow_rate,
                "current_scale": sst.scale if self.scaler.is_enabled() else 1.0,
                "scale_increases": sst.scale_increases, "scale_decreases": sst.scale_decreases,
                "last_overflow_step": sst.last_overflow_step, "loss_scaling": self.loss_scaling,
                "compute_dtype": self.precision_name,
                "low_precision_modules": self.low_precision_modules,
                "fp8_modules": len(self.fp8.modules) if self.fp8 is not None else 0,
                "mode": self.mode.value,
                "adaptive_decisions": [dict(d) for d in self.adaptive_decisions]}

    @property
    def precision_name(self) -> str:
        """What is in effect: ``"fp16"``, ``"bf16"``, ``"fp32"`` (also when the policy
        runs no module in low precision), or ``"fp8"`` at the FP8 level with at least one
        Float8 linear (the rest in bfloat16)."""
        if self.fp8 is not None and self.fp8.modules:
            return "fp8"
        if self.strategy.low_precision_modules() is not None and not self.low_precision_modules:
            return "fp32"  # SELECTIVE with no module selected
        return PREC_NAME.get(self.compute_dtype, "fp32")

    def describe(self) -> str:
        """``"<mode>, <precision>"``, e.g. ``"automatic, fp16"``, ``"manual, fp8 (tensorwise)"``."""
        if self.fp8 is not None and self.fp8.modules:
            return f"{self.mode.value}, fp8 ({self.fp8.recipe})"
        return f"{self.mode.value}, {self.precision_name}"


class _MadeStep:
    """The step of :meth:`MixedPrecisionManager.make_step` with ``config.capture``."""

    def __init__(self, manager: MixedPrecisionManager, fn: Callable[..., Any],
                 example_inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.manager, self.fn = manager, fn
        self.example_inputs = example_inputs
        self.max_graphs = int(kwargs.pop("max_graphs", 4))
        self.kwargs = kwargs
        self.captured: list[CapturedStep] = []  # one per input signature, one pool
        self._built_for: tuple[int, int, int] = (0, 0, 0)

    def _body(self, *inputs: Any) -> Any:
        self.manager._in_made_step = True
        try:
            return self.fn(*inputs)
        finally:
            self.manager._in_made_step = False

    def _step_for(self, inputs: tuple[Any, ...]) -> CapturedStep:
        m = self.manager
        key = (id(m.scaler), id(m.optimizer), m.plan_version)
        if key != self._built_for:
            if self.captured:
                logger.info("mixprec: capturing the step anew (new scaler, optimizer or "
                            "policy)")
            self.captured, self._built_for = [], key
        for step in self.captured:
            if step.accepts(*inputs):
                return step
        if len(self.captured) >= self.max_graphs:
            raise CaptureError(f"a new input signature would need captured step "
                               f"{len(self.captured) + 1}, but max_graphs={self.max_graphs}; "
                               "pad or bucket the inputs, or raise max_graphs")
        kwargs = dict(self.kwargs)
        if self.captured:
            kwargs["pool"] = self.captured[0].pool
        example = inputs if self.captured else self.example_inputs
        step = capture_step(self._body, example, optimizers=[m.optimizer], scaler=m.scaler,
                            modules=[m.model], **kwargs)
        self.captured.append(step)
        return step if step.accepts(*inputs) else self._step_for(inputs)

    def __call__(self, *inputs: Any) -> Any:
        m = self.manager
        steps = m.steps
        try:
            out = self._step_for(inputs)(*inputs)
        except CaptureError as e:  # (the setting named, the cause kept)
            raise CaptureError(f"MixedPrecisionConfig.capture=True: {e}") from e
        m.steps = steps + 1
        return out
