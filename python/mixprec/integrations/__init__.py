"""Glue between mixprec and the training frameworks (guide: ``docs/frameworks.md``).

Each submodule imports its framework and is imported only when asked for:
``import mixprec`` never imports Lightning, Accelerate or Transformers.

* :mod:`mixprec.integrations.lightning`: Lightning precision plugins under which
  ``gradient_clip_val`` works with mixprec's optimizers (``precision_plugin``).

The HF Trainer and Accelerate need no glue: pass mixprec's optimizers as any other
(``docs/frameworks.md`` says how, and what differs).
"""

from __future__ import annotations

__all__: list = []
