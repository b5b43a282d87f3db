"""The passes of :class:`mixprec.GradScaler` over an optimizer's gradients.

:func:`collect_grads` groups the grads by device; each pass makes one fused :mod:`mixprec.ops`
call per device with a fresh 0-dim float32 inf flag per device: :func:`unscale_and_check`
(``unscale_``), :func:`check_finite` (read only), :func:`norm_pass` (``clip_grad_norm_``).
:func:`reduce_found_inf` all-reduces the flags (MAX) over a process group or the meshes of
DTensor (FSDP2) grads, whose local shards the passes run on. Nothing here syncs with the host.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import Tensor

from .. import _dtensor, ops

__all__ = ["fp16_grads_allowed", "DeviceGrads", "inv_scale", "check_optimizer_grads",
           "unscale_optimizer_grads", "collect_grads", "reduce_found_inf", "unscale_and_check",
           "check_finite", "norm_pass"]

PerDevice = dict[torch.device, list[Tensor]]
Flags = dict[torch.device, Tensor]


class DeviceGrads(dict):  # type: ignore[type-arg]
    """``{device: grads}`` (DTensor grads as local shards); :attr:`specs`: the DTensor
    grads' layouts (:func:`mixprec._dtensor.specs_of`), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: List[Any] = []


def fp16_grads_allowed(setting: Optional[bool], optimizer: torch.optim.Optimizer) -> bool:
    """The scaler's ``allow_fp16_grads``, or (None) whether ``optimizer`` keeps float32 masters."""
    if setting is not None:
        return setting
    return (getattr(optimizer, "master_weights", False) is True
            or getattr(optimizer, "_mixprec_master_weights", False) is True)


def inv_scale(scale: Tensor) -> Tensor:
    """``1 / scale`` as torch's scaler takes it: in float64, rounded to float32 (MPS: in
    float32). A new 0-dim tensor on the scale's device; no sync."""
    if scale.device == torch.device("mps:0"):
        return scale.reciprocal()
    return scale.double().reciprocal().float()


def check_optimizer_grads(optimizer: torch.optim.Optimizer, home: torch.device,
                          group: Optional[Any]) -> Flags:
    """:func:`check_finite` over ``optimizer``'s grads (any dtype), reduced onto ``home`` by
    :func:`reduce_found_inf`. Returns ``{device: found_inf}``. No host sync."""
    per_device = collect_grads(optimizer, True)
    return reduce_found_inf(check_finite(per_device), home, group, per_device.specs)


def unscale_optimizer_grads(optimizer: torch.optim.Optimizer, inv: Tensor, found_inf: Tensor,
                            allow_fp16: bool, group: Optional[Any],
                            setting: Optional[bool] = False) -> Flags:
    """Unscale ``optimizer``'s grads by ``inv`` in place and check them
    (:func:`unscale_and_check`, reduced by :func:`reduce_found_inf`); fp16 grads accepted
    when ``allow_fp16`` or :func:`fp16_grads_allowed` of ``setting``. Returns
    ``{device: found_inf}``. No host sync."""
    allow_fp16 = allow_fp16 or fp16_grads_allowed(setting, optimizer)
    per_device = collect_grads(optimizer, allow_fp16)
    flags = unscale_and_check(per_device, inv, found_inf)
    return reduce_found_inf(flags, found_inf.device, group, per_device.specs)


def collect_grads(optimizer: torch.optim.Optimizer, allow_fp16: bool,
                  coalesce_sparse: bool = False) -> DeviceGrads:
    """The optimizer's grads (values of sparse ones, local shards of DTensor ones) by device.

    ``ValueError("Attempting to unscale FP16 gradients.")`` for a float16 grad unless
    ``allow_fp16``. Float16 sparse grads (all sparse ones with ``coalesce_sparse``) are
    coalesced first, replacing ``param.grad``, as torch does.
    """
    per_device = DeviceGrads()
    lists: PerDevice = {}
    fp16 = torch.float16
    for group in optimizer.param_groups:
        params = group["params"]
        for cls in set(map(type, params)):  # (torch's check, once per class of param)
            if not issubclass(cls, Tensor):
                raise AssertionError(f"expected param to be torch.Tensor, got {cls.__name__}")
        for param in params:
            grad = param.grad
            if grad is None:
                continue
            if not allow_fp16 and grad.dtype is fp16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            if type(grad) is not Tensor or grad.is_sparse:
                grad = _dense_local(param, grad, coalesce_sparse, per_device.specs)
            lists.setdefault(grad.device, []).append(grad)
    per_device.update(lists)
    return per_device


def _dense_local(param: Tensor, grad: Tensor, coalesce_sparse: bool, specs: List[Any]) -> Tensor:
    """A DTensor's local shard (layout appended to ``specs``), a sparse grad's values
    (coalesced as :func:`collect_grads` says), another subclass itself."""
    if _dtensor.is_dtensor(grad):
        specs.extend(_dtensor.specs_of([grad]))
        return _dtensor.local(grad)
    if grad.is_sparse:
        if coalesce_sparse or grad.dtype is torch.float16:
            grad = grad.coalesce()
            param.grad = grad
        return grad._values()
    return grad


def reduce_found_inf(per_device: Flags, home: torch.device, group: Optional[Any],
                     specs: Sequence[Any] = ()) -> Flags:
    """All-reduce the inf flags (MAX) over ``group``, else over every mesh dimension of
    ``specs``, into one flag on ``home`` (zero without grads: every rank joins); identity
    when neither applies."""
    if group is not None:
        groups = [group]
    elif specs:
        groups = _dtensor.reduce_groups(specs, shard_only=False)
    else:
        return per_device
    import torch.distributed as dist

    flags = [f.to(home) for f in per_device.values()]
    combined = (sum(flags[1:], flags[0]) if flags
                else torch.zeros((), dtype=torch.float32, device=home))
    _dtensor.all_reduce(combined, dist.ReduceOp.MAX, groups)
    return {home: combined}


def unscale_and_check(per_device: PerDevice, inv_scale: Tensor, found_inf: Tensor) -> Flags:
    """Unscale the grads in place and check them: one ``unscale_and_check_`` per device.

    ``inv_scale``/``found_inf``: float32 0-dim on one device (copied to others); unlike
    torch, ``found_inf`` itself is set for its own device. Returns ``{device: flag}``.
    """
    home = found_inf.device
    with torch.no_grad():
        # copies first, so they all start from the caller's (unset) flag
        targets = {dev: (found_inf, inv_scale) if dev == home
                   else (found_inf.to(dev, non_blocking=True, copy=True),
                         inv_scale.to(dev, non_blocking=True, copy=True))
                   for dev in per_device}
        for dev, grads in per_device.items():
            flag, inv = targets[dev]
            ops.unscale_and_check_(grads, flag, inv)
    return {dev: flag for dev, (flag, _) in targets.items()}


def check_finite(per_device: PerDevice) -> Flags:
    """Check the grads for inf/NaN without writing them: one ``check_finite_`` per device
    (any grad mode: only the fresh flag is written)."""
    flags: Flags = {}
    for dev, grads in per_device.items():
        flag = torch.zeros((), dtype=torch.float32, device=dev)
        ops.check_finite_(grads, flag)
        flags[dev] = flag
    return flags


def norm_pass(per_device: PerDevice, op: Callable[[list[Tensor], Tensor, Tensor, float], Tensor],
              inv_scale: Tensor, norm_type: float) -> tuple[Flags, Tensor]:
    """One ``op`` call (a norm op of :mod:`mixprec.ops`) per device with a fresh inf flag.
    Returns the flags and the total norm (float32, 0-dim, on ``inv_scale``'s device)."""
    home = inv_scale.device
    flags: Flags = {}
    norms: list[Tensor] = []
    with torch.no_grad():
        for dev, grads in per_device.items():
            flag = torch.zeros((), dtype=torch.float32, device=dev)
            inv = inv_scale if dev == home else inv_scale.to(dev, non_blocking=True)
            norms.append(op(grads, flag, inv, norm_type).to(home))
            flags[dev] = flag
    if not norms:
        total = torch.zeros((), dtype=torch.float32, device=home)
    elif len(norms) == 1:
        total = norms[0]
    else:
        total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    return flags, total
