"""Fused master-weight optimizers: :class:`AdamW`, :class:`Adam`, :class:`SGD`.

Drop-ins for their ``torch.optim`` namesakes that also take float16/bfloat16 params (with
float32 masters by default, or split ones: ``master_correction_bits``,
:func:`decode_master`), grads of any float dtype, stochastic rounding, and
GradScaler's scalars read on the device: one fused kernel per step, no host sync.
:func:`release_gradients` steps the params during backward instead, freeing each gradient.
"""

from __future__ import annotations

from ._base import FusedOptimizer
from ._checkpoint import check_checkpoint
from ._masters import decode_master
from .adam import Adam, Adam8bit, AdamW, AdamW8bit
from .release import GradientRelease, release_gradients
from .sgd import SGD, SGD8bit

__all__ = ["Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit", "FusedOptimizer",
           "check_checkpoint", "release_gradients", "GradientRelease", "decode_master"]
