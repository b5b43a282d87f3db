"""Every mixprec op and optimizer on one device, each result checked against torch or a
float64 reference: the workload ``make gpu-check`` runs under
``compute-sanitizer --tool memcheck``, so that one run finds out-of-bounds accesses
and wrong results alike.

Parameter sets (``--sets``; a set whose largest tensor exceeds ``--max-numel`` or whose
total exceeds ``--max-total`` is skipped, and says so):

    odd         1, 3, 4097, 33x65, 2^15+7 elements: tails, odd sizes and alignments
    many-small  2,000 x 64: more tensors than one CUDA launch takes
    gpt2-tiny   GPT-2 layer shapes, 1 layer, width 64, vocab 512, context 128
    2^20+3, 2^24+1, 2^26    one tensor each (past 2^24 elements: 32-bit index arithmetic)
    2000x4096   2,000 tensors of 4,096 elements
    gpt2-small  GPT-2 small: 148 tensors, 124M elements

Per set:

* ops, called as ``torch.ops.mixprec.*`` on float32, float16 and bfloat16 grads (and a
  list mixing the three): ``unscale_and_check_`` (grads * inv_scale within the op's
  rounding; bitwise equal to torch's op where torch has it; found_inf set by an inf
  planted in the last element), ``check_finite_`` (read only; inf and NaN detected),
  ``unscale_and_norm_`` / ``check_finite_and_norm_`` (2-norm against float64 within the
  float32 accumulation's bound; inf-norm exact), ``update_scale_`` (bitwise
  ``torch._amp_update_scale_`` over a sequence of steps), ``update_scale_ext_`` (bitwise
  torch's with hysteresis 1 and no bounds; bitwise ``_reference (tests/_reference.py)`` with
  hysteresis 2 and bounds), ``fused_adam_`` (AMSGrad, Adam-L2, maximize, clip_coef) and
  ``fused_sgd_`` (Nesterov) called directly, against ``_reference (tests/_reference.py)`` within the
  rounding of one float32 update (sets of up to 200 tensors: the reference loops over
  tensors in Python); ``fused_adam8_`` / ``fused_sgd8_`` (8-bit state) over two steps,
  bitwise against the CPU kernel on copies (same sets);
* optimizers ``mixprec.optim.AdamW``, ``Adam``, ``SGD`` for float32 params, float16 +
  float32 masters, bfloat16 + masters, and bfloat16 with stochastic rounding: a step on
  grads carrying a loss scale of 1024, a step with an inf planted (must change nothing:
  params, masters, moments, step counts), a plain step. The weights must equal
  ``torch.optim`` of the same class run in float64 on copies, within the rounding of
  float32 steps (``_common.optimizer_tolerance``); 16-bit params equal their master
  rounded to nearest; stochastically rounded params are within their bfloat16 spacing
  per element and unbiased in aggregate.

One line per check (ok / FAIL / skip); exit status 1 when any check failed. A CUDA error
(the context is then unusable) stops the run.

    python tools/gpu_workload.py --device cuda                  # everything, up to 2^26
    python tools/gpu_workload.py --device cpu --max-numel 40000 --max-total 200000
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the references

import _reference  # noqa: E402
import mixprec  # noqa: E402
import mixprec.optim  # noqa: E402
from _common import (  # noqa: E402
    NA,
    U32,
    CheckFailed,
    Shape,
    check_close,
    check_equal,
    check_found_inf,
    check_optimizer_result,
    check_stochastic_rounding,
    check_unchanged,
    check_unscaled,
    flat64,
    gpt2_shapes,
    numel,
    plant_inf,
    reference_run,
    restore_planted,
    run_control,
    snapshot,
    spacing,
    sync,
    verify_unscale_fn,
)

SETS: Dict[str, Callable[[], List[Shape]]] = {
    "odd": lambda: [(1,), (3,), (4097,), (33, 65), (2**15 + 7,)],
    "many-small": lambda: [(64,)] * 2000,
    "gpt2-tiny": lambda: gpt2_shapes(1, 512, 64, 128),
    "2^20+3": lambda: [(2**20 + 3,)],
    "2^24+1": lambda: [(2**24 + 1,)],
    "2^26": lambda: [(2**26,)],
    "2000x4096": lambda: [(4096,)] * 2000,
    "gpt2-small": lambda: gpt2_shapes(),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
OPTIMIZERS: Dict[str, Tuple[type, type, Dict[str, Any]]] = {
    # name: (mixprec class, torch class, shared kwargs)
    "AdamW": (mixprec.optim.AdamW, torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}),
    "Adam": (mixprec.optim.Adam, torch.optim.Adam, {"lr": 1e-3, "weight_decay": 0.01}),
    "SGD": (mixprec.optim.SGD, torch.optim.SGD,
            {"lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-3}),
}
# param dtype, extra mixprec kwargs
CONFIGS: Dict[str, Tuple[torch.dtype, Dict[str, Any]]] = {
    "fp32": (torch.float32, {}),
    "fp16+masters": (torch.float16, {"master_weights": True}),
    "bf16+masters": (torch.bfloat16, {"master_weights": True}),
    "bf16+sr": (torch.bfloat16, {"master_weights": False, "stochastic_rounding": True,
                                 "seed": 7}),
}
LOSS_SCALE = 1024.0  # a power of two: scaled grads unscale exactly
MAX_DIRECT_TENSORS = 200
# Terms summed in float32 before a partial goes to float64 in the norm kernels (CUDA: a
# 65,536-element chunk over 512 threads = 128 per thread), with margin.
NORM_FLOAT32_TERMS = 4096


class Runner:
    """Runs named checks, prints one line each, counts failures."""

    def __init__(self, device: torch.device, max_check_gib: float = 0.0) -> None:
        self.device = device
        self.max_check_gib = max_check_gib
        self.passed = 0
        self.failed: List[str] = []
        self.skipped = 0

    def check(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            self._check(name, fn)
        finally:
            # Each check's peak is printed and, with --max-check-gib, bounded (a check
            # above it fails); what a check leaves in reference cycles is collected, so
            # that memory cannot grow from check to check. Two figures: the allocator's
            # peak, and what the driver reports in use once the check's memory is freed
            # (the allocator may keep no statistics when PYTORCH_NO_CUDA_MEMORY_CACHING=1;
            # the driver's figure also counts the sanitizer's and the context's memory).
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                peak = torch.cuda.max_memory_allocated() / 2**30
                free, total = torch.cuda.mem_get_info(self.device)
                used = (total - free) / 2**30
                print(f"     (device memory: peak {peak:.2f} GiB, after "
                      f"{torch.cuda.memory_allocated() / 2**20:.0f} MiB; in use after "
                      f"{used:.2f} GiB)", flush=True)
                worst = max(peak, used)
                if self.max_check_gib and worst > self.max_check_gib:
                    self.failed.append(f"{name}: {worst:.2f} GiB of device memory, over the "
                                       f"--max-check-gib {self.max_check_gib:g} bound")
                    print(f"FAIL {name}: {self.failed[-1]}", flush=True)

    def _check(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        t0 = time.perf_counter()
        try:
            note = fn()
            sync(self.device)
        except CheckFailed as exc:
            self.failed.append(f"{name}: {exc}")
            print(f"FAIL {name}: {exc}", flush=True)
            return
        except Exception as exc:  # an op that raised: a failure too
            self.failed.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            if "CUDA error" in str(exc) or "CUDA-capable" in str(exc):
                raise SystemExit(self.finish("stopped after a CUDA error")) from exc
            return
        if isinstance(note, NA):
            self.skipped += 1
            print(f"skip {name}: {note.reason}", flush=True)
            return
        self.passed += 1
        extra = f" ({note})" if note else ""
        print(f"ok   {name} [{time.perf_counter() - t0:.2f}s]{extra}", flush=True)

    def skip(self, name: str, why: str) -> None:
        self.skipped += 1
        print(f"skip {name}: {why}", flush=True)

    def finish(self, why: str = "") -> int:
        print(f"\ngpu_workload: {self.passed} passed, {len(self.failed)} failed, "
              f"{self.skipped} skipped{' -- ' + why if why else ''}")
        for f in self.failed:
            print(f"  FAILED {f}")
        return 1 if self.failed or why else 0


def randn(shapes: Sequence[Shape], dtype: torch.dtype, device: torch.device, gen: torch.Generator,
          std: float = 1.0) -> List[Tensor]:
    # generated in float32 on the device (fast for 2^26 elements), then rounded
    return [(torch.randn(s, generator=gen, device=device) * std).to(dtype) for s in shapes]


# ---------------------------------------------------------------------------------------------
# ops


def check_unscale(grads: List[Tensor], device: torch.device) -> Optional[str]:
    found = torch.zeros((), device=device)
    inv = torch.ones((), device=device)
    op = torch.ops.mixprec.unscale_and_check_
    verify_unscale_fn(lambda: op(grads, found, inv), grads, found, inv, "unscale_and_check_")
    # bitwise torch's op where torch has one
    ours = snapshot(grads)
    theirs = snapshot(grads)
    inv.fill_(0.3)
    op(ours, found, inv)
    ran = run_control(lambda: torch._amp_foreach_non_finite_check_and_unscale_(
        theirs, torch.zeros((), device=device), inv))
    if isinstance(ran, NA):
        return "torch's op n/a for this dtype: checked against float64 only"
    check_equal(ours, theirs, "vs torch's op")  # one flat comparison, not one per tensor
    return "bitwise torch's op"


def check_check_finite(grads: List[Tensor], device: torch.device) -> None:
    found = torch.zeros((), device=device)
    before = snapshot(grads)
    torch.ops.mixprec.check_finite_(grads, found)
    check_found_inf(found, False, "all finite")
    check_unchanged(before, grads, "read-only op wrote a grad")
    for value in (float("inf"), float("nan")):
        planted = plant_inf(grads)
        planted[0][-1] = value
        try:
            torch.ops.mixprec.check_finite_(grads, found)
        finally:
            restore_planted(planted)
        check_found_inf(found, True, f"{value} in the last element")
        found.zero_()


def norm_reference(grads: Sequence[Tensor], inv: float, norm_type: float) -> float:
    """Norm of the float32 products RN32(g * inv), in float64."""
    inv32 = float(torch.tensor(inv, dtype=torch.float32))
    u = torch.cat([g.reshape(-1).float() for g in grads]) * inv32  # rounded as the op does
    if u.numel() == 0:
        return 0.0
    if math.isinf(norm_type):
        return float(u.abs().max())
    return float((u.double().abs() ** norm_type).sum()) ** (1.0 / norm_type)


def check_norms(grads: List[Tensor], device: torch.device) -> str:
    """unscale_and_norm_ and check_finite_and_norm_, p = 2 and inf."""
    inv_value = 0.3
    inv = torch.full((), inv_value, device=device)
    notes = []
    for norm_type in (2.0, float("inf")):
        expected = norm_reference(grads, inv_value, norm_type)
        # 2-norm: each term |u|^2 of the float32 product u carries <= 3 U32 (the product's
        # rounding, doubled by the square, and the square's rounding); at most
        # NORM_FLOAT32_TERMS terms are summed in float32 before float64 (<= that many U32);
        # the square root halves the relative error; one rounding to float32 at the end.
        # inf-norm: a max of float32 values, exact.
        rel = ((NORM_FLOAT32_TERMS + 3) / 2 + 1) * U32 if norm_type == 2.0 else 0.0
        for name, in_place in (("check_finite_and_norm_", False), ("unscale_and_norm_", True)):
            work = snapshot(grads)
            found = torch.zeros((), device=device)
            out = getattr(torch.ops.mixprec, name)(work, found, inv, norm_type)
            got = float(out)
            if abs(got - expected) > rel * expected:
                raise CheckFailed(f"{name} p={norm_type}: {got!r}, float64 reference "
                                  f"{expected!r} (relative tolerance {rel:.2g})")
            check_found_inf(found, False, f"{name} p={norm_type}")
            if in_place:
                check_unscaled(grads, work, inv_value, f"{name}: grads")
            else:
                check_unchanged(grads, work, f"{name}: read-only op wrote a grad")
            planted = plant_inf(work)
            out = getattr(torch.ops.mixprec, name)(work, found, inv, norm_type)
            restore_planted(planted)
            check_found_inf(found, True, f"{name} p={norm_type}, inf planted")
            if not math.isinf(float(out)) and not math.isnan(float(out)):
                raise CheckFailed(f"{name} p={norm_type}: {float(out)!r} with an inf grad")
            del work
        notes.append(f"p={norm_type}: {expected:.6g}")
    return ", ".join(notes)


def check_update_scale(device: torch.device) -> str:
    founds = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]

    def run(fn: Callable[[Tensor, Tensor, Tensor], None]) -> List[Tuple[float, int]]:
        scale = torch.full((1,), 2.0**16, device=device)
        tracker = torch.zeros(1, dtype=torch.int32, device=device)
        out = []
        for f in founds:
            fn(scale, tracker, torch.full((1,), float(f), device=device))
            out.append((float(scale), int(tracker)))
        return out

    ours = run(lambda s, t, f: torch.ops.mixprec.update_scale_(s, t, f, 2.0, 0.5, 3))
    theirs = run(lambda s, t, f: torch._amp_update_scale_(s, t, f, 2.0, 0.5, 3))
    if ours != theirs:
        raise CheckFailed(f"update_scale_ {ours} vs torch._amp_update_scale_ {theirs}")
    # update_scale_ext_ with hysteresis 1 and no bounds is torch's rule
    ext1 = run(lambda s, t, f: torch.ops.mixprec.update_scale_ext_(
        s, t, torch.ones(1, dtype=torch.int32, device=device), f, 2.0, 0.5, 3, None, None, 1))
    if ext1 != theirs:
        raise CheckFailed(f"update_scale_ext_ (hysteresis 1) {ext1} vs torch's {theirs}")

    def ext(impl: Any) -> List[Tuple[float, int, int]]:
        scale = torch.full((1,), 2.0**16, device=device)
        tracker = torch.zeros(1, dtype=torch.int32, device=device)
        hyst = torch.full((1,), 2, dtype=torch.int32, device=device)
        out = []
        for f in founds + [1, 1, 1, 1]:
            impl(scale, tracker, hyst, torch.full((1,), float(f), device=device), 2.0, 0.5, 3,
                 2.0**14, 2.0**17, 2)
            out.append((float(scale), int(tracker), int(hyst)))
        return out

    a, b = ext(torch.ops.mixprec.update_scale_ext_), ext(_reference.update_scale_ext_)
    if a != b:
        raise CheckFailed(f"update_scale_ext_ (hysteresis 2, bounds) {a} vs the reference {b}")
    return f"{len(founds)} steps bitwise torch's, ext with hysteresis/bounds bitwise reference"


def _close_to_reference(actual: Tensor, expected: Tensor, before: Tensor, what: str) -> None:
    """One fused update of ``before`` against the pure-PyTorch reference's result.

    Both compute the same float32 operations, but not necessarily with the same
    contractions (a CPU build may fuse a multiply-add the reference rounds twice) nor the
    same float64 ``pow`` for the bias corrections: each value is a chain of a few float32
    roundings of operands bounded by ``|before|`` and the change ``|expected - before|``,
    so the two agree within 16 * U32 of those; a 16-bit value may then round to the
    other neighbour (one spacing of its dtype). Step counts are exact."""
    if actual.dtype == torch.float32 and actual.numel() == 1 and actual.dim() == 0:
        check_equal(actual, expected, what)
        return
    e = expected.double().reshape(-1)
    b = before.double().reshape(-1)
    tol = 16 * U32 * (b.abs() + (e - b).abs())
    if actual.dtype != torch.float32:
        tol = tol + spacing(e, actual.dtype)
    check_close(actual, e, tol, what)


def check_fused_direct(shapes: Sequence[Shape], device: torch.device,
                       gen: torch.Generator) -> str:
    """fused_adam_ (AMSGrad, Adam-L2, maximize, grad_scale, clip_coef) and fused_sgd_
    (Nesterov) called directly, fp16 params with masters and bf16 grads, against the
    pure-PyTorch reference ``_reference (tests/_reference.py)`` (:func:`_close_to_reference`); every
    master must move."""
    params = randn(shapes, torch.float16, device, gen)
    inputs = {
        "params": params,
        "grads": randn(shapes, torch.bfloat16, device, gen, std=64.0),
        "exp_avgs": randn(shapes, torch.float32, device, gen, std=0.1),
        "exp_avg_sqs": [t.abs() for t in randn(shapes, torch.float32, device, gen)],
        "max_exp_avg_sqs": [t.abs() for t in randn(shapes, torch.float32, device, gen)],
        "master_params": [p.float() + 1e-3 for p in params],
        "state_steps": [torch.full((), float(i % 5), device=device) for i in range(len(shapes))],
    }
    adam_scalars = (torch.tensor(3e-3, device=device), 0.9, 0.999, 0.01, 1e-8, True, True,
                    False, torch.full((1,), 64.0, device=device), torch.zeros(1, device=device),
                    torch.full((1,), 0.5, device=device))
    a = {k: snapshot(v) for k, v in inputs.items()}
    b = {k: snapshot(v) for k, v in inputs.items()}
    torch.ops.mixprec.fused_adam_(*a.values(), *adam_scalars)
    _reference.fused_adam_(*b.values(), *adam_scalars)
    for k in inputs:
        for i, (x, y, x0) in enumerate(zip(a[k], b[k], inputs[k])):
            _close_to_reference(x, y, x0, f"fused_adam_ {k}[{i}]")
    changed = sum(int(not torch.equal(x, y)) for x, y in zip(a["master_params"],
                                                          inputs["master_params"]))
    if changed != len([s for s in shapes if torch.Size(s).numel()]):
        raise CheckFailed(f"fused_adam_: {changed} of {len(shapes)} masters changed")
    order = ["params", "grads", "exp_avgs", "master_params", "state_steps"]
    sgd_scalars = (torch.tensor(0.05, dtype=torch.float64, device=device), 1e-2, 0.9, 0.0,
                   True, False, torch.full((1,), 64.0, device=device), None, None)
    a = {k: snapshot(inputs[k]) for k in order}
    b = {k: snapshot(inputs[k]) for k in order}
    torch.ops.mixprec.fused_sgd_(*a.values(), *sgd_scalars)
    _reference.fused_sgd_(*b.values(), *sgd_scalars)
    for k in order:
        for i, (x, y, x0) in enumerate(zip(a[k], b[k], inputs[k])):
            _close_to_reference(x, y, x0, f"fused_sgd_ {k}[{i}]")
    return "fused_adam_ and fused_sgd_ match _reference (tests/_reference.py)"


def check_fused8_direct(shapes: Sequence[Shape], device: torch.device,
                        gen: torch.Generator) -> str:
    """fused_adam8_ and fused_sgd8_ (fp16 params with masters, bf16 grads, grad_scale,
    clip_coef; two steps, so codes written by the first are read by the second) on the
    device against the CPU kernel on copies: bitwise (the same float32 operations, IEEE
    division and sqrt on both, no contraction)."""
    from mixprec.optim import _quant8 as q8

    params = randn(shapes, torch.float16, device, gen)
    m = [q8.quantize(t, q8.SIGNED) for t in randn(shapes, torch.float32, device, gen, std=0.1)]
    v = [q8.quantize(t.abs(), q8.UNSIGNED) for t in randn(shapes, torch.float32, device, gen)]
    adam = {"params": params, "grads": randn(shapes, torch.bfloat16, device, gen, std=64.0),
            "exp_avgs": [c for c, _ in m], "exp_avg_absmax": [a for _, a in m],
            "exp_avg_sqs": [c for c, _ in v], "exp_avg_sq_absmax": [a for _, a in v],
            "master_params": [p.float() + 1e-3 for p in params],
            "state_steps": [torch.full((), float(i % 5), device=device)
                            for i in range(len(shapes))]}
    sgd = {k: adam[k] for k in ("params", "grads")}
    sgd.update({"momentum_buffers": adam["exp_avgs"], "momentum_absmax": adam["exp_avg_absmax"],
                "master_params": adam["master_params"], "state_steps": adam["state_steps"]})

    def scalars(dev: torch.device, op: str) -> Dict[str, Any]:
        common = {"grad_scale": torch.full((1,), 64.0, device=dev),
                  "found_inf": torch.zeros(1, device=dev),
                  "clip_coef": torch.full((1,), 0.5, device=dev)}
        if op == "fused_adam8_":
            return {"lr": torch.tensor(3e-3, device=dev), "beta1": 0.9, "beta2": 0.999,
                    "weight_decay": 0.01, "eps": 1e-8, "maximize": False,
                    "decoupled_weight_decay": True, **common}
        return {"lr": torch.tensor(0.05, dtype=torch.float64, device=dev),
                "weight_decay": 1e-2, "momentum": 0.9, "dampening": 0.0, "nesterov": True,
                "maximize": False, **common}

    for op, inputs in (("fused_adam8_", adam), ("fused_sgd8_", sgd)):
        on_dev = {k: snapshot(t) for k, t in inputs.items()}
        on_cpu = {k: [t.cpu() for t in ts] for k, ts in inputs.items()}
        for _ in range(2):
            getattr(torch.ops.mixprec, op)(**on_dev, **scalars(device, op))
            getattr(torch.ops.mixprec, op)(**on_cpu, **scalars(torch.device("cpu"), op))
        for k in inputs:
            for i, (x, y) in enumerate(zip(on_dev[k], on_cpu[k])):
                if not torch.equal(x.cpu().reshape(-1).view(torch.uint8),
                                   y.reshape(-1).view(torch.uint8)):
                    raise CheckFailed(f"{op} {k}[{i}]: the device's bits differ from the CPU "
                                      "kernel's")
    return "fused_adam8_ and fused_sgd8_ match the CPU kernel bitwise over two steps"


# ---------------------------------------------------------------------------------------------
# optimizers


def check_optimizer(opt_name: str, config: str, shapes: Sequence[Shape], device: torch.device,
                    gen: torch.Generator) -> Optional[str]:
    mp_cls, torch_cls, kwargs = OPTIMIZERS[opt_name]
    dtype, extra = CONFIGS[config]
    params = [torch.nn.Parameter(t) for t in randn(shapes, dtype, device, gen)]
    g1 = randn(shapes, dtype, device, gen)
    g3 = randn(shapes, dtype, device, gen)
    opt = mp_cls(params, **kwargs, **extra)
    w0 = flat64(params)
    p0 = snapshot(params)
    # step 1: grads carrying the loss scale
    for p, g in zip(params, g1):
        p.grad = g * LOSS_SCALE  # exact (a power of two; |g| * 1024 is far below fp16's max)
    found = torch.zeros(1, device=device)
    scale = torch.full((1,), LOSS_SCALE, device=device)
    torch.ops.mixprec.check_finite_([p.grad for p in params], found)
    opt.step(grad_scale=scale, found_inf=found)
    check_found_inf(found, False, "step 1")
    # step 2: an inf in the last grad element: nothing may change
    state = [t for p in params for t in opt.state[p].values() if torch.is_tensor(t)]
    before = snapshot(list(params) + state)
    planted = plant_inf([p.grad for p in params])
    torch.ops.mixprec.check_finite_([p.grad for p in params], found)
    opt.step(grad_scale=scale, found_inf=found)
    restore_planted(planted)
    check_found_inf(found, True, "step 2 (inf planted)")
    check_unchanged(before, list(params) + state, "step 2 with an inf must change nothing")
    del before, state
    # step 3: plain
    for p, g in zip(params, g3):
        p.grad = g
    opt.step()
    sync(device)
    ref, movement, slack = reference_run(torch_cls, kwargs, w0, [flat64(g1), flat64(g3)])
    what = f"{opt_name} {config}"
    if config == "bf16+sr":
        return check_stochastic_rounding(what, p0, params, ref, movement, 2, slack)
    masters = [opt.state[p]["master_param"] for p in params] if dtype != torch.float32 else []
    check_optimizer_result(what, params, masters, ref, movement, 2, slack)
    return None


# ---------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated (default: all)")
    ap.add_argument("--max-numel", type=int, default=2**26,
                    help="skip sets with a larger tensor (default 2^26)")
    ap.add_argument("--max-total", type=int, default=0,
                    help="skip sets with more elements in all (default: no limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--max-check-gib", type=float, default=0.0,
                    help="CUDA: fail a check whose peak device memory exceeds this (0: no bound)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_workload: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    if device.type != "cpu" and not mixprec.has_cuda_kernels():
        print(f"gpu_workload: this mixprec build has no {device.type} kernels "
              f"(mixprec.has_cuda_kernels() is False): rebuild with MIXPREC_FORCE_CUDA=1",
              file=sys.stderr)
        return 2
    print(f"gpu_workload: device {device} "
          f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, mixprec {mixprec.__version__}, max numel "
          f"{args.max_numel}, max total {args.max_total or 'none'}", flush=True)
    run = Runner(device, args.max_check_gib)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    for set_name in args.sets.split(","):
        shapes = SETS[set_name]()
        biggest, total = max(torch.Size(s).numel() for s in shapes), numel(shapes)
        if biggest > args.max_numel or (args.max_total and total > args.max_total):
            run.skip(f"set {set_name}", f"{len(shapes)} tensors, largest {biggest}, total "
                     f"{total} elements: over --max-numel / --max-total")
            continue
        print(f"--- set {set_name}: {len(shapes)} tensors, {total} elements", flush=True)
        for dname, dtype in DTYPES.items():
            grads = randn(shapes, dtype, device, gen, std=4.0)
            run.check(f"{set_name} {dname} unscale_and_check_",
                      functools.partial(check_unscale, grads, device))
            run.check(f"{set_name} {dname} check_finite_",
                      functools.partial(check_check_finite, grads, device))
            run.check(f"{set_name} {dname} unscale_and_norm_ + check_finite_and_norm_",
                      functools.partial(check_norms, grads, device))
            del grads
        mixed = [randn([s], list(DTYPES.values())[i % 3], device, gen)[0]
                 for i, s in enumerate(shapes)]
        run.check(f"{set_name} mixed dtypes unscale_and_check_",
                  functools.partial(check_unscale, mixed, device))
        run.check(f"{set_name} mixed dtypes norms", functools.partial(check_norms, mixed, device))
        del mixed
        if len(shapes) <= MAX_DIRECT_TENSORS:
            run.check(f"{set_name} fused_adam_/fused_sgd_ direct",
                      functools.partial(check_fused_direct, shapes, device, gen))
            run.check(f"{set_name} fused_adam8_/fused_sgd8_ direct",
                      functools.partial(check_fused8_direct, shapes, device, gen))
        for opt_name in OPTIMIZERS:
            for config in CONFIGS:
                run.check(f"{set_name} optim.{opt_name} {config}",
                          functools.partial(check_optimizer, opt_name, config, shapes, device,
                                            gen))
    run.check("update_scale_ / update_scale_ext_", lambda: check_update_scale(device))
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
