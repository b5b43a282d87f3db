"""A CPU stand-in for CUDA-graph capture and replay (tests only).

:class:`Recorder` is a TorchDispatchMode that records one step as the dispatcher runs it:
every aten/mixprec op below autograd and autocast, with its arguments, each tensor
identified either as *external* (it existed before the op: a param, a grad, optimizer
state, a static input, a constant; kept by reference, as a graph keeps its address) or as
the output of an earlier recorded op. Python numbers in the arguments are recorded as
they were: baked in, as a CUDA graph bakes kernel arguments. :meth:`Trace.replay` runs
the ops again, external tensors by reference (so in-place writes land in the same
storages) and intermediates recomputed. So a step whose replay equals eager training
bit for bit on CPU has no host value and no storage change a CUDA graph would miss.

:class:`OpLog` records, per step, the op sequence and the storages of the persistent
tensors it touched, for the replay-invariance tests.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _Ext:
    __slots__ = ("t",)

    def __init__(self, t: Tensor) -> None:
        self.t = t


class _Int:
    __slots__ = ("op", "leaf")

    def __init__(self, op: int, leaf: int) -> None:
        self.op, self.leaf = op, leaf


class Trace:
    """One recorded step: ``ops`` (func, args and kwargs with tensor references) and the
    references of the body's outputs."""

    def __init__(self) -> None:
        self.ops: List[Tuple[Any, Any, Any, List[int]]] = []
        self.outputs: Any = None

    def replay(self) -> Any:
        """Run the recorded ops again (under no_grad: they are below autograd); return the
        body's outputs as this replay computed them."""
        vals: Dict[Tuple[int, int], Tensor] = {}

        def resolve(x: Any) -> Any:
            if isinstance(x, _Ext):
                return x.t
            if isinstance(x, _Int):
                return vals[(x.op, x.leaf)]
            return x

        is_ref = lambda x: isinstance(x, (_Ext, _Int))  # noqa: E731
        with torch.no_grad():
            for i, (func, a, k, produced) in enumerate(self.ops):
                args = pytree.tree_map(resolve, a, is_leaf=is_ref)
                kwargs = pytree.tree_map(resolve, k, is_leaf=is_ref)
                out = func(*args, **kwargs)
                leaves = pytree.tree_leaves(out)
                for j in produced:
                    vals[(i, j)] = leaves[j]
        return pytree.tree_map(resolve, self.outputs, is_leaf=is_ref)


class Recorder(TorchDispatchMode):
    """Record the ops of the block it is active for into :attr:`trace` (they also run)."""

    def __init__(self) -> None:
        super().__init__()
        self.trace = Trace()
        self._made: Dict[int, _Int] = {}
        self._keep: List[Tensor] = []  # keeps ids unique while recording

    def ref(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            made = self._made.get(id(x))
            return made if made is not None else _Ext(x)
        return x

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        a = pytree.tree_map(self.ref, args)
        k = pytree.tree_map(self.ref, kwargs)
        out = func(*args, **kwargs)
        index = len(self.trace.ops)
        seen = {id(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        produced = []
        for j, leaf in enumerate(pytree.tree_leaves(out)):
            if isinstance(leaf, Tensor) and id(leaf) not in seen and id(leaf) not in self._made:
                self._made[id(leaf)] = _Int(index, j)
                self._keep.append(leaf)
                produced.append(j)
        self.trace.ops.append((func, a, k, produced))
        return out

    def finish(self, outputs: Any) -> Trace:
        """Record the body's outputs; the trace is complete."""
        self.trace.outputs = pytree.tree_map(self.ref, outputs)
        return self.trace


def record(fn: Any, *inputs: Any) -> Tuple[Trace, Any]:
    """Run ``fn(*inputs)`` once, recording it; ``(trace, outputs)``."""
    rec = Recorder()
    with rec:
        out = fn(*inputs)
    return rec.finish(out), out


class OpLog(TorchDispatchMode):
    """Per op: its name, and for each tensor argument of ``watched`` storages, which one.
    ``ops`` is the sequence; ``touched`` the watched storages seen (data_ptr)."""

    def __init__(self, watched: Dict[int, str]) -> None:
        super().__init__()
        self.watched = watched
        self.ops: List[Tuple[str, Tuple[str, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        names = tuple(self.watched.get(t.untyped_storage().data_ptr(), "-")
                      for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor))
        self.ops.append((str(func), names))
        return func(*args, **kwargs)
