"""The Autograd-key kernel of every op of the op library's ``op_names``, registered from Python.

The ops are not differentiable: they write grads, optimizer and loss-scale state in place.
Each kernel, generic over its op's schema (without one, torch's boxed "autograd not
implemented" fallback would run):

* with grad mode on, refuses a tensor the schema marks as written (``Tensor(a!)``) that
  requires grad, naming the argument (the scaler and the optimizers call the ops under
  ``torch.no_grad()``, where nothing is checked);
* redispatches below autograd (outputs never require grad);
* bumps the version counter of every written tensor, in one call, as torch's in-place ops do.

The torch helpers it needs (:data:`HELPERS`) are looked up at import: a torch without one fails
here, naming it. libmixprec (C++, no Python) has the same kernels in csrc/autograd.cpp.
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, Callable, List

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


def _refuse(name: str, arg: str, value: Any) -> None:
    """Raise if ``value`` (argument ``arg`` of op ``name``, a tensor or list) requires grad."""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    if any(map(_requires_grad, tensors)):
        i = list(map(_requires_grad, tensors)).index(True)
        raise RuntimeError(f"mixprec.{name}: {arg}{f'[{i}]' if tensors is value else ''} "
                           "requires grad, but mixprec ops are not differentiable and write it "
                           "in place; call the op under torch.no_grad() or pass detached tensors")


def _kernel(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The Autograd-key kernel of ``op`` (registered ``with_keyset``)."""
    name = op._schema.name.split("::")[-1]
    written = [(i, a.name) for i, a in enumerate(op._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    redispatch = functools.partial(_redispatch, op)

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        # (the dispatcher passes the arguments positionally, less trailing defaults)
        values = [(arg, args[i]) for i, arg in written if i < len(args) and args[i] is not None]
        if torch.is_grad_enabled():
            for arg, value in values:
                _refuse(name, arg, value)
        with _below():
            out = redispatch(keyset & _after_keyset, *args)
        bumped: List[torch.Tensor] = []
        for _, value in values:
            bumped += value if isinstance(value, (list, tuple)) else [value]
        _bump(bumped)
        return out

    return kernel


#: The kernels live as long as this library object.
_LIBRARY = torch.library.Library("mixprec", "IMPL")
for _name in EXT.op_names:
    _LIBRARY.impl(_name, _kernel(getattr(torch.ops.mixprec, _name).default), "Autograd",
                  with_keyset=True)
