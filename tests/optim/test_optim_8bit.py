"""8-bit optimizer state: the block-wise quantizer (mixprec.optim._quant8) at its documented
bound, the 8-bit Adam step against the 32-bit step it must equal up to quantization, its
checkpoints, memory and bad inputs."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn

import mixprec
from _helpers import REPO, assert_bitwise_equal, load_stored, saved_and_loaded
from mixprec.optim import _quant8 as q8
from mixprec.optim import _state8

sys.path.insert(0, str(REPO / "benchmarks"))
from _common import gpt2_small_shapes  # noqa: E402

# ------------------------------------------------------------------------ the quantizer


def _roundtrip(x: torch.Tensor, name: str) -> torch.Tensor:
    codes, absmax = q8.quantize(x, name)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert absmax.dtype == torch.float32 and absmax.shape == (q8.num_blocks(x.numel()),)
    return q8.dequantize(codes, absmax, name)


def _nearest(x: torch.Tensor, name: str) -> torch.Tensor:
    """float64 oracle: per element, the distance to the nearest table entry times absmax
    (a nonzero value: the nearest nonzero entry of its sign)."""
    v = q8.table(name).double()
    b = q8._blocks(x).double()
    a = b.abs().amax(1, keepdim=True)
    y = torch.where(a > 0, b / a, torch.zeros_like(b))
    d = (y[..., None] - v).abs()
    nonzero = (y != 0)[..., None] & ((v == 0) | (torch.sign(v) != torch.sign(y)[..., None]))
    d = torch.where(nonzero, torch.full_like(d, float("inf")), d)
    return (d.min(-1).values * a).reshape(-1)[: x.numel()].view(x.shape)


CASES = {
    "normal": lambda n: torch.randn(n) * 3,
    "absmax first in block": lambda n: torch.cat([torch.tensor([50.0]), torch.randn(n - 1)]),
    "absmax last in block": lambda n: torch.cat([torch.randn(n - 1), torch.tensor([-50.0])]),
    "one huge value": lambda n: torch.cat([torch.tensor([1e30]), torch.randn(n - 1) * 1e-3]),
    "zeros": lambda n: torch.zeros(n),
    "denormals": lambda n: torch.randn(n) * 1e-40,
    "mixed zeros": lambda n: torch.randn(n) * (torch.rand(n) > 0.5),
    "wide range": lambda n: torch.randn(n) * torch.logspace(-12, 3, n),
}


@pytest.mark.parametrize("name", q8.TABLES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
def test_quantize_is_nearest_and_within_the_documented_bound(name, case, n):
    x = CASES[case](n).float()
    if name == q8.UNSIGNED:
        x = x.abs()
    got = _roundtrip(x, name).double()
    err = (got - x.double()).abs()
    assert bool((err <= q8.error_bound(x, name)).all())
    # the nearest entry (float32 rounding of x / absmax and of table * absmax aside)
    a = q8._blocks(x).abs().amax(1).double().repeat_interleave(q8.BLOCK)[:n].view(x.shape)
    slack = 4 * torch.finfo(torch.float32).eps * a + 2.0**-149
    assert bool((err <= _nearest(x, name) + slack).all())
    # zeros stay zero, nothing else becomes zero, signs are kept
    assert bool(((got == 0) == (x == 0)).all())
    assert bool((torch.sign(got) == torch.sign(x.double())).all())


def test_the_block_absmax_element_is_exact_and_tables_are_sorted():
    for name in q8.TABLES:
        v = q8.table(name)
        assert v.numel() == 256 and bool((v[1:] >= v[:-1]).all()) and float(v[-1]) == 1.0
        x = torch.rand(700) + 0.1
        x[300] = 7.25
        got = _roundtrip(x, name)
        assert float(got[300]) == 7.25


@pytest.mark.parametrize("name", q8.TABLES)
def test_zero_code_is_what_quantize_gives_zero(name):
    codes, absmax = q8.quantize(torch.zeros(300), name)
    assert (codes == q8.zero_code(name)).all() and not absmax.any()


def test_unknown_table_is_named():
    with pytest.raises(ValueError, match="unknown 8-bit code table 'int8'"):
        q8.quantize(torch.ones(3), "int8")


# ------------------------------------------------------------------------ the step


def _model(dtype: torch.dtype) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10)).to(dtype)


def _grads(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=g) * 1e-2).to(p.dtype)


KWARGS = {"AdamW8bit": dict(lr=1e-2, weight_decay=0.1), "Adam8bit": dict(lr=1e-2,
                                                                          weight_decay=0.1),
          "SGD8bit": dict(lr=1e-1, momentum=0.9, nesterov=True, weight_decay=0.1)}


@pytest.mark.parametrize("cls", sorted(KWARGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_8bit_step_is_the_32bit_step_on_the_read_back_moments(cls, dtype):
    """One 8-bit step = dequantize the moments, the 32-bit step, quantize again: the
    params (and masters) bit for bit, the codes and maxima exactly."""
    torch.manual_seed(0)
    model = _model(dtype)
    twin = copy.deepcopy(model)
    kw = KWARGS[cls]
    opt8 = getattr(mixprec.optim, cls)(model.parameters(), **kw)
    opt32 = getattr(mixprec.optim, cls.replace("8bit", ""))(twin.parameters(), **kw)
    for step in range(3):
        _grads(model, step)
        _grads(twin, step)
        # the 32-bit twin starts each step from the 8-bit state read back
        opt8.step() if step == 0 else None
        if step == 0:
            opt32.step()
            opt32.load_state_dict(opt8.state_dict())
            with torch.no_grad():
                for p, q in zip(twin.parameters(), model.parameters()):
                    p.copy_(q)
            continue
        opt8.step()
        opt32.step()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p, q)
        first = opt8._MOMENTS8[0][0]
        for (p, q) in zip(model.parameters(), twin.parameters()):
            s8, s32 = opt8.state[p], opt32.state[q]
            if s8[first].dtype != torch.uint8:
                assert torch.equal(s8[first], s32[first])
                continue
            for name, absname, table in opt8._MOMENTS8:
                codes, absmax = q8.quantize(s32[name], table)
                assert torch.equal(s8[name], codes) and torch.equal(s8[absname], absmax)
                s32[name].copy_(q8.dequantize(codes, absmax, table))  # the twin reads back too
            if "master_param" in s8:
                assert torch.equal(s8["master_param"], s32["master_param"])


def test_small_params_keep_32bit_moments_and_big_ones_8bit():
    model = _model(torch.bfloat16)
    opt = mixprec.optim.AdamW8bit(model.parameters(), min_8bit_size=1000)
    _grads(model, 0)
    opt.step()
    kinds = {tuple(p.shape): opt.state[p]["exp_avg"].dtype for p in model.parameters()}
    assert kinds == {(96, 64): torch.uint8, (96,): torch.float32, (10, 96): torch.float32,
                     (10,): torch.float32}


def test_inf_grads_skip_the_step_and_leave_the_codes():
    model = _model(torch.float16)
    opt = mixprec.optim.AdamW8bit(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu", init_scale=4.0)
    for step in range(2):
        scaler.scale(torch.ones(()))
        _grads(model, step)
        if step == 1:
            model[0].weight.grad[0, 0] = float("inf")
            before = {k: v.clone() for k, v in opt.state[model[0].weight].items()
                      if torch.is_tensor(v)}
            params = [p.clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
    after = opt.state[model[0].weight]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert scaler.get_scale() == 2.0


def test_8bit_trains_like_32bit():
    """A small classification task, 3 seeds: the 8-bit final loss within the 32-bit seeds'
    spread (the accuracy study on the digits and a tiny LM is in benchmarks/README.md)."""
    finals = {8: [], 32: []}
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        x = torch.randn(256, 64, generator=g)
        y = (x[:, :10].argmax(1))
        for bits in (8, 32):
            torch.manual_seed(seed)
            model = _model(torch.bfloat16)
            opt = mixprec.optim.AdamW(model.parameters(), lr=3e-3, state_bits=bits,
                                      min_8bit_size=1000)
            for _ in range(150):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x.bfloat16()).float(), y)
                loss.backward()
                opt.step()
            finals[bits].append(float(loss.detach()))
    lo, hi = min(finals[32]), max(finals[32])
    spread = max(hi - lo, 0.1 * hi)
    assert all(lo - spread <= f <= hi + spread for f in finals[8]), finals


# ------------------------------------------------------------------------ checkpoints


def _trained(bits: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = _model(torch.bfloat16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2, state_bits=bits)
    for step in range(2):
        _grads(model, step)
        opt.step()
    return model, opt


def test_8bit_state_dict_round_trip_weights_only():
    model, opt = _trained(8)
    sd = saved_and_loaded(opt.state_dict())
    st = sd["state"][0]
    assert st["quant"] == "dynamic8/rows/b256" and st["exp_avg"].dtype == torch.uint8
    fresh = mixprec.optim.AdamW8bit(model.parameters(), lr=1e-2)
    fresh.load_state_dict(sd)
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert torch.equal(v, fresh.state[p][k]) if torch.is_tensor(v) else v == \
                fresh.state[p][k]


def test_32bit_checkpoints_load_into_8bit_and_back():
    model, opt32 = _trained(32)
    opt8 = mixprec.optim.AdamW8bit(model.parameters())
    opt8.load_state_dict(saved_and_loaded(opt32.state_dict()))
    w = model[0].weight
    codes, absmax = q8.quantize(opt32.state[w]["exp_avg"], q8.SIGNED)
    assert torch.equal(opt8.state[w]["exp_avg"], codes)
    assert torch.equal(opt8.state[w]["exp_avg_absmax"], absmax)
    back = mixprec.optim.AdamW(model.parameters())
    back.load_state_dict(saved_and_loaded(opt8.state_dict()))
    assert back.state[w]["exp_avg"].dtype == torch.float32
    assert set(back.state[w]) == {"step", "exp_avg", "exp_avg_sq", "master_param"}
    assert torch.equal(back.state[w]["exp_avg"], q8.dequantize(codes, absmax, q8.SIGNED))
    # torch.optim.AdamW's state (float32 params) loads too
    m32 = _model(torch.float32)
    t = torch.optim.AdamW(m32.parameters())
    _grads(m32, 0)
    t.step()
    o = mixprec.optim.AdamW8bit(m32.parameters())
    o.load_state_dict(saved_and_loaded(t.state_dict()))
    assert o.state[m32[0].weight]["exp_avg"].dtype == torch.uint8


@pytest.mark.parametrize("corrupt,match", [
    (lambda st: st.__setitem__("exp_avg", st["exp_avg"][:10]), r"\['exp_avg'\]: expected uint8"),
    (lambda st: st.__setitem__("exp_avg_sq_absmax", st["exp_avg_sq_absmax"][:-1]),
     r"\['exp_avg_sq_absmax'\]: expected float32 of shape \[96, 1\]"),
    (lambda st: st.__setitem__("quant", "dynamic4/b64"), "unknown 8-bit layout 'dynamic4/b64'"),
])
def test_corrupted_8bit_checkpoint_is_refused_and_nothing_changes(corrupt, match):
    model, opt = _trained(8)
    sd = saved_and_loaded(opt.state_dict())
    corrupt(sd["state"][0])
    before = {k: v.clone() for k, v in opt.state[model[0].weight].items() if torch.is_tensor(v)}
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    assert all(torch.equal(v, opt.state[model[0].weight][k]) for k, v in before.items())


# ------------------------------------------------------------------------ memory, bad input


@pytest.mark.parametrize("masters,expected", [(True, 6.03), (False, 2.03)])
def test_state_bytes_per_param_at_gpt2_small(masters, expected):
    """Optimizer state bytes per param, measured from the state tensors of a GPT-2-small-
    shaped bf16 model: 4 (master) + 2 x (1 + 4/256) = 6.03, without masters 2.03 (plus the
    small tensors' float32 moments and 4-byte step counts)."""
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16))
              for s in gpt2_small_shapes()]
    opt = mixprec.optim.AdamW8bit(params, master_weights=masters,
                                  stochastic_rounding=not masters)
    group = opt.param_groups[0]
    total = 0
    for p in params:
        for v in opt._init_state(p, group).values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    per_param = total / sum(p.numel() for p in params)
    assert per_param == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("kwargs,match", [
    (dict(state_bits=4), "state_bits must be 8 or 32, got 4"),
    (dict(state_bits=8, amsgrad=True), "amsgrad=True needs state_bits=32"),
    (dict(state_bits=8, min_8bit_size=-1), "min_8bit_size must be an int >= 0"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mixprec.optim.AdamW(_model(torch.float32).parameters(), **kwargs)


def test_amsgrad_with_8bit_state_is_refused_in_any_group():
    """A group added later, or loaded, cannot bring amsgrad=True to 8-bit state (no step
    keeps a max_exp_avg_sq in 8 bits): refused, the optimizer unchanged."""
    from _unchanged import refused_unchanged

    model = _model(torch.float32)
    opt = mixprec.optim.AdamW([model[0].weight], state_bits=8, min_8bit_size=0)
    opt.step()  # (no grads: nothing moves, the state is still checked below)
    extra = {"params": [model[2].weight], "amsgrad": True}
    msg = refused_unchanged(opt, lambda: opt.add_param_group(extra), ValueError)
    assert "param_groups[1]: amsgrad=True needs state_bits=32" in msg
    saved = opt.state_dict()
    saved["param_groups"][0]["amsgrad"] = True
    msg = refused_unchanged(opt, lambda: opt.load_state_dict(saved), ValueError)
    assert "param_groups[0]: amsgrad=True needs state_bits=32" in msg


def test_manual_mode_swaps_in_an_8bit_optimizer():
    from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer

    model = _model(torch.float32)
    trainer = MixedPrecisionTrainer(
        MixedPrecisionConfig(mode="manual", precision_level="bf16", optimizer_state_bits=8),
        device="cpu")
    trainer.setup_training(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                           torch.nn.functional.cross_entropy)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    trainer.train_step(x, y)
    state = trainer.optimizer.state[model[0].weight]
    assert state["exp_avg"].dtype == torch.uint8 and state["master_param"].dtype == torch.float32
    assert trainer.optimizer.state[model[0].bias]["exp_avg"].dtype == torch.float32


def test_config_state_bits_is_checked_by_name():
    from mixprec import MixedPrecisionConfig

    with pytest.raises(ValueError, match="optimizer_state_bits: expected 8 or 32, got 16"):
        MixedPrecisionConfig(optimizer_state_bits=16)


# ---------------------------------------------------------------------------
# 8-bit state of the previous layout ("dynamic8/b256": blocks over the flattened tensor),
# saved by the mixprec that had it (tests/data/make_8bit_flat_checkpoint.py wrote the file).

def _flat_checkpoint() -> dict:
    return load_stored("optim8_flat_layout.pt")


def _fixture_model() -> nn.Module:
    m = nn.Module()
    m.square = nn.Parameter(torch.zeros(8, 512))
    m.narrow = nn.Parameter(torch.zeros(120, 48))
    m.wide = nn.Parameter(torch.zeros(48, 120))
    m.flat = nn.Parameter(torch.zeros(1000))
    return m


@pytest.mark.parametrize("name,make", [
    ("adamw", lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=256)),
    ("sgd", lambda ps: mixprec.optim.SGD8bit(ps, lr=1e-1, momentum=0.9, min_8bit_size=256)),
])
def test_a_checkpoint_of_the_previous_8bit_layout_loads(name, make):
    """Rows a multiple of 256 long: the same codes and maxima (reshaped). Rows of 48 and
    120: requantized from the values the old release read back, within the 8-bit bound,
    with a warning. The 1-D param: float32 moments now, equal to the old read-back."""
    saved = _flat_checkpoint()
    assert saved["quant"] == _state8.FLAT_QUANT
    ck = saved[name]
    m = _fixture_model()
    m.load_state_dict(ck["model"])
    opt = make(m.parameters())
    with pytest.warns(UserWarning, match="requantized from its decoded values"):
        opt.load_state_dict(ck["optim"])
    moments = [("exp_avg", q8.SIGNED), ("exp_avg_sq", q8.UNSIGNED)] if name == "adamw" \
        else [("momentum_buffer", q8.SIGNED)]
    for i, (pname, p) in enumerate(m.named_parameters()):
        st, old, want = opt.state[p], ck["optim"]["state"][i], ck["decoded"][i]
        for mom, table in moments:
            if pname == "flat":
                assert st[mom].dtype == torch.float32 and "quant" not in st
                assert_bitwise_equal(st[mom], want[mom], f"{name} {pname} {mom}")
                continue
            assert st["quant"] == _state8.QUANT and st[mom].dtype == torch.uint8
            assert st[mom + "_absmax"].shape == q8.absmax_shape(p.shape)
            got = q8.dequantize(st[mom], st[mom + "_absmax"], table)
            if pname == "square":  # the old blocks are the new: nothing requantized
                assert torch.equal(st[mom], old[mom])
                assert torch.equal(st[mom + "_absmax"].reshape(-1), old[mom + "_absmax"])
                assert_bitwise_equal(got, want[mom], f"{name} {pname} {mom}")
            else:
                assert bool(((got - want[mom]).abs() <= q8.error_bound(want[mom], table)).all())
    # and it trains on
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(bool(torch.isfinite(p).all()) for p in m.parameters())


def test_a_checkpoint_of_the_previous_8bit_layout_reads_back_exactly_into_32bit_state():
    ck = _flat_checkpoint()["adamw"]
    m = _fixture_model()
    opt = mixprec.optim.AdamW(m.parameters(), lr=1e-2)
    opt.load_state_dict(ck["optim"])
    for i, p in enumerate(m.parameters()):
        for mom in ("exp_avg", "exp_avg_sq"):
            assert_bitwise_equal(opt.state[p][mom], ck["decoded"][i][mom], f"{i} {mom}")
