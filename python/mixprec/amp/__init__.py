"""Loss scaling and autocast: :class:`GradScaler`, :class:`autocast`, precision policies.

* :mod:`.grad_scaler`: :class:`GradScaler`, the drop-in :class:`torch.amp.GradScaler`
  built on the fused ops (:mod:`mixprec.ops`), and its loss-scale policies;
* :mod:`.stats`: the scaler's device-side statistics (:class:`ScalerStats`);
* :mod:`.autocast`: :class:`autocast`; :mod:`.module_policy`: the per-module
  :class:`PrecisionPolicy` and :func:`apply_policy`;
* :mod:`._patch`: :func:`patch_torch`, which makes ``torch.amp.GradScaler`` build mixprec's.
"""

from __future__ import annotations

from ._patch import is_torch_patched, patch_torch, unpatch_torch
from .autocast import autocast, resolve_precision
from .grad_scaler import GradScaler
from .module_policy import (
    DEFAULT_FP32_MODULES,
    PolicyHandle,
    PrecisionPolicy,
    apply_policy,
    remove_policy,
)
from .stats import ScalerStats

__all__ = [
    "GradScaler",
    "ScalerStats",
    "autocast",
    "resolve_precision",
    "PrecisionPolicy",
    "PolicyHandle",
    "apply_policy",
    "remove_policy",
    "DEFAULT_FP32_MODULES",
    "patch_torch",
    "unpatch_torch",
    "is_torch_patched",
]
