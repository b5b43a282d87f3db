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

import logging
import os
from typing import TYPE_CHECKING, Any, Union

import torch

if TYPE_CHECKING:
    from .trainer import MixedPrecisionTrainer

__all__ = ["STATE_FORMAT", "save_trainer_state", "load_trainer_state"]

logger = logging.getLogger("mixprec.trainer")

#: The version of the checkpoint layout (the dict's ``"format"``).
STATE_FORMAT = 1


def trainer_state(trainer: MixedPrecisionTrainer) -> dict[str, Any]:
    """The checkpoint dict of a set-up trainer (one host sync)."""
    manager = trainer.mixed_precision_manager
    assert manager is not None and trainer.model is not None
    scaler = manager.scaler
    sst = scaler.stats()
    offsets = trainer._scaler_offsets
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "config": trainer.config.to_dict(),
        "counters": {
            "optimizer_steps": trainer.optimizer_steps,
            "micro_steps": trainer.micro_steps,
            "epochs_done": trainer.epochs_done,
            "micro": trainer._micro,
            "log_step": trainer._metrics.log_step,
            "scaler_steps": sst.steps + offsets[0],
            "scale_increases": sst.scale_increases + offsets[1],
            "scale_decreases": sst.scale_decreases + offsets[2],
            "peak_memory": trainer.peak_memory,
        },
    }
    state.update(trainer._metrics.state())
    state["adaptive"] = manager.plan_state()
    state["rng"] = {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    state["pending_loss"] = None if trainer._step_loss is None else trainer._step_loss.cpu()
    state["pending_grads"] = (
        [None if p.grad is None else p.grad.detach().cpu() for p in trainer._params()]
        if trainer._micro
        else None
    )
    return state


def save_trainer_state(trainer: MixedPrecisionTrainer, path: Union[str, os.PathLike[str]]) -> None:
    """Write :func:`trainer_state` to ``path``."""
    torch.save(trainer_state(trainer), os.fspath(path))


def load_trainer_state(
    trainer: MixedPrecisionTrainer, path: Union[str, os.PathLike[str]], strict_config: bool
) -> None:
    """Restore a checkpoint file into a set-up trainer (see ``load_state``)."""
    manager = trainer.mixed_precision_manager
    assert manager is not None and trainer.model is not None
    state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"MixedPrecisionTrainer.load_state: unknown format {state.get('format')!r} in {path}"
        )
    saved_cfg = state["config"]
    mine = trainer.config.to_dict()
    # (a field added since the file was written counts as saved at its default)
    defaults = type(trainer.config)().to_dict()
    diff = sorted(k for k in mine if saved_cfg.get(k, defaults[k]) != mine[k])
    if diff:
        msg = f"MixedPrecisionTrainer.load_state: config differs from the saved one in {diff}"
        if strict_config:
            raise ValueError(msg)
        logger.warning(msg)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        manager.scaler.load_state_dict(state["scaler"])
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    c = state["counters"]
    trainer._reset_counters()
    trainer.optimizer_steps = int(c["optimizer_steps"])
    manager.steps = trainer.optimizer_steps
    trainer.micro_steps = int(c["micro_steps"])
    trainer.epochs_done = int(c["epochs_done"])
    trainer._micro = int(c["micro"])
    trainer._scaler_offsets = [
        int(c["scaler_steps"]),
        int(c["scale_increases"]),
        int(c["scale_decreases"]),
    ]
    trainer.peak_memory = int(c["peak_memory"])
    dev = manager.device
    trainer._metrics.restore(state, trainer.optimizer_steps, int(c["log_step"]), dev)
    manager.load_plan_state(state["adaptive"])
    torch.set_rng_state(state["rng"]["cpu"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    if state["pending_loss"] is not None:
        trainer._step_loss = state["pending_loss"].to(dev)
    if state["pending_grads"] is not None:
        for p, g in zip(trainer._params(), state["pending_grads"]):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
    trainer._measure_activations = False
