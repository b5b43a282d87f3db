"""The warning category of a setting that has no effect (a pattern matching no module, an
option with nothing to act on). Filter with ``warnings.filterwarnings("ignore",
category=mixprec.amp.notices.IneffectiveSettingWarning)``, or make it an error.
"""

from __future__ import annotations

import warnings

__all__ = ["IneffectiveSettingWarning", "warn_ineffective"]


class IneffectiveSettingWarning(UserWarning):
    """A setting was accepted but has no effect (what it says, and what to do)."""


def warn_ineffective(message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` as an :class:`IneffectiveSettingWarning`, attributed ``stacklevel``
    frames up (2: the caller's caller)."""
    warnings.warn(message, IneffectiveSettingWarning, stacklevel=stacklevel + 1)
