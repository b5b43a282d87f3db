"""Pure-PyTorch versions of every mixprec op: the oracle the tests hold the kernels to.

Each function has the op's exact signature and semantics, validates its arguments with
the same rules (:mod:`_reference_checks`), never syncs with the host (everything stays in
device tensors) and is bitwise equal to the kernel for the same inputs. mixprec itself
never calls them (a build without kernels for a device raises, as torch's ops do).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from _reference_checks import (
    _check_finite_nonneg,
    _check_list,
    _check_norm_args,
    _check_optim,
    _check_scale_stats,
    _check_state,
    _check_update_args,
)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _any_nonfinite(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    flags = [(~torch.isfinite(t)).any() for t in tensors if t.numel() > 0]
    if flags:
        hit = torch.stack(flags).any().to(found_inf.dtype).reshape(found_inf.shape)
        found_inf.copy_(torch.maximum(found_inf, hit))


def unscale_and_check_(grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """Reference of ``torch.ops.mixprec.unscale_and_check_`` (see :mod:`mixprec.ops`)."""
    op = "unscale_and_check_"
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_state(op, "inv_scale", inv_scale, torch.float32, found_inf.device)
    _check_list(op, "grads", grads, found_inf.device, written=True)
    _any_nonfinite(grads, found_inf)
    is_one = inv_scale.reshape(()) == 1.0
    for g in grads:
        if g.numel() == 0:
            continue
        math = _opmath(g.dtype)
        v = g.to(math)
        g.copy_(torch.where(is_one, v, v * inv_scale.reshape(()).to(math)))


def unscale_and_norm_(
    grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor, norm_type: float = 2.0
) -> Tensor:
    """Reference of ``torch.ops.mixprec.unscale_and_norm_`` (norm accumulated in float64)."""
    _check_norm_args("unscale_and_norm_", grads, found_inf, inv_scale, norm_type, True)
    unscale_and_check_(grads, found_inf, inv_scale)
    return _total_norm([g.to(_opmath(g.dtype)) for g in grads], norm_type, found_inf.device)


def check_finite_and_norm_(
    grads: Sequence[Tensor], found_inf: Tensor, inv_scale: Tensor, norm_type: float = 2.0
) -> Tensor:
    """Reference of ``torch.ops.mixprec.check_finite_and_norm_`` (grads not written)."""
    _check_norm_args("check_finite_and_norm_", grads, found_inf, inv_scale, norm_type, False)
    _any_nonfinite(grads, found_inf)
    unscaled = [g.to(_opmath(g.dtype)) * inv_scale.to(_opmath(g.dtype)) for g in grads]
    return _total_norm(unscaled, norm_type, found_inf.device)


def _total_norm(values: Sequence[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """The norm_type-norm of all ``values`` together, accumulated in float64, as float32."""
    norms = [torch.linalg.vector_norm(v.double(), norm_type) for v in values if v.numel() > 0]
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type).float()


def check_finite_(tensors: Sequence[Tensor], found_inf: Tensor) -> None:
    """Reference of ``torch.ops.mixprec.check_finite_``."""
    op = "check_finite_"
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_list(op, "tensors", tensors, found_inf.device)
    _any_nonfinite(tensors, found_inf)


def _count_update(counts: Tensor, prev_scale: Tensor, scale: Tensor, found_inf: Tensor) -> None:
    """The statistics of one update (``counts``, ``prev_scale``), after it: the torch ops
    ``mixprec.GradScaler.update()`` ran for them before its kernel counted them (ne, where, gt,
    lt, add_, copy_ into a bool row ``[1, overflowed, grew, shrank]``)."""
    after, prev = scale.reshape(()), prev_scale.reshape(())
    row = torch.ones(4, dtype=torch.bool, device=scale.device)
    torch.ne(found_inf.reshape(()), 0, out=row[1])
    torch.where(row[1], counts[0], counts[4], out=counts[4])
    torch.gt(after, prev, out=row[2])
    torch.lt(after, prev, out=row[3])
    counts[:4].add_(row)
    prev.copy_(after)


def update_scale_(
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    counts: Optional[Tensor] = None,
    prev_scale: Optional[Tensor] = None,
) -> None:
    """Reference of ``torch.ops.mixprec.update_scale_`` (= ``torch._amp_update_scale_``;
    with ``counts`` and ``prev_scale``, the update's statistics too)."""
    _check_update_args("update_scale_", scale, growth_tracker, found_inf, growth_interval)
    stats = _check_scale_stats("update_scale_", counts, prev_scale, scale.device)
    s64 = scale.double()
    found = found_inf != 0
    successful = growth_tracker + 1
    at_interval = successful == growth_interval
    grown = (s64 * growth_factor).float()
    backed = (s64 * backoff_factor).float()
    grow = at_interval & torch.isfinite(grown)
    new_scale = torch.where(found, backed, torch.where(grow, grown, scale))
    zero = torch.zeros_like(growth_tracker)
    new_tracker = torch.where(found | at_interval, zero, successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    if stats:
        assert counts is not None and prev_scale is not None
        _count_update(counts, prev_scale, scale, found_inf)


def update_scale_ext_(
    scale: Tensor,
    growth_tracker: Tensor,
    hysteresis_left: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    min_scale: Optional[float] = None,
    max_scale: Optional[float] = None,
    hysteresis: int = 1,
    counts: Optional[Tensor] = None,
    prev_scale: Optional[Tensor] = None,
) -> None:
    """Reference of ``torch.ops.mixprec.update_scale_ext_`` (rule in :mod:`mixprec.ops`)."""
    op = "update_scale_ext_"
    _check_update_args(op, scale, growth_tracker, found_inf, growth_interval, hysteresis_left)
    if not (growth_factor > 1.0 and growth_factor != float("inf")):
        raise RuntimeError(
            f"mixprec.{op}: growth_factor must be a finite number > 1, got {growth_factor}"
        )
    if not 0.0 < backoff_factor < 1.0:
        raise RuntimeError(f"mixprec.{op}: backoff_factor must be in (0, 1), got {backoff_factor}")
    if not 1 <= hysteresis <= 2**31 - 1:
        raise RuntimeError(
            f"mixprec.{op}: hysteresis must be a positive 32-bit integer, got {hysteresis}"
        )
    lo, hi = 0.0, float("inf")
    for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
        if value is not None and not (0.0 < value < float("inf")):
            raise RuntimeError(f"mixprec.{op}: {name} must be a finite number > 0, got {value}")
    if min_scale is not None:
        lo = float(min_scale)
    if max_scale is not None:
        hi = float(max_scale)
    if lo > hi:
        raise RuntimeError(f"mixprec.{op}: min_scale ({lo}) must not exceed max_scale ({hi})")
    stats = _check_scale_stats(op, counts, prev_scale, scale.device)

    s64 = scale.double()
    found = found_inf != 0
    zero = torch.zeros_like(growth_tracker)
    left = torch.clamp(hysteresis_left - 1, min=0)
    backed = torch.clamp(s64 * backoff_factor, min=lo).float()
    overflow_scale = torch.where(left == 0, backed, scale)

    successful = growth_tracker + 1
    at_interval = successful == growth_interval
    grown64 = s64 * growth_factor
    grow = at_interval & torch.isfinite(grown64.float())
    grown = torch.clamp(grown64, max=hi).float()
    clean_scale = torch.where(grow, grown, scale)
    clean_left = torch.where(
        at_interval, torch.full_like(hysteresis_left, hysteresis), hysteresis_left
    )

    scale.copy_(torch.where(found, overflow_scale, clean_scale))
    growth_tracker.copy_(torch.where(found | at_interval, zero, successful))
    hysteresis_left.copy_(torch.where(found, left, clean_left))
    if stats:
        assert counts is not None and prev_scale is not None
        _count_update(counts, prev_scale, scale, found_inf)


# ---------------------------------------------------------------------------
# Fused optimizers. Same element math as csrc/common/optim_math.h, one torch op
# per float32 operation so every intermediate is rounded as in the kernels.

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for int64 tensors holding uint32 values, without overflow."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    return x ^ (x >> 15)


def _sr_key(seed: int, step: Tensor, stream: int) -> Tensor:
    """common/optim_math.h sr_key on device: step is a 0-dim int64 tensor."""
    s = seed & 0xFFFFFFFFFFFFFFFF
    h = _mix32(torch.full_like(step, (s & _M32) ^ 0x9E3779B9))
    h = _mix32(h ^ (s >> 32))
    h = _mix32(h ^ step)
    return _mix32(h ^ stream)


# torch ScalarType codes (c10::ScalarType) of the grad dtypes: the SR stream.
_SCALAR_TYPE_CODE = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


def _bf16_stochastic(w: Tensor, key: Tensor, base: int) -> Tensor:
    """w (float32) rounded to bfloat16 with common/optim_math.h's SR bits."""
    flat = w.reshape(-1)
    u = flat.view(torch.int32).to(torch.int64) & _M32
    index = (torch.arange(flat.numel(), device=w.device, dtype=torch.int64) + base) & _M32
    r = (_mix32((_mix32(index ^ key) + key) & _M32) >> 16) & 0xFFFF
    finite = (u & 0x7F800000) != 0x7F800000
    nan = (u & 0x007FFFFF) != 0
    bits = torch.where(finite, (u + r) >> 16, (u >> 16) | torch.where(nan, 0x40, 0))
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return bits.to(torch.int16).view(torch.bfloat16).reshape(w.shape)


def _sr_bases(params: Sequence[Tensor], grads: Sequence[Tensor],
              given: Optional[Sequence[int]] = None) -> list[int]:
    """The SR number of each param's element 0: ``given`` (the ops' ``sr_bases``), else
    the 65536-element chunks of the params before it with its (param, grad) dtypes."""
    if given is not None:
        if len(given) != len(params):
            raise RuntimeError(f"sr_bases must be None or have one number per param "
                               f"({len(params)}), got {len(given)}")
        return [int(b) & _M32 for b in given]
    counts: dict[tuple[torch.dtype, torch.dtype], int] = {}
    bases = []
    for p, g in zip(params, grads):
        key = (p.dtype, g.dtype)
        c = counts.get(key, 0)
        bases.append(c * 65536)
        counts[key] = c + (p.numel() + 65535) // 65536
    return bases


def _prepare_grad(
    g: Tensor, grad_scale: Optional[Tensor], clip_coef: Optional[Tensor], maximize: bool
) -> Tensor:
    g = g.float()
    if grad_scale is not None:
        g = g * (1.0 / grad_scale.reshape(()).double()).float()
    if clip_coef is not None:
        g = g * clip_coef.reshape(())
    if maximize:
        g = -g
    return g


def _f32(x: float) -> float:
    """x rounded to float32 (as a Python float)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _store(dst: Tensor, new: Tensor, keep: Optional[Tensor]) -> None:
    """``dst = new``, unless ``keep`` (the step's found_inf != 0) holds."""
    dst.copy_(new if keep is None else torch.where(keep, dst, new))


def _keep(found_inf: Optional[Tensor]) -> Optional[Tensor]:
    return None if found_inf is None else found_inf.reshape(()) != 0


def _write_param(
    p: Tensor,
    w: Tensor,
    master: Optional[Tensor],
    keep: Optional[Tensor],
    stochastic_rounding: bool,
    seed: int,
    step: Tensor,
    grad_dtype: torch.dtype,
    base: int,
) -> None:
    """Store the new float32 weights ``w`` of step ``step`` (0-dim) in the master and the param."""
    if master is not None:
        _store(master, w, keep)
    if stochastic_rounding and p.dtype == torch.bfloat16:
        key = _sr_key(seed, step.to(torch.int64), _SCALAR_TYPE_CODE[grad_dtype])
        new = _bf16_stochastic(w, key, base)
    else:
        new = w.to(p.dtype)
    _store(p, new, keep)


def fused_adam_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    max_exp_avg_sqs: Sequence[Tensor],
    master_params: Sequence[Tensor],
    state_steps: Sequence[Tensor],
    lr: Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
    grad_scale: Optional[Tensor] = None,
    found_inf: Optional[Tensor] = None,
    clip_coef: Optional[Tensor] = None,
    stochastic_rounding: bool = False,
    seed: int = 0,
    sr_bases: Optional[Sequence[int]] = None,
) -> None:
    """Reference of ``torch.ops.mixprec.fused_adam_`` (see :func:`mixprec.ops.fused_adam_`).

    Stochastic rounding numbers elements in logical (row-major) order, which
    is the kernels' memory order for contiguous params.
    """
    op = "fused_adam_"
    _check_optim(
        op,
        params,
        grads,
        [
            ("exp_avgs", exp_avgs, True),
            ("exp_avg_sqs", exp_avg_sqs, True),
            ("max_exp_avg_sqs", max_exp_avg_sqs, amsgrad),
        ],
        master_params,
        state_steps,
        lr,
        [("grad_scale", grad_scale), ("found_inf", found_inf), ("clip_coef", clip_coef)],
        stochastic_rounding,
    )
    if not 0.0 <= beta1 < 1.0:
        raise RuntimeError(f"mixprec.{op}: beta1 must be in [0, 1), got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise RuntimeError(f"mixprec.{op}: beta2 must be in [0, 1), got {beta2}")
    _check_finite_nonneg(op, "weight_decay", weight_decay)
    _check_finite_nonneg(op, "eps", eps)
    if len(params) == 0:
        return
    keep = _keep(found_inf)
    lr64 = lr.reshape(()).double()
    w1 = _f32(1.0 - beta1)
    w1_rest = _f32(1.0 - w1)
    bases = _sr_bases(params, grads, sr_bases) if stochastic_rounding else [0] * len(params)
    for i, p in enumerate(params):
        if p.numel() == 0:
            _store(state_steps[i], state_steps[i] + 1, keep)
            continue
        master = master_params[i] if master_params else None
        step_t = state_steps[i].reshape(()) + 1
        t = step_t.double()
        bc1 = 1.0 - torch.pow(torch.full_like(t, beta1), t)
        bc2 = 1.0 - torch.pow(torch.full_like(t, beta2), t)
        neg_step = (-(lr64 / bc1)).float()
        bc2_sqrt = bc2.sqrt().float()
        decay = (1.0 - lr64 * weight_decay).float()

        g = _prepare_grad(grads[i], grad_scale, clip_coef, maximize)
        w = master.clone() if master is not None else p.float()
        if weight_decay != 0:
            if decoupled_weight_decay:
                w = w * decay
            else:
                g = g + weight_decay * w
        m = exp_avgs[i]
        if abs(w1) < 0.5:
            m_new = m + w1 * (g - m)
        else:
            m_new = g - (g - m) * w1_rest
        v = exp_avg_sqs[i]
        v_new = v * beta2
        v_new = v_new + ((1.0 - beta2) * g) * g
        vhat = v_new
        if amsgrad:
            vm_new = torch.maximum(max_exp_avg_sqs[i], v_new)
            vhat = vm_new
            _store(max_exp_avg_sqs[i], vm_new, keep)
        # The kernels' sqrt is IEEE (correctly rounded) on every ISA. torch's
        # float32 CPU sqrt goes through MKL VML (HA mode), whose generic code
        # path (taken e.g. on AMD CPUs) is off by 1 ulp for ~20% of inputs.
        # sqrt in float64 rounded to float32 is correctly rounded for every
        # float32 input, even from a float64 sqrt up to 3 ulps off: sqrt(x) of
        # a float32 x lies at least 4 float64 ulps away from every float32
        # rounding midpoint (the square of a midpoint needs 49+ bits).
        denom = vhat.double().sqrt().float() / bc2_sqrt + eps
        w = w + (neg_step * m_new) / denom
        _store(m, m_new, keep)
        _store(v, v_new, keep)
        _write_param(
            p, w, master, keep, stochastic_rounding, seed, step_t, grads[i].dtype, bases[i]
        )
        _store(state_steps[i], state_steps[i] + 1, keep)


def fused_sgd_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    master_params: Sequence[Tensor],
    state_steps: Sequence[Tensor],
    lr: Tensor,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
    grad_scale: Optional[Tensor] = None,
    found_inf: Optional[Tensor] = None,
    clip_coef: Optional[Tensor] = None,
    stochastic_rounding: bool = False,
    seed: int = 0,
    sr_bases: Optional[Sequence[int]] = None,
) -> None:
    """Reference of ``torch.ops.mixprec.fused_sgd_`` (see :func:`mixprec.ops.fused_sgd_`)."""
    op = "fused_sgd_"
    has_mom = momentum != 0.0
    _check_optim(
        op,
        params,
        grads,
        [("momentum_buffers", momentum_buffers, has_mom)],
        master_params,
        state_steps,
        lr,
        [("grad_scale", grad_scale), ("found_inf", found_inf), ("clip_coef", clip_coef)],
        stochastic_rounding,
    )
    _check_finite_nonneg(op, "weight_decay", weight_decay)
    _check_finite_nonneg(op, "momentum", momentum)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise RuntimeError(
            f"mixprec.{op}: nesterov requires momentum > 0 and dampening == 0 "
            f"(got momentum {momentum}, dampening {dampening})"
        )
    if len(params) == 0:
        return
    keep = _keep(found_inf)
    neg_lr = (-lr.reshape(()).double()).float()
    bases = _sr_bases(params, grads, sr_bases) if stochastic_rounding else [0] * len(params)
    for i, p in enumerate(params):
        step_before = state_steps[i].reshape(())
        if p.numel() > 0:
            master = master_params[i] if master_params else None
            g = _prepare_grad(grads[i], grad_scale, clip_coef, maximize)
            w = master.clone() if master is not None else p.float()
            if weight_decay != 0:
                g = g + weight_decay * w
            if has_mom:
                buf = momentum_buffers[i]
                later = buf * momentum
                later = later + (1.0 - dampening) * g
                buf_new = torch.where(step_before == 0, g, later)
                g = g + momentum * buf_new if nesterov else buf_new
                _store(buf, buf_new, keep)
            w = w + neg_lr * g
            _write_param(
                p, w, master, keep, stochastic_rounding, seed, step_before + 1, grads[i].dtype,
                bases[i],
            )
        _store(state_steps[i], state_steps[i] + 1, keep)


def fused_adam8_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_absmax: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    exp_avg_sq_absmax: Sequence[Tensor],
    master_params: Sequence[Tensor],
    state_steps: Sequence[Tensor],
    lr: Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
    decoupled_weight_decay: bool,
    grad_scale: Optional[Tensor] = None,
    found_inf: Optional[Tensor] = None,
    clip_coef: Optional[Tensor] = None,
    stochastic_rounding: bool = False,
    seed: int = 0,
    sr_bases: Optional[Sequence[int]] = None,
) -> None:
    """One Adam/AdamW step with block-wise 8-bit moments (:mod:`mixprec.optim._quant8`).

    ``exp_avgs``/``exp_avg_sqs``: uint8 codes of each param's shape (tables
    ``dynamic8-signed``/``dynamic8-unsigned``), ``exp_avg_absmax``/``exp_avg_sq_absmax``:
    their float32 block maxima, ``(ceil(numel / 256),)``. Each moment is read back in
    float32, updated exactly as :func:`fused_adam_` updates a float32 moment (amsgrad is
    not offered), and quantized again; with ``found_inf`` set nothing changes (codes and
    maxima included). Mutates params, masters, codes, maxima and step counts.
    """
    from mixprec.optim import _quant8 as q8

    op = "fused_adam8_"
    _check_optim(op, params, grads, [], master_params, state_steps, lr,
                 [("grad_scale", grad_scale), ("found_inf", found_inf),
                  ("clip_coef", clip_coef)], stochastic_rounding)
    _check_codes8(op, params, [("exp_avgs", "exp_avg_absmax", exp_avgs, exp_avg_absmax),
                               ("exp_avg_sqs", "exp_avg_sq_absmax", exp_avg_sqs,
                                exp_avg_sq_absmax)])
    if not 0.0 <= beta1 < 1.0:
        raise RuntimeError(f"mixprec.{op}: beta1 must be in [0, 1), got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise RuntimeError(f"mixprec.{op}: beta2 must be in [0, 1), got {beta2}")
    _check_finite_nonneg(op, "weight_decay", weight_decay)
    _check_finite_nonneg(op, "eps", eps)
    ms = [q8.dequantize(c, a, q8.SIGNED) for c, a in zip(exp_avgs, exp_avg_absmax)]
    vs = [q8.dequantize(c, a, q8.UNSIGNED) for c, a in zip(exp_avg_sqs, exp_avg_sq_absmax)]
    fused_adam_(params, grads, ms, vs, [], master_params, state_steps, lr, beta1, beta2,
                weight_decay, eps, False, maximize, decoupled_weight_decay, grad_scale,
                found_inf, clip_coef, stochastic_rounding, seed, sr_bases)
    keep = _keep(found_inf)
    _requantize(ms, exp_avgs, exp_avg_absmax, q8.SIGNED, keep)
    _requantize(vs, exp_avg_sqs, exp_avg_sq_absmax, q8.UNSIGNED, keep)


def fused_sgd8_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    momentum_absmax: Sequence[Tensor],
    master_params: Sequence[Tensor],
    state_steps: Sequence[Tensor],
    lr: Tensor,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
    grad_scale: Optional[Tensor] = None,
    found_inf: Optional[Tensor] = None,
    clip_coef: Optional[Tensor] = None,
    stochastic_rounding: bool = False,
    seed: int = 0,
    sr_bases: Optional[Sequence[int]] = None,
) -> None:
    """One SGD step with a block-wise 8-bit momentum buffer (``dynamic8-signed`` codes of
    each param's shape, float32 maxima per block of 256): read back in float32, updated as
    :func:`fused_sgd_` updates a float32 buffer, quantized again; nothing changes with
    ``found_inf`` set."""
    from mixprec.optim import _quant8 as q8

    op = "fused_sgd8_"
    if not 0.0 < momentum < float("inf"):
        raise RuntimeError(
            f"mixprec.{op}: momentum must be a finite number > 0 (the 8-bit state is the "
            f"momentum buffer; without momentum call fused_sgd_), got {momentum}")
    _check_optim(op, params, grads, [], master_params, state_steps, lr,
                 [("grad_scale", grad_scale), ("found_inf", found_inf),
                  ("clip_coef", clip_coef)], stochastic_rounding)
    _check_codes8(op, params, [("momentum_buffers", "momentum_absmax", momentum_buffers,
                                momentum_absmax)])
    _check_finite_nonneg(op, "weight_decay", weight_decay)
    if nesterov and dampening != 0:
        raise RuntimeError(
            f"mixprec.{op}: nesterov requires momentum > 0 and dampening == 0 "
            f"(got momentum {momentum}, dampening {dampening})"
        )
    if not abs(dampening) < float("inf"):
        raise RuntimeError(f"mixprec.{op}: dampening must be finite, got {dampening}")
    bufs = [q8.dequantize(c, a, q8.SIGNED) for c, a in zip(momentum_buffers, momentum_absmax)]
    fused_sgd_(params, grads, bufs, master_params, state_steps, lr, weight_decay, momentum,
               dampening, nesterov, maximize, grad_scale, found_inf, clip_coef,
               stochastic_rounding, seed, sr_bases)
    _requantize(bufs, momentum_buffers, momentum_absmax, q8.SIGNED, _keep(found_inf))


def _check_codes8(op: str, params: Sequence[Tensor],
                  lists: Sequence[tuple[str, str, Sequence[Tensor], Sequence[Tensor]]]) -> None:
    """The 8-bit ops' checks of their code and maxima lists (before anything is written)."""
    from mixprec.optim import _quant8 as q8

    n = len(params)
    for name, absname, codes_list, absmax_list in lists:
        for lname, lst in ((name, codes_list), (absname, absmax_list)):
            if len(lst) != n:
                raise RuntimeError(f"mixprec.{op}: {lname} must have one tensor per param "
                                   f"({n}), got {len(lst)}")
        for i, p in enumerate(params):
            codes, absmax = codes_list[i], absmax_list[i]
            if codes.device != p.device:
                raise RuntimeError(f"mixprec.{op}: {name}[{i}] is on {codes.device} but "
                                   f"params[0] is on {p.device}")
            if codes.shape != p.shape:
                raise RuntimeError(
                    f"mixprec.{op}: {name}[{i}] has shape {list(codes.shape)} but params[{i}] "
                    f"has shape {list(p.shape)}")
            if codes.dtype != torch.uint8 or not codes.is_contiguous():
                raise RuntimeError(
                    f"mixprec.{op}: {name}[{i}] must be contiguous uint8 codes, got "
                    f"{codes.dtype}{'' if codes.is_contiguous() else ' (not contiguous)'}")
            want = q8.absmax_shape(p.shape)
            if (absmax.dtype != torch.float32 or tuple(absmax.shape) != want
                    or not absmax.is_contiguous()):
                raise RuntimeError(
                    f"mixprec.{op}: {absname}[{i}] must be a contiguous float32 tensor of "
                    f"shape {list(want)} (one per block of up to {q8.BLOCK} elements of "
                    f"each row of params[{i}]), got {absmax.dtype} of shape "
                    f"{list(absmax.shape)}")
            if absmax.device != p.device:
                raise RuntimeError(f"mixprec.{op}: {absname}[{i}] is on {absmax.device} but "
                                   f"params[0] is on {p.device}")


def _requantize(values: Sequence[Tensor], codes: Sequence[Tensor], maxima: Sequence[Tensor],
                table: str, keep: Optional[Tensor]) -> None:
    """Quantize ``values`` into ``codes``/``maxima`` in place, unless ``keep``."""
    from mixprec.optim import _quant8 as q8

    for x, c, a in zip(values, codes, maxima):
        new_c, new_a = q8.quantize(x, table)
        _store(c, new_c, keep)
        _store(a, new_a, keep)
