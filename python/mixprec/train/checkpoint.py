"""The trainer's checkpoints: the format, its checks, save/load (a file, or a DCP directory
for a sharded model), periodic checkpoints with rotation, and resuming a ``train()`` call
mid-epoch. :class:`CheckpointMixin` gives :class:`~mixprec.MixedPrecisionTrainer` its
``save_state``/``load_state``; how the bytes reach the disk whole is :mod:`._files`.

The checkpoint (:meth:`~CheckpointMixin.save_state`) is one ``torch.save`` of tensors and
plain values (``torch.load(path, weights_only=True)`` reads it), format :data:`STATE_FORMAT`::

    format        2 (1: mixprec 0.1.0, which had no ``loop``; still loads)
    model         model.state_dict()
    optimizer     optimizer.state_dict() (with the float32 masters in MANUAL mode)
    scaler        scaler.state_dict() ({} when disabled)
    scheduler     scheduler.state_dict() or None
    config        MixedPrecisionConfig.to_dict()
    counters      optimizer_steps, micro_steps, epochs_done, micro (micro-batches of an
                  unfinished accumulation), log_step, scaler_steps, scale_increases,
                  scale_decreases, peak_memory
    totals, log_snapshot, history, history_steps
                  the per-step metrics (see mixprec.train.metrics.MetricsLog)
    adaptive      decisions, overrides, root_precision (+ fwd_counts, bwd_counts in ADAPTIVE)
    rng           cpu: torch.get_rng_state(); cuda: every device's, or []
    pending_loss  the summed loss of an unfinished accumulation, or None
    pending_grads the grads of an unfinished accumulation (param order), or None
    loop          where a ``train()`` call stood (:class:`TrainRun`), or None

Every file written since format 1 was introduced loads (``tests/data/trainer_*.pt``).
"""

from __future__ import annotations

import copy
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from .. import _dtensor
from ..optim import check_checkpoint
from ..optim.torch_rules import check_torch_state_dict
from . import _files
from ._files import IncompleteCheckpointError
from .manager import MixedPrecisionManager, check_plan
from .metrics import MetricsLog, has_data

__all__ = ["CheckpointMixin", "IncompleteCheckpointError", "STATE_FORMAT", "TrainRun",
           "latest_checkpoint"]

#: The version of the checkpoint layout (the dict's ``"format"``).
STATE_FORMAT = 2
#: The file of a sharded checkpoint's directory that holds all but the model and optimizer.
_REST_FILE = "trainer.pt"
_LOAD = "MixedPrecisionTrainer.load_state"
_WHERE = f"{_LOAD}: state"
#: The keys of a checkpoint besides ``model``, ``optimizer`` and ``pending_grads``.
_STATE_KEYS = ("format", "scaler", "scheduler", "config", "counters", "totals",
               "log_snapshot", "history", "history_steps", "adaptive", "rng", "pending_loss",
               "loop")
_LOOP_KEYS = ("first_epoch", "epochs", "epoch", "batches", "epoch_rng", "epoch_steps",
              "epoch_totals", "results", "loader")
_COUNTERS = ("optimizer_steps", "micro_steps", "epochs_done", "micro", "log_step",
             "scaler_steps", "scale_increases", "scale_decreases", "peak_memory")


def _within(key: str, check: Callable[[], None]) -> None:
    """Run the check of the checkpoint's ``key`` entry; its error says where it is."""
    try:
        check()
    except (TypeError, ValueError, KeyError) as e:
        raise type(e)(f"{_WHERE}[{key!r}]: {e}") from e


def _check_keys(where: str, saved: Any, expected: Iterable[Any]) -> None:
    """``saved`` is a dict with exactly the keys of ``expected``."""
    if not isinstance(saved, dict):
        raise TypeError(f"{where} must be a dict, got {type(saved).__name__}")
    missing = sorted(map(str, set(expected) - set(saved)))
    extra = sorted(map(str, set(saved) - set(expected)))
    if missing or extra:
        raise ValueError(f"{where}: missing keys {missing}, unexpected keys {extra} (the "
                         "state of another kind of object?)")


def _check_model_state(model: nn.Module, saved: Any) -> None:
    """``saved`` has the keys of ``model.state_dict()``, each a tensor of the same shape
    and dtype (a checkpoint of another precision setup has other dtypes)."""
    where = f"{_WHERE}['model']"
    mine = model.state_dict()
    _check_keys(where, saved, mine)
    for k, t in mine.items():
        v = saved[k]
        if not isinstance(v, Tensor):
            raise TypeError(f"{where}[{k!r}]: expected a tensor, got {type(v).__name__}")
        if tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype:
            raise ValueError(
                f"{where}[{k!r}]: expected {t.dtype} of shape {list(t.shape)} (this model's), "
                f"got {v.dtype} of shape {list(v.shape)} (a checkpoint of another model, or "
                "of another mode/precision: MANUAL keeps 16-bit params, the others float32)")
        if v.is_meta and not t.is_meta:
            raise ValueError(f"{where}[{k!r}]: a tensor on 'meta' has no data to load")


def _check_optimizer_state(opt: Any, saved: Any) -> None:
    """mixprec's optimizers and torch's SGD/Adam/AdamW check themselves; another torch
    optimizer: the layout torch's ``load_state_dict`` would refuse after replacing things."""
    check = getattr(opt, "check_state_dict", None)
    if check is not None:
        return check(saved)
    if check_torch_state_dict(opt, saved):
        return
    where = f"{_WHERE}['optimizer']"
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
            and isinstance(saved.get("param_groups"), list)):
        raise ValueError(f"{where}: expected a dict with 'state' (a dict) and 'param_groups' "
                         "(a list)")
    groups = saved["param_groups"]
    if len(groups) != len(opt.param_groups) or any(
            not isinstance(g, dict) or len(g.get("params", ())) != len(m["params"])
            for g, m in zip(groups, opt.param_groups)):
        raise ValueError(f"{where}: its param groups do not match this optimizer's (number of "
                         "groups or of params per group)")
    ids = {i for g in groups for i in g["params"]}
    for key, st in saved["state"].items():
        if isinstance(key, int) and key not in ids:
            raise ValueError(f"{where}['state'][{key}]: no param has this id")
        if key in ids and not isinstance(st, dict):
            raise TypeError(f"{where}['state'][{key}]: expected a dict")


def _check_counters(c: Any) -> None:
    where = f"{_WHERE}['counters']"
    _check_keys(where, c, _COUNTERS)
    for k in _COUNTERS:
        if not isinstance(c[k], int) or isinstance(c[k], bool) or c[k] < 0:
            raise ValueError(f"{where}[{k!r}]: expected an int >= 0, got {c[k]!r}")
    if c["log_step"] > c["optimizer_steps"]:
        raise ValueError(f"{where}['log_step'] = {c['log_step']} is past "
                         f"optimizer_steps = {c['optimizer_steps']}")


def _check_pending(state: dict[str, Any], params: list[Tensor]) -> None:
    """``rng``, ``pending_loss`` and ``pending_grads`` (``None``: not in ``state``)."""
    rng, cpu_rng = state["rng"], torch.get_rng_state()
    if not (isinstance(rng, dict) and has_data(rng.get("cpu"), cpu_rng.shape, torch.uint8)
            and isinstance(rng.get("cuda"), (list, tuple))):
        raise ValueError(f"{_WHERE}['rng'] must be {{'cpu': a uint8 tensor of shape "
                         f"{list(cpu_rng.shape)}, 'cuda': a list}}")
    loss = state["pending_loss"]
    if loss is not None and not (has_data(loss, floating=True) and loss.numel() == 1):
        raise ValueError(f"{_WHERE}['pending_loss'] must be None or a one-element floating tensor")
    grads = state.get("pending_grads")
    if grads is not None and (not isinstance(grads, (list, tuple)) or len(grads) != len(params)):
        raise ValueError(f"{_WHERE}['pending_grads'] must be None or a list of "
                         f"{len(params)} grads (one per param)")
    for i, (g, p) in enumerate(zip(grads or (), params)):
        if g is not None and not has_data(g, p.shape, floating=True):
            raise ValueError(f"{_WHERE}['pending_grads'][{i}] must be None or a "
                             f"floating tensor of shape {list(p.shape)}")
    micro = state["counters"]["micro"]
    if (micro > 0) != (loss is not None):
        raise ValueError(f"{_WHERE}['pending_loss'] must be given exactly when "
                         f"counters['micro'] > 0 (it is {micro})")



def _check_loop(loop: Any) -> None:
    """The ``loop`` entry: ``None`` or where a ``train()`` call stood (:class:`TrainRun`)."""
    where = f"{_WHERE}['loop']"
    if loop is None:
        return
    _check_keys(where, loop, _LOOP_KEYS)
    for k in ("first_epoch", "epochs", "epoch", "batches", "epoch_steps"):
        if not isinstance(loop[k], int) or isinstance(loop[k], bool) or loop[k] < 0:
            raise ValueError(f"{where}[{k!r}]: expected an int >= 0, got {loop[k]!r}")
    rng = loop["epoch_rng"]
    if not (isinstance(rng, dict) and has_data(rng.get("cpu"), dtype=torch.uint8)
            and isinstance(rng.get("cuda"), (list, tuple))):
        raise ValueError(f"{where}['epoch_rng'] must be {{'cpu': a uint8 tensor, 'cuda': a list}}")
    if not isinstance(loop["results"], list) or not all(isinstance(r, dict)
                                                        for r in loop["results"]):
        raise ValueError(f"{where}['results'] must be a list of dicts")
    if loop["loader"] is not None and not isinstance(loop["loader"], dict):
        raise ValueError(f"{where}['loader'] must be None or a loader's state_dict()")


class CheckpointMixin:
    """``save_state``/``load_state`` of :class:`~mixprec.MixedPrecisionTrainer` (its
    attributes are read here; the class is not used on its own)."""

    model: Optional[nn.Module]
    optimizer: Any
    config: Any
    optimizer_steps: int
    micro_steps: int
    epochs_done: int
    peak_memory: int
    _micro: int
    _metrics: MetricsLog
    _scheduler: Any
    _scaler_offsets: list[int]
    _step_loss: Optional[Tensor]
    _measure_activations: bool
    #: the ``loop`` entry of the checkpoint :meth:`load_state` read last (None: none)
    _loaded_loop: Optional[dict[str, Any]] = None
    #: the ``loop`` entry the next save writes (set by a ``train()`` call while it runs)
    _loop_state: Optional[Callable[[], dict[str, Any]]] = None

    _manager: Callable[[], MixedPrecisionManager]
    _params: Callable[[], list[Tensor]]
    _reset_counters: Callable[[], None]
    scheduler: Any

    def _sharded(self) -> bool:
        return self.model is not None and _dtensor.any_dtensor(self.model.parameters())

    def _state_rest(self) -> dict[str, Any]:
        """Everything of the checkpoint but the model's and the optimizer's state."""
        manager = self._manager()
        scaler_state, sst = manager.scaler.state_dict_and_stats()  # one host read
        offsets = self._scaler_offsets
        return {
            "format": STATE_FORMAT, "scaler": scaler_state,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "config": self.config.to_dict(), "counters": {
                "optimizer_steps": self.optimizer_steps, "micro_steps": self.micro_steps,
                "epochs_done": self.epochs_done, "micro": self._micro,
                "log_step": self._metrics.log_step, "scaler_steps": sst.steps + offsets[0],
                "scale_increases": sst.scale_increases + offsets[1],
                "scale_decreases": sst.scale_decreases + offsets[2],
                "peak_memory": self.peak_memory},
            **self._metrics.state(), "adaptive": manager.plan_state(),
            "rng": {"cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            "pending_loss": None if self._step_loss is None else self._step_loss.cpu(),
            "loop": None if self._loop_state is None else self._loop_state(),
        }

    def save_state(self, path: Union[str, os.PathLike[str]]) -> None:
        """Save everything needed to resume bitwise: model, optimizer (with masters), scaler,
        scheduler, counters, statistics/history, config, ADAPTIVE plan, RNG states and the grads
        of an unfinished accumulation. One host sync.

        Atomic: ``path`` holds the previous checkpoint or this one, whole, whenever the
        process dies (:mod:`mixprec.train._files`). An unsharded model: one file, written
        beside ``path``, flushed, fsync-ed and renamed onto it (``torch.load(path,
        weights_only=True)`` reads it; layout in :mod:`mixprec.train.checkpoint`). A sharded
        model (FSDP2): ``path`` is a directory, a ``torch.distributed.checkpoint`` (DCP)
        checkpoint of the model's and the optimizer's state (``get_state_dict``, each rank
        writing its shards) plus ``trainer.pt``, the rest, and the marker ``COMPLETE``, written
        by rank 0 last, under a new name renamed to ``path`` once every rank has finished;
        every rank calls it, and :meth:`load_state` reads it on any world size and sharding. It
        cannot hold an unfinished accumulation (``RuntimeError``: :meth:`flush` first).
        """
        self._manager()
        assert self.model is not None
        if self._sharded():
            return self._save_sharded(os.fspath(path))
        state = self._state_rest()
        state["model"] = self.model.state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        state["pending_grads"] = [None if p.grad is None else p.grad.detach().cpu()
                                  for p in self._params()] if self._micro else None
        _files.save_file(state, os.fspath(path))
        for stale in _files.leftovers(os.fspath(path)):  # (of saves killed before this one)
            _files.remove(stale)

    def _save_sharded(self, path: str) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._micro:
            raise RuntimeError(
                "MixedPrecisionTrainer.save_state: a sharded model with an unfinished "
                f"gradient accumulation ({self._micro} micro-batches): call flush() first "
                "(a DCP checkpoint does not keep pending grads)")
        on = dist.is_initialized()
        rank0 = not on or dist.get_rank() == 0
        token = [secrets.token_hex(6) if rank0 else None]
        if on:
            dist.broadcast_object_list(token, src=0)  # (one name for every rank's files)
        partial = _files.partial_name(path, str(token[0]))
        rest = self._state_rest()  # (every rank: the scaler's state is the same on each)
        msd, osd = get_state_dict(self.model, self.optimizer)
        # returns on every rank once every rank's files are written (fsync-ed) and rank 0
        # wrote .metadata
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=partial)
        if rank0:
            _files.save_file(rest, os.path.join(partial, _REST_FILE))
            _files.write_marker(partial, {
                "format": STATE_FORMAT, "optimizer_steps": self.optimizer_steps,
                "world_size": dist.get_world_size() if on else 1})
            _files.commit_dir(partial, path, str(token[0]))
            for stale in _files.leftovers(path):
                _files.remove(stale)
        if on:
            dist.barrier()

    def load_state(self, path: Union[str, os.PathLike[str]], strict_config: bool = False) -> None:
        """Restore a :meth:`save_state` checkpoint after :meth:`setup_training` with the same
        model architecture and optimizer type: a file (``weights_only=True``), or the directory
        of a sharded model (DCP: any world size; every rank calls it).

        Everything is checked before anything changes: that the checkpoint is whole (a file
        cut short, a directory without its ``COMPLETE`` marker or missing a rank's files:
        :class:`IncompleteCheckpointError`, a ``ValueError``, naming the path and what is
        missing), the layout, the model's state (keys, shapes, dtypes: another precision
        setup's is refused), the optimizer's, the scaler's, the scheduler's keys, the counters,
        RNG states and pending grads; a bad checkpoint raises ``ValueError``/``TypeError``/
        ``KeyError`` naming the entry and changes nothing. A config that differs from the saved
        one warns (``UserWarning``; ``strict_config=True``: ``ValueError``; a field added since
        counts as saved at its default). A directory of mixprec 0.1.0 (no marker) loads when
        every file is there, with a ``FutureWarning``. Mutates model, optimizer, scaler,
        scheduler, counters and the global RNG states."""
        self._manager()
        where = os.fspath(path)
        if not os.path.exists(where):
            found = _files.stranded(where)
            if found is None:
                raise FileNotFoundError(f"{_LOAD}: no checkpoint at {where}")
            warnings.warn(f"{_LOAD}: {where} is missing: a save over it was cut short between "
                          f"its two renames; loading the finished copy it left, {found}",
                          UserWarning, stacklevel=2)
            where = found
        if os.path.isdir(where):
            return self._load_sharded(where, strict_config)
        state = _files.load_file(where, _LOAD)
        self._check_state(state, strict_config, where)
        self._apply(lambda: self._load(state))

    def _load_sharded(self, path: str, strict_config: bool) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not self._sharded():
            raise ValueError(f"{_LOAD}: {path} is a directory (the DCP checkpoint of a sharded "
                             "model); this trainer's model is not sharded: shard it as the saved "
                             "one was (fully_shard), any world size")
        _files.check_dir(path, _REST_FILE, _LOAD)
        rest = _files.load_file(os.path.join(path, _REST_FILE), _LOAD)
        self._check_state(rest, strict_config, path, tensors=False, stacklevel=4)
        msd, osd = get_state_dict(self.model, self.optimizer)
        state = {"model": msd, "optimizer": osd}
        check_checkpoint(state, path)  # (mixprec's words for a missing key or a wrong shape)
        dcp.load(state, checkpoint_id=path)

        def load() -> None:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
            self._load({**rest, "pending_grads": None})

        self._apply(load)

    def _check_state(self, state: Any, strict_config: bool, where: str,
                     tensors: bool = True, stacklevel: int = 3) -> None:
        """Every check of :meth:`load_state`, before anything changes (``tensors``: the
        model's and the optimizer's state are in ``state``). Format 1 (no ``loop``) is
        read as format 2 with ``loop=None``."""
        manager = self._manager()
        if not isinstance(state, dict):
            raise TypeError(f"{_LOAD}: {where} holds a {type(state).__name__}, not a checkpoint")
        if state.get("format") not in (1, STATE_FORMAT):
            raise ValueError(f"{_LOAD}: unknown format {state.get('format')!r} in {where}")
        if state["format"] == 1 and "loop" not in state:
            state["loop"] = None
        keys = set(_STATE_KEYS) | ({"model", "optimizer", "pending_grads"} if tensors else set())
        missing = sorted(keys - set(state))
        if missing:
            raise KeyError(f"{_LOAD}: {where} has no {missing} (not a complete checkpoint of "
                           f"MixedPrecisionTrainer.save_state)")
        extra = sorted(map(str, set(state) - keys))
        if extra:
            raise ValueError(f"{_LOAD}: unexpected keys {extra} in {where}")
        _check_loop(state["loop"])
        if not isinstance(state["config"], dict):
            raise TypeError(f"{_LOAD}: state['config'] must be a dict")
        mine, defaults = self.config.to_dict(), type(self.config)().to_dict()
        diff = sorted(k for k in mine if state["config"].get(k, defaults[k]) != mine[k])
        if diff and strict_config:
            raise ValueError(f"{_LOAD}: config differs from the saved one in {diff}")
        if tensors:
            assert self.model is not None
            _check_model_state(self.model, state["model"])
            _within("optimizer", lambda: _check_optimizer_state(self.optimizer,
                                                                state["optimizer"]))
        if state["scaler"]:
            _within("scaler", lambda: manager.scaler.check_state_dict(state["scaler"]))
        if self._scheduler is not None and state["scheduler"] is not None:
            _check_keys(f"{_WHERE}['scheduler']", state["scheduler"], self._scheduler.state_dict())
        _check_counters(state["counters"])
        check_plan(state["adaptive"], f"{_WHERE}['adaptive']")
        _check_pending(state, self._params())
        self._metrics.check_state(state, state["counters"]["optimizer_steps"])
        if diff:
            warnings.warn(f"{_LOAD}: config differs from the saved one in {diff}",
                          UserWarning, stacklevel=stacklevel)

    def _apply(self, load: Callable[[], None]) -> None:
        """Run ``load``; if it raises, put the optimizer, scaler, scheduler, manager, counters,
        grads and RNG states back. A safety net for a user's hook (the checks ran first); the
        model's weights are not copied (that would double its memory): its load comes first."""
        manager = self._manager()
        opt, scaler, sched = self.optimizer, manager.scaler, self._scheduler
        opt_state = (opt.state, opt.param_groups, [dict(g) for g in opt.param_groups])
        scaler_state = scaler.state_dict() if scaler.is_enabled() else None
        sched_state = copy.deepcopy(sched.state_dict()) if sched is not None else None
        plan, steps = manager.plan_state(), manager.steps
        mine = dict(self.__dict__)
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        grads = [p.grad for p in self._params()]
        try:
            load()
        except BaseException:
            opt.state, opt.param_groups = opt_state[0], opt_state[1]
            for g, saved in zip(opt.param_groups, opt_state[2]):
                g.clear()
                g.update(saved)
            if scaler_state is not None:
                scaler.load_state_dict(scaler_state)
            if sched_state is not None:
                sched.load_state_dict(sched_state)
            manager.load_plan_state(plan)
            manager.steps = steps
            self.__dict__.clear()
            self.__dict__.update(mine)
            torch.set_rng_state(rng)
            if cuda_rng:
                torch.cuda.set_rng_state_all(cuda_rng)
            for p, g in zip(self._params(), grads):
                p.grad = g
            raise

    def _load(self, state: dict[str, Any]) -> None:
        """Load a checked ``state`` (a sharded checkpoint's model and optimizer are not in it:
        set_state_dict loaded them)."""
        manager = self._manager()
        if "model" in state:
            assert self.model is not None
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            manager.scaler.load_state_dict(state["scaler"])
        if self._scheduler is not None and state["scheduler"] is not None:
            self._scheduler.load_state_dict(state["scheduler"])
        self._reset_counters()
        c = state["counters"]
        self.optimizer_steps, self.micro_steps = c["optimizer_steps"], c["micro_steps"]
        self.epochs_done, self._micro = c["epochs_done"], c["micro"]
        self._scaler_offsets = [c["scaler_steps"], c["scale_increases"], c["scale_decreases"]]
        self.peak_memory = c["peak_memory"]
        manager.steps = self.optimizer_steps
        self._metrics.restore(state, self.optimizer_steps, c["log_step"], manager.device)
        manager.load_plan_state(state["adaptive"])
        torch.set_rng_state(state["rng"]["cpu"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        for p, g in zip(self._params(), state["pending_grads"] or ()):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
        if state["pending_loss"] is not None:
            self._step_loss = state["pending_loss"].to(manager.device)
        self._measure_activations = False
        self._loaded_loop = state["loop"]

    def save_mixed_precision_state(self, path: Union[str, os.PathLike[str]]) -> None:
        """Alias of :meth:`save_state` (the name used by the system mixprec replaces)."""
        self.save_state(path)

    def load_mixed_precision_state(self, path: Union[str, os.PathLike[str]],
                                   strict_config: bool = False) -> None:
        """Alias of :meth:`load_state` (the name used by the system mixprec replaces)."""
        self.load_state(path, strict_config)


# -- periodic checkpoints and resuming a train() call ---------------------------------------
def latest_checkpoint(checkpoint_dir: Union[str, os.PathLike[str]]) -> Optional[str]:
    """The newest finished periodic checkpoint in ``checkpoint_dir`` (``step-N.pt`` files or
    ``step-N`` directories of ``MixedPrecisionTrainer.train``), or ``None``."""
    return _files.latest(os.fspath(checkpoint_dir))


def _rng_now() -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _stateful(loader: Any) -> bool:
    """A loader that checkpoints itself (torchdata's ``StatefulDataLoader``, or any object
    with ``state_dict``/``load_state_dict``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None))


class TrainRun:
    """One ``MixedPrecisionTrainer.train()`` call's checkpoints: every ``every`` optimizer
    steps and at the end, into ``directory`` (``step-N.pt``, or a ``step-N`` directory for a
    sharded model), the ``keep`` newest kept; with ``resume``, the call goes on from where
    the loaded checkpoint's call stood (the ``loop`` entry).

    A checkpoint is taken only at an optimizer-step boundary (never inside a gradient
    accumulation), so it holds no pending grads. Resuming mid-epoch: a loader with
    ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) is restored by
    its own state; another is iterated anew with the global RNG state the epoch began with
    (a shuffled ``DataLoader`` draws the same order) and the batches the epoch had consumed
    are skipped; then the RNG state of the checkpoint is put back."""

    def __init__(self, trainer: Any, num_epochs: int, directory: Optional[str],
                 every: Optional[int], keep: Optional[int],
                 resume: Union[bool, str, os.PathLike[str]]) -> None:
        where = "MixedPrecisionTrainer.train"
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"{where}: checkpoint_dir must be a path or None, got "
                            f"{type(directory).__name__}")
        for name, v in (("checkpoint_every", every), ("keep_checkpoints", keep)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{where}: {name} must be None or an int >= 1, got {v!r}")
        if not isinstance(resume, (bool, str, os.PathLike)):
            raise TypeError(f"{where}: resume must be a bool or a checkpoint's path, got "
                            f"{type(resume).__name__}")
        if directory is None and (every is not None or resume is True):
            raise ValueError(f"{where}: checkpoint_every and resume=True need checkpoint_dir")
        self.trainer, self.every, self.keep = trainer, every, keep
        self.directory = None if directory is None else os.fspath(directory)
        self.loop: Optional[dict[str, Any]] = None
        if resume is not False:
            path = (_files.latest(self.directory) if resume is True and self.directory
                    else None if resume is True else os.fspath(resume))
            if path is not None:
                trainer.load_state(path)
                self.loop = trainer._loaded_loop
        self.first = self.loop["first_epoch"] if self.loop else trainer.epochs_done
        self.end = self.first + num_epochs
        self.results: list[dict[str, Any]] = list(self.loop["results"]) if self.loop else []
        self._saved_at = trainer.optimizer_steps if self.loop else -1
        self._epoch: dict[str, Any] = {}
        self._loader: Any = None

    @property
    def saving(self) -> bool:
        return self.directory is not None

    def begin_epoch(self, loader: Iterable[Any]) -> tuple[Iterator[Any], Optional[Tensor], int,
                                                          int]:
        """The epoch's batches, its starting totals and steps, and the batches it had done."""
        t = self.trainer
        loop, self.loop = self.loop, None
        self._loader = loader
        if loop is None or loop["epoch"] != t.epochs_done:
            totals = t._metrics.totals
            self._epoch = {"epoch_rng": _rng_now(), "epoch_steps": t.optimizer_steps,
                           "epoch_totals": None if totals is None else totals.clone(),
                           "batches": 0}
            return iter(loader), self._epoch["epoch_totals"], t.optimizer_steps, 0
        saved = _rng_now()  # (the checkpoint's, just loaded)
        _set_rng(loop["epoch_rng"])
        skip = loop["batches"]
        if loop["loader"] is not None and _stateful(loader):
            loader.load_state_dict(loop["loader"])  # type: ignore[attr-defined]
            it = iter(loader)
        else:
            it = iter(loader)
            for i in range(skip):
                try:
                    next(it)
                except StopIteration:
                    raise ValueError(
                        f"MixedPrecisionTrainer.train: resuming epoch {t.epochs_done + 1}, "
                        f"whose checkpoint had consumed {skip} batches, the loader yields only "
                        f"{i}: not the data the checkpointed run had") from None
        _set_rng(saved)
        totals = loop["epoch_totals"]
        dev = t._manager().device
        self._epoch = {"epoch_rng": loop["epoch_rng"], "epoch_steps": loop["epoch_steps"],
                       "epoch_totals": None if totals is None else totals.to(dev),
                       "batches": skip}
        return it, self._epoch["epoch_totals"], loop["epoch_steps"], skip

    def _position(self) -> dict[str, Any]:
        e = self._epoch
        totals = e.get("epoch_totals")
        loader = self._loader
        return {"first_epoch": self.first, "epochs": self.end - self.first,
                "epoch": self.trainer.epochs_done, "batches": e.get("batches", 0),
                "epoch_rng": e.get("epoch_rng") or _rng_now(),
                "epoch_steps": e.get("epoch_steps", self.trainer.optimizer_steps),
                "epoch_totals": None if totals is None else totals.detach().cpu(),
                "results": [dict(r) for r in self.results],
                "loader": loader.state_dict() if loader is not None and _stateful(loader)
                else None}

    def batch_done(self, batches: int) -> None:
        """After a batch (or the epoch's flush): a checkpoint when an optimizer step just
        ended on the interval (no host read: the step count is a host counter)."""
        self._epoch["batches"] = batches
        t = self.trainer
        steps = t.optimizer_steps
        if (self.every is not None and t._micro == 0 and steps != self._saved_at
                and steps % self.every == 0):
            self.save()

    def end_epoch(self) -> None:
        """The epoch is done (its result appended to :attr:`results`)."""
        self._epoch, self._loader = {}, None

    def save(self) -> None:
        """Write the checkpoint of now, then remove the ones past ``keep`` (only once this
        one is finished)."""
        assert self.directory is not None
        t = self.trainer
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, _files.step_name(t.optimizer_steps, t._sharded()))
        t._loop_state = self._position
        try:
            t.save_state(path)
        finally:
            t._loop_state = None
        self._saved_at = t.optimizer_steps
        self._prune(path)

    def _prune(self, newest: str) -> None:
        import torch.distributed as dist

        if self.keep is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            _files.prune(self.directory or "", self.keep, newest)

    def finish(self) -> None:
        """At the end of the call: the last checkpoint (unless one of this step is there:
        resumed from it, the call only redid the epoch's end; what a removal cut short left
        is removed)."""
        if not self.saving:
            return
        t = self.trainer
        path = os.path.join(self.directory or "", _files.step_name(t.optimizer_steps,
                                                                   t._sharded()))
        if self._saved_at == t.optimizer_steps and _files.is_complete(path):
            self._prune(path)
        else:
            self.save()
