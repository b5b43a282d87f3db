"""Numerical diagnostics for mixed precision, in plain PyTorch, stateless, and not meant for
every step (a few small kernels per tensor): :func:`check_fp16_safe` (the values a cast to float16
would overflow or flush, no sync), :func:`health_report` (per-parameter param and grad norms,
non-finite counts, vanishing/exploding flags, one sync), :func:`compare_precisions` (float16 and
bfloat16 autocast error against float32 on a workload, one sync per precision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["check_fp16_safe", "Fp16Safety", "health_report", "HealthReport", "ParamHealth",
           "compare_precisions", "PrecisionError"]


class Fp16Safety(NamedTuple):
    """What a cast to float16 (or the ``dtype`` asked for) would do to a tensor. Both counts
    are 0-dim int64 tensors on the tensor's device (read them with ``int()``: a host sync)."""

    overflow: Tensor  # finite values whose cast is inf (|x| >= 65520 for float16)
    underflow: Tensor  # nonzero values whose cast is 0 (|x| <= 2**-25 for float16)


def check_fp16_safe(tensor: Tensor, dtype: torch.dtype = torch.float16) -> Fp16Safety:
    """Count the values of ``tensor`` that a cast to ``dtype`` would ruin.

    Args:
        tensor: a floating-point tensor of any shape, dtype and device. Read only.
        dtype: the low-precision dtype to check against (default ``torch.float16``).

    Returns:
        :class:`Fp16Safety` ``(overflow, underflow)``: the finite values whose cast is
        infinite and the nonzero values whose cast is zero, as 0-dim int64 tensors on
        ``tensor``'s device. Values already inf or NaN count in neither. No host sync; one
        temporary of ``tensor``'s size in ``dtype``.
    """
    if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
        got = tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__
        raise TypeError(f"mixprec.check_fp16_safe: expected a floating-point tensor, got {got}")
    with torch.no_grad():
        x = tensor.detach()
        cast = x.to(dtype)
        overflow = (torch.isfinite(x) & torch.isinf(cast)).sum()
        underflow = ((x != 0) & (cast == 0)).sum()
    return Fp16Safety(overflow, underflow)


@dataclass(frozen=True)
class ParamHealth:
    """The health of one parameter. Norms are L2 norms computed in float32; ``grad_norm``
    counts the finite gradient values only and is None without a gradient."""

    name: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    param_norm: float
    grad_norm: Optional[float]
    grad_nonfinite: int  # inf/NaN gradient values
    vanishing: bool  # grad_norm below the report's vanishing threshold
    exploding: bool  # grad_norm above the report's exploding threshold


@dataclass(frozen=True)
class HealthReport:
    """The result of :func:`health_report`: one :class:`ParamHealth` per parameter, in the
    order of ``model.named_parameters()``."""

    params: List[ParamHealth]

    @property
    def ok(self) -> bool:
        """No non-finite, vanishing or exploding gradient."""
        return not self.warnings()

    def warnings(self) -> List[str]:
        """One line per parameter with a non-finite, vanishing or exploding gradient."""
        out = []
        for p in self.params:
            if p.grad_nonfinite:
                out.append(f"{p.name}: {p.grad_nonfinite} non-finite gradient values")
            if p.vanishing:
                out.append(f"{p.name}: vanishing gradient (norm {p.grad_norm:.2e})")
            if p.exploding:
                out.append(f"{p.name}: exploding gradient (norm {p.grad_norm:.2e})")
        return out

    def __str__(self) -> str:
        rows = [f"{'parameter':40s} {'dtype':9s} {'|w|':>10s} {'|g|':>10s} {'inf/nan':>8s}"]
        for p in self.params:
            g = "-" if p.grad_norm is None else f"{p.grad_norm:10.3e}"
            rows.append(f"{p.name[:40]:40s} {str(p.dtype)[6:]:9s} {p.param_norm:10.3e} "
                        f"{g:>10s} {p.grad_nonfinite:8d}")
        return "\n".join(rows + [f"warning: {w}" for w in self.warnings()])


def health_report(model: nn.Module, vanishing_threshold: float = 1e-8,
                  exploding_threshold: float = 1e3) -> HealthReport:
    """The norms of ``model``'s params and grads, with their non-finite gradient counts and
    vanishing (norm below ``vanishing_threshold``) / exploding (above ``exploding_threshold``)
    flags; non-finite values are left out of the norms. Call it after ``backward()`` and, with a
    loss scale, after ``scaler.unscale_(optimizer)``. Any floating dtype; DTensor params report
    their local shard. One host sync (every figure stacked on the first param's device).
    """
    named = list(model.named_parameters())
    if not named:
        return HealthReport([])
    with torch.no_grad():
        device = named[0][1].device
        rows = []
        for _, p in named:
            w = torch.linalg.vector_norm(_local(p).detach().float())
            if p.grad is None:
                rows.append(torch.stack((w, w.new_zeros(()), w.new_zeros(()))).to(device))
                continue
            g = _local(p.grad).detach().float()
            finite = torch.isfinite(g)
            norm = torch.linalg.vector_norm(torch.where(finite, g, torch.zeros_like(g)))
            rows.append(torch.stack((w, norm, (~finite).sum().float())).to(device))
        table = torch.stack(rows).cpu().tolist()  # the one host sync
    params = []
    for (name, p), (w, gn, bad) in zip(named, table):
        has = p.grad is not None
        params.append(ParamHealth(name, tuple(p.shape), p.dtype, w, gn if has else None,
                                  int(bad), has and gn < vanishing_threshold,
                                  has and gn > exploding_threshold))
    return HealthReport(params)


def _local(t: Tensor) -> Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor
    return to_local() if callable(to_local) else t


@dataclass(frozen=True)
class PrecisionError:
    """The error of a workload's output in one precision against its float32 output."""

    max_abs: float  # the largest |out - ref| over the finite elements of both
    rel_l2: float  # ||out - ref|| / ||ref|| over those elements
    nonfinite: int  # elements non-finite in ``out`` but finite in ``ref``


def compare_precisions(workload: Optional[Callable[[], Tensor]] = None,
                       dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
                       device: Union[torch.device, str, None] = None,
                       ) -> Dict[torch.dtype, PrecisionError]:
    """The error of ``workload()`` under ``torch.autocast`` in each of ``dtypes`` against
    its float32 result (the same call without autocast).

    Args:
        workload: a callable taking no arguments and returning one floating tensor (e.g.
            ``lambda: model(x)``), deterministic from call to call. Default: the product of
            two random float32 512 x 512 matrices on ``device``.
        dtypes: the autocast dtypes to compare (float16 and bfloat16 by default).
        device: where the default workload runs (default: CUDA if available, else CPU).
            A workload you pass runs where its tensors are; autocast follows its output.

    Returns ``{dtype: PrecisionError}``. Runs ``workload`` ``1 + len(dtypes)`` times under
    ``torch.no_grad()``; one host sync per dtype.
    """
    if workload is None:
        dev = torch.device(device if device is not None
                           else "cuda" if torch.cuda.is_available() else "cpu")
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(512, 512, generator=gen).to(dev) for _ in range(2))
        workload = lambda: a @ b  # noqa: E731
    with torch.no_grad():
        ref = workload().detach().float()
        out: Dict[torch.dtype, PrecisionError] = {}
        for dtype in dtypes:
            with torch.autocast(ref.device.type, dtype=dtype):
                low = workload().detach().float()
            both = torch.isfinite(ref) & torch.isfinite(low)
            diff = torch.where(both, low - ref, torch.zeros_like(ref))
            ref_ok = torch.where(both, ref, torch.zeros_like(ref))
            max_abs, num, den, bad = torch.stack((
                diff.abs().amax() if diff.numel() else diff.new_zeros(()),
                torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref_ok),
                (torch.isfinite(ref) & ~torch.isfinite(low)).sum().float())).tolist()
            out[dtype] = PrecisionError(max_abs, num / den if den else 0.0, int(bad))
    return out
