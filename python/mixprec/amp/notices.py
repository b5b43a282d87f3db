"""The warning category of a setting that has no effect.

mixprec warns (:func:`warnings.warn`, never a log line) when something the user asked for
does nothing: a SELECTIVE pattern that matches no module, the FP8 level with no eligible
``nn.Linear``, ``stochastic_rounding=True`` on params it never rounds, 8-bit state with
nothing to store in 8 bits, an lr table shorter than the schedule. Filter them with
``warnings.filterwarnings("ignore", category=mixprec.amp.notices.IneffectiveSettingWarning)``
or turn them into errors with ``"error"``.
"""

from __future__ import annotations

import warnings

__all__ = ["IneffectiveSettingWarning", "warn_ineffective"]


class IneffectiveSettingWarning(UserWarning):
    """A setting was accepted but has no effect (what it says, and what to do)."""


def warn_ineffective(message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` as an :class:`IneffectiveSettingWarning` (shown once per call
    site by Python's default filter), attributed ``stacklevel`` frames up (2: the
    caller's caller)."""
    warnings.warn(message, IneffectiveSettingWarning, stacklevel=stacklevel + 1)
