"""Stochastic rounding by the element's place in the whole tensor (``sr_bases``): a tensor
cut into row shards and stepped as separate params, each given the numbers its elements
have in the whole tensor's call (``mixprec.optim._sr``), rounds exactly as the whole tensor
does, on every backend (CPU kernel, CUDA launcher through the emulation, the reference),
for the four optimizer ops; and ``sr_bases`` of the wrong length is refused."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import pytest
import torch

import _cuda_emulation
from _helpers import assert_bitwise_equal
from mixprec.optim import _quant8 as q8
from mixprec.optim import _sr

SHAPES = [(67, 300), (5, 130), (130, 67), (300, 257)]  # (the last spans CUDA blocks)


def _backends(op: str) -> Dict[str, Callable[..., Any]]:
    return _cuda_emulation.backends(op, reference=True)


def _args(op: str, shapes: List[tuple]) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    common = dict(params=params, grads=[], master_params=[],
                  state_steps=[torch.zeros(()) for _ in shapes], lr=torch.tensor(1e-2),
                  weight_decay=0.01, maximize=False, grad_scale=None, found_inf=None,
                  clip_coef=None, stochastic_rounding=True, seed=11)
    if op.startswith("fused_adam"):
        common.update(beta1=0.9, beta2=0.999, eps=1e-8, decoupled_weight_decay=True)
    else:
        common.update(momentum=0.9, dampening=0.0, nesterov=False)
    zeros = [torch.zeros(s) for s in shapes]
    if op == "fused_adam_":
        common.update(exp_avgs=zeros, exp_avg_sqs=[z.clone() for z in zeros],
                      max_exp_avg_sqs=[], amsgrad=False)
    elif op == "fused_sgd_":
        common.update(momentum_buffers=zeros)
    elif op == "fused_adam8_":
        m, v = ([q8.quantize(z, t) for z in zeros] for t in (q8.SIGNED, q8.UNSIGNED))
        common.update(exp_avgs=[c for c, _ in m], exp_avg_absmax=[a for _, a in m],
                      exp_avg_sqs=[c for c, _ in v], exp_avg_sq_absmax=[a for _, a in v])
    else:
        b = [q8.quantize(z, q8.SIGNED) for z in zeros]
        common.update(momentum_buffers=[c for c, _ in b], momentum_absmax=[a for _, a in b])
    return common


def _clone(args: Dict[str, Any]) -> Dict[str, Any]:
    return {k: [t.clone() if isinstance(t, torch.Tensor) else t for t in v]
            if isinstance(v, list) else v for k, v in args.items()}


@pytest.mark.parametrize("op", ["fused_adam_", "fused_sgd_", "fused_adam8_", "fused_sgd8_"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_given_their_numbers_round_as_the_whole_tensor(op, world):
    args = _args(op, SHAPES)

    def cut(t: torch.Tensor) -> List[torch.Tensor]:
        parts = [c.contiguous() for c in torch.chunk(t, world, dim=0)]
        return parts + [t[:0].contiguous()] * (world - len(parts))

    per_param = {k for k, v in args.items() if isinstance(v, list) and v
                 and k not in ("state_steps",)}
    for name, fn in _backends(op).items():
        whole = _clone(args)
        ranks = []
        for r in range(world):  # rank r's call: row chunk r of every param
            a = _clone(args)
            for k in per_param:
                a[k] = [cut(t)[r] for t in args[k]]
            extents = []
            for p in args["params"]:
                rows = torch.chunk(torch.arange(p.shape[0]), world)
                first = int(rows[r][0]) if r < len(rows) else p.shape[0]
                extents.append((p.numel(), first * (p.numel() // p.shape[0])))
            a["sr_bases"] = _sr.sr_bases(a["params"], [p.to(torch.bfloat16)
                                                       for p in a["params"]], extents)
            ranks.append(a)
        g = torch.Generator().manual_seed(5)
        for _ in range(3):
            whole["grads"] = [torch.randn(p.shape, generator=g).to(torch.bfloat16)
                              for p in whole["params"]]
            fn(**whole)
            for r, a in enumerate(ranks):
                a["grads"] = [cut(t)[r] for t in whole["grads"]]
                fn(**a)
        for k in per_param:
            for i, t in enumerate(whole[k]):
                joined = torch.cat([a[k][i] for a in ranks])
                assert_bitwise_equal(joined, t, f"{op} {name} world={world}: {k}[{i}]")


def test_without_sr_bases_the_numbering_is_the_unsharded_calls():
    """sr_bases=None and the bases _sr gives an unsharded call are the same numbers."""
    args = _args("fused_adam_", SHAPES)
    a, b = _clone(args), _clone(args)
    g = [torch.randn(p.shape).to(torch.bfloat16) for p in args["params"]]
    a["grads"], b["grads"] = g, g
    b["sr_bases"] = _sr.sr_bases(b["params"], g, [(p.numel(), 0) for p in b["params"]])
    torch.ops.mixprec.fused_adam_(**a)
    torch.ops.mixprec.fused_adam_(**b)
    for x, y in zip(a["params"], b["params"]):
        assert_bitwise_equal(x, y, "params")


@pytest.mark.parametrize("op", ["fused_adam_", "fused_sgd_", "fused_adam8_", "fused_sgd8_"])
def test_sr_bases_of_the_wrong_length_are_refused_before_anything_changes(op):
    args = _args(op, SHAPES)
    args["grads"] = [torch.ones(p.shape, dtype=torch.bfloat16) for p in args["params"]]
    args["sr_bases"] = [0, 0]
    before = _clone(args)
    for name, fn in _backends(op).items():
        with pytest.raises(RuntimeError, match=r"sr_bases must be None or have one number "
                                               r"per param \(4\), got 2"):
            fn(**args)
        for k, v in before.items():
            if isinstance(v, list) and k != "sr_bases":
                for i, t in enumerate(v):
                    assert_bitwise_equal(args[k][i], t, f"{op} {name}: {k}[{i}]")
