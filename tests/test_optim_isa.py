"""The CPU optimizer kernels are compiled per instruction set (default, AVX2,
AVX-512) and picked at run time. Every set must compute the same bits (the
builds never fuse a multiply-add), so the same steps run with each set forced
through MIXPREC_CPU_CAPABILITY must leave identical params and state."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mixprec

ORDER = ["default", "avx2", "avx512"]
NATIVE = mixprec.build_info().get("cpu_capability", "default") if mixprec.has_extension() \
    else "default"

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


@pytest.mark.skipif(not mixprec.has_extension(), reason="needs the compiled extension")
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
