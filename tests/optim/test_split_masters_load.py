"""Checkpoints of split masters (``master_correction_bits``): saved and loaded as they are,
bit for bit; float32 masters loaded into a split optimizer and back, whichever of the model
and the optimizer is loaded first, training on as the run in the original form; 16 to 8
bits and back keep the param; bad entries refused with nothing changed."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

import pytest
import torch
from torch import nn

import mixprec
from _helpers import assert_bitwise_equal, assert_same_tree, saved_and_loaded
from mixprec.optim import decode_master


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 6))
    m[0].to(torch.bfloat16)  # bf16 params beside float32 ones
    return m


def _opt(m: nn.Module, bits: Optional[int], state_bits: int = 32) -> torch.optim.Optimizer:
    return mixprec.optim.AdamW(m.parameters(), lr=1e-2, master_correction_bits=bits,
                               state_bits=state_bits, min_8bit_size=0)


def _step(m: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    x = torch.randn(5, 12, generator=g)
    opt.zero_grad()
    m[2](m[1](m[0](x.to(torch.bfloat16)).float())).pow(2).mean().backward()
    opt.step()


def _run(bits: Optional[int], steps: int, state_bits: int = 32) -> tuple:
    m = _model()
    opt = _opt(m, bits, state_bits)
    for k in range(steps):
        _step(m, opt, k)
    return m, opt


def _params(m: nn.Module) -> List[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("state_bits", [32, 8])
def test_a_split_checkpoint_reloads_bit_for_bit_and_trains_on(bits: int, state_bits: int):
    m, opt = _run(bits, 2, state_bits)
    msd, osd = saved_and_loaded(m.state_dict()), saved_and_loaded(opt.state_dict())
    dtypes = {v["master_correction"].dtype for v in osd["state"].values()
              if "master_correction" in v}
    assert dtypes == {torch.int16 if bits == 16 else torch.int8}
    m2 = _model()
    opt2 = _opt(m2, bits, state_bits)
    opt2.load_state_dict(osd)
    m2.load_state_dict(msd)
    assert_same_tree(saved_and_loaded(opt2.state_dict()), osd)
    for k in range(2, 4):
        _step(m, opt, k)
        _step(m2, opt2, k)
    for a, b in zip(_params(m2), _params(m)):
        assert_bitwise_equal(a, b)
    assert_same_tree(opt2.state_dict(), opt.state_dict())


@pytest.mark.parametrize("model_first", [True, False])
def test_float32_masters_load_into_16_bits_and_train_on_as_float32_masters(model_first: bool):
    m, opt = _run(None, 2)
    msd, osd = saved_and_loaded(m.state_dict()), saved_and_loaded(opt.state_dict())
    masters = [mm.clone() for mm in opt.master_params()]
    m2 = _model()
    opt2 = _opt(m2, 16)
    if model_first:
        m2.load_state_dict(msd)
    opt2.load_state_dict(osd)
    if not model_first:
        m2.load_state_dict(msd)
    assert opt2.param_groups[0]["master_correction_bits"] == 16  # the loader's setting
    for a, b in zip(opt2.master_params(), masters):
        assert_bitwise_equal(a, b, "the masters, before any step")
    for k in range(2, 5):
        _step(m, opt, k)
        _step(m2, opt2, k)
    for a, b in zip(_params(m2), _params(m)):
        assert_bitwise_equal(a, b)
    for a, b in zip(opt2.master_params(), opt.master_params()):
        assert_bitwise_equal(a, b)
    bf16 = m2[0].weight
    assert "master_param" not in opt2.state[bf16]
    assert opt2.state[bf16]["master_correction"].dtype == torch.int16


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("model_first", [True, False])
def test_a_split_checkpoint_loads_into_float32_masters(bits: int, model_first: bool):
    m, opt = _run(bits, 2)
    msd, osd = saved_and_loaded(m.state_dict()), saved_and_loaded(opt.state_dict())
    decoded = [mm.clone() for mm in opt.master_params()]
    m2 = _model()
    opt2 = _opt(m2, None)
    if model_first:
        m2.load_state_dict(msd)
    opt2.load_state_dict(osd)
    if not model_first:
        m2.load_state_dict(msd)  # the correction is decoded with this param, at the step
    for a, b in zip(opt2.master_params(), decoded):
        assert_bitwise_equal(a, b, "the masters, before any step")
    ref = _model()
    ref.load_state_dict(msd)
    ref_opt = _opt(ref, None)
    ref_opt.load_state_dict(osd)
    for k in range(2, 4):
        _step(m2, opt2, k)
    w = m2[0].weight
    assert opt2.state[w]["master_param"].dtype == torch.float32
    assert "master_correction" not in opt2.state[w]
    if bits == 16:  # the 16-bit run trains on as float32 masters (no midpoint hit here)
        for k in range(2, 4):
            _step(m, opt, k)
        for a, b in zip(_params(m2), _params(m)):
            assert_bitwise_equal(a, b)
        for a, b in zip(opt2.master_params(), opt.master_params()):
            assert_bitwise_equal(a, b)


@pytest.mark.parametrize("saved_bits,bits", [(16, 8), (8, 16)])
def test_another_width_is_re_encoded_against_the_param(saved_bits: int, bits: int):
    m, opt = _run(saved_bits, 2)
    msd, osd = saved_and_loaded(m.state_dict()), saved_and_loaded(opt.state_dict())
    before = opt.master_params()[0].clone()
    m2 = _model()
    m2.load_state_dict(msd)
    opt2 = _opt(m2, bits)
    opt2.load_state_dict(osd)
    w = m2[0].weight
    for p in m2.parameters():
        p.grad = torch.zeros_like(p)
    opt2._buckets(0, opt2.param_groups[0])  # (the conversion the next step makes first)
    c = opt2.state[w]["master_correction"]
    assert c.dtype == (torch.int8 if bits == 8 else torch.int16)
    assert_bitwise_equal(w.detach(), m[0].weight.detach(), "the param is kept")
    after = decode_master(w.detach(), c)
    if bits == 16:
        assert_bitwise_equal(after, before, "8 bits are carried exactly by 16")
    else:
        off = (after.view(torch.int32).long() - before.view(torch.int32).long()).abs()
        assert int(off.max()) <= 256


def _corrupt(osd: Dict[str, Any], key: str, value: Any) -> Dict[str, Any]:
    bad = copy.deepcopy(osd)
    bad["state"][0][key] = value
    return bad


@pytest.mark.parametrize("what,match", [
    ("float", "expected an int16 or int8 correction"),
    ("shape", "expected the param's shape"),
    ("both", "holds both 'master_param' and 'master_correction'"),
    ("fp32 param", "only a bfloat16 param with masters keeps a split master"),
    ("group bits", r"\['master_correction_bits'\]: master_correction_bits must be None"),
])
def test_bad_entries_are_refused_naming_them_nothing_changed(what: str, match: str):
    m, opt = _run(16, 1)
    osd = opt.state_dict()
    c = osd["state"][0]["master_correction"]
    bad = {"float": lambda: _corrupt(osd, "master_correction", c.float()),
           "shape": lambda: _corrupt(osd, "master_correction", c.reshape(-1)),
           "both": lambda: _corrupt(osd, "master_param", decode_master(m[0].weight, c)),
           "group bits": lambda: {**osd, "param_groups": [
               {**osd["param_groups"][0], "master_correction_bits": 12}]}}
    if what == "fp32 param":
        sd = copy.deepcopy(osd)
        sd["state"][2]["master_correction"] = torch.zeros(m[2].weight.shape,
                                                          dtype=torch.int16)
    else:
        sd = bad[what]()
    before = saved_and_loaded(opt.state_dict())
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    assert_same_tree(opt.state_dict(), before)
