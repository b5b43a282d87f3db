"""The warning category of a setting that has no effect (a pattern matching no module, an
option with nothing to act on). Filter with ``warnings.filterwarnings("ignore",
category=mixprec.amp.notices.IneffectiveSettingWarning)``, or make it an error. Both live in
:mod:`mixprec._step` (below :mod:`mixprec.optim`, which raises it too).
"""

from __future__ import annotations

from .._step import IneffectiveSettingWarning, warn_ineffective

__all__ = ["IneffectiveSettingWarning", "warn_ineffective"]
