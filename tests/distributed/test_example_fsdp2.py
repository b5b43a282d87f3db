"""examples/fsdp2_train.py under ``torchrun --nproc-per-node 2`` on CPU (gloo): it trains
(the loss falls) and each rank holds half of the model's params, grads and state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mixprec
from _helpers import REPO
from mixprec import _dtensor

ROOT = REPO
PACKAGE_DIR = Path(mixprec.__file__).resolve().parents[1]  # this run's build of mixprec
_WHY = _dtensor.fsdp2_unavailable()


@pytest.mark.skipif(_WHY is not None or sys.platform == "win32",
                    reason=_WHY or "torch.distributed with gloo unavailable on this platform")
@pytest.mark.parametrize("recipe,held", [
    ("A-fp16", {"params": 2.0, "grads": 2.0, "optimizer state": 4.0}),
    ("B-bf16", {"params": 1.0, "grads": 1.0, "optimizer state": 6.0}),
    ("B-sr", {"params": 1.0, "grads": 1.0, "optimizer state": 4.0}),
])
def test_fsdp2_example_trains_on_two_cpu_ranks(tmp_path, recipe, held):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_DIR),
                                                        os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone",
         str(ROOT / "examples" / "fsdp2_train.py"), "--recipe", recipe, "--steps", "40",
         "--device", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], out.stdout
    for rank in range(2):
        line = re.search(rf"rank {rank}/2 \[{recipe}\] bytes per model param held: (.*)",
                         out.stdout)
        assert line is not None, out.stdout
        got = {k: float(v) for k, v in re.findall(r"([a-z ]+?) (\d+\.\d+)", line.group(1))}
        assert {k.strip(): v for k, v in got.items()} == pytest.approx(held, abs=0.02)
