"""``mixprec.GradScaler``: a drop-in, faster :class:`torch.amp.GradScaler`.

It *is* a :class:`torch.amp.GradScaler` (a subclass, so ``isinstance`` checks in
Lightning, Accelerate, transformers... still pass) with the same constructor,
the same public methods, the same private attributes and hooks that frameworks
read or call (``_scale``, ``_growth_tracker``, ``_per_optimizer_states``,
``_enabled``, ``_device``, ``_init_scale``, ``_unscale_grads_``,
``_lazy_init_scale_growth_tracker``, ``_check_inf_per_device``,
``_found_inf_per_device``, ``_maybe_opt_step``), the same state machine and the
same exception types and messages. What changes:

* unscaling and the inf/NaN check run as **one** :func:`mixprec.ops.unscale_and_check_`
  call per device for all of an optimizer's gradients, whatever their dtypes
  (float32, float16, bfloat16 and float64 together; torch launches one op per
  dtype and rejects bfloat16 on CUDA);
* optimizers that unscale inside their own kernel (``_step_supports_amp_scaling``,
  e.g. torch's ``fused=True`` optimizers) get their inf check from the read-only
  :func:`mixprec.ops.check_finite_` instead of an unscale by 1.0 that rewrites
  every gradient; they receive ``grad_scale``/``found_inf`` as torch passes them
  and nothing syncs with the host;
* the scale update is the device-side :func:`mixprec.ops.update_scale_` (bitwise
  ``torch._amp_update_scale_``) or, with hysteresis or bounds,
  :func:`mixprec.ops.update_scale_ext_`.

And it adds: ``allow_fp16_grads``, ``min_scale``/``max_scale``/``hysteresis``,
``policy="torch" | "deepspeed" | "megatron"``, :meth:`GradScaler.clip_grad_norm_`
(unscale + check + norm in one pass), :meth:`GradScaler.stats`,
:attr:`GradScaler.step_was_skipped` and ``process_group=``.

Host syncs: :meth:`~GradScaler.step` syncs once (one ``.item()`` per device, as
torch does) only for ordinary optimizers, whose step must be skipped on the
host; :meth:`~GradScaler.get_scale`, :meth:`~GradScaler.state_dict`,
:meth:`~GradScaler.stats`, :attr:`~GradScaler.step_was_skipped` and pickling
read device values. Everything else is asynchronous.
"""

from __future__ import annotations

import inspect
import math
import warnings
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from .. import ops
from ..optim import flat as _flat
from .stats import ScalerStats, _StatsTracker

__all__ = ["GradScaler", "ScalePolicy", "POLICIES", "OptState"]

_TORCH_INIT_SCALE = 2.0**16
_TORCH_GROWTH_INTERVAL = 2000
_MISSING = object()


@dataclass(frozen=True)
class ScalePolicy:
    """The loss-scale rule of a training system, as :class:`GradScaler` presets.

    A preset supplies ``init_scale`` and ``growth_interval`` when the
    constructor's arguments are left at torch's defaults (``2.0**16`` and
    ``2000``), and ``hysteresis``/``min_scale``/``max_scale`` when they are
    left at ``None``; any other value you pass wins. Growth and backoff
    factors are 2.0 and 0.5 in all three systems.
    """

    name: str
    init_scale: float
    growth_interval: int
    hysteresis: int
    min_scale: Optional[float]
    max_scale: Optional[float]


#: The presets. Rules, in terms of :func:`mixprec.ops.update_scale_ext_`:
#:
#: ``"torch"`` -- ``torch.amp.GradScaler``: back off by 0.5 on every overflow,
#: grow by 2 after 2000 clean steps, no bounds, no hysteresis (bitwise
#: ``torch._amp_update_scale_``).
#:
#: ``"deepspeed"`` -- ``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler``
#: with DeepSpeed's fp16 config defaults (``initial_scale_power=16``,
#: ``loss_scale_window=1000``, ``hysteresis=2``, ``min_loss_scale=1``,
#: ``consecutive_hysteresis=False``): an overflow resets the growth window
#: (``last_overflow_iter = cur_iter``); while ``cur_hysteresis > 1`` it only
#: decrements it, otherwise ``scale = max(scale / 2, min_loss_scale)``; after
#: ``loss_scale_window`` clean iterations the scale doubles and hysteresis is
#: refilled. Differences: DeepSpeed raises when it would back off below
#: ``min_loss_scale`` with ``raise_error_at_min_scale`` (that needs a host sync;
#: here the scale stays at ``min_scale``), and ``consecutive_hysteresis=True``
#: is not modelled.
#:
#: ``"megatron"`` -- ``megatron.core.optimizer.grad_scaler.DynamicGradScaler``
#: with Megatron-LM's argument defaults (``--initial-loss-scale 2**32``,
#: ``--min-loss-scale 1``, ``--loss-scale-window 1000``, ``--hysteresis 2``):
#: on overflow ``growth_tracker = 0``, ``hysteresis_tracker -= 1`` and, if it is
#: ``<= 0``, ``scale = max(scale * 0.5, min_scale)``; after ``growth_interval``
#: clean steps ``scale *= 2`` and the hysteresis tracker is refilled.
#: Difference: a growth whose result would overflow float32 is skipped here.
POLICIES: dict[str, ScalePolicy] = {
    "torch": ScalePolicy("torch", 2.0**16, 2000, 1, None, None),
    "deepspeed": ScalePolicy("deepspeed", 2.0**16, 1000, 2, 1.0, None),
    "megatron": ScalePolicy("megatron", 2.0**32, 1000, 2, 1.0, None),
}

_STEP_SIG_CACHE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _step_takes_grad_scaler(step: Callable[..., Any]) -> bool:
    """Whether ``step`` has a ``grad_scaler`` parameter (cached per function)."""
    key = getattr(step, "__func__", step)
    try:
        return _STEP_SIG_CACHE[key]
    except (KeyError, TypeError):
        pass
    has = "grad_scaler" in inspect.signature(step).parameters
    try:
        _STEP_SIG_CACHE[key] = has
    except TypeError:  # not weak-referenceable: just don't cache
        pass
    return has


def _amp_definitely_not_available() -> bool:
    return bool(torch.cuda.amp.common.amp_definitely_not_available())


def _op_available(name: str) -> bool:
    """Whether ``mixprec.ops.<name>`` runs (compiled, or the reference without an extension)."""
    if not hasattr(ops, name):
        return False
    from ..ops._extension import has_extension

    return not has_extension() or hasattr(torch.ops.mixprec, name)


# Keys mixprec adds to a per-optimizer state of ``_per_optimizer_states`` when
# clip_grad_norm_ folds the clip into a mixprec optimizer's step: the grads
# still carry the scale (the optimizer unscales them), and the clip
# coefficient (0-dim float32 on the scale's device) to hand to the optimizer.
_DEFERRED_UNSCALE = "mixprec_deferred_unscale"
_CLIP_COEF = "mixprec_clip_coef"


class GradScaler(torch.amp.GradScaler):
    """Gradient scaler for mixed-precision training; a drop-in for :class:`torch.amp.GradScaler`.

    Use it exactly like torch's::

        scaler = mixprec.GradScaler("cuda")
        for x, y in data:
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)               # optional, e.g. for clipping
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)                   # skipped if grads hold inf/NaN
            scaler.update()
            if not scaler.step_was_skipped:          # optional; syncs
                lr_scheduler.step()

    or replace the ``unscale_`` + ``clip_grad_norm_`` pair by
    ``scaler.clip_grad_norm_(optimizer, 1.0)`` (one pass, no sync).

    Args:
        device: device type of the scale, ``"cuda"`` (default) or ``"cpu"``
            (any type torch accepts). As in torch, ``"cuda"`` without CUDA
            warns and disables the scaler.
        init_scale: initial scale (default ``2.0**16``).
        growth_factor: factor applied after ``growth_interval`` clean
            iterations; must be > 1 (``AssertionError`` otherwise, as torch).
        backoff_factor: factor applied on overflow; must be < 1.
        growth_interval: clean iterations between growths (default 2000).
        enabled: ``False`` makes every method a transparent no-op
            (:meth:`step` just calls ``optimizer.step``).

    Keyword-only extras (not in torch):
        allow_fp16_grads: accept float16 gradients instead of raising
            ``ValueError("Attempting to unscale FP16 gradients.")``. ``None``
            (default): accept them only for optimizers that keep float32 master
            weights (``optimizer.master_weights is True`` or
            ``optimizer._mixprec_master_weights is True``).
        min_scale, max_scale: bounds on the scale (finite, > 0). Backoff never
            goes below ``min_scale``, growth never above ``max_scale``.
        hysteresis: number of overflows tolerated before backing off, counted
            since the last growth (1 = back off on every overflow, torch).
        policy: ``"torch"`` (default), ``"deepspeed"`` or ``"megatron"``;
            see :data:`POLICIES` for the exact rules and their sources.
        process_group: a ``torch.distributed`` process group. When set, every
            inf check is all-reduced (max) over its ranks, so that all ranks of
            a sharded model skip the same steps and keep the same scale, and
            :meth:`clip_grad_norm_` reduces the norm over the ranks (the ranks
            are assumed to hold disjoint shards of the gradients). With NCCL
            this is asynchronous; every rank must call the same methods.

    State: ``_scale`` (float32 0-dim) and ``_growth_tracker`` (int32 0-dim) live
    on the device of the first tensor passed to :meth:`scale`, created lazily
    there; with hysteresis, ``_hysteresis_left`` (int32 0-dim) next to them.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        allow_fp16_grads: Optional[bool] = None,
        min_scale: Optional[float] = None,
        max_scale: Optional[float] = None,
        hysteresis: Optional[int] = None,
        policy: str = "torch",
        process_group: Optional[Any] = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(
                f"mixprec.GradScaler: policy must be one of {sorted(POLICIES)}, got {policy!r}"
            )
        preset = POLICIES[policy]
        if init_scale == _TORCH_INIT_SCALE:
            init_scale = preset.init_scale
        if growth_interval == _TORCH_GROWTH_INTERVAL:
            growth_interval = preset.growth_interval
        if hysteresis is None:
            hysteresis = preset.hysteresis
        if min_scale is None:
            min_scale = preset.min_scale
        if max_scale is None:
            max_scale = preset.max_scale
        _check_extras(allow_fp16_grads, min_scale, max_scale, hysteresis)

        self._device = device
        self._enabled = enabled
        if self._device == "cuda" and enabled and _amp_definitely_not_available():
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            self._enabled = False

        # mixprec's own state (present even when disabled).
        self._policy = policy
        self._allow_fp16_grads = allow_fp16_grads
        self._min_scale = None if min_scale is None else float(min_scale)
        self._max_scale = None if max_scale is None else float(max_scale)
        self._hysteresis = int(hysteresis)
        self._process_group = process_group
        self._init_hysteresis_left = self._hysteresis
        self._hysteresis_left: Optional[Tensor] = None
        self._mp_stats = _StatsTracker()
        self._mp_host_found: dict[int, bool] = {}
        self._mp_last_found: Union[None, bool, Tensor] = None

        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale: Optional[Tensor] = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: Optional[Tensor] = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(
                _refresh_per_optimizer_state
            )

    # ------------------------------------------------------------------ properties
    @property
    def policy(self) -> str:
        """The preset this scaler was built with (``"torch"``, ``"deepspeed"``, ``"megatron"``)."""
        return self._policy

    @property
    def process_group(self) -> Optional[Any]:
        """The ``torch.distributed`` group inf checks are reduced over, or ``None``."""
        return self._process_group

    @property
    def hysteresis(self) -> int:
        """Overflows tolerated (since the last growth) before backing off; 1 = torch."""
        return self._hysteresis

    @property
    def min_scale(self) -> Optional[float]:
        """Lower bound of the scale, or ``None``."""
        return self._min_scale

    @property
    def max_scale(self) -> Optional[float]:
        """Upper bound of the scale, or ``None``."""
        return self._max_scale

    def _uses_ext_rule(self) -> bool:
        return self._hysteresis != 1 or self._min_scale is not None or self._max_scale is not None

    # ------------------------------------------------------------------ lazy state
    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """Create ``_scale``/``_growth_tracker`` (and ``_hysteresis_left``) on ``dev``."""
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full(
            (), self._init_growth_tracker, dtype=torch.int32, device=dev
        )
        if self._uses_ext_rule():
            self._hysteresis_left = torch.full(
                (), self._init_hysteresis_left, dtype=torch.int32, device=dev
            )

    def _get_hysteresis_left(self) -> int:
        if self._hysteresis_left is None:
            return self._init_hysteresis_left
        return int(self._hysteresis_left.item())

    # ------------------------------------------------------------------ gradients
    def _fp16_grads_allowed(self, optimizer: torch.optim.Optimizer) -> bool:
        if self._allow_fp16_grads is not None:
            return self._allow_fp16_grads
        return (
            getattr(optimizer, "master_weights", False) is True
            or getattr(optimizer, "_mixprec_master_weights", False) is True
        )

    def _collect_grads(
        self, optimizer: torch.optim.Optimizer, allow_fp16: bool, coalesce_sparse: bool = False
    ) -> dict[torch.device, list[Tensor]]:
        """The optimizer's gradients (values of sparse ones) grouped by device.

        Float16 sparse gradients are coalesced first (replacing ``param.grad``),
        as torch does, since summing duplicate indices can overflow; with
        ``coalesce_sparse`` every sparse gradient is.
        """
        per_device: dict[torch.device, list[Tensor]] = {}
        allow_fp16 = allow_fp16 or self._fp16_grads_allowed(optimizer)
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, Tensor):
                    raise AssertionError(
                        f"expected param to be torch.Tensor, got {type(param).__name__}"
                    )
                grad = param.grad
                if grad is None:
                    continue
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if grad.is_sparse:
                    if coalesce_sparse or grad.dtype is torch.float16:
                        grad = grad.coalesce()
                        param.grad = grad
                    grad = grad._values()
                bucket = per_device.get(grad.device)
                if bucket is None:
                    per_device[grad.device] = [grad]
                else:
                    bucket.append(grad)
        return _flat.coalesce_grads(per_device)  # flat-buffer mode: one slice per run

    def _reduce_found_inf(
        self, per_device: dict[torch.device, Tensor], home: torch.device
    ) -> dict[torch.device, Tensor]:
        """All-reduce the inf flags over ``process_group`` (identity without one).

        With a group, the result is a single flag on ``home`` (zero when this
        rank has no gradients, so that every rank joins the collective).
        """
        if self._process_group is None:
            return per_device
        import torch.distributed as dist

        flags = list(per_device.values())
        if not flags:
            combined = torch.zeros((), dtype=torch.float32, device=home)
        else:
            combined = flags[0].to(home)
            for f in flags[1:]:
                combined = combined + f.to(home)
        dist.all_reduce(combined, op=dist.ReduceOp.MAX, group=self._process_group)
        return {home: combined}

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: Tensor,
        found_inf: Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, Tensor]:
        """Unscale ``optimizer``'s grads in place and check them for inf/NaN.

        One :func:`mixprec.ops.unscale_and_check_` call per device, all dtypes
        together. ``inv_scale``/``found_inf``: float32 0-dim tensors on one
        device; grads on other devices get copies of them. Unlike torch, the
        ``found_inf`` passed in is itself used (and set) for the grads on its own
        device instead of a copy. Returns ``{device: found_inf on that device}``
        (reduced over ``process_group`` when set). No host sync.
        """
        per_device = self._collect_grads(optimizer, allow_fp16)
        home = found_inf.device
        flags: dict[torch.device, Tensor] = {}
        with torch.no_grad():
            # copies first, so they all start from the caller's (unset) flag
            targets = {
                dev: (
                    (found_inf, inv_scale)
                    if dev == home
                    else (
                        found_inf.to(dev, non_blocking=True, copy=True),
                        inv_scale.to(dev, non_blocking=True, copy=True),
                    )
                )
                for dev in per_device
            }
            for dev, grads in per_device.items():
                flag, inv = targets[dev]
                ops.unscale_and_check_(grads, flag, inv)
                flags[dev] = flag
            return self._reduce_found_inf(flags, home)

    def _inv_scale(self) -> Tensor:
        assert self._scale is not None
        # 1/scale taken in float64 then rounded, as torch does (except on MPS).
        if self._scale.device == torch.device("mps:0"):
            return self._scale.reciprocal()
        return self._scale.double().reciprocal().float()

    def _check_unscalable(self, optimizer: torch.optim.Optimizer, what: str) -> dict[str, Any]:
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                f"{what}() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError(f"{what}() is being called after step().")
        return state

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and check them.

        Optional: call it between ``backward()`` and :meth:`step` to work on
        real gradient values (clipping, logging). At most once per optimizer
        per iteration (``RuntimeError`` otherwise, as torch). Float16 sparse
        gradients are coalesced (``param.grad`` replaced). Gradients of all
        dtypes on one device are processed by one fused op call. No host sync.
        """
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._check_unscalable(optimizer, "unscale_")
        assert self._scale is not None
        found_inf = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(
            optimizer, self._inv_scale(), found_inf, False
        )
        state["stage"] = OptState.UNSCALED

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Check ``optimizer``'s grads for inf/NaN without unscaling them.

        For optimizers that unscale inside their own step. Read-only on the
        grads (torch instead unscales by 1.0, rewriting them). Records and
        returns ``{device: found_inf}``. No host sync.
        """
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        per_device = self._collect_grads(optimizer, True)
        flags: dict[torch.device, Tensor] = {}
        with torch.no_grad():
            for dev, grads in per_device.items():
                flag = torch.zeros((), dtype=torch.float32, device=dev)
                ops.check_finite_(grads, flag)
                flags[dev] = flag
        result = self._reduce_found_inf(flags, scale.device)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = result
        return result  # type: ignore[return-value]

    # ------------------------------------------------------------------ stepping
    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Optional[float]:
        """Call ``optimizer.step(*args, **kwargs)`` unless an inf was found.

        Syncs: one ``.item()`` per device the optimizer's grads live on.
        """
        found = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
        self._mp_host_found[id(optimizer)] = bool(found)
        if not found:
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[float]:
        """Unscale (unless :meth:`unscale_` ran) and step ``optimizer`` if the grads are finite.

        ``args``/``kwargs`` go to ``optimizer.step`` (looked up on the
        optimizer at call time) and its return value is returned (``None`` when
        the step is skipped). A ``closure`` keyword is rejected while enabled.

        Optimizers with ``_step_supports_amp_scaling = True`` are always
        stepped: they get ``optimizer.grad_scale`` (the scale, or ``None`` if
        the grads were already unscaled; multiplied by a ``grad_scale`` you set
        beforehand) and ``optimizer.found_inf`` (float32 0-dim) for the duration
        of the call, and skip the update themselves -- no host sync. Others:
        one host sync to decide the skip, as in torch.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_amp_aware(optimizer, state, args, kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def _step_amp_aware(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Optional[float]:
        if _step_takes_grad_scaler(optimizer.step):
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
                "directly.",
                FutureWarning,
                stacklevel=3,
            )
            kwargs["grad_scaler"] = self
            retval = optimizer.step(*args, **kwargs)
            state["stage"] = OptState.STEPPED
            return retval

        if state["stage"] is OptState.READY:
            self._check_inf_per_device(optimizer)
        scale = self._get_scale_async()
        if scale is None:
            raise AssertionError("_get_scale_async returned None")
        flags = list(state["found_inf_per_device"].values())
        found_inf: Union[int, Tensor]
        if not flags:
            found_inf = 0
        elif len(flags) == 1 and flags[0].device == scale.device:
            found_inf = flags[0]
        else:
            found_inf = flags[0].to(scale.device, non_blocking=True)
            for f in flags[1:]:
                found_inf = found_inf + f.to(scale.device, non_blocking=True)
        preset = getattr(optimizer, "grad_scale", _MISSING)
        if state["stage"] is OptState.UNSCALED and not state.get(_DEFERRED_UNSCALE, False):
            grad_scale = None if preset is _MISSING else preset
        else:
            grad_scale = scale if preset is _MISSING else scale * preset
        set_names = ["grad_scale", "found_inf"]
        optimizer.grad_scale = grad_scale  # type: ignore[attr-defined]
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        clip_coef = state.get(_CLIP_COEF)
        if clip_coef is not None:
            user_coef = optimizer.__dict__.get("clip_coef")
            optimizer.clip_coef = (  # type: ignore[attr-defined]
                clip_coef if user_coef is None else clip_coef * user_coef
            )
            set_names.append("clip_coef")
        try:
            retval = optimizer.step(*args, **kwargs)
            state["stage"] = OptState.STEPPED
        finally:
            for name in set_names:
                if name in optimizer.__dict__:
                    delattr(optimizer, name)
            if clip_coef is not None and user_coef is not None:
                optimizer.clip_coef = user_coef  # type: ignore[attr-defined]
        return retval

    # ------------------------------------------------------------------ clipping
    def clip_grad_norm_(
        self,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        *,
        fold_into_step: bool = True,
    ) -> Tensor:
        """Unscale, check and clip ``optimizer``'s gradients; return their total norm.

        Equivalent to ``scaler.unscale_(optimizer)`` followed by
        ``torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`` over
        the optimizer's parameters, but the unscale, the inf/NaN check and the
        norm are **one** pass over the gradients
        (:func:`mixprec.ops.unscale_and_norm_`, one call per device), and
        nothing syncs with the host. If :meth:`unscale_` already ran this
        iteration, only the norm and the clipping are done. Counts as this
        iteration's :meth:`unscale_` (calling ``unscale_`` afterwards raises).

        With a :mod:`mixprec.optim` optimizer (and ``fold_into_step=True``)
        the clip is folded into the optimizer's fused step instead: this pass
        only **reads** the grads (:func:`mixprec.ops.check_finite_and_norm_`),
        and :meth:`step` hands the optimizer ``grad_scale`` and the clip
        coefficient ``min(1, max_norm / (norm + 1e-6))``, which its kernel
        applies while it reads the grads anyway -- one read of the grads
        instead of a read-write unscale pass, a read-write clip pass and the
        optimizer's read. ``param.grad`` is then left as backward produced it
        (scaled, unclipped); pass ``fold_into_step=False`` if you need the
        clipped, unscaled gradients in ``param.grad``. The update equals the
        unfolded one within float32 rounding (the fold unscales and clips each
        grad in float32 without rounding it to the grad's dtype in between).

        Sparse gradients are coalesced (``param.grad`` replaced) so that their
        norm is that of the tensor. With ``process_group``, the norm is reduced
        over the ranks (disjoint shards assumed). When the gradients hold
        inf/NaN the norm is inf/NaN (the step will be skipped anyway).

        Args:
            optimizer: its ``param_groups`` give the parameters.
            max_norm: maximum norm after clipping.
            norm_type: ``p`` of the p-norm, ``float("inf")`` for the max norm.
            fold_into_step: fold the unscale and the clip into the step of an
                optimizer that supports it (mixprec's); ignored for others.

        Returns:
            The total norm before clipping, a float32 0-dim tensor on the
            scale's device (on a disabled scaler: what torch's
            ``clip_grad_norm_`` returns).
        """
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if not self._enabled:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        scale, _ = self._check_scale_growth_tracker("clip_grad_norm_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("clip_grad_norm_() is being called after step().")
        norm_type = float(norm_type)
        home = scale.device
        fold = (
            fold_into_step
            and getattr(optimizer, "_mixprec_folds_clip_coef", False)
            and norm_type > 0
            and _op_available("check_finite_and_norm_")
            and not any(p.grad is not None and p.grad.is_sparse for p in params)
        )
        deferred = state.get(_DEFERRED_UNSCALE, False)
        total: Optional[Tensor] = None
        if fold and (state["stage"] is OptState.READY or deferred):
            # Read-only pass: found_inf and the norm of grad * inv_scale.
            per_device = self._collect_grads(optimizer, False)
            flags, total = self._norm_pass(per_device, ops.check_finite_and_norm_, norm_type)
            if not deferred:
                state["found_inf_per_device"] = self._reduce_found_inf(flags, home)
                state["stage"] = OptState.UNSCALED
                state[_DEFERRED_UNSCALE] = True
        elif (
            state["stage"] is OptState.READY
            and norm_type > 0
            and _op_available("unscale_and_norm_")
        ):
            per_device = self._collect_grads(optimizer, False, coalesce_sparse=True)
            flags, total = self._norm_pass(per_device, ops.unscale_and_norm_, norm_type)
            state["found_inf_per_device"] = self._reduce_found_inf(flags, home)
            state["stage"] = OptState.UNSCALED
        else:
            if state["stage"] is OptState.READY:
                for p in params:
                    if p.grad is not None and p.grad.is_sparse:
                        p.grad = p.grad.coalesce()
                self.unscale_(optimizer)
            grads = [p.grad for p in params if p.grad is not None]
            with torch.no_grad():
                if grads:
                    total = _total_norm(grads, norm_type).to(home, torch.float32)
                else:
                    total = torch.zeros((), dtype=torch.float32, device=home)
        if self._process_group is not None:
            total = _all_reduce_norm(total, norm_type, self._process_group)
        pending: Optional[Tensor] = state.get(_CLIP_COEF)
        if pending is not None:
            # An earlier folded clip of this iteration: the grads it would have
            # produced are the current ones times its coefficient.
            total = total * pending
        if fold:
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            state[_CLIP_COEF] = coef if pending is None else pending * coef
        else:
            _clip_with_norm(params, max_norm, total)
        return total

    def _norm_pass(
        self,
        per_device: dict[torch.device, list[Tensor]],
        op: Callable[[list[Tensor], Tensor, Tensor, float], Tensor],
        norm_type: float,
    ) -> tuple[dict[torch.device, Tensor], Tensor]:
        """One ``op`` call per device (a norm op of :mod:`mixprec.ops`) with a fresh inf flag.

        Returns the per-device flags and the total norm (float32, 0-dim, on the
        scale's device). No host sync.
        """
        inv_scale = self._inv_scale()
        home = inv_scale.device
        flags: dict[torch.device, Tensor] = {}
        norms: list[Tensor] = []
        with torch.no_grad():
            for dev, grads in per_device.items():
                flag = torch.zeros((), dtype=torch.float32, device=dev)
                inv = inv_scale if dev == home else inv_scale.to(dev, non_blocking=True)
                norms.append(op(grads, flag, inv, norm_type).to(home))
                flags[dev] = flag
        if not norms:
            total = torch.zeros((), dtype=torch.float32, device=home)
        elif len(norms) == 1:
            total = norms[0]
        else:
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        return flags, total

    # ------------------------------------------------------------------ update
    def update(self, new_scale: Union[float, Tensor, None] = None) -> None:
        """End the iteration: update the scale from this iteration's inf checks.

        Back off on overflow, grow after ``growth_interval`` clean iterations
        (with the hysteresis/bounds of the policy), all on the device with no
        host sync; or set the scale to ``new_scale`` (a float, or a one-element
        tensor on the scale's device type without ``requires_grad``; copied).
        Call it once per iteration, after :meth:`step` for every optimizer.
        """
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        if self._mp_stats.needs_baseline():
            self._mp_stats.set_baseline(scale.clone())
        found: Optional[Tensor]
        if new_scale is not None:
            if isinstance(new_scale, float):
                scale.fill_(new_scale)
            else:
                reason = (
                    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                    "torch.FloatTensor with requires_grad=False."
                )
                if new_scale.device.type != self._device:
                    raise AssertionError(reason)
                if new_scale.numel() != 1:
                    raise AssertionError(reason)
                if new_scale.requires_grad is True:
                    raise AssertionError(reason)
                scale.copy_(new_scale)
            flags = [
                f.to(scale.device, non_blocking=True)
                for s in self._per_optimizer_states.values()
                for f in s["found_inf_per_device"].values()
            ]
            found = None if not flags else torch.stack(flags).sum()
        else:
            flags = [
                f.to(device=scale.device, non_blocking=True)
                for s in self._per_optimizer_states.values()
                for f in s["found_inf_per_device"].values()
            ]
            if not flags:
                raise AssertionError("No inf checks were recorded prior to update.")
            found = flags[0]
            for f in flags[1:]:
                found += f
            if self._uses_ext_rule():
                if self._hysteresis_left is None:
                    self._hysteresis_left = torch.full(
                        (), self._init_hysteresis_left, dtype=torch.int32, device=scale.device
                    )
                ops.update_scale_ext_(
                    scale,
                    tracker,
                    self._hysteresis_left,
                    found,
                    self._growth_factor,
                    self._backoff_factor,
                    self._growth_interval,
                    self._min_scale,
                    self._max_scale,
                    self._hysteresis,
                )
            else:
                ops.update_scale_(
                    scale,
                    tracker,
                    found,
                    self._growth_factor,
                    self._backoff_factor,
                    self._growth_interval,
                )
        self._record_iteration(found)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _record_iteration(self, found: Optional[Tensor]) -> None:
        assert self._scale is not None
        checked = [k for k, s in self._per_optimizer_states.items() if s["found_inf_per_device"]]
        if found is None:
            self._mp_last_found = False
        elif checked and all(k in self._mp_host_found for k in checked):
            self._mp_last_found = any(self._mp_host_found[k] for k in checked)
        else:
            self._mp_last_found = found
        self._mp_host_found = {}
        self._mp_stats.record(found, self._scale.clone())

    # ------------------------------------------------------------------ extras
    @property
    def step_was_skipped(self) -> bool:
        """Whether the optimizer steps of the last completed iteration were skipped.

        "Completed" means closed by :meth:`update`; ``False`` before the first
        update and on a disabled scaler. Use it to step LR schedulers only
        after real steps. Free when :meth:`step` already synced for ordinary
        optimizers; otherwise one host sync (then cached).
        """
        if not self._enabled:
            return False
        last = self._mp_last_found
        if isinstance(last, Tensor):
            last = bool(last.item() != 0)
            self._mp_last_found = last
        return bool(last)

    def stats(self) -> ScalerStats:
        """Counters since construction (see :class:`mixprec.stats.ScalerStats`).

        Counted on the device at every :meth:`update` (no sync there); this
        call reads them back: one host sync. Zeros on a disabled scaler.
        """
        if not self._enabled:
            return ScalerStats(0, 0, 0.0, 0, 0, 1.0, None)
        steps, skipped, inc, dec, last = self._mp_stats.read()
        return ScalerStats(
            steps=steps,
            skipped_steps=skipped,
            overflow_rate=(skipped / steps) if steps else 0.0,
            scale_increases=inc,
            scale_decreases=dec,
            scale=self.get_scale(),
            last_overflow_step=last,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """torch's state dict: ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` as plain float/int (``{}`` when
        disabled); loadable by torch's scaler and by ``torch.load(weights_only=True)``.

        With a hysteresis rule (``hysteresis > 1``) one more int,
        ``"_hysteresis_left"``, so resuming is exact (torch's scaler ignores it).
        Syncs (reads the scale).
        """
        out = super().state_dict()
        if self._enabled and self._hysteresis != 1:
            out["_hysteresis_left"] = self._get_hysteresis_left()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from this class or from :class:`torch.amp.GradScaler`.

        No-op when disabled; ``RuntimeError`` for an empty dict (as torch).
        Without ``"_hysteresis_left"`` the hysteresis budget is refilled.
        """
        if not self._enabled:
            return
        super().load_state_dict(state_dict)
        left = int(state_dict.get("_hysteresis_left", self._hysteresis))
        self._init_hysteresis_left = left
        if self._hysteresis_left is not None:
            self._hysteresis_left.fill_(left)
        self._mp_stats.rebaseline()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_hysteresis_left"] = self._get_hysteresis_left()
            state["_hysteresis_left"] = None
        last = state.get("_mp_last_found")
        if isinstance(last, Tensor):
            state["_mp_last_found"] = bool(last.item() != 0)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Also accepts the state of a torch.amp.GradScaler (unpickled as
        # mixprec's under patch_torch()): fill in mixprec's attributes.
        defaults: dict[str, Any] = {
            "_policy": "torch",
            "_allow_fp16_grads": None,
            "_min_scale": None,
            "_max_scale": None,
            "_hysteresis": 1,
            "_process_group": None,
            "_init_hysteresis_left": 1,
            "_hysteresis_left": None,
            "_mp_host_found": {},
            "_mp_last_found": None,
        }
        for key, value in defaults.items():
            state.setdefault(key, value)
        if "_mp_stats" not in state:
            state["_mp_stats"] = _StatsTracker()
        self.__dict__.update(state)


# ---------------------------------------------------------------------- helpers
def _check_extras(
    allow_fp16_grads: Optional[bool],
    min_scale: Optional[float],
    max_scale: Optional[float],
    hysteresis: int,
) -> None:
    if allow_fp16_grads is not None and not isinstance(allow_fp16_grads, bool):
        raise TypeError(
            "mixprec.GradScaler: allow_fp16_grads must be None, True or False, got "
            f"{allow_fp16_grads!r}"
        )
    if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 1:
        raise ValueError(f"mixprec.GradScaler: hysteresis must be an int >= 1, got {hysteresis!r}")
    for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
        if value is not None and not (0.0 < float(value) < math.inf):
            raise ValueError(f"mixprec.GradScaler: {name} must be finite and > 0, got {value!r}")
    if min_scale is not None and max_scale is not None and min_scale > max_scale:
        raise ValueError(
            f"mixprec.GradScaler: min_scale ({min_scale}) must not exceed max_scale ({max_scale})"
        )


def _total_norm(grads: list[Tensor], norm_type: float) -> Tensor:
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(grads, norm_type)
    norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]  # torch < 2.6
    first = norms[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type)


def _clip_with_norm(params: list[Tensor], max_norm: float, total: Tensor) -> None:
    """Scale grads by ``min(1, max_norm / (total + 1e-6))`` as torch's clipping does."""
    clip = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
    if clip is not None:
        clip(params, max_norm, total)
        return
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch < 2.6
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef.to(p.grad.device))


def _all_reduce_norm(total: Tensor, norm_type: float, group: Any) -> Tensor:
    import torch.distributed as dist

    if math.isinf(norm_type):
        out = total.clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
        return out
    powered = total.double().pow(norm_type)
    dist.all_reduce(powered, op=dist.ReduceOp.SUM, group=group)
    return powered.pow(1.0 / norm_type).float()
