"""Flat-buffer mode (mixprec.optim.flat_buffers): layout, grads kept as views across both
kinds of zero_grad, results bitwise equal to the per-tensor path, one tensor per buffer run
in the scaler's and the optimizers' op calls, fallbacks, state_dict both ways,
torch.compile and DDP."""

from __future__ import annotations

import gc
import io
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from torch import nn

import mixprec
from _helpers import assert_bitwise_equal
from mixprec import flat as flat_mod
from mixprec.flat import layout as flat_layout

MASTER = {torch.float32: False, torch.float16: True, torch.bfloat16: True}
OPTIMS: Dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": lambda ps: mixprec.optim.Adam(ps, lr=1e-2, weight_decay=0.01),
    "adamw": lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, amsgrad=True),
    "sgd": lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True,
                                        weight_decay=1e-3),
}


class Net(nn.Module):
    """Several layers, odd sizes (so views are padded), one branch that may be unused."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 3)
        self.c = nn.Linear(7, 3, bias=False)  # used only when use_c
        self.n = nn.LayerNorm(3)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        h = torch.relu(self.a(x))
        out = self.b(h)
        if use_c:
            out = out + self.c(h)
        return self.n(out)


def make(dtype: torch.dtype, device: str = "cpu", seed: int = 0, flat: bool = False) -> Net:
    """A seeded :class:`Net`; with ``flat``, its parameters moved into flat buffers."""
    torch.manual_seed(seed)
    model = Net().to(device=device, dtype=dtype)
    if flat:
        mixprec.flat_buffers(model)
    return model


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> List[Tuple[str, int]]:
    """Every mixprec op call made through mixprec.ops, with the length of its first list."""
    log: List[Tuple[str, int]] = []
    for name in ("fused_adam_", "fused_sgd_", "check_finite_", "unscale_and_check_",
                 "unscale_and_norm_", "check_finite_and_norm_"):
        orig = getattr(mixprec.ops, name)

        def wrapped(*args: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            # the first list, passed by position or (the optimizers) by name
            first = args[0] if args else kw.get("params", kw.get("grads", kw.get("tensors")))
            log.append((_name, len(first)))
            return _orig(*args, **kw)

        monkeypatch.setattr(mixprec.ops, name, wrapped)
    return log


def train(model: Net, opt: torch.optim.Optimizer, steps: int, *, set_to_none: bool,
          scaler: Optional[mixprec.GradScaler] = None, inf_at: Tuple[int, ...] = (),
          unused_at: Tuple[int, ...] = (), seed: int = 1, device: str = "cpu",
          clip: Optional[float] = None,
          between: Optional[Callable[[int], None]] = None) -> List[float]:
    """Steps with fixed data; an inf in the first and last element of a.weight.grad at
    the steps in ``inf_at``; branch c unused at the steps in ``unused_at``."""
    g = torch.Generator().manual_seed(seed)
    dtype = model.a.weight.dtype
    losses = []
    for it in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        x = torch.randn(4, 5, generator=g).to(device=device, dtype=dtype)
        loss = model(x, use_c=it not in unused_at).float().pow(2).mean()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if between is not None:
            between(it)
        if it in inf_at:
            w = model.a.weight.grad.view(-1)
            w[0] = float("inf")
            w[-1] = float("-inf")
        if scaler is not None:
            if clip is not None:
                scaler.clip_grad_norm_(opt, clip)
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(loss.item())
    return losses


def assert_same(m1: nn.Module, m2: nn.Module, o1: torch.optim.Optimizer,
                o2: torch.optim.Optimizer) -> None:
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert_bitwise_equal(p.detach(), q.detach())
        s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
        assert s1.keys() == s2.keys()
        for k in s1:
            if isinstance(s1[k], torch.Tensor):
                assert_bitwise_equal(s1[k].reshape(s1[k].shape), s2[k])


# ---------------------------------------------------------------------------------------------
# Layout and grads


def test_params_become_views_with_their_values() -> None:
    model = make(torch.float32)
    before = [p.detach().clone() for p in model.parameters()]
    ids = [id(p) for p in model.parameters()]
    fb = mixprec.flat_buffers(model)
    assert isinstance(fb, mixprec.FlatBuffers) and len(fb) == 1
    assert [id(p) for p in model.parameters()] == ids  # the same Parameter objects
    assert fb.params == list(model.parameters())
    (pbuf, gbuf), = list(fb)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
        assert p.untyped_storage().data_ptr() == pbuf.untyped_storage().data_ptr()
    # each view starts at a 16-byte boundary; the padding is zero
    offs = fb._buffers[0].offsets
    assert all(o % 4 == 0 for o in offs) and pbuf.numel() > sum(p.numel() for p in before)
    covered = torch.zeros(pbuf.numel(), dtype=torch.bool)
    for o, e in zip(fb._buffers[0].offsets, fb._buffers[0].ends):
        covered[o:e] = True
    assert torch.all(pbuf[~covered] == 0) and torch.all(gbuf[~covered] == 0)


def test_one_buffer_per_device_and_dtype_frozen_params_left_out() -> None:
    model = make(torch.float32)
    model.b.to(torch.bfloat16)
    model.n.weight.requires_grad_(False)
    fb = mixprec.flat_buffers(model)
    assert len(fb) == 2
    dtypes = sorted(str(b.dtype) for b in fb._buffers)
    assert dtypes == ["torch.bfloat16", "torch.float32"]
    assert all(p is not model.n.weight for p in fb.params)
    with pytest.raises(ValueError, match="already in a flat buffer"):
        mixprec.flat_buffers(model)


def test_a_dead_params_reused_id_is_not_taken_for_a_flat_param() -> None:
    """The registry is keyed by ``id``, and a buffer can outlive its params (here its handle
    holds it): a new tensor may take a dead param's id. Found by CI, where a compiled step
    kept an old buffer alive and ``make`` of a fresh model raised "already in a flat
    buffer". Planted here: a fresh param's id points at a live buffer's slot."""
    fb = mixprec.flat_buffers(make(torch.float32))
    fresh = torch.nn.Linear(2, 2)
    flat_layout._PARAMS[id(fresh.weight)] = next(iter(flat_layout._PARAMS.values()))
    try:
        fresh_fb = mixprec.flat_buffers(fresh)  # not "already in a flat buffer"
        assert len(fresh_fb) == 1
        fresh_fb.remove()
    finally:
        fb.remove()


@pytest.mark.parametrize("how", ["optim-none", "optim-zero", "model-none", "flat-zero",
                                 "assigned"])
def test_grads_are_views_after_every_backward(how: str) -> None:
    model = make(torch.float32)
    fb = mixprec.flat_buffers(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    views = fb._buffers[0].grad_views
    ref = make(torch.float32)
    for _it in range(3):
        if how == "optim-none":
            opt.zero_grad()  # set_to_none=True: grads become None
        elif how == "optim-zero":
            opt.zero_grad(set_to_none=False)
        elif how == "model-none":
            model.zero_grad()
        elif how == "flat-zero":
            fb.zero_grad()
        elif how == "assigned":
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        ref.zero_grad()
        x = torch.randn(3, 5)
        model(x).sum().backward()
        ref(x).sum().backward()
        for p, q, v in zip(model.parameters(), ref.parameters(), views):
            assert p.grad is v
            assert_bitwise_equal(p.grad, q.grad)
        opt.step()
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref.parameters()):
                q.copy_(p)


# torch warns that create_graph=True makes a param <-> grad reference cycle: expected here.
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_create_graph_grads_are_left_alone() -> None:
    model = make(torch.float32, flat=True)
    model(torch.randn(2, 5)).pow(2).sum().backward(create_graph=True)
    assert model.a.weight.grad.requires_grad  # autograd's grad, not the view
    for p in model.parameters():
        p.grad = None


def test_bad_inputs() -> None:
    x = torch.randn(3, requires_grad=True) * 2
    with pytest.raises(ValueError, match="dense leaf"):
        mixprec.flat_buffers([x])
    with pytest.raises(TypeError):
        mixprec.flat_buffers([1.0])


# ---------------------------------------------------------------------------------------------
# Bitwise equality with the per-tensor path, and one tensor per buffer


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(OPTIMS))
def test_bitwise_equal_to_per_tensor_with_scaler(name: str, dtype: torch.dtype,
                                                 set_to_none: bool, device: str,
                                                 calls: List[Tuple[str, int]]) -> None:
    results = []
    for flat in (False, True):
        model = make(dtype, device)
        fb = mixprec.flat_buffers(model) if flat else None
        opt = OPTIMS[name](model.parameters())
        scaler = mixprec.GradScaler(device, init_scale=2.0**12)
        calls.clear()
        losses = train(model, opt, 5, set_to_none=set_to_none, scaler=scaler, inf_at=(0, 3),
                       device=device)
        results.append((model, opt, losses, list(calls), scaler.get_scale()))
        if fb is not None:
            assert all(p.grad is v for p, v in zip(model.parameters(),
                                                   fb._buffers[0].grad_views))
            # the optimizer's per-param loop is skipped: the group is one whole run
            assert list(flat_mod.whole_group(opt, opt.param_groups[0]).values())[0][
                "params"][0].dim() == 1
    (m1, o1, l1, c1, s1), (m2, o2, l2, c2, s2) = results
    assert l1 == l2 and s1 == s2 == 2.0**12 * 0.5 * 0.5  # two skipped steps
    assert_same(m1, m2, o1, o2)
    steps = {float(o2.state[p]["step"]) for p in m2.parameters()}
    assert steps == {3.0}
    n = len(list(m1.parameters()))
    op = "fused_sgd_" if name == "sgd" else "fused_adam_"
    assert c1 == [("check_finite_", n), (op, n)] * 5
    assert c2 == [("check_finite_", 1), (op, 1)] * 5  # one tensor: the buffer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreign_optimizer_unscale_and_clip(dtype: torch.dtype,
                                            calls: List[Tuple[str, int]]) -> None:
    """torch.optim.AdamW through the scaler's unscale_ path; and a folded clip."""
    out = []
    for flat in (False, True):
        model = make(dtype, flat=flat)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0**8, allow_fp16_grads=True)
        calls.clear()
        train(model, opt, 4, set_to_none=True, scaler=scaler, inf_at=(1,))
        out.append(([p.detach().clone() for p in model.parameters()], list(calls)))
    for p, q in zip(out[0][0], out[1][0]):
        assert_bitwise_equal(p, q)
    assert out[1][1] == [("unscale_and_check_", 1)] * 4
    # clip: the norm is the same number up to the order of the partial sums
    norms = []
    for flat in (False, True):
        model = make(dtype, flat=flat)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
        scaler.scale(model(torch.ones(2, 5, dtype=dtype)).float().pow(2).sum()).backward()
        norms.append(scaler.clip_grad_norm_(opt, 0.5).item())
    assert norms[0] == pytest.approx(norms[1], rel=1e-6)


def test_mixed_dtypes_and_groups_one_call_per_group_and_buffer(
        calls: List[Tuple[str, int]]) -> None:
    """bf16 weights with masters and fp32 norms without, in two groups with different
    hyperparameters (the usual no-decay group): one tensor per (group, buffer)."""
    results = []
    for flat in (False, True):
        model = make(torch.bfloat16)
        model.n.float()
        decay = [model.a.weight, model.b.weight, model.c.weight]
        no_decay = [model.a.bias, model.b.bias, model.n.weight, model.n.bias]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay,
                                                           "weight_decay": 0.0, "lr": 3e-3}]
        if flat:
            fb = mixprec.flat_buffers(groups)
            assert len(fb) == 2
        opt = mixprec.optim.AdamW(groups, lr=1e-2)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
        calls.clear()
        train(model, opt, 4, set_to_none=False, scaler=scaler, inf_at=(2,))
        results.append((model, opt, list(calls)))
    (m1, o1, _), (m2, o2, c2) = results
    assert_same(m1, m2, o1, o2)
    # per step: one check over 2 runs (the bf16 buffer, laid out group by group, and the
    # fp32 norm buffer); group 0: one bf16 run; group 1: a bf16 run (biases, with masters)
    # and an fp32 run (the norm, without masters: another bucket)
    assert c2 == [("check_finite_", 2), ("fused_adam_", 1), ("fused_adam_", 1),
                  ("fused_adam_", 1)] * 4


# ---------------------------------------------------------------------------------------------
# Fallbacks: detection is exact


def test_replaced_grad_falls_back_for_that_tensor(calls: List[Tuple[str, int]]) -> None:
    replaced = []

    def replace(it: int, model: Net) -> None:
        if it == 1:
            g = model.b.weight.grad
            model.b.weight.grad = torch.zeros_like(g)
            model.b.weight.grad.copy_(g)
            replaced.append(model.b.weight.grad)

    results = []
    for flat in (False, True):
        model = make(torch.float32, flat=flat)
        opt = mixprec.optim.Adam(model.parameters(), lr=1e-2)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
        calls.clear()
        train(model, opt, 4, set_to_none=False, scaler=scaler,
              between=lambda it, m=model: replace(it, m))
        results.append((model, opt, list(calls)))
    (m1, o1, _), (m2, o2, c2) = results
    assert_same(m1, m2, o1, o2)
    # step 1: b.weight per tensor, the params before and after it as two runs
    assert c2[2:4] == [("check_finite_", 3), ("fused_adam_", 3)]
    assert c2[4:] == [("check_finite_", 1), ("fused_adam_", 1)] * 2  # the view is back
    assert m2.b.weight.grad is not replaced[-1]


def test_data_replaced_param_is_not_a_view_any_more(calls: List[Tuple[str, int]]) -> None:
    model = make(torch.float32, flat=True)
    opt = mixprec.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.b.weight.data = model.b.weight.data.clone()  # same object, new storage
    train(model, opt, 2, set_to_none=True)
    assert ("fused_sgd_", 3) in calls  # a.*, then b.weight alone, then the rest


def test_subset_unused_params_and_frozen_params(calls: List[Tuple[str, int]]) -> None:
    """An optimizer over part of a flat model; a branch without grads at some steps (its
    step counts must lag); a param frozen later. Bitwise equal to the per-tensor path."""

    def freeze(it: int, model: Net) -> None:
        if it == 3:
            model.n.bias.requires_grad_(False)
            model.n.bias.grad = None

    results = []
    for flat in (False, True):
        model = make(torch.float32, flat=flat)
        ps = [p for n, p in model.named_parameters() if not n.startswith("a.")]
        opt = mixprec.optim.Adam(ps, lr=1e-2)
        calls.clear()
        train(model, opt, 7, set_to_none=True, unused_at=(1, 2),
              between=lambda it, m=model: freeze(it, m))
        results.append((model, opt, list(calls)))
    (m1, o1, _), (m2, o2, c2) = results
    assert_same(m1, m2, o1, o2)
    steps = {n: float(o2.state[p]["step"]) for n, p in m2.named_parameters() if p in o2.state}
    assert steps["c.weight"] == 5.0 and steps["b.weight"] == 7.0 and steps["n.bias"] == 3.0
    assert "a.weight" not in steps
    assert c2[0] == ("fused_adam_", 1)  # b.*, c.weight, n.* are adjacent: one run
    assert all(n <= 3 for _, n in c2)


def test_two_optimizers_share_a_model(calls: List[Tuple[str, int]]) -> None:
    model = make(torch.float32)
    ref = make(torch.float32)
    mixprec.flat_buffers(model)
    opts = []
    for m in (model, ref):
        opts.append((mixprec.optim.SGD([m.a.weight, m.a.bias], lr=0.1, momentum=0.5),
                     mixprec.optim.Adam([m.b.weight, m.b.bias, m.c.weight], lr=1e-2)))
    for _ in range(3):
        for m, (o1, o2) in zip((model, ref), opts):
            m.zero_grad()
            m(torch.ones(2, 5)).sum().backward()
            o1.step()
            o2.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_bitwise_equal(p.detach(), q.detach())
    assert ("fused_sgd_", 1) in calls and ("fused_adam_", 1) in calls


def test_steps_not_shared_when_a_run_splits() -> None:
    """A shared step count is held by exactly the params of one op call."""
    model = make(torch.float32, flat=True)
    opt = mixprec.optim.Adam(model.parameters(), lr=1e-2)
    train(model, opt, 1, set_to_none=True)
    steps = {id(opt.state[p]["step"]) for p in model.parameters()}
    assert len(steps) == 1
    train(model, opt, 1, set_to_none=True, unused_at=(0,))
    by_name = {n: opt.state[p]["step"] for n, p in model.named_parameters()}
    assert by_name["c.weight"] is not by_name["b.weight"]
    assert by_name["a.weight"] is by_name["b.bias"]
    assert float(by_name["c.weight"]) == 1.0 and float(by_name["b.weight"]) == 2.0


# ---------------------------------------------------------------------------------------------
# state_dict: the layout is not part of the checkpoint


def _roundtrip(obj: Any) -> Any:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("saved_flat", [True, False])
def test_state_dict_loads_across_modes(saved_flat: bool,
                                       calls: List[Tuple[str, int]]) -> None:
    def build(flat: bool) -> Tuple[Net, torch.optim.Optimizer]:
        model = make(torch.bfloat16, flat=flat)
        return model, mixprec.optim.AdamW(model.parameters(), lr=1e-2)

    # uninterrupted reference: 6 steps, an unused branch at step 1 (unequal step counts)
    ref, ref_opt = build(False)
    train(ref, ref_opt, 3, set_to_none=True, unused_at=(1,))
    src, src_opt = build(saved_flat)
    train(src, src_opt, 3, set_to_none=True, unused_at=(1,))
    ckpt = _roundtrip({"model": src.state_dict(), "opt": src_opt.state_dict()})
    plain = build(False)[1].state_dict()["param_groups"]
    assert ckpt["opt"]["param_groups"] == plain  # same format
    dst, dst_opt = build(not saved_flat)
    dst.load_state_dict(ckpt["model"])
    dst_opt.load_state_dict(ckpt["opt"])
    train(ref, ref_opt, 3, set_to_none=True, seed=7)
    calls.clear()
    train(dst, dst_opt, 3, set_to_none=True, seed=7)
    assert_same(ref, dst, ref_opt, dst_opt)
    if not saved_flat:  # migrated into flat state: c.weight's count differs, so 3 runs
        assert calls == [("fused_adam_", 3)] * 3
        for p in dst.parameters():
            assert dst_opt.state[p]["exp_avg"]._base is not None


# ---------------------------------------------------------------------------------------------
# torch.compile


def test_compiled_model_forward_backward(calls: List[Tuple[str, int]]) -> None:
    torch._dynamo.reset()
    results = []
    for flat in (False, True):
        model = make(torch.float32)
        fb = mixprec.flat_buffers(model) if flat else None
        compiled = torch.compile(model, backend="aot_eager")
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(3)
        calls.clear()
        for _ in range(3):
            opt.zero_grad()
            compiled(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
            opt.step()
        if fb is not None:
            assert all(p.grad is v for p, v in zip(model.parameters(),
                                                   fb._buffers[0].grad_views))
        results.append((model, opt, list(calls)))
    assert_same(results[0][0], results[1][0], results[0][1], results[1][1])
    assert results[1][2] == [("fused_adam_", 1)] * 3


def test_compiled_optimizer_step_runs_the_detection_eagerly() -> None:
    """coalesce_bucket is torch.compiler.disable'd: a compiled step graph-breaks around it
    and gives the eager results."""
    torch._dynamo.reset()
    results = []
    for flat in (False, True):
        model = make(torch.float32, flat=flat)
        opt = mixprec.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = torch.compile(opt.step, backend="eager")
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(2, 5)).sum().backward()
            step()
        results.append((model, opt))
    assert_same(results[0][0], results[1][0], results[0][1], results[1][1])


@pytest.mark.parametrize("first_step", ["eager", "compiled"])
def test_other_models_buffers_keep_a_plain_step_fullgraph(first_step: str) -> None:
    """A flat model elsewhere in the process: the step of an optimizer over plain params
    still compiles with fullgraph=True (its registry tests are traceable) and equals eager,
    bit for bit."""
    torch._dynamo.reset()
    other = make(torch.float32, seed=5, flat=True)  # noqa: F841 (keeps the registry full)
    results = []
    for compiled in (False, True):
        model = make(torch.float32)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
        step = torch.compile(opt.step, fullgraph=True, backend="eager") if compiled \
            else opt.step
        for it in range(3):
            opt.zero_grad()
            model(torch.ones(2, 5) * (it + 1)).sum().backward()
            (opt.step if first_step == "eager" and it == 0 else step)()
        results.append((model, opt))
    assert_same(results[0][0], results[1][0], results[0][1], results[1][1])
    assert [float(results[1][1].state[p]["step"]) for p in results[1][0].parameters()] \
        == [3.0] * 7


# ---------------------------------------------------------------------------------------------
# DDP (two gloo processes on CPU)

WORLD = 2


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        out: Dict[str, Any] = {}
        for flat in (False, True):
            model = make(torch.float32)
            fb = mixprec.flat_buffers(model) if flat else None
            ddp = DDP(model)
            opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
            g = torch.Generator().manual_seed(10 + rank)
            for _ in range(3):
                opt.zero_grad()
                ddp(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
                opt.step()
            out[f"params{flat}"] = [p.detach().clone() for p in model.parameters()]
            if fb is not None:
                out["views"] = all(p.grad is v for p, v in
                                   zip(model.parameters(), fb._buffers[0].grad_views))
        # wrapped afterwards with gradient_as_bucket_view=True (not detectable here): DDP
        # owns param.grad, every step runs per tensor, the results are still right
        model = make(torch.float32)
        fb = mixprec.flat_buffers(model)
        ddp = DDP(model, gradient_as_bucket_view=True)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(10 + rank)
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            ddp(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
            opt.step()
        out["bucket_view_params"] = [p.detach().clone() for p in model.parameters()]
        out["bucket_view_grads_flat"] = any(p.grad is v for p, v in
                                            zip(model.parameters(), fb._buffers[0].grad_views))
        try:
            mixprec.flat_buffers(DDP(make(torch.float32), gradient_as_bucket_view=True))
            out["refused"] = ""
        except ValueError as exc:
            out["refused"] = str(exc)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(sys.platform == "win32", reason="torch.distributed unavailable")
def test_ddp_gloo_two_ranks() -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        pytest.skip("torch.distributed unavailable")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD, join=True)
        r = [torch.load(os.path.join(tmp, f"rank{k}.pt")) for k in range(WORLD)]
    for k in range(WORLD):
        assert r[k]["views"]
        assert "gradient_as_bucket_view" in r[k]["refused"]
        assert not r[k]["bucket_view_grads_flat"]
        for p, q, b in zip(r[k]["paramsFalse"], r[k]["paramsTrue"], r[k]["bucket_view_params"]):
            assert_bitwise_equal(p, q)
            assert_bitwise_equal(p, b)
    for p, q in zip(r[0]["paramsTrue"], r[1]["paramsTrue"]):  # the ranks agree
        assert_bitwise_equal(p, q)


# ---------------------------------------------------------------------------------------------
# Internals


def test_coalesce_leaves_foreign_and_duplicate_lists_alone() -> None:
    model = make(torch.float32)
    fb = mixprec.flat_buffers(model)
    views = fb._buffers[0].grad_views
    other = torch.zeros(3)
    out = flat_mod.coalesce([views[0], other, views[1], views[2]])
    assert out[0] is other and len(out) == 2 and out[1].dim() == 1
    assert flat_mod.coalesce([views[0], views[0]]) == [views[0], views[0]]
    assert flat_mod.coalesce([views[2], views[0]]) == [views[2], views[0]]  # not adjacent
    whole = flat_mod.coalesce(list(reversed(views)))
    assert len(whole) == 1 and whole[0].numel() == fb._buffers[0].ends[-1]


def test_remove_turns_the_mode_off(calls: List[Tuple[str, int]]) -> None:
    model = make(torch.float32)
    fb = mixprec.flat_buffers(model)
    fb.remove()
    opt = mixprec.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, 2, set_to_none=True)
    assert calls == [("fused_sgd_", 7)] * 2
    mixprec.flat_buffers(model)  # can be applied again
    del fb
    gc.collect()  # the old buffer's collection leaves the new registration alone
    calls.clear()
    train(model, opt, 1, set_to_none=True)
    assert calls == [("fused_sgd_", 1)]



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_stays_zero(dtype: torch.dtype) -> None:
    """The padding between views is inside every coalesced slice: unscaling, the inf check
    and the updates (weight decay, maximize, a folded clip) must leave it zero."""
    model = make(dtype)
    fb = mixprec.flat_buffers(model)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-1, weight_decay=0.5, maximize=True)
    scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
    train(model, opt, 4, set_to_none=True, scaler=scaler, inf_at=(1,), clip=0.1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, sgd, 2, set_to_none=False, scaler=mixprec.GradScaler("cpu"))  # unscale_
    buf = fb._buffers[0]
    pad = torch.ones(buf.numel, dtype=torch.bool)
    for o, e in zip(buf.offsets, buf.ends):
        pad[o:e] = False
    assert pad.any()
    st = opt._mixprec_flat.states[buf]
    for t in [buf.param_data, buf.grad_data, *st.data.values()]:
        assert torch.all(t[pad] == 0), t


def test_registry_empties_when_the_model_dies() -> None:
    """No reference cycle keeps a dead model's buffers registered (the registry being empty
    is what keeps the hooks traceable by torch.compile(fullgraph=True))."""
    gc.collect()
    before = len(flat_layout._PARAMS)
    model = make(torch.float32, flat=True)
    opt = mixprec.optim.AdamW(model.parameters())
    train(model, opt, 2, set_to_none=True)
    assert len(flat_layout._PARAMS) == before + 7
    del model, opt
    assert len(flat_layout._PARAMS) == before  # without gc.collect()


def test_checkpoint_of_flat_optimizer_loads_into_torch_adamw() -> None:
    """One step tensor per param in the state dict: torch's AdamW keeps a loaded step
    tensor as it is and increments each param's once."""
    model = make(torch.float32, flat=True)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 2, set_to_none=True)
    shared = {id(opt.state[p]["step"]) for p in model.parameters()}
    assert len(shared) == 1
    sd = _roundtrip(opt.state_dict())
    assert len({id(s["step"]) for s in sd["state"].values()}) == 7
    assert {id(opt.state[p]["step"]) for p in model.parameters()} == shared  # untouched
    ref = make(torch.float32)
    torch_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    ref.load_state_dict(model.state_dict())
    torch_opt.load_state_dict(sd)
    train(ref, torch_opt, 1, set_to_none=True)
    assert [float(torch_opt.state[p]["step"]) for p in ref.parameters()] == [3.0] * 7


# ---------------------------------------------------------------------------------------------
# The whole-group bucket is kept across steps (FusedOptimizer._reuse) and the scaler's answer
# too (detect._coalesce): one C pass per step, and any change is seen.

def _replace_grad(model: Net) -> None:
    g = model.b.weight.grad
    model.b.weight.grad = g.clone()  # not the view any more


def _replace_data(model: Net) -> None:
    with torch.no_grad():
        model.b.weight.data = model.b.weight.data.clone()


def _replace_state(model: Net, opt: torch.optim.Optimizer, fb: Any) -> None:
    st = opt.state[model.b.weight]
    opt.state[model.b.weight] = {k: (v.clone() if k != "step" else v) for k, v in st.items()}


FLAT_CHANGES: Dict[str, Callable[[Net, torch.optim.Optimizer, Any], None]] = {
    "nothing": lambda m, o, fb: None,
    "grad replaced": lambda m, o, fb: _replace_grad(m),
    "data replaced": lambda m, o, fb: _replace_data(m),
    "buffer removed": lambda m, o, fb: fb.remove() if fb is not None else None,
    "state dict replaced": _replace_state,
    "moment replaced": lambda m, o, fb: o.state[m.a.bias].__setitem__(
        "exp_avg", o.state[m.a.bias]["exp_avg"].clone()),
}


def _spy(inner: Callable[..., Any], hits: List[bool]) -> Callable[..., Any]:
    def reuse(index: int, group: Dict[str, Any]) -> Any:
        out = inner(index, group)
        hits.append(out is not None)
        return out
    return reuse


@pytest.mark.parametrize("change", list(FLAT_CHANGES))
def test_kept_whole_bucket_sees_each_change(calls: List[Tuple[str, int]], change: str) -> None:
    results = []
    for flat in (False, True):
        model = make(torch.float32)
        fb = mixprec.flat_buffers(model) if flat else None
        opt = mixprec.optim.Adam(model.parameters(), lr=1e-2)
        scaler = mixprec.GradScaler("cpu", init_scale=2.0**8)
        hits: List[bool] = []
        opt._reuse = _spy(opt._reuse, hits)  # type: ignore[method-assign]
        calls.clear()
        train(model, opt, 6, set_to_none=False, scaler=scaler,
              between=lambda it, m=model, o=opt, f=fb: FLAT_CHANGES[change](m, o, f)
              if it == 4 else None)
        results.append((model, opt, list(calls), hits))
    (m1, o1, _, _), (m2, o2, c2, hits) = results
    assert_same(m1, m2, o1, o2)  # bitwise: nothing stale was stepped
    assert c2[:8] == [("check_finite_", 1), ("fused_adam_", 1)] * 4  # one slice each
    assert hits[:4] == [False, False, True, True]  # kept from step 2 on
    if change == "nothing":
        assert c2[8:] == [("check_finite_", 1), ("fused_adam_", 1)] * 2 and all(hits[2:])
    else:
        assert not hits[4]  # the step after the change built its lists again
        if change in ("grad replaced", "data replaced", "buffer removed"):
            assert c2[9] != ("fused_adam_", 1)  # and no longer one slice


# The scaler's grads of an all-flat optimizer are kept too (detect.kept_grads): one C pass
# over the params per step instead of collect_grads + coalesce. Each change below must
# give exactly what a fresh collection gives.

def _shrink_grad(model: Net) -> None:
    g = model.b.weight.grad
    g.data = g.data.view(-1)[:3]  # the same view object and data pointer, fewer elements


def _drop_param(model: Net, opt: torch.optim.Optimizer) -> None:
    params = opt.param_groups[0]["params"]
    params[:] = [p for p in params if p is not model.b.bias]


# change -> (what it does, whether the grads are still all flat views after it)
SCALER_CHANGES: Dict[str, Tuple[Callable[[Net, torch.optim.Optimizer, Any], None], bool]] = {
    "nothing": (lambda m, o, fb: None, True),
    "grad replaced": (lambda m, o, fb: _replace_grad(m), False),
    "grad set to None": (lambda m, o, fb: setattr(m.n.bias, "grad", None), True),
    "grad shrunk in place": (lambda m, o, fb: _shrink_grad(m), True),
    "data replaced": (lambda m, o, fb: _replace_data(m), True),
    "buffer removed": (lambda m, o, fb: fb.remove(), False),
    "another model laid out": (lambda m, o, fb: mixprec.flat_buffers(make(torch.float32)),
                               True),
    "param group added": (lambda m, o, fb: o.add_param_group(
        {"params": [nn.Parameter(torch.ones(2))]}), True),
    "param removed from its group": (lambda m, o, fb: _drop_param(m, o), True),
}


def _described(per_device: Dict[torch.device, List[torch.Tensor]]) -> Dict[Any, Any]:
    return {dev: [(t.data_ptr(), t.numel(), t.dtype, t.shape) for t in ts]
            for dev, ts in per_device.items()}


@pytest.mark.parametrize("change", list(SCALER_CHANGES))
def test_scaler_kept_grads_see_each_change(monkeypatch: pytest.MonkeyPatch, change: str
                                           ) -> None:
    from mixprec.amp import grads as amp_grads
    from mixprec.flat import detect

    model = make(torch.float32)
    fb = mixprec.flat_buffers(model)
    # (torch's optimizer: the scaler allows fp16 grads for mixprec's, whatever is asked)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu")
    hits: List[bool] = []
    inner = detect.kept_grads

    def spy(optimizer: Any, allow_fp16: bool) -> Any:
        out = inner(optimizer, allow_fp16)
        hits.append(out is not None)
        return out

    monkeypatch.setattr(flat_mod, "kept_grads", spy)
    train(model, opt, 1, set_to_none=False)
    first = scaler._collect_grads(opt, False)
    assert [len(v) for v in first.values()] == [1]  # one slice of the grad buffer
    first[next(iter(first))].append(torch.ones(1))  # the caller's copy, not the kept one
    again = scaler._collect_grads(opt, False)
    assert hits == [False, True] and _described(again) != _described(first)
    apply, still_flat = SCALER_CHANGES[change]
    apply(model, opt, fb)
    got = scaler._collect_grads(opt, False)
    want = flat_mod.coalesce_grads(amp_grads.collect_grads(opt, False))
    assert _described(got) == _described(want)
    assert hits[2] is (change == "nothing")
    assert _described(scaler._collect_grads(opt, False)) == _described(want)
    assert hits[3] is still_flat  # kept again from the new answer where it is all flat
    assert _described(scaler._collect_grads(opt, True)) == _described(want)
    assert not hits[4]  # allow_fp16 is part of the key


def test_scaler_kept_grads_only_when_all_flat() -> None:
    """A param outside the buffers (a grad replaced) keeps nothing: the scaler's answer is
    then per tensor and built each step."""
    from mixprec.flat import detect

    model = make(torch.float32)
    mixprec.flat_buffers(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu")
    train(model, opt, 1, set_to_none=False)
    scaler._collect_grads(opt, False)
    assert detect.kept_grads(opt, False) is not None
    _replace_grad(model)
    out = scaler._collect_grads(opt, False)
    assert len(next(iter(out.values()))) > 1
    assert detect.kept_grads(opt, False) is None
    assert opt not in detect._KEPT


def test_scaler_kept_grads_with_an_unhashable_optimizer() -> None:
    """An optimizer class with __eq__ and no __hash__ keeps nothing and still works."""

    class Unhashable(torch.optim.SGD):
        def __eq__(self, other: object) -> bool:
            return self is other

    assert Unhashable.__hash__ is None
    model = make(torch.float32)
    mixprec.flat_buffers(model)
    opt = Unhashable(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu")
    losses = train(model, opt, 3, set_to_none=False, scaler=scaler)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert [len(v) for v in scaler._collect_grads(opt, False).values()] == [1]


def test_plain_optimizer_pays_no_pass_for_other_models_buffers(
        monkeypatch: pytest.MonkeyPatch, calls: List[Tuple[str, int]]) -> None:
    """Another model laid out flat: a plain optimizer's reused lists skip the per-param
    any_flat test; laying out its own model later is still seen (new data pointers), and
    the results stay those of a model that never was flat."""
    from mixprec.flat import state as flat_state

    other = make(torch.float32, seed=3, flat=True)  # noqa: F841 (keeps the registry full)
    tested: List[int] = []
    real = flat_state.any_flat

    def spy(params: List[torch.Tensor]) -> bool:
        tested.append(len(params))
        return real(params)

    monkeypatch.setattr(flat_state, "any_flat", spy)
    monkeypatch.setattr(flat_mod, "any_flat", spy)
    results = []
    for lay_out in (False, True):
        model = make(torch.float32)
        opt = mixprec.optim.Adam(model.parameters(), lr=1e-2)
        train(model, opt, 3, set_to_none=False)
        if not lay_out:
            tested.clear()
            train(model, opt, 2, set_to_none=False)
            assert tested == []  # reused lists, no pass
        else:
            mixprec.flat_buffers(model)
            calls.clear()
            train(model, opt, 2, set_to_none=False)
            assert ("fused_adam_", 1) in calls  # seen: one slice of the buffer
        results.append((model, opt))
    (m1, o1), (m2, o2) = results
    assert_same(m1, m2, o1, o2)
