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

import math
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _dtensor
from ..amp.protocol import StepScalars
from . import _sr

#: The scalars of a step given none (a plain ``opt.step()``): one shared value.
_NO_SCALARS = StepScalars(None, None, None)

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)

Bucket = Dict[str, List[Tensor]]
BucketKey = Tuple[torch.device, bool]


def _on(t: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    """A step scalar on ``device`` (copied ``non_blocking`` from elsewhere; None stays)."""
    return t if t is None or t.device == device else t.to(device, non_blocking=True)


def float32_copy(p: Tensor) -> Tensor:
    """A float32 copy of ``p``'s values: a master weight. A tensor subclass that is not a
    DTensor (torchao's float8 weight wrapper, whose ``to``/``clone`` keep the subclass and
    whose ``data_ptr()`` is 0) gets a plain tensor: optimizer state is never a subclass.
    A DTensor stays a DTensor (its state is sharded like it)."""
    t = p.detach()
    if type(t) is not Tensor and not _dtensor.is_dtensor(t):
        out = torch.empty(t.shape, dtype=torch.float32, device=t.device)
        out.copy_(t)
        return out
    return t.to(torch.float32, copy=True)


def _lr_at(table: Dict[Optional[torch.device], Tensor], step: Tensor,
           device: torch.device) -> Tensor:
    """``table``'s lr after ``step`` steps taken (the last one past its end), as a 0-dim
    float64 tensor on ``device``: a gather on the device, no sync. ``table`` holds the
    host copy under ``None`` and the copy on each device used (state, made once)."""
    values = table.get(device)
    if values is None:
        values = table[device] = table[None].to(device)
    index = step.detach().to(torch.long).clamp(0, values.numel() - 1).reshape(1)
    return values.index_select(0, index).reshape(())


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


#: How torch.optim words a bad value of each checked argument (``ValueError``).
_INVALID = {"lr": "Invalid learning rate", "eps": "Invalid epsilon value",
            "weight_decay": "Invalid weight_decay value", "momentum": "Invalid momentum value",
            "dampening": "Invalid dampening value"}


def _check_nonneg(cls: str, name: str, value: Any) -> None:
    """``value`` must be a finite number >= 0: ValueError worded as torch's otherwise."""
    if isinstance(value, Tensor):
        return  # a tensor is not read on the host (that would sync)
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"mixprec.optim.{cls}: {_INVALID.get(name, 'Invalid ' + name)}: "
                         f"{value} (must be a finite number >= 0)")


class FusedOptimizer(torch.optim.Optimizer):
    """Base class of :class:`~mixprec.optim.Adam`, :class:`~mixprec.optim.AdamW`
    and :class:`~mixprec.optim.SGD`; not used directly.

    Subclasses declare :attr:`STATE` (their per-param state besides step/master) and
    define ``_run(bucket, group, args)``: the ops' step, ``args`` the keyword arguments
    every fused optimizer op takes (``lr``, ``grad_scale``... ``seed``), theirs to extend.
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
        #: per param group index: the lr after k steps taken, k = 0.. (float64, on the
        #: group's devices once used): see :meth:`lr_by_steps_taken`
        self._lr_tables: Dict[int, Dict[Optional[torch.device], Tensor]] = {}
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
        (``"<name>_absmax"``)."""
        names = []
        for n, option, _ in self.STATE:  # (a loop: a comprehension costs 0.1 us more here)
            if option is None or group[option]:
                names.append(n)
        if names and group.get("state_bits", 32) == 8:
            names += [absmax for n, absmax, _ in coded_states(self.STATE) if n in names]
        return names

    def _run(self, bucket: Bucket, group: Dict[str, Any], args: Dict[str, Any]) -> None:
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
        self.__dict__.setdefault("_lr_cache", {})
        self.__dict__.setdefault("_lr_tables", {})
        for group in self.param_groups:
            for key, value in self.defaults.items():
                if key != "params":
                    group.setdefault(key, value)

    def keeps_master(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p`` (of ``group``) has a float32 master in its state: a 16-bit
        param of a group with ``master_weights``."""
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
                    out.append(float32_copy(p))
                else:
                    out.append(p)
        return out

    def lr_by_steps_taken(self, scheduler: Any, num_steps: int) -> None:
        """Make each step's lr the one ``scheduler`` gives after as many steps as this
        optimizer has **taken**, so that steps skipped on the device (an inf/NaN under a
        GradScaler) do not advance the schedule -- without a host sync.

        A skipped step is invisible on the host (no sync tells anyone), so frameworks
        that step their LR scheduler after every optimizer step (the HF Trainer,
        Accelerate, Lightning with torch's fused optimizers) advance it over skipped
        steps too. With this, the lr a kernel uses is read on the device from a table of
        ``scheduler``'s values, indexed by the step count the kernels keep (the first
        param with a grad of the group, on each device), which a skipped step does not
        advance. The scheduler itself is left as it was; it may go on being stepped (and
        logged: its ``get_last_lr()`` then counts calls, not steps taken) -- ``group["lr"]``
        no longer reaches the kernels.

        Call before the first step, with the scheduler as constructed (its
        ``last_epoch`` 0) and the optimizer's groups as they will train. The table is
        computed now by stepping ``scheduler`` ``num_steps`` times and restoring it
        (``state_dict``/``load_state_dict``; warnings of those calls are silenced);
        past ``num_steps`` taken steps the last value stays. Not in the optimizer's
        ``state_dict``: call again after building a fresh optimizer; loading a state
        dict keeps it, and the loaded step counts index it. ``ReduceLROnPlateau``
        (which needs metrics) is refused.

        Args:
            scheduler: a ``torch.optim.lr_scheduler.LRScheduler`` of this optimizer.
            num_steps: how many taken steps to tabulate (e.g. the run's total).
        """
        import warnings

        name = f"mixprec.optim.{type(self).__name__}.lr_by_steps_taken"
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise TypeError(f"{name}: ReduceLROnPlateau depends on metrics, not on the "
                            "step count; it cannot be tabulated")
        if getattr(scheduler, "optimizer", None) is not self:
            raise ValueError(f"{name}: scheduler must be a scheduler of this optimizer")
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"{name}: num_steps must be a positive int, got {num_steps!r}")
        if getattr(scheduler, "last_epoch", 0) != 0 or any(
                "step" in st for st in self.state.values() if isinstance(st, dict)):
            raise RuntimeError(f"{name}: call it before the first step (the scheduler's "
                               "last_epoch and the optimizer's step counts must be 0)")
        saved = scheduler.state_dict()
        lrs = [g["lr"] for g in self.param_groups]
        rows: List[List[float]] = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(num_steps):
                    rows.append([float(g["lr"]) for g in self.param_groups])
                    scheduler.step()
        finally:
            scheduler.load_state_dict(saved)
            for g, lr in zip(self.param_groups, lrs):
                g["lr"] = lr
        self._lr_tables = {i: {None: torch.tensor([r[i] for r in rows], dtype=torch.float64)}
                           for i in range(len(self.param_groups))}

    @torch.no_grad()
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

        Runs under ``torch.no_grad()``. As for every torch optimizer,
        :class:`torch.optim.Optimizer` wraps it (once per class) so that step hooks
        and the profiler see it.

        Mutates the params, their masters and state; grads are read only.
        No host sync (the scalars are moved to each param device with
        ``non_blocking=True`` when they live elsewhere). Params on the ``meta``
        device get their state created and nothing computed (no data to compute on).

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
        for index, group in enumerate(self.param_groups):
            self._step_group(index, group, grad_scale, found_inf, clip_coef)
        return loss

    # -- internals ------------------------------------------------------------

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for name in self.state_names(group):
            if state.get(name) is None:
                state[name] = torch.zeros_like(p, dtype=torch.float32,
                                               memory_format=torch.preserve_format)
        if self.keeps_master(p, group) and state.get("master_param") is None:
            state["master_param"] = float32_copy(p)
        return state

    def _local_state(self, name: str, t: Tensor, p: Tensor) -> Tensor:
        """What the kernels take for state ``name`` of DTensor param ``p``: its shard."""
        return _dtensor.local(t)

    def lr_tensor(self, index: int, device: torch.device) -> Tensor:
        """The 0-dim lr tensor the kernels of ``param_groups[index]`` read on ``device``.

        A tensor ``lr`` (float32/float64, one element, on ``device``) is returned itself,
        read in place; another tensor, converted. A float ``lr`` is kept as one float64
        tensor per (group, device) for the optimizer's life (checkpoint loads included),
        refilled in place (``fill_``, no sync) when the group's ``lr`` changed: a CUDA
        graph that captured the step reads the new value once this ran before its replay
        (:func:`mixprec.capture_step` calls it).
        """
        lr = self.param_groups[index]["lr"]
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

    def _check_param(self, index: int, k: int, p: Tensor, sharded: bool) -> None:
        """The checks of ``param_groups[index]['params'][k]`` before its state is created
        (and, for DTensor groups, every step): a dense grad, its dtype, a DTensor's layout.
        (Afterwards the op checks what it is given, sparse grads included, before it
        writes anything.)"""
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError(
                f"mixprec.optim.{type(self).__name__} does not support sparse gradients: "
                f"param_groups[{index}]['params'][{k}] has one (e.g. from "
                "nn.Embedding(sparse=True)). Use torch.optim.SGD or torch.optim.SparseAdam "
                "for those params (in a second optimizer), or a dense gradient (sparse=False)."
            )
        if sharded:
            _check_sharded(type(self).__name__, index, k, p)
        if p.dtype not in _SUPPORTED:
            raise RuntimeError(
                f"mixprec.optim.{type(self).__name__}: params must be float32, float16 or "
                f"bfloat16, got {p.dtype}; use torch.optim for other dtypes"
            )

    def _buckets(self, index: int, group: Dict[str, Any]) -> Dict[BucketKey, Bucket]:
        """The group's params with a grad, as the op's tensor lists per (device, has
        master), built afresh each step as torch.optim does, in one pass over the params.

        A param whose state lacks an entry (its first step, or an option that keeps more
        state was turned on) is checked and its state completed (:meth:`_init_state`);
        a DTensor (FSDP2) param runs as its local shard, its state as
        :meth:`_local_state` says.
        """
        names = self.state_names(group)
        take = itemgetter("step", *names)  # (one C call per param; KeyError: incomplete)
        one = not names  # (itemgetter of one key returns the value, not a tuple)
        masters_on = group.get("master_weights", True)
        sharded = _dtensor.any_dtensor(group["params"])
        states = self.state
        buckets: Dict[BucketKey, Bucket] = {}
        rows: Dict[BucketKey, List[Any]] = {}
        for k, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            state = states[p]
            keeps = masters_on and p.dtype in _LOW_PRECISION  # (self.keeps_master, inline)
            master = state.get("master_param") if keeps else None
            try:
                if sharded or (keeps and master is None):
                    raise KeyError("master_param")  # (checked, then completed, below)
                row = take(state)
            except KeyError:
                self._check_param(index, k, p, sharded)
                state = self._init_state(p, group)
                master = state.get("master_param") if self.keeps_master(p, group) else None
                row = take(state)
            key = (p.device, master is not None)
            b = buckets.get(key)
            if b is None:
                b = buckets[key] = {"params": [], "grads": [], "master_params": []}
                rows[key] = []
            b["params"].append(p)
            b["grads"].append(g)
            if master is not None:
                b["master_params"].append(master)
            rows[key].append(row)
        for key, b in buckets.items():  # the state columns, each in one C pass
            columns = [rows[key]] if one else list(map(list, zip(*rows[key])))
            b["state_steps"] = columns[0]
            for n, column in zip(names, columns[1:]):
                b[n] = column
            if sharded:  # a DTensor's kernels take its shard
                if group.get("stochastic_rounding", False):  # (its elements' SR numbers)
                    b["sr_extents"] = [_sr.extent(p) for p in b["params"]]
                for n in names:
                    b[n] = [self._local_state(n, t, p) for t, p in zip(b[n], b["params"])]
                for n in ("params", "grads", "master_params", "state_steps"):
                    b[n] = _dtensor.locals_of(b[n])
        return buckets

    def _step_group(self, index: int, group: Dict[str, Any], grad_scale: Optional[Tensor],
                    found_inf: Optional[Tensor], clip_coef: Optional[Tensor]) -> None:
        buckets = self._buckets(index, group)
        none = grad_scale is None and found_inf is None and clip_coef is None
        seed = (int(group.get("seed", 0)) * 1_000_003 + index) & 0x7FFFFFFFFFFFFFFF
        on_device: Dict[torch.device, StepScalars] = {}  # (buckets of a device share them)
        for (device, _), bucket in buckets.items():
            if device.type == "meta":
                continue  # no data: nothing to compute (as torch's kernels on meta tensors)
            scalars = _NO_SCALARS if none else on_device.get(device)
            if scalars is None:
                scalars = on_device[device] = StepScalars(
                    _on(grad_scale, device), _on(found_inf, device), _on(clip_coef, device))
            table = self._lr_tables.get(index)
            lr = self.lr_tensor(index, device) if table is None else \
                _lr_at(table, bucket["state_steps"][0], device)
            sr = bool(group.get("stochastic_rounding", False)) and not bucket["master_params"]
            self._run(bucket, group, dict(
                vars(scalars), lr=lr, weight_decay=float(group["weight_decay"]),
                maximize=bool(group["maximize"]), stochastic_rounding=sr, seed=seed))

    #: Group options a loaded state dict does not change (the 8-bit mixin's
    #: ``state_bits``: the layout is this optimizer's choice, the values are converted).
    _KEPT_ON_LOAD: ClassVar[Tuple[str, ...]] = ()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.optim.Adam/AdamW/SGD``.

        Param groups are matched as in torch, and torch's load_state_dict hooks run as
        in torch: the pre hooks first; the state is then converted to this optimizer's
        layout, from the dict the pre hooks left, before any post hook runs (so a post
        hook sees what a step will use). Conversion (copies, so the loaded dict is not
        aliased): step counts become float32 tensors on the param's device, moments
        and buffers float32, and masters are taken from the dict when present, else
        built from the params (migration from a torch checkpoint). Keys this class does
        not set (``master_weights``, ``stochastic_rounding``, ``seed``...) are filled
        from its defaults. Entries of ``state`` whose key is not a param are kept as
        they are, as torch does.
        """
        loaded: List[Dict[str, Any]] = []
        kept = [{k: g[k] for k in self._KEPT_ON_LOAD if k in g} for g in self.param_groups]

        def check(opt: torch.optim.Optimizer, sd: Dict[str, Any]) -> None:
            self._check_loadable(sd)  # before anything is loaded
            loaded.append(sd)

        def convert(opt: torch.optim.Optimizer) -> None:
            for g, options in zip(self.param_groups, kept):
                g.update(options)
            self._convert_loaded(loaded[-1])

        # (registered now: the check runs after the user's pre hooks, the conversion
        # before the user's post hooks; both removed again whatever happens)
        pre = self.register_load_state_dict_pre_hook(check)
        post = self.register_load_state_dict_post_hook(convert, prepend=True)
        try:
            super().load_state_dict(state_dict)
        finally:
            pre.remove()
            post.remove()

    def _check_loadable(self, state_dict: Dict[str, Any]) -> None:
        """Raise before anything is loaded when ``state_dict`` cannot be (the 8-bit
        mixin checks its coded moments); nothing to check here."""

    def _convert_loaded(self, state_dict: Dict[str, Any]) -> None:
        """Replace the state torch loaded (cast to the params' dtypes) by the saved
        entries converted to this optimizer's layout (:meth:`_convert_state`)."""
        saved_groups = state_dict["param_groups"]
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for key, saved in state_dict["state"].items():
            p = id_map.get(key)
            if p is None:
                continue  # not a param's: torch kept it as it is
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
            out["master_param"] = float32_copy(p)
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
            raise ValueError(f"mixprec.optim.{cls}: Tensor lr must be 1-element, got "
                             f"shape {list(lr.shape)}")
        if not lr.is_floating_point():
            raise ValueError(f"mixprec.optim.{cls}: Tensor lr must be floating point, got "
                             f"{lr.dtype}")
    else:
        _check_nonneg(cls, "lr", lr)
    for name, value in extra:
        _check_nonneg(cls, name, value)
    if differentiable:
        raise ValueError(f"mixprec.optim.{cls}: differentiable=True is not supported (the "
                         "step is a fused in-place kernel); use torch.optim")
