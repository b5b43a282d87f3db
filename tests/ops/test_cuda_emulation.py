"""The CUDA backend's code, run on the CPU (CI has no GPU).

``torch.ops.mixprec_cuda_emu.<op>`` (tests/_cuda_emulation.py) runs the CUDA
launcher of <op> -- argument checks, flattening, dtype grouping, slot wiring,
launch plan, kernel bodies -- over an emulated grid on CPU tensors. These tests
hold it to the CPU kernels (which every other test holds to torch) and to
float64 formulas, over the cases where a launch plan can go wrong: many tensors
(more than one launch holds), tensors longer than a chunk, a tensor split across
two launches, misaligned (vector path off) and strided (copied) tensors, empty
lists and zero-size tensors, every dtype combination, inf/NaN at the first and
the last element.

Emulation is slow (one emulated thread at a time, ~0.1 us per element and
thread-visit), so sizes stay small except in the two tests that need a launch
boundary inside one tensor.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import pytest
import torch

import _cuda_emulation
from _helpers import assert_bitwise_equal, ulps

# (MIXPREC_BUILD_TEST_EXT=1, as make test sets it: the tests run, and fail without it)
pytestmark = pytest.mark.skipif(
    not _cuda_emulation.available() and os.environ.get("MIXPREC_BUILD_TEST_EXT") != "1",
    reason="needs the test library mixprec/_cuda_emulation (MIXPREC_BUILD_TEST_EXT=1)",
)

LOW = (torch.float16, torch.bfloat16)
ALL = (torch.float32, torch.float16, torch.bfloat16)
CHUNK = 65536          # elements per block (launch_plan.h kChunkSize)
MAX_BLOCKS = 2560      # blocks per launch (kMaxBlocks, CUDA >= 12.1 tables)
# kMaxTensors = (32000 - 2560 * 6 - 64) // (8 * (depth + 1)), launch_plan.h
MAX_TENSORS = {depth: (32000 - MAX_BLOCKS * 6 - 64) // (8 * (depth + 1)) for depth in (1, 8)}
# fused_adam_'s lists per launch (fused_adam.h AdamSlot): param, grad, exp_avg, exp_avg_sq,
# max_exp_avg_sq, master, step and the stochastic-rounding base
ADAM = 8
# The small table (SmallTensorListMeta): a launch with at most this many blocks (and
# so tensors) is launched with a 4 KB kernel argument instead of the 32 KB one.
SMALL = {depth: (4000 - 64) // (6 + 8 * (depth + 1)) for depth in (1, ADAM)}  # 178, 50


def emu() -> Any:
    return _cuda_emulation.ops()


def _misaligned(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A dense n-element tensor whose data pointer is not 16-byte aligned."""
    t = torch.randn(n + 1).to(dtype)[1:]
    assert t.data_ptr() % 16 != 0
    return t


def _strided(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A non-dense n-element view (every other element)."""
    return torch.randn(2 * n).to(dtype)[::2]


# ---------------------------------------------------------------------------
# unscale_and_check_ / check_finite_: bitwise equal to torch's op and to the
# CPU kernel.

UNSCALE_SHAPES = {
    "empty-list": [],
    "zero-size": [(0,), (3,), (0, 4)],
    "tails": [(1,), (7,), (15,), (17,), (4096 + 3,)],
    "multi-chunk": [(CHUNK + 5,), (3 * CHUNK,), (2,)],
    "many": [(5,)] * (MAX_TENSORS[1] + 7),
    # the largest launch the small table holds, and one tensor or one block more
    "small-full": [(5,)] * SMALL[1],
    "small+1-tensor": [(5,)] * (SMALL[1] + 1),
}
# one block more than the small table holds (planned only: the bitwise tests
# above run the large table over "many" and the launch-splitting tests)
SMALL_PLUS_BLOCK = [(CHUNK * (SMALL[1] - 2),), (CHUNK + 1,), (3,)]


def _grads(shapes: List[tuple], dtype: torch.dtype, layout: str) -> List[torch.Tensor]:
    out = []
    for i, s in enumerate(shapes):
        n = int(torch.Size(s).numel())
        if layout == "misaligned" and n > 0:
            out.append(_misaligned(n, dtype).view(s))
        elif layout == "strided" and n > 0 and i % 2 == 0:
            out.append(_strided(n, dtype).view(s))  # (1-D shapes: a strided view)
        else:
            out.append(torch.randn(s).to(dtype))
    return out


@pytest.mark.parametrize("dtype", (torch.float64,) + ALL)
@pytest.mark.parametrize("case", list(UNSCALE_SHAPES))
@pytest.mark.parametrize("layout", ["dense", "misaligned", "strided"])
@pytest.mark.parametrize("nonfinite", [None, "first", "last"])
def test_unscale_and_check_bitwise(dtype: torch.dtype, case: str, layout: str,
                                   nonfinite: str | None) -> None:
    grads = _grads(UNSCALE_SHAPES[case], dtype, layout)
    if nonfinite is not None and grads:
        nonempty = [g for g in grads if g.numel() > 0]
        target = nonempty[0] if nonfinite == "first" else nonempty[-1]
        target.view(-1)[0 if nonfinite == "first" else -1] = (
            float("inf") if nonfinite == "first" else float("nan"))
    inv = torch.full((1,), 1.0 / 1024)
    a = [g.clone() for g in grads]
    b = [g.clone() for g in grads]
    fa, fb = torch.zeros(1), torch.zeros(1)
    emu().unscale_and_check_(a, fa, inv)
    torch.ops.mixprec.unscale_and_check_(b, fb, inv)
    assert fa.item() == fb.item() == (1.0 if nonfinite and grads else 0.0)
    for x, y in zip(a, b):
        assert_bitwise_equal(x, y)
    if dtype != torch.bfloat16:  # torch's op, where it takes the dtype
        c = [g.clone() for g in grads]
        fc = torch.zeros(1)
        if c:
            torch._amp_foreach_non_finite_check_and_unscale_(c, fc, inv)
        for x, y in zip(a, c):
            assert_bitwise_equal(x, y)
    # check_finite_ reads only
    d = [g.clone() for g in grads]
    fd = torch.zeros(1)
    emu().check_finite_(d, fd)
    assert fd.item() == fa.item()
    for x, y in zip(d, grads):
        assert_bitwise_equal(x, y)


def test_unscale_inv_scale_one_writes_nothing() -> None:
    g = [torch.randn(100)]
    g[0][3] = float("nan")
    before = g[0].clone()
    f = torch.zeros(1)
    emu().unscale_and_check_(g, f, torch.ones(1))
    assert f.item() == 1.0
    assert_bitwise_equal(g[0], before)


def test_unscale_tensor_split_across_launches() -> None:
    # A launch holds MAX_BLOCKS chunks: tensor 2 starts in launch 1 and goes on
    # in launch 2 as its tensor 0; the last element of each launch is non-finite.
    sizes = [5 * CHUNK, (MAX_BLOCKS - 3) * CHUNK + 11, 7]
    grads = [torch.randn(n, dtype=torch.float16) for n in sizes]
    boundary = (MAX_BLOCKS - 5) * CHUNK  # first element of launch 2 in tensor 1
    expected = [g.float() * 0.25 for g in grads]
    for case in ("clean", "before", "after"):
        a = [g.clone() for g in grads]
        if case == "before":
            a[1][boundary - 1] = float("inf")
        if case == "after":
            a[1][boundary] = float("inf")
        f = torch.zeros(1)
        emu().unscale_and_check_(a, f, torch.full((1,), 0.25))
        assert f.item() == (0.0 if case == "clean" else 1.0)
        if case == "clean":
            for x, e in zip(a, expected):
                assert torch.equal(x, e.half())


@pytest.mark.parametrize("case,small,large", [
    ("small-full", 1, 0), ("small+1-tensor", 0, 1), ("small+1-block", 0, 1),
    ("tails", 1, 0), ("many", 1, 1),  # "many": a full large launch, then 7 tensors
])
def test_small_table_chosen_when_the_launch_fits(case: str, small: int, large: int) -> None:
    # A launch that fits the small table is launched with it (4 KB of kernel
    # arguments, not 32 KB); one tensor or one block more takes the large table.
    # (The results of both are held to the CPU kernel by the bitwise tests above.)
    shapes = SMALL_PLUS_BLOCK if case == "small+1-block" else UNSCALE_SHAPES[case]
    grads = _grads(shapes, torch.float32, "dense")
    launches, smalls = emu().planned_launches(), emu().planned_small_launches()
    emu().plan_unscale_and_check_(grads, torch.zeros(1), torch.ones(1))
    got_small = emu().planned_small_launches() - smalls
    assert (got_small, emu().planned_launches() - launches - got_small) == (small, large)


def test_small_table_in_optimizer_plans() -> None:
    # Adam with amsgrad and masters: SMALL[ADAM] tensors in one small launch,
    # one more in one large launch (and the step-increment launch each)
    for n, small in ((SMALL[ADAM], 1), (SMALL[ADAM] + 1, 0)):
        d = _adam_inputs(torch.float16, torch.float16, True, True, [(3,)] * n)
        launches, smalls = emu().planned_launches(), emu().planned_small_launches()
        emu().plan_fused_adam_(*d.values(), *_adam_scalars(True, True))
        assert emu().planned_small_launches() - smalls == small
        assert emu().planned_launches() - launches == 2


def _model_launches(numels: List[int], max_tensors: int) -> int:
    """Launches a plan of tensors of these sizes takes: launch_plan.h's packing, written
    out (empty tensors take none; a launch closes at MAX_BLOCKS blocks, the tensor going
    on in the next, or at max_tensors tensors after the last one's last chunk)."""
    launches = tensors = blocks = 0
    open_ = False
    for n in numels:
        if n == 0:
            continue
        if not open_:
            launches, open_ = launches + 1, True
        tensors += 1
        chunks = -(-n // CHUNK)
        for c in range(chunks):
            blocks += 1
            last = c == chunks - 1
            if blocks == MAX_BLOCKS or (tensors == max_tensors and last):
                blocks = 0
                if last:
                    tensors, open_ = 0, False
                else:
                    launches, tensors = launches + 1, 1
    return launches


def _planned(call: Any) -> tuple:
    """(launches, blocks) planned by call()."""
    launches, blocks = emu().planned_launches(), emu().planned_blocks()
    call()
    return emu().planned_launches() - launches, emu().planned_blocks() - blocks


# more tensors than one launch holds (exactly two full launches of Adam: a launch
# holding one tensor fewer would take three), zero-size tensors at the ends and between,
# one tensor of several chunks, sizes mixed
PLAN_SIZES = ([0] + [5] * (2 * MAX_TENSORS[ADAM] - 41) + [0, 3 * CHUNK + 1, 0]
              + [1 + i % 9 for i in range(40)] + [0])


@pytest.mark.parametrize("sizes", [PLAN_SIZES, [], [0, 0], [2 * CHUNK] * 3])
def test_optimizer_plan_launches_and_blocks(sizes: List[int]) -> None:
    # one (param dtype, grad dtype) group: its launches and blocks as the packing model
    # says, plus one step-increment launch (one block) per 256 params
    d = _adam_inputs(torch.float16, torch.float16, True, True, [(n,) for n in sizes])
    steps = -(-len(sizes) // 256)
    want = (_model_launches(sizes, MAX_TENSORS[ADAM]) + steps,
            sum(-(-n // CHUNK) for n in sizes) + steps)
    assert _planned(lambda: emu().plan_fused_adam_(*d.values(), *_adam_scalars(True, True))) \
        == want


@pytest.mark.parametrize("sizes", [PLAN_SIZES, [], [0, 0],
                                   [2 * CHUNK] * 3 + [CHUNK + 1] * (MAX_BLOCKS // 2 + 1)])
def test_unscale_plan_launches_and_blocks(sizes: List[int]) -> None:
    # (planned only, nothing is read or written: disjoint views of one buffer, since a
    # written list may not hold one tensor twice)
    grads = list(torch.empty(sum(sizes)).split(sizes)) if sizes else []
    want = (_model_launches(sizes, MAX_TENSORS[1]), sum(-(-n // CHUNK) for n in sizes))
    assert _planned(lambda: emu().plan_unscale_and_check_(grads, torch.zeros(1),
                                                          torch.ones(1))) == want


def _emulated_and_cpu_mixed_adam(shapes: list, every: int) -> tuple:
    """fused_adam_ emulated and on the CPU over ``shapes`` in three (param, grad) dtype
    groups (bf16 params every ``every``-th tensor, fp32 grads the one after), held to each
    other within one ulp: (the inputs, the emulated result, the CPU result)."""
    n = len(shapes)
    d = _adam_inputs(torch.float16, torch.float16, True, False, shapes)
    for i in range(0, n, every):
        d["params"][i] = d["params"][i].to(torch.bfloat16)
        d["master_params"][i] = d["params"][i].float() + 1e-2
    for i in range(1, n, every):
        d["grads"][i] = d["grads"][i].float()
    a, b = _clone(d), _clone(d)
    emu().fused_adam_(*a.values(), *_adam_scalars(False, True))
    torch.ops.mixprec.fused_adam_(*b.values(), *_adam_scalars(False, True))
    for k in d:
        for x, y in zip(a[k], b[k]):
            assert ulps(x, y) <= 1, k
    return d, a, b


def test_optimizer_plans_per_dtype_group_match_the_cpu_kernel() -> None:
    # zero-size tensors and sizes mixed across three (param, grad) dtype groups, more
    # tensors than one launch holds in one of them: the emulated kernel equals the CPU one
    n = MAX_TENSORS[ADAM] + 20
    _emulated_and_cpu_mixed_adam([((0 if i % 17 == 0 else 1 + (i * 5) % 23),)
                                  for i in range(n)], 4)


# ---------------------------------------------------------------------------
# unscale_and_norm_ / check_finite_and_norm_: same effects, same norm.

@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("case", ["tails", "multi-chunk", "many", "zero-size", "empty-list"])
def test_norms_match_cpu_kernel(dtype: torch.dtype, norm_type: float, case: str) -> None:
    grads = _grads(UNSCALE_SHAPES[case], dtype, "dense")
    inv = torch.full((1,), 0.5)
    for op in ("unscale_and_norm_", "check_finite_and_norm_"):
        a = [g.clone() for g in grads]
        b = [g.clone() for g in grads]
        fa, fb = torch.zeros(1), torch.zeros(1)
        na = getattr(emu(), op)(a, fa, inv, norm_type)
        nb = getattr(torch.ops.mixprec, op)(b, fb, inv, norm_type)
        for x, y in zip(a, b):
            assert_bitwise_equal(x, y)
        assert fa.item() == fb.item() == 0.0
        # float64 reference of the norm of grads * inv_scale
        u = torch.cat([g.double().reshape(-1) * 0.5 for g in grads] + [torch.zeros(1)])
        ref = torch.linalg.vector_norm(u, norm_type).item()  # (a 0 keeps inf-norm defined)
        # both combine per-chunk double partials and round once to float32; the
        # order differs (block tree vs CPU chunks), which moves the double sum
        # by far less than one float32 ulp: allow one.
        for n in (na, nb):
            assert n.dtype == torch.float32 and n.shape == ()
            assert abs(n.item() - ref) <= 2.0 ** -23 * abs(ref) * 1.01 + 1e-30, (n, ref)
        assert ulps(na, nb) <= 1


def test_norm_with_nonfinite_reports_it() -> None:
    g = [torch.randn(CHUNK + 3), torch.randn(9)]
    g[0][0] = float("inf")
    g[1][-1] = float("nan")
    f = torch.zeros(1)
    n = emu().unscale_and_norm_(g, f, torch.ones(1), 2.0)
    assert f.item() == 1.0 and not torch.isfinite(n)


# ---------------------------------------------------------------------------
# update_scale_ / update_scale_ext_: bitwise equal to the CPU kernels over a
# sequence of found_inf values.

def test_update_scale_sequences_match_cpu() -> None:
    pattern = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    states = {k: (torch.full((1,), 65536.0), torch.zeros(1, dtype=torch.int32),
                  torch.ones(1, dtype=torch.int32)) for k in ("emu", "cpu")}
    for inf in pattern:
        found = torch.full((1,), float(inf))
        for k, ns in (("emu", emu()), ("cpu", torch.ops.mixprec)):
            s, gt, hl = states[k]
            ns.update_scale_(s, gt, found, 2.0, 0.5, 3)
        assert_bitwise_equal(states["emu"][0], states["cpu"][0])
        assert_bitwise_equal(states["emu"][1], states["cpu"][1])
    states = {k: (torch.full((1,), 1024.0), torch.zeros(1, dtype=torch.int32),
                  torch.full((1,), 2, dtype=torch.int32)) for k in ("emu", "cpu")}
    for inf in pattern:
        found = torch.full((1,), float(inf))
        for k, ns in (("emu", emu()), ("cpu", torch.ops.mixprec)):
            s, gt, hl = states[k]
            ns.update_scale_ext_(s, gt, hl, found, 2.0, 0.5, 2, 256.0, 4096.0, 2)
        for x, y in zip(states["emu"], states["cpu"]):
            assert_bitwise_equal(x, y)


def test_update_scale_statistics_match_cpu() -> None:
    """The one-thread kernel's statistics (counts, prev_scale) as the CPU kernel's."""
    pattern = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    runs = {k: (torch.full((1,), 1024.0), torch.zeros(1, dtype=torch.int32),
                torch.full((1,), 2, dtype=torch.int32),
                torch.tensor([0, 0, 0, 0, -1]), torch.full((1,), 1024.0))
            for k in ("emu", "cpu", "emu_ext", "cpu_ext")}
    for step, inf in enumerate(pattern):
        found = torch.full((1,), float("nan") if step == 9 else float(inf))
        for k, (s, gt, hl, counts, prev) in runs.items():
            ns = emu() if k.startswith("emu") else torch.ops.mixprec
            if k.endswith("_ext"):
                ns.update_scale_ext_(s, gt, hl, found, 2.0, 0.5, 2, 256.0, 4096.0, 2,
                                     counts, prev)
            else:
                ns.update_scale_(s, gt, found, 2.0, 0.5, 3, counts, prev)
        for a, b in (("emu", "cpu"), ("emu_ext", "cpu_ext")):
            for x, y in zip(runs[a], runs[b]):
                assert_bitwise_equal(x, y)
    assert runs["cpu"][3].tolist()[:2] == [13, 4]


def test_every_op_of_the_table_is_emulated_and_planned() -> None:
    """ops_emulated.cpp registers <op> and plan_<op> for each op of the table."""
    for name in _cuda_emulation.OP_NAMES:
        for kernel in (name, "plan_" + name):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(
                f"{_cuda_emulation.NAMESPACE}::{kernel}", "CPU"), kernel


def test_plan_update_scale_counts_one_launch_and_writes_nothing() -> None:
    s, gt, hl = (torch.full((1,), 1024.0), torch.zeros(1, dtype=torch.int32),
                 torch.full((1,), 2, dtype=torch.int32))
    found = torch.ones(1)
    for call in (lambda: emu().plan_update_scale_(s, gt, found, 2.0, 0.5, 3),
                 lambda: emu().plan_update_scale_ext_(s, gt, hl, found, 2.0, 0.5, 2,
                                                      256.0, 4096.0, 2)):
        before = emu().planned_launches()
        call()
        assert emu().planned_launches() == before + 1
        assert s.item() == 1024.0 and gt.item() == 0 and hl.item() == 2
    with pytest.raises(RuntimeError, match="growth_interval"):
        emu().plan_update_scale_(s, gt, found, 2.0, 0.5, 0)


# ---------------------------------------------------------------------------
# fused_adam_ / fused_sgd_

OPT_SHAPES = [(0,), (1,), (3,), (15,), (40, 3), (4096 + 5,), (CHUNK + 9,)]


def _adam_inputs(pdt: torch.dtype, gdt: torch.dtype, masters: bool, amsgrad: bool,
                 shapes: List[tuple], layout: str = "dense") -> Dict[str, List[torch.Tensor]]:
    def make(s: tuple, dtype: torch.dtype, scale: float = 1.0, positive: bool = False,
             i: int = 0) -> torch.Tensor:
        n = int(torch.Size(s).numel())
        base = torch.rand(s) if positive else torch.randn(s)
        base = (base * scale).to(dtype)
        if layout == "misaligned" and n > 0:
            t = torch.empty(n + 1, dtype=dtype)[1:].view(s)
            t.copy_(base)
            return t
        if layout == "strided" and n > 0 and i % 2 == 0:
            t = torch.empty(n * 2, dtype=dtype)[::2].view(s)
            t.copy_(base)
            return t
        return base

    params = [make(s, pdt, i=i) for i, s in enumerate(shapes)]
    return {
        "params": params,
        "grads": [make(s, gdt, i=i) for i, s in enumerate(shapes)],
        "exp_avgs": [make(s, torch.float32, 0.1, i=i) for i, s in enumerate(shapes)],
        "exp_avg_sqs": [make(s, torch.float32, 0.01, True, i=i)
                        for i, s in enumerate(shapes)],
        "max_exp_avg_sqs": [make(s, torch.float32, 0.01, True, i=i)
                            for i, s in enumerate(shapes)] if amsgrad else [],
        # masters differ from the params by more than a 16-bit ulp, so reading
        # the param (or the grad) in place of the master shows
        "master_params": [p.float() + 1e-2 * torch.randn(p.shape) for p in params]
        if masters else [],
        "state_steps": [torch.full((), float(i % 4)) for i in range(len(shapes))],
    }


def _clone(d: Dict[str, List[torch.Tensor]]) -> Dict[str, List[torch.Tensor]]:
    return {k: [t.clone() for t in v] for k, v in d.items()}


def _adam_scalars(amsgrad: bool, decoupled: bool, skip: bool = False) -> tuple:
    return (torch.tensor(1e-2), 0.9, 0.999, 0.01, 1e-8, amsgrad, False, decoupled,
            torch.full((1,), 64.0), torch.full((1,), float(skip)), torch.full((1,), 0.75))


def _adam_float64(d: Dict[str, List[torch.Tensor]], masters: bool, amsgrad: bool,
                  decoupled: bool) -> Dict[str, List[torch.Tensor]]:
    """torch.optim.Adam(W)'s update in float64 from the same inputs (grad / 64 * 0.75)."""
    lr, b1, b2, wd, eps = 1e-2, 0.9, 0.999, 0.01, 1e-8
    out: Dict[str, List[torch.Tensor]] = {"w": [], "m": [], "v": [], "vmax": []}
    for i, p in enumerate(d["params"]):
        w = (d["master_params"][i] if masters else p).double()
        g = d["grads"][i].double() / 64.0 * 0.75
        step = d["state_steps"][i].item() + 1
        if decoupled:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        m = d["exp_avgs"][i].double() * b1 + (1 - b1) * g
        v = d["exp_avg_sqs"][i].double() * b2 + (1 - b2) * g * g
        vmax = torch.maximum(d["max_exp_avg_sqs"][i].double(), v) if amsgrad else v
        denom = vmax.sqrt() / (1 - b2 ** step) ** 0.5 + eps
        w = w - lr / (1 - b1 ** step) * m / denom
        out["w"].append(w)
        out["m"].append(m)
        out["v"].append(v)
        out["vmax"].append(vmax)
    return out


def _close_to_float64(x: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor,
                      ulps: float) -> None:
    """|x - ref| <= ulps float32 ulps of `scale` (the magnitudes the result is built from)."""
    err = (x.double() - ref).abs()
    bound = ulps * 2.0 ** -23 * scale.abs() + 1e-30
    assert bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("pdt,gdt,masters", [
    (p, g, m) for p in ALL for g in ALL for m in (False, True) if not (m and p == torch.float32)
])
@pytest.mark.parametrize("amsgrad,decoupled", [(False, True), (True, False)])
def test_fused_adam_vs_float64_and_cpu_kernel(pdt: torch.dtype, gdt: torch.dtype,
                                              masters: bool, amsgrad: bool,
                                              decoupled: bool) -> None:
    d = _adam_inputs(pdt, gdt, masters, amsgrad, OPT_SHAPES)
    a, b = _clone(d), _clone(d)
    emu().fused_adam_(*a.values(), *_adam_scalars(amsgrad, decoupled))
    torch.ops.mixprec.fused_adam_(*b.values(), *_adam_scalars(amsgrad, decoupled))
    ref = _adam_float64(d, masters, amsgrad, decoupled)
    for i in range(len(OPT_SHAPES)):
        lr_step = 1e-2 / (1 - 0.9 ** (d["state_steps"][i].item() + 1))
        # Each float32 result is a short chain of roundings (<= ~12 operations,
        # each <= 0.5 ulp of its value); the values chained are bounded by
        # |w| and by the step size lr/(1-b1^t) * |m/denom| <= lr/(1-b1^t) * ~3.
        w32 = a["master_params"][i] if masters else a["params"][i].float()
        # plus, for a 16-bit param without master, its final rounding (half
        # an ulp: 2^-11 relative for fp16, 2^-8 for bf16 = 2^13 / 2^16 float32 ulps)
        final = {torch.float16: 2.0 ** 13, torch.bfloat16: 2.0 ** 16}.get(pdt, 0.0)
        _close_to_float64(w32, ref["w"][i], ref["w"][i].abs() + 3 * lr_step,
                          16 + (0.0 if masters else final))
        _close_to_float64(a["exp_avgs"][i], ref["m"][i],
                          d["exp_avgs"][i].abs() + ref["m"][i].abs() + 1e-3, 4)
        _close_to_float64(a["exp_avg_sqs"][i], ref["v"][i],
                          d["exp_avg_sqs"][i].abs() + ref["v"][i].abs(), 4)
        if masters:
            # the master is written, and the param is the master rounded to nearest
            assert_bitwise_equal(a["params"][i], a["master_params"][i].to(pdt))
        # the CUDA code and the CPU kernel evaluate the same float32 formula
        for k in d:
            if k != "state_steps" and d[k]:
                assert ulps(a[k][i], b[k][i]) <= 1, (k, i)
        assert a["state_steps"][i].item() == d["state_steps"][i].item() + 1


@pytest.mark.parametrize("layout", ["misaligned", "strided"])
@pytest.mark.parametrize("pdt,masters", [(torch.float32, False), (torch.float16, True),
                                         (torch.bfloat16, True)])
def test_fused_adam_layouts(layout: str, pdt: torch.dtype, masters: bool) -> None:
    d = _adam_inputs(pdt, pdt, masters, True, OPT_SHAPES, layout)
    a, b = _clone(d), _clone(d)
    emu().fused_adam_(*a.values(), *_adam_scalars(True, True))
    torch.ops.mixprec.fused_adam_(*b.values(), *_adam_scalars(True, True))
    for k in d:
        for x, y, orig in zip(a[k], b[k], d[k]):
            assert ulps(x, y) <= 1, k
            # (max_exp_avg_sqs keeps its value where it exceeds the new exp_avg_sq; a 16-bit
            # param with a master may round back to its old value: checked against the
            # master below)
            if orig.numel() > 0 and k not in ("grads", "state_steps", "max_exp_avg_sqs") \
                    and not (masters and k == "params"):
                assert not torch.equal(x, orig), f"{k} not written"
    for p, m in zip(a["params"], a["master_params"]):
        assert_bitwise_equal(p, m.to(pdt))  # the param is its written master, rounded


def test_fused_adam_mixed_dtypes_many_tensors_and_skip() -> None:
    # more tensors than one launch holds, three dtype groups
    n = MAX_TENSORS[ADAM] + 9
    d, a, _ = _emulated_and_cpu_mixed_adam([(1 + (i * 7) % 50,) for i in range(n)], 3)
    for p, mp in zip(a["params"], a["master_params"]):
        assert_bitwise_equal(p, mp.to(p.dtype))
    # found_inf set: nothing changes, step counts included
    c = _clone(d)
    emu().fused_adam_(*c.values(), *_adam_scalars(False, True, skip=True))
    for k in d:
        for x, y in zip(c[k], d[k]):
            assert_bitwise_equal(x, y)


def test_fused_adam_tensor_split_across_launches() -> None:
    # bf16 params with masters; one tensor crosses the launch boundary at
    # MAX_BLOCKS chunks: both halves must be updated from their masters. (Adam is
    # elementwise, so the float64 reference is taken on windows around the
    # boundary and at both ends; every element is checked against its master.)
    sizes = [3 * CHUNK + 1, (MAX_BLOCKS - 1) * CHUNK + 77]
    d = _adam_inputs(torch.bfloat16, torch.bfloat16, True, False, [(n,) for n in sizes])
    boundary = (MAX_BLOCKS - 4) * CHUNK  # first element of launch 2 in tensor 1
    windows = [(0, 0, 300), (1, 0, 300), (1, boundary - 300, boundary + 300),
               (1, sizes[1] - 300, sizes[1])]
    part = {k: [v[i][lo:hi].clone() if v[i].numel() > 1 else v[i].clone()
                for i, lo, hi in windows] if v else [] for k, v in d.items()}
    ref = _adam_float64(part, True, False, True)
    masters_before = [m.clone() for m in d["master_params"]]
    emu().fused_adam_(*d.values(), *_adam_scalars(False, True))
    for j, (i, lo, hi) in enumerate(windows):
        lr_step = 1e-2 / (1 - 0.9 ** (part["state_steps"][j].item() + 1))
        _close_to_float64(d["master_params"][i][lo:hi], ref["w"][j],
                          ref["w"][j].abs() + 3 * lr_step, 16)
    for i, n in enumerate(sizes):
        assert_bitwise_equal(d["params"][i], d["master_params"][i].to(torch.bfloat16))
        # every chunk (block) wrote its masters
        moved = d["master_params"][i] != masters_before[i]
        full = n // CHUNK * CHUNK
        assert bool(moved[:full].view(-1, CHUNK).any(dim=1).all()) and bool(moved[full:].any())


def test_stochastic_rounding_equals_cpu_kernel() -> None:
    # SR numbers elements by block across the group's plan, as the CPU kernel
    # does: the emulated CUDA result is the CPU result bit for bit.
    shapes = [(5,), (CHUNK + 3,), (2 * CHUNK,), (17,)]
    d = _adam_inputs(torch.bfloat16, torch.float32, False, False, shapes)
    a, b = _clone(d), _clone(d)
    sc = list(_adam_scalars(False, True)) + [True, 1234]
    emu().fused_adam_(*a.values(), *sc)
    torch.ops.mixprec.fused_adam_(*b.values(), *sc)
    for x, y in zip(a["params"], b["params"]):
        assert_bitwise_equal(x, y)


@pytest.mark.parametrize("pdt,gdt,masters", [
    (torch.float32, torch.float32, False), (torch.float16, torch.float16, True),
    (torch.bfloat16, torch.float32, True), (torch.float16, torch.bfloat16, False),
])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_fused_sgd_vs_cpu_kernel(pdt: torch.dtype, gdt: torch.dtype, masters: bool,
                                 momentum: float, nesterov: bool) -> None:
    d = _adam_inputs(pdt, gdt, masters, False, OPT_SHAPES)
    inputs = [d["params"], d["grads"], d["exp_avgs"] if momentum else [],
              d["master_params"], d["state_steps"]]
    scal = (torch.tensor(0.05, dtype=torch.float64), 1e-2, momentum, 0.0 if nesterov else 0.1,
            nesterov, False,
            torch.full((1,), 4.0), torch.zeros(1), None)
    a = [[t.clone() for t in lst] for lst in inputs]
    b = [[t.clone() for t in lst] for lst in inputs]
    emu().fused_sgd_(*a, *scal)
    torch.ops.mixprec.fused_sgd_(*b, *scal)
    for la, lb in zip(a, b):
        for x, y in zip(la, lb):
            assert ulps(x, y) <= 1
    if masters:
        for i, (p, mp) in enumerate(zip(a[0], a[3])):
            assert_bitwise_equal(p, mp.to(pdt))
            # w - lr * (g/4 + wd * w) [+ momentum], float64, from the master
            w0 = inputs[3][i].double()
            if momentum == 0.0 and inputs[0][i].numel():
                ref = w0 - 0.05 * (inputs[1][i].double() / 4 + 1e-2 * w0)
                _close_to_float64(mp, ref, w0.abs() + 0.05 * inputs[1][i].double().abs(), 8)


# ---------------------------------------------------------------------------
# Bad input: the same checks, the same messages, nothing modified.

def test_bad_inputs_raise_the_cpu_kernels_errors() -> None:
    d = _adam_inputs(torch.float16, torch.float16, True, False, [(8,), (9,)])
    d["master_params"][1] = torch.zeros(9, dtype=torch.float16)  # wrong dtype
    before = _clone(d)
    msgs = []
    for ns in (emu(), torch.ops.mixprec):
        with pytest.raises(RuntimeError) as err:
            ns.fused_adam_(*d.values(), *_adam_scalars(False, True))
        msgs.append(str(err.value).splitlines()[0])
        for k in d:
            for x, y in zip(d[k], before[k]):
                assert_bitwise_equal(x, y)
    assert msgs[0] == msgs[1] and "master_params" in msgs[0]
    with pytest.raises(RuntimeError, match="found_inf"):
        emu().unscale_and_check_([torch.ones(3)], torch.zeros(2), torch.ones(1))
