"""The optimizer side: state and float32 masters as views of flat buffers, shared steps,
and one bucket slice per run of flat views.

See :mod:`mixprec.flat` for the mode as a whole.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .detect import _any_in, _lookup, _runs
from .layout import _PARAMS, _Buffer, _data_ptr, _view_in

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

    def forget_fresh_steps(self) -> None:
        """A step handed to an op is no longer known to be 0."""
        for st in self.states.values():
            st.fresh_step = None

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
    if not _PARAMS or id(p) not in _PARAMS:
        return False  # traceable: torch.compile(fullgraph) of params that are not flat
    if group.get("state_bits", 32) == 8:
        return False  # 8-bit state is per param (its blocks start at the param)
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
        for name in optimizer.state_names(group):
            state[name] = st.view(name, i).zero_()
        if optimizer.keeps_master(p, group):
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


def any_flat(params: List[Tensor]) -> bool:
    """Whether any of ``params`` is laid out in a flat buffer (traceable)."""
    return _any_in(_PARAMS, params)


def coalesce_bucket(optimizer: Any, group: Dict[str, Any], bucket: Dict[str, List[Tensor]],
                    plain: bool = False) -> Dict[str, List[Tensor]]:
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
    ``plain``: the caller knows that none of the params is laid out flat.
    """
    if group.get("state_bits", 32) == 8:
        return bucket  # per-param 8-bit state (see init_state): per tensor
    if getattr(optimizer, "_mixprec_flat", None) is None and (
            plain or not any_flat(bucket["params"])):
        # no flat state and none of these params laid out flat (traceable by
        # torch.compile(fullgraph) without flat buffers; with ``plain``, flat buffers of
        # other models do not cost this optimizer a per-param pass)
        return bucket
    return _coalesce_bucket(optimizer, group, bucket)


@torch.compiler.disable
def _coalesce_bucket(optimizer: Any, group: Dict[str, Any],
                     bucket: Dict[str, List[Tensor]]) -> Dict[str, List[Tensor]]:
    of = _opt_flat(optimizer)
    of.forget_fresh_steps()
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
    if group.get("state_bits", 32) == 8:
        return {}  # per-param 8-bit state (see init_state)
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
        has_master = bool(optimizer.keeps_master(params[0], group))
        names = optimizer.state_names(group)
        bucket: Dict[str, List[Tensor]] = {"params": params, "grads": grads,
                                           "master_params": [], "state_steps": steps}
        for name in names:
            bucket[name] = list(map(operator.itemgetter(name), states))
        if has_master:
            bucket["master_params"] = list(map(operator.itemgetter(_MASTER), states))
    except KeyError:
        return {}
    of.forget_fresh_steps()
    whole = _whole_bucket(of, buf, a, bucket, names, has_master)
    if whole is None:
        return {}
    return {(buf.device, has_master): whole}


def reuse_whole(optimizer: Any, params: List[Tensor], bucket: Dict[str, List[Tensor]]) -> bool:
    """Hand :func:`whole_group`'s bucket of an earlier step for ``params`` to this step.

    The caller (:meth:`mixprec.optim.FusedOptimizer._reuse`) has proved the params, their
    grad views and their state dicts unchanged; checked here: their buffer is still
    registered (not removed) and the run's shared step still held by exactly these
    params. Then as :func:`whole_group` does: no step is known to be 0 any more (the
    optimizer runs the bucket as it is: it is one slice already).
    """
    of = optimizer.__dict__.get("_mixprec_flat")
    entry = _PARAMS.get(id(params[0])) if params else None
    buf = entry[0]() if entry is not None else None
    if (of is None or buf is None or buf.removed
            or of.count(bucket["state_steps"][0]) != len(params)):
        return False
    of.forget_fresh_steps()
    return True


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
