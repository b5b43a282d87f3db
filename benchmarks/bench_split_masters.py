"""The split-master step against the float32-master step on the CPU, side by side.

mixprec.optim.AdamW over bf16 params (``--tensors`` tensors of ``2^--log2`` elements in all)
with float32 masters, ``master_correction_bits=16`` and ``=8``, 32-bit or 8-bit moments; one
torch thread, thread CPU time per ``optimizer.step()``, the cases interleaved round by round;
the median per case and its ratio to the float32-master step. Checked untimed first: after
one step from the same state the 16-bit form's params equal the float32-master run's, and its
decoded masters equal the float32 masters off the stated exception (the 8-bit form's params
moved). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch

import mixprec


def _make(n: int, tensors: int, bits: Optional[int], state_bits: int,
          seed: int) -> mixprec.optim.AdamW:
    g = torch.Generator().manual_seed(seed)
    size = max(1, n // tensors)
    params = []
    for _ in range(tensors):
        p = (torch.randn(size, generator=g) * 0.02).to(torch.bfloat16).requires_grad_()
        p.grad = (torch.randn(size, generator=g) * 1e-3).to(torch.bfloat16)
        params.append(p)
    return mixprec.optim.AdamW(params, lr=1e-3, weight_decay=0.01, state_bits=state_bits,
                               master_correction_bits=bits)


def _params(opt: mixprec.optim.AdamW) -> List[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def check(n: int, tensors: int, state_bits: int) -> bool:
    """One step of each form from the same state; the 16-bit form must equal float32 masters."""
    ref, s16, s8 = (_make(n, tensors, b, state_bits, 0) for b in (None, 16, 8))
    before = [p.detach().clone() for p in _params(s8)]
    for opt in (ref, s16, s8):
        opt.step()
    ok = True
    for a, b in zip(_params(ref), _params(s16)):
        if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
            print("check: the 16-bit form's params differ from the float32-master run's")
            ok = False
            break
    for m32, m16 in zip(ref.master_params(), s16.master_params()):
        off = (m32.view(torch.int32) - m16.view(torch.int32)).abs()
        if int(off.max()) > 1:  # the exception: one float32 ulp
            print("check: the 16-bit form's masters are off by more than the stated ulp")
            ok = False
            break
    if all(torch.equal(a, b) for a, b in zip(before, _params(s8))):
        print("check: the 8-bit form's step changed no param")
        ok = False
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2", type=int, nargs="+", default=[20, 24])
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--state-bits", type=int, default=32, choices=(8, 32))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"mixprec {mixprec.__version__}, torch {torch.__version__}, "
          f"CPU kernels {mixprec.build_info().get('cpu_capability')}, "
          f"moments {args.state_bits}-bit")
    status = 0
    for log2 in args.log2:
        n = 1 << log2
        if not check(n, args.tensors, args.state_bits):
            status = 1
            continue
        cases = {name: _make(n, args.tensors, bits, args.state_bits, 0)
                 for name, bits in (("float32", None), ("split16", 16), ("split8", 8))}
        reps = max(1, (1 << 22) // n)
        times: Dict[str, List[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for name, opt in cases.items():
                t0 = time.thread_time()
                for _ in range(reps):
                    opt.step()
                times[name].append((time.thread_time() - t0) / reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"2^{log2} elements: " + ", ".join(
            f"{k} {med[k] * 1e3:.2f} ms ({med[k] / med['float32']:.2f}x)" for k in med))
    return status


if __name__ == "__main__":
    sys.exit(main())
