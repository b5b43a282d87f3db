"""Helpers shared by the benchmarks and ``tools/gpu_workload.py``.

Timing (``torch.utils.benchmark``), the memory bound measured in the same run,
model shapes and the environment header -- and the guards that keep a
benchmark from printing a figure for work that did not happen:

* the ``check_*`` helpers compare what the timed code produced with a
  reference, within a tolerance derived from the arithmetic, and raise
  :class:`CheckFailed` (with the worst element) when it is off;
* :class:`Report` turns failed checks and figures above the memory bound into
  errors: printed where they happen, summed up after the table, and a non-zero
  exit status;
* :func:`run_control` turns "torch cannot run this case" (``NotImplementedError``,
  an unsupported dtype) into :class:`NA`, printed as ``n/a``, instead of a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import platform
import re
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.utils.benchmark as tbench
from torch import Tensor

import mixprec

Shape = Tuple[int, ...]

# ---------------------------------------------------------------------------------------------
# Shapes, timing, environment


def gpt2_shapes(n_layer: int = 12, vocab: int = 50257, n_embd: int = 768,
                n_ctx: int = 1024) -> List[Shape]:
    """Parameter (= gradient) shapes of a GPT-2 model; the defaults are GPT-2 small
    (148 tensors, 124.4M elements)."""
    d = n_embd
    shapes: List[Shape] = [(vocab, d), (n_ctx, d)]
    for _ in range(n_layer):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d),
                   (4 * d,), (4 * d, d), (d,)]
    shapes += [(d,), (d,)]
    return shapes


def gpt2_small_shapes() -> List[Shape]:
    """GPT-2 small: 148 tensors, 124.4M elements."""
    return gpt2_shapes()


def numel(shapes: Sequence[Shape]) -> int:
    """Total number of elements of tensors of these shapes."""
    return sum(torch.Size(s).numel() for s in shapes)


def sync(device: Union[str, torch.device]) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], device: Union[str, torch.device],
            min_run_time: float) -> tbench.Measurement:
    """torch.utils.benchmark ``blocked_autorange`` of ``fn`` after one warm-up call (also
    the first-call allocation); syncs CUDA around the runs."""
    fn()
    sync(device)
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time)


def time_fn(fn: Callable[[], object], device: Union[str, torch.device],
            min_run_time: float) -> float:
    """Median seconds per call (torch.utils.benchmark, adaptive; syncs CUDA around runs)."""
    return measure(fn, device, min_run_time).median


def fit_fixed_per_tensor(sizes: Sequence[int], times: Sequence[float],
                         min_n: int = 100) -> Tuple[float, float]:
    """Least-squares ``time = fixed + n * per_tensor`` over the sizes ``>= min_n``: the fixed
    and the per-tensor host cost of a call (NaNs with fewer than two such points)."""
    pts = [(n, t) for n, t in zip(sizes, times) if n >= min_n]
    if len(pts) < 2:
        return float("nan"), float("nan")
    mn = sum(n for n, _ in pts) / len(pts)
    mt = sum(t for _, t in pts) / len(pts)
    per = sum((n - mn) * (t - mt) for n, t in pts) / sum((n - mn) ** 2 for n, _ in pts)
    return mt - per * mn, per


#: Largest buffer the memory-bound measurement allocates (both regimes, cache or DRAM,
#: are reached well below it).
MAX_BOUND_BUFFER = 256 * 2**20
#: Least time each pass of :func:`copy_bandwidth` is measured for (seconds).
BOUND_MIN_RUN_TIME = 0.2


def copy_bandwidth(nbytes: int, device: Union[str, torch.device], min_run_time: float) -> float:
    """The memory bound in GB/s for passes over ``nbytes`` (each byte read once and
    written once, counted twice), measured now.

    It is the best of three passes over buffers of ``nbytes`` (capped at
    :data:`MAX_BOUND_BUFFER`): ``dst.copy_(src)`` (2 streams), the in-place
    ``dst.mul_(1.0)`` (2) and ``dst.addcmul_(src, other)`` (4 streams: 3 read, 1
    written). On a GPU they are about equal. On a CPU the out-of-place copy also reads
    each destination line before writing it, so an in-place kernel can beat it without
    doing anything wrong, and few cores reach more bandwidth with more streams in flight;
    the other two passes move memory the way such kernels do. Each pass is timed with
    ``blocked_autorange`` and its fastest block taken. A benchmark figure (a median)
    above this bound (see :data:`BANDWIDTH_TOLERANCE`) means the timed code skipped
    work.
    """
    device = torch.device(device)
    # (at least BOUND_MIN_RUN_TIME per pass, whatever the benchmark's own setting: with a
    # --quick run's 0.02 s the best block of an in-cache pass scattered over 105-135 GB/s
    # on the project's CPU, which let a correct figure cross the bound)
    min_run_time = max(min_run_time, BOUND_MIN_RUN_TIME)
    n = max(min(nbytes, MAX_BOUND_BUFFER) // 4, 1024)
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    other = torch.ones_like(src)
    # the best block of each (not the median): the bound is what the memory can do, and
    # a busy machine only ever slows a measurement down
    passes = [(lambda: dst.copy_(src), 2), (lambda: dst.mul_(1.0), 2),
              (lambda: dst.addcmul_(src, other, value=0.0), 4)]
    return max(k * n * 4 / min(measure(fn, device, min_run_time).times) / 1e9
               for fn, k in passes)


def header(title: str, device: Union[str, torch.device]) -> str:
    """Two comment lines: the benchmark, date, device, torch and mixprec versions."""
    device = torch.device(device)
    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
    else:
        dev = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return (f"# {title}\n# date {datetime.date.today()} | device {device.type}: {dev} | torch "
            f"{torch.__version__} | mixprec {mixprec.__version__} (CUDA kernels: "
            f"{mixprec.has_cuda_kernels()})")


@contextlib.contextmanager
def count_cuda_syncs(device: Union[str, torch.device]) -> Iterator[List[int]]:
    """Counts the host syncs CUDA's sync debug mode reports inside the block (CUDA only):
    ``box[0]`` of the yielded ``box`` once the block has ended."""
    box = [0]
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode("default")
    box[0] = sum("synchroniz" in str(w.message) for w in caught)


def add_timing_args(ap: argparse.ArgumentParser, quick_help: str) -> None:
    """``--min-run-time``, ``--quick`` and ``--bandwidth-tolerance``, as the verified
    kernel benchmarks take them (``--quick``'s effect is the caller's: ``quick_help``)."""
    ap.add_argument("--min-run-time", type=float, default=None, help="seconds (default 1.0)")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--bandwidth-tolerance", type=float, default=None,
                    help="slack over the copy bandwidth before a figure is an error "
                         "(default: 0.05 on CUDA, 0.5 on CPU; see _common.BANDWIDTH_TOLERANCE)")


def count_cuda_launches(fn: Callable[[], object]) -> int:
    """Number of CUDA kernels one call of fn launches (torch.profiler)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


# ---------------------------------------------------------------------------------------------
# Controls that cannot run a case: n/a instead of a crash


@dataclasses.dataclass(frozen=True)
class NA:
    """A control (torch's implementation) that cannot run this case; prints as ``n/a``."""

    reason: str

    def __str__(self) -> str:
        return "n/a"


# Messages of errors meaning "this op/dtype/device combination is not implemented".
_UNSUPPORTED = re.compile(
    r"not implemented for|not supported|unsupported|does not support|no kernel|"
    r"only supports|requires all the params to be", re.IGNORECASE)


def run_control(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` (a torch control); return its result, or :class:`NA` when torch has no
    implementation for the case (``NotImplementedError``, or a ``RuntimeError``/
    ``TypeError``/``ValueError`` saying the dtype/device is unsupported). Other errors
    propagate. Never use this for mixprec's own code: mixprec failing is an error."""
    try:
        return fn()
    except NotImplementedError as exc:
        return NA(_first_line(exc))
    except (RuntimeError, TypeError, ValueError) as exc:
        if _UNSUPPORTED.search(str(exc)):
            return NA(_first_line(exc))
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def is_na(x: object) -> bool:
    """True for None or an :class:`NA`."""
    return x is None or isinstance(x, NA)


def fmt(x: object, spec: str = ".3f", width: int = 0) -> str:
    """``format(x, spec)`` right-aligned in ``width``; ``n/a`` for None/NA."""
    s = "n/a" if is_na(x) else format(x, spec)
    return f"{s:>{width}}" if width else s


def ratio(num: object, den: object) -> Optional[float]:
    """num / den, or None when either is None/NA."""
    if is_na(num) or is_na(den):
        return None
    return float(num) / float(den)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Errors of a run


#: Slack over the memory bound before a figure is an error, by device type.
#: CUDA: the bound is hard -- copy and in-place passes saturate the memory (the unscale
#: kernels reach 92-95 % of it on an H100), and medians of blocked_autorange on a quiet GPU
#: vary by a few percent; a kernel skipping a tenth of its traffic or more crosses it.
#: CPU: a few cores do not saturate the memory with one access pattern -- a kernel with
#: more streams in flight can beat the reference passes a little (torch's fused AdamW
#: reached 103 % of the bound on the project's 2-core VM) -- and a shared machine's
#: bandwidth drifts by tens of percent within a run; there a figure 1.5 times the bound is
#: an error (a kernel skipping a third of its traffic or more; the H100's was at 189 %).
BANDWIDTH_TOLERANCE: Dict[str, float] = {"cuda": 0.05, "cpu": 0.5}


def bandwidth_tolerance(device: Union[str, torch.device]) -> float:
    """The slack of :data:`BANDWIDTH_TOLERANCE` for ``device`` (0.05 for other GPUs)."""
    return BANDWIDTH_TOLERANCE.get(torch.device(device).type, 0.05)


class CheckFailed(AssertionError):
    """A verification found that the timed code did not do its work."""


class Report:
    """Errors of one benchmark run: printed as they happen, summed up at the end, turned
    into the exit status by :meth:`finish`."""

    def __init__(self, name: str, bandwidth_tolerance: Optional[float] = None) -> None:
        self.name = name
        self.bandwidth_tolerance = bandwidth_tolerance  # None: by device
        self.errors: List[str] = []
        self.bandwidth_checks = 0

    def fail(self, message: str) -> None:
        """Record an error and print it at once."""
        self.errors.append(message)
        print(f"ERROR: {message}", flush=True)

    def verify(self, label: str, check: Callable[[], None]) -> bool:
        """Run ``check``; a :class:`CheckFailed` becomes an error. Returns True on success."""
        try:
            check()
        except CheckFailed as exc:
            self.fail(f"{label}: verification failed: {exc}")
            return False
        return True

    def check_bandwidth(self, label: str, gbs: float, bound_gbs: float,
                        device: Union[str, torch.device] = "cuda") -> str:
        """Flag ``gbs`` above the memory bound ``bound_gbs`` measured in the same run
        (beyond the tolerance given to the Report, else :func:`bandwidth_tolerance` of
        ``device``): an error, since no pass over memory can beat it. Returns the mark to
        print next to the figure (``" !!"`` or ``""``)."""
        self.bandwidth_checks += 1
        tol = (self.bandwidth_tolerance if self.bandwidth_tolerance is not None
               else bandwidth_tolerance(device))
        if gbs > bound_gbs * (1.0 + tol):
            self.errors.append(
                f"{label}: {gbs:.1f} GB/s is {gbs / bound_gbs:.0%} of the copy bandwidth "
                f"({bound_gbs:.1f} GB/s) measured in this run -- impossible for a pass "
                "that moves the bytes counted; the timed code skipped work")
            return " !!"
        return ""

    def finish(self) -> int:
        """Print the errors (after the table) and return the exit status: 0 or 1."""
        if not self.errors:
            print(f"{self.name}: all results verified"
                  + (", no figure above the copy bandwidth" if self.bandwidth_checks else ""))
            return 0
        print(f"\n{self.name}: {len(self.errors)} error(s):")
        for e in self.errors:
            print(f"  - {e}")
        return 1


# ---------------------------------------------------------------------------------------------
# Verification


#: Unit roundoff of float32 (half its spacing at 1.0).
U32 = 2.0**-24
_CHUNK = 1 << 24  # elements per chunk when comparing (bounds the float64 temporaries)


def spacing(x: Tensor, dtype: torch.dtype) -> Tensor:
    """The distance between adjacent ``dtype`` values around ``|x|`` (float64): 2**e * eps
    for normal values, the subnormal spacing below ``finfo.tiny``."""
    fi = torch.finfo(dtype)
    ax = x.abs().double().clamp(min=fi.tiny)
    _, e = torch.frexp(ax)  # ax = m * 2**e, m in [0.5, 1)
    return torch.ldexp(torch.full_like(ax, fi.eps / 2), e)


def flat64(tensors: Sequence[Tensor]) -> Tensor:
    """All elements of ``tensors``, in order, as one float64 vector."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def _flat(x: Union[Tensor, Sequence[Tensor]]) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach().reshape(-1)
    return torch.cat([t.detach().reshape(-1) for t in x]) if x else torch.zeros(0)


def check_close(actual: Union[Tensor, Sequence[Tensor]], expected: Tensor,
                tol: Union[Tensor, Callable[[Tensor], Tensor]], what: str) -> None:
    """Every element of ``actual`` (a tensor or list, flattened) within ``tol`` of the
    float64 vector ``expected``; non-finite expected values must be matched exactly
    (same inf, or NaN). ``tol`` is a float64 vector, or a function of an ``expected``
    chunk giving it. Raises :class:`CheckFailed` naming the worst element."""
    a = _flat(actual)
    e = expected.reshape(-1)
    if a.numel() != e.numel():
        raise CheckFailed(f"{what}: {a.numel()} elements, reference has {e.numel()}")
    bad_total, worst, worst_at = 0, -1.0, (0, 0.0, 0.0, 0.0)
    for start in range(0, e.numel(), _CHUNK):
        ac = a[start:start + _CHUNK].double()
        ec = e[start:start + _CHUNK].to(ac.device, torch.float64)
        tc = tol(ec) if callable(tol) else tol.reshape(-1)[start:start + _CHUNK].to(ac.device)
        finite = torch.isfinite(ec)
        err = (ac - ec).abs()
        bad = torch.where(finite, ~(err <= tc),  # NaN err is bad
                          ~((ac == ec) | (torch.isnan(ac) & torch.isnan(ec))))
        nbad = int(bad.sum())
        if nbad:
            bad_total += nbad
            excess = torch.where(bad, torch.where(finite, err / tc.clamp(min=1e-300),
                                                  torch.full_like(err, float("inf"))),
                                 torch.zeros_like(err)).nan_to_num(float("inf"))
            i = int(excess.argmax())
            if float(excess[i]) > worst:
                worst = float(excess[i])
                worst_at = (start + i, float(ac[i]), float(ec[i]), float(tc[i]))
    if bad_total:
        i, av, ev, tv = worst_at
        raise CheckFailed(
            f"{what}: {bad_total} of {e.numel()} elements off the reference; worst at "
            f"[{i}]: got {av!r}, expected {ev!r} (tolerance {tv:.3g})")


def check_equal(actual: Union[Tensor, Sequence[Tensor]],
                expected: Union[Tensor, Sequence[Tensor]], what: str) -> None:
    """Bitwise equality (NaNs at the same places count as equal)."""
    a, e = _flat(actual), _flat(expected)
    if a.dtype != e.dtype or a.numel() != e.numel():
        raise CheckFailed(f"{what}: {a.dtype}[{a.numel()}] vs expected {e.dtype}[{e.numel()}]")
    same = (a == e) | (torch.isnan(a) & torch.isnan(e))
    nbad = int((~same).sum())
    if nbad:
        i = int((~same).nonzero()[0])
        raise CheckFailed(f"{what}: {nbad} of {e.numel()} elements differ; first at [{i}]: "
                          f"got {float(a[i])!r}, expected {float(e[i])!r}")


def check_scalar(actual: Tensor, expected: float, what: str) -> None:
    """A one-element tensor holds exactly ``expected``."""
    value = float(actual.detach().reshape(-1)[0])
    if value != expected:
        raise CheckFailed(f"{what}: {value!r}, expected {expected!r}")


def check_found_inf(found_inf: Tensor, expected: bool, what: str) -> None:
    """``found_inf`` is 1.0 when an inf/NaN was planted, 0.0 otherwise."""
    check_scalar(found_inf, 1.0 if expected else 0.0, f"{what}: found_inf")


def unscale_tolerance(expected: Tensor, dtype: torch.dtype) -> Tensor:
    """Bound on ``|round(g * inv_scale) - g * inv_scale|`` for an unscale of a ``dtype``
    grad. The product is exact in float64 (24 x 24 significant bits). The op rounds it once
    to float32 (<= half a float32 spacing) and, for 16-bit grads, once more to the grad's
    dtype (<= half its spacing): the sum of the two half-spacings."""
    tol = 0.5 * spacing(expected, torch.float32)
    if dtype != torch.float32:
        tol = tol + 0.5 * spacing(expected, dtype)
    return tol


def by_dtype(tensors: Sequence[Tensor]) -> Dict[torch.dtype, List[int]]:
    """Indices of ``tensors`` grouped by dtype (checks run once per group, not per tensor:
    a list of 2,000 tensors costs a few kernels, not thousands)."""
    groups: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def check_unscaled(before: Sequence[Tensor], after: Sequence[Tensor], inv_scale: float,
                   what: str) -> None:
    """``after`` == ``before * inv_scale``, each element within :func:`unscale_tolerance`."""
    if len(before) != len(after):
        raise CheckFailed(f"{what}: {len(after)} tensors, expected {len(before)}")
    inv32 = float(torch.tensor(inv_scale, dtype=torch.float32))
    for dtype, idx in by_dtype(after).items():
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise CheckFailed(f"{what}: unexpected dtype {dtype}")
        expected = flat64([before[i] for i in idx]) * inv32
        check_close([after[i] for i in idx], expected,
                    lambda e, dt=dtype: unscale_tolerance(e, dt), f"{what} ({dtype} grads)")


#: inv_scale of :func:`verify_unscale_fn`: not a power of two, so every element is rounded
#: and a do-nothing op cannot pass for 16-bit grads (whose spacing would hide 1 + 2**-20).
VERIFY_INV_SCALE = 0.3


def verify_unscale_fn(fn: Callable[[], object], grads: Sequence[Tensor], found_inf: Tensor,
                      inv_scale: Tensor, what: str) -> None:
    """Verify an unscale-and-check callable (the very one a benchmark times) on the
    tensors it is bound to: with ``inv_scale`` set to :data:`VERIFY_INV_SCALE` the grads
    become ``grads * inv_scale`` (:func:`check_unscaled`) and ``found_inf`` stays 0; with
    an inf planted in the last element, ``found_inf`` becomes 1. Restores the grads, sets
    ``found_inf`` to 0 and leaves ``inv_scale`` as it found it. Raises :class:`CheckFailed`."""
    saved = snapshot(grads)
    old_inv = inv_scale.clone()
    try:
        inv_scale.fill_(VERIFY_INV_SCALE)
        found_inf.zero_()
        fn()
        check_unscaled(saved, grads, VERIFY_INV_SCALE, what)
        check_found_inf(found_inf, False, f"{what} (all finite)")
        torch._foreach_copy_(list(grads), saved)
        planted = plant_inf(grads)
        fn()
        check_found_inf(found_inf, True, f"{what} (inf planted in the last element)")
        restore_planted(planted)
    finally:
        torch._foreach_copy_(list(grads), saved)
        inv_scale.copy_(old_inv)
        found_inf.zero_()


def plant_inf(tensors: Sequence[Tensor]) -> Tuple[Tensor, float]:
    """Write +inf into the last element of the last non-empty tensor (the tail a kernel
    that skips work would miss first). Returns (that tensor's flat view, old value) for
    :func:`restore_planted`."""
    for t in reversed(tensors):
        if t.numel():
            flat = t.view(-1)
            old = float(flat[-1])
            flat[-1] = float("inf")
            return flat, old
    raise ValueError("plant_inf: all tensors are empty")


def restore_planted(planted: Tuple[Tensor, float]) -> None:
    """Undo :func:`plant_inf`."""
    flat, old = planted
    flat[-1] = old


# -- optimizers -------------------------------------------------------------------------------


def reference_run(opt_cls: type, kwargs: Dict[str, Any], w0: Tensor,
                  grads: Sequence[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """``torch.optim`` on float64: ``opt_cls(**kwargs)`` on one flat float64 parameter
    starting at ``w0``, one step per entry of ``grads`` (flat float64, already unscaled).
    Returns (final weights, movement, slack): movement = sum over steps of ``|w_k -
    w_{k-1}|`` per element, slack = the Adam-L2 term of :func:`optimizer_tolerance`
    (zero for other optimizers). One flat tensor: a few kernels per step whatever the
    number of params.

    Adam with (L2) ``weight_decay`` adds ``wd * w`` to the grad, and where the two nearly
    cancel, the float32 rounding of ``wd * w`` (<= U32 * wd * |w|) is large against their
    sum, which the update then divides by ``sqrt(v_hat) + eps``: a step's update can move
    by ``lr * (sum of those roundings so far) / (sqrt(v_hat) + eps)``, twice as margin
    (``v_hat`` the reference's, after the step). One element in 2^24 random ones went past
    the bound without this term on a GPU."""
    w = torch.nn.Parameter(w0.detach().to(torch.float64, copy=True))
    opt = opt_cls([w], **kwargs)
    movement = torch.zeros_like(w0, dtype=torch.float64)
    slack = torch.zeros_like(movement)
    wd = float(kwargs.get("weight_decay", 0.0))
    l2 = opt_cls is torch.optim.Adam and wd != 0.0 and not kwargs.get("decoupled_weight_decay")
    rounded = torch.zeros_like(movement)  # the sum of wd * w's float32 roundings so far
    for g in grads:
        before = w.detach().clone()
        w.grad = g.to(device=w.device, dtype=torch.float64)
        if l2:
            rounded += U32 * wd * before.abs()
        opt.step()
        movement += (w.detach() - before).abs()
        if l2:
            st = opt.state[w]
            beta2 = float(opt.param_groups[0]["betas"][1])
            v_hat = st["exp_avg_sq"] / (1.0 - beta2 ** float(st["step"]))
            group = opt.param_groups[0]
            slack += 2.0 * float(group["lr"]) * rounded / (v_hat.sqrt() + float(group["eps"]))
    return w.detach(), movement, slack


def optimizer_tolerance(w: Tensor, movement: Tensor, steps: int,
                        slack: Optional[Tensor] = None) -> Tensor:
    """Bound on the distance between a float32 Adam/AdamW/SGD run and the float64
    reference after ``steps`` steps, per element (``w``: the reference's weights,
    ``movement`` and ``slack``: from :func:`reference_run`).

    Each step rounds the weight twice in float32 (the decay ``w * (1 - lr * wd)`` or
    ``g + wd * w``, and ``w - update``), each time by at most half a float32 spacing,
    <= U32 * |w|: 2 * U32 * |w| per step, with ``|w|`` over the run bounded by
    ``|w_final| + movement``; taken twice (4) as margin. The update comes out of a chain
    of at most ~10 float32 roundings (grad unscale and clip, the moment updates, the
    constants ``1 - beta`` held in float32, ``sqrt``, division, ``eps``, step size; each
    <= U32 relative, and ``sqrt`` halves the error of ``v``) applied to moments that
    carry the earlier steps' errors: <= 16 * U32 relative to the update, summed over the
    steps: 16 * U32 * movement. Plus ``slack``: Adam-L2's cancellation (see
    :func:`reference_run`)."""
    tol = U32 * (4.0 * steps * (w.abs() + movement) + 16.0 * movement)
    return tol if slack is None else tol + slack


def check_optimizer_result(what: str, params: Sequence[Tensor], masters: Sequence[Tensor],
                           ref: Tensor, movement: Tensor, steps: int,
                           slack: Optional[Tensor] = None) -> None:
    """Check a mixprec/torch optimizer's state against the float64 reference.

    ``params``: the params after the run. ``masters``: their float32 masters (empty
    when the params hold the weights themselves, i.e. float32 params). The weights
    (masters, or float32 params) must be within :func:`optimizer_tolerance` of ``ref``;
    16-bit params with masters must be their master rounded to nearest (bitwise)."""
    tol = optimizer_tolerance(ref, movement, steps, slack)
    if masters:
        check_close(masters, ref, tol, f"{what}: float32 master weights vs float64 reference")
        for dtype, idx in by_dtype(params).items():
            check_equal([params[i].detach() for i in idx], [masters[i].to(dtype) for i in idx],
                        f"{what}: {dtype} params vs their masters rounded to nearest")
    else:
        if any(p.dtype != torch.float32 for p in params):
            raise ValueError("check_optimizer_result: 16-bit params need masters; use "
                             "check_stochastic_rounding for params without")
        check_close(params, ref, tol, f"{what}: float32 params vs float64 reference")


def check_stochastic_rounding(what: str, before: Sequence[Tensor], after: Sequence[Tensor],
                              ref: Tensor, movement: Tensor, steps: int,
                              slack: Optional[Tensor] = None) -> Optional[str]:
    """bfloat16 params without masters, stochastically rounded at every step.

    Per element: each step's float32 result is rounded to one of its two bfloat16
    neighbours (less than one spacing away), so after ``steps`` steps the param is within
    ``steps`` bfloat16 spacings (at the largest magnitude on the way) plus
    :func:`optimizer_tolerance` of the reference. In aggregate (the check that
    a do-nothing kernel cannot pass): the rounding is unbiased, so the movement of the
    params projected on the reference's direction, ``r = sum(s * (p - p0)) /
    sum(s * (ref - p0))`` with ``s = sign(ref - p0)``, is 1 within 6 standard deviations:
    each rounding has variance <= spacing**2 / 4. Needs enough elements for 6 sigma to be
    small (< 0.5); with fewer, only the per-element check runs and the returned note
    says so."""
    p0 = flat64(before).to(ref.device)
    p = flat64(after).to(ref.device)
    # the largest |param| on the way: the reference's, plus up to one bfloat16 spacing
    # (<= 2**-7 relative) per stochastic rounding
    sp = spacing((ref.abs() + movement) * (1.0 + steps * 2.0**-7), torch.bfloat16)
    tol = steps * sp + optimizer_tolerance(ref, movement, steps, slack)
    check_close(p, ref, tol, f"{what}: bfloat16 params (stochastic rounding) vs reference")
    s = torch.sign(ref - p0)
    expected_move = float((s * (ref - p0)).sum())
    sigma = float((steps * (sp**2).sum() / 4).sqrt()) / max(expected_move, 1e-300)
    if 6 * sigma >= 0.5:
        return (f"aggregate check skipped: too few elements ({ref.numel()}), 6 sigma = "
                f"{6 * sigma:.2f}")
    r = float((s * (p - p0)).sum()) / expected_move
    if abs(r - 1.0) > 6 * sigma:
        raise CheckFailed(f"{what}: params moved {r:.3f} of the reference's way "
                          f"(expected 1 +- {6 * sigma:.3f}): stochastic rounding biased, or "
                          "the update not applied")
    return f"moved {r:.3f} of the reference's way (1 +- {6 * sigma:.3f})"


def snapshot(tensors: Sequence[Tensor]) -> List[Tensor]:
    """Bitwise copies, for :func:`check_unchanged`: one multi-tensor copy rather than a
    kernel per tensor (2,000 small tensors under compute-sanitizer cost minutes per clone
    loop)."""
    out = [torch.empty_like(t) for t in tensors]
    if out:
        torch._foreach_copy_(out, [t.detach() for t in tensors])
    return out


def check_unchanged(before: Sequence[Tensor], after: Sequence[Tensor], what: str) -> None:
    """Every tensor bitwise equal to its snapshot (a skipped step changes nothing)."""
    if len(before) != len(after):
        raise CheckFailed(f"{what}: {len(after)} tensors, expected {len(before)}")
    for dtype, idx in by_dtype(after).items():
        check_equal([after[i] for i in idx], [before[i] for i in idx],
                    f"{what} ({dtype} tensors)")


def eager_step(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Makes ``opt.step`` run with TORCHDYNAMO_DISABLE=1 set (torch.compile, which reads it
    at each call, then returns the function as is), restored after each step: a library
    optimizer whose step is ``torch.compile``-d (torchao's) then runs eagerly, without the
    minutes of compilation."""
    compiled_step = opt.step

    def step(*args: object, **kwargs: object) -> object:
        old = os.environ.get("TORCHDYNAMO_DISABLE")
        os.environ["TORCHDYNAMO_DISABLE"] = "1"
        try:
            return compiled_step(*args, **kwargs)
        finally:
            if old is None:
                del os.environ["TORCHDYNAMO_DISABLE"]
            else:
                os.environ["TORCHDYNAMO_DISABLE"] = old

    opt.step = step  # type: ignore[method-assign]
    return opt
