"""Loss scaling and autocast: :class:`GradScaler` (:mod:`.grad_scaler`), :class:`ScalerStats`,
:class:`autocast`, per-module :class:`PrecisionPolicy` (:mod:`.module_policy`) and
:func:`patch_torch`.
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

__all__ = ["GradScaler", "ScalerStats", "autocast", "resolve_precision", "PrecisionPolicy",
           "PolicyHandle", "apply_policy", "remove_policy", "DEFAULT_FP32_MODULES",
           "patch_torch", "unpatch_torch", "is_torch_patched"]
