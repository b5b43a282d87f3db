"""``MixedPrecisionConfig``: everything :class:`mixprec.MixedPrecisionTrainer` needs to know.

A validated dataclass (every error names the field and what was expected), three scale presets, two
enums, and a plain-dict form (``to_dict`` / ``from_dict``) made of str/int/float/bool/None/list
only, so that it round-trips through ``torch.save`` / ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Union

import torch

__all__ = ["MixedPrecisionMode", "PrecisionLevel", "MixedPrecisionConfig", "HandlingAction",
           "PRESETS", "FP8_RECIPES"]


#: compute dtype <-> precision name (``None`` is float32: no low precision)
PREC_NAME: dict[Optional[torch.dtype], str] = {torch.float16: "fp16", torch.bfloat16: "bf16",
                                               None: "fp32"}
NAME_PREC: dict[str, Optional[torch.dtype]] = {v: k for k, v in PREC_NAME.items()}


class MixedPrecisionMode(str, Enum):
    """How the trainer applies low precision.

    * ``AUTOMATIC`` -- float32 params, forward under autocast with the default policy (norms/losses
      in float32); a mixprec GradScaler scales the loss for float16; for bfloat16 no loss scaling,
      but non-finite steps are still detected and skipped.
    * ``MANUAL`` -- params (except float32-policy modules such as norms) converted to
      float16/bfloat16, no autocast; a mixprec master-weight optimizer keeps float32 copies; the
      loss is computed in float32.
    * ``SELECTIVE`` -- float32 params; only ``selective_layers`` run in low precision.
    * ``ADAPTIVE`` -- like AUTOMATIC, and reacts to overflows (promotes the offending modules to
      bfloat16 or float32) and to memory pressure (turns low precision on); decisions are logged.
    * ``GRADIENT_SCALING`` -- float32 compute, dynamic loss scaling only.
    """

    AUTOMATIC = "automatic"
    MANUAL = "manual"
    SELECTIVE = "selective"
    ADAPTIVE = "adaptive"
    GRADIENT_SCALING = "gradient_scaling"


class PrecisionLevel(str, Enum):
    """The low-precision dtype.

    * ``FP16`` -- float16 (loss scaling on by default).
    * ``BF16`` -- bfloat16 (no loss scaling by default).
    * ``FP32`` -- no low precision (ADAPTIVE may still switch it on under memory pressure).
    * ``MIXED`` -- the device's preferred 16-bit type: bfloat16 where supported, else float16 with
      loss scaling, else float32 (``"auto"``).
    * ``DYNAMIC`` -- like ``MIXED`` at start, and the precision may change per module while training
      (what ADAPTIVE does); in the other modes it is the same as ``MIXED``.
    * ``FP8`` -- the eligible ``nn.Linear`` layers computed in float8 by torchao
      (``torchao.float8.convert_to_float8_training``, recipe ``fp8_recipe``), the rest of the model
      in bfloat16 autocast; AUTOMATIC (float32 params) and MANUAL (bfloat16 params, float32 masters)
      only. Needs torchao (``pip install "mixprec[fp8]"``); see ``docs/fp8.md``.
    """

    FP16 = "fp16"
    FP32 = "fp32"
    BF16 = "bf16"
    DYNAMIC = "dynamic"
    MIXED = "mixed"
    FP8 = "fp8"


#: the torchao float8 recipes ``MixedPrecisionConfig.fp8_recipe`` accepts
#: (``torchao.float8.Float8LinearConfig.from_recipe_name``)
FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: the modes the FP8 level runs in
FP8_MODES: tuple[MixedPrecisionMode, ...] = (MixedPrecisionMode.AUTOMATIC,
                                             MixedPrecisionMode.MANUAL)


class HandlingAction(str, Enum):
    """What the trainer does when it sees NaN / overflow / underflow events.

    Whether a non-finite step is *skipped* is decided by ``gradient_scaling`` (on the device, every
    step); these actions decide what is reported, and are applied at log steps (every
    ``logging_frequency`` optimizer steps, the only points where the trainer reads counters back),
    for the events of the steps since the previous log step:

    * ``SKIP`` -- nothing beyond the skip itself and the counters (default for NaN and overflow:
      with dynamic loss scaling occasional overflows are normal).
    * ``WARN`` -- log a warning on logger ``mixprec.trainer``.
    * ``RAISE`` -- raise ``FloatingPointError``.
    * ``IGNORE`` -- same as ``SKIP`` (only counted), for configs that want to say so.
    """

    SKIP = "skip"
    WARN = "warn"
    RAISE = "raise"
    IGNORE = "ignore"


def _enum(cls: type[Enum], name: str, value: Any) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for member in cls:  # type: ignore[attr-defined]
            if value.lower() in (member.value, member.name.lower()):
                return member
    choices = ", ".join(m.name for m in cls)  # type: ignore[attr-defined]
    raise ValueError(f"MixedPrecisionConfig.{name}: expected one of {choices}, got {value!r}")


@dataclass
class MixedPrecisionConfig:
    """Configuration of :class:`mixprec.MixedPrecisionTrainer`.

    Attributes:
        enabled: ``False`` turns every mixed-precision feature off (plain float32 training).
        mode: a :class:`MixedPrecisionMode` (or its name).
        precision_level: a :class:`PrecisionLevel` (or its name).
        gradient_scaling: unscale/check gradients through the GradScaler and skip non-finite
            steps (on the device). Required by ``loss_scaling``.
        loss_scaling: multiply the loss by the scale. ``None`` (default): on exactly when the
            compute dtype is float16 or the mode is GRADIENT_SCALING.
        dynamic_loss_scaling: let the scale grow/back off; ``False`` keeps it at ``initial_scale``.
        initial_scale: starting scale (> 0).
        scale_factor: growth factor (> 1).
        scale_window: clean steps between growths (torch's ``growth_interval``).
        backoff_factor: multiplier on overflow, in (0, 1).
        min_scale, max_scale: scale bounds (``None``: unbounded); ADAPTIVE also treats reaching
            ``min_scale`` as a reason to promote.
        hysteresis: overflows tolerated before a backoff (1 = torch).
        overflow_threshold: ADAPTIVE: fraction of the steps of an evaluation window
            (``logging_frequency`` steps) that overflowed above which the overflowing modules
            are promoted. In [0, 1].
        underflow_threshold: fraction of nonzero scaled gradient elements that would flush to zero
            in the compute dtype above which a step reports ``underflow_detected``. In [0, 1].
        adaptive_threshold: ADAPTIVE: fraction of device memory (CUDA: allocated / total; CPU:
            resident set / physical RAM) above which low precision is turned on. In (0, 1].
        memory_efficiency: free gradients between steps (``zero_grad(set_to_none=True)``).
        performance_monitoring: compute the per-step gradient norm (when not clipping) and underflow
            check, and a saved-activation memory estimate; all on the device, no host sync.
        nan_handling, overflow_handling, underflow_handling: a :class:`HandlingAction` (or its
            name), applied at log steps.
        selective_layers: SELECTIVE (required, non-empty): module specs that run in low
            precision: globs over qualified names (``"features.*"``) or class names (``"Conv2d"``).
        logging_frequency: optimizer steps between log lines (and ADAPTIVE evaluations); each
            costs one host sync. >= 1.
        master_weights: MANUAL: keep float32 master weights in the optimizer.
        optimizer_state_bits: MANUAL: 32 (default) or 8: the moments of the mixprec Adam/AdamW the
            mode swaps in are kept in 8 bits (``state_bits=8``; SGD keeps 32-bit momentum).
        master_correction_bits: MANUAL: None (default): float32 masters; 16 or 8: the
            master of each bfloat16 param kept as the param plus a 16-bit correction (float32
            master semantics, one exception set, see ``docs/optimizers.md``) or an 8-bit one
            ("24-bit masters"): the optimizer's ``master_correction_bits``. Needs
            ``master_weights=True``; refused at setup for float16 compute.
        max_grad_norm: clip the gradient norm to this (fused with the unscale); ``None`` or 0: no
            clipping.
        gradient_accumulation_steps: micro-batches per optimizer step (>= 1).
        fp8_recipe: FP8 level: torchao's scaling recipe, ``"tensorwise"`` (default),
            ``"rowwise"`` or ``"rowwise_with_gw_hp"`` (see ``docs/fp8.md``).
        fp8_keep_first_last: FP8 level: keep the first and the last ``nn.Linear`` (in
            ``named_modules`` order) in bfloat16, as torchao and torchtitan advise. Ignored when a
            ``fp8_module_filter`` is passed to the trainer/manager.
        fp8_fsdp_all_gather: FP8 level: torchao's float8 all-gather under FSDP2
            (``enable_fsdp_float8_all_gather``). Refused for now (``True`` raises).
        gradient_release: step each param during backward, as soon as its gradient exists,
            and free the gradient at once (:func:`mixprec.optim.release_gradients`, in
            buckets with the fused kernels): the gradients of the whole model are never
            alive together, and the bits are those of the run without release. There is no
            GradScaler (``gradient_scaling`` has no effect: non-finite steps are not
            skipped) and no per-step gradient monitoring (``performance_monitoring`` keeps
            only its activation estimate). Refused with float16 compute or
            ``loss_scaling=True`` (an overflow found late would need updates already
            applied undone), ``max_grad_norm`` (the norm needs every gradient first),
            ``gradient_accumulation_steps > 1``, ``capture``, mode ADAPTIVE or
            GRADIENT_SCALING, and (at setup) DDP or an optimizer that is not a mixprec one.
        capture: run each training step through :func:`mixprec.capture_step` (one CUDA graph per
            step, replayed; on CPU the same checks, eager): the trainer's ``train_step`` and
            :meth:`MixedPrecisionManager.make_step`. Refused in ADAPTIVE mode and with
            ``gradient_accumulation_steps > 1``; see ``docs/trainer.md``.
    """

    enabled: bool = True
    mode: Union[MixedPrecisionMode, str] = MixedPrecisionMode.AUTOMATIC
    precision_level: Union[PrecisionLevel, str] = PrecisionLevel.MIXED
    gradient_scaling: bool = True
    loss_scaling: Optional[bool] = None
    dynamic_loss_scaling: bool = True
    initial_scale: float = 2.0**16
    scale_factor: float = 2.0
    scale_window: int = 2000
    backoff_factor: float = 0.5
    min_scale: Optional[float] = 1.0
    max_scale: Optional[float] = 2.0**24
    hysteresis: int = 1
    overflow_threshold: float = 0.5
    underflow_threshold: float = 0.01
    adaptive_threshold: float = 0.9
    memory_efficiency: bool = True
    performance_monitoring: bool = True
    nan_handling: Union[HandlingAction, str] = HandlingAction.SKIP
    overflow_handling: Union[HandlingAction, str] = HandlingAction.SKIP
    underflow_handling: Union[HandlingAction, str] = HandlingAction.WARN
    selective_layers: list[str] = field(default_factory=list)
    logging_frequency: int = 100
    master_weights: bool = True
    optimizer_state_bits: int = 32
    master_correction_bits: Optional[int] = None
    max_grad_norm: Optional[float] = None
    gradient_accumulation_steps: int = 1
    fp8_recipe: str = "tensorwise"
    fp8_keep_first_last: bool = True
    fp8_fsdp_all_gather: bool = False
    capture: bool = False
    gradient_release: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check every field (and turn enum names into members); ``ValueError`` / ``TypeError``
        naming the field."""
        self.mode = _enum(MixedPrecisionMode, "mode", self.mode)
        self.precision_level = _enum(PrecisionLevel, "precision_level", self.precision_level)
        for name in ("nan_handling", "overflow_handling", "underflow_handling"):
            setattr(self, name, _enum(HandlingAction, name, getattr(self, name)))
        for f in dataclasses.fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"MixedPrecisionConfig.{f.name}: expected a bool, got "
                                f"{getattr(self, f.name)!r}")
        bits = self.optimizer_state_bits
        if bits not in (8, 32) or isinstance(bits, bool):
            raise ValueError(
                f"MixedPrecisionConfig.optimizer_state_bits: expected 8 or 32, got {bits!r}")
        split = self.master_correction_bits
        if split is not None and (split not in (8, 16) or not isinstance(split, int)
                                  or isinstance(split, bool)):
            raise ValueError("MixedPrecisionConfig.master_correction_bits: expected None "
                             f"(float32 masters), 16 or 8, got {split!r}")
        if self.master_correction_bits is not None and not self.master_weights:
            raise ValueError(
                f"MixedPrecisionConfig.master_correction_bits={self.master_correction_bits} "
                "needs master_weights=True (it is the form of the masters); set "
                "master_correction_bits=None or master_weights=True")
        if self.loss_scaling is not None and not isinstance(self.loss_scaling, bool):
            raise TypeError(f"MixedPrecisionConfig.loss_scaling: expected None or a bool, got "
                            f"{self.loss_scaling!r}")
        if self.loss_scaling and not self.gradient_scaling:
            raise ValueError("MixedPrecisionConfig.loss_scaling=True needs gradient_scaling=True "
                             "(scaled gradients must be unscaled by the GradScaler)")

        def number(name: str, low: float, high: float, low_open: bool, high_open: bool) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise TypeError(f"MixedPrecisionConfig.{name}: expected a number, got {v!r}")
            ok_low = v > low if low_open else v >= low
            ok_high = v < high if high_open else v <= high
            if not (ok_low and ok_high):
                lb, hb = "(" if low_open else "[", ")" if high_open else "]"
                raise ValueError(
                    f"MixedPrecisionConfig.{name}: must be in {lb}{low}, {high}{hb}, got {v!r}")

        number("initial_scale", 0.0, math.inf, True, True)
        number("scale_factor", 1.0, math.inf, True, True)
        number("backoff_factor", 0.0, 1.0, True, True)
        number("overflow_threshold", 0.0, 1.0, False, False)
        number("underflow_threshold", 0.0, 1.0, False, False)
        number("adaptive_threshold", 0.0, 1.0, True, False)
        for name in ("scale_window", "hysteresis", "logging_frequency",
                     "gradient_accumulation_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"MixedPrecisionConfig.{name}: expected an int, got {v!r}")
            if v < 1:
                raise ValueError(f"MixedPrecisionConfig.{name}: must be >= 1, got {v}")
        for name in ("min_scale", "max_scale"):
            if getattr(self, name) is not None:
                number(name, 0.0, math.inf, True, True)
        low, high, init = self.min_scale, self.max_scale, self.initial_scale
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"MixedPrecisionConfig.min_scale ({low}) must not exceed max_scale ({high})")
        if low is not None and init < low:
            raise ValueError(
                f"MixedPrecisionConfig.initial_scale ({init}) is below min_scale ({low})")
        if high is not None and init > high:
            raise ValueError(
                f"MixedPrecisionConfig.initial_scale ({init}) is above max_scale ({high})")
        if self.max_grad_norm is not None:
            number("max_grad_norm", 0.0, math.inf, False, True)
        layers = self.selective_layers
        if not isinstance(layers, (list, tuple)) or not all(isinstance(s, str) for s in layers):
            raise TypeError("MixedPrecisionConfig.selective_layers: expected a list of str (glob "
                            f"patterns or class names), got {layers!r}")
        self.selective_layers = list(layers)
        if self.mode is MixedPrecisionMode.SELECTIVE and self.enabled and not layers:
            raise ValueError("MixedPrecisionConfig.selective_layers: SELECTIVE mode needs at "
                             "least one pattern (e.g. ['features.*'] or ['Conv2d'])")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"MixedPrecisionConfig.fp8_recipe: expected one of "
                             f"{list(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_fsdp_all_gather:
            raise ValueError(
                "MixedPrecisionConfig.fp8_fsdp_all_gather=True is refused for now: torchao's "
                "float8 all-gather under FSDP2 (tensorwise only, GPU only: gloo cannot "
                "all-gather float8) has not been measured on a GPU with mixprec's optimizers; "
                "leave it False (the weights are all-gathered in their own dtype and cast to "
                "float8 after the all-gather)")
        if (self.precision_level is PrecisionLevel.FP8 and self.enabled
                and self.mode not in FP8_MODES):
            raise ValueError(
                f"MixedPrecisionConfig.precision_level=FP8 runs in mode AUTOMATIC or MANUAL, "
                f"got mode {self.mode.name}")  # type: ignore[union-attr]
        if self.capture and self.enabled and self.mode is MixedPrecisionMode.ADAPTIVE:
            raise ValueError(
                "MixedPrecisionConfig.capture=True is refused in mode ADAPTIVE: its evaluations "
                "read overflow counts on the host and re-wrap module forwards, which a "
                "captured graph would not follow; use another mode or capture=False")
        if self.capture and self.gradient_accumulation_steps > 1:
            raise ValueError(
                "MixedPrecisionConfig.capture=True needs gradient_accumulation_steps=1: a graph "
                "holds one whole optimizer step and train_step takes one micro-batch; "
                "accumulate inside a step of MixedPrecisionManager.make_step instead")
        if self.gradient_release:
            self._check_release()
        if self.mode is MixedPrecisionMode.GRADIENT_SCALING and not self.gradient_scaling:
            raise ValueError(
                "MixedPrecisionConfig: mode GRADIENT_SCALING needs gradient_scaling=True")

    def _check_release(self) -> None:
        why = {
            "loss_scaling=True": self.loss_scaling is True,
            "max_grad_norm": bool(self.max_grad_norm),
            "gradient_accumulation_steps > 1": self.gradient_accumulation_steps > 1,
            "capture=True": self.capture,
            f"mode {getattr(self.mode, 'name', self.mode)}": self.enabled and self.mode in (
                MixedPrecisionMode.ADAPTIVE, MixedPrecisionMode.GRADIENT_SCALING),
        }
        reasons = {
            "loss_scaling=True": "an overflow found in a later gradient would need updates "
                                 "already applied to be undone",
            "max_grad_norm": "the global norm needs every gradient before any param is stepped",
            "gradient_accumulation_steps > 1": "every backward steps the params",
            "capture=True": "a captured step holds the whole step, the release hooks run "
                            "inside its backward",
        }
        for setting, refused in why.items():
            if refused:
                because = reasons.get(setting, "it reads every gradient after backward "
                                               "(overflow counts, the GradScaler's checks)")
                raise ValueError(f"MixedPrecisionConfig.gradient_release=True cannot be "
                                 f"combined with {setting}: {because}")

    # ------------------------------------------------------------------ presets
    @classmethod
    def conservative(cls, **overrides: Any) -> MixedPrecisionConfig:
        """Scale 2**15, growth every 5000 clean steps, hysteresis 2."""
        return cls(**{**PRESETS["conservative"], **overrides})

    @classmethod
    def standard(cls, **overrides: Any) -> MixedPrecisionConfig:
        """Scale 2**16, growth every 2000 clean steps (torch's defaults)."""
        return cls(**{**PRESETS["standard"], **overrides})

    @classmethod
    def aggressive(cls, **overrides: Any) -> MixedPrecisionConfig:
        """Scale 2**17, growth every 1000 clean steps."""
        return cls(**{**PRESETS["aggressive"], **overrides})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> MixedPrecisionConfig:
        """``"conservative"``, ``"standard"`` or ``"aggressive"``, with overrides."""
        if name not in PRESETS:
            raise ValueError(
                f"MixedPrecisionConfig.preset: expected one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})

    # ------------------------------------------------------------------ dicts
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python values (enums as their string values)."""
        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value
            return list(v) if isinstance(v, (list, tuple)) else v

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixedPrecisionConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"MixedPrecisionConfig.from_dict: unknown fields {unknown}")
        return cls(**data)


def as_config(config: Any, who: str) -> MixedPrecisionConfig:
    """``config`` validated (``None``: ``MixedPrecisionConfig()``); TypeError naming ``who``
    for another type."""
    if config is None:
        return MixedPrecisionConfig()
    if not isinstance(config, MixedPrecisionConfig):
        raise TypeError(f"{who}: config must be a MixedPrecisionConfig, got "
                        f"{type(config).__name__}")
    config.validate()
    return config


#: Field values of the presets (every other field keeps its default).
PRESETS: dict[str, dict[str, Any]] = {
    "conservative": {"initial_scale": 2.0**15, "scale_window": 5000, "hysteresis": 2},
    "standard": {"initial_scale": 2.0**16, "scale_window": 2000},
    "aggressive": {"initial_scale": 2.0**17, "scale_window": 1000},
}
