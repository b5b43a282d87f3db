"""Split masters (``master_correction_bits``): the encoding of mixprec.optim._masters against
its documented exactness and bound, the option's checks, and the step: with 16 bits the bits
of the float32-master step wherever no midpoint is hit, with 8 bits the same params and a
master within the bound, one master form per op call."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import pytest
import torch

import mixprec
from _helpers import assert_bitwise_equal
from mixprec.optim._masters import decode_master, recode, split_master


def _patterns() -> torch.Tensor:
    """float32 patterns: every pattern around +-0, the smallest normal, 1.0, bf16's largest
    finite value and inf (both signs, two bf16 ulps each side), 2^20 random ones and 4096
    random bf16 midpoints."""
    centres = [0x00000000, 0x00800000, 0x3F800000, 0x3F810000, 0x7F7F0000, 0x7F800000]
    spans = [torch.arange(c - 0x20000, c + 0x20000, dtype=torch.int64) for c in centres]
    g = torch.Generator().manual_seed(0)
    spans.append(torch.randint(0, 2 ** 32, (1 << 20,), generator=g, dtype=torch.int64))
    spans.append(torch.randint(0, 2 ** 16, (4096,), generator=g) * 65536 + 0x8000)  # midpoints
    u = torch.cat(spans) % 2 ** 32
    u = torch.cat([u, u ^ 0x80000000])  # both signs
    return torch.where(u >= 2 ** 31, u - 2 ** 32, u).to(torch.int32).view(torch.float32)


def _pattern_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32).to(torch.int64) - b.view(torch.int32).to(torch.int64)).abs()


def test_16_bits_are_exact_but_at_the_midpoints_rounded_to_an_even_param():
    m = _patterns()
    p, c = split_master(m, 16)
    assert c.dtype == torch.int16 and c.shape == m.shape
    assert_bitwise_equal(p, m.to(torch.bfloat16), "the param is RNE(master)")
    out = decode_master(p, c)
    nan = m.isnan()
    assert out[nan].isnan().all()
    u = m.view(torch.int32).to(torch.int64) % 2 ** 32
    # the exceptions, found without the encoding: low half exactly 0x8000 (a bf16 midpoint)
    # above an even truncation (RNE keeps it), not NaN
    midpoint = ((u & 0xFFFF) == 0x8000) & (((u >> 16) & 1) == 0) & ~nan
    off = _pattern_distance(out, m)
    assert int(midpoint.sum()) > 2000
    assert torch.equal(off[~nan & ~midpoint], torch.zeros_like(off[~nan & ~midpoint]))
    assert torch.equal(off[midpoint], torch.ones_like(off[midpoint]))
    toward_p = out[midpoint].abs() < m[midpoint].abs()
    assert toward_p.all()
    for special in (0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 3.4e38):
        t = torch.tensor([special])
        assert_bitwise_equal(decode_master(*split_master(t, 16)), t, str(special))


def test_8_bits_stay_within_256_patterns_and_128_below_the_clamp():
    m = _patterns()
    p, c = split_master(m, 8)
    assert c.dtype == torch.int8
    assert_bitwise_equal(p, m.to(torch.bfloat16))
    out = decode_master(p, c)
    nan = m.isnan()
    assert out[nan].isnan().all()
    off = _pattern_distance(out, m)[~nan]
    d = (m.view(torch.int32).to(torch.int64)
         - p.view(torch.int16).to(torch.int64) * 65536)[~nan]
    assert int(off.max()) <= 256
    assert int(off[d < 32640].max()) <= 128
    # the decoded master rounds to the param, but where it is the midpoint below an odd one
    # (the correction -128: 0x8000 patterns below)
    odd_below = (c[~nan] == -128) & ((p.view(torch.int16)[~nan] & 1) == 1)
    rounds = out[~nan].to(torch.bfloat16).view(torch.int16) == p[~nan].view(torch.int16)
    assert odd_below.any() and torch.equal(rounds, ~odd_below)


@pytest.mark.parametrize("bits", [16, 8])
def test_the_encoding_is_the_kernels_reference(bits: int):
    """mixprec.optim._masters against tests/_split_reference.py (written apart, with a floor
    division), and a width change against the param kept."""
    import _split_reference as ref

    m = _patterns()
    p, c = split_master(m, bits)
    rp, rc = ref.split(m, c.dtype)
    assert_bitwise_equal(p, rp)
    assert torch.equal(c, rc)
    assert_bitwise_equal(decode_master(p, c), ref.decode(p, c))
    other = 8 if bits == 16 else 16
    again = recode(p, c, other)
    assert torch.equal(again, ref.encode(ref.decode(p, c), p, again.dtype))


def test_decode_master_refuses_what_is_not_a_pair():
    p = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="param must be a bfloat16"):
        decode_master(p.float(), torch.zeros(3, dtype=torch.int16))
    with pytest.raises(TypeError, match="int16 or int8"):
        decode_master(p, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \[2\], the param \[3\]"):
        decode_master(p, torch.zeros(2, dtype=torch.int8))


# ---------------------------------------------------------------- the option

CLASSES = ["Adam", "AdamW", "SGD", "Adam8bit", "AdamW8bit", "SGD8bit"]


def _make(cls: str, params: Any, **kw: Any) -> torch.optim.Optimizer:
    if cls.startswith("SGD"):
        kw.setdefault("momentum", 0.9)
    return getattr(mixprec.optim, cls)(params, lr=1e-2, **kw)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("bad", [0, 4, 32, True, "16", 16.0])
def test_a_bad_value_is_refused_naming_the_argument(cls: str, bad: Any):
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="master_correction_bits must be None"):
        _make(cls, [p], master_correction_bits=bad)
    with pytest.raises(ValueError, match=r"param_groups\[0\]: master_correction_bits"):
        _make(cls, [{"params": [p], "master_correction_bits": bad}])


@pytest.mark.parametrize("cls", CLASSES)
def test_float16_params_are_refused_naming_the_param_and_the_alternative(cls: str):
    bf, fp16 = (torch.nn.Parameter(torch.zeros(4, dtype=d))
                for d in (torch.bfloat16, torch.float16))
    with pytest.raises(ValueError) as e:
        _make(cls, [bf, fp16], master_correction_bits=16)
    for words in ("param_groups[0]['params'][1] is float16", "master_correction_bits=16",
                  "master_correction_bits=None (float32 masters)", "bfloat16 params"):
        assert words in str(e.value)
    opt = _make(cls, [bf], master_correction_bits=8)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] is float16"):
        opt.add_param_group({"params": (q for q in [fp16])})
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == [bf]
    # float16 with float32 masters in a group of its own, or without masters: accepted
    opt.add_param_group({"params": [fp16], "master_correction_bits": None})
    _make(cls, [fp16], master_correction_bits=16, master_weights=False)


def test_a_float16_param_set_later_is_refused_at_the_step_unchanged():
    p = torch.nn.Parameter(torch.randn(8).to(torch.float16))
    opt = mixprec.optim.AdamW([p], lr=1e-2)
    opt.param_groups[0]["master_correction_bits"] = 16
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    with pytest.raises(ValueError, match=r"\['params'\]\[0\] is float16"):
        opt.step()
    assert_bitwise_equal(p.detach(), before)
    assert not opt.state[p]


# ---------------------------------------------------------------- the step

def _params(seed: int) -> List[torch.nn.Parameter]:
    """bf16 params of edge shapes (empty, scalar, transposed) and one float32 param."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(0,), (), (7,), (300,), (64, 72)]
    ps = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    ps.append(torch.randn(13, 9, generator=g).to(torch.bfloat16).t())
    ps.append(torch.randn(5, generator=g))
    return [torch.nn.Parameter(p) for p in ps]


def _train(make: Callable[[Any], torch.optim.Optimizer], steps: int, seed: int = 0
           ) -> tuple:
    params = _params(seed)
    opt = make(params)
    g = torch.Generator().manual_seed(seed + 1)
    masters: List[List[torch.Tensor]] = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step()
        masters.append([m.clone() for m in opt.master_params()])
    return params, opt, masters


def _midpoint_mask(m: torch.Tensor) -> torch.Tensor:
    """The float32 values of ``m`` that are the 16-bit form's exceptions."""
    u = m.contiguous().view(torch.int32).to(torch.int64) % 2 ** 32
    return ((u & 0xFFFF) == 0x8000) & (((u >> 16) & 1) == 0) & ~m.isnan()


@pytest.mark.parametrize("cls", CLASSES)
def test_16_bits_step_as_float32_masters(cls: str):
    """Step by step against float32 masters: the same params, the same masters but at the
    exception midpoints (one float32 ulp toward the param; the float32 run is then set to
    the split master, so that the runs go on from the same state)."""
    kw: Dict[str, Any] = {"min_8bit_size": 0} if cls.endswith("8bit") else {}
    pa, pb = _params(0), _params(0)
    ref = _make(cls, pa, **kw)
    opt = _make(cls, pb, master_correction_bits=16, **kw)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        for a, b in zip(pa, pb):
            a.grad = torch.randn(a.shape, generator=g).to(a.dtype)
            b.grad = a.grad.clone()
        ref.step()
        opt.step()
        for k, (a, b, ma, mb) in enumerate(zip(pa, pb, ref.master_params(),
                                               opt.master_params())):
            where = f"step {step}, param {k}"
            assert_bitwise_equal(b.detach(), a.detach(), where)
            if a.dtype != torch.bfloat16:
                assert not opt.state[b].keys() & {"master_param", "master_correction"}
                continue
            c = opt.state[b]["master_correction"]
            assert c.dtype == torch.int16 and c.shape == b.shape and \
                "master_param" not in opt.state[b]
            assert_bitwise_equal(decode_master(b.detach(), c), mb, where)
            mid = _midpoint_mask(ma)
            off = _pattern_distance(mb.contiguous(), ma.contiguous())
            assert torch.equal(off[~mid], torch.zeros_like(off[~mid])), where
            assert torch.equal(off[mid], torch.ones_like(off[mid])), where
            assert (mb[mid].abs() < ma[mid].abs()).all(), where
            ma.copy_(mb)  # (the state's tensor: the float32 run goes on from here)


@pytest.mark.parametrize("cls", CLASSES)
def test_8_bits_give_the_params_of_float32_masters_and_a_master_within_the_bound(cls: str):
    kw: Dict[str, Any] = {"min_8bit_size": 0} if cls.endswith("8bit") else {}
    ref_p, _, ref_m = _train(lambda ps: _make(cls, ps, **kw), 1)
    p, opt, m = _train(lambda ps: _make(cls, ps, master_correction_bits=8, **kw), 1)
    for k, (a, b) in enumerate(zip(p, ref_p)):
        assert_bitwise_equal(a.detach(), b.detach(), f"param {k}")
        if a.dtype == torch.bfloat16:
            assert opt.state[a]["master_correction"].dtype == torch.int8
            off = _pattern_distance(m[0][k].contiguous(), ref_m[0][k].contiguous())
            assert off.numel() == 0 or int(off.max()) <= 256
        else:
            assert_bitwise_equal(m[0][k], ref_m[0][k])


def test_each_op_call_gets_one_master_form(monkeypatch: pytest.MonkeyPatch):
    """A group of float32 masters, one of 16-bit and one of 8-bit corrections, and params
    without masters, stepped together: one op call per form."""
    seen: List[List[torch.dtype]] = []
    real = mixprec.ops.fused_adam_

    def spy(**kw: Any) -> None:
        seen.append(sorted({t.dtype for t in kw["master_params"]}, key=str))
        real(**kw)

    monkeypatch.setattr(mixprec.ops, "fused_adam_", spy)
    ps = _params(3)
    opt = mixprec.optim.AdamW([{"params": ps[:2]}, {"params": ps[2:5],
                                                    "master_correction_bits": 16}],
                              lr=1e-2, master_correction_bits=8)
    opt.add_param_group({"params": ps[5:], "master_correction_bits": None})
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    assert sorted(map(str, seen)) == sorted(map(str, [
        [torch.int8], [torch.int16], [torch.float32], []]))
    assert [opt.state[p]["master_correction"].dtype for p in ps[:2]] == [torch.int8] * 2
    assert "master_param" in opt.state[ps[5]] and not {"master_param", "master_correction"} \
        & set(opt.state[ps[6]])
