"""What the mode strategies (:mod:`.modes`) and the ADAPTIVE controller (:mod:`.adaptive`)
see of the manager: its precision plan, as a structural type. They take any object with
these attributes (in practice :class:`~mixprec.train.manager.MixedPrecisionManager`), so
neither imports the manager, which imports them."""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch
from torch import nn

from ..amp.module_policy import PolicyHandle
from .config import MixedPrecisionConfig

__all__ = ["PlanHost"]


class PlanHost(Protocol):
    """The precision plan of a managed model, read and changed in place.

    Attributes:
        model: the managed model.
        config: its configuration.
        device: where the model runs.
        compute_dtype: the low-precision dtype in use (``None``: float32).
        eventual_dtype: the low-precision dtype the mode may switch to.
        root_precision: the model-wide precision name (``"fp16"``, ``"bf16"``,
            ``"fp32"``), or ``None`` before the first plan.
        overrides: per-module precision names that differ from the root.
        policy_handle: the installed precision policy, or ``None``.
        loss_scaling: whether the loss is scaled.
        adaptive_decisions: the ADAPTIVE decisions so far (appended to).
    """

    model: nn.Module
    config: MixedPrecisionConfig
    device: torch.device
    compute_dtype: Optional[torch.dtype]
    eventual_dtype: Optional[torch.dtype]
    root_precision: Optional[str]
    overrides: dict[str, str]
    policy_handle: Optional[PolicyHandle]
    loss_scaling: bool
    adaptive_decisions: list[dict[str, Any]]

    def install_policy(self) -> None:
        """(Re)install the precision policy that the plan describes."""
