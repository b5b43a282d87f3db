"""Shared machinery of mixprec's fused master-weight optimizers.

:class:`FusedOptimizer` is a :class:`torch.optim.Optimizer` whose ``step`` runs one fused
mixprec op per (device, with/without masters) bucket of a param group: per-param state
(float32 step count on the param's device, float32 moments and masters), the amp contract
(scalars read on the device), ``lr`` as a device tensor (no sync), and loading of mixprec
and torch.optim state dicts.
"""

from __future__ import annotations

import math
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _dtensor
from .._step import StepScalars, warn_ineffective
from . import _sr
from ._masters import CORRECTION_DTYPES, check_bits, decode_master, recode, split_master

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: the state entry holding a param's master, by master form (others: the split one's)
_MASTER_KEY: Dict[Optional[torch.dtype], Tuple[str, ...]] = {None: (),
                                                             torch.float32: ("master_param",)}
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)

Bucket = Dict[str, List[Tensor]]
#: (device, the dtype of the bucket's master state: None without masters, float32, or the
#: int16/int8 correction of split masters): one master form per op call
BucketKey = Tuple[torch.device, Optional[torch.dtype]]


def _entries_getter(keys: Tuple[str, ...]) -> Callable[[Dict[str, Any]], Tuple[Any, ...]]:
    """A function of a param's state returning its entries ``keys`` as a tuple, in one
    call (KeyError naming a missing one)."""
    if len(keys) > 1:
        return itemgetter(*keys)
    key = keys[0]
    return lambda state: (state[key],)


def _on(scalars: StepScalars, device: torch.device) -> StepScalars:
    """``scalars`` on ``device`` (copied ``non_blocking`` where elsewhere). No host sync."""
    given = (scalars.grad_scale, scalars.found_inf, scalars.clip_coef)
    if (given[0] is None and given[1] is None and given[2] is None) or all(
            not isinstance(t, Tensor) or t.device == device for t in given):
        return scalars
    return StepScalars(*(t if not isinstance(t, Tensor) or t.device == device
                         else t.to(device, non_blocking=True) for t in given))


def float32_copy(p: Tensor) -> Tensor:
    """A float32 copy of ``p``: a master weight. A DTensor stays one; another subclass
    (torchao's float8 wrapper) gets a plain tensor: state is never such a subclass."""
    t = p.detach()
    if type(t) is not Tensor and not _dtensor.is_dtensor(t):
        return torch.empty(t.shape, dtype=torch.float32, device=t.device).copy_(t)
    return t.to(torch.float32, copy=True)


def _lr_at(table: Dict[Any, Tensor], step: Tensor, device: torch.device) -> Tensor:
    """``table``'s lr after ``step`` steps taken (the last one past its end), a 0-dim
    float64 tensor on ``device`` (a gather, no sync). ``table``: the host copy under
    ``None``, a copy per device used. With ``restart=True`` it counts from the step count
    its first step finds: that count under ``("base", device)``, a flag set when the table
    was (re)made under ``("pending", device)``, both on the device (a graph re-reads them)."""
    values = table.get(device)
    if values is None:
        values = table[device] = table[None].to(device)
    step = step.detach()
    if "restart" in table:
        base, pending = table.get(("base", device)), table.get(("pending", device))
        if base is None:
            base = table[("base", device)] = torch.zeros((), dtype=step.dtype, device=device)
            pending = table[("pending", device)] = torch.ones((), dtype=torch.float32,
                                                             device=device)
        base.copy_(torch.where(pending > 0, step.reshape(()), base))
        pending.zero_()
        step = step - base
    index = step.to(torch.long).clamp(0, values.numel() - 1).reshape(1)
    return values.index_select(0, index).reshape(())


def _check_sharded(cls: str, index: int, k: int, p: Tensor) -> None:
    """A param of a DTensor (FSDP2) group: a DTensor with a grad laid out as it."""
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


class FusedOptimizer(torch.optim.Optimizer):
    """Base class of :class:`~mixprec.optim.Adam`, :class:`~mixprec.optim.AdamW`
    and :class:`~mixprec.optim.SGD`; not used directly.

    Subclasses declare :attr:`STATE` and define ``_run(bucket, group, scalars, args)``: the
    ops' step, ``scalars`` the :class:`~mixprec._step.StepScalars` on the bucket's
    device, ``args`` the keyword arguments every fused optimizer op takes (``lr``,
    ``weight_decay``... ``seed``), theirs to extend.
    """

    #: GradScaler contract (torch's): unscales in its kernel, skips on the device on inf.
    _step_supports_amp_scaling = True
    #: mixprec's extension (what mixprec.GradScaler looks for): ``step(grad_scale=,
    #: found_inf=, clip_coef=)`` takes the scalars, so ``clip_grad_norm_`` can be folded in.
    _step_takes_scalars = True

    def __init__(self, params: Any, defaults: Dict[str, Any]) -> None:
        self._lr_cache: Dict[Tuple[int, torch.device], Tuple[float, Tensor]] = {}
        #: per group index: the :meth:`lr_by_steps_taken` table (see :func:`_lr_at`)
        self._lr_tables: Dict[int, Dict[Any, Tensor]] = {}
        # [whether _warn_ineffective_rounding ran]: a list, mutated in place, as torch 2.11's
        # torch.compile traces no attribute set on an optimizer
        self._rounding_checked = [False]
        self._table_calls = [0, 0]  # lr_by_steps_taken: step() calls since, num_steps
        super().__init__(params, defaults)

    #: The per-param state besides ``step`` and ``master_param``, in the op's order: ``(name,
    #: the group option that keeps it or None for always, its 8-bit code table or None)``.
    STATE: ClassVar[Tuple[Tuple[str, Optional[str], Optional[str]], ...]] = ()

    def state_names(self, group: Dict[str, Any]) -> List[str]:
        """The per-param state a step of ``group`` uses besides ``step`` and
        ``master_param``, in the op's order (e.g. ``["exp_avg", "exp_avg_sq"]``), then with
        ``state_bits=8`` the 8-bit ones' maxima (``"<name>_absmax"``)."""
        names = [n for n, option, _ in self.STATE if option is None or group[option]]
        if names and group.get("state_bits", 32) == 8:
            names += [absmax for n, absmax, _ in coded_states(self.STATE) if n in names]
        return names

    @property
    def master_weights(self) -> bool:
        """True when some param group keeps float32 masters for 16-bit params (a
        GradScaler may then accept float16 grads: the kernel unscales them in float32)."""
        return any(g.get("master_weights", False) for g in self.param_groups)

    def _warn_ineffective_rounding(self) -> None:
        """At the first step (dtypes final): an ``IneffectiveSettingWarning`` per group
        whose ``stochastic_rounding`` does nothing (float16 params, or no bfloat16 param
        without a master)."""
        self._rounding_checked[0] = True
        for index, group in enumerate(self.param_groups):
            if not group.get("stochastic_rounding"):
                continue
            params = group["params"]
            fp16 = any(p.dtype == torch.float16 for p in params)
            rounded = any(p.dtype == torch.bfloat16 and not self.keeps_master(p, group)
                          for p in params)
            if fp16 or not rounded:
                warn_ineffective(
                    f"mixprec.optim.{type(self).__name__}: param_groups[{index}] has "
                    "stochastic_rounding=True, which rounds only bfloat16 params without a "
                    "float32 master (master_weights=False); "
                    + ("its float16 params are rounded to nearest" if fp16 else
                       "no param of the group is one, so it does nothing"), stacklevel=5)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for key, value in (("_lr_cache", {}), ("_lr_tables", {}), ("_rounding_checked", [False]),
                           ("_table_calls", [0, 0])):
            self.__dict__.setdefault(key, value)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                if key != "params":
                    group.setdefault(key, value)

    def keeps_master(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p`` (of ``group``) has a float32 master in its state: a 16-bit
        param of a group with ``master_weights``."""
        return bool(group.get("master_weights", True)) and p.dtype in _LOW_PRECISION

    def master_form(self, p: Tensor, group: Dict[str, Any]) -> Optional[torch.dtype]:
        """The dtype of ``p``'s master state in ``group``: None without a master, float32
        for a float32 master (``state[p]["master_param"]``), int16 or int8 for a split one
        (``state[p]["master_correction"]``: a bfloat16 param of a group with
        ``master_correction_bits`` 16 or 8)."""
        if not self.keeps_master(p, group):
            return None
        bits = group.get("master_correction_bits")
        return (CORRECTION_DTYPES[bits] if bits is not None and p.dtype == torch.bfloat16
                else torch.float32)

    @torch.no_grad()
    def master_params(self) -> List[Tensor]:
        """The weights the optimizer updates, one per param in group order: a 16-bit
        param's float32 master (the state's tensor; a split master decoded from the param
        and its correction, :func:`~mixprec.optim.decode_master`, a fresh tensor; a fresh
        float32 copy before its first step), else the param itself (16-bit without
        masters). No host sync."""
        out: List[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p, {})
                master, c = state.get("master_param"), state.get("master_correction")
                out.append(master if master is not None else
                           decode_master(p, c) if c is not None else
                           float32_copy(p) if self.keeps_master(p, group) else p)
        return out

    def lr_by_steps_taken(self, scheduler: Any, num_steps: int, *,
                          restart: bool = False) -> Tensor:
        """Make each step's lr the one ``scheduler`` gives after as many steps as this
        optimizer has **taken**, so that steps skipped on the device (inf/NaN under a
        GradScaler) do not advance the schedule, without a host sync.

        The kernels read the lr on the device from a table of ``scheduler``'s values,
        indexed by the step count they keep (the group's first param with a grad, per
        device); ``group["lr"]`` no longer reaches them. The scheduler is left as it was
        (stepping it on only changes its ``get_last_lr()``).

        Call before the first step, with the scheduler as constructed (``last_epoch`` 0).
        The table is computed now by stepping ``scheduler`` ``num_steps`` times and
        restoring it; past ``num_steps`` taken steps the last value stays, and the step
        call past ``num_steps`` calls warns once (``IneffectiveSettingWarning``). Not in
        ``state_dict``: call again on a fresh optimizer; loading keeps it.

        With ``restart=True`` it may be called at any point, ``scheduler`` standing at the
        schedule of the steps taken so far (the trainer's catch-up): row 0 is the next
        step's lr whatever step count it finds, and an unchanged ``num_steps`` refills the
        table in place (a captured graph reads the new rows).

        Args:
            scheduler: a ``torch.optim.lr_scheduler.LRScheduler`` of this optimizer.
            num_steps: how many taken steps to tabulate (e.g. the run's total).
            restart: tabulate from the scheduler's state now (see above).

        Returns:
            The table, ``[num_steps, len(param_groups)]`` float64 on the CPU: row ``k``
            holds each group's lr after ``k`` steps taken (from now, with ``restart``).

        Raises:
            TypeError: ``ReduceLROnPlateau``.
            ValueError: another optimizer's scheduler, or ``num_steps`` not an int >= 1.
            RuntimeError: without ``restart``, called after the first step.
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
        if not restart and (getattr(scheduler, "last_epoch", 0) != 0 or any(
                "step" in st for st in self.state.values() if isinstance(st, dict))):
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
        self._table_calls = [0, num_steps]
        values = torch.tensor(rows, dtype=torch.float64)
        old, self._lr_tables = self._lr_tables, {}
        for i in range(len(self.param_groups)):
            column = values[:, i].contiguous()
            table = old.get(i)
            if not (restart and table is not None and "restart" in table
                    and table[None].shape == column.shape):
                table = {None: column, "restart": column} if restart else {None: column}
            else:  # refilled in place: the tensors a captured step reads stay
                for key, t in table.items():
                    if key is None or isinstance(key, torch.device):
                        t.copy_(column, non_blocking=True)
                    elif key[0] == "pending":
                        t.fill_(1.0)
            self._lr_tables[i] = table
        return values

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
            closure: re-evaluates the model and returns the loss (run with grad enabled).
            grad_scale: one-element float32 tensor, the scale the grads carry (they are
                multiplied by its float64 reciprocal in the kernel).
            found_inf: one-element float32 tensor; non-zero skips the step on the device
                (params, masters, state and step counts unchanged).
            clip_coef: one-element float32 tensor multiplied into the grads (a folded clip).

        :class:`mixprec.GradScaler` passes these three; each left None defaults to the
        attribute of that name (how ``torch.amp.GradScaler`` hands over the first two).

        Mutates the params, masters and state; grads are read only. No host sync (scalars
        on another device are copied ``non_blocking``). Params on ``meta`` get state only.

        Raises:
            RuntimeError: a scalar that is not a one-element float32 tensor (nothing
                changed).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scalars = StepScalars(
            getattr(self, "grad_scale", None) if grad_scale is None else grad_scale,
            getattr(self, "found_inf", None) if found_inf is None else found_inf,
            getattr(self, "clip_coef", None) if clip_coef is None else clip_coef)
        if not (scalars.grad_scale is None and scalars.found_inf is None
                and scalars.clip_coef is None):
            self._check_scalars(scalars)  # before any state is created
        if not self._rounding_checked[0]:
            self._warn_ineffective_rounding()
        if self._lr_tables:
            calls = self._table_calls
            calls[0] += 1
            if calls[0] == calls[1] + 1:
                warn_ineffective(
                    f"mixprec.optim.{type(self).__name__}: step() called more times "
                    f"({calls[0]}) than lr_by_steps_taken's num_steps ({calls[1]}); once "
                    f"{calls[1]} steps are taken the lr stays at the table's last value: "
                    "pass the run's total number of steps", stacklevel=4)
        for index, group in enumerate(self.param_groups):
            self._step_group(index, group, scalars)
        return loss

    def _check_scalars(self, scalars: StepScalars) -> None:
        """RuntimeError naming the first of ``scalars`` that is neither None nor a float32
        tensor with one element (attribute reads: torch 2.11's torch.compile traces no
        ``vars()`` of a frozen dataclass)."""
        for name, t in (("grad_scale", scalars.grad_scale), ("found_inf", scalars.found_inf),
                        ("clip_coef", scalars.clip_coef)):
            if t is not None and not (isinstance(t, Tensor) and t.dtype == torch.float32
                                      and t.numel() == 1):
                got = (f"{t.dtype} of shape {list(t.shape)}" if isinstance(t, Tensor)
                       else type(t).__name__)
                raise RuntimeError(f"mixprec.optim.{type(self).__name__}.step: {name} must "
                                   f"be a float32 tensor with one element, got {got}")

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for name in self.state_names(group):
            if state.get(name) is None:
                state[name] = torch.zeros_like(p, dtype=torch.float32,
                                               memory_format=torch.preserve_format)
        form = self.master_form(p, group)
        if form is not None:
            _complete_master(state, p, form)
        return state

    @torch.no_grad()
    def step_groups_with_grads(self, groups: Iterable[int]) -> None:
        """Step the params of ``param_groups[i]``, for each ``i`` in ``groups``, that hold a
        grad: :meth:`step`'s update of those params, without its step hooks, closure,
        scalars (``grad_scale``, ``found_inf``, ``clip_coef``) or call count. What
        :func:`mixprec.optim.release_gradients` runs for a bucket during backward.
        Mutates those params, their masters and state; no host sync."""
        scalars = StepScalars(None, None, None)
        for index in groups:
            self._step_group(index, self.param_groups[index], scalars)

    def lr_tensor(self, index: int, device: torch.device) -> Tensor:
        """The 0-dim lr tensor the kernels of ``param_groups[index]`` read on ``device``. A
        one-element float32/float64 tensor ``lr`` on ``device`` is returned itself;
        another tensor is converted. A float ``lr`` is kept as one float64 tensor per
        (group, device), refilled in place (``fill_``, no sync) when it changed, so a
        captured graph replayed after this call reads the new value."""
        lr = self.param_groups[index]["lr"]
        if isinstance(lr, Tensor):
            if lr.device == device and lr.dtype in (torch.float32, torch.float64) \
                    and lr.numel() == 1:
                return lr  # read in place: in-place updates reach captured graphs
            return lr.detach().to(device=device, dtype=torch.float64,
                                  non_blocking=True).reshape(())
        key, value = (index, device), float(lr)
        cached = self._lr_cache.get(key)
        if cached is None:
            cached = (value, torch.full((), value, dtype=torch.float64, device=device))
        elif cached[0] != value:
            cached = (value, cached[1].fill_(value))
        self._lr_cache[key] = cached
        return cached[1]

    def _check_param(self, index: int, k: int, p: Tensor, sharded: bool,
                     group: Dict[str, Any]) -> None:
        """Checks of ``param_groups[index]['params'][k]`` before its state is created (each
        step for DTensor groups): a dense grad, the dtype, a DTensor's layout, no float16
        param under ``master_correction_bits``."""
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
        _check_split_dtypes(type(self).__name__, index, [p], group, first=k)

    def _buckets(self, index: int, group: Dict[str, Any]) -> Dict[BucketKey, Bucket]:
        """The group's params with a grad as the op's tensor lists per (device, has
        master), built afresh each step. A param whose state lacks an entry is checked and
        its state completed (:meth:`_init_state`); so is every param of a DTensor group,
        which runs as its local shard (its state too)."""
        names = self.state_names(group)
        masters_on = bool(group.get("master_weights", True))
        split = CORRECTION_DTYPES.get(group.get("master_correction_bits"))  # type: ignore
        sharded = _dtensor.any_dtensor(group["params"])
        # the rule of master_form, per param dtype (another dtype: _check_param refuses it)
        low = torch.float32 if masters_on else None
        forms = {torch.float16: low, torch.bfloat16: low if split is None or not masters_on
                 else split}
        # per master form: the state entries in the op's order ("step", the names, then
        # the master's), read in one call; a missing one raises KeyError
        getters: Dict[Optional[torch.dtype], Callable[[Dict[str, Any]], Tuple[Any, ...]]] = {}
        state_of = self.state
        # per (device, master form): (param, grad, its state entries) per param
        rows: Dict[BucketKey, List[Tuple[Tensor, Tensor, Tuple[Any, ...]]]] = {}
        for k, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            form = forms.get(p.dtype)
            get = getters.get(form)
            if get is None:
                get = getters[form] = _entries_getter(
                    ("step", *names, *_MASTER_KEY.get(form, ("master_correction",))))
            try:
                if sharded:
                    raise KeyError
                entries = get(state_of[p])
                if form is not None and form is not torch.float32 \
                        and entries[-1].dtype != form:
                    raise KeyError  # a correction of the other width: re-encoded
            except KeyError:
                self._check_param(index, k, p, sharded, group)
                entries = get(self._init_state(p, group))
            key = (p.device, form)
            out = rows.get(key)
            if out is None:
                out = rows[key] = []
            out.append((p, grad, entries))
        buckets: Dict[BucketKey, Bucket] = {}
        for key, part in rows.items():
            params, grads, entries = (list(c) for c in zip(*part))
            columns = [list(c) for c in zip(*entries)]
            b = buckets[key] = {"params": params, "grads": grads,
                                "master_params": [] if key[1] is None else columns[-1],
                                "state_steps": columns[0]}
            b.update(zip(names, columns[1:]))
            if sharded:  # the kernels take the local shards (and the SR element numbers)
                if group.get("stochastic_rounding", False):
                    b["sr_extents"] = [_sr.extent(p) for p in params]
                for n in ("params", "grads", "master_params", "state_steps", *names):
                    b[n] = _dtensor.locals_of(b[n])
        return buckets

    def _step_group(self, index: int, group: Dict[str, Any], scalars: StepScalars) -> None:
        buckets = self._buckets(index, group)
        seed = (int(group.get("seed", 0)) * 1_000_003 + index) & 0x7FFFFFFFFFFFFFFF
        on_device: Dict[torch.device, StepScalars] = {}
        for (device, _), bucket in buckets.items():
            if device.type == "meta":
                continue  # no data to compute on
            if device not in on_device:
                on_device[device] = _on(scalars, device)
            table = self._lr_tables.get(index)
            lr = self.lr_tensor(index, device) if table is None else \
                _lr_at(table, bucket["state_steps"][0], device)
            sr = bool(group.get("stochastic_rounding", False)) and not bucket["master_params"]
            self._run(bucket, group, on_device[device], dict(
                lr=lr, weight_decay=float(group["weight_decay"]),
                maximize=bool(group["maximize"]), stochastic_rounding=sr, seed=seed))

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's ``add_param_group``; a group whose options (its own, else the defaults)
        combine ``amsgrad=True`` with ``state_bits=8``, have a ``master_correction_bits``
        other than None/16/8, or set it with masters for a float16 param is refused
        (ValueError), unadded."""
        index = len(self.param_groups)
        options = {**self.defaults, **param_group}
        _check_combination(f"mixprec.optim.{type(self).__name__}: param_groups[{index}]",
                           options)
        params = param_group.get("params")
        if params is not None and not isinstance(params, (Tensor, list, tuple, set)):
            param_group["params"] = params = list(params)  # (a generator: read once)
        _check_split_dtypes(type(self).__name__, index,
                            [params] if isinstance(params, Tensor) else list(params or ()),
                            options)
        super().add_param_group(param_group)

    #: Group options every saved group has besides ``params``, ``lr``, ``weight_decay``.
    REQUIRED_OPTIONS: ClassVar[Tuple[str, ...]] = ()
    #: Whether a param's saved state may lack ``step`` (torch's SGD keeps none).
    STEP_OPTIONAL: ClassVar[bool] = False
    #: Group options a load does not change (the state is converted to them).
    _KEPT_ON_LOAD: ClassVar[Tuple[str, ...]] = ("master_correction_bits",)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.optim.Adam/AdamW/SGD``.

        Groups are matched and hooks run as in torch; the state is converted from the
        dict the pre hooks left, before any post hook runs. Conversion copies: step counts
        become float32 tensors on the param's device, moments float32, masters are taken
        from the dict or built from the params (a torch checkpoint). Missing options
        (``master_weights``, ``seed``...) come from the defaults. ``state`` entries whose
        key is not a param (nor an int: an unknown param id is refused) are kept.

        Raises:
            TypeError, ValueError: :meth:`check_state_dict`'s, run after the pre hooks;
                the optimizer is left as it was (state, groups, lr tensors), as it is
                when anything later (a post hook) raises.
        """
        loaded: List[Dict[str, Any]] = []
        kept = [{k: g[k] for k in self._KEPT_ON_LOAD if k in g} for g in self.param_groups]

        def check(opt: torch.optim.Optimizer, sd: Dict[str, Any]) -> None:
            self.check_state_dict(sd)  # before anything is loaded
            loaded.append(sd)

        def convert(opt: torch.optim.Optimizer) -> None:
            # the saved state, converted, replaces torch's (other entries: kept as torch did)
            sd = loaded[-1]
            for g, options in zip(self.param_groups, kept):
                g.update(options)
            ids = chain.from_iterable(g["params"] for g in sd["param_groups"])
            mine = dict(zip(ids, ((p, g) for g in self.param_groups for p in g["params"])))
            for key, saved in sd["state"].items():
                if key in mine:
                    p, g = mine[key]
                    self.state[p] = self._convert_state(p, g, saved)

        pre = self.register_load_state_dict_pre_hook(check)
        post = self.register_load_state_dict_post_hook(convert, prepend=True)
        # torch's load builds a new ``state`` and group dicts: the old ones are the old state
        before = (self.state, self.param_groups, [dict(g) for g in self.param_groups])
        try:
            super().load_state_dict(state_dict)
        except BaseException:
            self.state, self.param_groups = before[0], before[1]
            for g, saved in zip(self.param_groups, before[2]):
                g.clear()
                g.update(saved)
            raise
        finally:
            pre.remove()
            post.remove()

    def check_state_dict(self, state_dict: Any) -> None:
        """Raise when ``state_dict`` cannot be loaded into this optimizer, changing
        nothing (what :meth:`load_state_dict` runs first). Checked against this optimizer's
        groups: the entries and their types, group and param counts, each known option's
        type and range, only known state keys, ``step`` a whole number >= 0, moments and
        masters floating tensors of the param's shape (``master_param`` float32, only where
        one is kept), with data, finite (second moments >= 0), the group's moments present
        once stepped; 8-bit codes and maxima by the 8-bit layer. Syncs (reads values).

        Raises:
            TypeError: a wrong type (of the dict, an entry or a hyper-parameter).
            ValueError: a wrong shape, dtype, device, value or key, naming it, e.g.
                ``state[0]['exp_avg']``, and saying what was expected.
        """
        check_state_dict32(self, state_dict)
        self._check_loadable(state_dict)

    def _check_loadable(self, state_dict: Dict[str, Any]) -> None:
        """The 8-bit mixin's checks of its coded moments; none here."""

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
        step = saved.get("step")
        if step is None:  # (torch's SGD keeps none: a stored buffer means steps were taken)
            step = 1.0 if isinstance(saved.get("momentum_buffer"), Tensor) else 0.0
        out["step"] = torch.as_tensor(step).detach().to(device=p.device, dtype=torch.float32,
                                                        copy=True).reshape(())
        # a master of the other form is converted where the step first needs it (it reads
        # the param then, so a model loaded after the optimizer is used)
        if (self.master_form(p, group) is torch.float32 and out.get("master_param") is None
                and out.get("master_correction") is None):
            out["master_param"] = float32_copy(p)
        return out


def _complete_master(state: Dict[str, Any], p: Tensor, form: torch.dtype) -> None:
    """Give ``state`` the master of ``form`` (float32, or an int16/int8 correction),
    converting the one it holds: a float32 master becomes ``RNE_bf16(master)``, written into
    ``p``, and its correction; a correction of the other width is re-encoded against ``p``
    (``p`` kept); float32 from a correction: decoded with ``p``.
    No master yet: ``p``'s value (float32 copy, or a zero correction)."""
    master, c = state.get("master_param"), state.get("master_correction")
    with torch.no_grad():
        if form is torch.float32:
            if master is None:
                state["master_param"] = decode_master(p, c) if c is not None \
                    else float32_copy(p)
            state.pop("master_correction", None)
            return
        if master is None and c is not None and c.dtype == form:
            return
        if master is None and c is None:
            state["master_correction"] = torch.zeros_like(p, dtype=form,
                                                          memory_format=torch.preserve_format)
            return
        bits = next(b for b, dtype in CORRECTION_DTYPES.items() if dtype == form)
        if master is None:  # a correction of the other width, of the same param
            state["master_correction"] = recode(p, c, bits)
            return
        param, state["master_correction"] = split_master(master, bits)
        p.copy_(param)  # what the next float32-master step would have written
        state.pop("master_param", None)


def _check_split_dtypes(cls: str, index: int, params: List[Any], options: Dict[str, Any],
                        first: int = 0) -> None:
    """ValueError for a float16 param of a group with masters and
    ``master_correction_bits`` (or for a bad value of it)."""
    bits = options.get("master_correction_bits")
    check_bits(f"mixprec.optim.{cls}: param_groups[{index}]", bits)
    if bits is None or not options.get("master_weights", True):
        return
    for k, p in enumerate(params, first):
        if isinstance(p, Tensor) and p.dtype == torch.float16:
            raise ValueError(
                f"mixprec.optim.{cls}: param_groups[{index}]['params'][{k}] is float16 in a "
                f"group with master_correction_bits={bits}: a split master is a bfloat16 "
                "param plus a fixed-width correction, and float16's exponent range differs "
                "from float32's, so a float16 param cannot carry one. Use "
                "master_correction_bits=None (float32 masters) for float16 params (e.g. a "
                "param group of their own), or bfloat16 params")


def _check_correction(where: str, v: Any, p: Tensor, keeps: bool) -> None:
    """A saved ``master_correction`` of param ``p`` (``keeps``: the param keeps a master)."""
    if not (isinstance(v, Tensor) and v.dtype in (torch.int16, torch.int8)):
        raise ValueError(f"{where}: expected an int16 or int8 correction (a split master), "
                         f"got {_describe(v)}")
    if p.dtype != torch.bfloat16 or not keeps:
        raise ValueError(f"{where}: only a bfloat16 param with masters keeps a split master; "
                         f"this one is {p.dtype}" + ("" if keeps else ", master_weights=False")
                         + " (a checkpoint of another precision setup?)")
    if tuple(v.shape) != tuple(p.shape):
        raise ValueError(f"{where}: expected the param's shape {list(p.shape)}, got "
                         f"{_describe(v)} (the state of another model?)")
    if v.is_meta and not p.is_meta:
        raise ValueError(f"{where}: a tensor on 'meta' has no data to load; expected one on "
                         f"{p.device}")


#: Group options of a known type (checked at load).
_BOOL_OPTIONS = ("amsgrad", "maximize", "nesterov", "master_weights", "stochastic_rounding",
                 "decoupled_weight_decay")
_INT_OPTIONS = ("seed", "min_8bit_size")
#: State that is never negative (a negative one makes NaN params).
_NONNEGATIVE = ("exp_avg_sq", "max_exp_avg_sq")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _describe(v: Any) -> str:
    if isinstance(v, Tensor):
        kind = "DTensor" if _dtensor.is_dtensor(v) else "tensor"
        return f"a {v.dtype} {kind} of shape {list(v.shape)} on {v.device}"
    return f"{type(v).__name__} {v!r}" if len(repr(v)) < 60 else type(v).__name__


def _check_group_option(where: str, key: str, v: Any) -> None:
    """One option of a saved param group: the type and range its constructor takes."""
    if key == "lr" and isinstance(v, Tensor):
        if v.numel() != 1 or not v.is_floating_point():
            raise ValueError(f"{where}['lr']: expected a float >= 0 or a one-element floating "
                             f"tensor, got {_describe(v)}")
        return
    if key in _INVALID:
        if not _is_number(v):
            raise TypeError(f"{where}[{key!r}]: expected a float, got {_describe(v)}")
        if not (v >= 0.0 and math.isfinite(v)):
            raise ValueError(f"{where}[{key!r}]: expected a finite number >= 0, got {v!r}")
    elif key == "betas":
        ok = isinstance(v, (tuple, list)) and len(v) == 2
        for b in (v if ok else ()):
            if isinstance(b, Tensor) and b.numel() == 1:
                b = float(b.detach().cpu())
            ok = ok and _is_number(b) and 0.0 <= b < 1.0
        if not ok:
            raise ValueError(f"{where}['betas']: expected two floats in [0, 1), got "
                             f"{_describe(v)}")
    elif key in _BOOL_OPTIONS:
        if not isinstance(v, bool):
            raise TypeError(f"{where}[{key!r}]: expected a bool, got {_describe(v)}")
    elif key in _INT_OPTIONS:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}[{key!r}]: expected an int >= 0, got {_describe(v)}")
    elif key == "state_bits":
        if v not in (8, 32) or isinstance(v, bool):
            raise ValueError(f"{where}['state_bits']: expected 8 or 32, got {_describe(v)}")
    elif key == "master_correction_bits":
        check_bits(f"{where}['master_correction_bits']", v)


def _check_combination(where: str, options: Dict[str, Any]) -> None:
    """Options of one group that no step can honour together (ValueError)."""
    if options.get("amsgrad") and options.get("state_bits", 32) == 8:
        raise ValueError(f"{where}: amsgrad=True needs state_bits=32 (8-bit state keeps no "
                         "max_exp_avg_sq)")


def _check_step(where: str, v: Any) -> None:
    """A saved step count: a whole number >= 0 (a number or a one-element real tensor)."""
    value: Any = v
    if isinstance(v, Tensor):
        if v.numel() != 1 or v.is_complex() or v.dtype == torch.bool or v.is_meta:
            raise ValueError(f"{where}: expected a step count (a one-element real tensor "
                             f"or a number), got {_describe(v)}")
        value = _dtensor.local(v).detach().reshape(()).cpu().double().item()
    elif not _is_number(v):
        raise TypeError(f"{where}: expected a step count (a one-element tensor or a "
                        f"number), got {_describe(v)}")
    if not (math.isfinite(value) and value >= 0 and float(value).is_integer()):
        raise ValueError(f"{where}: expected a whole number of steps >= 0, got {value!r}")


def _check_state_tensor(where: str, name: str, v: Any, p: Tensor) -> None:
    """A saved moment or master of param ``p``."""
    if not isinstance(v, Tensor):
        raise TypeError(f"{where}: expected a float32 tensor, got {_describe(v)}")
    want = "float32" if name == "master_param" else "floating"
    if not v.is_floating_point() or (name == "master_param" and v.dtype != torch.float32):
        raise ValueError(f"{where}: expected a {want} tensor, got {_describe(v)}")
    if tuple(v.shape) != tuple(p.shape):
        raise ValueError(f"{where}: expected the param's shape {list(p.shape)}, got "
                         f"{_describe(v)} (the state of another model?)")
    if v.is_meta:
        if not p.is_meta:
            raise ValueError(f"{where}: a tensor on 'meta' has no data to load; expected "
                             f"one on {p.device}")
        return
    local = _dtensor.local(v).detach()
    if local.numel() and not bool(torch.isfinite(local).all()):
        raise ValueError(f"{where}: holds inf or NaN")
    if name in _NONNEGATIVE and local.numel() and bool((local < 0).any()):
        raise ValueError(f"{where}: a second moment must be >= 0, got a negative value "
                         f"({float(local.min())})")


def check_state_dict32(opt: FusedOptimizer, sd: Any, name: Optional[str] = None) -> None:
    """:meth:`FusedOptimizer.check_state_dict` but the 8-bit checks. ``opt``: an optimizer
    or an object with its attributes; ``name``: the messages' prefix."""
    name = name or f"mixprec.optim.{type(opt).__name__}.load_state_dict"
    if not isinstance(sd, dict):
        raise TypeError(f"{name}: state_dict must be a dict, got {type(sd).__name__}")
    for key in ("state", "param_groups"):
        if key not in sd:
            raise ValueError(f"{name}: state_dict has no {key!r} entry")
    extra = sorted(map(str, set(sd) - {"state", "param_groups"}))
    if extra:
        raise ValueError(f"{name}: unexpected keys {extra} in state_dict (expected 'state' "
                         "and 'param_groups')")
    groups, state = sd["param_groups"], sd["state"]
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        raise TypeError(f"{name}: state_dict['param_groups'] must be a list of dicts")
    if not isinstance(state, dict):
        raise TypeError(f"{name}: state_dict['state'] must be a dict, got "
                        f"{type(state).__name__}")
    if len(groups) != len(opt.param_groups):
        raise ValueError(f"{name}: state_dict has {len(groups)} param groups, this optimizer "
                         f"{len(opt.param_groups)}")
    index: Dict[Any, Tuple[Tensor, Dict[str, Any]]] = {}
    for i, (saved, mine) in enumerate(zip(groups, opt.param_groups)):
        where = f"{name}: param_groups[{i}]"
        ids = saved.get("params")
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"{where}['params']: expected a list of param ids, got "
                            f"{_describe(ids)}")
        if len(ids) != len(mine["params"]):
            raise ValueError(f"{where}['params']: {len(ids)} params, this optimizer's group "
                             f"has {len(mine['params'])}")
        absent = [k for k in ("lr", "weight_decay") + opt.REQUIRED_OPTIONS if k not in saved]
        if absent:
            raise ValueError(f"{where}: missing {absent} (a saved param group has them)")
        for k, v in saved.items():
            if k != "params":
                _check_group_option(where, k, v)
        options = {**opt.defaults, **mine, **saved}
        options.update({k: mine[k] for k in opt._KEPT_ON_LOAD if k in mine})
        _check_combination(where, options)
        for pid, p in zip(ids, mine["params"]):
            if pid in index:
                raise ValueError(f"{where}['params']: param id {pid!r} appears twice")
            index[pid] = (p, options)
    known = {"step", "master_param", "master_correction", *(n for n, _, _ in opt.STATE)}
    coded = coded_states(opt.STATE)
    if coded:
        known.update([absmax for _, absmax, _ in coded] + ["quant"])
    for key, st in state.items():
        where = f"{name}: state[{key!r}]"
        if key not in index:
            if isinstance(key, int) and not isinstance(key, bool):
                raise ValueError(f"{where}: no param of state_dict['param_groups'] has id "
                                 f"{key} (the state of another model or optimizer?)")
            continue  # not a param's entry: kept as it is, as torch does
        p, options = index[key]
        if not isinstance(st, dict):
            raise TypeError(f"{where}: expected a dict of state, got {_describe(st)}")
        unknown = sorted(map(str, set(st) - known))
        if unknown:
            raise ValueError(f"{where}: unexpected keys {unknown} (expected some of "
                             f"{sorted(known)})")
        if "step" not in st and not opt.STEP_OPTIONAL and any(
                isinstance(v, Tensor) for v in st.values()):
            raise ValueError(f"{where}: missing 'step' (the step count of a param with "
                             "state)")
        if "step" in st:
            _check_step(f"{where}['step']", st["step"])
            names = [n for n, option, _ in opt.STATE if option is None or options.get(option)]
            missing = [n for n in names if n not in st]
            if missing:
                raise ValueError(f"{where}: missing {missing} (a param that has stepped keeps "
                                 f"them with these options)")
        if "master_param" in st and "master_correction" in st:
            raise ValueError(f"{where}: holds both 'master_param' and 'master_correction' "
                             "(one master per param: float32, or split)")
        for k, v in st.items():
            if k == "master_correction":
                _check_correction(f"{where}['master_correction']", v, p,
                                  opt.keeps_master(p, options))
                continue
            if k in ("step", "quant") or k.endswith("_absmax") or (
                    isinstance(v, Tensor) and v.dtype == torch.uint8):
                continue  # 8-bit state: checked by the 8-bit layer
            if v is None and k != "master_param":
                continue  # torch's SGD keeps momentum_buffer=None without momentum
            if k == "master_param" and not opt.keeps_master(p, options):
                off = "" if options.get("master_weights", True) else ", master_weights=False"
                raise ValueError(
                    f"{where}['master_param']: this param keeps no master (it is "
                    f"{p.dtype}{off}); a checkpoint of another precision setup?")
            _check_state_tensor(f"{where}[{k!r}]", k, v, p)


def coded_states(state: Tuple[Tuple[str, Optional[str], Optional[str]], ...]
                 ) -> Tuple[Tuple[str, str, str], ...]:
    """The 8-bit states of a :attr:`FusedOptimizer.STATE`: ``(name, maxima's name, table)``."""
    return tuple((n, n + "_absmax", table) for n, _, table in state if table is not None)


def params_and_kwargs_check(cls: str, lr: Union[float, Tensor], differentiable: bool,
                            state_bits: Any, min_8bit_size: Any,
                            extra: Iterable[Tuple[str, Any]] = ()) -> None:
    """The argument checks shared by the constructors (ValueError, as torch); a tensor ``lr``
    or value of ``extra`` is not read (that would sync)."""
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError(f"mixprec.optim.{cls}: Tensor lr must be 1-element, got "
                             f"shape {list(lr.shape)}")
        if not lr.is_floating_point():
            raise ValueError(f"mixprec.optim.{cls}: Tensor lr must be floating point, got "
                             f"{lr.dtype}")
    for name, value in (("lr", lr), *extra):
        if isinstance(value, Tensor):
            continue
        if not _is_number(value):
            raise TypeError(f"mixprec.optim.{cls}: {name} must be a float, got "
                            f"{type(value).__name__} {value!r}")
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"mixprec.optim.{cls}: {_INVALID.get(name, 'Invalid ' + name)}: "
                             f"{value} (must be a finite number >= 0)")
    if differentiable:
        raise ValueError(f"mixprec.optim.{cls}: differentiable=True is not supported (the "
                         "step is a fused in-place kernel); use torch.optim")
    if state_bits not in (8, 32) or isinstance(state_bits, bool):
        raise ValueError(f"mixprec.optim.{cls}: state_bits must be 8 or 32, got "
                         f"{state_bits!r}")
    if not (isinstance(min_8bit_size, int) and min_8bit_size >= 0):
        raise ValueError(f"mixprec.optim.{cls}: min_8bit_size must be an int >= 0, got "
                         f"{min_8bit_size!r}")
