"""Detection: the grads handed to the scaler's ops, as one slice per run of flat views.

See :mod:`mixprec.flat` for what counts as a view and why results never depend
on the detection.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..ops._extension import WATCH as _WATCH
from .layout import GRAD_VIEWS, REGISTRY, _Buffer, _data_ptr


def _lookup(table: Dict[int, Tuple[weakref.ref[_Buffer], int]], t: Tensor,
            ptrs_attr: str) -> Optional[Tuple[_Buffer, int]]:
    entry = table.get(id(t))
    if entry is None:
        return None
    buf = entry[0]()
    if buf is None or _data_ptr(t) != getattr(buf, ptrs_attr)[entry[1]]:
        return None
    return buf, entry[1]


def _any_in(table: Dict[int, Any], tensors: Sequence[Tensor]) -> bool:
    """Whether any of ``tensors`` is a key (by ``id``) of ``table`` (a set test at C speed;
    while torch.compile traces, a loop it can follow, guarded on the table)."""
    if not table:
        return False
    if torch.compiler.is_compiling():
        return any(id(t) in table for t in tensors)
    return not table.keys().isdisjoint(map(id, tensors))


def _first_owner(grads: Sequence[Tensor]) -> Optional[_Buffer]:
    """The buffer of which ``grads[0]`` is a grad view (by ``id``): where the answer of
    :func:`_coalesce` for lists starting with it is kept."""
    first = GRAD_VIEWS.get(id(grads[0])) if grads else None
    return first[0]() if first is not None else None


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
    first = GRAD_VIEWS.get(id(grads[0]))
    if first is not None:
        buf, a = first[0](), first[1]
        if (buf is not None and buf.grad_ids[a:a + n] == list(map(id, grads))
                and buf.grad_ptrs[a:a + n] == list(map(_data_ptr, grads))):
            return [(buf, a, a + n)], []
    per_buf: Dict[int, Tuple[_Buffer, List[Tuple[int, int]]]] = {}
    rest: List[int] = []
    for k, g in enumerate(grads):
        hit = _lookup(GRAD_VIEWS, g, "grad_ptrs")
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
    if len(grads) < 2 or not _any_in(GRAD_VIEWS, grads):
        return grads  # no flat view among them
    return _coalesce(grads)


@torch.compiler.disable
def _coalesce(grads: List[Tensor]) -> List[Tensor]:
    # The last all-flat answer for lists starting with this grad view is kept on its
    # buffer, with a snapshot of the list: the same grad objects with the same data
    # pointers (one C pass), and no buffer laid out or removed since, give the same answer.
    owner = _first_owner(grads)
    kept = owner.coalesced if owner is not None else None
    if (kept is not None and kept[2] == REGISTRY[0]
            and _WATCH.tensors_grads(grads, kept[0], False) is not None):
        return list(kept[1])  # (the caller's list)
    ranges, rest = _grad_ranges(grads)
    if not ranges:
        return grads
    out = [grads[k] for k in rest] + [buf.slice(1, a, b) for buf, a, b in ranges]
    if owner is not None and not rest and _WATCH is not None:
        snap = _WATCH.watch_tensors(grads, False)
        owner.coalesced = (snap, list(out), REGISTRY[0]) if snap is not None else None
    return out


def _all_flat(grads: List[Tensor], coalesced: List[Tensor]) -> bool:
    """Whether ``coalesced`` is :func:`_coalesce`'s all-flat answer for ``grads`` (kept on
    the buffer of the first grad: the very same slices)."""
    owner = _first_owner(grads)
    kept = owner.coalesced if owner is not None else None
    return (kept is not None and kept[2] == REGISTRY[0] and len(kept[1]) == len(coalesced)
            and all(map(operator.is_, kept[1], coalesced)))


def coalesce_grads(per_device: Dict[torch.device, List[Tensor]]
                   ) -> Dict[torch.device, List[Tensor]]:
    """:func:`coalesce` for each device's list (``amp.grads.optimizer_grads``'s)."""
    if not GRAD_VIEWS:
        return per_device
    return {dev: coalesce(grads) for dev, grads in per_device.items()}


PerDevice = Dict[torch.device, List[Tensor]]

#: optimizer -> (its param group dicts, a snapshot of each group's params with their
#: grads, allow_fp16, REGISTRY[0], the scaler's grads per device): the last answer of
#: amp.grads.optimizer_grads in which every grad went into a flat slice.
_Kept = Tuple[Tuple[Any, ...], List[Any], bool, int, PerDevice]
_KEPT: weakref.WeakKeyDictionary[Any, _Kept] = weakref.WeakKeyDictionary()


def kept_grads(optimizer: Any, allow_fp16: bool) -> Optional[PerDevice]:
    """The scaler's grads of ``optimizer`` as :func:`keep_grads` kept them, when nothing
    they were found from changed; else None.

    One C pass per param group (``_C.tensors_grads``, csrc/python/list_watch.h) proves
    that the groups are the same dicts holding the very same params (data pointer,
    numel, dtype, device), each with the very same grad object (None where there was
    none) with the same data pointer, numel, dtype and device, and no buffer was laid
    out or removed since. ``collect_grads`` + ``coalesce_grads`` would then find the
    same grads and the same flat slices; this replaces their two passes with one.
    """
    if not GRAD_VIEWS or torch.compiler.is_compiling():
        return None
    try:
        kept = _KEPT.get(optimizer)
    except TypeError:  # an optimizer that cannot be weakly referenced or hashed
        return None
    if kept is None or kept[2] != allow_fp16 or kept[3] != REGISTRY[0]:
        return None
    groups = optimizer.param_groups
    if len(groups) != len(kept[0]) or not all(map(operator.is_, groups, kept[0])):
        return None
    for group, snap in zip(groups, kept[1]):
        if _WATCH.tensors_grads(group["params"], snap, False) is None:
            return None
    return {dev: list(grads) for dev, grads in kept[4].items()}


def coalesce_and_keep(optimizer: Any, allow_fp16: bool, collected: PerDevice) -> PerDevice:
    """:func:`coalesce_grads` of ``collected`` (``amp.grads.collect_grads``'s answer for
    ``optimizer``), kept for :func:`kept_grads` where every grad went into a flat slice."""
    coalesced = coalesce_grads(collected)
    keep_grads(optimizer, allow_fp16, collected, coalesced)
    return coalesced


def keep_grads(optimizer: Any, allow_fp16: bool, collected: PerDevice,
               coalesced: PerDevice) -> None:
    """Keep ``coalesced`` (:func:`coalesce_grads` of ``collected``) for :func:`kept_grads`
    when every grad of every device went into a flat slice; forget it otherwise."""
    if not GRAD_VIEWS or _WATCH is None or torch.compiler.is_compiling():
        return
    groups = tuple(optimizer.param_groups)
    snaps = ([_WATCH.watch_tensors(group["params"], True) for group in groups]
             if all(_all_flat(grads, coalesced[dev]) for dev, grads in collected.items())
             else [None])
    try:
        if any(snap is None for snap in snaps):
            _KEPT.pop(optimizer, None)
        else:
            _KEPT[optimizer] = (groups, snaps, allow_fp16, REGISTRY[0],
                                {dev: list(grads) for dev, grads in coalesced.items()})
    except TypeError:  # an optimizer that cannot be weakly referenced or hashed
        pass


