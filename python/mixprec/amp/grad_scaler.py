"""``mixprec.GradScaler``: a drop-in, faster :class:`torch.amp.GradScaler`.

A subclass (``isinstance`` checks in frameworks still pass) with torch's
constructor, methods, state machine, exceptions and the private attributes and
hooks frameworks use. It overrides only what differs; the parts live beside it:
:mod:`.grads` (one fused op per device over all grads), :mod:`.capability` (which
protocol an optimizer speaks), :mod:`.protocol` (how it is stepped, the
per-optimizer record), :mod:`.policies` (scale
rules), :mod:`.clipping` (:meth:`~GradScaler.clip_grad_norm_`).

Host syncs: :meth:`~GradScaler.step` syncs once (one ``.item()`` per device, as
torch) only for ordinary optimizers, whose step must be skipped on the host;
:meth:`~GradScaler.get_scale`, :meth:`~GradScaler.state_dict`,
:meth:`~GradScaler.stats`, :attr:`~GradScaler.step_was_skipped` and pickling
read device values. Everything else, :meth:`~GradScaler.found_inf` included,
is asynchronous.
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
from .policies import (
    POLICIES,
    ScalePolicy,
    ScaleRule,
    apply_scale_rule,
    resolve_options,
)
from .protocol import IterationRecord, record_of
from .stats import ScalerStats, _StatsTracker

__all__ = ["GradScaler", "ScalePolicy", "POLICIES", "OptState"]


_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_device(device: Any, who: str = "mixprec.GradScaler") -> None:
    """``device`` must be a device string torch parses (``"cuda"``, ``"cpu"``...):
    ``ValueError`` naming ``who``'s argument otherwise."""
    try:
        ok = isinstance(device, str) and torch.device(device) is not None
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{who}: device must be a device type such as 'cuda' or 'cpu', "
                         f"got {device!r}")


def _check_scale_options(where: str, *, error: type = ValueError, key: str = "{}",
                         **values: Any) -> None:
    """The ranges the constructor takes, for the constructor and for a loaded state dict
    (``key`` formats the name in the message, e.g. ``"state_dict[{!r}]"``).
    ``growth_factor``/``backoff_factor`` out of range raise ``error`` (AssertionError in
    the constructor, as torch); every other bad value ValueError or TypeError."""
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
        if not _number(v):
            raise TypeError(f"{where}: {shown} must be a float, got {type(v).__name__} {v!r}")
        if name in ("scale", "init_scale") and not (0.0 < v < math.inf):
            raise ValueError(f"{where}: {shown} must be finite and > 0, got {v!r}")
        if name == "growth_factor" and not (1.0 < v < math.inf):
            raise error(f"{where}: {shown} must be finite and > 1.0, got {v!r} "
                        "(The growth factor must be > 1.0.)")
        if name == "backoff_factor" and not (0.0 < v < 1.0):
            raise error(f"{where}: {shown} must be in (0, 1), got {v!r} "
                        "(The backoff factor must be < 1.0.)")


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
        process_group: a ``torch.distributed`` process group. Every inf check
            is all-reduced (max) over its ranks, so that all ranks skip the same
            steps, and :meth:`clip_grad_norm_` reduces the norm over the ranks
            (disjoint shards assumed). Every rank must call the same methods.

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

        # mixprec's own state (present even when disabled).
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

    def scale_tensor(self) -> Optional[Tensor]:
        """The scale as the scaler keeps it: a 0-dim float32 tensor on the device of
        the first :meth:`scale` call, read without a host sync. ``None`` when disabled
        or before the first :meth:`scale`. It is the scaler's own tensor: read it
        (e.g. to log it later), do not write it; :meth:`update` changes it in place."""
        return self._scale if self._enabled else None

    def iteration_open(self) -> bool:
        """Whether an iteration is under way: some optimizer was unscaled, checked or
        stepped since the last :meth:`update` (which closes it). No host sync."""
        return any(map(protocol.was_checked, self._per_optimizer_states.values()))

    def fresh(self, init_scale: Optional[float] = None) -> GradScaler:
        """A new scaler with this one's settings and a fresh state.

        Same device, growth and backoff factors (as they stand: torch's setters
        change them), growth interval, ``enabled``, and the extras (policy, bounds,
        hysteresis, ``allow_fp16_grads``, ``process_group``); the scale starts at
        ``init_scale`` (default: this scaler's initial scale), with no growth count
        and no statistics. This scaler is not modified."""
        if init_scale is None:
            init_scale = getattr(self, "_init_scale", 2.0**16)
        return GradScaler(
            self._device,
            init_scale=init_scale,
            growth_factor=getattr(self, "_growth_factor", 2.0),
            backoff_factor=getattr(self, "_backoff_factor", 0.5),
            growth_interval=getattr(self, "_growth_interval", 2000),
            enabled=self._enabled,
            allow_fp16_grads=self._allow_fp16_grads,
            min_scale=self._min_scale,
            max_scale=self._max_scale,
            hysteresis=self._hysteresis,
            policy=self._policy,
            process_group=self._process_group,
        )

    def _scale_rule(self) -> ScaleRule:
        """The scale-update rule as it stands (torch's setters change its factors)."""
        return ScaleRule(self._growth_factor, self._backoff_factor, self._growth_interval,
                         self._min_scale, self._max_scale, self._hysteresis)

    # ------------------------------------------------------------------ lazy state
    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """torch's lazy ``_scale``/``_growth_tracker``, and ``_hysteresis_left`` next to them."""
        super()._lazy_init_scale_growth_tracker(dev)
        if self._scale_rule().extended:
            self._hysteresis_left = torch.full(
                (), self._init_hysteresis_left, dtype=torch.int32, device=dev
            )

    def _get_hysteresis_left(self) -> int:
        if self._hysteresis_left is None:
            return self._init_hysteresis_left
        return int(self._hysteresis_left.item())

    # ------------------------------------------------------------------ gradients
    def _collect_grads(
        self, optimizer: torch.optim.Optimizer, allow_fp16: bool, coalesce_sparse: bool = False
    ) -> grads.DeviceGrads:
        """The optimizer's gradients by device (:func:`mixprec.amp.grads.collect_grads`),
        fp16 grads allowed by ``allow_fp16`` or by this scaler's ``allow_fp16_grads``."""
        allow_fp16 = allow_fp16 or grads.fp16_grads_allowed(self._allow_fp16_grads, optimizer)
        return grads.collect_grads(optimizer, allow_fp16, coalesce_sparse)

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: Tensor,
        found_inf: Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, Tensor]:
        """torch's hook behind :meth:`unscale_`: :func:`mixprec.amp.grads.unscale_optimizer_grads`
        (one fused op per device; ``{device: found_inf}``, reduced). No host sync."""
        return grads.unscale_optimizer_grads(optimizer, inv_scale, found_inf, allow_fp16,
                                             self._process_group, self._allow_fp16_grads)

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """torch's hook for optimizers that unscale in their own step: records and returns
        :func:`mixprec.amp.grads.check_optimizer_grads` (read only on the grads, where torch
        unscales them by 1.0). No host sync."""
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        result = grads.check_optimizer_grads(optimizer, scale.device, self._process_group)
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
        """Call ``optimizer.step(*args, **kwargs)`` unless an inf was found; one sync per device."""
        found = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
        record_of(optimizer_state).host_found_inf = bool(found)
        if not found:
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[float]:
        """Unscale (unless :meth:`unscale_` ran) and step ``optimizer`` if the grads are finite.

        ``args``/``kwargs`` go to ``optimizer.step`` (looked up on the
        optimizer at call time) and its return value is returned (``None`` when
        the step is skipped). A ``closure`` keyword is rejected while enabled.

        Optimizers with ``_step_supports_amp_scaling = True`` are always stepped
        and skip the update themselves when ``found_inf`` is set, with no host
        sync; they get ``grad_scale`` (None if already unscaled) and ``found_inf``
        -- mixprec's as ``step()`` arguments (with ``clip_coef``), others as
        torch's attributes (:mod:`mixprec.amp.protocol`). Others: one host sync
        to decide the skip, as in torch.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        kind = capability.step_kind(optimizer)
        if kind is capability.LEGACY:
            return protocol.legacy_step(optimizer, self, state, args, kwargs)
        if kind is not capability.HOST:
            if state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            scale = self._get_scale_async()
            if scale is None:
                raise AssertionError("_get_scale_async returned None")
            return protocol.step_amp_aware(optimizer, state, scale, kind is capability.SCALARS,
                                           args, kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
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
        ``torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`` over the
        optimizer's parameters, but the unscale, the inf/NaN check and the norm
        are **one** pass over the gradients (:func:`mixprec.ops.unscale_and_norm_`,
        one call per device), with no host sync. After :meth:`unscale_`, only the
        norm and the clip are done. Counts as this iteration's :meth:`unscale_`.

        With a :mod:`mixprec.optim` optimizer (and ``fold_into_step=True``) the
        clip is folded into its fused step: this pass only **reads** the grads
        (:func:`mixprec.ops.check_finite_and_norm_`) and :meth:`step` passes the
        optimizer ``grad_scale`` and ``clip_coef = min(1, max_norm / (norm + 1e-6))``,
        applied in the kernel that reads the grads anyway. ``param.grad`` stays
        as backward produced it (scaled, unclipped); ``fold_into_step=False``
        gives the clipped, unscaled grads instead. The update equals the unfolded
        one within float32 rounding. The branches: :mod:`mixprec.amp.clipping`.

        Sparse gradients are coalesced (``param.grad`` replaced). With
        ``process_group``, the norm is reduced over the ranks (disjoint shards
        assumed). With inf/NaN grads the norm is inf/NaN (the step is skipped).

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
        self._mp_stats.start(scale)
        states = self._per_optimizer_states
        flags = [f.to(device=scale.device, non_blocking=True)
                 for s in states.values() for f in s["found_inf_per_device"].values()]
        found: Optional[Tensor]
        if new_scale is not None:
            super().update(new_scale)  # torch's checks of new_scale; resets the states
            found = None if not flags else torch.stack(flags).sum()
        else:
            if not flags:
                raise AssertionError("No inf checks were recorded prior to update.")
            found = sum(flags[1:], flags[0])  # not in place: flags[0] is an optimizer's own
            rule = self._scale_rule()
            if self._hysteresis_left is None and rule.extended:
                self._hysteresis_left = torch.full(
                    (), self._init_hysteresis_left, dtype=torch.int32, device=scale.device
                )
            apply_scale_rule(rule, scale, tracker, found, self._hysteresis_left)
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._mp_last = protocol.close_iteration(states, found)
        self._mp_stats.record(found, scale)

    def _home(self) -> torch.device:
        return self._scale.device if self._scale is not None else torch.device(self._device)

    # ------------------------------------------------------------------ extras
    def found_inf(self, optimizer: Optional[torch.optim.Optimizer] = None) -> Tensor:
        """Whether an inf/NaN check of this iteration found a non-finite gradient; no host sync.

        Returns a 0-dim float32 tensor on the scale's device: ``1.0`` if the
        checks of ``optimizer`` (of all optimizers together when ``None``)
        found inf/NaN -- so that its :meth:`step` is (or was) skipped -- else
        ``0.0``. Reading the value (``.item()``, ``bool()``) is the sync; the
        call itself only launches a few tiny device ops.

        Valid after :meth:`step`, :meth:`unscale_` or :meth:`clip_grad_norm_`
        of ``optimizer`` in the current iteration. Once :meth:`update` has
        closed the iteration, and until the next inf check of any optimizer,
        it answers for that last completed iteration. ``RuntimeError`` if
        ``optimizer`` had no check in that iteration (or, for ``None``, if no
        iteration has been checked yet). A zero CPU tensor on a disabled scaler.
        """
        if not self._enabled:
            return torch.zeros((), dtype=torch.float32)
        return protocol.found_inf(
            self._per_optimizer_states, self._mp_last, optimizer, self._home()
        )

    @property
    def step_was_skipped(self) -> bool:
        """Whether the optimizer steps of the last completed iteration were skipped.

        "Completed" means closed by :meth:`update`; ``False`` before the first
        update and on a disabled scaler. Use it to step LR schedulers only
        after real steps. Free when :meth:`step` already synced for ordinary
        optimizers; otherwise it reads the device flag: one host sync per read
        (as C++ ``GradScaler::step_was_skipped()``), so it answers for the last
        replay of a captured step too. :meth:`found_inf` answers without the sync.
        """
        if not self._enabled or self._mp_last is None:
            return False
        last = self._mp_last
        if last.skipped is not None:
            return last.skipped
        return bool(protocol.found_inf({}, last, None, self._home()).item() != 0)

    @property
    def last_iteration(self) -> Optional[IterationRecord]:
        """The record :meth:`update` kept of the last completed iteration (None before
        the first): its inf flags are device tensors, which :meth:`found_inf` and
        :attr:`step_was_skipped` read. A captured step (:mod:`mixprec.capture`) sets it
        back to the record of its captured ``update()`` after each replay, whose flags
        the replay rewrote."""
        return self._mp_last

    @last_iteration.setter
    def last_iteration(self, record: IterationRecord) -> None:
        if not isinstance(record, IterationRecord):
            raise TypeError("mixprec.GradScaler.last_iteration: expected an IterationRecord, "
                            f"got {type(record).__name__}")
        self._mp_last = record

    def state_tensors(self) -> dict[str, Tensor]:
        """The scaler's device state by name: ``scale``, ``growth_tracker`` and, with
        hysteresis, ``hysteresis_left``, those created so far (none when disabled or
        before the first :meth:`scale`). :meth:`update` and :meth:`load_state_dict`
        change them in place; read them, do not replace them. No host sync."""
        if not self._enabled:
            return {}
        named = (("scale", self._scale), ("growth_tracker", self._growth_tracker),
                 ("hysteresis_left", self._hysteresis_left))
        return {name: t for name, t in named if isinstance(t, Tensor)}

    def stats(self) -> ScalerStats:
        """Counters since construction (see :class:`mixprec.amp.stats.ScalerStats`).

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
        Without ``"_hysteresis_left"`` the hysteresis budget is refilled. Everything is
        checked first (:meth:`check_state_dict`): a bad dict raises ``ValueError`` or
        ``TypeError`` naming the key, and the scaler is left as it was.
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
        """Every entry of a state dict to load, checked before anything changes: the keys
        of :meth:`state_dict` (``_hysteresis_left`` optional), nothing else, each of the
        type and range the constructor takes, and the scale within ``min_scale`` /
        ``max_scale``. ``RuntimeError`` for an empty dict (as torch)."""
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
            # the flags are device tensors of this process: keep only the answer
            state["_mp_last"] = IterationRecord({}, self.step_was_skipped)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Also accepts the state of a torch.amp.GradScaler (unpickled as
        # mixprec's under patch_torch()) and older mixprec pickles.
        self.__dict__.update(complete_state(state))
