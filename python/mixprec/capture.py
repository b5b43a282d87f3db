"""One CUDA graph per training step: :func:`capture_step`.

A layer above :mod:`mixprec.optim` and :mod:`mixprec.amp`, below :mod:`mixprec.train`.
The user hands over their step body as it is written::

    def train_step(x, y):
        opt.zero_grad(set_to_none=False)         # grads keep their storage
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.clip_grad_norm_(opt, 1.0)
        scaler.step(opt)
        scaler.update()
        return loss

    step = mixprec.capture.capture_step(train_step, (x0, y0), optimizers=[opt],
                                        scaler=scaler, modules=[model])
    for x, y in data:
        loss = step(x, y)          # a device tensor; no host sync
        sched.step()               # a torch LR scheduler, between calls, as usual

Per input signature, the first ``warmup`` calls run the body eagerly on a side stream,
the next one runs it eagerly under the checks (:class:`SyncDetector`; every persistent
tensor keeps its storage; the body changes no host state; the scaler's iteration is
closed), and the next one captures it into a :class:`torch.cuda.CUDAGraph` (one memory
pool for all) and replays it; later calls copy their inputs into static buffers and
replay. :meth:`CapturedStep.prepare` runs before every call: the lr tensors are filled
from the host lr, replaced state (a checkpoint load) is copied into the captured
storages, and a change of what a graph baked in drops every graph (logged). On CPU the
same checks and ``prepare`` run, and every call is eager. The guide: docs/capture.md.

Host syncs: none per call once captured. Capturing synchronizes the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import traceback
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _dtensor
from .amp.capability import ATTRIBUTES, HOST, LEGACY, SCALARS, step_kind

__all__ = [
    "CaptureError",
    "CapturedStep",
    "SyncDetector",
    "SyncEvent",
    "SYNC_OPS",
    "capture_step",
    "check_optimizers",
    "check_distributed",
    "check_autocast",
    "persistent_tensors",
]

log = logging.getLogger("mixprec.capture")

_OUR_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class CaptureError(RuntimeError):
    """A step cannot be captured as it is written; the message names the cause and the fix."""


# --------------------------------------------------------------------------- detector

#: Ops that read a device value on the host (a sync on CUDA; during capture an error, or
#: a value baked into the graph), by ``OpOverloadPacket`` name. Ops returning a Python
#: number or bool are counted too, whatever their name; so are boolean-mask indexing and
#: device-to-host copies (see :meth:`SyncDetector.why`).
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal",
    "aten::allclose", "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere",
    "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
    "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::bincount", "aten::histc", "aten::repeat_interleave", "aten::tolist",
    "aten::_assert_async", "aten::is_set_to",
})


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

    Counted (:meth:`why`): the ops of :data:`SYNC_OPS`; any other op that returns a
    Python float or bool (a value read back to the host; an int is a size the op knows on
    the host, as cuDNN attention's max sequence lengths); indexing with a boolean mask
    (``aten::index``/``index_put_`` with a bool index: a ``nonzero`` on CUDA); a copy from
    a non-CPU tensor into a CPU one. On CPU, kernels reading CPU tensors are not syncs
    (no dispatcher op is seen); the detector counts the ops that would sync on CUDA, on
    any device, so a CPU run proves the CUDA step sync-free. ``.item()`` of a CPU tensor
    is counted too: under capture it bakes the value into the graph.

    Args:
        raise_on_sync: raise :class:`CaptureError` at the first one (naming the op and
            the user's line) instead of counting.

    Attributes:
        events: the :class:`SyncEvent` seen, in order. ``count``: their number.
    """

    def __init__(self, raise_on_sync: bool = False) -> None:
        super().__init__()
        self.raise_on_sync = raise_on_sync
        self.events: List[SyncEvent] = []

    @property
    def count(self) -> int:
        return len(self.events)

    @staticmethod
    def why(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], out: Any) -> Optional[str]:
        """Why the call ``func(*args, **kwargs) -> out`` syncs, or None."""
        name = func.name().split(".")[0]  # "aten::add.Tensor" -> "aten::add"
        if name in SYNC_OPS:
            return "reads a device value on the host"
        if name in ("aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            for t in indices or ():
                if isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8):
                    return "boolean-mask indexing (a nonzero on the device)"
        if name in ("aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::to"):
            src = args[1] if name in ("aten::copy_", "aten::_copy_from") else args[0]
            dst = args[0] if name == "aten::copy_" else out
            if (isinstance(src, Tensor) and isinstance(dst, Tensor)
                    and src.device.type not in ("cpu", "meta") and dst.device.type == "cpu"):
                return "copies a device tensor to the host"
        for leaf in pytree.tree_leaves(out):
            # (an int is a size or a count the op knows on the host -- cuDNN attention
            # returns its max sequence lengths so -- not a device read; a bool or a float
            # from an op not listed above is)
            if isinstance(leaf, (bool, float, complex)) and not isinstance(leaf, Tensor):
                return f"returns a Python {type(leaf).__name__}"
        return None

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        reason = self.why(func, args, kwargs, out)
        if reason is not None:
            event = SyncEvent(str(func), reason, _user_frame())
            self.events.append(event)
            if self.raise_on_sync:
                raise CaptureError(
                    f"mixprec.capture: the step syncs with the host: {event}. A CUDA graph "
                    "cannot capture a host read (capture fails, or the value read at capture "
                    "would be replayed forever). Keep the value on the device (e.g. return "
                    "the loss tensor, log it after the step; use scaler.found_inf() instead "
                    "of step_was_skipped)."
                )
        return out


# --------------------------------------------------------------------------- checks

def check_optimizers(optimizers: Sequence[torch.optim.Optimizer], scaler: Any) -> None:
    """Refuse optimizers whose step cannot be captured. :class:`CaptureError` naming the
    optimizer and the reason.

    * mixprec's (``_step_takes_scalars``): accepted; lr, step counts and the scaler's
      scalars are device tensors.
    * others: every param group must have ``capturable=True`` (torch keeps step counts
      on the device then); with an enabled scaler, the optimizer must also skip its own
      step on the device (``_step_supports_amp_scaling``, torch's ``fused=True``), since
      otherwise ``scaler.step`` reads ``found_inf`` on the host; torch's deprecated
      ``grad_scaler`` protocol is refused.
    """
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
        assert kind in (HOST, ATTRIBUTES)


def check_distributed(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                      modules: Sequence[torch.nn.Module]) -> None:
    """Refuse what is not supported under capture: FSDP2 (DTensor params), a scaler with
    a ``process_group``, DDP-wrapped modules, a multi-rank process group. See
    ``docs/capture.md``."""
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
    """Refuse an autocast region with its weight-cast cache open around the step: the
    cache would keep tensors of the graph's pool across replays (torch's
    ``make_graphed_callables`` refuses it too). The step body's own ``torch.autocast``
    is fine: its cache closes inside the captured region."""
    enabled = torch.is_autocast_enabled(device_type)
    if enabled and torch.is_autocast_cache_enabled():
        raise CaptureError(
            f"mixprec.capture: called inside an enabled torch.autocast({device_type!r}) region "
            "with its cache enabled: the cast weights it caches would outlive the graph. "
            "Put the autocast inside the step body, or use cache_enabled=False.")


# --------------------------------------------------------------------------- bindings

@dataclasses.dataclass
class _Slot:
    """One persistent tensor of the step: where it lives (``get``/``put``) and the tensor
    the captured kernels use."""

    name: str
    get: Callable[[], Optional[Tensor]]
    put: Optional[Callable[[Tensor], None]]  # None: cannot be re-bound (a param)
    tensor: Tensor
    ptr: int
    #: for mixprec's lr tensor of a float lr: (optimizer index, group index)
    lr_key: Optional[Tuple[int, int]] = None


def _slot(name: str, get: Callable[[], Optional[Tensor]],
          put: Optional[Callable[[Tensor], None]] = None,
          lr_key: Optional[Tuple[int, int]] = None) -> _Slot:
    t = get()
    assert t is not None
    return _Slot(name, get, put, t, t.data_ptr(), lr_key)


def _entry(owner: Callable[[], Any], key: Any) -> Tuple[Callable[[], Optional[Tensor]],
                                                        Callable[[Tensor], None]]:
    """``get``/``put`` of ``owner()[key]``, the owner looked up afresh at every use
    (``load_state_dict`` builds new state and group dicts)."""
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
    """The lr tensor the kernels of ``opt``'s group ``i`` read: the group's own tensor lr
    (re-bindable), mixprec's device tensor for a float lr, or None (a float lr of a torch
    optimizer: part of what a graph bakes in)."""
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
    """Every tensor a step keeps across steps, named: params, grads, optimizer state
    (moments, masters, 8-bit codes and block maxima, step counts), the lr tensors, the
    scaler's scale, growth tracker and hysteresis counter, and the modules' buffers.
    Read-only (no op runs)."""
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
        for name in ("_scale", "_growth_tracker", "_hysteresis_left"):
            if isinstance(getattr(scaler, name, None), Tensor):
                slots.append(_slot(f"scaler.{name}", *_attr(scaler, name)))
    for m, module in enumerate(modules):
        for mod_name, sub in module.named_modules():
            for b_name, _ in sub.named_buffers(recurse=False):
                where = f"modules[{m}].{mod_name}.{b_name}".replace("..", ".")
                slots.append(_slot(where, *_attr(sub, b_name)))
    return slots


def _host_fingerprint(optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                      modules: Sequence[torch.nn.Module]) -> Tuple[Any, ...]:
    """What a graph bakes in from the host: every param-group option but the params and a
    mixprec optimizer's lr (which reaches the graph as a device tensor), the params'
    identities, the scaler's rule and the modules' ``training`` flags. No op runs."""
    out: List[Any] = []
    for opt in optimizers:
        device_lr = step_kind(opt) == SCALARS
        for group in opt.param_groups:
            items = []
            for key in sorted(group, key=str):
                value = group[key]
                if key == "params":
                    items.append((key, tuple(map(id, value))))
                elif key == "lr" and (device_lr or isinstance(value, Tensor)):
                    continue
                elif isinstance(value, Tensor):
                    items.append((key, id(value)))
                else:
                    items.append((key, repr(value)))
            out.append(tuple(items))
    if scaler is not None:
        rule = (scaler.get_growth_factor(), scaler.get_backoff_factor(),
                scaler.get_growth_interval(),
                *(getattr(scaler, k, None) for k in ("min_scale", "max_scale", "hysteresis"))
                ) if scaler.is_enabled() else ()
        out.append(("scaler", scaler.is_enabled(), *rule))
    for module in modules:
        out.append(tuple(sub.training for sub in module.modules()))
    return tuple(out)


def _describe_change(before: Tuple[Any, ...], after: Tuple[Any, ...]) -> str:
    for a, b in zip(before, after):
        if a != b:
            if isinstance(a, tuple) and isinstance(b, tuple):
                for x, y in zip(a, b):
                    if x != y:
                        return f"{x!r} -> {y!r}"
            return f"{a!r} -> {b!r}"
    return "the number of param groups or modules"


# --------------------------------------------------------------------------- the step

@dataclasses.dataclass
class _Graph:
    """One captured signature."""

    graph: Any  # torch.cuda.CUDAGraph
    static_inputs: List[Tensor]
    static_outputs: Any
    record: Any  # the scaler's IterationRecord of the captured update()


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

    Calls take the inputs as the example (same structure; tensor leaves of the captured
    shapes and dtypes are copied into static buffers; a new signature captures a new
    graph, up to ``max_graphs``). Returns the body's return value: on a replay, clones
    of the static outputs (device tensors; ``clone_outputs=False`` returns the static
    tensors themselves, overwritten by the next replay). No host sync per call once
    captured.

    Attributes:
        graphs: the captured graphs by signature. ``device``: where the step runs.
        mode: ``"cuda-graph"`` or ``"eager"`` (CPU: validation mode).
        eager_reasons: signature -> why it runs eagerly (``fallback="eager"``).
    """

    def __init__(self, fn: Callable[..., Any], example_inputs: Tuple[Any, ...], *,
                 optimizers: Sequence[torch.optim.Optimizer], scaler: Any,
                 modules: Sequence[torch.nn.Module], schedulers: Sequence[Any],
                 max_graphs: int, warmup: int,
                 fallback: str, clone_outputs: bool, pool: Any) -> None:
        self.fn = fn
        self.optimizers = list(optimizers)
        self.scaler = scaler
        self.modules = list(modules)
        self.schedulers = list(schedulers)
        self.max_graphs = int(max_graphs)
        self.warmup = int(warmup)
        self.fallback = fallback
        self.clone_outputs = clone_outputs
        self.device = _step_device(self.optimizers, example_inputs)
        self.mode = "cuda-graph" if self.device.type == "cuda" else "eager"
        self.graphs: Dict[Tuple[Any, ...], _Graph] = {}
        self.eager_reasons: Dict[Tuple[Any, ...], str] = {}
        self._calls: Dict[Tuple[Any, ...], int] = {}
        self._slots: Optional[List[_Slot]] = None
        self._fingerprint: Optional[Tuple[Any, ...]] = None
        self._pool = pool
        self._side: Any = None
        if self.mode == "eager":
            log.info("mixprec.capture: the step runs on %s: no CUDA graphs; every call runs "
                     "eagerly after the capture checks (validation mode)", self.device)

    # -- public ------------------------------------------------------------------

    def __call__(self, *inputs: Any) -> Any:
        check_autocast(self.device.type)
        leaves, spec = pytree.tree_flatten(inputs)
        key = _signature(leaves, spec)
        self.prepare()
        g = self.graphs.get(key)
        if g is not None:
            return self._replay(g, leaves)
        if key in self.eager_reasons:
            return self.fn(*inputs)
        n = self._calls.get(key, 0)
        if n == 0 and len(self._calls) >= self.max_graphs:
            self._fall_back(key, f"mixprec.capture: a new input signature would need graph "
                            f"{len(self._calls) + 1}, but max_graphs={self.max_graphs} (this "
                            f"signature: {key[1:]}). Pad or bucket the inputs, or raise "
                            "max_graphs")
            return self.fn(*inputs)
        self._calls[key] = n + 1
        if n < self.warmup:
            return self._eager(inputs)
        if n == self.warmup:
            out, problem = self._checked(inputs)
            if problem is not None:
                self._fall_back(key, problem)
            return out
        if self.mode == "eager":
            return self._eager(inputs)
        g = self._capture(key, inputs, leaves)
        return self._replay(g, leaves, copy=False)

    def prepare(self) -> None:
        """Make the captured state current; run before every call (no host sync).

        * a change of what the graphs baked in (hyperparameters but lr, the scaler's
          rule, ``training`` flags, param storages) drops every graph (logged);
        * a persistent tensor that was replaced (``load_state_dict``, grads set to None)
          is copied into the captured storage and re-bound (``copy_``, in place);
        * each group's host lr is written into the lr tensor the kernels read, when it
          changed (``fill_``; a tensor lr that is not the captured one: ``copy_``).
        """
        if self._fingerprint is not None:
            now = _host_fingerprint(self.optimizers, self.scaler, self.modules)
            if now != self._fingerprint:
                self.reset(f"what the graphs baked in changed: "
                           f"{_describe_change(self._fingerprint, now)}")
                return
        if self._slots is not None:
            for s in self._slots:
                cur = s.get()
                if cur is s.tensor:
                    if s.put is None and cur.data_ptr() != s.ptr:
                        self.reset(f"{s.name} moved to new storage")
                        return
                    continue
                if s.put is None:
                    self.reset(f"{s.name} was replaced")
                    return
                if cur is None or cur.shape != s.tensor.shape or cur.dtype != s.tensor.dtype \
                        or cur.device != s.tensor.device:
                    if cur is None and s.name.endswith(".grad"):
                        s.put(s.tensor)  # dropped outside the step: the body zeroes it
                        continue
                    self.reset(f"{s.name} changed shape, dtype or device")
                    return
                with torch.no_grad():
                    s.tensor.copy_(cur)  # e.g. optimizer.load_state_dict's new tensors
                s.put(s.tensor)
        self._fill_lr()

    def _fall_back(self, key: Tuple[Any, ...], reason: str) -> None:
        """Raise :class:`CaptureError`, or (``fallback="eager"``) run ``key`` eagerly from
        now on, logged."""
        if self.fallback != "eager":
            raise CaptureError(reason)
        self.eager_reasons[key] = reason
        log.warning("mixprec.capture: running this signature eagerly: %s", reason)

    def reset(self, reason: str) -> None:
        """Drop every graph and forget the checks: the next calls warm up and capture anew."""
        if self.graphs or self._slots is not None:
            log.warning("mixprec.capture: re-capturing: %s", reason)
        self.graphs.clear()
        self._calls.clear()
        self._slots = None
        self._fingerprint = None

    # -- phases ------------------------------------------------------------------

    def _stream_ctx(self) -> Any:
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return _side_stream(self._side)

    def _eager(self, inputs: Tuple[Any, ...]) -> Any:
        with self._stream_ctx():
            out = self.fn(*inputs)
        sc = self.scaler
        if sc is not None and sc.is_enabled() and sc.iteration_open():
            # (the next call would fail inside torch's scaler.step instead)
            raise CaptureError("mixprec.capture: the step leaves the scaler's iteration "
                               "open; end the step body with scaler.update()")
        return out

    def _checked(self, inputs: Tuple[Any, ...]) -> Tuple[Any, Optional[str]]:
        """One eager step under every check, run to its end (a real step, as eager
        training would run it): ``(outputs, None)``, the slots and the host fingerprint
        taken for the capture; or ``(outputs, why it cannot be captured)``."""
        before = _collect_slots(self.optimizers, self.scaler, self.modules)
        host = _host_fingerprint(self.optimizers, self.scaler, self.modules)
        lrs = [[g["lr"] for g in o.param_groups] for o in self.optimizers]
        epochs = [getattr(sc, "last_epoch", None) for sc in self.schedulers]
        detector = SyncDetector()
        with self._stream_ctx(), detector:
            out = self.fn(*inputs)
        problem = self._problem(before, host, lrs, detector)
        for k, sc in enumerate(self.schedulers):
            if problem is None and getattr(sc, "last_epoch", None) != epochs[k]:
                problem = _scheduler_in_body(
                    f"schedulers[{k}] ({type(sc).__name__}), an LR scheduler stepped inside the "
                    "body")
        if problem is not None:
            return out, problem
        self._slots = _collect_slots(self.optimizers, self.scaler, self.modules)
        self._fingerprint = _host_fingerprint(self.optimizers, self.scaler, self.modules)
        return out, None

    def _problem(self, before: List[_Slot], host: Tuple[Any, ...], lrs: List[List[Any]],
                 detector: SyncDetector) -> Optional[str]:
        """The first reason the step just run cannot be replayed, or None."""
        if detector.events:
            e = detector.events[0]
            return (f"mixprec.capture: the step syncs with the host ({detector.count} op(s)); "
                    f"first: {e}. A CUDA graph cannot capture a host read (capture fails, or "
                    "the value read at capture is replayed forever). Keep values on the "
                    "device: return the loss tensor, use scaler.found_inf() instead of "
                    "step_was_skipped, no .item()/bool()/print of a tensor in the step.")
        after = {s.name: s for s in _collect_slots(self.optimizers, self.scaler, self.modules)}
        for s in before:
            now = after.get(s.name)
            grad = s.name.endswith(".grad")
            if now is None:
                hint = (" (zero_grad(set_to_none=True) in the step? use set_to_none=False: "
                        "the grads must keep their storage)") if grad else ""
                return f"mixprec.capture: the step drops {s.name}{hint}"
            if now.tensor is not s.tensor or now.ptr != s.ptr:
                hint = (" (zero_grad(set_to_none=True) in the step? use set_to_none=False)"
                        if grad else " (a tensor rebuilt instead of updated in place)")
                return (f"mixprec.capture: the step changes the storage of {s.name}{hint}; "
                        "a replay would keep writing the old storage")
        for o, opt in enumerate(self.optimizers):
            for i, group in enumerate(opt.param_groups):
                old = lrs[o][i] if i < len(lrs[o]) else None
                if group["lr"] is not old and group["lr"] != old:
                    return _scheduler_in_body(f"optimizers[{o}].param_groups[{i}]['lr'] (an "
                                              "LR scheduler stepped inside the body?)")
        now_host = _host_fingerprint(self.optimizers, self.scaler, self.modules)
        if now_host != host:
            return (f"mixprec.capture: the step changes host state a replay would not "
                    f"change: {_describe_change(host, now_host)}")
        sc = self.scaler
        if sc is not None and sc.is_enabled():
            if sc.iteration_open():
                return ("mixprec.capture: the step leaves the scaler's iteration open; end "
                        "the step body with scaler.update()")
            if sc._mp_last is None:
                return "mixprec.capture: the scaler passed as scaler= is not updated by the step"
        return None

    def _capture(self, key: Tuple[Any, ...], inputs: Tuple[Any, ...], leaves: List[Any]) -> _Graph:
        static = [x.detach().clone() if isinstance(x, Tensor) else x for x in leaves]
        static_inputs = pytree.tree_unflatten(static, pytree.tree_flatten(inputs)[1])
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.fn(*static_inputs)
        except CaptureError:
            raise
        except RuntimeError as e:
            raise CaptureError(f"mixprec.capture: CUDA graph capture of the step failed: {e}"
                               ) from e
        record = getattr(self.scaler, "_mp_last", None) if self.scaler is not None else None
        out = pytree.tree_map_only(Tensor, lambda t: t.detach(), out)  # free the autograd graph
        g = _Graph(graph, [x for x in static if isinstance(x, Tensor)], out, record)
        self.graphs[key] = g
        log.info("mixprec.capture: captured graph %d for %s", len(self.graphs), key[1:])
        return g

    def _replay(self, g: _Graph, leaves: List[Any], copy: bool = True) -> Any:
        if copy:
            new = [x for x in leaves if isinstance(x, Tensor)]
            for dst, src in zip(g.static_inputs, new):
                if dst is not src:
                    dst.copy_(src, non_blocking=True)
        g.graph.replay()
        if g.record is not None:
            g.record.skipped = None  # the flags in it were rewritten by this replay
            self.scaler._mp_last = g.record
        if not self.clone_outputs:
            return g.static_outputs
        return pytree.tree_map_only(Tensor, lambda t: t.clone(), g.static_outputs)

    def _fill_lr(self) -> None:
        """Bring each captured lr tensor of mixprec's up to date with its group's lr
        (:meth:`mixprec.optim.FusedOptimizer.lr_tensor`: ``fill_`` when it changed; a
        tensor lr the kernels do not read in place is copied in). No sync."""
        for s in self._slots or ():
            if s.lr_key is None:
                continue
            o, i = s.lr_key
            opt = self.optimizers[o]
            if i < len(opt.param_groups):
                with torch.no_grad():
                    t = opt.lr_tensor(i, s.tensor.device)  # type: ignore[attr-defined]
                    if t is not s.tensor:
                        s.tensor.copy_(t.reshape(()), non_blocking=True)


def _scheduler_in_body(what: str) -> str:
    return (f"mixprec.capture: the step changes {what}: host code a replay does not run. "
            "Step schedulers outside the body, between calls: the lr reaches the graph as "
            "a device tensor filled before each replay")


@contextlib.contextmanager
def _side_stream(stream: Any) -> Iterator[None]:
    """Run a block on ``stream`` after the current stream's work; the current stream
    waits for it afterwards (torch's warm-up recipe for capture)."""
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield
    current.wait_stream(stream)


def _step_device(optimizers: Sequence[torch.optim.Optimizer],
                 example_inputs: Tuple[Any, ...]) -> torch.device:
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                return p.device
    for leaf in pytree.tree_leaves(example_inputs):
        if isinstance(leaf, Tensor):
            return leaf.device
    return torch.device("cpu")


def capture_step(
    step_fn: Callable[..., Any],
    example_inputs: Tuple[Any, ...],
    *,
    optimizers: Iterable[torch.optim.Optimizer],
    scaler: Any = None,
    modules: Iterable[torch.nn.Module] = (),
    schedulers: Iterable[Any] = (),
    max_graphs: int = 4,
    warmup: int = 2,
    fallback: str = "error",
    clone_outputs: bool = True,
    pool: Any = None,
) -> CapturedStep:
    """Capture a training step, written as for eager training, into CUDA graphs.

    Args:
        step_fn: the step body, ``step_fn(*inputs) -> outputs`` (a tensor, a pytree of
            tensors, or None). It must zero grads with ``set_to_none=False``, step the
            optimizers through ``scaler.step`` (or directly, without a scaler) and end
            with ``scaler.update()``. Gradient accumulation: loop over the micro-batches
            inside the body (one graph holds the whole step).
        example_inputs: a tuple (pytree) of inputs as the calls will pass them: tensors on
            the step's device and plain values. Checked here; not trained on (the calls
            are).
        optimizers: every optimizer the body steps. mixprec's (lr as a device tensor);
            others need ``capturable=True`` and, with a scaler, ``fused=True``
            (:func:`check_optimizers`).
        scaler: the :class:`mixprec.GradScaler` the body uses, or None. Its statistics
            are counted on the device (``scaler.stats()`` counts replays);
            ``found_inf()`` answers for the last replay.
        schedulers: LR schedulers of these optimizers (optional): the checked call
            refuses a body that steps one (host code a replay does not run; an lr
            change is caught without them too, but only when it happens at that call).
        modules: the models the body runs (optional): their buffers are persistent
            tensors (checked, re-bound after a load) and their ``training`` flags are part
            of what a graph bakes in. DDP-wrapped modules are refused.
        max_graphs: the most graphs (input signatures) kept; one more raises
            :class:`CaptureError` (or, ``fallback="eager"``, runs eagerly, logged).
        warmup: eager calls per signature before the checked one (on a side stream).
        fallback: ``"error"`` (default) or ``"eager"``: what a failed check or one graph
            too many does.
        clone_outputs: return clones of the static outputs (default) or the static
            tensors themselves (overwritten by the next replay).
        pool: a memory pool (``torch.cuda.graph_pool_handle()``) to share with other
            graphs; by default one new pool, shared by this step's graphs.

    Returns:
        A :class:`CapturedStep`. On CPU it runs every call eagerly after the same checks.

    Raises:
        CaptureError: an optimizer, a distributed setup or an enclosing autocast cache
            that cannot be captured (here, before anything runs); later, from a call, a
            sync, a storage change or host state changed by the body (the checked call).
    """
    if fallback not in ("error", "eager"):
        raise ValueError(f"mixprec.capture: fallback must be 'error' or 'eager', got {fallback!r}")
    for name, value, low in (("max_graphs", max_graphs, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"mixprec.capture: {name} must be an int, got "
                            f"{type(value).__name__} {value!r}")
        if value < low:
            raise ValueError(f"mixprec.capture: {name} must be >= {low}, got {value}")
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
                        modules=modules, schedulers=list(schedulers),
                        max_graphs=max_graphs, warmup=warmup,
                        fallback=fallback, clone_outputs=clone_outputs, pool=pool)
    check_autocast(step.device.type)
    for leaf in pytree.tree_leaves(example_inputs):
        if isinstance(leaf, Tensor) and leaf.device != step.device:
            raise CaptureError(f"mixprec.capture: an example input is on {leaf.device}, the "
                               f"params on {step.device}; inputs are copied into static "
                               "buffers on the step's device")
    return step
