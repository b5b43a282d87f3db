"""The load checks of mixprec's 32-bit optimizers applied to ``torch.optim.SGD``, ``Adam``
and ``AdamW`` state dicts (what ``MixedPrecisionTrainer.load_state`` runs first for a torch
optimizer, e.g. in AUTOMATIC mode)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from ._base import check_state_dict32
from .adam import Adam
from .sgd import SGD

__all__ = ["check_torch_state_dict"]


def check_torch_state_dict(opt: torch.optim.Optimizer, state_dict: Any) -> bool:
    """For a ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (exactly those classes): run the
    32-bit checks of :meth:`FusedOptimizer.check_state_dict` on ``state_dict`` (messages
    name ``torch.optim.<cls>``; a ``master_param`` is refused: torch keeps none) and return
    True; False for another class (nothing checked)."""
    twin = {torch.optim.SGD: SGD, torch.optim.Adam: Adam, torch.optim.AdamW: Adam}.get(
        type(opt))
    if twin is None:
        return False
    # the torch optimizer seen through its twin's rules; torch keeps no masters
    rules = SimpleNamespace(param_groups=opt.param_groups, defaults=opt.defaults,
                            STATE=twin.STATE, REQUIRED_OPTIONS=twin.REQUIRED_OPTIONS,
                            STEP_OPTIONAL=twin.STEP_OPTIONAL, _KEPT_ON_LOAD=(),
                            keeps_master=lambda p, group: False)
    check_state_dict32(rules, state_dict,  # type: ignore[arg-type]
                       f"torch.optim.{type(opt).__name__}.load_state_dict")
    return True
