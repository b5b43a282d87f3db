"""mixprec.optim.SGD: fused, master-weight SGD with momentum."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch
from torch import Tensor

from .. import ops
from ..amp.notices import warn_ineffective
from ..amp.protocol import StepScalars
from . import _quant8 as q8
from . import _sr
from ._base import Bucket, FusedOptimizer, coded_states, params_and_kwargs_check
from ._state8 import EightBitState, check_state_bits, split_coded

__all__ = ["SGD", "SGD8bit"]


class SGD(EightBitState, FusedOptimizer):
    """SGD (momentum, dampening, Nesterov, weight decay) in one fused kernel.

    A drop-in for :class:`torch.optim.SGD`: same arguments, defaults and
    behaviour, and with float32 params the same update as
    ``torch.optim.SGD(foreach=False)``. Like :class:`~mixprec.optim.Adam` it
    takes float32/float16/bfloat16 params (``master_weights=True`` keeps float32
    masters for 16-bit ones), grads of any of those dtypes, stochastic rounding
    for bfloat16 params without masters, GradScaler's ``grad_scale`` and
    ``found_inf`` (skip on the device, no sync) and a ``clip_coef``.

    State per param: ``momentum_buffer`` (float32, when momentum != 0) as in
    torch, plus ``step`` (float32 count on the param's device; the buffer starts
    as a copy of the grad on the first step that is not skipped) and
    ``master_param``.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (float >= 0, or a one-element tensor). Default 1e-3.
        momentum: momentum factor >= 0. Default 0.
        dampening: dampening of the momentum. Default 0.
        weight_decay: L2 penalty >= 0. Default 0.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening 0).
        maximize: maximize the objective. Default False.
        foreach, fused: accepted for compatibility and ignored (always fused).
        capturable: accepted; steps are always capturable.
        differentiable: must be False.
        master_weights, stochastic_rounding, seed, state_bits, min_8bit_size: as
            :class:`~mixprec.optim.Adam` (8 bits: the momentum buffer, signed code).
    """

    STATE = (("momentum_buffer", "momentum", q8.SIGNED),)
    REQUIRED_OPTIONS = ("momentum", "dampening", "nesterov")
    STEP_OPTIONAL = True  # (torch's SGD keeps only momentum_buffer)
    #: the 8-bit momentum (EightBitState): name, maxima's name, code table
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
    ) -> None:
        params_and_kwargs_check(type(self).__name__, lr, differentiable,
                                [("momentum", momentum), ("weight_decay", weight_decay)])
        check_state_bits(type(self).__name__, state_bits, min_8bit_size)
        if state_bits == 8 and momentum == 0:
            warn_ineffective(
                f"mixprec.optim.{type(self).__name__}: state_bits=8 without momentum stores "
                "nothing in 8 bits (SGD keeps no state then); pass momentum > 0, or use "
                "mixprec.optim.SGD with state_bits=32", stacklevel=3)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"mixprec.optim.{type(self).__name__}: Nesterov momentum requires a "
                             f"momentum and zero dampening, got momentum={momentum}, "
                             f"dampening={dampening}")
        defaults: Dict[str, Any] = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": False,
            "fused": fused,
            "capturable": capturable,
            "master_weights": master_weights,
            "stochastic_rounding": stochastic_rounding,
            "seed": int(seed),
            "state_bits": int(state_bits),
            "min_8bit_size": int(min_8bit_size),
        }
        super().__init__(params, defaults)

    def _default_step(self, saved: Dict[str, Any], p: Tensor) -> Tensor:
        # A torch SGD state has no step: a stored buffer means steps were taken.
        taken = 1.0 if isinstance(saved.get("momentum_buffer"), Tensor) else 0.0
        return torch.full((), taken, dtype=torch.float32, device=p.device)

    def _run(self, bucket: Bucket, group: Dict[str, Any], scalars: StepScalars,
             args: Dict[str, Any]) -> None:
        args.update(momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                    nesterov=bool(group["nesterov"]))
        coded = None
        if group.get("state_bits", 32) == 8:  # (a 32-bit group has nothing to split)
            coded, bucket = split_coded(bucket, "momentum_buffer")
        sr_coded, sr_rest = _sr.bucket_bases(coded, bucket)
        if coded is not None:  # the 8-bit params: one fused_sgd8_
            ops.fused_sgd8_(
                params=coded["params"], grads=coded["grads"],
                momentum_buffers=coded["momentum_buffer"],
                momentum_absmax=coded["momentum_buffer_absmax"],
                master_params=coded["master_params"], state_steps=coded["state_steps"],
                sr_bases=sr_coded, **vars(scalars), **args)
        if bucket["params"]:
            ops.fused_sgd_(
                params=bucket["params"], grads=bucket["grads"],
                momentum_buffers=bucket.get("momentum_buffer", []),
                master_params=bucket["master_params"], state_steps=bucket["state_steps"],
                sr_bases=sr_rest, **vars(scalars), **args)


class SGD8bit(SGD):
    """:class:`SGD` with ``state_bits=8`` (a block-wise 8-bit momentum buffer), the name
    bitsandbytes uses. Every other argument as :class:`SGD`."""

    def __init__(self, params: Any, *args: Any, state_bits: int = 8, **kwargs: Any) -> None:
        super().__init__(params, *args, state_bits=state_bits, **kwargs)
