"""Argument validation of the pure-PyTorch reference ops (:mod:`_reference`).

The same rules, checked in the same order and reported with the same messages,
as the compiled kernels' validation: a rejected call raises before any tensor
changes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_scalar(
    op: str,
    name: str,
    t: Tensor,
    dtypes: tuple[torch.dtype, ...],
    kinds: str,
    device: torch.device,
    anchor: str,
) -> None:
    """A one-element ``dtypes`` tensor on ``device`` (the device of ``anchor``)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"mixprec.{op}: {name} must be a Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise RuntimeError(f"mixprec.{op}: {name} must be a dense (strided) tensor, got {t.layout}")
    if t.dtype not in dtypes:
        raise RuntimeError(f"mixprec.{op}: {name} must be a {kinds} tensor, got {t.dtype}")
    if t.numel() != 1:
        raise RuntimeError(
            f"mixprec.{op}: {name} must be a one-element tensor, got shape {list(t.shape)}"
        )
    if t.device != device:
        raise RuntimeError(
            f"mixprec.{op}: {name} must be on {device} (the device of {anchor}), got {t.device}"
        )


def _check_state(op: str, name: str, t: Tensor, dtype: torch.dtype, device: torch.device) -> None:
    _check_scalar(op, name, t, (dtype,), str(dtype), device, "found_inf")


def _check_member(
    op: str,
    where: str,
    t: Tensor,
    device: torch.device,
    anchor: str,
    written: bool,
    layout_note: str = "",
    check_dtype: bool = False,
) -> None:
    """A list member ``where`` (``name[i]``): dense, (a float dtype,) on ``device`` (that of
    ``anchor``), and without internal overlap when the op writes it."""
    if t.layout != torch.strided:
        raise RuntimeError(
            f"mixprec.{op}: {where} must be a dense (strided) tensor, got layout {t.layout}"
            + layout_note
        )
    if check_dtype and t.dtype not in _FLOATS:
        raise RuntimeError(
            f"mixprec.{op}: {where} must be float32, float16, bfloat16 or float64, got {t.dtype}"
        )
    if t.device != device:
        raise RuntimeError(
            f"mixprec.{op}: {where} is on {t.device} but {anchor} is on {device}; "
            "call the op once per device"
        )
    if written and torch._debug_has_internal_overlap(t) == 1:
        raise RuntimeError(
            f"mixprec.{op}: {where} has internal overlap (e.g. an expanded tensor), so an "
            "in-place write would touch an element more than once"
        )


def _check_disjoint(op: str, name: str, tensors: Sequence[Tensor]) -> None:
    """csrc/common/checks.cpp check_disjoint: no two dense tensors of a written list share
    memory."""
    spans = []
    for i, t in enumerate(tensors):
        if isinstance(t, Tensor) and t.device == tensors[0].device and _dense_permuted(t):
            begin = t.data_ptr()
            spans.append((begin, begin + t.numel() * t.element_size(), i))
    spans.sort()
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise RuntimeError(
                f"mixprec.{op}: {name}[{min(a, b)}] and {name}[{max(a, b)}] share memory (the "
                "same tensor twice, or overlapping views of one), so an in-place update would "
                "write an element twice")


def _dense_permuted(t: Tensor) -> bool:
    """Non-overlapping and dense in some order of its dims (TensorImpl's flag)."""
    if not (isinstance(t, Tensor) and t.layout == torch.strided and t.numel() > 0
            and t.device.type != "meta"):
        return False
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def _check_list(
    op: str, name: str, tensors: Sequence[Tensor], device: torch.device, written: bool = False
) -> None:
    if written:
        _check_disjoint(op, name, tensors)
    for i, t in enumerate(tensors):
        _check_member(op, f"{name}[{i}]", t, device, "found_inf", written, check_dtype=True)


def _check_norm_args(
    op: str,
    grads: Sequence[Tensor],
    found_inf: Tensor,
    inv_scale: Tensor,
    norm_type: float,
    written: bool,
) -> None:
    _check_state(op, "found_inf", found_inf, torch.float32, found_inf.device)
    _check_state(op, "inv_scale", inv_scale, torch.float32, found_inf.device)
    _check_list(op, "grads", grads, found_inf.device, written=written)
    if not norm_type > 0:
        raise RuntimeError(f"mixprec.{op}: norm_type must be > 0 or inf, got {norm_type}")


def _check_update_args(
    op: str,
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_interval: int,
    hysteresis_left: Optional[Tensor] = None,
) -> None:
    dev = scale.device
    _check_state(op, "scale", scale, torch.float32, dev)
    _check_state(op, "growth_tracker", growth_tracker, torch.int32, dev)
    if hysteresis_left is not None:
        _check_state(op, "hysteresis_left", hysteresis_left, torch.int32, dev)
    _check_state(op, "found_inf", found_inf, torch.float32, dev)
    if not 1 <= growth_interval <= 2**31 - 1:
        raise RuntimeError(
            f"mixprec.{op}: growth_interval must be a positive 32-bit integer, got "
            f"{growth_interval}"
        )


def _check_scale_stats(op: str, counts: Optional[Tensor], prev_scale: Optional[Tensor],
                       device: torch.device) -> bool:
    """update_scale_(ext_)'s statistics: int64 ``counts`` of 5 (1-D, dense) and float32
    one-element ``prev_scale`` on ``device``, both or neither; whether they are given."""
    if (counts is None) != (prev_scale is None):
        alone = "counts" if prev_scale is None else "prev_scale"
        raise RuntimeError(f"mixprec.{op}: counts and prev_scale go together, got {alone} alone")
    if counts is None:
        return False
    if counts.layout != torch.strided:
        raise RuntimeError(f"mixprec.{op}: counts must be a dense (strided) tensor, got layout "
                           f"{counts.layout}")
    if counts.dtype != torch.int64:
        raise RuntimeError(f"mixprec.{op}: counts must be an int64 tensor, got {counts.dtype}")
    if counts.dim() != 1 or counts.numel() != 5 or counts.stride() != (1,):
        raise RuntimeError(f"mixprec.{op}: counts must be a dense 1-D tensor of 5 elements, got "
                           f"shape {list(counts.shape)} strides {list(counts.stride())}")
    if counts.device != device:
        raise RuntimeError(f"mixprec.{op}: counts must be on {device} (the device of scale), "
                           f"got {counts.device}")
    _check_scalar(op, "prev_scale", prev_scale, (torch.float32,), "float32", device, "scale")
    return True


_PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_optim_scalar(
    op: str, name: str, t: Tensor, device: torch.device, allow_double: bool = False
) -> None:
    if allow_double:
        _check_scalar(op, name, t, (torch.float32, torch.float64), "float32 or float64", device,
                      "params")
    else:
        _check_scalar(op, name, t, (torch.float32,), "float32", device, "params")


def _check_finite_nonneg(op: str, name: str, value: float) -> None:
    if not 0.0 <= value < float("inf"):
        raise RuntimeError(f"mixprec.{op}: {name} must be a finite number >= 0, got {value}")


def _check_optim(
    op: str,
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    states: Sequence[tuple[str, Sequence[Tensor], bool]],
    master_params: Sequence[Tensor],
    state_steps: Sequence[Tensor],
    lr: Tensor,
    scalars: Sequence[tuple[str, Optional[Tensor]]],
    stochastic_rounding: bool,
) -> None:
    n = len(params)
    if len(grads) != n:
        raise RuntimeError(f"mixprec.{op}: grads has {len(grads)} tensors but params has {n}")
    for name, lst, required in states:
        want = n if required else 0
        if len(lst) != want:
            raise RuntimeError(f"mixprec.{op}: {name} must have {want} tensors, got {len(lst)}")
    if len(master_params) not in (0, n):
        raise RuntimeError(
            f"mixprec.{op}: master_params must be empty or have one tensor per param ({n}), "
            f"got {len(master_params)}"
        )
    if len(state_steps) != n:
        raise RuntimeError(
            f"mixprec.{op}: state_steps has {len(state_steps)} tensors but params has {n}"
        )
    if stochastic_rounding and len(master_params) > 0:
        raise RuntimeError(
            f"mixprec.{op}: stochastic_rounding applies to bfloat16 params updated in place; "
            "it cannot be combined with master_params"
        )
    device = params[0].device if n > 0 else lr.device
    _check_optim_scalar(op, "lr", lr, device, allow_double=True)
    for name, t in scalars:
        if t is not None:
            _check_optim_scalar(op, name, t, device)

    _check_disjoint(op, "params", params)
    for name, lst, _ in states:
        _check_disjoint(op, name, lst)
    _check_disjoint(op, "master_params", master_params)

    def member(name: str, i: int, t: Tensor, p: Tensor, written: bool = True) -> None:
        _check_member(op, f"{name}[{i}]", t, device, "params[0]", written,
                      "; sparse gradients are not supported")
        if t.shape != p.shape:
            raise RuntimeError(
                f"mixprec.{op}: {name}[{i}] has shape {list(t.shape)} but params[{i}] has shape "
                f"{list(p.shape)}"
            )

    for i, p in enumerate(params):
        if p.dtype not in _PARAM_DTYPES:
            raise RuntimeError(
                f"mixprec.{op}: params[{i}] must be float32, float16 or bfloat16, got {p.dtype}"
            )
        member("params", i, p, p)
        member("grads", i, grads[i], p, written=False)
        if grads[i].dtype not in _PARAM_DTYPES:
            raise RuntimeError(
                f"mixprec.{op}: grads[{i}] must be float32, float16 or bfloat16, got "
                f"{grads[i].dtype}"
            )
        for name, lst, _ in states:
            if len(lst) == 0:
                continue
            member(name, i, lst[i], p)
            if lst[i].dtype != torch.float32:
                raise RuntimeError(f"mixprec.{op}: {name}[{i}] must be float32, got {lst[i].dtype}")
        if master_params:
            member("master_params", i, master_params[i], p)
            if master_params[i].dtype != torch.float32:
                raise RuntimeError(
                    f"mixprec.{op}: master_params[{i}] must be float32, got "
                    f"{master_params[i].dtype}"
                )
            if p.dtype == torch.float32:
                raise RuntimeError(
                    f"mixprec.{op}: params[{i}] is float32 and needs no master copy; pass "
                    "float32 params in a call without master_params"
                )
        st = state_steps[i]
        if st.dtype != torch.float32 or st.numel() != 1 or st.layout != torch.strided:
            raise RuntimeError(
                f"mixprec.{op}: state_steps[{i}] must be a one-element float32 tensor, got "
                f"{st.dtype} of shape {list(st.shape)}"
            )
        if st.device != device:
            raise RuntimeError(
                f"mixprec.{op}: state_steps[{i}] is on {st.device} but params[0] is on {device}"
            )
