"""torch.library.opcheck on every op, and the ops inside torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

import mixprec
from _helpers import assert_bitwise_equal
from mixprec.ops import _reference

if not mixprec.has_extension():
    pytest.skip("opcheck needs the compiled extension", allow_module_level=True)

from mixprec import _C  # noqa: E402


def _grads(device):
    gs = [torch.randn(n, device=device) * 10 for n in (1, 37, 5000)]
    return gs + [torch.randn(300, device=device).half(), torch.randn(9, device=device).bfloat16()]


def _f(device):
    return torch.zeros((), device=device)


def _inv(device):
    return torch.full((), 0.25, device=device)


def _i32(device, v):
    return torch.full((), v, dtype=torch.int32, device=device)


def _optim_lists(device, n_states, masters):
    """params (bf16, fp16, fp32), grads, n_states float32 state lists, masters, steps."""
    shapes = (7, (3, 5), 1)
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    params = [torch.randn(s, device=device).to(dt) for s, dt in zip(shapes, dtypes)]
    grads = [torch.randn(s, device=device).half() for s in shapes]
    states = [[torch.rand(s, device=device) for s in shapes] for _ in range(n_states)]
    master = ([p.float() if p.dtype != torch.float32 else None for p in params]
              if masters else [])
    if masters:  # one master per 16-bit param: drop the float32 one (and its state rows)
        keep = [i for i, m in enumerate(master) if m is not None]
        params, grads = [params[i] for i in keep], [grads[i] for i in keep]
        states = [[st[i] for i in keep] for st in states]
        master = [master[i] for i in keep]
    steps = [torch.full((), 3.0, device=device) for _ in params]
    return params, grads, states, master, steps


def _adam(device):
    params, grads, (m, v, vmax), masters, steps = _optim_lists(device, 3, True)
    return ((params, grads, m, v, vmax, masters, steps, torch.tensor(1e-3, device=device),
             0.9, 0.999, 0.01, 1e-8, True, False, True, torch.full((1,), 2.0, device=device),
             torch.zeros(1, device=device), None, False, 0), {})


def _sgd(device):
    params, grads, (buf,), _, steps = _optim_lists(device, 1, False)
    params = [p.to(torch.bfloat16) for p in params]
    return ((params, grads, buf, [], steps, torch.tensor(0.1, device=device), 0.0, 0.9, 0.0,
             True, False, None, None, None),
            {"stochastic_rounding": True, "seed": 7})


def _codes8(device, params, table):
    from mixprec.ops import _quant8 as q8

    pairs = [q8.quantize(torch.randn(p.shape, device=device), table) for p in params]
    return [c for c, _ in pairs], [a for _, a in pairs]


def _adam8(device):
    from mixprec.ops import _quant8 as q8

    params, grads, _, masters, steps = _optim_lists(device, 0, True)
    params = [torch.randn(600, device=device).half()] + params  # more than one block
    grads = [torch.randn(600, device=device).bfloat16()] + grads
    masters = [params[0].float()] + masters
    steps = [torch.full((), 1.0, device=device)] + steps
    m, ma = _codes8(device, params, q8.SIGNED)
    v, va = _codes8(device, params, q8.UNSIGNED)
    return ((params, grads, m, ma, v, va, masters, steps, torch.tensor(1e-3, device=device),
             0.9, 0.999, 0.01, 1e-8, False, True, torch.full((1,), 2.0, device=device),
             torch.zeros(1, device=device), torch.full((), 0.5, device=device), False, 0), {})


def _sgd8(device):
    from mixprec.ops import _quant8 as q8

    params, grads, _, _, steps = _optim_lists(device, 0, False)
    params = [p.to(torch.bfloat16) for p in params]
    b, ba = _codes8(device, params, q8.SIGNED)
    return ((params, grads, b, ba, [], steps, torch.tensor(0.1, device=device), 0.0, 0.9, 0.0,
             True, False, None, None, None),
            {"stochastic_rounding": True, "seed": 7})


# (test id, op, args builder(device) -> (args, kwargs)). One entry per case: each
# gets its own test id, and none can be left out of the parametrization. The first
# entry of each op is also its sample in tests/test_dispatch_paths.py.
SAMPLES = [
    ("unscale_and_check_", "unscale_and_check_",
     lambda d: ((_grads(d), _f(d), _inv(d)), {})),
    ("unscale_and_check_-empty", "unscale_and_check_", lambda d: (([], _f(d), _inv(d)), {})),
    ("check_finite_", "check_finite_", lambda d: ((_grads(d), _f(d)), {})),
    ("unscale_and_norm_-p2", "unscale_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 2.0), {})),
    ("unscale_and_norm_-pinf", "unscale_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), float("inf")), {})),
    ("check_finite_and_norm_-p2", "check_finite_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 2.0), {})),
    ("check_finite_and_norm_-p1.5", "check_finite_and_norm_",
     lambda d: ((_grads(d), _f(d), _inv(d), 1.5), {})),
    ("update_scale_", "update_scale_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), torch.ones((), device=d), 2.0, 0.5,
                 2), {})),
    ("update_scale_ext_", "update_scale_ext_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), _i32(d, 2),
                 torch.ones((), device=d), 2.0, 0.5, 2),
                {"min_scale": 1.0, "max_scale": 1024.0, "hysteresis": 2})),
    ("fused_adam_-masters-amsgrad", "fused_adam_", _adam),
    ("fused_sgd_-nesterov-sr", "fused_sgd_", _sgd),
    ("fused_adam8_-masters-clip", "fused_adam8_", _adam8),
    ("fused_sgd8_-nesterov-sr", "fused_sgd8_", _sgd8),
]


def sample(op):
    """The first sample of `op`: a builder(device) -> (args, kwargs)."""
    for _, name, build in SAMPLES:
        if name == op:
            return build
    pytest.fail(f"{op} has no sample in tests/test_opcheck.py SAMPLES")


@pytest.mark.parametrize(("op_name", "build"), [pytest.param(op, build, id=name)
                                                for name, op, build in SAMPLES])
def test_opcheck(device, op_name, build):
    args, kwargs = build(device)
    torch.library.opcheck(getattr(torch.ops.mixprec, op_name).default, args, kwargs)


def test_every_op_has_an_opcheck_sample():
    """Every op of the table (csrc/common/op_table.h, exported as _C.op_names) needs a sample."""
    sampled = {op for _, op, _ in SAMPLES}
    assert set(_C.op_names) == sampled, (
        f"without an opcheck sample: {sorted(set(_C.op_names) - sampled)}; "
        f"sampled but not in the op table: {sorted(sampled - set(_C.op_names))}")


def test_op_table_is_every_registered_op_with_every_entry():
    """The one list of the ops: what is registered, wrapped and given kernels."""
    table = list(_C.op_names)
    assert table and len(set(table)) == len(table)
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("mixprec::")}
    assert registered == set(table)
    assert set(mixprec.ops.__all__) == set(table)
    keys = ["CPU", "Autograd"] + (["CUDA"] if _C.cuda_kernels else [])
    for op in table:
        assert callable(getattr(_C, f"fast_{op}")), op
        assert callable(getattr(_reference, op)), op
        for key in keys:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mixprec::{op}", key), (op, key)


def test_torch_compile_fullgraph(device):
    """A whole scaler step (unscale+check, norm, update) compiled as one graph."""

    def step(grads, found_inf, scale, tracker):
        found_inf.zero_()
        inv = scale.double().reciprocal().float()
        norm = torch.ops.mixprec.unscale_and_norm_(grads, found_inf, inv, 2.0)
        torch.ops.mixprec.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 1)
        return norm * 1.0

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    grads = [torch.randn(1000, device=device) * 64, torch.randn(33, device=device) * 64]
    ref_grads = [g.clone() for g in grads]
    state = (torch.zeros((), device=device), torch.full((), 64.0, device=device),
             torch.zeros((), dtype=torch.int32, device=device))
    ref_state = tuple(t.clone() for t in state)
    out = compiled(grads, *state)
    expected = step(ref_grads, *ref_state)
    assert_bitwise_equal(out, expected)
    for a, b in zip(grads + list(state), ref_grads + list(ref_state)):
        assert_bitwise_equal(a, b)
    assert state[1].item() == 128.0  # clean step with interval 1 grew the scale

    grads[0][5] = float("inf")
    compiled(grads, *state)
    assert state[0].item() == 1.0 and state[1].item() == 64.0


def test_torch_compile_check_finite(device):
    @torch.compile(fullgraph=True)
    def has_nonfinite(tensors, found_inf):
        torch.ops.mixprec.check_finite_(tensors, found_inf)
        return found_inf + 0

    found = torch.zeros((), device=device)
    ts = [torch.randn(10, device=device), torch.randn(5, device=device)]
    assert has_nonfinite(ts, found).item() == 0.0
    ts[1][4] = float("nan")
    assert has_nonfinite(ts, found).item() == 1.0
