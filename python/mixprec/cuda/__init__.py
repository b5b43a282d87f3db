"""CUDA-flavoured entry points mirroring ``torch.cuda`` (``mixprec.cuda.amp.GradScaler``)."""

from __future__ import annotations

from . import amp

__all__ = ["amp"]
