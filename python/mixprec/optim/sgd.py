"""mixprec.optim.SGD: fused, master-weight SGD with momentum."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from torch import Tensor

from .. import ops
from .._step import StepScalars, warn_ineffective
from . import _quant8 as q8
from ._base import Bucket, FusedOptimizer, coded_states, params_and_kwargs_check
from ._masters import check_bits
from ._state8 import EightBitState

__all__ = ["SGD", "SGD8bit"]


class SGD(EightBitState, FusedOptimizer):
    """SGD (momentum, dampening, Nesterov, weight decay) in one fused kernel.

    A drop-in for :class:`torch.optim.SGD` (with float32 params the update of
    ``torch.optim.SGD(foreach=False)``). Like :class:`~mixprec.optim.Adam`: 16-bit params
    with float32 masters, grads of any float dtype, stochastic rounding, GradScaler's
    scalars read on the device. State per param: ``momentum_buffer`` (float32, when
    momentum != 0; a copy of the grad at the first step not skipped), ``step`` (float32,
    on the param's device) and ``master_param`` (or ``master_correction``).

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (float >= 0, or a one-element tensor). Default 1e-3.
        momentum: momentum factor >= 0. Default 0.
        dampening: dampening of the momentum. Default 0.
        weight_decay: L2 penalty >= 0. Default 0.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening 0).
        maximize: maximize the objective. Default False.
        foreach, fused, capturable: accepted and ignored (always fused and capturable).
        differentiable: must be False.
        master_weights, stochastic_rounding, seed, state_bits, min_8bit_size,
            master_correction_bits: as :class:`~mixprec.optim.Adam` (8 bits: the momentum
            buffer, signed code).
    """

    STATE = (("momentum_buffer", "momentum", q8.SIGNED),)
    REQUIRED_OPTIONS = ("momentum", "dampening", "nesterov")
    STEP_OPTIONAL = True  # (torch's SGD keeps only momentum_buffer)
    _MOMENTS8 = coded_states(STATE)

    def __init__(
        self,
        params: Any,
        lr: Union[float, Tensor] = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        capturable: bool = False,
        master_weights: bool = True,
        stochastic_rounding: bool = False,
        seed: int = 0,
        state_bits: int = 32,
        min_8bit_size: int = 4096,
        master_correction_bits: Optional[int] = None,
    ) -> None:
        cls = type(self).__name__
        params_and_kwargs_check(cls, lr, differentiable, state_bits, min_8bit_size,
                                [("momentum", momentum), ("weight_decay", weight_decay)])
        check_bits(f"mixprec.optim.{cls}", master_correction_bits)
        if state_bits == 8 and momentum == 0:
            warn_ineffective(
                f"mixprec.optim.{cls}: state_bits=8 without momentum stores "
                "nothing in 8 bits (SGD keeps no state then); pass momentum > 0, or use "
                "mixprec.optim.SGD with state_bits=32", stacklevel=3)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"mixprec.optim.{cls}: Nesterov momentum requires a "
                             f"momentum and zero dampening, got momentum={momentum}, "
                             f"dampening={dampening}")
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
            nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=False,
            fused=fused, capturable=capturable, master_weights=master_weights,
            stochastic_rounding=stochastic_rounding, seed=int(seed),
            state_bits=int(state_bits), min_8bit_size=int(min_8bit_size),
            master_correction_bits=master_correction_bits)
        super().__init__(params, defaults)

    def _run(self, bucket: Bucket, group: Dict[str, Any], scalars: StepScalars,
             args: Dict[str, Any]) -> None:
        args.update(momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                    nesterov=bool(group["nesterov"]))
        self._run_split(bucket, group, scalars, args,
                        ops.fused_sgd8_, dict(momentum_buffers="momentum_buffer",
                                              momentum_absmax="momentum_buffer_absmax"),
                        ops.fused_sgd_, dict(momentum_buffers="momentum_buffer"))


class SGD8bit(SGD):
    """:class:`SGD` with ``state_bits=8`` (a block-wise 8-bit momentum buffer), the name
    bitsandbytes uses. Every other argument as :class:`SGD`."""

    def __init__(self, params: Any, *args: Any, state_bits: int = 8, **kwargs: Any) -> None:
        super().__init__(params, *args, state_bits=state_bits, **kwargs)
