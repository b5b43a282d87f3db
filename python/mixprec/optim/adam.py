"""mixprec.optim.Adam and mixprec.optim.AdamW: fused, master-weight Adam."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _dtensor, ops
from ..ops import _quant8 as q8
from ..ops import _reference
from . import flat as _flat
from ._base import Bucket, FusedOptimizer, params_and_kwargs_check

__all__ = ["Adam", "AdamW", "Adam8bit", "AdamW8bit"]

#: what a quantized param's state records under "quant": the tables (exp_avg signed,
#: exp_avg_sq unsigned, mixprec.ops._quant8) and the block size
QUANT = "dynamic8/b256"
_MOMENTS = (("exp_avg", "exp_avg_absmax", q8.SIGNED),
            ("exp_avg_sq", "exp_avg_sq_absmax", q8.UNSIGNED))


def _beta(cls: str, index: int, value: Union[float, Tensor]) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"mixprec.optim.{cls}: betas[{index}] as a tensor must have one "
                             "element")
        value = float(value.detach().cpu())  # read once, at construction
    if not 0.0 <= value < 1.0:
        raise ValueError(f"mixprec.optim.{cls}: betas[{index}] must be in [0, 1), got {value}")
    return float(value)


class Adam(FusedOptimizer):
    """Adam (and, with ``decoupled_weight_decay=True``, AdamW) in one fused kernel.

    A drop-in for :class:`torch.optim.Adam`: same arguments, defaults, param
    groups, ``add_param_group``, ``zero_grad``, ``maximize`` and ``amsgrad``,
    and with float32 params the same update as ``torch.optim.Adam(foreach=False)``
    (operation by operation; within float rounding of torch's own kernels).

    In addition:

    * params may be float32, float16 or bfloat16, mixed. For 16-bit params,
      ``master_weights=True`` (default) keeps a float32 master in
      ``state[p]["master_param"]``; the update runs on it and the param receives
      it rounded to nearest. Moments are always float32.
    * grads may be float32, float16 or bfloat16 (any of them for any param);
      they are read, never written.
    * ``stochastic_rounding=True`` rounds bfloat16 params that have no master
      (``master_weights=False``) stochastically, from a counter-based hash of
      (``seed``, step, element): reproducible bit for bit, also across a
      save/load.
    * GradScaler integration without host syncs (``_step_supports_amp_scaling``):
      the grads are unscaled in the kernel and a step with ``found_inf`` set
      changes nothing, step counts included. See :meth:`step`.
    * step counts and lr live on the param's device, so every step is
      capturable (``capturable`` is accepted for compatibility; it is always
      in effect). For CUDA-graph replays with a changing lr, pass ``lr`` as a
      one-element float32/float64 tensor on the params' device and update it in
      place.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (float >= 0, or a one-element tensor). Default 1e-3.
        betas: (beta1, beta2), each in [0, 1). Default (0.9, 0.999).
        eps: added to the denominator. Default 1e-8.
        weight_decay: L2 penalty (Adam) or decoupled decay (AdamW). Default 0.
        amsgrad: use the AMSGrad variant. Default False.
        maximize: maximize the objective. Default False.
        foreach, fused: accepted for compatibility and ignored (always fused).
        capturable: accepted; steps are always capturable.
        differentiable: must be False.
        decoupled_weight_decay: AdamW's decay. Default False.
        master_weights: keep float32 masters for 16-bit params. Default True.
        stochastic_rounding: stochastic rounding of bf16 params without masters.
        seed: stochastic-rounding seed (int). Default 0.
        state_bits: 32 (default) or 8: block-wise 8-bit moments (one byte per element
            and one float32 maximum per block of 256, ``mixprec.ops._quant8``) for params
            of at least ``min_8bit_size`` elements; smaller ones keep float32 moments.
            Not with ``amsgrad``, flat buffers or DTensor params (yet). The 8-bit step
            runs the pure-PyTorch reference for now (no fused kernel yet).
        min_8bit_size: the size threshold of ``state_bits=8``. Default 4096.
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
    ) -> None:
        cls = type(self).__name__
        params_and_kwargs_check(cls, lr, differentiable,
                                [("eps", eps), ("weight_decay", weight_decay)])
        if state_bits not in (8, 32):
            raise ValueError(f"mixprec.optim.{cls}: state_bits must be 8 or 32, got "
                             f"{state_bits!r}")
        if state_bits == 8 and amsgrad:
            raise ValueError(f"mixprec.optim.{cls}: amsgrad=True needs state_bits=32")
        if not (isinstance(min_8bit_size, int) and min_8bit_size >= 0):
            raise ValueError(f"mixprec.optim.{cls}: min_8bit_size must be an int >= 0, got "
                             f"{min_8bit_size!r}")
        b1, b2 = _beta(cls, 0, betas[0]), _beta(cls, 1, betas[1])
        defaults: Dict[str, Any] = {
            "lr": lr,
            "betas": (b1, b2),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": False,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
            "master_weights": master_weights,
            "stochastic_rounding": stochastic_rounding,
            "seed": int(seed),
            "state_bits": int(state_bits),
            "min_8bit_size": int(min_8bit_size),
        }
        super().__init__(params, defaults)

    def _decoupled(self, group: Dict[str, Any]) -> bool:
        return bool(group.get("decoupled_weight_decay", False))

    def _state_names(self, group: Dict[str, Any]) -> List[str]:
        names = ["exp_avg", "exp_avg_sq"]
        if group["amsgrad"]:
            names.append("max_exp_avg_sq")
        if group.get("state_bits", 32) == 8:
            names += ["exp_avg_absmax", "exp_avg_sq_absmax"]
        return names

    # -- 8-bit moments ------------------------------------------------------------

    def _quantized(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p``'s moments are 8-bit (``state_bits=8`` and big enough)."""
        return group.get("state_bits", 32) == 8 and p.numel() >= group.get("min_8bit_size",
                                                                             4096)

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        if group.get("state_bits", 32) != 8:
            return super()._init_state(p, group)
        cls = type(self).__name__
        if _dtensor.is_dtensor(p):
            raise RuntimeError(f"mixprec.optim.{cls}: state_bits=8 does not take DTensor "
                               "(FSDP2) params yet; use state_bits=32")
        if _flat.any_flat([p]):
            raise RuntimeError(f"mixprec.optim.{cls}: state_bits=8 does not combine with "
                               "flat buffers yet; use state_bits=32 or no flat_buffers")
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if state.get("exp_avg") is None:
            if self._quantized(p, group):
                for name, absname, table in _MOMENTS:
                    state[name], state[absname] = q8.quantize(
                        torch.zeros(p.shape, device=p.device), table)
                state["quant"] = QUANT
            else:  # small: float32 moments, empty maxima (one list per name in the op)
                for name, absname, _ in _MOMENTS:
                    state[name] = torch.zeros_like(p, dtype=torch.float32,
                                                   memory_format=torch.preserve_format)
                    state[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self._wants_master(p, group) and state.get("master_param") is None:
            state["master_param"] = p.detach().to(torch.float32, copy=True)
        return state

    def _convert_state(self, p: Tensor, group: Dict[str, Any],
                       saved: Dict[str, Any]) -> Dict[str, Any]:
        out = super()._convert_state(p, group, saved)
        coded = isinstance(out.get("exp_avg"), Tensor) and out["exp_avg"].dtype == torch.uint8
        if coded:  # an 8-bit checkpoint: read the moments back
            moments = {name: q8.dequantize(out[name], out[absname], table)
                       for name, absname, table in _MOMENTS}
        else:
            moments = {name: out.get(name) for name, _, _ in _MOMENTS}
        for _name, absname, _ in _MOMENTS:
            out.pop(absname, None)
        out.pop("quant", None)
        if group.get("state_bits", 32) != 8:
            out.update({k: v for k, v in moments.items() if v is not None})
            return out
        for name, absname, table in _MOMENTS:
            m = moments[name]
            if m is None:
                m = torch.zeros(p.shape, device=p.device)
            if self._quantized(p, group):
                out[name], out[absname] = q8.quantize(m, table)
            else:
                out[name] = m.float()
                out[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self._quantized(p, group):
            out["quant"] = QUANT
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As :meth:`FusedOptimizer.load_state_dict`; moments are converted to this
        optimizer's ``state_bits`` (a 32-bit checkpoint, mixprec's or torch's, loads into
        an 8-bit optimizer and the other way round), which each group keeps. An 8-bit
        entry is checked before anything is loaded: ValueError naming it otherwise."""
        self._check_coded(state_dict)
        bits = [g.get("state_bits", 32) for g in self.param_groups]
        super().load_state_dict(state_dict)
        for g, b in zip(self.param_groups, bits):
            g["state_bits"] = b
        # (super converted with the saved groups' state_bits: convert again now)
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for p, st in list(self.state.items()):
            self.state[p] = self._convert_state(p, group_of[id(p)], st)

    def _check_coded(self, state_dict: Dict[str, Any]) -> None:
        cls = type(self).__name__
        params = [p for g in self.param_groups for p in g["params"]]
        keys = [k for g in state_dict.get("param_groups", []) for k in g.get("params", [])]
        index = dict(zip(keys, params))
        for key, st in state_dict.get("state", {}).items():
            codes = st.get("exp_avg") if isinstance(st, dict) else None
            if not (isinstance(codes, Tensor) and codes.dtype == torch.uint8):
                continue
            where = f"mixprec.optim.{cls}.load_state_dict: state[{key!r}]"
            if st.get("quant") != QUANT:
                raise ValueError(f"{where}: unknown 8-bit layout {st.get('quant')!r} "
                                 f"(this version reads {QUANT!r})")
            p = index.get(key)
            n = p.numel() if p is not None else codes.numel()
            for name, absname, _ in _MOMENTS:
                c, a = st.get(name), st.get(absname)
                if not (isinstance(c, Tensor) and c.dtype == torch.uint8 and c.numel() == n
                        and (p is None or c.shape == p.shape)):
                    raise ValueError(f"{where}[{name!r}]: expected uint8 codes of "
                                     f"{n} elements, got {getattr(c, 'dtype', c)} of shape "
                                     f"{list(getattr(c, 'shape', []))}")
                if not (isinstance(a, Tensor) and a.dtype == torch.float32
                        and tuple(a.shape) == (q8.num_blocks(n),)):
                    raise ValueError(f"{where}[{absname!r}]: expected float32 of shape "
                                     f"[{q8.num_blocks(n)}], got {getattr(a, 'dtype', a)} "
                                     f"of shape {list(getattr(a, 'shape', []))}")

    def _run(self, bucket: Bucket, group: Dict[str, Any], lr: Tensor,
             scalars: Dict[str, Optional[Tensor]], seed: int) -> None:
        if group.get("state_bits", 32) == 8:
            coded = [c.dtype == torch.uint8 for c in bucket["exp_avg"]]
            if any(coded):
                self._run8(bucket, group, lr, scalars, seed, coded)
                if all(coded):
                    return
                bucket = {k: [t for t, c in zip(v, coded) if not c] if v else v
                          for k, v in bucket.items()}
        beta1, beta2 = group["betas"]
        masters = bucket["master_params"]
        ops.fused_adam_(
            bucket["params"],
            bucket["grads"],
            bucket["exp_avg"],
            bucket["exp_avg_sq"],
            bucket.get("max_exp_avg_sq", []),
            masters,
            bucket["state_steps"],
            lr,
            float(beta1),
            float(beta2),
            float(group["weight_decay"]),
            float(group["eps"]),
            bool(group["amsgrad"]),
            bool(group["maximize"]),
            self._decoupled(group),
            scalars["grad_scale"],
            scalars["found_inf"],
            scalars["clip_coef"],
            bool(group.get("stochastic_rounding", False)) and not masters,
            seed,
        )


    def _run8(self, bucket: Bucket, group: Dict[str, Any], lr: Tensor,
              scalars: Dict[str, Optional[Tensor]], seed: int, coded: List[bool]) -> None:
        """The 8-bit part of a bucket: ``fused_adam8_`` (the pure-PyTorch reference)."""
        pick = [k for k, c in enumerate(coded) if c]

        def sub(name: str) -> List[Tensor]:
            lst = bucket.get(name, [])
            return [lst[k] for k in pick] if lst else []

        beta1, beta2 = group["betas"]
        masters = sub("master_params")
        _reference.fused_adam8_(
            sub("params"), sub("grads"), sub("exp_avg"), sub("exp_avg_absmax"),
            sub("exp_avg_sq"), sub("exp_avg_sq_absmax"), masters, sub("state_steps"), lr,
            float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]),
            bool(group["maximize"]), self._decoupled(group), scalars["grad_scale"],
            scalars["found_inf"], scalars["clip_coef"],
            bool(group.get("stochastic_rounding", False)) and not masters, seed)


class AdamW(Adam):
    """AdamW (decoupled weight decay) in one fused kernel; a drop-in for
    :class:`torch.optim.AdamW` (``weight_decay`` default 1e-2).

    Everything else is as :class:`Adam` (masters, grad dtypes, stochastic
    rounding, GradScaler integration, capturable steps).
    """

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
    ) -> None:
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
            capturable=capturable, differentiable=differentiable, fused=fused,
            decoupled_weight_decay=True, master_weights=master_weights,
            stochastic_rounding=stochastic_rounding, seed=seed, state_bits=state_bits,
            min_8bit_size=min_8bit_size,
        )

    def _decoupled(self, group: Dict[str, Any]) -> bool:
        return True

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
