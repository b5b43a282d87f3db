"""mixprec.optim.Adam and mixprec.optim.AdamW: fused, master-weight Adam."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from torch import Tensor

from .. import ops
from .._step import StepScalars
from . import _quant8 as q8
from ._base import Bucket, FusedOptimizer, coded_states, params_and_kwargs_check
from ._masters import check_bits
from ._state8 import EightBitState

__all__ = ["Adam", "AdamW", "Adam8bit", "AdamW8bit"]


def _beta(cls: str, index: int, value: Union[float, Tensor]) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"mixprec.optim.{cls}: Invalid beta parameter at index {index}: "
                             "a tensor beta must be 1-element")
        value = float(value.detach().cpu())  # read once, at construction
    if not 0.0 <= value < 1.0:
        raise ValueError(f"mixprec.optim.{cls}: Invalid beta parameter at index {index}: "
                         f"{value} (must be in [0, 1))")
    return float(value)


class Adam(EightBitState, FusedOptimizer):
    """Adam (and, with ``decoupled_weight_decay=True``, AdamW) in one fused kernel.

    A drop-in for :class:`torch.optim.Adam` (arguments, defaults, param groups, ``maximize``,
    ``amsgrad``; with float32 params the update of ``torch.optim.Adam(foreach=False)``,
    within float rounding). In addition:

    * params may be float32, float16 or bfloat16, mixed; ``master_weights=True`` keeps a
      float32 master of each 16-bit param in ``state[p]["master_param"]``, updated and
      rounded to nearest into the param. Moments are float32.
    * grads may be float32, float16 or bfloat16; they are read, never written.
    * ``stochastic_rounding=True`` rounds bfloat16 params without a master stochastically
      from a hash of (``seed``, step, element): reproducible, also across a save/load.
    * GradScaler without host syncs: grads are unscaled in the kernel and a step with
      ``found_inf`` set changes nothing, step counts included (see :meth:`step`).
    * step counts and lr live on the param's device: every step is capturable. For graph
      replays with a changing lr, pass ``lr`` as a one-element float32/float64 tensor on
      the params' device and update it in place.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (float >= 0, or a one-element tensor). Default 1e-3.
        betas: (beta1, beta2), each in [0, 1). Default (0.9, 0.999).
        eps: added to the denominator. Default 1e-8.
        weight_decay: L2 penalty (Adam) or decoupled decay (AdamW). Default 0.
        amsgrad: use the AMSGrad variant. Default False.
        maximize: maximize the objective. Default False.
        foreach, fused, capturable: accepted and ignored (always fused and capturable).
        differentiable: must be False.
        decoupled_weight_decay: AdamW's decay. Default False.
        master_weights: keep float32 masters for 16-bit params. Default True.
        stochastic_rounding: stochastic rounding of bf16 params without masters.
        seed: stochastic-rounding seed (int). Default 0.
        state_bits: 32 (default) or 8: block-wise 8-bit moments (a byte per element, a
            float32 maximum per block of 256, ``mixprec.optim._quant8``) for params of
            two or more dims and ``min_8bit_size`` elements, stepped by one
            ``fused_adam8_`` per bucket. Not with ``amsgrad``. FSDP2: see
            ``docs/distributed.md``.
        min_8bit_size: the size threshold of ``state_bits=8``. Default 4096.
        master_correction_bits: None (default): float32 masters. 16 or 8: split masters,
            the master of a bfloat16 param kept as the param plus a 16-bit correction
            (``state[p]["master_correction"]``, int16: float32 master semantics, exact but
            for the float32 midpoints RNE rounds to an even param from the side away from
            zero, off by one float32 ulp) or an 8-bit one (int8, "24-bit masters": within
            2^-8 of a bf16 ulp); 2 or 1 byte per param instead of 4. With
            ``master_weights=True`` only; float32 params keep no master; float16 params are
            refused (ValueError). See ``docs/optimizers.md``.
    """

    def __init__(
        self,
        params: Any,
        lr: Union[float, Tensor] = 1e-3,
        betas: Tuple[Union[float, Tensor], Union[float, Tensor]] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        decoupled_weight_decay: bool = False,
        master_weights: bool = True,
        stochastic_rounding: bool = False,
        seed: int = 0,
        state_bits: int = 32,
        min_8bit_size: int = 4096,
        master_correction_bits: Optional[int] = None,
    ) -> None:
        cls = type(self).__name__
        params_and_kwargs_check(cls, lr, differentiable, state_bits, min_8bit_size,
                                [("eps", eps), ("weight_decay", weight_decay)])
        check_bits(f"mixprec.optim.{cls}", master_correction_bits)
        if state_bits == 8 and amsgrad:
            raise ValueError(f"mixprec.optim.{cls}: amsgrad=True needs state_bits=32")
        b1, b2 = _beta(cls, 0, betas[0]), _beta(cls, 1, betas[1])
        defaults = dict(
            lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
            maximize=maximize, foreach=foreach, capturable=capturable, differentiable=False,
            fused=fused, decoupled_weight_decay=decoupled_weight_decay,
            master_weights=master_weights, stochastic_rounding=stochastic_rounding,
            seed=int(seed), state_bits=int(state_bits), min_8bit_size=int(min_8bit_size),
            master_correction_bits=master_correction_bits)
        super().__init__(params, defaults)

    REQUIRED_OPTIONS = ("betas", "eps")
    STATE = (("exp_avg", None, q8.SIGNED), ("exp_avg_sq", None, q8.UNSIGNED),
             ("max_exp_avg_sq", "amsgrad", None))
    _MOMENTS8 = coded_states(STATE)

    def _run(self, bucket: Bucket, group: Dict[str, Any], scalars: StepScalars,
             args: Dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        args.update(beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                    decoupled_weight_decay=isinstance(self, AdamW)
                    or bool(group.get("decoupled_weight_decay", False)))
        moments = dict(exp_avgs="exp_avg", exp_avg_sqs="exp_avg_sq")
        self._run_split(bucket, group, scalars, args,
                        ops.fused_adam8_, dict(moments, exp_avg_absmax="exp_avg_absmax",
                                               exp_avg_sq_absmax="exp_avg_sq_absmax"),
                        ops.fused_adam_, dict(moments, max_exp_avg_sqs="max_exp_avg_sq"),
                        amsgrad=bool(group["amsgrad"]))


class AdamW(Adam):
    """AdamW (decoupled weight decay) in one fused kernel; a drop-in for
    :class:`torch.optim.AdamW` (``weight_decay`` default 1e-2). Otherwise as :class:`Adam`."""

    def __init__(
        self,
        params: Any,
        lr: Union[float, Tensor] = 1e-3,
        betas: Tuple[Union[float, Tensor], Union[float, Tensor]] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        master_weights: bool = True,
        stochastic_rounding: bool = False,
        seed: int = 0,
        state_bits: int = 32,
        min_8bit_size: int = 4096,
        master_correction_bits: Optional[int] = None,
    ) -> None:
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
            capturable=capturable, differentiable=differentiable, fused=fused,
            decoupled_weight_decay=True, master_weights=master_weights,
            stochastic_rounding=stochastic_rounding, seed=seed, state_bits=state_bits,
            min_8bit_size=min_8bit_size, master_correction_bits=master_correction_bits)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True


class Adam8bit(Adam):
    """:class:`Adam` with ``state_bits=8`` (block-wise 8-bit moments), the name
    bitsandbytes and torchao use. Every other argument as :class:`Adam`."""

    def __init__(self, params: Any, *args: Any, state_bits: int = 8, **kwargs: Any) -> None:
        super().__init__(params, *args, state_bits=state_bits, **kwargs)


class AdamW8bit(AdamW):
    """:class:`AdamW` with ``state_bits=8`` (block-wise 8-bit moments), the name
    bitsandbytes and torchao use. Every other argument as :class:`AdamW`."""

    def __init__(self, params: Any, *args: Any, state_bits: int = 8, **kwargs: Any) -> None:
        super().__init__(params, *args, state_bits=state_bits, **kwargs)
