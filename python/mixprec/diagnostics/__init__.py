"""Numerical health checks of a model: is it safe in float16, where does it overflow.

:mod:`.health` holds :func:`check_fp16_safe`, :func:`health_report` and
:func:`compare_precisions`. What the installed build contains is printed by
``python -m mixprec.info``.
"""

from __future__ import annotations

from .health import HealthReport, ParamHealth, check_fp16_safe, compare_precisions, health_report

__all__ = ["check_fp16_safe", "health_report", "HealthReport", "ParamHealth", "compare_precisions"]
