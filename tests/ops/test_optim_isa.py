"""The CPU optimizer kernels are compiled per instruction set (default, AVX2,
AVX-512) and picked at run time. Every set must compute the same bits (the
builds never fuse a multiply-add), so the same steps run with each set forced
through MIXPREC_CPU_CAPABILITY must leave identical params and state."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, List

import pytest
import torch

import mixprec
import mixprec.optim

ORDER = ["default", "avx2", "avx512"]
NATIVE = mixprec.build_info()["cpu_capability"]

SCRIPT = r"""
import hashlib, torch, mixprec, mixprec.optim
gen = torch.Generator().manual_seed(0)
h = hashlib.sha256()
for dtype, kw, cls in [
    (torch.float32, dict(amsgrad=True, weight_decay=0.1), mixprec.optim.AdamW),
    (torch.float16, dict(), mixprec.optim.AdamW),
    (torch.bfloat16, dict(master_weights=False, stochastic_rounding=True, seed=3),
     mixprec.optim.Adam),
    (torch.bfloat16, dict(momentum=0.9, nesterov=True), mixprec.optim.SGD),
]:
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype))
          for s in [(1,), (37,), (129, 65), (70001,)]]
    opt = cls(ps, lr=1e-2, **kw)
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        opt.step(grad_scale=torch.full((1,), 4.0))
    for p in ps:
        h.update(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        for v in opt.state[p].values():
            if isinstance(v, torch.Tensor):
                h.update(v.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
print(mixprec.build_info().get("cpu_capability"), h.hexdigest())
"""


def test_every_cpu_isa_gives_the_same_bits() -> None:
    caps = [c for c in ORDER if ORDER.index(c) <= ORDER.index(NATIVE)] \
        if NATIVE in ORDER else ["default"]
    digests = {}
    for cap in caps:
        env = {**os.environ, "MIXPREC_CPU_CAPABILITY": cap}
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        used, digest = out.stdout.split()[-2:]
        assert used == cap
        digests[cap] = digest
    assert len(set(digests.values())) == 1, digests


# The CPU kernels split their work into chunks that the threads of torch's pool claim as
# they go, so which thread runs which chunk changes from call to call. The results must
# not: every chunk processed exactly once, norms combined in chunk order.
THREAD_COUNTS = [1, 2, 3]
# several tensors of more than one 32768-element chunk, odd sizes for the tails
SIZES = [70001, 1, 65536, 131073, 3, 40000]


def _with_threads(n: int, fn: Callable[[], List[torch.Tensor]]) -> List[torch.Tensor]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unscale_and_norm_same_bits_for_every_thread_count(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    base = [torch.randn(n, generator=gen).to(dtype) for n in SIZES]
    inv = torch.full((), 0.3)

    def run() -> List[torch.Tensor]:
        g = [t.clone() for t in base]
        found = torch.zeros(())
        mixprec.ops.unscale_and_check_(g, found, inv)
        g2 = [t.clone() for t in base]
        found2 = torch.zeros(())
        norm = mixprec.ops.unscale_and_norm_(g2, found2, inv, 2.0)
        return g + g2 + [found, found2, norm]

    results = {n: _with_threads(n, run) for n in THREAD_COUNTS}
    # each element scaled exactly once (a chunk run twice or skipped would differ)
    for got, t in zip(results[1][:len(SIZES)], base):
        assert torch.equal(got, (t.float() * inv).to(dtype))
    assert float(results[1][-3]) == 0.0
    for n in THREAD_COUNTS[1:]:
        for a, b in zip(results[1], results[n]):
            assert torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), n


def test_inf_found_in_any_chunk_for_every_thread_count() -> None:
    for where in range(len(SIZES)):
        g = [torch.ones(n) for n in SIZES]
        g[where].view(-1)[-1] = float("inf")

        def run(grads: List[torch.Tensor] = g) -> List[torch.Tensor]:
            found = torch.zeros(())
            mixprec.ops.unscale_and_check_(grads, found, torch.full((), 0.5))
            return [found]

        for n in THREAD_COUNTS:
            g[where].view(-1)[-1] = float("inf")
            assert float(_with_threads(n, run)[0]) == 1.0, (where, n)


def test_fused_adam_same_bits_for_every_thread_count() -> None:
    gen = torch.Generator().manual_seed(2)
    p0 = [torch.randn(n, generator=gen).to(torch.bfloat16) for n in SIZES]
    grads = [torch.randn(n, generator=gen).to(torch.bfloat16) for n in SIZES]

    def run() -> List[torch.Tensor]:
        ps = [torch.nn.Parameter(p.clone()) for p in p0]
        opt = mixprec.optim.AdamW(ps, lr=1e-2, master_weights=False, stochastic_rounding=True,
                                  seed=5)
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt.step()
        opt.step()
        out = [p.detach() for p in ps]
        for p in ps:
            out += [v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        return out

    results = {n: _with_threads(n, run) for n in THREAD_COUNTS}
    for n in THREAD_COUNTS[1:]:
        for a, b in zip(results[1], results[n]):
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), n
