"""The passes of :class:`mixprec.GradScaler` over an optimizer's gradients.

:func:`collect_grads` groups the gradients by device; each pass then makes one fused
:mod:`mixprec.ops` call per device, all dtypes together, with a fresh 0-dim float32 inf
flag per device:

* :func:`unscale_and_check` -- :func:`mixprec.ops.unscale_and_check_` (``unscale_``;
  :func:`unscale_optimizer_grads` is the whole of it, from the optimizer to the flags);
* :func:`check_finite` -- :func:`mixprec.ops.check_finite_`, read only (the
  inf check of optimizers that unscale in their own step; :func:`check_optimizer_grads`
  is the whole of it);
* :func:`norm_pass` -- :func:`mixprec.ops.unscale_and_norm_` or
  :func:`mixprec.ops.check_finite_and_norm_` (``clip_grad_norm_``).

:func:`reduce_found_inf` all-reduces the flags (MAX) over a process group, or over
the meshes of DTensor (FSDP2) grads, whose local shards the passes run on
(:class:`DeviceGrads` keeps their layouts). Nothing here syncs with the host.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import Tensor

from .. import _dtensor, ops

__all__ = [
    "fp16_grads_allowed", "DeviceGrads", "inv_scale", "check_optimizer_grads",
    "unscale_optimizer_grads", "collect_grads", "reduce_found_inf", "unscale_and_check",
    "check_finite", "norm_pass"]

PerDevice = dict[torch.device, list[Tensor]]
Flags = dict[torch.device, Tensor]


class DeviceGrads(dict):  # type: ignore[type-arg]
    """What :func:`collect_grads` returns: ``{device: grads}`` (a DTensor grad as its local
    shard), and in :attr:`specs` the layouts (:func:`mixprec._dtensor.specs_of`) of the
    DTensor grads, in order (empty without any)."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: List[Any] = []


def fp16_grads_allowed(setting: Optional[bool], optimizer: torch.optim.Optimizer) -> bool:
    """The scaler's ``allow_fp16_grads``, or (None) whether ``optimizer`` keeps float32 masters."""
    if setting is not None:
        return setting
    return (
        getattr(optimizer, "master_weights", False) is True
        or getattr(optimizer, "_mixprec_master_weights", False) is True
    )


def inv_scale(scale: Tensor) -> Tensor:
    """``1 / scale`` as torch's scaler takes it: in float64, rounded to float32 (MPS: in
    float32). A new 0-dim tensor on the scale's device; no sync."""
    if scale.device == torch.device("mps:0"):
        return scale.reciprocal()
    return scale.double().reciprocal().float()


def check_optimizer_grads(optimizer: torch.optim.Optimizer, home: torch.device,
                          group: Optional[Any]) -> Flags:
    """The inf check of an optimizer that unscales in its own step: :func:`check_finite`
    over ``optimizer``'s grads (read only, any dtype), the flags reduced (MAX) over
    ``group`` or the meshes of DTensor grads (:func:`reduce_found_inf`, onto ``home``).
    Returns ``{device: found_inf}``. No host sync."""
    per_device = collect_grads(optimizer, True)
    return reduce_found_inf(check_finite(per_device), home, group, per_device.specs)


def unscale_optimizer_grads(optimizer: torch.optim.Optimizer, inv: Tensor, found_inf: Tensor,
                            allow_fp16: bool, group: Optional[Any],
                            setting: Optional[bool] = False) -> Flags:
    """Unscale ``optimizer``'s grads by ``inv`` in place and check them for inf/NaN: one
    :func:`unscale_and_check` call per device, the flags reduced (MAX) over ``group``, or
    over the meshes of DTensor grads (:func:`reduce_found_inf`). Float16 grads are
    accepted when ``allow_fp16`` or :func:`fp16_grads_allowed` of the scaler's
    ``setting`` says so. Returns ``{device: found_inf}`` (on ``found_inf``'s device).
    No host sync."""
    allow_fp16 = allow_fp16 or fp16_grads_allowed(setting, optimizer)
    per_device = collect_grads(optimizer, allow_fp16)
    flags = unscale_and_check(per_device, inv, found_inf)
    return reduce_found_inf(flags, found_inf.device, group, per_device.specs)


def collect_grads(
    optimizer: torch.optim.Optimizer, allow_fp16: bool, coalesce_sparse: bool = False
) -> DeviceGrads:
    """The optimizer's gradients (values of sparse ones, local shards of DTensor ones)
    grouped by device; the DTensor grads' layouts in ``.specs``. ``allow_fp16``: as
    resolved by the scaler (its setting, or :func:`fp16_grads_allowed`).

    ``ValueError("Attempting to unscale FP16 gradients.")`` for a float16
    gradient unless ``allow_fp16``. Float16 sparse gradients are coalesced
    first (replacing ``param.grad``), as torch does, since summing duplicate
    indices can overflow; with ``coalesce_sparse`` every sparse gradient is.
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
            same_device = lists.get(grad.device)
            if same_device is None:
                lists[grad.device] = [grad]
            else:
                same_device.append(grad)
    per_device.update(lists)
    return per_device


def _dense_local(param: Tensor, grad: Tensor, coalesce_sparse: bool, specs: List[Any]) -> Tensor:
    """What the passes take for ``param``'s grad that is not a plain dense tensor: a
    DTensor's local shard (its layout appended to ``specs``), a sparse grad's values (a
    float16 one, or any with ``coalesce_sparse``, coalesced first into ``param.grad``),
    another tensor subclass itself."""
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
    """All-reduce the inf flags (max) over the process ``group``; without one, over the
    mesh of the DTensor grads laid out as ``specs`` (every dimension); identity when neither
    applies.

    When reduced, the result is a single flag on ``home`` (zero when this rank has no
    gradients, so that every rank joins the collective).
    """
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

    ``inv_scale``/``found_inf``: float32 0-dim tensors on one device; grads on
    other devices get copies of them. Unlike torch, the ``found_inf`` passed
    in is itself used (and set) for the grads on its own device instead of a
    copy. Returns ``{device: found_inf on that device}``.
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
    """Check the grads for inf/NaN without writing them: one ``check_finite_`` per device.

    In any grad mode: the op writes only the fresh flag, which never requires grad, and
    reads the grads (``create_graph`` ones require grad)."""
    flags: Flags = {}
    for dev, grads in per_device.items():
        flag = torch.zeros((), dtype=torch.float32, device=dev)
        ops.check_finite_(grads, flag)
        flags[dev] = flag
    return flags


def norm_pass(
    per_device: PerDevice,
    op: Callable[[list[Tensor], Tensor, Tensor, float], Tensor],
    inv_scale: Tensor,
    norm_type: float,
) -> tuple[Flags, Tensor]:
    """One ``op`` call per device (a norm op of :mod:`mixprec.ops`) with a fresh inf flag.

    Returns the per-device flags and the total norm (float32, 0-dim, on
    ``inv_scale``'s device).
    """
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
