"""The table-driven tests' calls of every op, in one place: adding an op adds its rows
here and nowhere else among the tests that cover every op.

* :data:`SAMPLES`: valid calls, ``(test id, op, builder(device) -> (args, kwargs))``.
  ``tests/ops/test_opcheck.py`` runs ``torch.library.opcheck`` on each, and the first sample of
  an op drives ``tests/ops/test_dispatch_paths.py``. An op of the table without a sample fails
  ``test_every_op_has_an_opcheck_sample``.
* :data:`CASES`: bad calls, ``(test id, builder(device) -> (op, args), substring)``: the
  error must name the argument (the substring) and nothing may be modified
  (``tests/ops/test_bad_inputs.py``, against the kernels and the reference). An op without a
  case fails ``test_every_op_has_a_bad_input_case``.

Every builder makes fresh tensors on each call.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from _helpers import HAS_CUDA


def _grads(device):
    return [torch.randn(100, device=device) * 5, torch.randn(70_000, device=device).half()]


def _unscale(device, grads=None, found=None, inv=None):
    grads = _grads(device) if grads is None else grads
    found = torch.zeros((), device=device) if found is None else found
    inv = torch.full((), 0.5, device=device) if inv is None else inv
    return "unscale_and_check_", (grads, found, inv)


def _norm(device, **kw):
    name, args = _unscale(device, **{k: v for k, v in kw.items() if k != "norm_type"})
    return "unscale_and_norm_", (*args, kw.get("norm_type", 2.0))


def _check_norm(device, **kw):
    name, args = _unscale(device, **{k: v for k, v in kw.items() if k != "norm_type"})
    return "check_finite_and_norm_", (*args, kw.get("norm_type", 2.0))


def _check(device, tensors=None, found=None):
    tensors = _grads(device) if tensors is None else tensors
    found = torch.zeros((), device=device) if found is None else found
    return "check_finite_", (tensors, found)


def _update(device, scale=None, tracker=None, found=None, interval=2):
    scale = torch.full((), 4.0, device=device) if scale is None else scale
    tracker = torch.zeros((), dtype=torch.int32, device=device) if tracker is None else tracker
    found = torch.zeros((), device=device) if found is None else found
    return "update_scale_", (scale, tracker, found, 2.0, 0.5, interval)


def _update_stats(device, counts=None, prev=None, ext=False):
    """update_scale_ (or, with ``ext``, update_scale_ext_) with statistics ``counts`` and
    ``prev`` (the string "default": a valid one)."""
    counts = torch.zeros(5, dtype=torch.int64, device=device) if counts == "default" else counts
    prev = torch.full((), 4.0, device=device) if prev == "default" else prev
    name, args = _update_ext(device) if ext else _update(device)
    return name, (*args, counts, prev)


def _update_ext(device, growth=2.0, backoff=0.5, hyst_t=None, hysteresis=1, min_scale=None,
                max_scale=None, interval=2):
    scale = torch.full((), 4.0, device=device)
    tracker = torch.zeros((), dtype=torch.int32, device=device)
    hyst_t = torch.ones((), dtype=torch.int32, device=device) if hyst_t is None else hyst_t
    found = torch.ones((), device=device)
    return "update_scale_ext_", (scale, tracker, hyst_t, found, growth, backoff, interval,
                                 min_scale, max_scale, hysteresis)


def _adam(device, **changes):
    shapes = (100, (3, 4))
    params = [torch.randn(s, device=device) for s in shapes]
    d = {"params": params, "grads": [torch.randn_like(p) for p in params],
         "exp_avgs": [torch.zeros_like(p) for p in params],
         "exp_avg_sqs": [torch.zeros_like(p) for p in params], "max_exp_avg_sqs": [],
         "master_params": [], "state_steps": [torch.zeros((), device=device) for _ in params],
         "lr": torch.tensor(1e-3, device=device), "beta1": 0.9, "beta2": 0.999,
         "weight_decay": 0.0, "eps": 1e-8, "amsgrad": False, "maximize": False,
         "decoupled_weight_decay": True, "grad_scale": None, "found_inf": None,
         "clip_coef": None, "stochastic_rounding": False, "seed": 0}
    d.update({k: v(d) if callable(v) else v for k, v in changes.items()})
    return "fused_adam_", tuple(d.values())


def _sgd(device, **changes):
    params = [torch.randn(50, device=device), torch.randn(2, 3, device=device)]
    d = {"params": params, "grads": [torch.randn_like(p) for p in params],
         "momentum_buffers": [torch.zeros_like(p) for p in params], "master_params": [],
         "state_steps": [torch.zeros((), device=device) for _ in params],
         "lr": torch.tensor(0.1, device=device), "weight_decay": 0.0, "momentum": 0.9,
         "dampening": 0.0, "nesterov": False, "maximize": False, "grad_scale": None,
         "found_inf": None, "clip_coef": None, "stochastic_rounding": False, "seed": 0}
    d.update({k: v(d) if callable(v) else v for k, v in changes.items()})
    return "fused_sgd_", tuple(d.values())


def _q8(device, params, table):
    from mixprec.optim import _quant8 as q8

    pairs = [q8.quantize(torch.randn(p.shape, device=device), table) for p in params]
    return [c for c, _ in pairs], [a for _, a in pairs]


def _adam8(device, **changes):
    from mixprec.optim import _quant8 as q8

    params = [torch.randn(600, device=device).half(), torch.randn(3, 4, device=device).half()]
    m, ma = _q8(device, params, q8.SIGNED)
    v, va = _q8(device, params, q8.UNSIGNED)
    d = {"params": params, "grads": [torch.randn_like(p) for p in params],
         "exp_avgs": m, "exp_avg_absmax": ma, "exp_avg_sqs": v, "exp_avg_sq_absmax": va,
         "master_params": [p.float() for p in params],
         "state_steps": [torch.zeros((), device=device) for _ in params],
         "lr": torch.tensor(1e-3, device=device), "beta1": 0.9, "beta2": 0.999,
         "weight_decay": 0.0, "eps": 1e-8, "maximize": False,
         "decoupled_weight_decay": True, "grad_scale": None, "found_inf": None,
         "clip_coef": None, "stochastic_rounding": False, "seed": 0}
    d.update({k: v(d) if callable(v) else v for k, v in changes.items()})
    return "fused_adam8_", tuple(d.values())


def _sgd8(device, **changes):
    from mixprec.optim import _quant8 as q8

    params = [torch.randn(300, device=device), torch.randn(2, 3, device=device)]
    b, ba = _q8(device, params, q8.SIGNED)
    d = {"params": params, "grads": [torch.randn_like(p) for p in params],
         "momentum_buffers": b, "momentum_absmax": ba, "master_params": [],
         "state_steps": [torch.ones((), device=device) for _ in params],
         "lr": torch.tensor(0.1, device=device), "weight_decay": 0.0, "momentum": 0.9,
         "dampening": 0.0, "nesterov": False, "maximize": False, "grad_scale": None,
         "found_inf": None, "clip_coef": None, "stochastic_rounding": False, "seed": 0}
    d.update({k: v(d) if callable(v) else v for k, v in changes.items()})
    return "fused_sgd8_", tuple(d.values())


# (id, builder(device) -> (op name, args), substring the message must contain)
CASES: list[tuple[str, Callable, str]] = [
    ("found_inf_dtype", lambda d: _unscale(d, found=torch.zeros((), dtype=torch.float64,
                                                                device=d)), "found_inf"),
    ("found_inf_shape", lambda d: _unscale(d, found=torch.zeros(2, device=d)), "found_inf"),
    ("inv_scale_dtype", lambda d: _unscale(d, inv=torch.full((), 0.5, dtype=torch.float16,
                                                             device=d)), "inv_scale"),
    ("inv_scale_shape", lambda d: _unscale(d, inv=torch.full((3,), 0.5, device=d)), "inv_scale"),
    ("integer_grad", lambda d: _unscale(d, grads=_grads(d) + [torch.ones(4, dtype=torch.int32,
                                                                         device=d)]), "grads[2]"),
    ("sparse_grad", lambda d: _unscale(d, grads=[torch.randn(4, device=d),
                                                 torch.eye(3, device=d).to_sparse()]), "grads[1]"),
    ("expanded_grad", lambda d: _unscale(d, grads=[torch.randn(1, 5, device=d).expand(4, 5)]),
     "grads[0]"),
    ("norm_found_inf_dtype", lambda d: _norm(d, found=torch.zeros((), dtype=torch.int32,
                                                                   device=d)), "found_inf"),
    ("norm_integer_grad", lambda d: _norm(d, grads=[torch.ones(4, dtype=torch.int64, device=d)]),
     "grads[0]"),
    ("norm_type_zero", lambda d: _norm(d, norm_type=0.0), "norm_type"),
    ("norm_type_negative", lambda d: _norm(d, norm_type=-2.0), "norm_type"),
    ("cnorm_found_inf_shape", lambda d: _check_norm(d, found=torch.zeros(2, device=d)),
     "found_inf"),
    ("cnorm_inv_scale_dtype", lambda d: _check_norm(d, inv=torch.full((), 0.5, dtype=torch.float64,
                                                                      device=d)), "inv_scale"),
    ("cnorm_integer_grad", lambda d: _check_norm(d, grads=_grads(d) + [
        torch.ones(4, dtype=torch.int32, device=d)]), "grads[2]"),
    ("cnorm_sparse_grad", lambda d: _check_norm(d, grads=[torch.eye(3, device=d).to_sparse()]),
     "grads[0]"),
    ("cnorm_type_zero", lambda d: _check_norm(d, norm_type=0.0), "norm_type"),
    ("check_integer", lambda d: _check(d, tensors=[torch.ones(3, dtype=torch.int8, device=d)]),
     "tensors[0]"),
    ("check_found_inf_shape", lambda d: _check(d, found=torch.zeros(1, 1, 2, device=d)),
     "found_inf"),
    ("scale_dtype", lambda d: _update(d, scale=torch.full((), 4.0, dtype=torch.float64,
                                                          device=d)), "scale"),
    ("tracker_dtype", lambda d: _update(d, tracker=torch.zeros((), device=d)), "growth_tracker"),
    ("update_found_inf_shape", lambda d: _update(d, found=torch.zeros(3, device=d)), "found_inf"),
    ("growth_interval_zero", lambda d: _update(d, interval=0), "growth_interval"),
    ("stats_counts_alone", lambda d: _update_stats(d, counts="default"), "prev_scale"),
    ("stats_prev_scale_alone", lambda d: _update_stats(d, prev="default"), "counts"),
    ("stats_counts_dtype",
     lambda d: _update_stats(d, counts=torch.zeros(5, dtype=torch.int32, device=d),
                             prev="default"), "counts"),
    ("stats_counts_shape",
     lambda d: _update_stats(d, counts=torch.zeros(4, dtype=torch.int64, device=d),
                             prev="default"), "counts"),
    ("stats_counts_strided",
     lambda d: _update_stats(d, counts=torch.zeros(10, dtype=torch.int64, device=d)[::2],
                             prev="default"), "counts"),
    ("stats_prev_scale_dtype",
     lambda d: _update_stats(d, counts="default",
                             prev=torch.full((), 4.0, dtype=torch.float64, device=d)),
     "prev_scale"),
    ("ext_stats_prev_scale_shape",
     lambda d: _update_stats(d, counts="default", prev=torch.ones(2, device=d), ext=True),
     "prev_scale"),
    ("ext_growth_factor_one", lambda d: _update_ext(d, growth=1.0), "growth_factor"),
    ("ext_growth_factor_small", lambda d: _update_ext(d, growth=0.5), "growth_factor"),
    ("ext_backoff_zero", lambda d: _update_ext(d, backoff=0.0), "backoff_factor"),
    ("ext_backoff_one", lambda d: _update_ext(d, backoff=1.0), "backoff_factor"),
    ("ext_backoff_big", lambda d: _update_ext(d, backoff=2.0), "backoff_factor"),
    ("ext_hysteresis_zero", lambda d: _update_ext(d, hysteresis=0), "hysteresis"),
    ("ext_hysteresis_tensor_dtype", lambda d: _update_ext(d, hyst_t=torch.ones((), device=d)),
     "hysteresis_left"),
    ("ext_min_scale_negative", lambda d: _update_ext(d, min_scale=-1.0), "min_scale"),
    ("ext_max_scale_inf", lambda d: _update_ext(d, max_scale=float("inf")), "max_scale"),
    ("ext_min_above_max", lambda d: _update_ext(d, min_scale=8.0, max_scale=2.0), "min_scale"),
    ("adam_beta1_one", lambda d: _adam(d, beta1=1.0), "beta1"),
    ("adam_exp_avgs_short", lambda d: _adam(d, exp_avgs=lambda a: a["exp_avgs"][:1]),
     "exp_avgs"),
    ("adam_lr_shape", lambda d: _adam(d, lr=torch.ones(2, device=d)), "lr"),
    ("adam_grad_shape", lambda d: _adam(d, grads=lambda a: [a["grads"][0],
                                                            a["grads"][1].reshape(-1)]),
     "grads[1]"),
    ("sgd_nesterov_without_momentum", lambda d: _sgd(d, nesterov=True, momentum=0.0,
                                                     momentum_buffers=[]), "nesterov"),
    ("sgd_buffers_short", lambda d: _sgd(d, momentum_buffers=lambda a:
                                         a["momentum_buffers"][:1]), "momentum_buffers"),
    ("sgd_step_dtype", lambda d: _sgd(d, state_steps=lambda a: [a["state_steps"][0].long(),
                                                                a["state_steps"][1]]),
     "state_steps[0]"),
    ("adam8_codes_float", lambda d: _adam8(d, exp_avgs=lambda a: [
        a["exp_avgs"][0].float(), a["exp_avgs"][1]]), "exp_avgs[0]"),
    ("adam8_codes_strided", lambda d: _adam8(d, exp_avg_sqs=lambda a: [
        a["exp_avg_sqs"][0], a["exp_avg_sqs"][1].t().contiguous().t()]), "exp_avg_sqs[1]"),
    ("adam8_codes_shape", lambda d: _adam8(d, exp_avgs=lambda a: [
        a["exp_avgs"][0][:599], a["exp_avgs"][1]]), "exp_avgs[0]"),
    ("adam8_absmax_short", lambda d: _adam8(d, exp_avg_absmax=lambda a: [
        a["exp_avg_absmax"][0][:2], a["exp_avg_absmax"][1]]), "exp_avg_absmax[0]"),
    ("adam8_absmax_dtype", lambda d: _adam8(d, exp_avg_sq_absmax=lambda a: [
        a["exp_avg_sq_absmax"][0].half(), a["exp_avg_sq_absmax"][1]]), "exp_avg_sq_absmax[0]"),
    ("adam8_absmax_list_short", lambda d: _adam8(d, exp_avg_absmax=lambda a:
                                                 a["exp_avg_absmax"][:1]), "exp_avg_absmax"),
    ("adam8_beta2_one", lambda d: _adam8(d, beta2=1.0), "beta2"),
    ("sgd8_no_momentum", lambda d: _sgd8(d, momentum=0.0), "momentum"),
    ("sgd8_absmax_2d", lambda d: _sgd8(d, momentum_absmax=lambda a: [
        a["momentum_absmax"][0].view(1, -1), a["momentum_absmax"][1]]), "momentum_absmax[0]"),
    ("sgd8_buffer_float", lambda d: _sgd8(d, momentum_buffers=lambda a: [
        a["momentum_buffers"][0], a["momentum_buffers"][1].float()]), "momentum_buffers[1]"),
]

if HAS_CUDA:
    CASES += [
        ("grads_other_device", lambda d: _unscale(d, grads=[torch.randn(5, device=d),
                                                            torch.randn(5)]), "grads[1]"),
        ("found_inf_on_cpu", lambda d: _unscale(d, found=torch.zeros(())), "found_inf"),
        ("cnorm_grads_other_device", lambda d: _check_norm(d, grads=[torch.randn(5, device=d),
                                                                     torch.randn(5)]),
         "grads[1]"),
        ("inv_scale_on_cpu", lambda d: _unscale(d, inv=torch.full((), 0.5)), "inv_scale"),
        ("tracker_on_cpu", lambda d: _update(d, tracker=torch.zeros((), dtype=torch.int32)),
         "growth_tracker"),
    ]


# --- valid calls (opcheck samples) ----------------------------------------------------

def _sample_grads(device):
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


def _sample_adam(device):
    params, grads, (m, v, vmax), masters, steps = _optim_lists(device, 3, True)
    return ((params, grads, m, v, vmax, masters, steps, torch.tensor(1e-3, device=device),
             0.9, 0.999, 0.01, 1e-8, True, False, True, torch.full((1,), 2.0, device=device),
             torch.zeros(1, device=device), None, False, 0), {})


def _sample_sgd(device):
    params, grads, (buf,), _, steps = _optim_lists(device, 1, False)
    params = [p.to(torch.bfloat16) for p in params]
    return ((params, grads, buf, [], steps, torch.tensor(0.1, device=device), 0.0, 0.9, 0.0,
             True, False, None, None, None),
            {"stochastic_rounding": True, "seed": 7})


def _sample_adam8(device):
    from mixprec.optim import _quant8 as q8

    params, grads, _, masters, steps = _optim_lists(device, 0, True)
    params = [torch.randn(600, device=device).half()] + params  # more than one block
    grads = [torch.randn(600, device=device).bfloat16()] + grads
    masters = [params[0].float()] + masters
    steps = [torch.full((), 1.0, device=device)] + steps
    m, ma = _q8(device, params, q8.SIGNED)
    v, va = _q8(device, params, q8.UNSIGNED)
    return ((params, grads, m, ma, v, va, masters, steps, torch.tensor(1e-3, device=device),
             0.9, 0.999, 0.01, 1e-8, False, True, torch.full((1,), 2.0, device=device),
             torch.zeros(1, device=device), torch.full((), 0.5, device=device), False, 0), {})


def _sample_sgd8(device):
    from mixprec.optim import _quant8 as q8

    params, grads, _, _, steps = _optim_lists(device, 0, False)
    params = [p.to(torch.bfloat16) for p in params]
    b, ba = _q8(device, params, q8.SIGNED)
    return ((params, grads, b, ba, [], steps, torch.tensor(0.1, device=device), 0.0, 0.9, 0.0,
             True, False, None, None, None),
            {"stochastic_rounding": True, "seed": 7})


# (test id, op, args builder(device) -> (args, kwargs)). One entry per case: each
# gets its own test id, and none can be left out of the parametrization. The first
# entry of each op is also its sample in tests/ops/test_dispatch_paths.py.
SAMPLES = [
    ("unscale_and_check_", "unscale_and_check_",
     lambda d: ((_sample_grads(d), _f(d), _inv(d)), {})),
    ("unscale_and_check_-empty", "unscale_and_check_", lambda d: (([], _f(d), _inv(d)), {})),
    ("check_finite_", "check_finite_", lambda d: ((_sample_grads(d), _f(d)), {})),
    ("unscale_and_norm_-p2", "unscale_and_norm_",
     lambda d: ((_sample_grads(d), _f(d), _inv(d), 2.0), {})),
    ("unscale_and_norm_-pinf", "unscale_and_norm_",
     lambda d: ((_sample_grads(d), _f(d), _inv(d), float("inf")), {})),
    ("check_finite_and_norm_-p2", "check_finite_and_norm_",
     lambda d: ((_sample_grads(d), _f(d), _inv(d), 2.0), {})),
    ("check_finite_and_norm_-p1.5", "check_finite_and_norm_",
     lambda d: ((_sample_grads(d), _f(d), _inv(d), 1.5), {})),
    ("update_scale_", "update_scale_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), torch.ones((), device=d), 2.0, 0.5,
                 2), {})),
    ("update_scale_ext_", "update_scale_ext_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), _i32(d, 2),
                 torch.ones((), device=d), 2.0, 0.5, 2),
                {"min_scale": 1.0, "max_scale": 1024.0, "hysteresis": 2})),
    ("update_scale_-stats", "update_scale_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), torch.ones((), device=d), 2.0, 0.5,
                 2, torch.tensor([3, 1, 1, 0, 0], device=d), torch.full((), 4.0, device=d)),
                {})),
    ("update_scale_ext_-stats", "update_scale_ext_",
     lambda d: ((torch.full((), 8.0, device=d), _i32(d, 1), _i32(d, 2),
                 torch.zeros((), device=d), 2.0, 0.5, 2),
                {"hysteresis": 2, "counts": torch.tensor([3, 1, 1, 0, 0], device=d),
                 "prev_scale": torch.full((), 4.0, device=d)})),
    ("fused_adam_-masters-amsgrad", "fused_adam_", _sample_adam),
    ("fused_sgd_-nesterov-sr", "fused_sgd_", _sample_sgd),
    ("fused_adam8_-masters-clip", "fused_adam8_", _sample_adam8),
    ("fused_sgd8_-nesterov-sr", "fused_sgd8_", _sample_sgd8),
]


def sample(op):
    """The first sample of `op`: a builder(device) -> (args, kwargs)."""
    for _, name, build in SAMPLES:
        if name == op:
            return build
    pytest.fail(f"{op} has no sample in tests/_op_cases.py SAMPLES")
