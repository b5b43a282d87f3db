"""One strategy object per :class:`MixedPrecisionMode`: what differs between the modes.

:class:`MixedPrecisionManager <mixprec.train.manager.MixedPrecisionManager>` asks its strategy
(dtypes, loss scaling, model/optimizer preparation, policy, input casts, the ADAPTIVE controller)
instead of testing the mode. ``config.enabled=False`` selects :class:`Disabled` whatever the mode.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from .._dtensor import is_dtensor
from ..amp.autocast import resolve_precision
from ..amp.module_policy import DEFAULT_FP32_MODULES, PrecisionPolicy
from .adaptive import AdaptiveController, PlanHost
from .config import NAME_PREC, PREC_NAME, MixedPrecisionConfig, MixedPrecisionMode, PrecisionLevel

__all__ = ["ModeStrategy", "strategy_for", "PREC_NAME", "NAME_PREC"]


def level_dtype(level: Any, device: torch.device) -> Optional[torch.dtype]:
    """The low-precision dtype of a :class:`PrecisionLevel` on ``device`` (``None``: fp32)."""
    if level is PrecisionLevel.FP16:
        return torch.float16
    if level in (PrecisionLevel.BF16, PrecisionLevel.FP8):
        # FP8: the Float8 linears' inputs and the rest of the model are in bfloat16
        return torch.bfloat16
    if level is PrecisionLevel.FP32:
        return None
    dtype, _ = resolve_precision(device.type, "auto")
    return dtype


class ModeStrategy:
    """The default behaviour (AUTOMATIC); each mode overrides what differs."""

    #: a restored precision plan (checkpoint) also sets the compute dtype
    dtype_follows_plan: ClassVar[bool] = True

    def __init__(self, config: MixedPrecisionConfig) -> None:
        self.config = config

    # -- dtypes and scaling ------------------------------------------------------------
    def compute_dtype(self, device: torch.device) -> Optional[torch.dtype]:
        """The dtype the model computes in at start (``None``: float32)."""
        return level_dtype(self.config.precision_level, device)

    def eventual_dtype(self, dtype: Optional[torch.dtype],
                       device: torch.device) -> Optional[torch.dtype]:
        """The low dtype the run may use at some point (loss scaling is decided on it)."""
        return dtype

    def loss_scaling(self, eventual: Optional[torch.dtype]) -> bool:
        """Multiply the loss by the scale: ``config.loss_scaling``, by default for float16."""
        if self.config.loss_scaling is not None:
            return self.config.loss_scaling
        return eventual == torch.float16

    def uses_scaler(self) -> bool:
        """Check grads and skip non-finite steps through an enabled GradScaler."""
        return self.config.gradient_scaling

    # -- model ---------------------------------------------------------------------------
    def check(self, model: nn.Module, compute_dtype: Optional[torch.dtype],
              optimizer: Any) -> None:
        """Raise when :meth:`prepare` would refuse ``optimizer`` or ``model`` (to run in
        ``compute_dtype``), before anything is converted (the manager calls it first)."""

    def prepare(self, manager: PlanHost, optimizer: Any) -> Any:
        """Adapt model/optimizer to the mode at setup; returns the optimizer to use."""
        return optimizer

    def policy(self, manager: PlanHost) -> tuple[str, Optional[PrecisionPolicy]]:
        """``(root precision, the policy to put on the model)`` for ``manager``'s plan (the policy
        ``None``: none); the manager stores both. Reads the manager, writes nothing."""
        root = manager.root_precision
        if root is None or root not in NAME_PREC:
            root = PREC_NAME[manager.compute_dtype]
        return root, PrecisionPolicy(precision=root, device_type=manager.device.type,
                                     low_precision_modules=self.low_precision_modules(),
                                     module_precisions=dict(manager.overrides))

    def low_precision_modules(self) -> Optional[tuple[str, ...]]:
        """SELECTIVE: the only modules that run in low precision (``None``: all)."""
        return None

    def input_dtype(self, manager: PlanHost) -> Optional[torch.dtype]:
        """Cast the forward's float32/float64 inputs to this dtype (``None``: leave them)."""
        return None

    def controller(self, manager: PlanHost) -> Optional[AdaptiveController]:
        """The ADAPTIVE controller, or ``None``."""
        return None


class Automatic(ModeStrategy):
    """float32 params; the forward in autocast with the default policy."""


class Selective(ModeStrategy):
    """float32 params; only ``config.selective_layers`` run in low precision."""

    def low_precision_modules(self) -> Optional[tuple[str, ...]]:
        return tuple(self.config.selective_layers)


class Adaptive(ModeStrategy):
    """Like AUTOMATIC, with the :class:`~mixprec.train.adaptive.AdaptiveController`."""

    def eventual_dtype(self, dtype: Optional[torch.dtype],
                       device: torch.device) -> Optional[torch.dtype]:
        # starts in float32 or not; memory pressure may turn low precision on
        return dtype if dtype is not None else resolve_precision(device.type, "auto")[0]

    def controller(self, manager: PlanHost) -> Optional[AdaptiveController]:
        return AdaptiveController(manager)


class Manual(ModeStrategy):
    """16-bit params (norms stay float32), float32 masters in a mixprec optimizer."""

    dtype_follows_plan = False

    def check(self, model: nn.Module, compute_dtype: Optional[torch.dtype],
              optimizer: Any) -> None:
        if compute_dtype is not None:
            check_convertible(optimizer, self.config.optimizer_state_bits)
            check_convertible_params(model, compute_dtype)
            bits = self.config.master_correction_bits
            if bits is not None and compute_dtype == torch.float16:
                raise ValueError(
                    f"MixedPrecisionConfig.master_correction_bits={bits}: the params are "
                    "converted to float16 here, and a split master is a bfloat16 param plus "
                    "a correction (float16's exponent range differs from float32's); compute "
                    "in bfloat16 (precision_level BF16), or set master_correction_bits=None "
                    "(float32 masters)")

    def prepare(self, manager: PlanHost, optimizer: Any) -> Any:
        dtype = manager.compute_dtype
        if dtype is None:
            return optimizer
        masters = convert_params(manager.model, dtype)
        from ..optim._masters import split_master

        bits = self.config.master_correction_bits
        new_opt = to_mixprec_optimizer(optimizer, self.config.master_weights,
                                       self.config.optimizer_state_bits, bits)
        if self.config.master_weights:
            for group in new_opt.param_groups:
                for p in group["params"]:
                    m = masters.get(id(p))
                    state = new_opt.state.get(p, {})
                    if m is None or "master_param" in state or "master_correction" in state:
                        continue
                    if new_opt.master_form(p, group) in (torch.int16, torch.int8):
                        # the param is RNE(m) already (converted above): its correction
                        new_opt.state[p]["master_correction"] = split_master(m, bits)[1]
                    else:
                        new_opt.state[p]["master_param"] = m
        return new_opt

    def policy(self, manager: PlanHost) -> tuple[str, Optional[PrecisionPolicy]]:
        return PREC_NAME[manager.compute_dtype], PrecisionPolicy(
            precision=None, restore_input_dtype=True, device_type=manager.device.type,
            module_precisions=dict(manager.overrides))

    def input_dtype(self, manager: PlanHost) -> Optional[torch.dtype]:
        return manager.compute_dtype


class GradientScaling(ModeStrategy):
    """float32 compute, dynamic loss scaling only."""

    def compute_dtype(self, device: torch.device) -> Optional[torch.dtype]:
        return None

    def loss_scaling(self, eventual: Optional[torch.dtype]) -> bool:
        return self.config.loss_scaling is not False  # None: on

    def policy(self, manager: PlanHost) -> tuple[str, Optional[PrecisionPolicy]]:
        return "fp32", None


class Disabled(GradientScaling):
    """``config.enabled=False``: plain float32 training, no scaler, no policy."""

    def loss_scaling(self, eventual: Optional[torch.dtype]) -> bool:
        return False

    def uses_scaler(self) -> bool:
        return False


_STRATEGIES: dict[MixedPrecisionMode, type[ModeStrategy]] = {
    MixedPrecisionMode.AUTOMATIC: Automatic, MixedPrecisionMode.MANUAL: Manual,
    MixedPrecisionMode.SELECTIVE: Selective, MixedPrecisionMode.ADAPTIVE: Adaptive,
    MixedPrecisionMode.GRADIENT_SCALING: GradientScaling}


def strategy_for(config: MixedPrecisionConfig) -> ModeStrategy:
    """The strategy of ``config`` (:class:`Disabled` when ``config.enabled`` is false)."""
    if not config.enabled:
        return Disabled(config)
    return _STRATEGIES[config.mode](config)  # type: ignore[index]


# ------------------------------------------------------------------------ MANUAL helpers
def _convertible(model: nn.Module, dtype: torch.dtype) -> Any:
    """The floating params :func:`convert_params` converts, module by module."""
    for module in model.modules():
        if isinstance(module, DEFAULT_FP32_MODULES):
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                yield p


def check_convertible_params(model: nn.Module, dtype: torch.dtype) -> None:
    """The refusal of :func:`convert_params` (a sharded model of another dtype), before
    anything is converted."""
    for p in _convertible(model, dtype):
        if is_dtensor(p):
            raise ValueError(
                f"MANUAL mode: the model is sharded (fully_shard) with {p.dtype} params; "
                f"FSDP2 keeps them in its own storage, so convert the model before "
                f"fully_shard: mixprec.train.modes.convert_params(model, {dtype}) "
                f"(what MANUAL mode does: every module but the float32-policy ones "
                f"such as norms), then fully_shard(model), then set up MANUAL mode; "
                f"the optimizer keeps sharded float32 masters")


def convert_params(model: nn.Module, dtype: torch.dtype) -> dict[int, Tensor]:
    """Convert the floating params and buffers of ``model`` to ``dtype``, except in float32-policy
    modules (norms); returns float32 copies of the converted params by ``id`` (the masters). A
    sharded model must come converted: ValueError for a DTensor param of another dtype."""
    check_convertible_params(model, dtype)
    masters: dict[int, Tensor] = {}
    for p in _convertible(model, dtype):  # lazily: a tied param is converted once
        masters[id(p)] = p.detach().to(torch.float32, copy=True)
        p.data = p.data.to(dtype)
    for module in model.modules():
        if isinstance(module, DEFAULT_FP32_MODULES):
            continue
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                setattr(module, name, b.to(dtype))  # (a registered buffer: replaced in place)
    return masters


def _target_class(opt: Any) -> Any:
    from .. import optim as mo

    if isinstance(opt, mo.FusedOptimizer):
        return type(opt)
    mapping = {torch.optim.AdamW: mo.AdamW, torch.optim.Adam: mo.Adam, torch.optim.SGD: mo.SGD}
    return mapping.get(type(opt))


def check_convertible(opt: Any, state_bits: int = 32) -> None:
    """Raise when :func:`to_mixprec_optimizer` would refuse ``opt``, before anything is converted:
    TypeError for a class it cannot convert, ValueError for 8-bit state with amsgrad."""
    from .. import optim as mo

    cls = _target_class(opt)
    if cls is None:
        raise TypeError(
            f"MixedPrecisionTrainer (MANUAL mode): cannot convert {type(opt).__name__} to a "
            "mixprec master-weight optimizer; pass torch.optim.SGD/Adam/AdamW or a "
            "mixprec.optim optimizer")
    if state_bits == 8 and issubclass(cls, mo.Adam) and any(
            g.get("amsgrad") for g in opt.param_groups):
        raise ValueError("MANUAL mode: optimizer_state_bits=8 needs amsgrad=False")


def to_mixprec_optimizer(opt: torch.optim.Optimizer, master_weights: bool,
                         state_bits: int = 32, master_correction_bits: Optional[int] = None
                         ) -> Any:
    """A mixprec optimizer with ``opt``'s param groups and hyper-parameters (Adam/AdamW with
    ``state_bits``: 8-bit moments for 8; tensors with 32-bit state keep it; every group with
    ``master_correction_bits``). A torch optimizer's
    param-group dicts become the new optimizer's (the same objects, given mixprec's keys), so an
    LR scheduler of ``opt`` still sets the lr the new optimizer uses."""
    from .. import optim as mo

    check_convertible(opt, state_bits)

    def bits(o: Any) -> Any:
        if isinstance(o, mo.Adam):
            for g in o.param_groups:
                g["state_bits"] = state_bits
        return o

    if isinstance(opt, mo.FusedOptimizer):
        for g in opt.param_groups:
            g["master_weights"] = master_weights
            g["master_correction_bits"] = master_correction_bits
        return bits(opt)
    cls = _target_class(opt)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted}
    defaults.pop("differentiable", None)
    saved = opt.state_dict() if opt.state else None
    # keep accepted hyper-parameters and keys torch does not define (initial_lr from a
    # scheduler, user tags); the same dicts (see above)
    groups = opt.param_groups
    for g in groups:
        for k in [k for k in g if k != "params" and k not in accepted and k in opt.defaults]:
            del g[k]
    defaults["master_weights"] = master_weights
    defaults["master_correction_bits"] = master_correction_bits
    new = bits(cls(groups, **defaults))
    if saved is not None:
        new.load_state_dict(saved)  # (torch's load makes new group dicts: share them again)
        for i, (mine, loaded) in enumerate(zip(groups, new.param_groups)):
            mine.update(loaded)
            new.param_groups[i] = mine
    return new
