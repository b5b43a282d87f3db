"""The Autograd-key kernel of every op of the op library's ``op_names``, registered from Python.

The ops are not differentiable: they write grads, optimizer and loss-scale state in place.
Each kernel, generic over its op's schema (without one, torch's boxed "autograd not
implemented" fallback would run):

* with grad mode on, refuses a tensor the schema marks as written (``Tensor(a!)``) that
  requires grad, naming the argument (the scaler and the optimizers call the ops under
  ``torch.no_grad()``, where nothing is checked);
* redispatches below autograd (outputs never require grad);
* bumps the version counter of every written tensor, in one call, as torch's in-place ops do.

The wrappers of :mod:`mixprec.ops` do the same work themselves (:func:`call_below_autograd`),
so that their calls skip the dispatcher's round trip through this Python kernel.

The torch helpers it needs (:data:`HELPERS`) are looked up at import: a torch without one fails
here, naming it. libmixprec (C++, no Python) has the same kernels in csrc/autograd.cpp.
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, Callable, List, Sequence, Tuple

import torch

from .._extension import EXT

#: Beyond ``torch.library`` and ``torch.is_grad_enabled``: the guard keeping the kernel's
#: inner calls below autograd (C++ ``at::AutoDispatchBelowADInplaceOrView``), the keyset to
#: redispatch with, the redispatch, and the version bump (it takes a list).
HELPERS = ("torch._C._AutoDispatchBelowADInplaceOrView", "torch._C._after_ADInplaceOrView_keyset",
           "torch._ops.OpOverload.redispatch", "torch.autograd.graph.increment_version")


def _helper(path: str) -> Any:
    """The object at dotted ``path`` ("torch...."); ImportError naming it when missing."""
    try:
        return functools.reduce(getattr, path.split(".")[1:], torch)
    except AttributeError:
        raise ImportError(f"mixprec: torch {torch.__version__} has no {path}, which mixprec's "
                          "Autograd-key kernels (mixprec/ops/_autograd.py) need") from None


_below, _after_keyset, _redispatch, _bump = (_helper(h) for h in HELPERS)
_requires_grad = attrgetter("requires_grad")


#: Per op: the schema arguments it writes in place, as ``(position, name)``.
Written = List[Tuple[int, str]]


def written_arguments(op: torch._ops.OpOverload) -> Written:
    """The arguments the schema of ``op`` marks as written (``Tensor(a!)``, ``Tensor(a!)[]``)."""
    return [(i, a.name) for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _refuse(name: str, arg: str, value: Any) -> None:
    """Raise if ``value`` (argument ``arg`` of op ``name``, a tensor or list) requires grad."""
    if isinstance(value, torch.Tensor):  # (one attribute read: no list, no map)
        if not value.requires_grad:
            return
        tensors = [value]
    else:
        tensors = value
    if any(map(_requires_grad, tensors)):
        i = list(map(_requires_grad, tensors)).index(True)
        raise RuntimeError(f"mixprec.{name}: {arg}{f'[{i}]' if tensors is value else ''} "
                           "requires grad, but mixprec ops are not differentiable and write it "
                           "in place; call the op under torch.no_grad() or pass detached tensors")


def _written_values(written: Written, args: Sequence[Any]) -> List[Tuple[str, Any]]:
    # (the dispatcher passes the arguments positionally, less trailing defaults)
    n = len(args)
    return [(arg, args[i]) for i, arg in written if i < n and args[i] is not None]


def _bump_all(values: List[Tuple[str, Any]]) -> None:
    bumped: List[torch.Tensor] = []
    for _, value in values:
        if isinstance(value, (list, tuple)):
            bumped += value
        else:
            bumped.append(value)
    _bump(bumped)


def call_below_autograd(op: Callable[..., Any], name: str, written: Written,
                        args: Sequence[Any]) -> Any:
    """``op(*args)`` doing the Autograd kernel's work itself (the refusal with grad mode on,
    the call below autograd, the version bump): the same effects, without the dispatcher's
    round trip through the Python kernel (each argument converted to Python and back)."""
    values = _written_values(written, args)
    if torch.is_grad_enabled():
        for arg, value in values:
            _refuse(name, arg, value)
    with _below():
        out = op(*args)
    _bump_all(values)
    return out


def _kernel(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The Autograd-key kernel of ``op`` (registered ``with_keyset``)."""
    name = op._schema.name.split("::")[-1]
    written = written_arguments(op)
    redispatch = functools.partial(_redispatch, op)

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        values = _written_values(written, args)
        if torch.is_grad_enabled():
            for arg, value in values:
                _refuse(name, arg, value)
        with _below():
            out = redispatch(keyset & _after_keyset, *args)
        _bump_all(values)
        return out

    return kernel


#: The kernels live as long as this library object.
_LIBRARY = torch.library.Library("mixprec", "IMPL")
for _name in EXT.op_names:
    _LIBRARY.impl(_name, _kernel(getattr(torch.ops.mixprec, _name).default), "Autograd",
                  with_keyset=True)
