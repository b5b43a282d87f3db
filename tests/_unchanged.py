"""``snapshot(obj)``: everything an object holds, tensors as their exact bits, so that a test
can check that a refused call left it *exactly* as it was (every load checks first, then
changes); :func:`refused_unchanged` is that check.

The walk follows dicts, lists, tuples, sets and the ``__dict__`` of plain objects
(optimizers, scalers, trainers, managers, modules' parameters), and records each tensor as
``(type, dtype, shape, stride, device, bits)`` and every other leaf as its ``repr`` (with
object identities replaced by the path where the object was first met, so that a replaced
sub-object counts as a change but the snapshot does not depend on memory addresses).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple, Type, Union

import pytest
import torch
from torch import nn

from _helpers import bits

_LEAVES = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)


def _tensor(t: torch.Tensor) -> Any:
    from mixprec import _dtensor

    kind = type(t).__name__
    local = _dtensor.local(t) if _dtensor.is_dtensor(t) else t
    if local.is_meta:
        data: Any = "meta"
    elif local.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        data = bits(local.detach()).tolist()
    else:
        data = local.detach().cpu().tolist()
    return ("tensor", kind, str(t.dtype), tuple(t.shape), tuple(local.stride()),
            str(local.device), t.requires_grad, t._version, data)


def snapshot(obj: Any, max_depth: int = 12) -> Any:
    """A comparable picture of ``obj`` (see the module docstring)."""
    seen: Dict[int, str] = {}
    alive: List[Any] = []  # (the walked objects, temporaries included: ids stay unique)

    def walk(x: Any, path: str, depth: int) -> Any:
        alive.append(x)
        if isinstance(x, _LEAVES):
            return x if not isinstance(x, float) or x == x else "nan"
        if isinstance(x, torch.Tensor):
            grad = None if x.grad is None else walk(x.grad, path + ".grad", depth + 1) \
                if x.requires_grad or x.grad is not None else None
            first = seen.setdefault(id(x), path)
            return ("same-as", first) if first != path else (_tensor(x), grad)
        if depth > max_depth:
            return ("deep", type(x).__name__)
        first = seen.setdefault(id(x), path)
        if first != path:
            return ("same-as", first)
        if isinstance(x, dict):
            items: List[Any] = []
            for i, (k, v) in enumerate(x.items()):
                key = ("tensor-key", i) if isinstance(k, torch.Tensor) else repr(k)
                items.append((key, walk(v, f"{path}[{key}]", depth + 1)))
            return (type(x).__name__, items)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, [walk(v, f"{path}[{i}]", depth + 1)
                                       for i, v in enumerate(x)])
        if isinstance(x, (set, frozenset)):
            return (type(x).__name__, sorted(repr(v) for v in x))
        if isinstance(x, nn.Module):
            return ("module", type(x).__name__,
                    walk(dict(x.named_parameters()), path + ".params", depth + 1),
                    walk(dict(x.named_buffers()), path + ".buffers", depth + 1),
                    walk({k: v for k, v in vars(x).items()
                          if k not in ("_parameters", "_buffers", "_modules")},
                         path + ".vars", depth + 1))
        if callable(x) and not hasattr(x, "__dict__"):
            return ("callable", getattr(x, "__qualname__", type(x).__name__))
        d = getattr(x, "__dict__", None)
        if d is not None and type(x).__module__.split(".")[0] in ("mixprec", "torch",
                                                                 "_unchanged", "test"):
            return (type(x).__name__, walk(dict(d), path + ".__dict__", depth + 1))
        return ("object", type(x).__name__)

    return walk(obj, "", 0)


def assert_unchanged(before: Any, after: Any) -> None:
    """Equal snapshots; otherwise the first path where they differ."""
    if before == after:
        return

    def diff(a: Any, b: Any, path: str) -> str:
        if type(a) is not type(b):
            return f"{path}: {str(a)[:200]} -> {str(b)[:200]}"
        if isinstance(a, (list, tuple)) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    return diff(x, y, f"{path}/{a[0] if i and isinstance(a[0], str) else i}")
        return f"{path}: {str(a)[:300]} -> {str(b)[:300]}"

    raise AssertionError("the object changed: " + diff(before, after, ""))


def refused_unchanged(
    obj: Any,
    call: Callable[[], Any],
    exc: Union[Type[BaseException], Tuple[Type[BaseException], ...]] = (TypeError, ValueError),
) -> str:
    """``call()`` raises ``exc`` and leaves ``obj`` exactly as it was (its :func:`snapshot`
    before and after equal). Returns the error's message, for the caller to check."""
    before = snapshot(obj)
    with pytest.raises(exc) as info:
        call()
    assert_unchanged(before, snapshot(obj))
    return str(info.value)


# -- one corrupted entry at a time (the load property tests) ------------------------------
#: how an entry is corrupted: a wrong type, shape, dtype, device or range, removed, or an
#: extra entry beside it
KINDS = ("type", "shape", "dtype", "device", "range", "missing", "extra")


def entries(d: Any, path: tuple = ()) -> List[tuple]:
    """The paths of every entry of a nested dict/list (tuples are leaves), parents first."""
    out: List[tuple] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out.append(path + (k,))
            out.extend(entries(v, path + (k,)))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.append(path + (i,))
            out.extend(entries(v, path + (i,)))
    return out


def get(d: Any, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def corrupt(state: Any, path: tuple, kind: str) -> Any:
    """A copy of ``state`` (containers copied, tensors shared unless replaced) with the
    entry at ``path`` corrupted by ``kind``; None when ``kind`` does not apply to it."""
    import copy

    new = copy.copy(state)

    def rebuild(d: Any, p: tuple) -> Any:
        d = copy.copy(d)
        if len(p) > 1:
            d[p[0]] = rebuild(d[p[0]], p[1:])
        return d

    new = rebuild(state, path)
    parent = get(new, path[:-1])
    key = path[-1]
    v = parent[key]
    if kind == "type":
        parent[key] = "text"
    elif kind == "missing":
        if not isinstance(parent, dict):
            return None
        del parent[key]
    elif kind == "extra":
        if not isinstance(v, dict):
            return None
        v = parent[key] = dict(v)
        v[999 if any(isinstance(k, int) for k in v) or not v else "bogus"] = (
            torch.zeros(1) if not v else next(iter(v.values())))
    elif isinstance(v, torch.Tensor):
        if kind == "shape":
            flat = v.detach().reshape(-1)
            parent[key] = torch.cat([flat, flat[:1] if flat.numel() else torch.zeros(1)])
        elif kind == "dtype":
            parent[key] = v.detach().to(torch.complex64)
        elif kind == "device":
            parent[key] = v.detach().to("meta")
        elif kind == "range":
            if not v.is_floating_point() or not v.numel():
                return None
            parent[key] = torch.full_like(v, float("nan"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        if kind == "range":
            parent[key] = -1 if isinstance(v, int) else -1.0
        elif kind == "dtype":
            parent[key] = torch.tensor(v)
        elif kind == "shape":
            parent[key] = [v, v]
        else:
            return None
    elif isinstance(v, bool) and kind == "range":
        parent[key] = 2
    else:
        return None
    return new
