"""Shared machinery of mixprec's fused master-weight optimizers.

:class:`FusedOptimizer` is a :class:`torch.optim.Optimizer` whose ``step`` runs
one fused mixprec op per (device, with/without masters) bucket of a param
group. It owns what Adam, AdamW and SGD have in common:

* state: per param a float32 step count on the param's device, float32
  moments/buffers and, for float16/bfloat16 params of a group with
  ``master_weights=True``, a float32 master copy (``state["master_param"]``);
* the amp contract (``_step_supports_amp_scaling = True``): ``grad_scale``,
  ``found_inf`` and ``clip_coef`` are read on the device by the kernels.
  :class:`mixprec.GradScaler` passes them as ``step()`` arguments (see
  :mod:`mixprec.amp.protocol`); ``torch.amp.GradScaler`` sets
  ``optimizer.grad_scale``/``optimizer.found_inf`` attributes for the call
  (torch's protocol), which ``step()`` reads when an argument is None;
* ``lr`` as a device tensor (cached, refreshed only when the group's float lr
  changes), so a step never syncs with the host;
* ``state_dict``/``load_state_dict`` that keep masters in float32 and accept
  torch.optim state dicts, and :meth:`master_params`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from itertools import chain
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from .. import _dtensor
from .. import flat as _flat
from .._grad_mode import is_grad_enabled as _IS_GRAD_ENABLED
from .._grad_mode import set_grad_enabled as _SET_GRAD_ENABLED
from ..ops._extension import WATCH as _WATCH
from ..ops._scalars import StepScalars

#: The scalars of a step given none (a plain ``opt.step()``): one shared immutable value.
_NO_SCALARS = StepScalars(None, None, None)

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)

Bucket = Dict[str, List[Tensor]]
BucketKey = Tuple[torch.device, bool]

Snapshot = Tuple[Tuple[Any, ...], bytes]


@dataclasses.dataclass
class _GroupPlan:
    """The op's tensor lists of one param group as :meth:`FusedOptimizer._buckets` built
    them, and snapshots of everything they were built from, so that a later step with the
    same params, the same state tensors and grads in the same places reuses them (the
    grads are read afresh every step). See :meth:`FusedOptimizer._reuse`."""

    group: Dict[str, Any]
    state: Any  # the optimizer's ``state`` mapping itself
    names: List[str]
    master_weights: Any
    params: Snapshot  # _C.watch_tensors(group["params"], whole)
    dicts: List[Dict[str, Any]]  # the state dicts the lists were read from
    items: Snapshot  # _C.watch_items(dicts)
    # per bucket: (key, lists without "grads", positions in the group (None: all, in
    # order)); whole: the group is one run of a flat buffer and the one bucket is
    # flat.whole_group's, grads included (their views are then watched too)
    buckets: List[Tuple[BucketKey, Bucket, Optional[List[int]]]]
    whole: bool = False


# (bound at import: read on every step)
_PROFILER = torch.autograd.profiler
_C_PROFILER_ENABLED = torch._C._autograd._profiler_enabled


def _profiling() -> bool:
    """Whether a torch profiler is recording (the python flag torch's own compiled code
    reads, or the C profiler state of this thread)."""
    return bool(getattr(_PROFILER, "_is_profiler_enabled", False) or _C_PROFILER_ENABLED())


def _lean_step(func: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` as torch's :meth:`torch.optim.Optimizer.profile_hook_step` wraps it,
    without that wrapper's cost where it does nothing.

    torch wraps every optimizer class's ``step`` in a ``record_function`` block that runs
    the step pre/post hooks; on an idle profiler that block alone costs about as much as
    a whole mixprec step over ten tensors. Here ``func`` runs under ``torch.no_grad()``,
    and only through torch's own wrapper (the same hooks, the same profiler label
    ``Optimizer.step#<class>.step``) when a step hook is registered (global or on this
    optimizer), a profiler is recording, or torch.compile traces. Marked ``hooked`` so
    that :class:`torch.optim.Optimizer` does not wrap it again. A subclass that overrides
    ``step`` gets torch's wrapper around its own as usual, and its ``super().step()``
    runs hooks no second time.
    """
    torchs = torch.optim.Optimizer.profile_hook_step(torch.no_grad()(func))

    @functools.wraps(func)
    def step(self: FusedOptimizer, *args: Any, **kwargs: Any) -> Any:
        compiling = torch.compiler.is_compiling()
        if type(self).step is step and (
                compiling or self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                or _global_optimizer_pre_hooks or _global_optimizer_post_hooks
                or _profiling()):
            return torchs(self, *args, **kwargs)
        # (a subclass's own step, which torch has wrapped, calls this one through super():
        # its hooks have run there)
        if compiling:
            with torch.no_grad():
                return func(self, *args, **kwargs)
        grad_was = _IS_GRAD_ENABLED()
        _SET_GRAD_ENABLED(False)
        try:
            return func(self, *args, **kwargs)
        finally:
            _SET_GRAD_ENABLED(grad_was)

    step.hooked = True  # type: ignore[attr-defined]
    return step


def _on(t: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    """A step scalar on ``device`` (copied ``non_blocking`` from elsewhere; None stays)."""
    return t if t is None or t.device == device else t.to(device, non_blocking=True)


def _same(t: Tensor) -> Tensor:
    return t


def _check_sharded(cls: str, index: int, k: int, p: Tensor) -> None:
    """A param of a group with DTensors (FSDP2): a DTensor whose grad is a DTensor laid out
    as the param (so that the local shards match element for element)."""
    where = f"mixprec.optim.{cls}: param_groups[{index}]['params'][{k}]"
    if not _dtensor.is_dtensor(p):
        raise RuntimeError(f"{where} is a plain tensor in a group of DTensor params; put "
                           "sharded and unsharded params in separate param groups")
    g = p.grad
    if not _dtensor.is_dtensor(g):
        raise RuntimeError(f"{where} is a DTensor but its grad is a {type(g).__name__}")
    if g.device_mesh != p.device_mesh or g.placements != p.placements or g.shape != p.shape:
        raise RuntimeError(f"{where}: the grad is laid out as {g.placements} of shape "
                           f"{list(g.shape)}, the param as {p.placements} of shape "
                           f"{list(p.shape)}")
    if p.to_local().shape != g.to_local().shape:
        raise RuntimeError(f"{where}: the local shard of the grad has shape "
                           f"{list(g.to_local().shape)}, the param's "
                           f"{list(p.to_local().shape)}")


def _check_nonneg(cls: str, name: str, value: Any) -> None:
    if isinstance(value, Tensor):
        return  # a tensor is not read on the host (that would sync)
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"mixprec.optim.{cls}: {name} must be a finite number >= 0, got {value}")


class FusedOptimizer(torch.optim.Optimizer):
    """Base class of :class:`~mixprec.optim.Adam`, :class:`~mixprec.optim.AdamW`
    and :class:`~mixprec.optim.SGD`; not used directly.

    Subclasses define ``state_names(group)`` (their float32 per-param state
    besides step/master) and ``_run(bucket, group, lr, scalars)``.
    """

    #: GradScaler contract (torch's): this optimizer unscales in its own kernel
    #: and skips the step on the device when found_inf is set.
    _step_supports_amp_scaling = True
    #: mixprec's one extension of that contract (what mixprec.GradScaler looks for; it
    #: never tests the type): ``step(grad_scale=, found_inf=, clip_coef=)`` takes the
    #: scalars as arguments, and with a ``clip_coef`` the scaler can fold
    #: ``clip_grad_norm_`` into the step.
    _step_takes_scalars = True

    def __init__(self, params: Any, defaults: Dict[str, Any]) -> None:
        self._lr_cache: Dict[Tuple[int, torch.device], Tuple[float, Tensor]] = {}
        self._plans: Dict[int, _GroupPlan] = {}
        self._state_items: Optional[Snapshot] = None  # _C.watch_items([self.state])
        super().__init__(params, defaults)

    # -- what subclasses declare and implement ------------------------------------

    #: The per-param state a step reads and writes besides ``step`` and
    #: ``master_param``, in the order the op takes it: ``(name, the group option that
    #: keeps it or None for always, its code table with state_bits=8 or None)``.
    STATE: ClassVar[Tuple[Tuple[str, Optional[str], Optional[str]], ...]] = ()

    def state_names(self, group: Dict[str, Any]) -> List[str]:
        """The names of the per-param state tensors a step of ``group`` reads and
        writes, besides ``step`` and ``master_param`` (e.g. ``["exp_avg",
        "exp_avg_sq"]``), in the order the op takes them: :attr:`STATE`'s entries that
        ``group`` keeps, then with ``state_bits=8`` the block maxima of the 8-bit ones
        (``"<name>_absmax"``). Part of the contract the flat-buffer layer builds state
        by (:mod:`mixprec.flat.state`)."""
        names = []
        for n, option, _ in self.STATE:  # (a loop: a comprehension costs 0.1 us more here)
            if option is None or group[option]:
                names.append(n)
        if names and group.get("state_bits", 32) == 8:
            names += [absmax for n, absmax, _ in coded_states(self.STATE) if n in names]
        return names

    def _run(self, bucket: Bucket, group: Dict[str, Any], lr: Tensor,
             scalars: StepScalars, seed: int) -> None:
        raise NotImplementedError

    # -- public API -------------------------------------------------------------

    @property
    def master_weights(self) -> bool:
        """True when some param group keeps float32 masters for 16-bit params.

        A GradScaler may then accept float16 gradients: they are unscaled in
        float32 inside the optimizer kernel.
        """
        return any(g.get("master_weights", False) for g in self.param_groups)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        if not hasattr(self, "_lr_cache"):
            self._lr_cache = {}
        self._plans = {}
        self._state_items = None
        for group in self.param_groups:
            for key, value in self.defaults.items():
                if key != "params":
                    group.setdefault(key, value)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As :meth:`torch.optim.Optimizer.add_param_group`."""
        self.__dict__.get("_plans", {}).clear()
        super().add_param_group(param_group)

    def keeps_master(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p`` (of ``group``) has a float32 master in its state: a 16-bit
        param of a group with ``master_weights``. The flat-buffer layer's other
        question (:mod:`mixprec.flat.state`)."""
        return bool(group.get("master_weights", True)) and p.dtype in _LOW_PRECISION

    @torch.no_grad()
    def master_params(self) -> List[Tensor]:
        """The float32 weights the optimizer updates, one per param in group order.

        For a 16-bit param with masters: its float32 master (the tensor in the
        state, not a copy; a fresh float32 copy of the param before its first
        step). For a float32 param: the param itself. For a 16-bit param
        without masters: the param itself (16-bit). No host sync.
        """
        out: List[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                master = self.state.get(p, {}).get("master_param")
                if master is not None:
                    out.append(master)
                elif self.keeps_master(p, group):
                    out.append(p.detach().float())
                else:
                    out.append(p)
        return out

    @_lean_step
    def step(  # type: ignore[override]
        self,
        closure: Optional[Callable[[], Any]] = None,
        grad_scale: Optional[Tensor] = None,
        found_inf: Optional[Tensor] = None,
        clip_coef: Optional[Tensor] = None,
    ) -> Any:
        """Perform one optimization step over every param that has a ``.grad``.

        Args:
            closure: re-evaluates the model and returns the loss (run with
                grad enabled), as in torch.
            grad_scale: one-element float32 tensor, the scale the grads carry
                (they are multiplied by its float64 reciprocal in the kernel).
            found_inf: one-element float32 tensor; when non-zero the step is
                skipped on the device (params, masters, state and step counts
                unchanged).
            clip_coef: one-element float32 tensor multiplied into the grads
                (gradient clipping folded into the step).

        :class:`mixprec.GradScaler` passes these three; each one left None
        defaults to the attribute of the same name (``self.grad_scale``...),
        which is how ``torch.amp.GradScaler`` hands over the first two.

        Runs under ``torch.no_grad()``; step hooks and the profiler see it as they see
        any torch optimizer's step (:func:`_lean_step`).

        Mutates the params, their masters and state; grads are read only.
        No host sync (the scalars are moved to each param device with
        ``non_blocking=True`` when they live elsewhere).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        if clip_coef is None:
            clip_coef = getattr(self, "clip_coef", None)
        # Checked before any state is created, so a rejected step changes nothing.
        given = () if grad_scale is None and found_inf is None and clip_coef is None else (
            ("grad_scale", grad_scale), ("found_inf", found_inf), ("clip_coef", clip_coef))
        for name, t in given:
            if t is not None and not (isinstance(t, Tensor) and t.dtype == torch.float32
                                      and t.numel() == 1):
                raise RuntimeError(
                    f"mixprec.optim.{type(self).__name__}.step: {name} must be a float32 "
                    f"tensor with one element, got "
                    f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}"
                    f"{' of shape ' + str(list(t.shape)) if isinstance(t, Tensor) else ''}"
                )
        if len(self._plans) > len(self.param_groups):  # groups were removed: drop theirs
            self._plans = {i: p for i, p in self._plans.items() if i < len(self.param_groups)}
        # Every plan assumes self.state maps each param to the dict it was built from: one
        # pass over the mapping per step proves it (any entry added, removed or replaced
        # drops every plan), and the snapshot is retaken after a step that built lists.
        # (Nothing is stored while torch.compile traces: _buckets builds every time.)
        eager = not torch.compiler.is_compiling()
        if eager and self._plans and not (
                self._state_items is not None and _WATCH is not None
                and _WATCH.items_unchanged((self.state,), self._state_items)):
            self._plans = {}
        for index, group in enumerate(self.param_groups):
            self._step_group(index, group, grad_scale, found_inf, clip_coef, not eager)
        if eager and self._plans and self._state_items is None:
            self._state_items = _WATCH.watch_items((self.state,))
        return loss

    # -- internals ------------------------------------------------------------

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state[p]
        if not state and _flat.init_state(self, p, group, state):  # flat-buffer mode
            return state
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for name in self.state_names(group):
            if state.get(name) is None:
                state[name] = torch.zeros_like(p, dtype=torch.float32,
                                               memory_format=torch.preserve_format)
        if self.keeps_master(p, group) and state.get("master_param") is None:
            state["master_param"] = p.detach().to(torch.float32, copy=True)
        return state

    def _local_state(self, name: str, t: Tensor, p: Tensor) -> Tensor:
        """What the kernels take for state ``name`` of DTensor param ``p``: its shard."""
        return _dtensor.local(t)

    def _lr_tensor(self, index: int, group: Dict[str, Any], device: torch.device) -> Tensor:
        lr = group["lr"]
        if isinstance(lr, Tensor):
            if lr.device == device and lr.dtype in (torch.float32, torch.float64) \
                    and lr.numel() == 1:
                return lr  # read in place: in-place updates reach captured graphs
            return lr.detach().to(device=device, dtype=torch.float64,
                                  non_blocking=True).reshape(())
        key = (index, device)
        cached = self._lr_cache.get(key)
        value = float(lr)
        if cached is None:
            t = torch.full((), value, dtype=torch.float64, device=device)
            self._lr_cache[key] = (value, t)
            return t
        if cached[0] != value:
            cached[1].fill_(value)  # a kernel with the value as argument: no sync
            self._lr_cache[key] = (value, cached[1])
        return cached[1]

    def _buckets(self, index: int, group: Dict[str, Any], compiling: bool
                 ) -> Tuple[Dict[BucketKey, Bucket], Optional[bool]]:
        """The group's params with a grad, as the op's tensor lists per (device, has master),
        and what is known of their flat layout without a pass over them (``plain``): True,
        none is laid out flat; False, unknown (:func:`mixprec.flat.coalesce_bucket`
        coalesces what it can); None, each bucket is one slice of a flat buffer already
        (:func:`mixprec.flat.whole_group`), run as it is.

        The lists of the last step are reused when :meth:`_reuse` finds nothing changed;
        else they are built here: the grads and dtypes are checked and missing state is
        created (:meth:`_init_state`). (Per-param lists are kept only where no param was
        flat, and a param laid out flat since has a new data pointer, which :meth:`_reuse`
        sees: so reused per-param lists hold no flat param.)
        """
        if not compiling:
            reused = self._reuse(index, group)
            if reused is not None:
                return reused, None if self._plans[index].whole else True
        buckets: Dict[BucketKey, Bucket] = _flat.whole_group(self, group)
        if buckets:  # flat-buffer mode: no per-param loop
            if not compiling:
                self._remember_whole(index, group, buckets)
            return buckets, None
        names = self.state_names(group)
        positions: Dict[BucketKey, List[int]] = {}
        dicts: Dict[BucketKey, List[Dict[str, Any]]] = {}
        sharded = _dtensor.any_dtensor(group["params"])
        for k, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if sharded:
                _check_sharded(type(self).__name__, index, k, p)
            if p.grad.is_sparse:
                raise RuntimeError(
                    f"mixprec.optim.{type(self).__name__} does not support sparse gradients"
                )
            if p.dtype not in _SUPPORTED:
                raise RuntimeError(
                    f"mixprec.optim.{type(self).__name__}: params must be float32, float16 or "
                    f"bfloat16, got {p.dtype}; use torch.optim for other dtypes"
                )
            state = self._init_state(p, group)
            master = state.get("master_param") if self.keeps_master(p, group) else None
            key = (p.device, master is not None)
            b = buckets.setdefault(key, {"params": [], "grads": [], "master_params": [],
                                         "state_steps": [], **{n: [] for n in names}})
            local = _dtensor.local if sharded else _same  # a DTensor's kernels: its shard
            b["params"].append(local(p))
            b["grads"].append(local(p.grad))
            b["state_steps"].append(state["step"])
            for n in names:
                b[n].append(self._local_state(n, state[n], p) if sharded else state[n])
            if master is not None:
                b["master_params"].append(local(master))
            positions.setdefault(key, []).append(k)
            dicts.setdefault(key, []).append(state)
        # (not kept where flat params are: flat.whole_group may take the group next step)
        if not compiling and not _flat.any_flat(group["params"]):
            self._remember(index, group, names, buckets, positions, dicts)
        return buckets, False

    def _remember(self, index: int, group: Dict[str, Any], names: List[str],
                  buckets: Dict[BucketKey, Bucket], positions: Dict[BucketKey, List[int]],
                  dicts: Dict[BucketKey, List[Dict[str, Any]]]) -> None:
        """Keep the per-param lists (without grads, read afresh every step)."""
        n = len(group["params"])
        self._keep(index, group, names, False, [d for key in buckets for d in dicts[key]],
                   [(key, {k: v for k, v in b.items() if k != "grads"},
                     None if len(positions[key]) == n else positions[key])
                    for key, b in buckets.items()])

    def _remember_whole(self, index: int, group: Dict[str, Any],
                        buckets: Dict[BucketKey, Bucket]) -> None:
        """Keep flat.whole_group's one-slice bucket (grads included: their views are
        watched too)."""
        self._keep(index, group, self.state_names(group), True,
                   list(map(self.state.get, group["params"])),  # (whole_group found each)
                   [(key, bucket, None) for key, bucket in buckets.items()])

    # Never traced: when dynamo runs a frame of a compiled step eagerly after a graph break
    # (flat.whole_group is compiler-disabled), it still traces the frames that one calls;
    # torch 2.11's dynamo then failed on the attribute write after the list watch's graph
    # break (the H100 run of 2026-11-25: test_compiled_optimizer_step_runs_the_detection_eagerly).
    @torch.compiler.disable
    def _keep(self, index: int, group: Dict[str, Any], names: List[str], whole: bool,
              dicts: List[Dict[str, Any]],
              buckets: List[Tuple[BucketKey, Bucket, Optional[List[int]]]]) -> None:
        """Store a group's lists with snapshots of the params (and, ``whole``, their grads)
        and of the state dicts they were read from; the state mapping's snapshot is
        retaken at the end of the step."""
        snap = _WATCH.watch_tensors(group["params"], whole) if _WATCH is not None else None
        if snap is None:  # no extension, or a tensor subclass among the params
            return
        self._plans[index] = _GroupPlan(
            group=group, state=self.state, names=list(names),
            master_weights=group.get("master_weights", True), params=snap, dicts=dicts,
            items=_WATCH.watch_items(dicts), buckets=buckets, whole=whole)
        self._state_items = None

    def _reuse(self, index: int, group: Dict[str, Any]) -> Optional[Dict[BucketKey, Bucket]]:
        """Last step's lists with this step's grads, or None when anything they were built
        from changed.

        Checked every step, each in one pass at C speed (``csrc/python/list_watch.h``):
        the same group, state mapping, state names and ``master_weights``; every param the
        very object listed, with the same data pointer, numel, dtype and device (a
        replaced ``.data``, an added, removed, moved or replaced param misses) and a grad
        exactly where there was one; the optimizer's ``state`` mapping holding the same
        keys and values as after the last step that built lists (checked once per step in
        :meth:`step`: so each param still has its state dict); and each of those state
        dicts holding the very same keys and tensors (moments, step count, master).
        For a group that was one run of a flat buffer (``whole``), also every grad the
        very view object with its data pointer, and the run's step tensor still held by
        exactly its params (:func:`mixprec.flat.reuse_whole`).
        Anything else returns None and the lists are rebuilt. Tensors changed in place
        keep their identity and are read afresh by the kernels; the grads' layout (a
        sparse one is refused, naming it), sizes, dtypes and devices are checked by the op
        before it writes anything.
        """
        plan = self._plans.get(index)
        if (plan is None or plan.group is not group or plan.state is not self.state
                or plan.master_weights != group.get("master_weights", True)):
            return None
        grads = _WATCH.tensors_grads(group["params"], plan.params, not plan.whole)
        if (grads is None or plan.names != self.state_names(group)
                or not _WATCH.items_unchanged(plan.dicts, plan.items)):
            return None
        if plan.whole:
            key, bucket, _ = plan.buckets[0]
            ok = _flat.reuse_whole(self, group["params"], bucket)
            return {key: bucket} if ok else None
        out: Dict[BucketKey, Bucket] = {}
        for key, lists, ks in plan.buckets:  # (a loop: a comprehension costs 0.1 us more)
            out[key] = {**lists, "grads": grads if ks is None else [grads[k] for k in ks]}
        return out

    def _step_group(self, index: int, group: Dict[str, Any], grad_scale: Optional[Tensor],
                    found_inf: Optional[Tensor], clip_coef: Optional[Tensor],
                    compiling: bool) -> None:
        buckets, plain = self._buckets(index, group, compiling)
        none = grad_scale is None and found_inf is None and clip_coef is None
        seed = (int(group.get("seed", 0)) * 1_000_003 + index) & 0x7FFFFFFFFFFFFFFF
        on_device: Dict[torch.device, StepScalars] = {}  # (buckets of a device share them)
        for (device, _), bucket in buckets.items():
            scalars = _NO_SCALARS if none else on_device.get(device)
            if scalars is None:
                scalars = on_device[device] = StepScalars(
                    _on(grad_scale, device), _on(found_inf, device), _on(clip_coef, device))
            if plain is not None:  # flat-buffer mode: runs of flat params as slices
                bucket = _flat.coalesce_bucket(self, group, bucket, plain)
            self._run(bucket, group, self._lr_tensor(index, group, device), scalars, seed)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.optim.Adam/AdamW/SGD``.

        Param groups are matched as in torch. State is converted to this
        optimizer's layout (copies, so the loaded dict is not aliased): step
        counts become float32 tensors on the param's device, moments and
        buffers float32, and masters are taken from the dict when present,
        else built from the params (migration from a torch checkpoint). Keys
        this class does not set (``master_weights``, ``stochastic_rounding``,
        ``seed``...) are filled from its defaults.
        """
        saved_state = state_dict["state"]
        saved_groups = state_dict["param_groups"]
        super().load_state_dict(state_dict)
        self._lr_cache = {}
        self._plans = {}
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for key, saved in saved_state.items():
            p = id_map.get(key)
            if p is None:
                continue
            self.state[p] = self._convert_state(p, group_of[id(p)], saved)

    def _convert_state(self, p: Tensor, group: Dict[str, Any],
                       saved: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for k, v in saved.items():
            if isinstance(v, Tensor) and k != "step":
                dtype = torch.float32 if v.is_floating_point() else v.dtype
                out[k] = v.detach().to(device=p.device, dtype=dtype, copy=True)
                if _dtensor.is_dtensor(p):
                    out[k] = _dtensor.shard_like(out[k], p, f"state {k!r}")
            else:
                out[k] = v
        if "step" in saved and saved["step"] is not None:
            step = torch.as_tensor(saved["step"])
            out["step"] = step.detach().to(device=p.device, dtype=torch.float32,
                                           copy=True).reshape(())
        else:
            out["step"] = self._default_step(saved, p)
        if self.keeps_master(p, group) and out.get("master_param") is None:
            out["master_param"] = p.detach().to(torch.float32, copy=True)
        return out

    def _default_step(self, saved: Dict[str, Any], p: Tensor) -> Tensor:
        return torch.zeros((), dtype=torch.float32, device=p.device)


def coded_states(state: Tuple[Tuple[str, Optional[str], Optional[str]], ...]
                 ) -> Tuple[Tuple[str, str, str], ...]:
    """The states of a :attr:`FusedOptimizer.STATE` declaration that are 8-bit with
    ``state_bits=8``, as ``(name, name of its block maxima, code table)``."""
    return tuple((n, n + "_absmax", table) for n, _, table in state if table is not None)


def params_and_kwargs_check(cls: str, lr: Union[float, Tensor], differentiable: bool,
                            extra: Iterable[Tuple[str, Any]] = ()) -> None:
    """The argument checks shared by the constructors (ValueError, as torch)."""
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError(f"mixprec.optim.{cls}: a tensor lr must have one element, got "
                             f"shape {list(lr.shape)}")
        if not lr.is_floating_point():
            raise ValueError(f"mixprec.optim.{cls}: a tensor lr must be floating point, got "
                             f"{lr.dtype}")
    else:
        _check_nonneg(cls, "lr", lr)
    for name, value in extra:
        _check_nonneg(cls, name, value)
    if differentiable:
        raise ValueError(f"mixprec.optim.{cls}: differentiable=True is not supported (the "
                         "step is a fused in-place kernel); use torch.optim")
