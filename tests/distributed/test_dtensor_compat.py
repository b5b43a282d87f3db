"""mixprec._dtensor: where FSDP2 lives in each torch, and what happens where it does not
(the FSDP2 tests skip with that reason; tests/distributed/test_fsdp2.py)."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from mixprec import _dtensor


def test_fsdp2_is_found_on_this_torch():
    fully_shard, policy = _dtensor.fsdp2()
    assert callable(fully_shard) and policy.__name__ == "MixedPrecisionPolicy"
    assert _dtensor.fsdp2_unavailable() is None


def test_without_fsdp2_the_reason_names_the_torch_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)
    with pytest.raises(ImportError, match=re.escape(f"torch {torch.__version__} has no FSDP2")):
        _dtensor.fsdp2()
    assert "has no FSDP2" in _dtensor.fsdp2_unavailable()


def test_without_torch_distributed(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    assert "torch.distributed" in _dtensor.fsdp2_unavailable()


def test_plain_tensors_are_not_dtensors():
    t = torch.ones(3)
    assert not _dtensor.is_dtensor(t) and not _dtensor.any_dtensor([t, t])
    assert _dtensor.local(t) is t and _dtensor.specs_of([t, t]) == []
    assert _dtensor.reduce_groups([], shard_only=True) == []
