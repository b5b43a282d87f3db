"""The Autograd-key kernel of every op of ``mixprec._C.op_names``, registered from Python.

The ops are not differentiable: they write gradients, optimizer state and loss-scale state in
place. Without an Autograd-key kernel the dispatcher would run torch's boxed "autograd not
implemented" fallback. Each kernel, generic over its op's schema:

* with grad mode on, refuses a tensor the schema marks as written (``Tensor(a!)``) that
  requires grad, naming the argument (writing it would silently corrupt autograd's view of it);
  the scaler and the optimizers call the ops under ``torch.no_grad()``, where nothing is checked;
* redispatches below autograd (outputs never require grad);
* bumps the version counter of every written tensor (one call for all of them), as torch's own
  in-place ops do, so autograd notices a tensor saved for backward that an op changed.

The torch internals it uses (:data:`HELPERS`) are looked up at import: a torch without one
fails here, naming it. libmixprec (the C++ library, no Python) keeps these kernels in C++
(csrc/autograd.cpp); one process never loads both.
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, Callable, List, Sequence

import torch

from .._extension import EXT

#: The torch helpers the kernels use beyond the public ``torch.library`` and
#: ``torch.is_grad_enabled``: the guard that keeps the kernel's inner calls below autograd
#: (C++ ``at::AutoDispatchBelowADInplaceOrView``), the keyset to redispatch with, the
#: redispatch, and the batched version bump.
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
        where = f"{arg}[{i}]" if tensors is value else arg
        raise RuntimeError(f"mixprec.{name}: {where} requires grad, but mixprec ops are not "
                           "differentiable and write it in place; call the op under "
                           "torch.no_grad() or pass detached tensors")


def _kernel(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The Autograd-key kernel of ``op`` (takes the dispatch keyset first)."""
    name = op._schema.name.split("::")[-1]
    written = [(i, a.name) for i, a in enumerate(op._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    redispatch = functools.partial(_redispatch, op)

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        # (the dispatcher passes every argument positionally, less trailing defaults)
        if torch.is_grad_enabled():
            for i, arg in written:
                if i < len(args) and args[i] is not None:
                    _refuse(name, arg, args[i])
        with _below():
            out = redispatch(keyset & _after_keyset, *args)
        bumped: List[torch.Tensor] = []
        for i, _arg in written:
            value = args[i] if i < len(args) else None
            if isinstance(value, (list, tuple)):
                bumped += value
            elif value is not None:
                bumped.append(value)
        _bump(bumped)
        return out

    return kernel


def register(names: Sequence[str]) -> torch.library.Library:
    """Register the kernels of ops ``names``; the kernels live as long as the returned library."""
    lib = torch.library.Library("mixprec", "IMPL")
    for name in names:
        lib.impl(name, _kernel(getattr(torch.ops.mixprec, name).default), "Autograd",
                 with_keyset=True)
    return lib


_LIBRARY = register(EXT.op_names)
