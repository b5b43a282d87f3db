"""Precision policies applied to a model: which module runs in which precision.

:func:`apply_policy` puts a :class:`PrecisionPolicy` on a model with forward wrappers over
:class:`torch.autocast` (no op lists copied from torch): chosen module types (default: norms and
losses) or glob names run in float32 with their inputs cast up; optionally only chosen modules
run in low precision (selective); per-module overrides (ADAPTIVE); floating outputs cast to
float32. The :class:`PolicyHandle` it returns undoes everything. Nothing here syncs.
"""

from __future__ import annotations

import fnmatch
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .autocast import PRECISIONS, _first_low_dtype, autocast, cast_floating, resolve_precision

__all__ = ["PrecisionPolicy", "PolicyHandle", "apply_policy", "remove_policy",
           "DEFAULT_FP32_MODULES"]

#: Module types kept in float32 by default: normalization layers and losses.
DEFAULT_FP32_MODULES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.LayerNorm,
    nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm, nn.modules.loss._Loss)


# ----------------------------------------------------------------------- policy
ModuleSpec = Union[str, type]


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which modules of a model run in which precision.

    Module specs (in ``fp32_modules``, ``low_precision_modules`` and the keys of
    ``module_precisions``) are glob patterns over qualified module names as
    :meth:`torch.nn.Module.named_modules` yields them (``"encoder.*.norm"``; ``""`` is the root), a
    class name (``"Linear"``) or a module class (matched with ``isinstance``).

    Attributes:
        precision: precision of the model's forward (``"fp16"``, ``"bf16"``, ``"fp32"``,
            ``"auto"``), the root's :class:`autocast`. ``None``: no root autocast; the policy
            only adjusts the modules below inside whatever autocast the caller enters.
        fp32_types: module types that always run in float32 (autocast off, floating inputs cast
            up). Default :data:`DEFAULT_FP32_MODULES`.
        fp32_modules: more specs that run in float32.
        low_precision_modules: selective mode: when not ``None``, *only* these modules run in
            low precision; every other leaf module runs in float32, its inputs cast up.
        module_precisions: per-module overrides ``{spec: precision}`` (e.g. ``{"fc2": "bf16"}``),
            applied after the rules above; a module promoted to ``"fp32"`` gets its inputs cast up.
        cast_outputs: cast the model's float16/bfloat16 outputs to float32.
        restore_input_dtype: float32 islands cast their floating outputs back to the 16-bit dtype
            their inputs had (needed when the params themselves are 16-bit and no autocast runs, as
            in the trainer's MANUAL mode).
        device_type: device type for autocast; ``None``: the device of the model's first
            parameter or buffer (``"cpu"`` without any).
    """

    precision: Optional[str] = "auto"
    fp32_types: tuple[type, ...] = DEFAULT_FP32_MODULES
    fp32_modules: tuple[ModuleSpec, ...] = ()
    low_precision_modules: Optional[tuple[ModuleSpec, ...]] = None
    module_precisions: dict[str, str] = field(default_factory=dict)
    cast_outputs: bool = True
    restore_input_dtype: bool = False
    device_type: Optional[str] = None

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"PrecisionPolicy: precision must be None or one of {PRECISIONS}, "
                             f"got {self.precision!r}")
        for spec, prec in self.module_precisions.items():
            if prec not in PRECISIONS:
                raise ValueError(f"PrecisionPolicy: module_precisions[{spec!r}] must be one of "
                                 f"{PRECISIONS}, got {prec!r}")
        for name in ("fp32_modules", "low_precision_modules"):
            value = getattr(self, name)
            if value is not None and isinstance(value, (str, type)):
                object.__setattr__(self, name, (value,))  # a single spec
        if not isinstance(self.fp32_types, tuple):
            object.__setattr__(self, "fp32_types", tuple(self.fp32_types))

    def with_overrides(self, overrides: dict[str, str]) -> PrecisionPolicy:
        """A copy with ``overrides`` merged into :attr:`module_precisions`."""
        return replace(self, module_precisions={**self.module_precisions, **overrides})


def _class_name(module: nn.Module) -> str:
    """The name of ``module``'s class; for a module that went through FSDP2's
    ``fully_shard`` (class ``FSDP<Name>``, bases ``(FSDPModule, <Name>)``), its own."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) == 2 and cls.__name__ == "FSDP" + bases[1].__name__:
        cls = bases[1]
    return cls.__name__


def _matches(spec: ModuleSpec, name: str, module: nn.Module) -> bool:
    if isinstance(spec, type):
        return isinstance(module, spec)
    return fnmatch.fnmatchcase(name, spec) or _class_name(module) == spec


def modules_matching(model: nn.Module, spec: ModuleSpec) -> list[str]:
    """The qualified names of ``model``'s modules (the root excluded) that ``spec`` picks,
    as a policy reads it: a glob over the qualified name, a class name or a class."""
    return [name for name, module in model.named_modules()
            if name and _matches(spec, name, module)]


@dataclass(eq=False)
class ModuleForward:
    """The forward installed on a module: runs the original (``prev``, an instance forward it
    replaced, else the class's) in ``ctx``, its inputs of a dtype in ``cast_only`` cast to
    ``cast_inputs_to``. Holds the module, not a closure, so that ``copy.deepcopy`` of a model
    gives a copy whose wrappers call the copy."""

    module: nn.Module
    prev: Optional[Callable[..., Any]]
    ctx: Optional[autocast]
    cast_inputs_to: Optional[torch.dtype] = None
    cast_outputs_to: Optional[torch.dtype] = None
    restore_input_dtype: bool = False
    cast_only: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        in_dtype = _first_low_dtype((args, kwargs)) if self.restore_input_dtype else None
        if self.cast_inputs_to is not None:
            args = cast_floating(args, self.cast_inputs_to, self.cast_only)
            kwargs = cast_floating(kwargs, self.cast_inputs_to, self.cast_only)
        forward = self.prev
        if forward is None:
            forward = partial(type(self.module).forward, self.module)
        with self.ctx if self.ctx is not None else nullcontext():
            out = forward(*args, **kwargs)
        if in_dtype is not None:
            out = cast_floating(out, in_dtype, only=(torch.float32,))
        elif self.cast_outputs_to is not None:
            out = cast_floating(out, self.cast_outputs_to)
        return out


def wrap_forward(installed: list[Any], module: nn.Module, wrapper: Callable[..., Any]) -> None:
    """Set ``module.forward`` (an instance attribute) to ``wrapper``, recording in ``installed``
    what :func:`unwrap_forwards` restores."""
    installed.append((module, "forward" in module.__dict__, module.__dict__.get("forward")))
    module.forward = wrapper  # type: ignore[method-assign]


def unwrap_forwards(installed: list[Any]) -> None:
    """Undo the :func:`wrap_forward` calls recorded in ``installed``, newest first; empties it."""
    for module, had, prev in reversed(installed):
        if had:
            module.forward = prev
        else:
            module.__dict__.pop("forward", None)
    installed.clear()


class PolicyHandle:
    """What :func:`apply_policy` installed; :meth:`remove` undoes it.

    Attributes:
        model: the model the policy was applied to.
        policy: the policy.
        precisions: ``{qualified module name: "fp16" | "bf16" | "fp32"}`` for every module that got
            a wrapper (the root is ``""``): the resolved plan.
    """

    def __init__(self, model: nn.Module, policy: PrecisionPolicy) -> None:
        self.model = model
        self.policy = policy
        self.precisions: dict[str, str] = {}
        self._installed: list[tuple[nn.Module, bool, Any]] = []
        self.removed = False

    def remove(self) -> None:
        """Restore every wrapped module's forward (idempotent)."""
        unwrap_forwards(self._installed)
        if getattr(self.model, "_mixprec_policy", None) is self:
            del self.model._mixprec_policy
        self.removed = True

    def __enter__(self) -> PolicyHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def apply_policy(model: nn.Module, policy: Optional[PrecisionPolicy] = None) -> PolicyHandle:
    """Apply ``policy`` to ``model`` by wrapping module forwards; reversible.

    Wrappers are installed as instance ``forward`` attributes (the class ``forward`` is untouched;
    an existing instance ``forward`` is chained and restored), so hooks, ``state_dict`` and
    parameter identity are unaffected. What each wrapped module does when called:

    * root (``precision`` not ``None``): runs in ``autocast(device_type, precision=...)``;
      with ``low_precision_modules`` set, with autocast *disabled* instead (only the selected
      modules enable it);
    * float32 modules: autocast disabled, float16/bfloat16 inputs (nested too) cast to float32;
    * selective mode: selected modules (and their children) run in autocast with the low dtype;
      every other leaf module is a float32 module as above (so it accepts their outputs);
    * overridden modules (``module_precisions``): run in their own autocast;
    * root output: float16/bfloat16 tensors cast to float32 (``cast_outputs``).

    Args:
        model: the module (mutated: forwards wrapped; params/buffers untouched).
        policy: default ``PrecisionPolicy()`` (auto precision, norms and losses in float32,
            outputs float32).

    Returns a :class:`PolicyHandle`; ``handle.remove()`` (or leaving ``with apply_policy(...)``)
    restores the model. A model holds at most one policy: a second raises ``RuntimeError``.
    """
    if getattr(model, "_mixprec_policy", None) is not None:
        raise RuntimeError("apply_policy: this model already has a policy; call handle.remove() "
                           "(or mixprec.remove_policy(model)) first")
    policy = policy if policy is not None else PrecisionPolicy()
    first = next(chain(model.parameters(), model.buffers()), None)
    device_type = policy.device_type or (first.device.type if first is not None else "cpu")
    handle = PolicyHandle(model, policy)
    selective = policy.low_precision_modules is not None
    if policy.precision is not None:
        low_dtype, _ = resolve_precision(device_type, policy.precision)
    else:
        low_dtype = torch.get_autocast_dtype(device_type)

    # the root
    root_ctx: Optional[autocast] = None
    if selective or policy.precision is not None:
        root_ctx = autocast(device_type, precision="fp32" if selective else policy.precision)
        handle.precisions[""] = root_ctx.precision
    selected = {n for s in policy.low_precision_modules or () for n in modules_matching(model, s)}

    def inside_selected(name: str) -> bool:
        return any(name == s or name.startswith(s + ".") for s in selected)

    # below the root, in named_modules order (parents before children)
    for name, module in model.named_modules():
        if name == "":
            continue
        prec: Optional[str] = None
        if isinstance(module, policy.fp32_types) or any(_matches(s, name, module)
                                                        for s in policy.fp32_modules):
            prec = "fp32"
        elif selective:
            if name in selected:
                prec = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(low_dtype, "fp32")
            elif not inside_selected(name) and next(module.children(), None) is None:
                # a float32 leaf outside every selected subtree: cast its inputs
                # up, since they may come from a low-precision module
                prec = "fp32"
        for spec, override in policy.module_precisions.items():
            if _matches(spec, name, module):
                prec = override
        if prec is None:
            continue
        ctx = autocast(device_type, precision=prec)
        is_fp32 = ctx.precision == "fp32"  # autocast off in this region
        handle.precisions[name] = ctx.precision
        wrap_forward(handle._installed, module, ModuleForward(
            module, module.__dict__.get("forward"), ctx,
            cast_inputs_to=torch.float32 if is_fp32 else None,
            restore_input_dtype=is_fp32 and policy.restore_input_dtype))
    if root_ctx is not None or policy.cast_outputs:
        wrap_forward(handle._installed, model, ModuleForward(
            model, model.__dict__.get("forward"), root_ctx,
            cast_outputs_to=torch.float32 if policy.cast_outputs else None))
    model._mixprec_policy = handle  # type: ignore[assignment]
    return handle


def remove_policy(model: nn.Module) -> bool:
    """Remove the policy applied to ``model``, if any; returns whether one was."""
    handle = getattr(model, "_mixprec_policy", None)
    if handle is None:
        return False
    handle.remove()
    return True

