"""The fused 8-bit-state ops (``fused_adam8_``, ``fused_sgd8_``): the CPU kernel and the
CUDA launcher (run on the CPU by the emulation) against the pure-PyTorch reference
(``tests/_reference.py``), bit for bit: params, masters, codes, maxima and step counts,
over several steps (so codes written by one step are read back by the next), every
param/grad dtype pair, masters, stochastic rounding, block and chunk boundaries, strided
and misaligned tensors. The rounding to codes is also tested on its own at the places it
can go wrong: every midpoint of the code table and its float32 neighbours, bucket edges,
zeros, denormals, and blocks that are all zero or have one huge value.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Callable, Dict, List

import pytest
import torch

import _cuda_emulation
import _reference
from _helpers import REPO, assert_bitwise_equal
from mixprec.optim import _quant8 as q8

ROOT = REPO
CHUNK = 65536  # the CUDA launcher's elements per block (a CPU chunk is half of it)
ALL = (torch.float32, torch.float16, torch.bfloat16)

needs_ext = pytest.mark.skipif(not hasattr(torch.ops.mixprec, "fused_adam8_"),
                               reason="needs the op library")


def test_the_kernels_tables_are_the_reference_tables():
    """csrc/common/quant8_tables.h is what tools/gen_quant8_tables.py writes from
    _quant8.py today (the script also proves that every bucket holds at most one
    midpoint of each sign, which the kernels' one-step rounding relies on)."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_quant8_tables.py"),
                        "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _backends(op: str) -> Dict[str, Callable[..., Any]]:
    return _cuda_emulation.backends(op)


# ---------------------------------------------------------------------------
# Cases: lists of param shapes and layouts.

SHAPES = {
    "tails": [(1,), (255,), (256,), (257,), (3, 100)],
    "chunk-edges": [(CHUNK + 300,), (5,)],
    # the row layout: blocks inside rows (rows of 257 across CUDA blocks and CPU chunks,
    # rows shorter than a block, of one element, 3-D, empty)
    "rows": [(300, 257), (67, 300), (3, 100), (2, 3, 50), (7, 1), (1, 600), (0, 5)],
}


def _param(shape: tuple, dtype: torch.dtype, layout: str, g: torch.Generator) -> torch.Tensor:
    if layout == "strided" and len(shape) == 2:
        return torch.randn(shape[::-1], generator=g).to(dtype).t()
    if layout == "misaligned":
        n = 1
        for s in shape:
            n *= s
        return torch.randn(n + 1, generator=g).to(dtype)[1:].view(shape)
    return torch.randn(shape, generator=g).to(dtype)


def _adam8_args(shapes: List[tuple], pdt: torch.dtype, gdt: torch.dtype, masters: bool,
                layout: str, seed: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    params = [_param(s, pdt, layout, g) for s in shapes]
    m = [torch.randn(s, generator=g) * 0.1 for s in shapes]
    v = [torch.rand(s, generator=g) * 0.01 for s in shapes]
    mq = [q8.quantize(x, q8.SIGNED) for x in m]
    vq = [q8.quantize(x, q8.UNSIGNED) for x in v]
    return dict(
        params=params,
        grads=[],  # filled per step
        exp_avgs=[c for c, _ in mq], exp_avg_absmax=[a for _, a in mq],
        exp_avg_sqs=[c for c, _ in vq], exp_avg_sq_absmax=[a for _, a in vq],
        master_params=[p.float() for p in params] if masters else [],
        state_steps=[torch.full((), float(i % 3)) for i in range(len(shapes))],
        lr=torch.tensor(1e-2), beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8,
        maximize=False, decoupled_weight_decay=True, grad_scale=torch.tensor(1024.0),
        found_inf=torch.zeros(()), clip_coef=torch.tensor(0.5),
        stochastic_rounding=False, seed=7,
    )


def _sgd8_args(shapes: List[tuple], pdt: torch.dtype, gdt: torch.dtype, masters: bool,
               layout: str, seed: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    params = [_param(s, pdt, layout, g) for s in shapes]
    bq = [q8.quantize(torch.randn(s, generator=g) * 0.1, q8.SIGNED) for s in shapes]
    return dict(
        params=params, grads=[],
        momentum_buffers=[c for c, _ in bq], momentum_absmax=[a for _, a in bq],
        master_params=[p.float() for p in params] if masters else [],
        state_steps=[torch.full((), float(i % 2)) for i in range(len(shapes))],
        lr=torch.tensor(1e-2), weight_decay=1e-3, momentum=0.9, dampening=0.0,
        nesterov=True, maximize=False, grad_scale=torch.tensor(1024.0),
        found_inf=torch.zeros(()), clip_coef=None, stochastic_rounding=False, seed=3,
    )


MAKERS = {"fused_adam8_": _adam8_args, "fused_sgd8_": _sgd8_args}


def _clone(args: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for k, v in args.items():
        if isinstance(v, list):  # (params keep their layouts: strided, misaligned)
            out[k] = [_same_layout(t) if k == "params" else t.clone() for t in v]
        elif isinstance(v, torch.Tensor):
            out[k] = v.clone()
        else:
            out[k] = v
    return out


def _same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same strides and the same 16-byte misalignment."""
    if t.is_contiguous() and t.data_ptr() % 16 != 0:
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
        return flat.view(t.shape).copy_(t)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t)


def _run_steps(op: str, fn: Callable[..., Any], args: Dict[str, Any], gdt: torch.dtype,
               steps: int, seed: int) -> Dict[str, Any]:
    a = _clone(args)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        a["grads"] = [(torch.randn(p.shape, generator=g) * 100).to(gdt) for p in a["params"]]
        fn(**a)
    return a


def _assert_same(x: Dict[str, Any], y: Dict[str, Any], what: str) -> None:
    for k, v in x.items():
        if isinstance(v, list) and k != "grads":
            for i, (a, b) in enumerate(zip(v, y[k])):
                assert_bitwise_equal(a, b, f"{what}: {k}[{i}]")


@needs_ext
@pytest.mark.parametrize("op", sorted(MAKERS))
@pytest.mark.parametrize("pdt,gdt", [(p, g) for p in ALL for g in ALL])
def test_kernels_match_the_reference_bitwise_over_steps(op, pdt, gdt):
    for masters in ([False, True] if pdt != torch.float32 else [False]):
        args = MAKERS[op](SHAPES["tails"], pdt, gdt, masters, "contiguous", seed=1)
        ref = _run_steps(op, getattr(_reference, op), args, gdt, steps=3, seed=5)
        for name, fn in _backends(op).items():
            got = _run_steps(op, fn, args, gdt, steps=3, seed=5)
            _assert_same(got, ref, f"{op} {name} {pdt}/{gdt} masters={masters}")


@needs_ext
@pytest.mark.parametrize("op", sorted(MAKERS))
@pytest.mark.parametrize("case", ["chunk-edges", "rows", "strided", "misaligned", "sr",
                                  "adam-l2", "adam-no-decay-large-lerp-weight",
                                  "maximize-no-scalars"])
def test_kernels_match_the_reference_on_layouts_and_options(op, case):
    """(The Adam steps of the other cases are AdamW with beta1 = 0.9, which the CUDA
    launcher runs with its common-step kernel; adam-l2 and adam-no-decay-large-lerp-weight
    take its general kernel.)"""
    shapes = SHAPES[case] if case in ("chunk-edges", "rows") else SHAPES["tails"]
    layout = case if case in ("strided", "misaligned") else "contiguous"
    pdt = torch.bfloat16
    masters = case not in ("sr",)
    args = MAKERS[op](shapes, pdt, torch.float16, masters, layout, seed=2)
    if case == "sr":
        args["stochastic_rounding"] = True
    if case == "adam-l2" and op == "fused_adam8_":
        args["decoupled_weight_decay"] = False
    if case == "adam-no-decay-large-lerp-weight" and op == "fused_adam8_":
        args.update(weight_decay=0.0, beta1=0.3)
    if case == "maximize-no-scalars":
        args.update(maximize=True, grad_scale=None, clip_coef=None, found_inf=None)
        if op == "fused_sgd8_":
            args.update(nesterov=False, dampening=0.25)
    ref = _run_steps(op, getattr(_reference, op), args, torch.float16, steps=2, seed=9)
    for name, fn in _backends(op).items():
        got = _run_steps(op, fn, args, torch.float16, steps=2, seed=9)
        _assert_same(got, ref, f"{op} {name} {case}")


def _offset_codes(args: Dict[str, Any], offset: int) -> Dict[str, Any]:
    """``args`` with every code tensor moved to a buffer ``offset`` bytes past an aligned
    start (the same codes; the kernels' 32-bit code words need 4-byte alignment)."""
    out = dict(args)
    for k in ("exp_avgs", "exp_avg_sqs", "momentum_buffers"):
        if k in out:
            out[k] = [torch.empty(c.numel() + offset, dtype=torch.uint8)[offset:]
                      .view(c.shape).copy_(c) for c in out[k]]
    return out


@needs_ext
@pytest.mark.parametrize("op", sorted(MAKERS))
@pytest.mark.parametrize("codes_offset", [0, 1, 2])
def test_whole_blocks_rows_and_misaligned_codes_match_the_reference(op, codes_offset):
    """Whole 256-element blocks (rows that are multiples of 256, as GPT-2's, across CUDA
    blocks that start mid-row; a 1-D tensor), codes aligned and not: the CUDA launcher's
    whole-block path (16-byte loads, codes as 32-bit words) where every list is aligned
    and its per-element path where the codes are not give the reference's bits."""
    shapes = [(130, 768), (3, 512), (1, 1024), (600,), (40, 256)]
    args = MAKERS[op](shapes, torch.bfloat16, torch.bfloat16, True, "contiguous", seed=8)
    ref = _run_steps(op, getattr(_reference, op), args, torch.bfloat16, steps=2, seed=3)
    for name, fn in _backends(op).items():
        a = _offset_codes(_clone(args), codes_offset)
        assert all(c.data_ptr() % 4 == codes_offset for c in a.get("exp_avgs", []) +
                   a.get("momentum_buffers", []))
        g = torch.Generator().manual_seed(3 + 1)
        for _ in range(2):
            a["grads"] = [(torch.randn(p.shape, generator=g) * 100).to(torch.bfloat16)
                          for p in a["params"]]
            fn(**a)
        _assert_same(a, ref, f"{op} {name} codes_offset={codes_offset}")


@needs_ext
@pytest.mark.parametrize("op", sorted(MAKERS))
@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_a_tensor_cut_into_row_shards_steps_as_the_whole(op, world):
    """The row layout's promise: the rows of a tensor stepped as separate tensors (the
    shards FSDP2 makes, torch.chunk's split, empty ones included) give the whole tensor's
    params, masters, codes and maxima, bit for bit, on every backend."""
    shapes = [(67, 300), (5, 130), (130, 67)]
    args = MAKERS[op](shapes, torch.bfloat16, torch.bfloat16, True, "contiguous", seed=6)

    def cut(t: torch.Tensor) -> List[torch.Tensor]:
        parts = [c.contiguous() for c in torch.chunk(t, world, dim=0)]
        return parts + [t[:0].contiguous()] * (world - len(parts))

    sharded = {k: ([c for t in v for c in cut(t)] if isinstance(v, list) and k not in
                   ("state_steps", "grads") else v) for k, v in args.items()}
    sharded["state_steps"] = [t.clone() for t in args["state_steps"] for _ in range(world)]
    for name, fn in _backends(op).items():
        whole = _clone(args)
        parts = _clone(sharded)
        g = torch.Generator().manual_seed(11)
        for _ in range(3):
            whole["grads"] = [torch.randn(p.shape, generator=g).to(torch.bfloat16)
                              for p in whole["params"]]
            parts["grads"] = [c for t in whole["grads"] for c in cut(t)]
            fn(**whole)
            fn(**parts)
        for k, v in whole.items():
            if isinstance(v, list) and k not in ("grads", "state_steps"):
                for i, t in enumerate(v):
                    joined = torch.cat(parts[k][i * world:(i + 1) * world])
                    assert_bitwise_equal(joined, t, f"{op} {name} world={world}: {k}[{i}]")


@needs_ext
@pytest.mark.parametrize("op", sorted(MAKERS))
def test_found_inf_changes_nothing_and_empty_lists_are_fine(op):
    args = MAKERS[op](SHAPES["tails"], torch.float16, torch.float16, True, "contiguous", 4)
    args["found_inf"] = torch.ones(())
    for name, fn in _backends(op).items():
        before = _clone(args)
        before["grads"] = [torch.full(p.shape, float("inf"), dtype=torch.float16)
                           for p in before["params"]]
        after = _clone(before)
        fn(**after)
        _assert_same(after, before, f"{op} {name} found_inf")
        empty = {k: ([] if isinstance(v, list) else v) for k, v in args.items()}
        fn(**empty)  # nothing to do, no error
        zero = MAKERS[op]([(0,), (0, 3)], torch.float16, torch.float16, True, "contiguous", 4)
        zero["grads"] = [torch.zeros(p.shape, dtype=torch.float16) for p in zero["params"]]
        fn(**zero)
        assert [float(s) for s in zero["state_steps"]] == [1.0, 2.0]


# ---------------------------------------------------------------------------
# The rounding on its own. fused_sgd8_ at a param's first step stores the prepared
# gradient as the momentum buffer: with no grad_scale, clip or weight decay the buffer is
# the gradient exactly, so its codes are the rounding of crafted values.

def _crafted_blocks() -> torch.Tensor:
    values, mid = q8._table_cpu(q8.SIGNED)
    u_values, u_mid = q8._table_cpu(q8.UNSIGNED)
    pts = torch.cat([mid, u_mid, values, u_values, -u_mid])
    near = torch.cat([pts, torch.nextafter(pts, torch.full_like(pts, 2.0)),
                      torch.nextafter(pts, torch.full_like(pts, -2.0))])
    edges = torch.tensor([2.0 ** e * (1 + k / 128) for e in range(-26, 0) for k in (0, 1, 127)]
                         + [0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 2.0 ** -25,
                            -(2.0 ** -25), 5e-8, 5e-7, -5e-7])
    edges = torch.cat([edges, -edges]).float()
    x = torch.cat([near, edges]).clamp(-1, 1)
    # blocks of 255 values plus a leading 1.0 (so absmax = 1 and y = x exactly)
    n = -(-x.numel() // 255) * 255
    x = torch.cat([x, torch.zeros(n - x.numel())]).view(-1, 255)
    return torch.cat([torch.ones(x.shape[0], 1), x], dim=1).reshape(-1)


@needs_ext
def test_rounding_is_the_references_at_midpoints_edges_zeros_and_denormals():
    x = _crafted_blocks()
    tail = torch.randn(77) * 1e-3  # a short last block, scalar path
    special = torch.cat([torch.zeros(256), torch.full((256,), 1e-30),
                         torch.cat([torch.tensor([3e4]), torch.randn(255) * 1e-6])])
    for g in (x, torch.cat([x, special, tail])):
        want, want_max = q8.quantize(g, q8.SIGNED)
        for name, fn in _backends("fused_sgd8_").items():
            codes = torch.zeros(g.shape, dtype=torch.uint8)
            absmax = torch.zeros(q8.num_blocks(g.numel()))
            fn(params=[torch.zeros_like(g)], grads=[g.clone()], momentum_buffers=[codes],
               momentum_absmax=[absmax], master_params=[], state_steps=[torch.zeros(())],
               lr=torch.tensor(0.0), weight_decay=0.0, momentum=0.9, dampening=0.0,
               nesterov=False, maximize=False)
            bad = (codes != want).nonzero().flatten()
            assert bad.numel() == 0, (
                f"{name}: {bad.numel()} codes differ, e.g. x={g[bad[:5]].tolist()} "
                f"got {codes[bad[:5]].tolist()} want {want[bad[:5]].tolist()}")
            assert_bitwise_equal(absmax, want_max, f"{name}: absmax")
