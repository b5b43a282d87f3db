"""Gradient release: the optimizer steps each param during backward, as soon as its gradient
exists, and frees the gradient at once, so the gradients of the whole model are never alive
together.

Params are stepped in buckets (``bucket_bytes`` of gradients at a time) with the same fused
multi-tensor kernels as :meth:`FusedOptimizer.step`; their grads are then set to None. The
last, partly filled bucket is stepped by the ``optimizer.step()`` the training loop calls
after ``backward()`` as usual (it steps whatever params still hold a grad), so the loop does
not change and step hooks, schedulers and ``lr_by_steps_taken`` see one step per iteration.
Each param's update is the one ``optimizer.step()`` would make after the whole backward:
the kernels update every tensor on its own, so the bits are those of the run without
release.

What cannot be correct under release is refused at setup (:func:`release_gradients`) or at
the first bucket: loss scaling (an overflow found in a later gradient would have to undo
updates already applied), a global gradient-norm clip (the norm needs every gradient
first), gradient accumulation over micro-batches (every backward steps), DDP (its reducer
writes the averaged gradients only at the end of backward), stochastic rounding (its
element numbering runs over all of a group's params in one call). FSDP2 is supported: its
reduce-scatter runs the post-accumulate-grad hooks of the sharded params, so each shard is
stepped once its averaged gradient exists.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from .. import _dtensor
from ._base import FusedOptimizer

__all__ = ["GradientRelease", "release_gradients", "check_release", "gradient_release_of",
           "DEFAULT_BUCKET_BYTES"]

#: default gradient bytes per bucket (as DDP's ``bucket_cap_mb`` = 25)
DEFAULT_BUCKET_BYTES = 25 * 2**20

_WHERE = "mixprec.optim.release_gradients"
#: the release active on each optimizer
_RELEASED: weakref.WeakKeyDictionary[FusedOptimizer, GradientRelease] = \
    weakref.WeakKeyDictionary()
_SCALER = ("loss scaling cannot be combined with gradient release (an overflow found in a "
           "later gradient would need updates already applied to be undone); train in "
           "bfloat16 without a scaler, or remove the release")
#: the optimizer attributes a scaler sets, and why each cannot be honoured under release
_REFUSED_SCALARS = {
    "grad_scale": "a GradScaler's grad_scale: " + _SCALER,
    "found_inf": "a GradScaler's found_inf: " + _SCALER,
    "clip_coef": "a clip coefficient: a global gradient-norm clip needs every gradient "
                 "before any param is stepped, which release does not wait for",
}


def _grad_bytes(g: Tensor) -> int:
    shard = _dtensor.local(g)
    return shard.numel() * shard.element_size()


class GradientRelease:
    """The hooks :func:`release_gradients` put on an optimizer's params; :meth:`remove`
    takes them off (the optimizer then steps after backward as before).

    Attributes:
        optimizer: the optimizer whose params are stepped during backward.
        bucket_bytes: gradient bytes (local shards') collected before a bucket is stepped.
        buckets_stepped: buckets stepped during backward so far (a host count, no sync).
    """

    def __init__(self, optimizer: FusedOptimizer, bucket_bytes: int) -> None:
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self.buckets_stepped = 0
        self._pending: List[Tensor] = []
        self._pending_bytes = 0
        self._group_of: Dict[int, int] = {}
        self._handles: List[Any] = []
        for index, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self._group_of[id(p)] = index
                    self._handles.append(p.register_post_accumulate_grad_hook(self._ready))
        _RELEASED[optimizer] = self
        #: declared for a scaler (which knows optimizers only by what they declare)
        optimizer.gradients_released = True  # type: ignore[attr-defined]

    def _ready(self, p: Tensor) -> None:
        if p.grad is None:
            return
        self._pending.append(p)
        self._pending_bytes += _grad_bytes(p.grad)
        if self._pending_bytes >= self.bucket_bytes:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        """Step the params collected so far and free their grads (what a full bucket
        does; the training loop's ``optimizer.step()`` steps the rest). Mutates those
        params, their masters and optimizer state; sets their ``.grad`` to None.

        Raises:
            RuntimeError: a GradScaler's scalars or a clip coefficient are set on the
                optimizer (neither can be honoured under release); nothing is stepped.
        """
        if not self._pending:
            return
        opt = self.optimizer
        for name, why in _REFUSED_SCALARS.items():
            if getattr(opt, name, None) is not None:
                raise RuntimeError(f"{_WHERE}: the optimizer carries {why}")
        # steps the params of those groups that hold a grad: exactly the pending ones
        opt.step_groups_with_grads(sorted({self._group_of[id(p)] for p in self._pending}))
        for p in self._pending:
            p.grad = None
        self._pending.clear()
        self._pending_bytes = 0
        self.buckets_stepped += 1

    def remove(self) -> None:
        """Take the hooks off; a bucket still pending is left to ``optimizer.step()``."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if _RELEASED.get(self.optimizer) is self:
            del _RELEASED[self.optimizer]
            self.optimizer.gradients_released = False  # type: ignore[attr-defined]


def gradient_release_of(optimizer: Any) -> Optional[GradientRelease]:
    """The :class:`GradientRelease` active on ``optimizer``, if any."""
    return _RELEASED.get(optimizer) if isinstance(optimizer, FusedOptimizer) else None


def check_release(model: nn.Module, optimizer: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                  optimizer_converted: bool = False) -> None:
    """Raise what :func:`release_gradients` would refuse, changing nothing;
    ``optimizer_converted``: the optimizer is yet to be replaced by a mixprec one (the
    trainer's MANUAL mode), so its class is not checked."""
    if not optimizer_converted and not isinstance(optimizer, FusedOptimizer):
        raise TypeError(f"{_WHERE}: optimizer must be a mixprec.optim optimizer (Adam, "
                        f"AdamW, SGD or their 8-bit forms), got {type(optimizer).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{_WHERE}: model must be an nn.Module, got {type(model).__name__}")
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"{_WHERE}: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    ddp = torch.nn.parallel.DistributedDataParallel
    if any(isinstance(m, ddp) for m in model.modules()):
        raise ValueError(f"{_WHERE}: DDP is not supported: its reducer all-reduces the "
                         "gradients in buckets and writes the averaged ones only at the end "
                         "of backward, so a param stepped earlier would use its local "
                         "gradient; shard with FSDP2 (fully_shard) instead")
    for index, group in enumerate(optimizer.param_groups):
        if group.get("stochastic_rounding", False):
            raise ValueError(f"{_WHERE}: param_groups[{index}] uses stochastic_rounding, "
                             "whose random bits number the elements over all of a group's "
                             "params in one call; under release each bucket is its own "
                             "call: use float32 masters (master_weights=True) instead")
    if gradient_release_of(optimizer) is not None:
        raise ValueError(f"{_WHERE}: the optimizer's gradients are already released "
                         "(remove() the first GradientRelease to change its bucket_bytes)")


def release_gradients(model: nn.Module, optimizer: FusedOptimizer, *,
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> GradientRelease:
    """Step ``optimizer``'s params during backward, ``bucket_bytes`` of gradients at a time,
    freeing each gradient once its param is stepped.

    Call ``optimizer.step()`` after each ``backward()`` as usual (it steps the last bucket)
    and nothing between them that reads the grads (they are None): no ``clip_grad_norm_``,
    no second backward to accumulate into, no GradScaler.
    ``MixedPrecisionConfig(gradient_release=True)`` is the same for the trainer and the
    manager, which refuse at setup what release cannot honour.

    Args:
        model: the module being trained (checked for DDP; FSDP2 modules are supported).
        optimizer: a mixprec optimizer (any of :mod:`mixprec.optim`'s), 32- or 8-bit
            state, float32 params or 16-bit ones with float32 masters.
        bucket_bytes: gradient bytes per bucket (> 0); larger buckets mean fewer kernel
            launches and more gradients alive at once.

    Returns:
        The :class:`GradientRelease` handle (``remove()`` undoes it).

    Raises:
        TypeError: ``optimizer`` is not a mixprec optimizer, or ``model`` not a module.
        ValueError: ``bucket_bytes`` not a positive int; ``model`` is (or holds) a DDP
            module; a param group uses stochastic rounding; the optimizer is already
            released. Nothing is changed.
    """
    check_release(model, optimizer, bucket_bytes=bucket_bytes)
    return GradientRelease(optimizer, bucket_bytes)
