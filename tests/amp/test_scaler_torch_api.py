"""GradScaler API, state machine and error paths.

Everything torch's GradScaler also does is parametrized over ``scaler_cls``
(mixprec's and torch's), so these tests are known to describe torch's
behaviour; mixprec-only features are in the other tests/amp/test_scaler_*.py.
"""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import re
import warnings

import pytest
import torch
from torch.amp.grad_scaler import OptState

import mixprec
from _helpers import (
    HAS_CUDA,
    INF,
    SCALERS,
    RecordingOptimizer,
    two_layer,
)

FIX = (
    "This may indicate your script did not use scaler.scale(loss or outputs) "
    "earlier in the iteration."
)


def _backward(model, scaler, device, inf=False):
    x = torch.randn(4, 8, device=device)
    scaler.scale(model(x).pow(2).mean()).backward()
    if inf:
        with torch.no_grad():
            model[0].weight.grad[1, 2] = INF


def _setup(scaler_cls, device, **kw):
    model = two_layer(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = scaler_cls(device, **kw)
    return model, opt, scaler


# ------------------------------------------------------------------ constructor
def test_subclass_and_signature():
    assert issubclass(mixprec.GradScaler, torch.amp.GradScaler)
    ours = inspect.signature(mixprec.GradScaler.__init__).parameters
    theirs = inspect.signature(torch.amp.GradScaler.__init__).parameters
    for name, p in theirs.items():
        assert ours[name].default == p.default
        assert ours[name].kind == p.kind
    assert list(ours)[: len(theirs)] == list(theirs)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_defaults(scaler_cls):
    s = scaler_cls("cpu")
    assert s.is_enabled()
    assert s._device == "cpu"
    assert s._init_scale == 2.0**16
    assert s.get_scale() == 2.0**16  # before the lazy init: the init scale
    assert s.get_growth_factor() == 2.0
    assert s.get_backoff_factor() == 0.5
    assert s.get_growth_interval() == 2000
    assert s._scale is None and s._growth_tracker is None
    assert s._get_growth_tracker() == 0
    assert len(s._per_optimizer_states) == 0


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_factor_checks(scaler_cls):
    with pytest.raises(AssertionError, match=re.escape("The growth factor must be > 1.0.")):
        scaler_cls("cpu", growth_factor=1.0)
    with pytest.raises(AssertionError, match=re.escape("The backoff factor must be < 1.0.")):
        scaler_cls("cpu", backoff_factor=1.0)
    # not checked when disabled
    s = scaler_cls("cpu", growth_factor=0.5, backoff_factor=2.0, enabled=False)
    assert not s.is_enabled()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_cuda_without_cuda_warns_and_disables(scaler_cls):
    if HAS_CUDA:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert scaler_cls("cuda").is_enabled()
        return
    with pytest.warns(UserWarning, match=re.escape(
        "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."
    )):
        s = scaler_cls()  # device defaults to "cuda"
    assert not s.is_enabled()
    assert s.get_scale() == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler_cls(enabled=False)  # no warning when not enabled


# ------------------------------------------------------------------ scale()
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_scale_tensor_and_nested(scaler_cls, device):
    s = scaler_cls(device, init_scale=4.0)
    t = torch.full((2,), 3.0, device=device)
    assert s.scale(t).tolist() == [12.0, 12.0]
    assert s._scale.device == t.device and s._scale.dtype == torch.float32
    assert s._growth_tracker.dtype == torch.int32 and s._growth_tracker.device == t.device
    nested = [t, (t, [t, t]), (t,)]
    out = s.scale(nested)
    assert type(out) is list and type(out[1]) is tuple and type(out[1][1]) is list
    assert type(out[2]) is tuple
    assert out[1][1][0].tolist() == [12.0, 12.0]
    gen = s.scale(x for x in [t, t])
    assert not isinstance(gen, (list, tuple))
    assert [g.tolist() for g in gen] == [[12.0, 12.0]] * 2
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        s.scale([t, 1.0])


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_scale_lazy_init_on_first_tensor_device_list(scaler_cls):
    s = scaler_cls("cpu", init_scale=2.0)
    out = s.scale([torch.ones(2)])
    assert out[0].tolist() == [2.0, 2.0]
    assert s._scale.device.type == "cpu"


# ------------------------------------------------------------------ disabled
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_disabled_is_transparent(scaler_cls):
    model = two_layer("cpu")
    opt = RecordingOptimizer(model.parameters())
    s = scaler_cls("cpu", enabled=False)
    t = torch.randn(3)
    assert s.scale(t) is t
    lst = [t]
    assert s.scale(lst) is lst
    model(torch.randn(2, 8)).sum().backward()
    g = model[0].weight.grad.clone()
    s.unscale_(opt)
    assert torch.equal(model[0].weight.grad, g)

    def closure():
        return 1.0

    assert s.step(opt, closure=closure, extra=1) == "stepped"  # closure allowed when disabled
    assert opt.calls[-1]["closure"] is closure and opt.calls[-1]["kwargs"] == {"extra": 1}
    s.update()
    s.update(4.0)
    assert s.get_scale() == 1.0
    assert s.state_dict() == {}
    s.load_state_dict({})
    assert s._get_growth_tracker() == 0
    assert not s.is_enabled()


# ------------------------------------------------------------------ state machine
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_state_machine_and_stage_values(scaler_cls, device):
    model, opt, s = _setup(scaler_cls, device)
    _backward(model, s, device)
    assert s._per_optimizer_states[id(opt)]["stage"] is OptState.READY
    s.unscale_(opt)
    st = s._per_optimizer_states[id(opt)]
    assert st["stage"] is OptState.UNSCALED
    fi = s._found_inf_per_device(opt)
    assert isinstance(fi, dict) and len(fi) == 1
    (dev, flag), = fi.items()
    assert dev == model[0].weight.grad.device
    assert flag.dtype == torch.float32 and flag.numel() == 1 and flag.item() == 0.0
    with pytest.raises(RuntimeError, match=re.escape(
        "unscale_() has already been called on this optimizer since the last update()."
    )):
        s.unscale_(opt)
    s.step(opt)
    assert s._per_optimizer_states[id(opt)]["stage"] is OptState.STEPPED
    with pytest.raises(RuntimeError, match=re.escape("unscale_() is being called after step().")):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match=re.escape(
        "step() has already been called since the last update()."
    )):
        s.step(opt)
    s.update()
    assert len(s._per_optimizer_states) == 0
    _backward(model, s, device)
    s.step(opt)  # a new iteration starts READY
    s.update()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_calls_before_scale(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    model(torch.randn(2, 8)).sum().backward()
    for name, call in (
        ("unscale_", lambda: s.unscale_(opt)),
        ("step", lambda: s.step(opt)),
        ("update", lambda: s.update()),
    ):
        with pytest.raises(AssertionError, match=re.escape(
            f"Attempted {name} but _scale is None.  " + FIX
        )):
            call()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_update_without_inf_checks(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    s.scale(torch.ones(()))
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update."):
        s.update()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_step_with_no_grads(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    s.scale(torch.ones(()))
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer."):
        s.step(opt)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_closure_rejected(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    _backward(model, s, "cpu")
    with pytest.raises(RuntimeError, match=re.escape(
        "Closure use is not currently supported if GradScaler is enabled."
    )):
        s.step(opt, closure=lambda: None)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_fp16_grads_rejected(scaler_cls):
    p = torch.nn.Parameter(torch.randn(4).half())
    opt = torch.optim.SGD([p], lr=0.1)
    s = scaler_cls("cpu")
    s.scale(torch.ones(()))
    p.grad = torch.randn(4).half()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        s.unscale_(opt)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        s.step(opt)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_non_tensor_param_rejected(scaler_cls):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.randn(2))], lr=0.1)
    opt.param_groups[0]["params"].append("oops")
    s = scaler_cls("cpu")
    s.scale(torch.ones(()))
    with pytest.raises(AssertionError, match="expected param to be torch.Tensor, got str"):
        s.unscale_(opt)


# ------------------------------------------------------------------ step()
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_step_forwards_args_and_return_value(scaler_cls, device):
    model = two_layer(device)
    opt = RecordingOptimizer(model.parameters())
    s = scaler_cls(device)

    def closure():
        return 0.0

    _backward(model, s, device)
    assert s.step(opt, closure, "a", k=3) == "stepped"
    call = opt.calls[-1]
    assert call["closure"] is closure and call["args"] == ("a",) and call["kwargs"] == {"k": 3}
    s.update()
    _backward(model, s, device, inf=True)
    assert s.step(opt) is None  # skipped: not called, None returned
    assert len(opt.calls) == 1
    s.update()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_step_looks_up_instance_attribute(scaler_cls):
    """Accelerate patches ``optimizer.step`` on the instance to see if it ran."""
    model, opt, s = _setup(scaler_cls, "cpu")
    seen = []
    original = opt.step

    def patched(*args, **kwargs):
        seen.append(True)
        return original(*args, **kwargs)

    opt.step = patched
    _backward(model, s, "cpu")
    s.step(opt)
    s.update()
    assert seen == [True]
    _backward(model, s, "cpu", inf=True)
    s.step(opt)
    s.update()
    assert seen == [True]


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_skip_and_scale_sequence(scaler_cls, device):
    model, opt, s = _setup(scaler_cls, device, init_scale=8.0, growth_interval=2)
    before = [p.detach().clone() for p in model.parameters()]
    scales = []
    for inf in (False, True, False, False, False, True):
        opt.zero_grad()
        _backward(model, s, device, inf=inf)
        s.step(opt)
        if inf:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        before = [p.detach().clone() for p in model.parameters()]
        s.update()
        scales.append(s.get_scale())
        assert isinstance(scales[-1], float)
    assert scales == [8.0, 4.0, 4.0, 8.0, 8.0, 4.0]
    assert s._get_growth_tracker() == 0


# ------------------------------------------------------------------ update(new_scale)
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_update_new_scale(scaler_cls, device):
    model, opt, s = _setup(scaler_cls, device)
    _backward(model, s, device)
    s.step(opt)
    s.update(new_scale=3.0)
    assert s.get_scale() == 3.0
    assert len(s._per_optimizer_states) == 0
    _backward(model, s, device)
    s.step(opt)
    t = torch.tensor(5.0, device=device)
    s.update(t)
    t.fill_(7.0)  # copied, not aliased
    assert s.get_scale() == 5.0
    reason = re.escape(
        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
        "torch.FloatTensor with requires_grad=False."
    )
    s.scale(torch.ones((), device=device))
    with pytest.raises(AssertionError, match=reason):
        s.update(torch.ones(2, device=device))
    with pytest.raises(AssertionError, match=reason):
        s.update(torch.ones((), device=device, requires_grad=True))
    other = "cuda" if device == "cpu" else "cpu"
    if other == "cpu" or HAS_CUDA:
        with pytest.raises(AssertionError, match=reason):
            s.update(torch.ones((), device=other))
    with pytest.raises(AttributeError):
        s.update(4)  # an int is neither a float nor a tensor (torch's behaviour)


# ------------------------------------------------------------------ getters/setters
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_getters_setters(scaler_cls):
    s = scaler_cls("cpu", init_scale=3.0, growth_factor=4.0, backoff_factor=0.25,
                   growth_interval=7)
    assert (s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(),
            s.get_growth_interval()) == (3.0, 4.0, 0.25, 7)
    s.set_growth_factor(3.0)
    s.set_backoff_factor(0.125)
    s.set_growth_interval(5)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (
        3.0, 0.125, 5)


@pytest.mark.parametrize("bounds", [{}, {"min_scale": 1e-3, "max_scale": 1e9}],
                         ids=["torch_rule", "extended_rule"])
def test_factor_changes_reach_the_next_update(bounds):
    """torch's setters, load_state_dict and a pickle round trip reach the next update, as
    they do torch's (bounds never hit: the extended rule then scales as torch's)."""
    kw = {"init_scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1}
    ref = torch.amp.GradScaler("cpu", **kw)
    ours = mixprec.GradScaler("cpu", **kw, **bounds)
    model = two_layer("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def iterate(scalers, infs):
        for inf in infs:
            for s in scalers:
                opt.zero_grad()
                _backward(model, s, "cpu", inf=inf)
                s.step(opt)
                s.update()
        assert ours.get_scale() == ref.get_scale()

    both = (ref, ours)
    iterate(both, [False, True, False])  # 16, 8, 16
    for s in both:
        s.set_growth_factor(3.0)
    iterate(both, [False])  # 48
    for s in both:
        s.set_backoff_factor(0.25)
    iterate(both, [True])  # 12
    for s in both:
        s.set_growth_interval(2)
    iterate(both, [False, False])  # 36
    assert ref.get_scale() == 36.0
    src = torch.amp.GradScaler("cpu", init_scale=2.0, growth_factor=5.0, backoff_factor=0.125,
                               growth_interval=1)
    src.scale(torch.ones(()))
    for s in both:
        s.load_state_dict(src.state_dict())
    iterate(both, [False, True])  # 10, 1.25
    ref, ours = (pickle.loads(pickle.dumps(s)) for s in both)
    both = (ref, ours)
    for s in both:
        s.set_growth_factor(7.0)
    iterate(both, [False])  # 8.75
    assert ref.get_scale() == 8.75


# ------------------------------------------------------------------ state_dict / pickle
def _advance(s, device, n=3, inf_at=(1,)):
    model = two_layer(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(n):
        opt.zero_grad()
        _backward(model, s, device, inf=i in inf_at)
        s.step(opt)
        s.update()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_state_dict_keys_and_types(scaler_cls, device):
    s = scaler_cls(device, init_scale=16.0, growth_interval=3)
    _advance(s, device, n=4, inf_at=(0,))
    sd = s.state_dict()
    assert sd == {"scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 3, "_growth_tracker": 0}
    assert type(sd["scale"]) is float and type(sd["_growth_tracker"]) is int
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == sd


@pytest.mark.parametrize("src_cls", SCALERS)
@pytest.mark.parametrize("dst_cls", SCALERS)
@pytest.mark.parametrize("dst_initialized", [False, True])
def test_state_dict_cross_loading(src_cls, dst_cls, dst_initialized):
    src = src_cls("cpu", init_scale=64.0, growth_interval=5)
    _advance(src, "cpu", n=4, inf_at=(1,))
    sd = src.state_dict()
    dst = dst_cls("cpu", growth_factor=3.0)
    if dst_initialized:
        dst.scale(torch.ones(()))
    dst.load_state_dict(sd)
    assert dst.state_dict() == sd
    assert dst.get_scale() == 32.0 and dst._get_growth_tracker() == 2
    # both continue identically
    _advance(src, "cpu", n=5, inf_at=())
    _advance(dst, "cpu", n=5, inf_at=())
    assert dst.state_dict() == src.state_dict()


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_load_empty_state_dict(scaler_cls):
    with pytest.raises(RuntimeError, match=re.escape(
        "The source state dict is empty, possibly because it was saved "
        "from a disabled instance of GradScaler."
    )):
        scaler_cls("cpu").load_state_dict({})


@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize("lazy", [True, False])
def test_pickle_round_trip(scaler_cls, lazy):
    s = scaler_cls("cpu", init_scale=32.0, growth_factor=4.0, backoff_factor=0.25,
                   growth_interval=3)
    if not lazy:
        _advance(s, "cpu", n=2, inf_at=(0,))
    for copy_fn in (lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy):
        s2 = copy_fn(s)
        assert type(s2) is type(s)
        assert s2.state_dict() == s.state_dict()
        assert s2._scale is None and s2._growth_tracker is None  # re-created lazily
        assert s2.is_enabled()
        _advance(s2, "cpu", n=3, inf_at=())
        assert s2._scale is not None


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_pickle_mid_iteration_rejected(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    _backward(model, s, "cpu")
    s.unscale_(opt)
    with pytest.raises(AssertionError, match=re.escape(
        "A GradScaler instance may only be pickled at the beginning "
        "of an iteration, or at the end after scaler.update()."
    )):
        pickle.dumps(s)


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_pickle_disabled(scaler_cls):
    s = pickle.loads(pickle.dumps(scaler_cls("cpu", enabled=False)))
    assert not s.is_enabled() and s.state_dict() == {}


# ------------------------------------------------------------------ private hooks
@pytest.mark.parametrize("scaler_cls", SCALERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_unscale_grads_sparse(scaler_cls, device, dtype):
    s = scaler_cls(device)
    inv_scale = torch.full((), 0.25, dtype=torch.float32, device=device)
    i = torch.tensor([[0, 1, 1], [2, 0, 2]], device=device)
    v = torch.tensor([16.0, 32.0, 64.0], device=device, dtype=dtype)
    sp = torch.sparse_coo_tensor(i, v, (2, 3), device=device, dtype=dtype, check_invariants=True)
    p = sp.clone()
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = sp.clone()
    out = s._unscale_grads_(opt, inv_scale, torch.zeros((), device=device), True)
    assert list(out) == [p.grad.device]
    assert out[p.grad.device].item() == 0.0
    torch.testing.assert_close(p.grad.to_dense(), (sp / 4).to_dense())
    for bad in (INF, float("nan")):
        vals = torch.tensor([16.0, 32.0, bad], dtype=dtype)
        p.grad = torch.sparse_coo_tensor(i, vals, (2, 3), device=device, check_invariants=True)
        out = s._unscale_grads_(opt, inv_scale, torch.zeros((), device=device), True)
        assert out[p.grad.device].item() == 1.0
    if dtype == torch.float16:
        # duplicate indices whose sum overflows fp16: coalesced before the check
        i2 = torch.tensor([[0, 1, 0], [2, 0, 2]], device=device)
        v2 = torch.tensor([64000.0, 32.0, 64000.0], dtype=dtype, device=device)
        p.grad = torch.sparse_coo_tensor(i2, v2, (2, 3), device=device, check_invariants=True)
        assert not p.grad.is_coalesced()
        out = s._unscale_grads_(opt, inv_scale, torch.zeros((), device=device), True)
        assert p.grad.is_coalesced()
        assert out[p.grad.device].item() == 1.0


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_check_inf_per_device_records(scaler_cls):
    model, opt, s = _setup(scaler_cls, "cpu")
    _backward(model, s, "cpu", inf=True)
    res = s._check_inf_per_device(opt)
    assert res is s._found_inf_per_device(opt)
    assert sum(v.item() for v in res.values()) == 1.0
    assert s._per_optimizer_states[id(opt)]["stage"] is OptState.READY


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_lazy_init_twice_rejected(scaler_cls):
    s = scaler_cls("cpu")
    s._lazy_init_scale_growth_tracker(torch.device("cpu"))
    with pytest.raises(AssertionError, match="_growth_tracker initialized before _scale"):
        s._lazy_init_scale_growth_tracker(torch.device("cpu"))


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_maybe_opt_step(scaler_cls):
    model = two_layer("cpu")
    opt = RecordingOptimizer(model.parameters())
    s = scaler_cls("cpu")
    cpu = torch.device("cpu")
    state = {"stage": OptState.UNSCALED, "found_inf_per_device": {cpu: torch.zeros(())}}
    assert s._maybe_opt_step(opt, state, 1, k=2) == "stepped"
    state["found_inf_per_device"] = {torch.device("cpu"): torch.ones(())}
    assert s._maybe_opt_step(opt, state) is None
    assert len(opt.calls) == 1
    assert opt.calls[0]["closure"] == 1 and opt.calls[0]["kwargs"] == {"k": 2}


# ------------------------------------------------------------------ _step_supports_amp_scaling
@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_amp_aware_optimizer_protocol(scaler_cls, device):
    model = two_layer(device)
    opt = RecordingOptimizer(model.parameters(), supports_amp=True)
    s = scaler_cls(device, init_scale=8.0)
    # READY: grad_scale = the scale, found_inf = the check result; never skipped
    _backward(model, s, device)
    grads = [p.grad.clone() for p in model.parameters()]
    assert s.step(opt) == "stepped"
    call = opt.calls[-1]
    assert call["grad_scale"].item() == 8.0 and call["found_inf"].item() == 0.0
    assert call["found_inf"].dtype == torch.float32
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    # the inf check alone does not change the gradients
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    s.update()
    # inf: still called, with found_inf set
    opt.zero_grad()
    _backward(model, s, device, inf=True)
    before = [p.detach().clone() for p in model.parameters()]
    assert s.step(opt) == "stepped"
    assert opt.calls[-1]["found_inf"].item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    s.update()
    assert s.get_scale() == 4.0
    # UNSCALED: grad_scale None
    opt.zero_grad()
    _backward(model, s, device)
    s.unscale_(opt)
    s.step(opt)
    assert opt.calls[-1]["grad_scale"] is None and opt.calls[-1]["found_inf"].item() == 0.0
    s.update()
    # a grad_scale set by the user is multiplied in
    opt.zero_grad()
    _backward(model, s, device)
    opt.grad_scale = torch.full((), 3.0, device=device)
    s.step(opt)
    assert opt.calls[-1]["grad_scale"].item() == 12.0
    s.update()


class _OldStyle(RecordingOptimizer):
    def step(self, closure=None, grad_scaler=None):  # type: ignore[override]
        self.calls.append({"grad_scaler": grad_scaler})
        return "old"


@pytest.mark.parametrize("scaler_cls", SCALERS)
def test_amp_aware_optimizer_with_grad_scaler_kwarg(scaler_cls):
    model = two_layer("cpu")
    opt = _OldStyle(model.parameters(), supports_amp=True)
    s = scaler_cls("cpu")
    _backward(model, s, "cpu")
    with pytest.warns(FutureWarning, match="GradScaler is going to stop passing itself"):
        assert s.step(opt) == "old"
    assert opt.calls[-1]["grad_scaler"] is s
    assert s._per_optimizer_states[id(opt)]["stage"] is OptState.STEPPED
