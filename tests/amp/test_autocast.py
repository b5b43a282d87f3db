"""mixprec.autocast and precision policies (apply_policy)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import mixprec
from _helpers import cuda_only
from mixprec.amp.autocast import resolve_precision
from mixprec.amp.module_policy import PrecisionPolicy, apply_policy, remove_policy


def _state(device_type: str) -> tuple[bool, torch.dtype, bool]:
    return (
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
        torch.is_autocast_cache_enabled(),
    )


def _low(device: str) -> torch.dtype:
    return torch.float16 if device == "cuda" else torch.bfloat16


# ----------------------------------------------------------------------- autocast
def test_is_torch_autocast_subclass_and_accepts_torch_keywords(device):
    ac = mixprec.autocast(device, dtype=_low(device), enabled=True, cache_enabled=False)
    assert isinstance(ac, torch.autocast)
    assert isinstance(ac, torch.amp.autocast)
    with ac:
        assert torch.is_autocast_enabled(device)
        assert torch.get_autocast_dtype(device) == _low(device)
        assert not torch.is_autocast_cache_enabled()
        y = torch.randn(4, 4, device=device) @ torch.randn(4, 4, device=device)
        assert y.dtype == _low(device)


@pytest.mark.parametrize(
    "precision,dtype,enabled,scaling",
    [("fp16", torch.float16, True, True), ("bf16", torch.bfloat16, True, False),
     ("fp32", None, False, False)],
)
def test_precision_names(device, precision, dtype, enabled, scaling):
    if device == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    ac = mixprec.autocast(device, precision=precision)
    assert ac.precision == precision
    assert ac.needs_loss_scaling is scaling
    before = _state(device)
    x = torch.randn(8, 8, device=device)
    with ac:
        assert torch.is_autocast_enabled(device) is enabled
        out = x @ x
    assert out.dtype == (dtype if enabled else torch.float32)
    assert _state(device) == before


def test_auto_resolves_to_bf16_on_cpu_and_by_capability_on_cuda(device):
    dtype, scaling = resolve_precision(device, "auto")
    if device == "cpu":
        assert (dtype, scaling) == (torch.bfloat16, False)
    elif torch.cuda.is_bf16_supported():
        assert (dtype, scaling) == (torch.bfloat16, False)
    else:
        assert (dtype, scaling) == (torch.float16, True)
    ac = mixprec.autocast(device, precision="auto")
    assert ac.fast_dtype == dtype


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision must be one of"):
        mixprec.autocast("cpu", precision="fp8")
    with pytest.raises(ValueError, match="conflicts"):
        mixprec.autocast("cpu", dtype=torch.float16, precision="bf16")
    with pytest.raises(ValueError, match="disables autocast"):
        mixprec.autocast("cpu", dtype=torch.bfloat16, precision="fp32")
    # dtype=float32 means "no autocast" instead of torch's warning
    assert not mixprec.autocast("cpu", dtype=torch.float32)._enabled


def test_reentrant_same_instance_restores_each_level():
    outer_state = _state("cpu")
    ac = mixprec.autocast("cpu", precision="bf16")
    off = mixprec.autocast("cpu", precision="fp32")
    with ac:
        s1 = _state("cpu")
        with off:
            assert not torch.is_autocast_enabled("cpu")
            with ac:  # the same instance entered again while active
                assert torch.is_autocast_enabled("cpu")
            assert not torch.is_autocast_enabled("cpu")  # inner exit restored "off"
        assert _state("cpu") == s1
    assert _state("cpu") == outer_state


def test_reentrant_through_recursion_and_reusable_as_decorator():
    ac = mixprec.autocast("cpu", precision="bf16")
    seen = []

    @ac
    def f(n: int) -> torch.dtype:
        x = torch.randn(2, 2)
        seen.append(torch.is_autocast_enabled("cpu"))
        if n:
            f(n - 1)
        return (x @ x).dtype

    before = _state("cpu")
    assert f(3) == torch.bfloat16
    assert f(0) == torch.bfloat16  # reusable
    assert all(seen) and _state("cpu") == before


def test_exception_inside_restores_state():
    before = _state("cpu")
    with pytest.raises(RuntimeError, match="boom"):
        with mixprec.autocast("cpu", precision="bf16"):
            raise RuntimeError("boom")
    assert _state("cpu") == before


# ----------------------------------------------------------------------- policies
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.fc2(self.act(self.norm(self.fc1(x))))))


def _record_outputs(model: nn.Module) -> tuple[dict[str, torch.dtype], list]:
    dtypes: dict[str, torch.dtype] = {}
    handles = []
    for name, m in model.named_modules():
        if name:
            handles.append(m.register_forward_hook(
                lambda mod, i, o, name=name: dtypes.__setitem__(name, o.dtype)))
    return dtypes, handles


def test_default_policy_norms_fp32_outputs_fp32(device):
    model = Block().to(device)
    dtypes, _ = _record_outputs(model)
    low = _low(device)
    handle = apply_policy(model, PrecisionPolicy(precision="fp16" if device == "cuda" else "bf16"))
    out = model(torch.randn(5, 8, device=device))
    assert dtypes["fc1"] == low and dtypes["fc2"] == low and dtypes["head"] == low
    assert dtypes["norm"] == torch.float32 and dtypes["bn"] == torch.float32
    assert out.dtype == torch.float32  # cast_outputs
    assert handle.precisions["norm"] == "fp32" and handle.precisions["bn"] == "fp32"
    # parameters untouched
    assert all(p.dtype == torch.float32 for p in model.parameters())
    handle.remove()
    assert model(torch.randn(5, 8, device=device)).dtype == torch.float32  # no autocast now
    with torch.autocast(device, dtype=low):
        model(torch.randn(5, 8, device=device))
    assert dtypes["bn"] == low  # the wrapper is gone: torch runs BN in the input dtype


def test_policy_fp32_by_glob_name_casts_inputs_up():
    model = Block()
    dtypes, _ = _record_outputs(model)
    seen_inputs = {}
    model.fc2.register_forward_pre_hook(lambda m, a: seen_inputs.__setitem__("fc2", a[0].dtype))
    apply_policy(model, PrecisionPolicy(precision="bf16", fp32_modules=("fc*",)))
    model(torch.randn(3, 8))
    assert dtypes["fc1"] == torch.float32 and dtypes["fc2"] == torch.float32
    assert dtypes["head"] == torch.bfloat16
    # hooks run outside the wrapper: the wrapper itself casts (input arrives fp32 here)
    assert seen_inputs["fc2"] == torch.float32


def test_policy_fp32_by_class_name_and_type():
    """A class name or a type in fp32_modules keeps the matching modules in float32; a spec
    that matches nothing (the control) leaves them in bfloat16."""
    for spec, want in (("Linear", torch.float32), (nn.Linear, torch.float32),
                       ("Conv2d", torch.bfloat16), (nn.Conv2d, torch.bfloat16)):
        model = Block()
        dtypes, _ = _record_outputs(model)
        with apply_policy(model, PrecisionPolicy(precision="bf16", fp32_modules=(spec,))):
            model(torch.randn(3, 8))
        assert {dtypes[n] for n in ("fc1", "fc2", "head")} == {want}, spec


def test_selective_only_chosen_modules_low(device):
    model = Block().to(device)
    dtypes, _ = _record_outputs(model)
    low = _low(device)
    prec = "fp16" if device == "cuda" else "bf16"
    apply_policy(model, PrecisionPolicy(precision=prec, low_precision_modules=("fc2",)))
    # even inside a caller's autocast, only fc2 runs low
    with torch.autocast(device, dtype=low):
        out = model(torch.randn(5, 8, device=device))
    assert dtypes["fc2"] == low
    assert dtypes["fc1"] == torch.float32 and dtypes["head"] == torch.float32
    assert dtypes["bn"] == torch.float32 and out.dtype == torch.float32


def test_module_precision_override():
    model = Block()
    dtypes, _ = _record_outputs(model)
    apply_policy(model, PrecisionPolicy(precision="fp16", module_precisions={"fc2": "bf16",
                                                                             "head": "fp32"}))
    model(torch.randn(3, 8))
    assert dtypes["fc1"] == torch.float16
    assert dtypes["fc2"] == torch.bfloat16
    assert dtypes["head"] == torch.float32


def test_manual_style_restore_input_dtype():
    # 16-bit params, no autocast: an fp32 norm island must hand back 16-bit outputs
    model = Block()
    for m in (model.fc1, model.fc2, model.head):
        m.to(torch.bfloat16)
    dtypes, _ = _record_outputs(model)
    apply_policy(model, PrecisionPolicy(precision=None, restore_input_dtype=True))
    out = model(torch.randn(3, 8, dtype=torch.bfloat16))
    assert model.norm.weight.dtype == torch.float32
    assert dtypes["norm"] == torch.bfloat16 and dtypes["fc2"] == torch.bfloat16
    assert out.dtype == torch.float32


def test_remove_is_complete_and_apply_twice_raises():
    model = Block()
    x = torch.randn(4, 8)
    ref = model(x)
    handle = apply_policy(model)
    with pytest.raises(RuntimeError, match="already has a policy"):
        apply_policy(model)
    handle.remove()
    handle.remove()  # idempotent
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not hasattr(model, "_mixprec_policy")
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
    apply_policy(model)
    assert remove_policy(model) and not remove_policy(model)


def test_existing_instance_forward_is_chained_and_restored():
    model = Block()
    calls = []
    orig = model.fc2.forward

    def custom(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return orig(x)

    model.fc2.forward = custom
    with apply_policy(model, PrecisionPolicy(precision="bf16", fp32_modules=("fc2",))):
        model(torch.randn(2, 8))
    assert calls == [1]
    assert model.fc2.forward is custom


def test_exception_in_wrapped_module_restores_autocast():
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("bad module")

    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), Bad())
    apply_policy(model, PrecisionPolicy(precision="bf16"))
    before = _state("cpu")
    with pytest.raises(ValueError, match="bad module"):
        model(torch.randn(2, 4))
    assert _state("cpu") == before


def test_deepcopy_of_wrapped_model_calls_the_copy():
    model = Block()
    apply_policy(model, PrecisionPolicy(precision="bf16"))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    x = torch.randn(3, 8)
    assert torch.all(clone.eval()(x) == clone.head.bias.float())  # zero weights: bias only
    assert not torch.equal(model.eval()(x), clone(x))


def test_backward_through_policy(device):
    model = Block().to(device)
    prec = "fp16" if device == "cuda" else "bf16"
    apply_policy(model, PrecisionPolicy(precision=prec))
    model(torch.randn(6, 8, device=device)).sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_policy_validation():
    with pytest.raises(ValueError, match="precision must be None or one of"):
        PrecisionPolicy(precision="int8")
    with pytest.raises(ValueError, match="module_precisions"):
        PrecisionPolicy(module_precisions={"fc": "fp64"})
    assert PrecisionPolicy(fp32_modules="fc1").fp32_modules == ("fc1",)


@cuda_only
def test_cuda_auto_policy_matches_capability():
    model = Block().cuda()
    dtypes, _ = _record_outputs(model)
    apply_policy(model, PrecisionPolicy(precision="auto"))
    model(torch.randn(4, 8, device="cuda"))
    assert dtypes["fc1"] == resolve_precision("cuda", "auto")[0]
