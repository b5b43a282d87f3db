"""``mixprec.GradScaler``: a drop-in, faster :class:`torch.amp.GradScaler`.

A subclass with torch's constructor, methods, state machine, exceptions and the private
attributes and hooks frameworks use; it overrides only what differs. The parts: :mod:`.grads`
(one fused op per device), :mod:`.capability` and :mod:`.protocol` (how an optimizer is
stepped), :mod:`.policies` (scale rules), :mod:`.clipping`.

Host syncs: :meth:`~GradScaler.step` syncs once per device only for ordinary optimizers (as
torch); :meth:`~GradScaler.get_scale`, :meth:`~GradScaler.state_dict`,
:meth:`~GradScaler.stats`, :attr:`~GradScaler.step_was_skipped` and pickling read device
values. Everything else is asynchronous.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from . import capability, grads, protocol
from ._pickling import complete_state
from .clipping import ClipAccess, clip_grad_norm
from .policies import POLICIES, ScalePolicy, ScaleRule, apply_scale_rule, resolve_options
from .protocol import IterationRecord, record_of
from .stats import ScalerStats, _StatsTracker

__all__ = ["GradScaler", "ScalePolicy", "POLICIES", "OptState"]

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _refuse_released(optimizer: Any, what: str) -> None:
    """An optimizer whose gradients are released (it declares ``gradients_released``:
    ``mixprec.optim.release_gradients``) cannot be unscaled or stepped by an enabled scaler."""
    if getattr(optimizer, "gradients_released", False):
        raise RuntimeError(
            f"mixprec.GradScaler.{what}: the optimizer's gradients are released "
            "(mixprec.optim.release_gradients): its params were already stepped during "
            "backward with the scaled gradients, and an overflow cannot be undone; loss "
            "scaling cannot be combined with gradient release: train in bfloat16 without a "
            "scaler, or remove the release (and restore the params from a checkpoint)")


def check_device(device: Any, who: str = "mixprec.GradScaler") -> None:
    """``ValueError`` naming ``who`` unless ``device`` is a device string torch parses."""
    try:
        ok = isinstance(device, str) and torch.device(device) is not None
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{who}: device must be a device type such as 'cuda' or 'cpu', "
                         f"got {device!r}")


def _check_scale_options(where: str, *, error: type = ValueError, key: str = "{}",
                         **values: Any) -> None:
    """The ranges the constructor takes (``key`` formats the name in the message). Factors
    out of range raise ``error`` (AssertionError in the constructor, as torch); other bad
    values ValueError or TypeError."""
    for name, v in values.items():
        shown = key.format(name)
        if name in ("growth_interval", "_growth_tracker", "_hysteresis_left"):
            low = 1 if name == "growth_interval" else 0
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{where}: {shown} must be an int, got {type(v).__name__} "
                                f"{v!r}")
            if v < low:
                raise ValueError(f"{where}: {shown} must be >= {low}, got {v}")
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{where}: {shown} must be a float, got {type(v).__name__} {v!r}")
        if name in ("scale", "init_scale") and not (0.0 < v < math.inf):
            raise ValueError(f"{where}: {shown} must be finite and > 0, got {v!r}")
        if name == "growth_factor" and not (1.0 < v < math.inf):
            raise error(f"{where}: {shown} must be finite and > 1.0, got {v!r} "
                        "(The growth factor must be > 1.0.)")
        if name == "backoff_factor" and not (0.0 < v < 1.0):
            raise error(f"{where}: {shown} must be in (0, 1), got {v!r} "
                        "(The backoff factor must be < 1.0.)")


def _read_only(attr: str, doc: str) -> property:
    return property(lambda self: getattr(self, attr), doc=doc)


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
        device: device type of the scale, ``"cuda"`` (default) or ``"cpu"`` (any type torch
            accepts). ``"cuda"`` without CUDA warns and disables the scaler, as torch.
        init_scale: initial scale (default ``2.0**16``).
        growth_factor: applied after ``growth_interval`` clean iterations; must be > 1
            (``AssertionError`` otherwise, as torch).
        backoff_factor: applied on overflow; must be < 1.
        growth_interval: clean iterations between growths (default 2000).
        enabled: ``False`` makes every method a no-op (:meth:`step` calls ``optimizer.step``).

    Keyword-only extras (not in torch):
        allow_fp16_grads: accept float16 grads instead of raising
            ``ValueError("Attempting to unscale FP16 gradients.")``. ``None`` (default):
            only for optimizers with float32 masters (``optimizer.master_weights is True``
            or ``optimizer._mixprec_master_weights is True``).
        min_scale, max_scale: bounds on the scale (finite, > 0).
        hysteresis: overflows tolerated since the last growth before backing off (1: torch).
        policy: ``"torch"`` (default), ``"deepspeed"`` or ``"megatron"`` (:data:`POLICIES`).
        process_group: a ``torch.distributed`` group: every inf check is all-reduced (max)
            over it, so all ranks skip the same steps, and :meth:`clip_grad_norm_` reduces
            the norm (disjoint shards assumed). Every rank must call the same methods.

    State: ``_scale`` (float32 0-dim), ``_growth_tracker`` (int32 0-dim) and, with
    hysteresis, ``_hysteresis_left`` (int32 0-dim), created lazily on the device of the
    first tensor passed to :meth:`scale`.
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
        check_device(device)
        _check_scale_options("mixprec.GradScaler", init_scale=init_scale,
                             growth_interval=growth_interval)
        options = resolve_options(
            policy, init_scale, growth_interval, allow_fp16_grads, min_scale, max_scale, hysteresis
        )
        init_scale, growth_interval = options.init_scale, options.growth_interval
        self._device = device
        self._enabled = enabled
        if (self._device == "cuda" and enabled
                and torch.cuda.amp.common.amp_definitely_not_available()):
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            self._enabled = False
        self._policy = policy
        self._allow_fp16_grads = allow_fp16_grads
        self._min_scale = options.min_scale
        self._max_scale = options.max_scale
        self._hysteresis = options.hysteresis
        self._process_group = process_group
        self._init_hysteresis_left = self._hysteresis
        self._hysteresis_left: Optional[Tensor] = None
        self._mp_stats = _StatsTracker()
        self._mp_last: Optional[IterationRecord] = None

        if self._enabled:
            _check_scale_options("mixprec.GradScaler", error=AssertionError,
                                 growth_factor=growth_factor, backoff_factor=backoff_factor)
            self._init_scale = init_scale
            self._scale: Optional[Tensor] = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: Optional[Tensor] = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(
                _refresh_per_optimizer_state)

    policy = _read_only("_policy", "The preset this scaler was built with (``POLICIES``).")
    process_group = _read_only("_process_group", "The group inf checks are reduced over, or None.")
    hysteresis = _read_only("_hysteresis", "Overflows tolerated before backing off; 1 = torch.")
    min_scale = _read_only("_min_scale", "Lower bound of the scale, or ``None``.")
    max_scale = _read_only("_max_scale", "Upper bound of the scale, or ``None``.")

    def scale_tensor(self) -> Optional[Tensor]:
        """The scale itself (0-dim float32, no sync; ``None`` when disabled or before the
        first :meth:`scale`). Read it, do not write it; :meth:`update` changes it in place."""
        return self._scale if self._enabled else None

    def iteration_open(self) -> bool:
        """Whether some optimizer was unscaled, checked or stepped since the last
        :meth:`update`. No host sync."""
        return any(map(protocol.was_checked, self._per_optimizer_states.values()))

    def fresh(self, init_scale: Optional[float] = None) -> GradScaler:
        """A new scaler with this one's current settings (factors as torch's setters left
        them, and the extras) and a fresh state starting at ``init_scale`` (default: this
        one's initial scale). This scaler is not modified."""
        if init_scale is None:
            init_scale = getattr(self, "_init_scale", 2.0**16)
        return GradScaler(
            self._device, init_scale, getattr(self, "_growth_factor", 2.0),
            getattr(self, "_backoff_factor", 0.5), getattr(self, "_growth_interval", 2000),
            self._enabled, allow_fp16_grads=self._allow_fp16_grads, min_scale=self._min_scale,
            max_scale=self._max_scale, hysteresis=self._hysteresis, policy=self._policy,
            process_group=self._process_group)

    def _scale_rule(self) -> ScaleRule:
        """The scale-update rule as it stands (torch's setters change its factors)."""
        return ScaleRule(self._growth_factor, self._backoff_factor, self._growth_interval,
                         self._min_scale, self._max_scale, self._hysteresis)

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """torch's lazy ``_scale``/``_growth_tracker``, and ``_hysteresis_left`` next to them."""
        super()._lazy_init_scale_growth_tracker(dev)
        if self._scale_rule().extended:
            self._hysteresis_left = torch.full((), self._init_hysteresis_left,
                                               dtype=torch.int32, device=dev)

    def _get_hysteresis_left(self) -> int:
        if self._hysteresis_left is None:
            return self._init_hysteresis_left
        return int(self._hysteresis_left.item())

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: Tensor,
                        found_inf: Tensor, allow_fp16: bool) -> dict[torch.device, Tensor]:
        """torch's hook behind :meth:`unscale_`: :func:`mixprec.amp.grads.unscale_optimizer_grads`
        (``{device: found_inf}``, reduced). No host sync."""
        _refuse_released(optimizer, "unscale_")
        return grads.unscale_optimizer_grads(optimizer, inv_scale, found_inf, allow_fp16,
                                             self._process_group, self._allow_fp16_grads)

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """torch's hook for optimizers that unscale in their own step: records and returns
        :func:`mixprec.amp.grads.check_optimizer_grads` (read only). No host sync."""
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        result = grads.check_optimizer_grads(optimizer, scale.device, self._process_group)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = result
        return result  # type: ignore[return-value]

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                        *args: Any, **kwargs: Any) -> Optional[float]:
        """Call ``optimizer.step(*args, **kwargs)`` unless an inf was found; one sync per device."""
        found = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
        record_of(optimizer_state).host_found_inf = bool(found)
        if not found:
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[float]:
        """Unscale (unless :meth:`unscale_` ran) and step ``optimizer`` if the grads are finite.

        ``args``/``kwargs`` go to ``optimizer.step``, whose return value is returned (``None``
        when skipped). A ``closure`` keyword is rejected while enabled.

        Optimizers with ``_step_supports_amp_scaling = True`` are always stepped and skip
        the update themselves on ``found_inf``, with no host sync; they get ``grad_scale``
        and ``found_inf`` (mixprec's as ``step()`` arguments with ``clip_coef``, others as
        torch's attributes: :mod:`mixprec.amp.protocol`). Others: one host sync, as torch.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        _refuse_released(optimizer, "step")
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        kind = capability.step_kind(optimizer)
        if kind is capability.LEGACY:
            retval = protocol.legacy_step(optimizer, self, args, kwargs)
        elif kind is not capability.HOST:
            if state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            retval = protocol.step_amp_aware(optimizer, state, self._get_scale_async(),
                                             kind is capability.SCALARS, args, kwargs)
        else:
            if state["stage"] is OptState.READY:
                self.unscale_(optimizer)
            if len(state["found_inf_per_device"]) == 0:
                raise AssertionError("No inf checks were recorded for this optimizer.")
            retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def clip_grad_norm_(self, optimizer: torch.optim.Optimizer, max_norm: float,
                        norm_type: float = 2.0, *, fold_into_step: bool = True) -> Tensor:
        """Unscale, check and clip ``optimizer``'s gradients; return their total norm.

        ``scaler.unscale_(optimizer)`` + ``torch.nn.utils.clip_grad_norm_`` over its params,
        but the unscale, the inf/NaN check and the norm are one pass per device
        (:func:`mixprec.ops.unscale_and_norm_`), with no host sync; after :meth:`unscale_`,
        only the norm and the clip. Counts as this iteration's :meth:`unscale_`.

        With a :mod:`mixprec.optim` optimizer and ``fold_into_step=True`` the pass only
        reads the grads (:func:`mixprec.ops.check_finite_and_norm_`) and :meth:`step` passes
        ``grad_scale`` and ``clip_coef = min(1, max_norm / (norm + 1e-6))`` to the fused
        step: ``param.grad`` stays scaled and unclipped, the update equals the unfolded one
        within float32 rounding (branches: :mod:`mixprec.amp.clipping`).

        Sparse grads are coalesced (``param.grad`` replaced). With ``process_group`` the
        norm is reduced over the ranks. With inf/NaN grads the norm is inf/NaN.

        Args:
            optimizer: its ``param_groups`` give the parameters.
            max_norm: maximum norm after clipping.
            norm_type: ``p`` of the p-norm, ``float("inf")`` for the max norm.
            fold_into_step: fold the unscale and the clip into the step of an
                optimizer that supports it (mixprec's); ignored for others.

        Returns:
            The total norm before clipping, a float32 0-dim tensor on the scale's
            device (disabled scaler: what torch's ``clip_grad_norm_`` returns).
        """
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
            raise TypeError(f"mixprec.GradScaler.clip_grad_norm_: max_norm must be a float, "
                            f"got {type(max_norm).__name__} {max_norm!r}")
        if not max_norm >= 0.0:  # (NaN fails this too)
            raise ValueError(f"mixprec.GradScaler.clip_grad_norm_: max_norm must be >= 0 (inf: "
                             f"no clipping), got {max_norm!r}")
        if not self._enabled:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        scale, _ = self._check_scale_growth_tracker("clip_grad_norm_")
        access = ClipAccess(scale, self._per_optimizer_states[id(optimizer)],
                            self._allow_fp16_grads, self._process_group)
        return clip_grad_norm(access, optimizer, max_norm, norm_type, fold_into_step)

    def update(self, new_scale: Union[float, Tensor, None] = None) -> None:
        """End the iteration: update the scale from this iteration's inf checks.

        Back off on overflow, grow after ``growth_interval`` clean iterations (with the
        policy's hysteresis/bounds), on the device with no host sync; or set the scale to
        ``new_scale`` (a float, or a one-element tensor on the scale's device type without
        ``requires_grad``; copied). Once per iteration, after every :meth:`step`.
        """
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        self._mp_stats.start(scale)
        states = self._per_optimizer_states
        flags = [f.to(device=scale.device, non_blocking=True)
                 for s in states.values() for f in s["found_inf_per_device"].values()]
        found: Optional[Tensor]
        if new_scale is not None:
            super().update(new_scale)  # torch's checks of new_scale; resets the states
            found = None if not flags else torch.stack(flags).sum()
            self._mp_stats.record(found, scale)
        else:
            if not flags:
                raise AssertionError("No inf checks were recorded prior to update.")
            found = sum(flags[1:], flags[0])  # not in place: flags[0] is an optimizer's own
            # (the rule's kernel counts the update in the stats too: one launch)
            apply_scale_rule(self._scale_rule(), scale, tracker, found, self._hysteresis_left,
                             self._mp_stats.kernel_state(scale))
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._mp_last = protocol.close_iteration(states, found)

    def _home(self) -> torch.device:
        return self._scale.device if self._scale is not None else torch.device(self._device)

    def found_inf(self, optimizer: Optional[torch.optim.Optimizer] = None) -> Tensor:
        """Whether an inf/NaN check of this iteration found a non-finite gradient; no host sync.

        Returns a 0-dim float32 tensor on the scale's device: ``1.0`` if the checks of
        ``optimizer`` (all optimizers when ``None``) found inf/NaN, else ``0.0``. Reading
        the value is the sync. Valid after :meth:`step`, :meth:`unscale_` or
        :meth:`clip_grad_norm_` of ``optimizer`` in this iteration; after :meth:`update`,
        until the next inf check, it answers for the last completed iteration.
        ``RuntimeError`` if ``optimizer`` (``None``: any) had no check there. A zero CPU
        tensor on a disabled scaler.
        """
        if not self._enabled:
            return torch.zeros((), dtype=torch.float32)
        return protocol.found_inf(self._per_optimizer_states, self._mp_last, optimizer,
                                  self._home())

    @property
    def step_was_skipped(self) -> bool:
        """Whether the optimizer steps of the last completed iteration were skipped.

        ``False`` before the first :meth:`update` and when disabled. Free when :meth:`step`
        already synced (ordinary optimizers); otherwise one host sync per read of the
        device flag (as C++), so it answers for a captured step's last replay too.
        :meth:`found_inf` answers without the sync.
        """
        if not self._enabled or self._mp_last is None:
            return False
        last = self._mp_last
        if last.skipped is not None:
            return last.skipped
        return bool(protocol.found_inf({}, last, None, self._home()).item() != 0)

    @property
    def last_iteration(self) -> Optional[IterationRecord]:
        """The record :meth:`update` kept of the last completed iteration (None before the
        first); its device inf flags are what :meth:`found_inf` and
        :attr:`step_was_skipped` read. A captured step sets it after each replay."""
        return self._mp_last

    @last_iteration.setter
    def last_iteration(self, record: IterationRecord) -> None:
        if not isinstance(record, IterationRecord):
            raise TypeError("mixprec.GradScaler.last_iteration: expected an IterationRecord, "
                            f"got {type(record).__name__}")
        self._mp_last = record

    def state_tensors(self) -> dict[str, Tensor]:
        """The device state created so far by name: ``scale``, ``growth_tracker``,
        ``hysteresis_left`` (none when disabled). Changed in place by :meth:`update` and
        :meth:`load_state_dict`; do not replace them. No host sync."""
        if not self._enabled:
            return {}
        named = (("scale", self._scale), ("growth_tracker", self._growth_tracker),
                 ("hysteresis_left", self._hysteresis_left))
        return {name: t for name, t in named if isinstance(t, Tensor)}

    def stats(self) -> ScalerStats:
        """Counters since construction (:class:`mixprec.amp.stats.ScalerStats`), counted on
        the device at every :meth:`update`; this read is one host sync. Zeros when disabled."""
        if not self._enabled:
            return ScalerStats(0, 0, 0.0, 0, 0, 1.0, None)
        steps, skipped, inc, dec, last = self._mp_stats.read()
        return ScalerStats(steps, skipped, (skipped / steps) if steps else 0.0, inc, dec,
                           self.get_scale(), last)

    def state_dict_and_stats(self) -> tuple[dict[str, Any], ScalerStats]:
        """:meth:`state_dict` and :meth:`stats` together, from one host read of the device
        values (the scale, the growth tracker, the hysteresis budget, the counters): what a
        checkpoint takes. The same values as the two calls."""
        if not self._enabled:
            return {}, self.stats()
        parts = [(name, t) for name, t in (("scale", self._scale),
                                            ("tracker", self._growth_tracker),
                                            ("left", self._hysteresis_left))
                 if isinstance(t, Tensor)]
        counts = self._mp_stats.device_counts()
        tensors = [t.detach().reshape(-1).double() for _, t in parts]
        if counts is not None:
            tensors.append(counts.detach().reshape(-1).double())
        # float32 scales, int32 trackers and int64 counters below 2**53 are exact in float64
        values = torch.cat([t.to(tensors[0].device) for t in tensors]).tolist() if tensors \
            else []
        read = {name: values[k] for k, (name, _) in enumerate(parts)}
        scale = float(read.get("scale", self._init_scale))
        out: dict[str, Any] = {
            "scale": scale, "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
            "_growth_tracker": int(read.get("tracker", self._init_growth_tracker))}
        if self._hysteresis != 1:
            out["_hysteresis_left"] = int(read.get("left", self._init_hysteresis_left))
        c = [int(v) for v in values[len(parts):]] if counts is not None else None
        steps, skipped, inc, dec, last = self._mp_stats.read(c)
        return out, ScalerStats(steps, skipped, (skipped / steps) if steps else 0.0, inc, dec,
                                scale, last)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict (``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` as plain numbers; ``{}`` when disabled),
        plus ``"_hysteresis_left"`` with hysteresis (torch ignores it). Syncs."""
        out = super().state_dict()
        if self._enabled and self._hysteresis != 1:
            out["_hysteresis_left"] = self._get_hysteresis_left()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from this class or from :class:`torch.amp.GradScaler`.

        No-op when disabled. Without ``"_hysteresis_left"`` the hysteresis budget is
        refilled. Checked first (:meth:`check_state_dict`): a bad dict raises naming the key
        and leaves the scaler as it was.
        """
        if not self._enabled:
            return
        self.check_state_dict(state_dict)
        super().load_state_dict(state_dict)
        left = int(state_dict.get("_hysteresis_left", self._hysteresis))
        self._init_hysteresis_left = left
        if self._hysteresis_left is not None:
            self._hysteresis_left.fill_(left)
        if self._scale is not None:
            self._mp_stats.rebaseline(self._scale)

    def check_state_dict(self, state_dict: Any) -> None:
        """Check a state dict to load: the keys of :meth:`state_dict` (``_hysteresis_left``
        optional) and no other, each of the constructor's type and range, the scale within
        the bounds. ``ValueError``/``TypeError`` naming the key; ``RuntimeError`` when empty."""
        where = "mixprec.GradScaler.load_state_dict"
        if not isinstance(state_dict, dict):
            raise TypeError(f"{where}: state_dict must be a dict, got "
                            f"{type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler.")
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        if missing:
            raise ValueError(f"{where}: state_dict has no {missing} (expected the keys "
                             f"{list(_STATE_KEYS)}, and '_hysteresis_left' optionally)")
        extra = sorted(map(str, set(state_dict) - set(_STATE_KEYS) - {"_hysteresis_left"}))
        if extra:
            raise ValueError(f"{where}: unexpected keys {extra} in state_dict (expected "
                             f"{list(_STATE_KEYS)} and '_hysteresis_left')")
        _check_scale_options(where, key="state_dict[{!r}]", **state_dict)
        scale = state_dict["scale"]
        if self._min_scale is not None and scale < self._min_scale:
            raise ValueError(f"{where}: state_dict['scale'] = {scale!r} is below this "
                             f"scaler's min_scale {self._min_scale}")
        if self._max_scale is not None and scale > self._max_scale:
            raise ValueError(f"{where}: state_dict['scale'] = {scale!r} is above this "
                             f"scaler's max_scale {self._max_scale}")
        left = state_dict.get("_hysteresis_left")
        if left is not None and left > self._hysteresis:
            raise ValueError(f"{where}: state_dict['_hysteresis_left'] = {left} exceeds this "
                             f"scaler's hysteresis {self._hysteresis}")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_hysteresis_left"] = self._get_hysteresis_left()
            state["_hysteresis_left"] = None
        if state.get("_mp_last") is not None:
            state["_mp_last"] = IterationRecord({}, self.step_was_skipped)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(complete_state(state))
