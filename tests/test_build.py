"""Build configuration, `python -m mixprec.info`, the missing-extension fallback and the
torch-mismatch error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mixprec

PKG_DIR = Path(mixprec.__file__).resolve().parent


def test_build_info_keys_and_values():
    info = mixprec.build_info()
    assert info["version"] == mixprec.__version__
    assert info["torch_running"] == torch.__version__
    assert info["extension_loaded"] is True
    assert info["torch_built"] == torch.__version__
    assert isinstance(info["cuda_kernels"], bool)
    if info["cuda_kernels"]:
        assert torch.version.cuda is not None
        assert info["cuda_version"] and info["cuda_archs"]
    else:
        assert info["cuda_version"] is None and info["cuda_archs"] == []


@pytest.mark.skipif("MIXPREC_EXPECT_CUDA_KERNELS" not in os.environ,
                    reason="the build variant under test is named by MIXPREC_EXPECT_CUDA_KERNELS")
def test_build_variant_is_the_expected_one():
    """`make test` names the variant it built; a CUDA build that silently lost its kernels
    (or a CPU-only build that kept them) fails here."""
    expected = os.environ["MIXPREC_EXPECT_CUDA_KERNELS"] == "1"
    assert mixprec.has_cuda_kernels() is expected
    if expected:
        assert {"8.0", "9.0"} <= {a.replace("+PTX", "") for a in mixprec.build_info()
                                  ["cuda_archs"]} or os.environ.get("TORCH_CUDA_ARCH_LIST")


def _run(code: str, env: dict | None = None, cwd: str | None = None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def test_python_m_mixprec_info():
    out = subprocess.run([sys.executable, "-m", "mixprec.info"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for key in ("version", "torch_built", "torch_running", "cuda_kernels", "cuda_version",
                "cuda_archs"):
        assert key in text
    kernels_line = next(line for line in text.splitlines() if line.startswith("cuda_kernels"))
    assert kernels_line.endswith("yes" if mixprec.has_cuda_kernels() else "no")


def test_missing_extension_falls_back_to_reference(tmp_path):
    """A copy of the package without the compiled module imports, warns once, and its ops
    still give the right answers through the reference implementation."""
    copy = tmp_path / "mixprec"
    shutil.copytree(PKG_DIR, copy, ignore=shutil.ignore_patterns("_C*.so", "_C*.pyd",
                                                                 "__pycache__"))
    code = """
import warnings, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    import mixprec
    import mixprec.ops
assert not mixprec.has_extension()
msgs = [str(x.message) for x in w if issubclass(x.category, mixprec.MixprecExtensionWarning)]
assert len(msgs) == 1 and "not found" in msgs[0], msgs
g = [torch.tensor([1.0, 2.0, float('inf')]), torch.tensor([4.0], dtype=torch.bfloat16)]
f = torch.zeros(())
mixprec.ops.unscale_and_check_(g, f, torch.tensor(0.5))
assert f.item() == 1.0 and g[0][:2].tolist() == [0.5, 1.0] and g[1].item() == 2.0
n = mixprec.ops.unscale_and_norm_([torch.tensor([6.0, 8.0])], f, torch.tensor(0.5))
assert n.item() == 5.0
s, t = torch.tensor(4.0), torch.tensor(1, dtype=torch.int32)
mixprec.ops.update_scale_(s, t, torch.zeros(()), 2.0, 0.5, 2)
assert (s.item(), t.item()) == (8.0, 0)
print("fallback ok")
"""
    out = _run(code, env={"PYTHONPATH": str(tmp_path)}, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "fallback ok" in out.stdout


def test_torch_version_mismatch_raises_with_rebuild_hint():
    code = """
import torch
torch.__version__ = "0.0.1+other"
try:
    import mixprec
except ImportError as e:
    print("ERR", e)
"""
    out = _run(code, env={"PYTHONPATH": str(PKG_DIR.parent)})
    assert "ERR" in out.stdout, out.stdout + out.stderr
    assert "0.0.1+other" in out.stdout and "Rebuild" in out.stdout
