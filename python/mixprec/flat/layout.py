"""The flat layout: :func:`flat_buffers`, :class:`FlatBuffers` and the registry of views.

See :mod:`mixprec.flat` for the mode as a whole.
"""


from __future__ import annotations

import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .. import _dtensor

__all__ = ["FlatBuffers", "flat_buffers"]

_ALIGN_BYTES = 16
_data_ptr = Tensor.data_ptr

# id(param) / id(grad view) -> (weakref to its _Buffer, index in it). Entries are
# removed when the buffer is collected (weakref.finalize); while it lives, it holds
# the objects, so an id cannot be reused.
_PARAMS: Dict[int, Tuple[weakref.ref[_Buffer], int]] = {}
#: The grad views' registry, the same for id(grad view). Empty when no flat grad view
#: exists, so ``amp.grads`` skips the flat hooks with one truth test. Written only here.
GRAD_VIEWS: Dict[int, Tuple[weakref.ref[_Buffer], int]] = {}
#: [number of changes to the registry]: a buffer laid out or unregistered (answers kept
#: from before a change are not reused)
REGISTRY = [0]


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
        # detect._coalesce's last all-flat answer for grad lists starting in this buffer:
        # (snapshot of the list, the slices)
        self.coalesced: Optional[Tuple[Any, List[Tensor], int]] = None  # (..., REGISTRY[0])
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
        REGISTRY[0] += 1
        for i, (p, g) in enumerate(zip(params, self.grad_views)):
            _PARAMS[id(p)] = (ref, i)
            GRAD_VIEWS[id(g)] = (ref, i)
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


def _in_live_buffer(p: Tensor) -> bool:
    """Whether ``p`` itself is a param of a live buffer. The registry is keyed by ``id``, and a
    buffer can outlive its params (a compiled graph or a kept list may hold it): a new
    tensor that reuses a dead param's ``id`` is not in any buffer."""
    entry = _PARAMS.get(id(p))
    if entry is None:
        return False
    buf = entry[0]()
    return buf is not None and not buf.removed and buf._param_refs[entry[1]]() is p


def _unregister(param_ids: List[int], grad_ids: List[int], ref: weakref.ref[_Buffer]) -> None:
    """Drop the registry entries of one buffer (not those a later buffer made since)."""
    REGISTRY[0] += 1
    for table, ids in ((_PARAMS, param_ids), (GRAD_VIEWS, grad_ids)):
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

    def __init__(self, buffers: List[_Buffer], guard: Any = None) -> None:
        self._buffers = buffers
        self._guard = guard  # the module's forward pre-hook of _sharded_guard, or None

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
        if self._guard is not None:
            self._guard.remove()
            self._guard = None

    def __repr__(self) -> str:
        parts = ", ".join(f"{b.device}/{str(b.dtype).replace('torch.', '')}: "
                          f"{b.count} params, {b.numel} elements" for b in self._buffers)
        return f"FlatBuffers({parts})"


_NO_FSDP2 = ("flat buffers cannot back FSDP2's DTensor params, which FSDP2 lays out in "
             "its own sharded storage; use fully_shard without flat_buffers (the "
             "optimizer then runs on the local shards)")


def _sharded_guard(model: nn.Module) -> Any:
    """A forward pre-hook on ``model`` that raises once ``fully_shard`` has replaced its
    laid-out params by DTensors (one param looked at: fully_shard replaces them all)."""
    first = next(((prefix, module, name, p) for prefix, module in model.named_modules()
                  for name, p in module.named_parameters(recurse=False) if p.requires_grad),
                 None)
    if first is None:
        return None
    prefix, module, name, p = first
    where = f"{prefix}.{name}" if prefix else name

    def hook(*_: Any) -> None:
        now = module._parameters.get(name)
        if now is not p and _dtensor.is_dtensor(now):
            raise ValueError(
                f"mixprec.optim.flat_buffers: param {where!r} became a DTensor after "
                "flat_buffers(): fully_shard replaced the flat params; " + _NO_FSDP2)

    return model.register_forward_pre_hook(hook)


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

    FSDP2 is refused: a DTensor param raises ``ValueError`` here, and a module laid out
    and then passed to ``fully_shard`` raises it at its next forward.

    Returns:
        A :class:`FlatBuffers`. Raises ``ValueError`` for a non-leaf, sparse, DTensor or
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
            if _dtensor.is_dtensor(p):
                raise ValueError("mixprec.optim.flat_buffers: a param is a DTensor "
                                 "(the model went through fully_shard); " + _NO_FSDP2)
            if id(p) in seen or not p.requires_grad:
                continue
            if not p.is_leaf or p.layout != torch.strided:
                raise ValueError("mixprec.optim.flat_buffers: params must be dense leaf "
                                 "tensors")
            if _in_live_buffer(p):
                raise ValueError("mixprec.optim.flat_buffers: a param is already in a flat "
                                 "buffer")
            seen.add(id(p))
            by_key.setdefault((p.device, p.dtype), []).append(p)
    buffers = [_Buffer(ps, dev, dt, align_bytes) for (dev, dt), ps in by_key.items()]
    guard = _sharded_guard(model_or_params) if isinstance(model_or_params, nn.Module) else None
    return FlatBuffers(buffers, guard)
