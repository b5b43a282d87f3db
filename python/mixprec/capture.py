"""One CUDA graph per training step: :func:`capture_step` (guide: docs/capture.md).

Above :mod:`mixprec.optim` and :mod:`mixprec.amp`, below :mod:`mixprec.train`. The user's
step body, written as for eager training, is captured as it is::

    step = mixprec.capture.capture_step(train_step, (x0, y0), optimizers=[opt],
                                        scaler=scaler, modules=[model])
    for x, y in data:
        loss = step(x, y)          # a device tensor; no host sync
        sched.step()               # between calls, as usual

One graph per captured step, for one input signature. The first ``warmup`` calls run
eagerly on a side stream, the next one eagerly under the checks, the next one is
captured and replayed; later calls copy their inputs into static buffers and replay.
:meth:`CapturedStep.prepare` runs before every call. The sync ops and baked settings are
C++ ``mixprec::CapturedStep``'s (``csrc/capture_rules.h``, read from the op library). On
CPU every call is eager, after the same checks.

Host syncs: none per call once captured. Capturing synchronizes the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import traceback
import weakref
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _dtensor
from ._extension import EXT
from .amp.capability import HOST, LEGACY, SCALARS, step_kind

__all__ = ["CaptureError", "CapturedStep", "SyncDetector", "SyncEvent", "SYNC_OPS",
           "capture_step", "check_optimizers", "check_distributed", "check_autocast",
           "persistent_tensors"]

log = logging.getLogger("mixprec.capture")

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class CaptureError(RuntimeError):
    """A step cannot be captured as it is written; the message names the cause and the fix."""


#: Ops that read a device value on the host, by ``OpOverloadPacket`` name, with their rule:
#: ``"reads"`` (always), ``"bool_mask"`` (indexing with a boolean mask), ``"to_host"`` (a
#: device-to-CPU copy). C++'s table (``csrc/capture_rules.h``).
SYNC_OPS: Mapping[str, str] = MappingProxyType(dict(EXT.capture_sync_ops))
#: The param-group options a graph does not bake in (C++'s rows flagged live).
_LIVE_OPTIONS: frozenset = EXT.capture_live_options
#: The scaler's settings a graph bakes in: (name, the scaler's method or property).
_SCALER_SETTINGS: Tuple[Tuple[str, str], ...] = EXT.capture_scaler_settings


@dataclasses.dataclass(frozen=True)
class SyncEvent:
    """One op that would sync: its name, why, and the innermost frame of user code."""

    op: str
    reason: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} ({self.reason}) at {self.where}"


def _user_frame() -> str:
    """The innermost frame outside torch and this module (the user's line), as text."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path == os.path.abspath(__file__):
            continue
        return f"{frame.filename}:{frame.lineno} ({frame.name}): {frame.line}"
    return "<unknown>"


class SyncDetector(TorchDispatchMode):
    """A :class:`TorchDispatchMode` that counts every op that would sync with the host.

    Counted (:meth:`why`): the ops of :data:`SYNC_OPS` by their rule, and any other op
    returning a Python float or bool (an int is a size the op knows on the host). The ops
    that would sync on CUDA are counted on any device, so a CPU run proves the CUDA step
    sync-free (``.item()`` of a CPU tensor counts: capture would bake the value in).

    ``events``: the :class:`SyncEvent` seen, in order; ``count``: their number.
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: List[SyncEvent] = []

    @property
    def count(self) -> int:
        return len(self.events)

    @staticmethod
    def why(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], out: Any) -> Optional[str]:
        """Why the call ``func(*args, **kwargs) -> out`` syncs, or None."""
        name = func.name().split(".")[0]  # "aten::add.Tensor" -> "aten::add"
        rule = SYNC_OPS.get(name)
        if rule == "reads":
            return "reads a device value on the host"
        if rule == "bool_mask":
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            for t in indices or ():
                if isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8):
                    return "boolean-mask indexing (a nonzero on the device)"
        elif rule == "to_host":  # copy_(self <- src), _copy_from(src -> dst), to(src)
            src, dst = ((args[1], args[0]) if name == "aten::copy_" else
                        (args[0], args[1]) if name == "aten::_copy_from" else (args[0], out))
            if (isinstance(src, Tensor) and isinstance(dst, Tensor)
                    and src.device.type not in ("cpu", "meta") and dst.device.type == "cpu"):
                return "copies a device tensor to the host"
        elif rule is None:
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, bool):
                    return "returns a bool"
                if isinstance(leaf, (float, complex)):
                    return "returns a float"
        return None

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        reason = self.why(func, args, kwargs, out)
        if reason is not None:
            event = SyncEvent(func.name().split(".")[0], reason, _user_frame())
            self.events.append(event)
        return out


def check_optimizers(optimizers: Sequence[torch.optim.Optimizer], scaler: Any) -> None:
    """Refuse optimizers whose step cannot be captured (:class:`CaptureError` naming the
    optimizer and the reason). mixprec's are accepted; others need ``capturable=True`` in
    every group and, with an enabled scaler, ``_step_supports_amp_scaling`` (torch's
    ``fused=True``); torch's deprecated ``grad_scaler`` protocol is refused."""
    if not optimizers:
        raise CaptureError("mixprec.capture: optimizers=[...] is required (the optimizers "
                           "the step body steps)")
    enabled = scaler is not None and scaler.is_enabled()
    for i, opt in enumerate(optimizers):
        if not isinstance(opt, torch.optim.Optimizer):
            raise CaptureError(f"mixprec.capture: optimizers[{i}] is a {type(opt).__name__}, "
                               "not a torch.optim.Optimizer")
        kind = step_kind(opt)
        name = f"optimizers[{i}] ({type(opt).__module__}.{type(opt).__name__})"
        if kind == SCALARS:
            continue
        if kind == LEGACY:
            raise CaptureError(f"mixprec.capture: {name} takes the scaler itself (torch's "
                               "deprecated grad_scaler protocol); its step is host code")
        if enabled and kind == HOST:
            raise CaptureError(
                f"mixprec.capture: {name} is not a mixprec optimizer and does not take the "
                "scaler's device tensors (no _step_supports_amp_scaling): scaler.step() "
                "would read found_inf on the host (.item()) to skip an overflow step, a "
                "host sync a CUDA graph cannot hold. Use mixprec.optim.Adam/AdamW/SGD (or "
                "a torch optimizer with fused=True, capturable=True)."
            )
        for k, group in enumerate(opt.param_groups):
            if not group.get("capturable", False):
                raise CaptureError(
                    f"mixprec.capture: {name}: param_groups[{k}] has capturable="
                    f"{group.get('capturable')!r}; a torch optimizer reads its step count "
                    "on the host unless capturable=True. Use mixprec.optim (always "
                    "capturable) or pass capturable=True."
                )


def check_distributed(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                      modules: Sequence[torch.nn.Module]) -> None:
    """Refuse FSDP2 (DTensor params), a scaler with a ``process_group``, DDP-wrapped modules
    and a multi-rank process group (:class:`CaptureError`)."""
    for opt in optimizers:
        for group in opt.param_groups:
            if _dtensor.any_dtensor(group["params"]):
                raise CaptureError(
                    "mixprec.capture: FSDP2 (DTensor params) is not supported: its hooks "
                    "all-gather and free unsharded params around every forward/backward "
                    "with host-side bookkeeping that a replay does not run. Train FSDP2 "
                    "models eagerly (or with torch.compile).")
    if scaler is not None and getattr(scaler, "process_group", None) is not None:
        raise CaptureError("mixprec.capture: a GradScaler with a process_group (collective "
                           "inf checks and norms) is not supported under capture")
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, torch.nn.parallel.DistributedDataParallel):
                raise CaptureError(
                    "mixprec.capture: DistributedDataParallel is not supported: its reducer "
                    "rebuilds buckets and decides on the host which hooks fired. Capture a "
                    "single-process step.")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise CaptureError("mixprec.capture: a multi-rank torch.distributed process group is "
                           "initialized; multi-rank steps (DDP, FSDP2) are not supported")


def check_autocast(device_type: str) -> None:
    """Refuse an enclosing autocast region with its cast cache on (it would keep tensors of
    the graph's pool across replays); the body's own ``torch.autocast`` is fine."""
    if torch.is_autocast_enabled(device_type) and torch.is_autocast_cache_enabled():
        raise CaptureError(
            f"mixprec.capture: called inside an enabled torch.autocast({device_type!r}) region "
            "with its cast cache on: the cast weights it caches would outlive the graph. "
            "Put the autocast inside the step body, or use cache_enabled=False.")


@dataclasses.dataclass
class _Slot:
    """One persistent tensor: where it lives (``get``/``put``), the tensor the graph uses."""

    name: str
    get: Callable[[], Optional[Tensor]]
    put: Optional[Callable[[Tensor], None]]  # None: cannot be re-bound (a param)
    tensor: Tensor
    ptr: int
    lr_key: Optional[Tuple[int, int]] = None


def _slot(name: str, get: Callable[[], Optional[Tensor]],
          put: Optional[Callable[[Tensor], None]] = None,
          lr_key: Optional[Tuple[int, int]] = None) -> _Slot:
    t = get()
    return _Slot(name, get, put, t, t.data_ptr(), lr_key)  # type: ignore[arg-type]


def _entry(owner: Callable[[], Any], key: Any) -> Tuple[Callable[[], Optional[Tensor]],
                                                        Callable[[Tensor], None]]:
    """``get``/``put`` of ``owner()[key]``, the owner looked up at every use (a load builds
    new dicts)."""
    def get() -> Optional[Tensor]:
        d = owner()
        return None if d is None else d.get(key)

    def put(v: Tensor) -> None:
        owner()[key] = v

    return get, put


def _attr(obj: Any, name: str) -> Tuple[Callable[[], Optional[Tensor]],
                                        Callable[[Tensor], None]]:
    """``get``/``put`` of ``obj.<name>`` (a grad, a module buffer, the scaler's tensors)."""
    return (lambda: getattr(obj, name, None)), (lambda v: setattr(obj, name, v))


def _lr_slot(name: str, opt: torch.optim.Optimizer, o: int, i: int) -> Optional[_Slot]:
    """The lr tensor group ``i``'s kernels read: a tensor lr, mixprec's device tensor of a
    float lr, or None (a torch optimizer's float lr is baked in)."""
    groups = opt.param_groups
    if isinstance(groups[i]["lr"], Tensor):
        return _slot(name + "['lr']",
                     *_entry(lambda g=groups, i=i: g[i] if i < len(g) else None, "lr"))
    if step_kind(opt) != SCALARS:
        return None
    device = groups[i]["params"][0].device if groups[i]["params"] else torch.device("cpu")
    t = opt.lr_tensor(i, device)  # type: ignore[attr-defined]
    return _slot(name + " lr tensor", lambda: t, None, (o, i))


def persistent_tensors(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                       modules: Sequence[torch.nn.Module]) -> List[Tuple[str, Tensor]]:
    """Every tensor a step keeps across steps, named: params, grads, optimizer state, the
    lr tensors, the scaler's state tensors and the modules' buffers. No op runs."""
    return [(s.name, s.tensor) for s in _collect_slots(optimizers, scaler, modules)]


def _collect_slots(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                   modules: Sequence[torch.nn.Module]) -> List[_Slot]:
    slots: List[_Slot] = []
    for o, opt in enumerate(optimizers):
        for i, group in enumerate(opt.param_groups):
            for k, p in enumerate(group["params"]):
                where = f"optimizers[{o}].param_groups[{i}]['params'][{k}]"
                slots.append(_slot(where, lambda p=p: p))
                if p.grad is not None:
                    slots.append(_slot(where + ".grad", *_attr(p, "grad")))
                state = opt.state.get(p) or {}
                for name in sorted(state, key=str):
                    if isinstance(state[name], Tensor):
                        slots.append(_slot(f"{where} state[{name!r}]",
                                           *_entry(lambda opt=opt, p=p: opt.state.get(p), name)))
            lr = _lr_slot(f"optimizers[{o}].param_groups[{i}]", opt, o, i)
            if lr is not None:
                slots.append(lr)
    if scaler is not None and scaler.is_enabled():
        for name in scaler.state_tensors():
            slots.append(_slot(f"scaler.{name}",
                               lambda name=name: scaler.state_tensors().get(name)))
    for m, module in enumerate(modules):
        for mod_name, sub in module.named_modules():
            for b_name, _ in sub.named_buffers(recurse=False):
                where = f"modules[{m}].{mod_name}.{b_name}".replace("..", ".")
                slots.append(_slot(where, *_attr(sub, b_name)))
    return slots


def _settings(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
              modules: Sequence[torch.nn.Module], deep: bool) -> Dict[str, Any]:
    """What a graph bakes in, by name: every param-group option but the live ones, the
    param lists (``(id, len)``), the scaler's settings, the ``training`` flags (``deep``:
    every submodule's). Tensors by identity. No op runs; O(groups) unless ``deep``."""
    out: Dict[str, Any] = {}
    for o, opt in enumerate(optimizers):
        device_lr = step_kind(opt) == SCALARS
        out[f"optimizers[{o}] param groups"] = len(opt.param_groups)
        for i, group in enumerate(opt.param_groups):
            where = f"optimizers[{o}].param_groups[{i}]"
            for key, value in group.items():
                if key == "params":
                    out[f"{where}['params']"] = (id(value), len(value))
                elif key in _LIVE_OPTIONS and (device_lr or isinstance(value, Tensor)):
                    continue  # (a tensor lr is a slot)
                else:
                    out[f"{where}[{key!r}]"] = id(value) if isinstance(value, Tensor) else value
    if scaler is not None:
        for name, accessor in _SCALER_SETTINGS:
            if name != "enabled" and not scaler.is_enabled():
                continue
            value = getattr(scaler, accessor, None)
            out[f"scaler.{name}"] = value() if callable(value) else value
    for m, module in enumerate(modules):
        subs = module.named_modules() if deep else (("", module),)
        for name, sub in subs:
            out[f"modules[{m}]{'.' + name if name else ''}.training"] = sub.training
    return out


def _changed(was: Dict[str, Any], now: Dict[str, Any]) -> Optional[str]:
    """The first setting of ``was`` that ``now`` changes, as ``name old -> new``."""
    for name, old in was.items():
        new = now.get(name, "<gone>")
        if new is not old and new != old:
            return f"{name} {old!r} -> {new!r}"
    extra = [name for name in now if name not in was]
    return f"{extra[0]} (new)" if extra else None


@dataclasses.dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    static_inputs: List[Tensor]
    static_outputs: Any
    record: Any  # the scaler's IterationRecord of the captured update()


def _describe(leaf: Any) -> str:
    if isinstance(leaf, Tensor):
        return f"{leaf.dtype} {list(leaf.shape)} on {leaf.device}"
    return repr(leaf)


def _signature(leaves: List[Any], spec: Any) -> Tuple[Any, ...]:
    key: List[Any] = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            key.append(("T", tuple(leaf.shape), leaf.dtype, str(leaf.device),
                        leaf.requires_grad))
        else:
            key.append(("V", repr(leaf)))
    return tuple(key)


class CapturedStep:
    """The callable :func:`capture_step` returns: ``step(*inputs)`` runs one training step.

    Inputs must have the example's signature (else :class:`CaptureError`). Returns the
    body's return value: on a replay, clones of the static outputs (``clone_outputs=False``:
    the static tensors, overwritten by the next replay). No host sync once captured.

    Attributes: ``graph`` (None before the capture, and on CPU), ``calls``, ``device``,
    ``mode`` (``"cuda-graph"``, or ``"eager"`` on CPU), ``pool`` (the graph's memory pool).
    """

    def __init__(self, fn: Callable[..., Any], example_inputs: Tuple[Any, ...], *,
                 optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                 modules: Sequence[torch.nn.Module], schedulers: Sequence[Any],
                 warmup: int, clone_outputs: bool, pool: Any) -> None:
        self.fn = fn
        self.optimizers = list(optimizers)
        self.scaler = scaler
        self.modules = list(modules)
        self.schedulers = list(schedulers)
        self.warmup = int(warmup)
        self.clone_outputs = clone_outputs
        self.device = _step_device(self.optimizers, example_inputs)
        self.mode = "cuda-graph" if self.device.type == "cuda" else "eager"
        leaves, spec = pytree.tree_flatten(example_inputs)
        self._example = [_describe(x) for x in leaves]
        self.signature = _signature(leaves, spec)
        self.graph: Optional[_Graph] = None
        self.calls = 0
        self.pool = pool
        self._slots: Optional[List[_Slot]] = None  # from the checked call
        self._lr_slots: List[_Slot] = []
        self._settings: Optional[Dict[str, Any]] = None
        self._deep: Optional[Dict[str, Any]] = None
        self._sentinels: List[Tuple[Tensor, int, Optional[Tensor]]] = []
        self._loaded = False  # set by the load hooks: the next prepare re-binds
        self._side: Any = None
        me = weakref.ref(self)

        def loaded(*_: Any) -> None:
            step = me()
            if step is not None:
                step._loaded = True

        self._hooks = [opt.register_load_state_dict_post_hook(loaded)
                       for opt in self.optimizers]
        self._hooks += [sub.register_load_state_dict_post_hook(loaded)
                        for m in self.modules for sub in m.modules()]
        if self.mode == "eager":
            log.info("mixprec.capture: the step runs on %s: no CUDA graph; every call runs "
                     "eagerly after the capture checks (validation mode)", self.device)

    def __del__(self) -> None:
        for h in getattr(self, "_hooks", ()):
            h.remove()

    def __call__(self, *inputs: Any) -> Any:
        check_autocast(self.device.type)
        leaves, spec = pytree.tree_flatten(inputs)
        if _signature(leaves, spec) != self.signature:
            self._refuse_inputs(leaves, spec)
        self.prepare()
        if self.graph is not None:
            return self._replay(self.graph, leaves)
        n, self.calls = self.calls, self.calls + 1
        if n < self.warmup or (n > self.warmup and self.mode == "eager"):
            return self._eager(inputs)
        if n == self.warmup:
            return self._checked(inputs)
        self.graph = self._capture(inputs, leaves)
        return self._replay(self.graph, leaves, copy=False)

    def accepts(self, *inputs: Any) -> bool:
        """Whether ``inputs`` are of the step's input signature (no op runs)."""
        return _signature(*pytree.tree_flatten(inputs)) == self.signature

    def prepare(self) -> None:
        """Make the captured state current; runs before every call (no host sync).

        A change of what the graph bakes in raises :class:`CaptureError` naming it; after
        a load (torch's load post hooks) or a moved first param or dropped grad of a group,
        :meth:`rebind` runs; each group's lr is written into its lr tensor when it changed.
        O(groups) when nothing was loaded.
        """
        if self._slots is None or self._settings is None:
            return
        self._check_baked(self._settings, deep=False)
        moved = any(p.data_ptr() != ptr or p.grad is not grad
                    for p, ptr, grad in self._sentinels)
        if self._loaded or moved:
            self.rebind()
        self._fill_lr()

    def rebind(self) -> None:
        """The full walk: every persistent tensor and ``training`` flag checked against the
        checked call's; a tensor replaced by one of the same layout is copied into the
        captured storage and put back, a dropped grad put back, anything else raises."""
        self._check_baked(self._deep, deep=True)  # type: ignore[arg-type]
        todo: List[Tuple[_Slot, Optional[Tensor]]] = []
        for s in self._slots:  # type: ignore[union-attr]
            cur = s.get()
            if cur is s.tensor and cur.data_ptr() == s.ptr:
                continue
            fits = (cur is not None and cur.shape == s.tensor.shape
                    and cur.dtype == s.tensor.dtype and cur.device == s.tensor.device)
            if s.put is None or not (fits or (cur is None and s.name.endswith(".grad"))):
                raise CaptureError(
                    f"mixprec.capture: {s.name} is another tensor or in new storage since "
                    "the checked call (the graph holds the old address): load values in "
                    "place (copy_ under torch.no_grad()), a checkpoint of the same layout")
            todo.append((s, cur))
        with torch.no_grad():
            for s, cur in todo:  # (every check before any write)
                if cur is not None:
                    s.tensor.copy_(cur)  # e.g. optimizer.load_state_dict's new tensors
                s.put(s.tensor)  # type: ignore[misc]
        self._loaded = False

    def _check_baked(self, was: Dict[str, Any], deep: bool) -> None:
        """:class:`CaptureError` for a change of what the graph bakes in since the checked call."""
        change = _changed(was, _settings(self.optimizers, self.scaler, self.modules, deep=deep))
        if change is not None:
            raise CaptureError(
                f"mixprec.capture: what the graph bakes in changed since the checked call: "
                f"{change}. Capture a new step to change it (sharing the pool: "
                "capture_step(..., pool=step.pool))")

    def _refuse_inputs(self, leaves: List[Any], spec: Any) -> None:
        got = _signature(leaves, spec)
        if len(got) != len(self.signature) or got[0] != self.signature[0]:
            what = f"inputs of another structure ({spec}, the example {self.signature[0]})"
        else:
            i = next(i for i in range(len(leaves)) if got[1 + i] != self.signature[1 + i])
            what = (f"inputs[{i}]: expected {self._example[i]} (as the example input), "
                    f"got {_describe(leaves[i])}")
        raise CaptureError(
            f"mixprec.capture: {what}; a step is captured for one input signature: another "
            "shape, dtype or device needs its own captured step (sharing the pool: "
            "capture_step(..., pool=step.pool)), or pad the batch")

    @contextlib.contextmanager
    def _stream_ctx(self) -> Iterator[None]:
        """On CUDA, run a block on the side stream, ordered after and before the current
        stream's work."""
        if self.device.type != "cuda":
            yield
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            yield
        current.wait_stream(self._side)

    def _eager(self, inputs: Tuple[Any, ...]) -> Any:
        with self._stream_ctx():
            out = self.fn(*inputs)
        sc = self.scaler
        if sc is not None and sc.is_enabled() and sc.iteration_open():
            # (the next call would fail inside torch's scaler.step instead)
            raise CaptureError(_OPEN)
        return out

    def _checked(self, inputs: Tuple[Any, ...]) -> Any:
        """One eager step under every check, run to its end; then the first reason it cannot
        be captured raises. The walk after it is what the graph holds."""
        before = _collect_slots(self.optimizers, self.scaler, self.modules)
        host = _settings(self.optimizers, self.scaler, self.modules, deep=True)
        lrs = [[g["lr"] for g in o.param_groups] for o in self.optimizers]
        epochs = [getattr(sc, "last_epoch", None) for sc in self.schedulers]
        record = self.scaler.last_iteration if self.scaler is not None else None
        detector = SyncDetector()
        with self._stream_ctx(), detector:
            out = self.fn(*inputs)
        after = _collect_slots(self.optimizers, self.scaler, self.modules)
        now_host = _settings(self.optimizers, self.scaler, self.modules, deep=True)
        if detector.events:
            raise CaptureError(
                f"mixprec.capture: the step syncs with the host: {detector.events[0]} "
                f"({detector.count} op(s) in all). A CUDA graph cannot capture a host "
                "read (capture fails, or the value read at capture is replayed "
                "forever). Keep values on the device: return the loss tensor, use "
                "scaler.found_inf() instead of step_was_skipped, no .item()/bool()/print "
                "of a tensor in the step.")
        names = {s.name: s for s in after}
        for s in before:
            now = names.get(s.name)
            grad = s.name.endswith(".grad")
            if now is None:
                hint = (" (zero_grad(set_to_none=True) in the step? use set_to_none=False: "
                        "the grads must keep their storage)") if grad else ""
                raise CaptureError(f"mixprec.capture: the step drops {s.name}{hint}")
            if now.tensor is not s.tensor or now.ptr != s.ptr:
                hint = (" (zero_grad(set_to_none=True) in the step? use set_to_none=False)"
                        if grad else " (a tensor rebuilt instead of updated in place)")
                raise CaptureError(f"mixprec.capture: the step changes the storage of "
                                   f"{s.name}{hint}; a replay would keep writing the old storage")
        for o, opt in enumerate(self.optimizers):
            for i, group in enumerate(opt.param_groups):
                old = lrs[o][i] if i < len(lrs[o]) else None
                if group["lr"] is not old and group["lr"] != old:
                    raise CaptureError(_scheduler_in_body(
                        f"optimizers[{o}].param_groups[{i}]['lr'] (an LR scheduler stepped "
                        "inside the body?)"))
        changed = _changed(host, now_host)
        if changed is not None:
            raise CaptureError(f"mixprec.capture: the step changes host state a replay would "
                               f"not: {changed}")
        sc = self.scaler
        if sc is not None and sc.is_enabled():
            if sc.iteration_open():
                raise CaptureError(_OPEN)
            if sc.last_iteration is record:
                raise CaptureError("mixprec.capture: the scaler passed as scaler= is not "
                                   "updated by the step")
        for k, sc in enumerate(self.schedulers):
            if getattr(sc, "last_epoch", None) != epochs[k]:
                raise CaptureError(_scheduler_in_body(
                    f"schedulers[{k}] ({type(sc).__name__}), an LR scheduler stepped inside the "
                    "body"))
        self._slots, self._deep = after, now_host
        self._lr_slots = [s for s in after if s.lr_key is not None]
        self._settings = _settings(self.optimizers, self.scaler, self.modules, deep=False)
        self._sentinels = [(g["params"][0], g["params"][0].data_ptr(), g["params"][0].grad)
                           for o in self.optimizers for g in o.param_groups if g["params"]]
        self._loaded = False
        return out

    def _capture(self, inputs: Tuple[Any, ...], leaves: List[Any]) -> _Graph:
        static = [x.detach().clone() if isinstance(x, Tensor) else x for x in leaves]
        static_inputs = pytree.tree_unflatten(static, pytree.tree_flatten(inputs)[1])
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.fn(*static_inputs)
        except CaptureError:
            raise
        except RuntimeError as e:
            raise CaptureError(f"mixprec.capture: CUDA graph capture of the step failed: {e}"
                               ) from e
        record = self.scaler.last_iteration if self.scaler is not None else None
        out = pytree.tree_map_only(Tensor, lambda t: t.detach(), out)  # free the autograd graph
        log.info("mixprec.capture: captured the step for %s", self.signature[1:])
        return _Graph(graph, [x for x in static if isinstance(x, Tensor)], out, record)

    def _replay(self, g: _Graph, leaves: List[Any], copy: bool = True) -> Any:
        if copy:
            new = [x for x in leaves if isinstance(x, Tensor)]
            for dst, src in zip(g.static_inputs, new):
                if dst is not src:
                    dst.copy_(src, non_blocking=True)
        g.graph.replay()
        self.calls += 1
        if g.record is not None:
            self.scaler.last_iteration = g.record  # its flags were rewritten by this replay
        if not self.clone_outputs:
            return g.static_outputs
        return pytree.tree_map_only(Tensor, lambda t: t.clone(), g.static_outputs)

    def _fill_lr(self) -> None:
        """Bring each captured lr tensor up to date (``lr_tensor``: ``fill_`` when changed;
        another tensor is copied in). No sync."""
        for s in self._lr_slots:
            o, i = s.lr_key  # type: ignore[misc]
            opt = self.optimizers[o]
            if i < len(opt.param_groups):
                with torch.no_grad():
                    t = opt.lr_tensor(i, s.tensor.device)  # type: ignore[attr-defined]
                    if t is not s.tensor:
                        s.tensor.copy_(t.reshape(()), non_blocking=True)


_OPEN = ("mixprec.capture: the step leaves the scaler's iteration open; end the step body "
         "with scaler.update()")


def _scheduler_in_body(what: str) -> str:
    return (f"mixprec.capture: the step changes {what}: host code a replay does not run. "
            "Step schedulers outside the body, between calls: the lr reaches the graph as "
            "a device tensor filled before each replay")


def _step_device(optimizers: Sequence[torch.optim.Optimizer],
                 example_inputs: Tuple[Any, ...]) -> torch.device:
    """The first param's device, else the first example input tensor's, else the CPU."""
    params = (p for opt in optimizers for group in opt.param_groups for p in group["params"])
    tensors = (x for x in pytree.tree_leaves(example_inputs) if isinstance(x, Tensor))
    first = next(itertools.chain(params, tensors), None)
    return torch.device("cpu") if first is None else first.device


def capture_step(
    step_fn: Callable[..., Any],
    example_inputs: Tuple[Any, ...],
    *,
    optimizers: Iterable[torch.optim.Optimizer],
    scaler: Any = None,
    modules: Iterable[torch.nn.Module] = (),
    schedulers: Iterable[Any] = (),
    warmup: int = 2,
    clone_outputs: bool = True,
    pool: Any = None,
) -> CapturedStep:
    """Capture a training step, written as for eager training, into a CUDA graph.

    Args:
        step_fn: the step body, ``step_fn(*inputs) -> outputs`` (a pytree of tensors, or
            None). It zeroes grads with ``set_to_none=False``, steps the optimizers
            through ``scaler.step`` (or directly) and ends with ``scaler.update()``;
            gradient accumulation loops over micro-batches inside it.
        example_inputs: a tuple (pytree) of inputs as calls pass them, tensors on the
            step's device. They fix the step's one input signature. Checked, not trained on.
        optimizers: every optimizer the body steps: mixprec's, or torch's with
            ``capturable=True`` (and ``fused=True`` with a scaler): :func:`check_optimizers`.
        scaler: the :class:`mixprec.GradScaler` the body uses, or None. ``stats()`` counts
            replays; ``found_inf()`` answers for the last replay.
        schedulers: LR schedulers of these optimizers (optional): the checked call refuses
            a body that steps one.
        modules: the models the body runs (optional): their buffers are persistent
            tensors, their ``training`` flags are baked in, their loads are followed.
        warmup: eager calls before the checked one (on a side stream).
        clone_outputs: return clones of the static outputs (default) or the static
            tensors themselves (overwritten by the next replay).
        pool: a memory pool to share with other graphs (``torch.cuda.graph_pool_handle()``
            or another step's :attr:`CapturedStep.pool`); by default a new one.

    Returns:
        A :class:`CapturedStep`. On CPU it runs every call eagerly after the same checks.

    Raises:
        CaptureError: here, an optimizer, a distributed setup or an enclosing autocast cache
            that cannot be captured; from a call, a sync, a storage change or host state
            changed by the body (the checked call), inputs of another signature or a change
            of what the graph bakes in (any call).
    """
    if not isinstance(warmup, int) or isinstance(warmup, bool):
        raise TypeError(f"mixprec.capture: warmup must be an int, got "
                        f"{type(warmup).__name__} {warmup!r}")
    if warmup < 0:
        raise ValueError(f"mixprec.capture: warmup must be >= 0, got {warmup}")
    for name, value, kind in (("optimizers", optimizers, torch.optim.Optimizer),
                              ("modules", modules, torch.nn.Module),
                              ("schedulers", schedulers, torch.optim.lr_scheduler.LRScheduler)):
        if isinstance(value, kind) or not isinstance(value, Iterable):
            raise TypeError(f"mixprec.capture: {name} must be a list (e.g. {name}=[x]), got "
                            f"a {type(value).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError("mixprec.capture: example_inputs must be a tuple of the step's "
                        f"positional arguments, got {type(example_inputs).__name__}")
    optimizers = list(optimizers)
    modules = list(modules)
    check_optimizers(optimizers, scaler)
    check_distributed(optimizers, scaler, modules)
    step = CapturedStep(step_fn, example_inputs, optimizers=optimizers, scaler=scaler,
                        modules=modules, schedulers=list(schedulers), warmup=warmup,
                        clone_outputs=clone_outputs, pool=pool)
    check_autocast(step.device.type)
    for leaf in pytree.tree_leaves(example_inputs):
        if isinstance(leaf, Tensor) and leaf.device != step.device:
            raise CaptureError(f"mixprec.capture: an example input is on {leaf.device}, the "
                               f"params on {step.device}; inputs are copied into static "
                               "buffers on the step's device")
    return step
