"""The trainer's helpers that need no trainer: evaluation, moving batches, measuring
activation memory, re-pointing a scheduler. (The epoch loops are the trainer's own
methods.)"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import Tensor, nn

from .. import _dtensor
from ..amp.autocast import cast_floating

if TYPE_CHECKING:
    from .manager import MixedPrecisionManager

__all__ = [
    "evaluate_model",
    "measured_forward",
    "to_device",
    "rebind_scheduler",
]


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def batch_size(obj: Any) -> int:
    if isinstance(obj, Tensor):
        return int(obj.shape[0]) if obj.dim() else 1
    if isinstance(obj, (list, tuple)) and obj:
        return batch_size(obj[0])
    if isinstance(obj, dict) and obj:
        return batch_size(next(iter(obj.values())))
    return 1


def rebind_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``scheduler`` at ``optimizer`` (and mark its step as tracked, as torch does)."""
    scheduler.optimizer = optimizer
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return
    func = step.__func__  # type: ignore[attr-defined]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return func.__get__(optimizer, type(optimizer))(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]


@torch.no_grad()
def evaluate_model(
    manager: MixedPrecisionManager,
    model: nn.Module,
    criterion: Callable[..., Tensor],
    loader: Iterable[Any],
) -> dict[str, Any]:
    """The body of :meth:`MixedPrecisionTrainer.evaluate`."""
    dev = manager.device
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    n = 0
    classify = True
    try:
        for data, target in loader:
            data = to_device(data, dev)
            target = to_device(target, dev)
            with manager.autocast():
                out = model(data)
            out = cast_floating(out, torch.float32)
            bs = batch_size(target)
            with torch.autocast(dev.type, enabled=False):
                loss_sum += criterion(out, target).double() * bs
            if (
                classify
                and isinstance(out, Tensor)
                and isinstance(target, Tensor)
                and out.dim() == 2
                and not target.is_floating_point()
                and target.dim() == 1
            ):
                correct += (out.argmax(1) == target).sum()
            else:
                classify = False
            n += bs
    finally:
        model.train(was_training)
    vals = torch.stack([loss_sum, correct.double()]).tolist()
    return {
        "loss": vals[0] / max(n, 1),
        "accuracy": (vals[1] / max(n, 1)) if classify and n else None,
        "num_samples": n,
    }


def measured_forward(forward: Callable[[], Tensor], params: list[Tensor]) -> tuple[Tensor, int]:
    """Run ``forward()`` while adding up the bytes autograd saves for backward, except
    the ``params``' storages; returns ``(loss, activation bytes)``."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    # (a DTensor param, FSDP2's, has no storage of its own: its local shard's is read)
    param_ptrs = {_dtensor.local(p).untyped_storage().data_ptr() for p in params}
    return loss, sum(v for k, v in seen.items() if k not in param_ptrs)
