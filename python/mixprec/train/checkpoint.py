"""The trainer's checkpoint: :meth:`MixedPrecisionTrainer.save_state` / ``load_state``.

The file is one ``torch.save`` of a dict of tensors and plain Python values, so
``torch.load(path, weights_only=True)`` reads it. Format :data:`STATE_FORMAT` (``1``)::

    format        1
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

Every file written since the format was introduced loads; a test loads files written by
the trainer before it was split into parts (``tests/data/trainer_*.pt``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .config import MixedPrecisionConfig
from .manager import MixedPrecisionManager
from .metrics import MetricsLog

__all__ = ["STATE_FORMAT", "Progress", "TrainerParts", "trainer_state", "save_trainer_state",
           "read_trainer_state", "restore_modules", "restore_progress"]

logger = logging.getLogger("mixprec.trainer")

#: The version of the checkpoint layout (the dict's ``"format"``).
STATE_FORMAT = 1


@dataclasses.dataclass
class Progress:
    """The trainer's counters that a checkpoint carries (``counters`` in the file).

    ``micro``: micro-batches of an unfinished accumulation; ``scaler_offsets``: the
    scaler statistics (steps, scale increases, decreases) of the runs before a load,
    added to the scaler's own."""

    optimizer_steps: int = 0
    micro_steps: int = 0
    epochs_done: int = 0
    micro: int = 0
    scaler_offsets: tuple[int, int, int] = (0, 0, 0)
    peak_memory: int = 0


@dataclasses.dataclass
class TrainerParts:
    """What a trainer's checkpoint is made of, handed over by the trainer (which keeps its
    own attributes to itself)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    config: MixedPrecisionConfig
    manager: MixedPrecisionManager
    metrics: MetricsLog
    progress: Progress
    step_loss: Optional[Tensor]  # the summed loss of an unfinished accumulation
    params: list[Tensor]  # the optimizer's params, in group order


def trainer_state(parts: TrainerParts) -> dict[str, Any]:
    """The checkpoint dict (one host sync)."""
    scaler = parts.manager.scaler
    sst = scaler.stats()
    prog = parts.progress
    offsets = prog.scaler_offsets
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "config": parts.config.to_dict(),
        "counters": {
            "optimizer_steps": prog.optimizer_steps,
            "micro_steps": prog.micro_steps,
            "epochs_done": prog.epochs_done,
            "micro": prog.micro,
            "log_step": parts.metrics.log_step,
            "scaler_steps": sst.steps + offsets[0],
            "scale_increases": sst.scale_increases + offsets[1],
            "scale_decreases": sst.scale_decreases + offsets[2],
            "peak_memory": prog.peak_memory,
        },
    }
    state.update(parts.metrics.state())
    state["adaptive"] = parts.manager.plan_state()
    state["rng"] = {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    state["pending_loss"] = None if parts.step_loss is None else parts.step_loss.cpu()
    state["pending_grads"] = (
        [None if p.grad is None else p.grad.detach().cpu() for p in parts.params]
        if prog.micro
        else None
    )
    return state


def save_trainer_state(parts: TrainerParts, path: Union[str, os.PathLike[str]]) -> None:
    """Write :func:`trainer_state` to ``path``."""
    torch.save(trainer_state(parts), os.fspath(path))


def read_trainer_state(path: Union[str, os.PathLike[str]], config: MixedPrecisionConfig,
                       strict_config: bool) -> dict[str, Any]:
    """Read a checkpoint file (``weights_only=True``) and compare its config with
    ``config``: a difference is a warning, or with ``strict_config`` a ``ValueError``. A
    config field added since the file was written counts as saved at its default."""
    state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"MixedPrecisionTrainer.load_state: unknown format {state.get('format')!r} in {path}"
        )
    saved_cfg = state["config"]
    mine = config.to_dict()
    defaults = type(config)().to_dict()
    diff = sorted(k for k in mine if saved_cfg.get(k, defaults[k]) != mine[k])
    if diff:
        msg = f"MixedPrecisionTrainer.load_state: config differs from the saved one in {diff}"
        if strict_config:
            raise ValueError(msg)
        logger.warning(msg)
    return state


def restore_modules(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, manager: MixedPrecisionManager) -> None:
    """Load the model, optimizer, scaler and scheduler states of a checkpoint dict."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        manager.scaler.load_state_dict(state["scaler"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])


def restore_progress(state: dict[str, Any], parts: TrainerParts) -> Progress:
    """The rest of a checkpoint dict into freshly reset trainer parts: the counters (returned),
    the metrics (``parts.metrics``, restored in place), the manager's step count and ADAPTIVE
    plan, the RNG states and an unfinished accumulation's grads (into ``parts.params``). The
    pending loss is ``state["pending_loss"]`` (on the CPU)."""
    c = state["counters"]
    prog = Progress(
        optimizer_steps=int(c["optimizer_steps"]),
        micro_steps=int(c["micro_steps"]),
        epochs_done=int(c["epochs_done"]),
        micro=int(c["micro"]),
        scaler_offsets=(int(c["scaler_steps"]), int(c["scale_increases"]),
                        int(c["scale_decreases"])),
        peak_memory=int(c["peak_memory"]),
    )
    manager = parts.manager
    manager.steps = prog.optimizer_steps
    parts.metrics.restore(state, prog.optimizer_steps, int(c["log_step"]), manager.device)
    manager.load_plan_state(state["adaptive"])
    torch.set_rng_state(state["rng"]["cpu"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    if state["pending_grads"] is not None:
        for p, g in zip(parts.params, state["pending_grads"]):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
    return prog
