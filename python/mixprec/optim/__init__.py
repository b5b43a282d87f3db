"""Fused master-weight optimizers: :class:`AdamW`, :class:`Adam`, :class:`SGD`.

Drop-ins for their ``torch.optim`` namesakes that also take float16/bfloat16
params (with float32 master weights kept in the optimizer state by default),
grads of any of float32/float16/bfloat16, stochastic rounding for bfloat16
params without masters, and GradScaler's ``grad_scale``/``found_inf`` read on
the device (``_step_supports_amp_scaling``): one fused kernel per step, no
host sync.
"""

from __future__ import annotations

from ._base import FusedOptimizer
from ._checkpoint import check_checkpoint
from .adam import Adam, Adam8bit, AdamW, AdamW8bit
from .sgd import SGD, SGD8bit

__all__ = ["Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit", "FusedOptimizer",
           "check_checkpoint"]
