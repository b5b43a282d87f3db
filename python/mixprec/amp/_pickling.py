"""Unpickling :class:`mixprec.GradScaler`: a torch scaler's state (under
``mixprec.patch_torch()``) or an earlier mixprec's, made current.
"""

from __future__ import annotations

from typing import Any

from .protocol import IterationRecord
from .stats import _StatsTracker

__all__ = ["complete_state"]

# mixprec's attributes, as a scaler built with torch's arguments has them
_DEFAULTS: dict[str, Any] = {
    "_policy": "torch", "_allow_fp16_grads": None, "_min_scale": None, "_max_scale": None,
    "_hysteresis": 1, "_process_group": None, "_init_hysteresis_left": 1,
    "_hysteresis_left": None}


def complete_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a pickled scaler's ``__dict__``) with every mixprec attribute present;
    updated in place and returned. The attributes of earlier mixprec pickles
    (``_mp_last_found``, ``_mp_host_found``) are read until mixprec 0.3.0, which retires
    them."""
    old_last = state.pop("_mp_last_found", None)
    state.pop("_mp_host_found", None)
    if "_mp_last" not in state:
        state["_mp_last"] = None if old_last is None else IterationRecord({}, bool(old_last))
    for key, value in _DEFAULTS.items():
        state.setdefault(key, value)
    if "_mp_stats" not in state:
        state["_mp_stats"] = _StatsTracker()
    return state
