"""Numerical diagnostics for mixed precision.

* :func:`check_fp16_safe` -- how many values of a tensor would overflow or
  underflow if cast to float16 (or another dtype);
* :func:`health_report` -- per-parameter gradient and weight norms of a model,
  with warnings for vanishing, exploding and non-finite gradients;
* :func:`compare_precisions` -- error of float16 and bfloat16 matmuls against
  float32, for several sizes.

All three read results back to the host (one sync each; documented per
function). They are meant for debugging and reports, not for the inner loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

__all__ = [
    "check_fp16_safe",
    "health_report",
    "HealthReport",
    "ParamHealth",
    "compare_precisions",
]


def check_fp16_safe(t: Tensor, dtype: torch.dtype = torch.float16) -> tuple[int, int]:
    """Count the values of ``t`` that a cast to ``dtype`` would ruin.

    Args:
        t: any floating tensor, any device, any shape (read only).
        dtype: the target low-precision dtype (default float16).

    Returns:
        ``(overflow_count, underflow_count)``: finite values whose cast is
        infinite, and nonzero values whose cast is zero. Values that are
        already inf/NaN are counted in neither. One host sync.
    """
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise TypeError(
            f"check_fp16_safe: expected a floating-point tensor, got "
            f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}"
        )
    with torch.no_grad():
        x = t.detach()
        cast = x.to(dtype)
        overflow = torch.isfinite(x) & torch.isinf(cast)
        underflow = (x != 0) & (cast == 0)
        counts = torch.stack((overflow.sum(), underflow.sum())).tolist()
    return int(counts[0]), int(counts[1])


@dataclass(frozen=True)
class ParamHealth:
    """Health numbers of one parameter (norms are float32 L2 norms).

    ``grad_norm`` is ``None`` when the param has no gradient; ``grad_finite``
    tells whether every gradient element is finite; ``fp16_overflow`` /
    ``fp16_underflow`` count gradient values a float16 cast would ruin.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    param_norm: float
    grad_norm: Optional[float]
    grad_finite: bool
    fp16_overflow: int
    fp16_underflow: int


@dataclass
class HealthReport:
    """Result of :func:`health_report`: ``params`` in model order, ``warnings``."""

    params: list[ParamHealth] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when there are no warnings."""
        return not self.warnings

    def as_dict(self) -> dict[str, Any]:
        """Plain-dict form (for JSON/loggers)."""
        return {
            "params": [p.__dict__.copy() for p in self.params],
            "warnings": list(self.warnings),
        }

    def __str__(self) -> str:
        lines = [f"{'parameter':40s} {'dtype':9s} {'|w|':>10s} {'|g|':>10s}"]
        for p in self.params:
            g = "-" if p.grad_norm is None else f"{p.grad_norm:10.3e}"
            lines.append(f"{p.name[:40]:40s} {p.dtype:9s} {p.param_norm:10.3e} {g:>10s}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def health_report(
    model: nn.Module,
    vanishing_threshold: float = 1e-8,
    exploding_threshold: float = 1e3,
) -> HealthReport:
    """Per-parameter gradient and parameter norms of ``model``, with warnings.

    Call it after ``backward()`` (and after unscaling, or the norms carry the
    loss scale). Warnings: non-finite gradients, gradient norm below
    ``vanishing_threshold`` (vanishing) or above ``exploding_threshold``
    (exploding), and gradient values that would overflow/underflow in float16.
    Read only. All numbers are gathered on the device and read back with one
    host sync.
    """
    named = [(n, p) for n, p in model.named_parameters()]
    report = HealthReport()
    if not named:
        return report
    with torch.no_grad():
        rows = []
        for _, p in named:
            w = torch.linalg.vector_norm(p.detach().float())
            g = p.grad
            if g is None:
                z = torch.zeros((), device=w.device)
                rows.append(torch.stack((w, z, z + 1, z, z)))
                continue
            gd = g.detach()
            gf = gd.float()
            finite = torch.isfinite(gf)
            gn = torch.linalg.vector_norm(torch.where(finite, gf, torch.zeros_like(gf)))
            cast = gd.to(torch.float16)
            over = (finite & torch.isinf(cast)).sum().float()
            under = ((gd != 0) & (cast == 0)).sum().float()
            rows.append(torch.stack((w, gn, finite.all().float(), over, under)).to(w.device))
        device = rows[0].device
        table = torch.stack([r.to(device) for r in rows]).cpu().tolist()
    for (name, p), (w, gn, finite, over, under) in zip(named, table):
        has_grad = p.grad is not None
        ph = ParamHealth(
            name=name,
            shape=tuple(p.shape),
            dtype=str(p.dtype).replace("torch.", ""),
            param_norm=float(w),
            grad_norm=float(gn) if has_grad else None,
            grad_finite=bool(finite),
            fp16_overflow=int(over),
            fp16_underflow=int(under),
        )
        report.params.append(ph)
        if not has_grad:
            continue
        if not ph.grad_finite:
            report.warnings.append(f"{name}: non-finite gradient (inf/NaN)")
        elif ph.grad_norm is not None and ph.grad_norm < vanishing_threshold:
            report.warnings.append(
                f"{name}: vanishing gradient (norm {ph.grad_norm:.2e} < {vanishing_threshold:g})"
            )
        elif ph.grad_norm is not None and ph.grad_norm > exploding_threshold:
            report.warnings.append(
                f"{name}: exploding gradient (norm {ph.grad_norm:.2e} > {exploding_threshold:g})"
            )
        if ph.fp16_overflow:
            report.warnings.append(
                f"{name}: {ph.fp16_overflow} gradient values would overflow in float16"
            )
        if ph.fp16_underflow:
            report.warnings.append(
                f"{name}: {ph.fp16_underflow} gradient values would underflow to 0 in float16"
            )
    return report


def compare_precisions(
    sizes: Sequence[int] = (64, 256, 1024),
    dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Error of low-precision matmuls against float32.

    For each ``n`` in ``sizes``: ``a, b`` are ``n x n`` standard-normal float32
    matrices (fixed ``seed``, generated on the CPU then moved); the reference
    is ``a @ b`` in float32; each dtype computes ``a.to(dtype) @ b.to(dtype)``.

    Returns:
        One dict per (size, dtype): ``size``, ``dtype`` (``"float16"``...),
        ``max_abs_error``, ``mean_abs_error``, ``rel_error`` (Frobenius norm of
        the error over that of the reference), ``eps`` (the dtype's machine
        epsilon, for scale). One host sync per entry.
    """
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    out: list[dict[str, Any]] = []
    for n in sizes:
        if n < 1:
            raise ValueError(f"compare_precisions: sizes must be >= 1, got {n}")
        a = torch.randn(n, n, generator=gen).to(dev)
        b = torch.randn(n, n, generator=gen).to(dev)
        ref = a @ b
        for dtype in dtypes:
            low = (a.to(dtype) @ b.to(dtype)).float()
            err = (low - ref).abs()
            vals = torch.stack(
                (err.max(), err.mean(), torch.linalg.norm(low - ref) / torch.linalg.norm(ref))
            ).tolist()
            out.append(
                {
                    "size": int(n),
                    "dtype": str(dtype).replace("torch.", ""),
                    "max_abs_error": float(vals[0]),
                    "mean_abs_error": float(vals[1]),
                    "rel_error": float(vals[2]),
                    "eps": float(torch.finfo(dtype).eps),
                }
            )
    return out
