"""Lightning precision plugins under which mixprec's optimizers clip gradients.

Lightning refuses ``gradient_clip_val`` for every optimizer declaring
``_step_supports_amp_scaling`` (as mixprec's do: they unscale in their fused step), even under
``bf16-mixed``, which has no scaler. These plugins clip the **unscaled** gradients instead
(:func:`clip_unscaled`). One line, in place of ``precision="..."``::

    trainer = L.Trainer(plugins=[precision_plugin("bf16-mixed")], gradient_clip_val=1.0)

The classes keep the names (and so the checkpoint keys) of the Lightning plugins they extend:
a checkpoint written with Lightning's ``MixedPrecision`` resumes under this one and back.
Importing this module imports Lightning; ``import mixprec`` does not.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

import torch
from lightning.pytorch.plugins.precision import HalfPrecision as _LightningHalfPrecision
from lightning.pytorch.plugins.precision import MixedPrecision as _LightningMixedPrecision
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor
from torch.optim import Optimizer

from ..amp.grad_scaler import GradScaler, check_device

__all__ = ["MixedPrecision", "HalfPrecision", "precision_plugin", "clip_unscaled"]

#: The precision strings :func:`precision_plugin` takes (Lightning's spelling).
PRECISIONS = ("16-mixed", "bf16-mixed", "bf16-true", "16-true")


def clip_unscaled(optimizer: Optimizer, clip_val: Union[int, float],
                  algorithm: Union[GradClipAlgorithmType, str],
                  scaler: Optional[torch.amp.GradScaler]) -> Optional[Tensor]:
    """Clip ``optimizer``'s gradients as they are after unscaling, where Lightning clips
    (after the backward closure, before ``scaler.step``).

    Args:
        optimizer: its ``param_groups`` give the parameters.
        clip_val: the max norm (``"norm"``) or max absolute value (``"value"``); ``<= 0``:
            nothing is done.
        algorithm: ``"norm"`` (2-norm over all the optimizer's grads) or ``"value"``.
        scaler: the plugin's scaler, or None (the grads carry no scale).

    Returns the total norm before clipping for ``"norm"`` (a 0-dim tensor, not read on the
    host), else None. With an enabled :class:`mixprec.GradScaler` and ``"norm"``:
    ``scaler.clip_grad_norm_`` (one read-only pass, unscale and clip folded into the step of
    mixprec's optimizers, ``param.grad`` untouched, no host sync). With another enabled scaler
    or ``"value"``: ``scaler.unscale_`` for an optimizer that unscales in its step, then torch's
    in-place clip. Without a scaler: torch's in-place clip, as Lightning's plugins.
    """
    if clip_val <= 0:
        return None
    norm = GradClipAlgorithmType(algorithm) == GradClipAlgorithmType.NORM
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if scaler is not None and scaler.is_enabled():
        if norm and isinstance(scaler, GradScaler):
            return scaler.clip_grad_norm_(optimizer, float(clip_val))
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # (Lightning's MixedPrecision unscaled the grads of every other optimizer)
            scaler.unscale_(optimizer)
    if norm:
        return torch.nn.utils.clip_grad_norm_(params, clip_val)
    torch.nn.utils.clip_grad_value_(params, clip_value=clip_val)
    return None


class _ClipsUnscaled:
    """The clipping both plugins share: :func:`clip_unscaled` with the plugin's scaler
    (``None`` without one), the last norm kept as ``grad_norm`` (a device tensor)."""

    grad_norm: Optional[Tensor] = None

    def clip_gradients(self, optimizer: Optimizer, clip_val: Union[int, float] = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM
                       ) -> None:
        """Clip the unscaled gradients (:func:`clip_unscaled`); never refuses."""
        norm = clip_unscaled(optimizer, clip_val, gradient_clip_algorithm,
                             getattr(self, "scaler", None))
        if norm is not None:
            self.grad_norm = norm


class MixedPrecision(_ClipsUnscaled, _LightningMixedPrecision):
    """Lightning's ``MixedPrecision`` plugin (``16-mixed``, ``bf16-mixed``), with
    :class:`mixprec.GradScaler` as the default scaler of ``16-mixed`` and gradient
    clipping that works with optimizers that unscale in their step (mixprec's; torch's
    ``fused=True``): :func:`clip_unscaled`.

    Args:
        precision: ``"16-mixed"`` (float16 autocast, loss scaling) or ``"bf16-mixed"``.
        device: the autocast device type; None: ``"cuda"`` when CUDA is available, else ``"cpu"``.
        scaler: for ``16-mixed``, the scaler to use (None: ``mixprec.GradScaler(device)``;
            torch's works too, without the folded clip). Must be None for ``bf16-mixed``.

    Attributes:
        grad_norm: the total grad norm the last norm clip measured (0-dim tensor on the device, not
            read on the host: log it, e.g. ``self.log("grad_norm", ...)``), or None.
    """

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"], device: Optional[str] = None,
                 scaler: Optional[torch.amp.GradScaler] = None) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if scaler is None and precision == "16-mixed":
            scaler = GradScaler(device)
        super().__init__(precision, device, scaler)


class HalfPrecision(_ClipsUnscaled, _LightningHalfPrecision):
    """Lightning's ``HalfPrecision`` plugin (``bf16-true``, ``16-true``: the model's
    params in 16 bits; mixprec's optimizers keep float32 masters of them), with the
    clipping of :class:`MixedPrecision` (no scaler: the grads are clipped in place) and
    its ``grad_norm`` attribute."""

    def __init__(self, precision: Literal["bf16-true", "16-true"] = "bf16-true") -> None:
        super().__init__(precision)


def precision_plugin(precision: str, device: Optional[str] = None,
                     scaler: Optional[torch.amp.GradScaler] = None) -> Precision:
    """The plugin to pass as ``L.Trainer(plugins=[...])`` in place of ``precision=...``.

    Args:
        precision: Lightning's string: ``"16-mixed"``, ``"bf16-mixed"`` (a :class:`MixedPrecision`),
            ``"bf16-true"`` or ``"16-true"`` (a :class:`HalfPrecision`).
        device: autocast device type of the mixed ones (None: CUDA if available, else CPU).
        scaler: the scaler of ``16-mixed`` (None: ``mixprec.GradScaler(device)``).

    Raises:
        ValueError: another precision, a scaler for one that does not scale, a device
            that is not a device type torch knows.
        TypeError: a scaler that is not a ``torch.amp.GradScaler``.
    """
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"precision_plugin: scaler must be a torch.amp.GradScaler (e.g. "
                        f"mixprec.GradScaler('cuda')) or None, got {type(scaler).__name__} "
                        f"{scaler!r}")
    if device is not None:
        check_device(device, "precision_plugin")
    if scaler is not None and precision in PRECISIONS and precision != "16-mixed":
        raise ValueError(f"precision_plugin({precision!r}) takes no scaler")
    if precision in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(precision, device, scaler)  # type: ignore[arg-type]
    if precision in ("bf16-true", "16-true"):
        return HalfPrecision(precision)  # type: ignore[arg-type]
    raise ValueError(f"precision_plugin: precision must be one of {PRECISIONS}, "
                     f"got {precision!r}")
