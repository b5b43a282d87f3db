"""Typed wrappers over ``torch.ops.mixprec.*``.

Every op works on CPU and CUDA tensors, never synchronises with the host, and takes its step-varying
scalars (``found_inf``, ``inv_scale``, ``scale``, ...) as one-element device tensors, so a step
built from them can be captured in a CUDA graph and traced by ``torch.compile(fullgraph=True)``. An
op that rejects its arguments raises ``RuntimeError`` naming the argument and leaves every tensor
unchanged; so do CUDA tensors where mixprec's CUDA library is not loaded, and meta tensors,
naming the cause. DTensor lists (FSDP2) are taken: the ops run on the local shards,
checks and norms are reduced over the mesh (:mod:`mixprec.ops._dtensor_rules`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .. import _dtensor
from .._extension import EXT
from . import _autograd, _dtensor_rules  # noqa: F401  (_autograd registers Autograd kernels)

__all__ = ["unscale_and_check_", "unscale_and_norm_", "check_finite_", "check_finite_and_norm_",
           "update_scale_", "update_scale_ext_", "fused_adam_", "fused_sgd_", "fused_adam8_",
           "fused_sgd8_"]


# Ops returning tensors need a fake implementation for torch.compile (in-place ops
# returning () get one from torch): a 0-dim float32 tensor on found_inf's device.
def _norm_fake(grads: Sequence[Tensor], found_inf: Tensor, *rest: Any) -> Tensor:
    return found_inf.new_empty(())


for _name in ("unscale_and_norm_", "check_finite_and_norm_"):
    torch.library.register_fake(f"mixprec::{_name}")(_norm_fake)

_dtensor.on_dtensor_class(_dtensor_rules.register)


#: Per op: the ``torch.ops.mixprec`` packet (what tensor subclasses and TorchFunctionModes
#: see), its overload and the arguments it writes, bound once.
_OPS = {name: (op, op.default, _autograd.written_arguments(op.default))
        for name, op in ((n, getattr(torch.ops.mixprec, n)) for n in EXT.op_names)}


def _call(name: str, *args: Any) -> Any:
    """Run ``torch.ops.mixprec.<name>`` on ``args`` (all positional, in the schema's order;
    each wrapper names its parameters: torch 2.11's torch.compile traces no ``locals()``).
    Outside torch.compile and inference mode the wrapper does the Autograd kernel's work
    itself (:func:`mixprec.ops._autograd.call_below_autograd`)."""
    op, _, written = _OPS[name]
    try:
        _dtensor.dtensor_class()  # DTensor arguments: their rules (_dtensor_rules) registered
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return op(*args)
        return _autograd.call_below_autograd(op, name, written, args)
    except (RuntimeError, NotImplementedError) as e:
        meta = _meta_argument(name, args)
        if meta is None:
            raise
        raise RuntimeError(f"mixprec.{name}: {meta} is on the 'meta' device: the ops compute "
                           "on data, and a meta tensor has none (move it to the device of the "
                           "others; a meta model needs to_empty() and initialised weights)"
                           ) from e


def _meta_argument(name: str, args: Sequence[Any]) -> Optional[str]:
    """The first argument that is (or holds) a tensor on ``meta``, as ``grads[1]``, or None."""
    schema = _OPS[name][1]._schema
    for arg_name, a in zip((a.name for a in schema.arguments), args):
        if isinstance(a, Tensor):
            if a.is_meta:
                return arg_name
        elif isinstance(a, (list, tuple)):
            for i, t in enumerate(a):
                if isinstance(t, Tensor) and t.is_meta:
                    return f"{arg_name}[{i}]"
    return None


def unscale_and_check_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """Unscale gradients in place and record whether any was inf or NaN.

    For every ``g`` in ``grads``: ``g *= inv_scale`` (in float32; float64 for float64
    grads) and, if any input value was inf or NaN, ``found_inf`` is set to 1.0 (never
    cleared: zero it before a step's first call). Bitwise equal to
    ``torch._amp_foreach_non_finite_check_and_unscale_`` wherever that accepts the input;
    also takes bfloat16 grads and lists mixing float32/float16/bfloat16/float64.

    Args:
        grads: tensors of any shape and strides (non-dense ones go through a contiguous
            copy), all on one device. Mutated.
        found_inf: float32, one element, on the grads' device. Mutated.
        inv_scale: float32, one element, on that device (``1 / scale`` taken in float64
            and rounded to float32, as torch does). Read only.

    No host sync. CUDA: one launch per dtype present (more only past 1,036 tensors or
    2,560 chunks of 65,536 elements per dtype); CPU: one parallel pass.
    """
    _call("unscale_and_check_", grads, found_inf, inv_scale)


def unscale_and_norm_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor,
                      norm_type: float = 2.0) -> Tensor:
    """:func:`unscale_and_check_` that also returns the total norm of the unscaled grads.

    One pass: unscale in place, record inf/NaN in ``found_inf``, accumulate ``sum |g|**p``
    (``max |g|`` for ``p = inf``) of the unscaled values (float32 per element, partials
    combined in float64 in a fixed order: deterministic). ``norm_type``: ``p`` > 0 or
    ``float("inf")``; the other arguments as :func:`unscale_and_check_`.

    Returns a 0-dim float32 tensor on the grads' device: the norm of all grads together,
    as ``torch.nn.utils.clip_grad_norm_`` computes it after ``unscale_`` (inf/NaN when a
    grad held inf/NaN). No host sync.
    """
    return _call("unscale_and_norm_", grads, found_inf, inv_scale, norm_type)


def check_finite_and_norm_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor,
                           norm_type: float = 2.0) -> Tensor:
    """Read-only :func:`unscale_and_norm_`: check grads, return the norm of ``grads * inv_scale``.

    Records inf/NaN in ``found_inf`` (mutated, only ever set to 1.0) and returns the total
    ``norm_type``-norm of ``g * inv_scale`` (taken in float32, float64 for float64 grads,
    not rounded to the grad's dtype), as a 0-dim float32 tensor on the grads' device;
    ``grads`` are read only. The first half of a clip whose second half happens in an
    optimizer's fused kernel (:meth:`mixprec.GradScaler.clip_grad_norm_`). No host sync.
    """
    return _call("check_finite_and_norm_", grads, found_inf, inv_scale, norm_type)


def check_finite_(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    """Set ``found_inf`` to 1.0 if any value in ``tensors`` is inf or NaN.

    Read-only on ``tensors`` (torch's check-and-unscale with scale 1 writes every element
    back), for optimizers that unscale in their own kernel. Argument rules as
    :func:`unscale_and_check_`; ``found_inf`` mutated, never cleared. No host sync.
    """
    _call("check_finite_", tensors, found_inf)


def update_scale_(scale: Tensor, growth_tracker: Tensor, found_inf: Tensor, growth_factor: float,
                  backoff_factor: float, growth_interval: int, counts: Optional[Tensor] = None,
                  prev_scale: Optional[Tensor] = None) -> None:
    """Update the loss scale in place, exactly as ``torch._amp_update_scale_``.

    ``found_inf`` non-zero: ``scale *= backoff_factor``, the tracker resets. Otherwise the tracker
    counts up; at ``growth_interval`` the scale is multiplied by ``growth_factor`` (unless that is
    not finite in float32) and the tracker resets. Products in float64, rounded to float32.

    Args:
        scale: float32, one element. Mutated.
        growth_tracker: int32, one element, same device. Mutated.
        found_inf: float32, one element, same device. Read only.
        growth_factor, backoff_factor: plain floats (not validated, as in torch).
        growth_interval: positive int.
        counts, prev_scale: optional, together: the update's statistics, counted in the same
            kernel. ``counts``: int64, 5 elements, same device (``[updates, overflowed
            updates, updates after which the scale was larger than prev_scale, ... smaller,
            index of the last overflowed update or -1]``; the index is ``counts[0]`` before
            this update). ``prev_scale``: float32, one element, the scale compared against;
            set to the new scale. Mutated.

    Runs on the tensors' device (a one-thread kernel on CUDA); no host sync.
    """
    _call("update_scale_",
          scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval,
          counts, prev_scale)


def update_scale_ext_(scale: Tensor, growth_tracker: Tensor, hysteresis_left: Tensor,
                      found_inf: Tensor, growth_factor: float, backoff_factor: float,
                      growth_interval: int, min_scale: Optional[float] = None,
                      max_scale: Optional[float] = None, hysteresis: int = 1,
                      counts: Optional[Tensor] = None,
                      prev_scale: Optional[Tensor] = None) -> None:
    """:func:`update_scale_` with hysteresis and bounds on the scale.

    Products and clamps in float64, one rounding to float32:

    * overflow (``found_inf != 0``): ``growth_tracker = 0``; ``hysteresis_left =
      max(hysteresis_left - 1, 0)``; if that is 0, ``scale = max(scale * backoff_factor,
      min_scale)``: the first ``hysteresis - 1`` overflows since the last growth are
      absorbed (DeepSpeed's and Megatron-LM's rule).
    * clean step: ``growth_tracker += 1``; at ``growth_interval``: ``scale = min(scale *
      growth_factor, max_scale)`` unless not finite in float32, ``growth_tracker = 0``,
      ``hysteresis_left = hysteresis``.

    With ``hysteresis=1`` and no bounds this is bitwise :func:`update_scale_`. Initialise
    ``hysteresis_left`` to ``hysteresis``.

    Args:
        scale: float32, one element. Mutated.
        growth_tracker, hysteresis_left: int32, one element each, same device. Mutated.
        found_inf: float32, one element, same device. Read only.
        growth_factor: finite, > 1. backoff_factor: in (0, 1).
        growth_interval, hysteresis: positive ints.
        min_scale, max_scale: optional finite positive bounds, min <= max.
        counts, prev_scale: the statistics, as in :func:`update_scale_`.

    No host sync.
    """
    _call("update_scale_ext_",
          scale, growth_tracker, hysteresis_left, found_inf, growth_factor, backoff_factor,
          growth_interval, min_scale, max_scale, hysteresis, counts, prev_scale)


def fused_adam_(params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor],
                exp_avg_sqs: Sequence[Tensor], max_exp_avg_sqs: Sequence[Tensor],
                master_params: Sequence[Tensor], state_steps: Sequence[Tensor], lr: Tensor,
                beta1: float, beta2: float, weight_decay: float, eps: float, amsgrad: bool,
                maximize: bool, decoupled_weight_decay: bool, grad_scale: Optional[Tensor] = None,
                found_inf: Optional[Tensor] = None, clip_coef: Optional[Tensor] = None,
                stochastic_rounding: bool = False, seed: int = 0,
                sr_bases: Optional[Sequence[int]] = None) -> None:
    """One fused Adam (``decoupled_weight_decay=False``) or AdamW step, in place.

    ``torch.optim.Adam``/``AdamW``'s update (``foreach=False``) operation by operation in
    float32, its scalars (bias corrections, step size, ``1 - lr * weight_decay``) in
    float64; per parameter ``i``, with ``t = state_steps[i] + 1``::

        g = grads[i] * (1 / grad_scale) * clip_coef     (each factor when given)
        g = -g if maximize
        w = the master of params[i] if given (below) else params[i] (in float32)
        w = w * (1 - lr * weight_decay)                 (AdamW)   | g = g + weight_decay * w (Adam)
        m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
        vmax = max(vmax, v)                             (amsgrad)
        w = w - lr / (1 - beta1**t) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1 - beta2**t) + eps)
        params[i] = w rounded to its dtype; state_steps[i] = t
        master_params[i] = w (float32) or w's correction against the new params[i]

    When ``found_inf`` is non-zero nothing changes (params, masters, moments, step counts).

    Args:
        params: float32, float16 or bfloat16 tensors, any shapes, one device. Mutated.
        grads: same shapes; float32, float16 or bfloat16 (any mix). Read only.
        exp_avgs, exp_avg_sqs: float32, shapes of the params. Mutated.
        max_exp_avg_sqs: float32, one per param when ``amsgrad``, else empty. Mutated.
        master_params: empty (params updated in place), or one per param, of its shape,
            every param then float16/bfloat16, all of one dtype (call the op once per
            master form): float32, the master itself; or int16 / int8, for bfloat16 params
            only, the correction of a split master, the master being the param plus the
            correction (:func:`mixprec.optim.decode_master`; docs/optimizers.md, "Split
            masters"), re-encoded against the new param. Mutated.
        state_steps: distinct one-element float32 tensors, one per param: the steps
            taken so far. Incremented.
        lr: one-element float32 or float64 tensor (read on the device: it may change
            between CUDA-graph replays).
        beta1, beta2: in [0, 1). weight_decay, eps: finite, >= 0.
        grad_scale: optional one-element float32 tensor, the loss scale the grads carry
            (reciprocal taken in float64, rounded to float32).
        found_inf: optional one-element float32 tensor; non-zero skips the step.
        clip_coef: optional one-element float32 gradient multiplier (clipping).
        stochastic_rounding: round bfloat16 params stochastically (``master_params`` empty); the
            bits hash (``seed``, step, element number): reproducible and resumable.
        seed: the stochastic-rounding seed (any int64).
        sr_bases: per param, the element number of its element 0, for shards of bigger
            tensors, so that a sharded step rounds as the unsharded one (the optimizers
            pass them for DTensor params; ``mixprec.optim._sr``). None: element ``e`` of
            param ``t`` is ``c * 65536 + e``, ``c`` the 65536-element chunks of the
            params before ``t`` with its (param dtype, grad dtype).

    Every tensor on params[0]'s device. No host sync: on CUDA one launch per (param dtype,
    grad dtype) present plus one for the step counts; on CPU one parallel pass.
    """
    _call("fused_adam_",
          params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, state_steps, lr,
          beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled_weight_decay, grad_scale,
          found_inf, clip_coef, stochastic_rounding, seed, sr_bases)


def fused_sgd_(params: Sequence[Tensor], grads: Sequence[Tensor],
               momentum_buffers: Sequence[Tensor], master_params: Sequence[Tensor],
               state_steps: Sequence[Tensor], lr: Tensor, weight_decay: float, momentum: float,
               dampening: float, nesterov: bool, maximize: bool,
               grad_scale: Optional[Tensor] = None, found_inf: Optional[Tensor] = None,
               clip_coef: Optional[Tensor] = None, stochastic_rounding: bool = False, seed: int = 0,
               sr_bases: Optional[Sequence[int]] = None) -> None:
    """One fused SGD step in place: ``torch.optim.SGD``'s rule (``foreach=False``).

    Per parameter, in float32 (``g`` prepared as in :func:`fused_adam_`)::

        g = g + weight_decay * w                              (weight_decay != 0)
        b = g if state_steps[i] == 0 else b * momentum + (1 - dampening) * g
        g = g + momentum * b if nesterov else b               (momentum != 0)
        w = w - lr * g

    Args:
        momentum_buffers: float32, one per param when ``momentum != 0`` (overwritten on
            a param's first step), else empty. Mutated.
        momentum, weight_decay: finite, >= 0. ``nesterov`` needs momentum > 0 and dampening == 0.
        Everything else: as :func:`fused_adam_` (found_inf set: nothing changes).

    No host sync.
    """
    _call("fused_sgd_",
          params, grads, momentum_buffers, master_params, state_steps, lr, weight_decay, momentum,
          dampening, nesterov, maximize, grad_scale, found_inf, clip_coef, stochastic_rounding,
          seed, sr_bases)


def fused_adam8_(params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor],
                 exp_avg_absmax: Sequence[Tensor], exp_avg_sqs: Sequence[Tensor],
                 exp_avg_sq_absmax: Sequence[Tensor], master_params: Sequence[Tensor],
                 state_steps: Sequence[Tensor], lr: Tensor, beta1: float, beta2: float,
                 weight_decay: float, eps: float, maximize: bool, decoupled_weight_decay: bool,
                 grad_scale: Optional[Tensor] = None, found_inf: Optional[Tensor] = None,
                 clip_coef: Optional[Tensor] = None, stochastic_rounding: bool = False,
                 seed: int = 0, sr_bases: Optional[Sequence[int]] = None) -> None:
    """One fused Adam/AdamW step with block-wise 8-bit moments, in place.

    :func:`fused_adam_` (no amsgrad) with each moment kept as codes and block maxima
    (:mod:`mixprec.optim._quant8`): read back in float32 (``table[code] * absmax`` of its block of
    256 elements inside a row), updated as :func:`fused_adam_` updates float32 moments, and written
    back as the codes of the new values against each block's new absmax (nearest entry; a nonzero
    value never becomes zero). ``found_inf`` set: nothing changes, codes and maxima included.

    Args:
        exp_avgs, exp_avg_sqs: contiguous uint8 codes of each param's shape (the
            ``dynamic8-signed`` / ``dynamic8-unsigned`` tables). Mutated.
        exp_avg_absmax, exp_avg_sq_absmax: contiguous float32 of shape ``(rows, blocks per
            row)`` (``(blocks,)`` below two dims), one per param: the blocks' maxima. Mutated.
        Everything else: as :func:`fused_adam_`.

    No host sync (CUDA: one launch per (param dtype, grad dtype) plus the step counts).
    """
    _call("fused_adam8_",
          params, grads, exp_avgs, exp_avg_absmax, exp_avg_sqs, exp_avg_sq_absmax, master_params,
          state_steps, lr, beta1, beta2, weight_decay, eps, maximize, decoupled_weight_decay,
          grad_scale, found_inf, clip_coef, stochastic_rounding, seed, sr_bases)


def fused_sgd8_(params: Sequence[Tensor], grads: Sequence[Tensor],
                momentum_buffers: Sequence[Tensor], momentum_absmax: Sequence[Tensor],
                master_params: Sequence[Tensor], state_steps: Sequence[Tensor], lr: Tensor,
                weight_decay: float, momentum: float, dampening: float, nesterov: bool,
                maximize: bool, grad_scale: Optional[Tensor] = None,
                found_inf: Optional[Tensor] = None, clip_coef: Optional[Tensor] = None,
                stochastic_rounding: bool = False, seed: int = 0,
                sr_bases: Optional[Sequence[int]] = None) -> None:
    """One fused SGD step (``momentum > 0``) with a block-wise 8-bit momentum buffer.

    :func:`fused_sgd_` with ``momentum_buffers`` as contiguous uint8 codes of each param's
    shape (``dynamic8-signed``) and ``momentum_absmax`` their float32 block maxima
    (shaped as :func:`fused_adam8_`'s), coded as :func:`fused_adam8_` codes its first moment. On a
    param's first step the buffer starts from the gradient, as in torch. Mutates params,
    masters, codes, maxima and step counts; nothing with ``found_inf`` set. No host sync.
    """
    _call("fused_sgd8_",
          params, grads, momentum_buffers, momentum_absmax, master_params, state_steps, lr,
          weight_decay, momentum, dampening, nesterov, maximize, grad_scale, found_inf, clip_coef,
          stochastic_rounding, seed, sr_bases)
