"""``torch.compile(opt.step, fullgraph=True)`` as the first mixprec step of a process.

Each case runs in a fresh interpreter (a test process has long since stepped eagerly,
which hides first-call work: the first DTensor-class lookup once called into the extension
inside the trace, which dynamo cannot trace, so a cold ``fullgraph=True`` step raised and a
cold step without ``fullgraph`` broke the graph ten times). The compiled first step is then
compared with the same step run eagerly on a twin, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Dict

import pytest

from _helpers import REPO

#: optimizer variants: the constructor call on ``params`` (16-bit params where named)
CASES: Dict[str, str] = {
    "adamw-fp32": "mixprec.optim.AdamW(params, lr=1e-2, weight_decay=0.1)",
    "adamw-bf16-masters-8bit": "mixprec.optim.AdamW(params, lr=1e-2, state_bits=8, "
                               "min_8bit_size=16)",
    "adam-amsgrad": "mixprec.optim.Adam(params, lr=1e-2, amsgrad=True)",
    "sgd-fp16-masters-nesterov": "mixprec.optim.SGD(params, lr=1e-1, momentum=0.9, "
                                 "nesterov=True)",
    "sgd-bf16-stochastic-rounding": "mixprec.optim.SGD(params, lr=1e-1, momentum=0.9, "
                                    "master_weights=False, stochastic_rounding=True)",
}

SCRIPT = """
import torch
import mixprec
{plant}
dtype = {dtype}
def make():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n).to(dtype)) for n in (64, 33, 1)]
    for k, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(k)).to(dtype)
    return params, {make}
params, opt = make()
step = torch.compile(opt.step, fullgraph=True)
step()  # the process's first mixprec step
twin, topt = make()
topt.step()
for a, b in zip(params, twin):
    assert torch.equal(a, b), (a, b)
print("ok")
"""

#: what the code did before the fix: a call into the C extension on the first step
#: (dynamo cannot trace it)
PLANT = """
import mixprec._dtensor as _d
_first = [True]
_any = _d.any_dtensor
def any_dtensor(ts):
    if _first[0]:
        _first[0] = False
        mixprec._extension.EXT.cpu_capability()
    return _any(ts)
_d.any_dtensor = any_dtensor
"""


def _run(case: str, plant: str = "") -> subprocess.CompletedProcess:
    ctor = CASES[case]
    dtype = ("torch.bfloat16" if "bf16" in case else
             "torch.float16" if "fp16" in case else "torch.float32")
    code = SCRIPT.format(plant=plant, dtype=dtype, make=ctor)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (
        os.path.dirname(os.path.dirname(__import__("mixprec").__file__)),
        env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cold_fullgraph_step_works_and_equals_eager(case: str) -> None:
    out = _run(case)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_a_c_call_on_the_first_step_is_caught() -> None:
    """The check itself: with a first-step call into the op library (ctypes) planted, the
    cold ``fullgraph=True`` step fails."""
    out = _run("adamw-fp32", PLANT)
    assert out.returncode != 0 and "Unsupported" in out.stderr, out.stderr[-3000:]
