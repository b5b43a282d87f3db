"""Flat-buffer mode: a model's params and grads as views into one buffer per (device, dtype).

:func:`flat_buffers` moves every trainable parameter of a model into one contiguous
buffer per (device, dtype) (``param.data`` becomes a view of it; the
:class:`~torch.nn.Parameter` objects stay the same, so modules, optimizers and
``state_dict`` keys are untouched) and gives each parameter a gradient that is a view
of a second buffer of the same layout. :class:`mixprec.GradScaler` and the
:mod:`mixprec.optim` optimizers recognise such views and hand the kernels one tensor
per contiguous run of views instead of one per parameter, so the kernels' host work
per step no longer grows with the number of tensors. The optimizers then also keep
their float32 state (moments, momentum buffers, masters) as views of flat buffers of
the same layout, and the step counts of params stepped together as one shared tensor.

How the gradients stay views (checked on torch 2.4-2.14):

* ``zero_grad(set_to_none=False)`` zeroes each ``param.grad`` in place. Autograd's
  ``AccumulateGrad`` then adds the new gradient into the existing ``.grad`` in place
  (``grad += new`` when the backward does not create a graph), so the view stays.
* ``zero_grad(set_to_none=True)`` (torch.optim's default) and ``param.grad = x`` replace
  the view. ``AccumulateGrad`` then installs a new tensor (the incoming gradient itself
  or a copy). A post-accumulate-grad hook on every parameter
  (:meth:`torch.Tensor.register_post_accumulate_grad_hook`) copies that tensor into the
  view and sets ``param.grad`` back to the view, so after every backward the grads are
  views again. The copy is exact, so results are bitwise those of the same model
  without the mode.
* A gradient that requires grad (``backward(create_graph=True)``), has another dtype,
  shape or device, or a parameter whose ``.data`` was replaced (``model.to(...)`` after
  this call), is left alone: that parameter simply runs on the per-tensor path.

Detection (:func:`coalesce`, :func:`coalesce_bucket`) is exact and cheap: a tensor
counts as a view only if it is the very view object installed here (``id``) *and*
still has its data pointer. Views of one buffer that sit next to each other (their
order in the list does not matter for the elementwise kernels) become one 1-D slice of
the buffer; the padding between views (alignment, at most 15 bytes per view) is zero
in every buffer and stays zero under unscaling and under every optimizer update (a
zero gradient and zero state leave a zero weight unchanged). Anything else (a replaced
grad, a param without grad, a frozen param in the middle, other param groups) splits
the runs or stays per tensor: results never depend on the detection.

Not bitwise with the per-tensor path: the stochastic-rounding bits of bf16 params
without masters (they are numbered per launch chunk, so another layout draws other,
equally distributed bits) and the rounding of gradient norms (the partial sums are
combined over other chunks).
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["FlatBuffers", "flat_buffers"]

_ALIGN_BYTES = 16
_data_ptr = Tensor.data_ptr

# id(param) / id(grad view) -> (weakref to its _Buffer, index in it). Entries are
# removed when the buffer is collected (weakref.finalize); while it lives, it holds
# the objects, so an id cannot be reused.
_PARAMS: Dict[int, Tuple[weakref.ref[_Buffer], int]] = {}
_GRADS: Dict[int, Tuple[weakref.ref[_Buffer], int]] = {}


def _dense_strides(t: Tensor) -> bool:
    """Whether ``t`` covers exactly ``numel`` consecutive elements (any dim order)."""
    dims = sorted((s, st) for s, st in zip(t.shape, t.stride()) if s != 1)
    expected = 1
    for size, stride in sorted(dims, key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _view_in(data: Tensor, offset: int, like: Tensor) -> Tensor:
    """A view of ``data`` at ``offset`` with ``like``'s shape and (dense) strides."""
    n = like.numel()
    if like.is_contiguous() or not _dense_strides(like):
        return data[offset:offset + n].view(like.shape)
    return data.as_strided(like.shape, like.stride(), offset)


class _Buffer:
    """One (device, dtype) buffer: params and grads, views and their offsets."""

    def __init__(self, params: List[Tensor], device: torch.device, dtype: torch.dtype,
                 align_bytes: int) -> None:
        elem = torch.empty((), dtype=dtype).element_size()
        align = max(1, align_bytes // elem)
        self.offsets: List[int] = []
        self.ends: List[int] = []
        off = 0
        for p in params:
            off = -(-off // align) * align
            self.offsets.append(off)
            off += p.numel()
            self.ends.append(off)
        self.numel = off
        self.device = device
        self.dtype = dtype
        # weak: a param's hook holds this buffer, so a strong list would be a cycle that
        # keeps the registry filled until the next garbage collection
        self._param_refs = [weakref.ref(p) for p in params]
        self.count = len(params)
        self.param_data = torch.zeros(off, dtype=dtype, device=device)
        self.grad_data = torch.zeros(off, dtype=dtype, device=device)
        self.grad_views: List[Tensor] = []
        self._hooks: List[Any] = []
        self._slices: Dict[Tuple[int, int, int], Tensor] = {}
        self.removed = False
        with torch.no_grad():
            for p, o in zip(params, self.offsets):
                view = _view_in(self.param_data, o, p)
                view.copy_(p.detach())
                p.data = view
                g = _view_in(self.grad_data, o, p)
                self.grad_views.append(g)
                old = p.grad
                if old is not None and not old.is_sparse and old.shape == p.shape:
                    g.copy_(old)
                    p.grad = g
        self.param_ids = [id(p) for p in params]
        self.param_ptrs = [_data_ptr(p) for p in params]
        self.grad_ids = [id(g) for g in self.grad_views]
        self.grad_ptrs = [_data_ptr(g) for g in self.grad_views]
        ref = weakref.ref(self)
        for i, (p, g) in enumerate(zip(params, self.grad_views)):
            _PARAMS[id(p)] = (ref, i)
            _GRADS[id(g)] = (ref, i)
            self._hooks.append(p.register_post_accumulate_grad_hook(
                _restore_hook(g, self.param_ptrs[i], self)))
        self._ref = ref
        weakref.finalize(self, _unregister, list(self.param_ids), list(self.grad_ids), ref)

    @property
    def params(self) -> List[Tensor]:
        """The params still alive, in buffer order."""
        return [p for p in (r() for r in self._param_refs) if p is not None]

    def pairs(self) -> List[Tuple[Tensor, Tensor]]:
        """(param, grad view) for the params still alive."""
        out = []
        for r, g in zip(self._param_refs, self.grad_views):
            p = r()
            if p is not None:
                out.append((p, g))
        return out

    def slice(self, kind: int, a: int, b: int) -> Tensor:
        """The 1-D slice of the param (kind 0) or grad (kind 1) buffer over views a..b-1."""
        key = (kind, a, b)
        s = self._slices.get(key)
        if s is None:
            data = self.param_data if kind == 0 else self.grad_data
            s = self._slices[key] = data[self.offsets[a]:self.ends[b - 1]]
        return s

    def remove(self) -> None:
        self.removed = True
        for h in self._hooks:
            h.remove()
        self._hooks = []
        _unregister(self.param_ids, self.grad_ids, self._ref)


def _unregister(param_ids: List[int], grad_ids: List[int], ref: weakref.ref[_Buffer]) -> None:
    """Drop the registry entries of one buffer (not those a later buffer made since)."""
    for table, ids in ((_PARAMS, param_ids), (_GRADS, grad_ids)):
        for i in ids:
            entry = table.get(i)
            if entry is not None and entry[0] is ref:
                del table[i]


def _restore_hook(view: Tensor, param_ptr: int, owner: _Buffer) -> Any:
    """The post-accumulate-grad hook that puts a replaced grad back into its view.

    It holds ``owner`` (the buffer), so the mode lives as long as the params do.
    """

    def hook(p: Tensor) -> None:
        g = p.grad
        if g is view or g is None or owner.removed:
            return
        if (g.requires_grad or g.layout != torch.strided or g.dtype != view.dtype
                or g.device != view.device or g.shape != view.shape
                or _data_ptr(p) != param_ptr):
            return  # e.g. create_graph=True, or p.data replaced: leave it per tensor
        with torch.no_grad():
            view.copy_(g)
        p.grad = view

    return hook


class FlatBuffers:
    """The flat buffers of a model (what :func:`flat_buffers` returns).

    Keep it to call :meth:`zero_grad` or :meth:`remove`; the mode stays on as long as
    the params live, whether or not this object is kept.
    """

    def __init__(self, buffers: List[_Buffer]) -> None:
        self._buffers = buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def __iter__(self) -> Iterator[Tuple[Tensor, Tensor]]:
        """``(param_buffer, grad_buffer)`` 1-D tensors, one pair per (device, dtype)."""
        return iter([(b.param_data, b.grad_data) for b in self._buffers])

    @property
    def params(self) -> List[Tensor]:
        """The params laid out, buffer by buffer, in buffer order."""
        return [p for b in self._buffers for p in b.params]

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero every grad buffer with one fill per buffer and reinstall the views.

        ``set_to_none=True`` sets every ``param.grad`` to None instead (the views come
        back after the next backward). Note that this zeroes the grads of every param
        in the buffers, also of those another optimizer steps.
        """
        for b in self._buffers:
            if set_to_none:
                for p, _ in b.pairs():
                    p.grad = None
                continue
            b.grad_data.zero_()
            for p, g in b.pairs():
                if p.grad is not g:
                    p.grad = g

    def remove(self) -> None:
        """Turn the mode off: no more hooks, no more detection.

        The params keep their storage in the buffers (nothing is copied back).
        """
        for b in self._buffers:
            b.remove()
        self._buffers = []

    def __repr__(self) -> str:
        parts = ", ".join(f"{b.device}/{str(b.dtype).replace('torch.', '')}: "
                          f"{b.count} params, {b.numel} elements" for b in self._buffers)
        return f"FlatBuffers({parts})"


def flat_buffers(model_or_params: Union[nn.Module, Iterable[Any]], *,
                 align_bytes: int = _ALIGN_BYTES) -> FlatBuffers:
    """Lay out params and grads as views into one contiguous buffer per (device, dtype).

    Args:
        model_or_params: an :class:`~torch.nn.Module` (its ``parameters()``), an
            iterable of tensors, or of param-group dicts (laid out group by group, so
            each group is one run of each buffer). Params with ``requires_grad=False``
            are left where they are; duplicates are laid out once.
        align_bytes: each view starts at a multiple of this many bytes (the padding
            is zero and stays zero).

    Call it after moving the model to its device and dtype and before building the
    optimizer state (a state built before is moved into flat buffers at the first step,
    with one host read of the step counts). Wrap the model in DDP afterwards, with
    ``gradient_as_bucket_view=False`` (the default): DDP then copies the reduced grads
    into the views. ``gradient_as_bucket_view=True`` makes DDP own the grads and is
    refused here.

    Returns:
        A :class:`FlatBuffers`. Raises ``ValueError`` for a non-leaf, sparse or
        already flat param and for a DDP module with ``gradient_as_bucket_view=True``.
    """
    if isinstance(model_or_params, nn.Module):
        if getattr(model_or_params, "gradient_as_bucket_view", False):
            raise ValueError(
                "mixprec.optim.flat_buffers: DistributedDataParallel(gradient_as_bucket_view="
                "True) keeps param.grad as views of DDP's own buckets, which conflicts with "
                "the flat grad buffers; use gradient_as_bucket_view=False (the default) or "
                "no flat buffers")
        items: Iterable[Any] = model_or_params.parameters()
    elif isinstance(model_or_params, Tensor):
        items = [model_or_params]
    else:
        items = model_or_params
    seen: set[int] = set()
    by_key: Dict[Tuple[torch.device, torch.dtype], List[Tensor]] = {}
    for item in items:
        group = item["params"] if isinstance(item, dict) else [item]
        if isinstance(group, Tensor):
            group = [group]
        for p in group:
            if not isinstance(p, Tensor):
                raise TypeError(f"mixprec.optim.flat_buffers: expected tensors, got "
                                f"{type(p).__name__}")
            if id(p) in seen or not p.requires_grad:
                continue
            if not p.is_leaf or p.layout != torch.strided:
                raise ValueError("mixprec.optim.flat_buffers: params must be dense leaf "
                                 "tensors")
            if id(p) in _PARAMS:
                raise ValueError("mixprec.optim.flat_buffers: a param is already in a flat "
                                 "buffer")
            seen.add(id(p))
            by_key.setdefault((p.device, p.dtype), []).append(p)
    return FlatBuffers([_Buffer(ps, dev, dt, align_bytes) for (dev, dt), ps in by_key.items()])


# ---------------------------------------------------------------------------------------------
# Detection


def _lookup(table: Dict[int, Tuple[weakref.ref[_Buffer], int]], t: Tensor,
            ptrs_attr: str) -> Optional[Tuple[_Buffer, int]]:
    entry = table.get(id(t))
    if entry is None:
        return None
    buf = entry[0]()
    if buf is None or _data_ptr(t) != getattr(buf, ptrs_attr)[entry[1]]:
        return None
    return buf, entry[1]


def _runs(entries: List[Tuple[int, int]]) -> List[List[Tuple[int, int]]]:
    """Split ``(index in buffer, position in list)`` pairs into runs of consecutive indices."""
    entries.sort()
    runs: List[List[Tuple[int, int]]] = []
    for e in entries:
        if runs and runs[-1][-1][0] + 1 == e[0]:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


def _grad_ranges(grads: Sequence[Tensor]) -> Tuple[List[Tuple[_Buffer, int, int]], List[int]]:
    """Runs of flat grad views in ``grads`` and the positions of everything else."""
    n = len(grads)
    first = _GRADS.get(id(grads[0]))
    if first is not None:
        buf, a = first[0](), first[1]
        if (buf is not None and buf.grad_ids[a:a + n] == list(map(id, grads))
                and buf.grad_ptrs[a:a + n] == list(map(_data_ptr, grads))):
            return [(buf, a, a + n)], []
    per_buf: Dict[int, Tuple[_Buffer, List[Tuple[int, int]]]] = {}
    rest: List[int] = []
    for k, g in enumerate(grads):
        hit = _lookup(_GRADS, g, "grad_ptrs")
        if hit is None:
            rest.append(k)
        else:
            per_buf.setdefault(id(hit[0]), (hit[0], []))[1].append((hit[1], k))
    ranges: List[Tuple[_Buffer, int, int]] = []
    for buf, entries in per_buf.values():
        if len({i for i, _ in entries}) != len(entries):
            return [], list(range(n))  # a grad twice: let the op report it
        for run in _runs(entries):
            if len(run) == 1:
                rest.append(run[0][1])
            else:
                ranges.append((buf, run[0][0], run[-1][0] + 1))
    return ranges, sorted(rest)


def coalesce(grads: List[Tensor]) -> List[Tensor]:
    """``grads`` with every run of adjacent flat-buffer grad views replaced by one slice.

    The result covers exactly the same elements plus the (zero) padding between the
    views of a run; tensors that are not flat views stay as they are. Used by
    :class:`mixprec.GradScaler` before its unscale / inf-check / norm ops.
    """
    if len(grads) < 2 or not _GRADS:  # traceable: torch.compile(fullgraph) without flat
        return grads
    return _coalesce(grads)


@torch.compiler.disable
def _coalesce(grads: List[Tensor]) -> List[Tensor]:
    ranges, rest = _grad_ranges(grads)
    if not ranges:
        return grads
    return [grads[k] for k in rest] + [buf.slice(1, a, b) for buf, a, b in ranges]


def coalesce_grads(per_device: Dict[torch.device, List[Tensor]]
                   ) -> Dict[torch.device, List[Tensor]]:
    """:func:`coalesce` for each device's list (the scaler's ``_collect_grads`` result)."""
    if not _GRADS:
        return per_device
    return {dev: coalesce(grads) for dev, grads in per_device.items()}


# ---------------------------------------------------------------------------------------------
# Optimizer state


_FIXED_KEYS = ("params", "grads", "master_params", "state_steps")
_MASTER = "master_param"


class _BufState:
    """An optimizer's float32 state of one buffer: flat tensors and their views."""

    def __init__(self, buf: _Buffer) -> None:
        self.buf = buf
        self.data: Dict[str, Tensor] = {}
        self.views: Dict[str, List[Optional[Tensor]]] = {}
        self.ids: Dict[str, List[int]] = {}
        self.fresh_step: Optional[Tensor] = None  # shared step known to be 0
        self._slices: Dict[Tuple[str, int, int], Tensor] = {}

    def view(self, name: str, i: int) -> Tensor:
        views = self.views.get(name)
        if views is None:
            buf = self.buf
            self.data[name] = torch.zeros(buf.numel, dtype=torch.float32, device=buf.device)
            views = self.views[name] = [None] * buf.count
            self.ids[name] = [0] * buf.count
        v = views[i]
        if v is None:
            v = views[i] = _view_in(self.data[name], self.buf.offsets[i],
                                    self.buf.grad_views[i])
            self.ids[name][i] = id(v)
        return v

    def slice(self, name: str, a: int, b: int) -> Tensor:
        key = (name, a, b)
        s = self._slices.get(key)
        if s is None:
            s = self._slices[key] = self.data[name][self.buf.offsets[a]:self.buf.ends[b - 1]]
        return s


class _OptFlat:
    """Per optimizer: the flat states and the holders of each shared step tensor."""

    def __init__(self) -> None:
        self.states: weakref.WeakKeyDictionary[_Buffer, _BufState] = \
            weakref.WeakKeyDictionary()
        # id(step) -> [step, number of params whose state["step"] it is]
        self.holders: Dict[int, List[Any]] = {}
        self.prepared: Optional[Dict[str, List[Tensor]]] = None  # whole_group's bucket

    def state_of(self, buf: _Buffer) -> _BufState:
        st = self.states.get(buf)
        if st is None:
            st = self.states[buf] = _BufState(buf)
        return st

    def share(self, step: Tensor, count: int) -> None:
        self.holders[id(step)] = [step, count]

    def release(self, step: Tensor, count: int) -> None:
        entry = self.holders.get(id(step))
        if entry is not None and entry[0] is step:
            entry[1] -= count
            if entry[1] <= 0:
                del self.holders[id(step)]

    def count(self, step: Tensor) -> int:
        entry = self.holders.get(id(step))
        return entry[1] if entry is not None and entry[0] is step else 0


def _opt_flat(optimizer: Any) -> _OptFlat:
    of = optimizer.__dict__.get("_mixprec_flat")
    if of is None:
        of = optimizer.__dict__["_mixprec_flat"] = _OptFlat()
        register = getattr(optimizer, "register_state_dict_post_hook", None)  # torch >= 2.1
        if register is not None:
            register(_unshare_steps)
    return of


def _unshare_steps(optimizer: Any, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """``state_dict`` post-hook: one step tensor per param, as without flat buffers.

    Params stepped together share one step tensor here; torch.optim optimizers that load
    such a dict keep the tensor as it is and would then increment it once per param.
    The per-param dicts are copied (they are the optimizer's own ones).
    """
    seen: set[int] = set()
    packed = state_dict["state"]
    for key, entry in packed.items():
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, Tensor):
            continue
        if id(step) in seen:
            packed[key] = {**entry, "step": step.clone()}
        else:
            seen.add(id(step))
    return state_dict


def init_state(optimizer: Any, p: Tensor, group: Dict[str, Any], state: Dict[str, Any]) -> bool:
    """Create the empty ``state`` of a flat param as views of flat state buffers.

    Called by :class:`mixprec.optim.FusedOptimizer` before it would create the state
    itself; returns False (and does nothing) for a param that is not a flat view.
    Fresh params of one buffer share one step tensor (all start at 0).
    """
    if not _PARAMS:
        return False
    return _init_state(optimizer, p, group, state)


@torch.compiler.disable
def _init_state(optimizer: Any, p: Tensor, group: Dict[str, Any], state: Dict[str, Any]
                ) -> bool:
    hit = _lookup(_PARAMS, p, "param_ptrs")
    if hit is None:
        return False
    buf, i = hit
    of = _opt_flat(optimizer)
    st = of.state_of(buf)
    with torch.no_grad():
        for name in optimizer._state_names(group):
            state[name] = st.view(name, i).zero_()
        if optimizer._wants_master(p, group):
            state[_MASTER] = st.view(_MASTER, i).copy_(p.detach())
    step = st.fresh_step
    if step is None:
        step = st.fresh_step = torch.zeros((), dtype=torch.float32, device=p.device)
        of.share(step, 0)
    of.holders[id(step)][1] += 1
    state["step"] = step
    return True


def _migrate(optimizer: Any, of: _OptFlat, st: _BufState, names: List[str],
             members: List[Tuple[int, int]], bucket: Dict[str, List[Tensor]]) -> None:
    """Move the (non-flat) state of ``members`` (index, position) into ``st``'s views.

    The step counts of the members are read once (a host sync) so that params with equal
    counts can share one step tensor.
    """
    buf = st.buf
    params = bucket["params"]
    has_master = bool(bucket["master_params"])
    with torch.no_grad():
        for i, k in members:
            state = optimizer.state[params[k]]
            for name in names + ([_MASTER] if has_master else []):
                key = "master_params" if name == _MASTER else name
                view = st.view(name, i)
                current = bucket[key][k]
                if current is not view:
                    view.copy_(current)
                    state[name] = view
                    bucket[key][k] = view
        foreign = [(i, k) for i, k in members if of.count(bucket["state_steps"][k]) == 0]
        if not foreign:
            return
        values = torch.stack([bucket["state_steps"][k].reshape(()).float()
                              for _, k in foreign]).tolist()
        shared: Dict[float, Tensor] = {}
        for (_, k), v in zip(foreign, values):
            s = shared.get(v)
            if s is None:
                s = shared[v] = torch.full((), v, dtype=torch.float32, device=buf.device)
                of.share(s, 0)
            of.holders[id(s)][1] += 1
            optimizer.state[params[k]]["step"] = s
            bucket["state_steps"][k] = s


def coalesce_bucket(optimizer: Any, group: Dict[str, Any],
                    bucket: Dict[str, List[Tensor]]) -> Dict[str, List[Tensor]]:
    """An optimizer bucket with each run of adjacent flat params replaced by buffer slices.

    ``bucket`` is what :class:`mixprec.optim.FusedOptimizer` hands its op: lists
    ``params``, ``grads``, ``master_params`` (empty or one per param), ``state_steps`` and
    one per float32 state name. A run qualifies when its params and grads are the flat
    views (``id`` and data pointer) of consecutive indices of one buffer, and its
    states/masters the views of this optimizer's flat state of that buffer (a state
    that is not, e.g. after ``load_state_dict``, is copied into them first). A run's
    step counts must be one shared tensor held by exactly the run's params, so that one
    increment is right for all: where a shared step is also held by params outside the
    run, the run gets its own copy (no sync). Everything else stays per tensor.
    """
    if not _PARAMS and getattr(optimizer, "_mixprec_flat", None) is None:
        return bucket  # traceable: torch.compile(fullgraph) without flat buffers
    return _coalesce_bucket(optimizer, group, bucket)


@torch.compiler.disable
def _coalesce_bucket(optimizer: Any, group: Dict[str, Any],
                     bucket: Dict[str, List[Tensor]]) -> Dict[str, List[Tensor]]:
    of = _opt_flat(optimizer)
    if of.prepared is bucket:  # made by whole_group: already one slice
        of.prepared = None
        return bucket
    for st in of.states.values():  # a step handed to an op is no longer known to be 0
        st.fresh_step = None
    params = bucket["params"]
    if not params:
        return bucket
    grads = bucket["grads"]
    n = len(params)
    names = [k for k in bucket if k not in _FIXED_KEYS]
    has_master = bool(bucket["master_params"])
    per_buf: Dict[int, Tuple[_Buffer, List[Tuple[int, int]]]] = {}
    rest: List[int] = []
    first = _PARAMS.get(id(params[0]))
    buf0 = first[0]() if first is not None else None
    if (buf0 is not None and buf0.param_ids[first[1]:first[1] + n] == list(map(id, params))
            and buf0.param_ptrs[first[1]:first[1] + n] == list(map(_data_ptr, params))
            and buf0.grad_ids[first[1]:first[1] + n] == list(map(id, grads))
            and buf0.grad_ptrs[first[1]:first[1] + n] == list(map(_data_ptr, grads))):
        a = first[1]
        whole = _whole_bucket(of, buf0, a, bucket, names, has_master)
        if whole is not None:
            return whole
        per_buf[id(buf0)] = (buf0, list(zip(range(a, a + n), range(n))))
    else:
        for k, (p, g) in enumerate(zip(params, grads)):
            hit = _lookup(_PARAMS, p, "param_ptrs")
            if hit is None or g is not hit[0].grad_views[hit[1]] \
                    or _data_ptr(g) != hit[0].grad_ptrs[hit[1]]:
                rest.append(k)
            else:
                per_buf.setdefault(id(hit[0]), (hit[0], []))[1].append((hit[1], k))
    out: Dict[str, List[Tensor]] = {key: list(v) for key, v in bucket.items()}
    steps = out["state_steps"]
    state_keys = names + (["master_params"] if has_master else [])
    runs: List[Tuple[_BufState, List[Tuple[int, int]]]] = []
    for buf, entries in per_buf.values():
        if len({i for i, _ in entries}) != len(entries):
            return bucket  # a param twice: let the op report it
        st = of.state_of(buf)
        for run in _runs(entries):
            if len(run) == 1:
                rest.append(run[0][1])
                continue
            ks = [k for _, k in run]
            a, b = run[0][0], run[-1][0] + 1
            stale = any(of.count(steps[k]) == 0 for k in ks)  # e.g. after load_state_dict
            for key in state_keys:
                name = _MASTER if key == "master_params" else key
                ids = st.ids.get(name)
                if ids is None or ids[a:b] != [id(out[key][k]) for k in ks]:
                    stale = True
            if stale:
                _migrate(optimizer, of, st, names, run, out)
            runs.append((st, run))
    # Split runs where the step tensor changes.
    pieces: List[Tuple[_BufState, int, int, List[int]]] = []
    for st, run in runs:
        start = 0
        for j in range(1, len(run) + 1):
            if j == len(run) or steps[run[j][1]] is not steps[run[start][1]]:
                if j - start == 1:
                    rest.append(run[start][1])
                else:
                    piece = run[start:j]
                    pieces.append((st, piece[0][0], piece[-1][0] + 1, [k for _, k in piece]))
                start = j
    rest.sort()
    # One increment per step tensor and op call: a step held by params outside this call
    # is first replaced, for the params in it, by a copy of their own; within the call
    # the first entry gets the step and the others a temporary copy of the same value.
    entries: List[List[int]] = [[k] for k in rest] + [ks for _, _, _, ks in pieces]
    by_step: Dict[int, List[int]] = {}
    for e, ks in enumerate(entries):
        by_step.setdefault(id(steps[ks[0]]), []).append(e)
    entry_steps: List[Tensor] = [steps[ks[0]] for ks in entries]
    for group_entries in by_step.values():
        step = entry_steps[group_entries[0]]
        ks = [k for e in group_entries for k in entries[e]]
        held = of.count(step)
        if held != len(ks) and (held > 0 or len(ks) > 1):  # (not ours, one param: as is)
            step = _split_step(optimizer, of, step, ks, out)
        entry_steps[group_entries[0]] = step
        for e in group_entries[1:]:
            entry_steps[e] = step.clone()
    result: Dict[str, List[Tensor]] = {key: [v[k] for k in rest] if v else []
                                       for key, v in out.items()}
    result["state_steps"] = entry_steps[:len(rest)]
    for (st, a, b, _), step in zip(pieces, entry_steps[len(rest):]):
        buf = st.buf
        result["params"].append(buf.slice(0, a, b))
        result["grads"].append(buf.slice(1, a, b))
        result["state_steps"].append(step)
        for name in names:
            result[name].append(st.slice(name, a, b))
        if has_master:
            result["master_params"].append(st.slice(_MASTER, a, b))
    return result


_get_grad = operator.attrgetter("grad")
_get_step = operator.itemgetter("step")
_OPTIM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def whole_group(optimizer: Any, group: Dict[str, Any]) -> Dict[Tuple[torch.device, bool],
                                                              Dict[str, List[Tensor]]]:
    """The buckets of a param group that is exactly one run of one flat buffer, or ``{}``.

    Lets :class:`mixprec.optim.FusedOptimizer` skip its per-param loop: the params must be
    views a..a+n-1 of one buffer in order, every grad its view, every state already this
    optimizer's flat views and every step one tensor held by exactly these params (all
    checked, mostly at C speed). Anything else: ``{}``, and the per-param path runs
    (where :func:`coalesce_bucket` still coalesces what it can).
    """
    if not _PARAMS or getattr(optimizer, "_mixprec_flat", None) is None:
        return {}  # traceable: torch.compile(fullgraph) without flat buffers
    return _whole_group(optimizer, group)


@torch.compiler.disable
def _whole_group(optimizer: Any, group: Dict[str, Any]
                 ) -> Dict[Tuple[torch.device, bool], Dict[str, List[Tensor]]]:
    of = optimizer.__dict__["_mixprec_flat"]
    params = group["params"]
    if not params:
        return {}
    first = _PARAMS.get(id(params[0]))
    buf = first[0]() if first is not None else None
    if buf is None or buf.dtype not in _OPTIM_DTYPES:
        return {}
    n = len(params)
    a = first[1]
    b = a + n
    grads = list(map(_get_grad, params))
    if (buf.param_ids[a:b] != list(map(id, params))
            or buf.param_ptrs[a:b] != list(map(_data_ptr, params))
            or buf.grad_ids[a:b] != list(map(id, grads))
            or buf.grad_ptrs[a:b] != list(map(_data_ptr, grads))):
        return {}
    get_state = optimizer.state.get
    states = list(map(get_state, params))
    if None in states:
        return {}
    try:
        steps = list(map(_get_step, states))
        has_master = bool(optimizer._wants_master(params[0], group))
        names = optimizer._state_names(group)
        bucket: Dict[str, List[Tensor]] = {"params": params, "grads": grads,
                                           "master_params": [], "state_steps": steps}
        for name in names:
            bucket[name] = list(map(operator.itemgetter(name), states))
        if has_master:
            bucket["master_params"] = list(map(operator.itemgetter(_MASTER), states))
    except KeyError:
        return {}
    for st in of.states.values():  # as in coalesce_bucket
        st.fresh_step = None
    whole = _whole_bucket(of, buf, a, bucket, names, has_master)
    if whole is None:
        return {}
    of.prepared = whole
    return {(buf.device, has_master): whole}


def _whole_bucket(of: _OptFlat, buf: _Buffer, a: int, bucket: Dict[str, List[Tensor]],
                  names: List[str], has_master: bool) -> Optional[Dict[str, List[Tensor]]]:
    """The common case at C speed: the bucket is views a..a+n-1 of one buffer (checked by
    the caller), its states are this optimizer's flat views and its params hold one step
    tensor that no other param holds. None when anything differs."""
    n = len(bucket["params"])
    b = a + n
    steps = bucket["state_steps"]
    step = steps[0]
    if of.count(step) != n or list(map(id, steps)).count(id(step)) != n:
        return None
    st = of.states.get(buf)
    if st is None:
        return None
    for name in names + ([_MASTER] if has_master else []):
        ids = st.ids.get(name)
        key = "master_params" if name == _MASTER else name
        if ids is None or ids[a:b] != list(map(id, bucket[key])):
            return None
    out: Dict[str, List[Tensor]] = {
        "params": [buf.slice(0, a, b)], "grads": [buf.slice(1, a, b)],
        "master_params": [st.slice(_MASTER, a, b)] if has_master else [],
        "state_steps": [step]}
    for name in names:
        out[name] = [st.slice(name, a, b)]
    return out


def _split_step(optimizer: Any, of: _OptFlat, step: Tensor, ks: List[int],
                out: Dict[str, List[Tensor]]) -> Tensor:
    """Give the params at positions ``ks`` one copy of their shared ``step`` of their own."""
    own = step.clone()
    of.release(step, len(ks))
    of.share(own, len(ks))
    for k in ks:
        optimizer.state[out["params"][k]]["step"] = own
        out["state_steps"][k] = own
    return own
