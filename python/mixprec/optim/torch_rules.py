"""The load checks of mixprec's 32-bit optimizers applied to ``torch.optim.SGD``, ``Adam``
and ``AdamW`` state dicts (what ``MixedPrecisionTrainer.load_state`` runs first for a torch
optimizer, e.g. in AUTOMATIC mode)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
from torch import Tensor

from ._base import check_state_dict32
from .adam import Adam
from .sgd import SGD

__all__ = ["check_torch_state_dict"]


class _TorchRules:
    """A ``torch.optim.SGD/Adam/AdamW`` seen through the rules of its mixprec twin (for
    :func:`check_torch_state_dict`): its groups and defaults, the twin's state names; no
    masters (torch keeps none)."""

    _KEPT_ON_LOAD: Tuple[str, ...] = ()

    def __init__(self, opt: torch.optim.Optimizer, twin: Any) -> None:
        self.param_groups = opt.param_groups
        self.defaults = opt.defaults
        self.STATE = twin.STATE
        self.REQUIRED_OPTIONS = twin.REQUIRED_OPTIONS
        self.STEP_OPTIONAL = twin.STEP_OPTIONAL

    def keeps_master(self, p: Tensor, group: Dict[str, Any]) -> bool:
        return False


def check_torch_state_dict(opt: torch.optim.Optimizer, state_dict: Any) -> bool:
    """For a ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (exactly those classes): run the
    32-bit checks of :meth:`FusedOptimizer.check_state_dict` on ``state_dict`` (messages
    name ``torch.optim.<cls>``; a ``master_param`` is refused: torch keeps none) and return
    True; False for another class (nothing checked)."""
    twin = {torch.optim.SGD: SGD, torch.optim.Adam: Adam, torch.optim.AdamW: Adam}.get(
        type(opt))
    if twin is None:
        return False
    check_state_dict32(_TorchRules(opt, twin), state_dict,  # type: ignore[arg-type]
                       f"torch.optim.{type(opt).__name__}.load_state_dict")
    return True
