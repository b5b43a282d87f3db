"""Optimizer state bytes per param at GPT-2 small (``bench_optim.py --state-bytes``).

Each mixprec row builds the optimizer over GPT-2 small's 148 params on the ``meta`` device
(shapes and dtypes, no data), takes one step (a step on ``meta`` makes the state and
computes nothing) and adds up the bytes of every tensor in ``optimizer.state``: masters or
corrections, moments, 8-bit codes and maxima, step counts. The param and its grad are not
state and not counted. The FlashOptim rows are counted from its documented layout
(arXiv 2602.23349, §3.2, and its README: ``master_weight_bits=24`` keeps an 8-bit
correction, 32 a 16-bit one; both moments in 8 bits in groups of 32 elements with a
float16 scale per group, each tensor padded to whole groups).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

import mixprec.optim
from _common import Shape, gpt2_small_shapes, numel

#: row -> (param dtype, optimizer keyword arguments) of a mixprec AdamW
MIXPREC_ROWS: Dict[str, Tuple[torch.dtype, Dict[str, Any]]] = {
    "fp32 params, 32-bit moments (no master)": (torch.float32, {}),
    "bf16 + float32 masters, 32-bit moments": (torch.bfloat16, {}),
    "bf16 + 16-bit correction, 32-bit moments": (torch.bfloat16,
                                                 {"master_correction_bits": 16}),
    "bf16 + 8-bit correction, 32-bit moments": (torch.bfloat16, {"master_correction_bits": 8}),
    "bf16 + float32 masters, 8-bit moments": (torch.bfloat16, {"state_bits": 8}),
    "bf16 + 16-bit correction, 8-bit moments": (torch.bfloat16,
                                                {"state_bits": 8, "master_correction_bits": 16}),
    "bf16 + 8-bit correction, 8-bit moments": (torch.bfloat16,
                                               {"state_bits": 8, "master_correction_bits": 8}),
    "bf16 without masters, 8-bit moments": (torch.bfloat16,
                                            {"state_bits": 8, "master_weights": False}),
}
#: row -> the bytes of its master correction per element
FLASHOPTIM_ROWS = {"FlashOptim master_weight_bits=32 (16-bit correction), 8-bit moments": 2,
                   "FlashOptim master_weight_bits=24 (8-bit correction), 8-bit moments": 1}
FLASHOPTIM_GROUP, FLASHOPTIM_SCALE_BYTES = 32, 2


def state_bytes(make: Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer],
                shapes: Sequence[Shape], dtype: torch.dtype) -> int:
    """The bytes of every tensor in the state of ``make(params)`` after one step over
    params of ``shapes`` and ``dtype`` on ``meta``."""
    params = [torch.nn.Parameter(torch.empty(s, dtype=dtype, device="meta")) for s in shapes]
    for p in params:
        p.grad = torch.empty_like(p)
    opt = make(params)
    opt.step()
    return sum(t.numel() * t.element_size() for st in opt.state.values()
               for t in st.values() if isinstance(t, torch.Tensor))


def flashoptim_bytes(shapes: Sequence[Shape], correction_bytes: int) -> int:
    """FlashOptim's AdamW state from its layout: the correction, two 8-bit moments and a
    float16 scale per 32-element group of each moment."""
    total = 0
    for s in shapes:
        n = torch.Size(s).numel()
        groups = -(-n // FLASHOPTIM_GROUP)
        total += n * (correction_bytes + 2) + 2 * groups * FLASHOPTIM_SCALE_BYTES
    return total


def table(shapes: Optional[Sequence[Shape]] = None) -> List[Tuple[str, float]]:
    """(row, state bytes per param) of every row, at ``shapes`` (default GPT-2 small)."""
    shapes = list(shapes or gpt2_small_shapes())
    n = numel(shapes)
    rows = []
    for name, (dtype, kw) in MIXPREC_ROWS.items():
        got = state_bytes(lambda ps, kw=kw: mixprec.optim.AdamW(ps, lr=1e-3, **kw), shapes,
                          dtype)
        rows.append((f"mixprec AdamW {name}", got / n))
    rows += [(name, flashoptim_bytes(shapes, c) / n) for name, c in FLASHOPTIM_ROWS.items()]
    return rows


def print_table(shapes: Optional[Sequence[Shape]] = None, label: str = "GPT-2 small") -> None:
    shapes = list(shapes or gpt2_small_shapes())
    print(f"optimizer state bytes per param, {label}: {len(shapes)} tensors, "
          f"{numel(shapes) / 1e6:.1f}M params (counted from optimizer.state after one "
          "step on 'meta'; FlashOptim from its documented layout)")
    print("| setting | state bytes / param |\n| --- | --- |")
    for name, value in table(shapes):
        print(f"| {name} | {value:.3f} |")
