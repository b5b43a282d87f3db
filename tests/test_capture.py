"""mixprec.capture without a GPU: no sync, replay invariance, the CPU replay harness
(tests/_replay.py) against eager training, checkpoints between replays, and the clear
errors of what cannot be captured. The GPU proof is tools/gpu_capture_check.py."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from torch import Tensor

import mixprec
from _replay import OpLog, record
from mixprec.capture import CaptureError, SyncDetector, capture_step, persistent_tensors

IN, HID, OUT, B = 16, 32, 8, 4

# name -> (param dtype, autocast dtype or None, scaler, optimizer kwargs, clip, micro-batches)
VARIANTS: Dict[str, Any] = {
    "fp32": (torch.float32, None, False, {}, None, 1),
    "fp16_masters_scaler": (torch.float16, torch.float16, True, {"master_weights": True}, None, 1),
    "bf16_masters": (torch.bfloat16, torch.bfloat16, False, {"master_weights": True}, None, 1),
    "bf16_8bit": (torch.bfloat16, torch.bfloat16, True,
                  {"state_bits": 8, "min_8bit_size": 256}, None, 1),
    "bf16_split16": (torch.bfloat16, torch.bfloat16, False, {"master_correction_bits": 16},
                     None, 1),
    "bf16_8bit_split8": (torch.bfloat16, torch.bfloat16, True,
                         {"state_bits": 8, "min_8bit_size": 256, "master_correction_bits": 8},
                         1.0, 1),
    "bf16_sr": (torch.bfloat16, torch.bfloat16, False,
                {"master_weights": False, "stochastic_rounding": True, "seed": 3}, None, 1),
    "fp16_clip": (torch.float16, torch.float16, True, {}, 1.0, 1),
    "fp16_accum3": (torch.float16, torch.float16, True, {}, 0.5, 3),
}
OVERFLOW_STEPS = {6, 13, 27, 28, 41}


class Setup:
    """A tiny model, a mixprec AdamW, maybe a scaler, a StepLR, and the step body as a
    user writes it."""

    def __init__(self, variant: str, seed: int = 0, body: Optional[Callable[..., Any]] = None
                 ) -> None:
        dtype, self.amp, use_scaler, okw, self.clip, self.k = VARIANTS[variant]
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.ReLU(),
                                         torch.nn.Linear(HID, OUT)).to(dtype)
        self.opt = mixprec.optim.AdamW(self.model.parameters(), lr=1e-2, **okw)
        self.scaler = (mixprec.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
                       if use_scaler else None)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=7, gamma=0.7)
        self.scales_inf = use_scaler
        self.body = body or self.step_body

    def step_body(self, x: Tensor, y: Tensor) -> Tensor:
        opt, scaler = self.opt, self.scaler
        opt.zero_grad(set_to_none=False)
        total = torch.zeros((), dtype=torch.float32)
        for i in range(self.k):
            with torch.autocast("cpu", dtype=self.amp or torch.bfloat16,
                                enabled=self.amp is not None):
                out = self.model(x[i])
            loss = torch.nn.functional.mse_loss(out.float(), y[i]) / self.k
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = total + loss.detach()
        if self.clip is not None:
            if scaler is not None:
                scaler.clip_grad_norm_(opt, self.clip)
            else:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        return total

    def batches(self, n: int, seed: int = 1) -> List[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for s in range(n):
            x = torch.randn(self.k, B, IN, generator=g)
            y = torch.randn(self.k, B, OUT, generator=g)
            if self.scales_inf and s in OVERFLOW_STEPS:
                x[0, 0, 0] = float("inf")
            out.append((x, y))
        return out

    def state(self) -> List[Tensor]:
        """Every persistent tensor, cloned, in a fixed order."""
        return [t.detach().clone() for _, t in
                persistent_tensors([self.opt], self.scaler, [self.model])]

    def capture(self, **kw: Any) -> Any:
        x, y = self.batches(1)[0]
        return capture_step(self.body, (x, y), optimizers=[self.opt], scaler=self.scaler,
                            modules=[self.model], **kw)


def assert_same(a: List[Tensor], b: List[Tensor], what: str) -> None:
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (what, i)
        xb = x.reshape(-1).view(torch.uint8) if x.dtype != torch.bool else x
        yb = y.reshape(-1).view(torch.uint8) if y.dtype != torch.bool else y
        assert torch.equal(xb, yb), f"{what}: tensor {i} differs"


# --------------------------------------------------------------------------- no sync

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_host_sync_per_step(variant: str) -> None:
    """0 sync ops per whole step (after 3 warm-up steps), overflow and growth steps
    included. Caught when planted: a loss.item() in the body (test_sync_in_body_is_refused);
    the detector itself: test_detector_counts_each_kind_of_sync."""
    s = Setup(variant)
    data = s.batches(12)
    for x, y in data[:3]:
        s.body(x, y)
        s.sched.step()
    counts = []
    for x, y in data[3:]:
        with SyncDetector() as det:
            s.body(x, y)
        s.sched.step()
        counts.append(det.count)
    assert counts == [0] * len(counts), [str(e) for e in det.events]


@pytest.mark.parametrize("sync", [
    lambda t, m: t.sum().item(),
    lambda t, m: bool(t.sum()),
    lambda t, m: t[m],
    lambda t, m: torch.equal(t, t),
    lambda t, m: t.nonzero(),
    lambda t, m: t.unique(),
    lambda t, m: torch.zeros(2, device="meta").to("cpu") if False else t.sum() > 0 and None,
], ids=["item", "bool", "mask_index", "equal", "nonzero", "unique", "bool_of_compare"])
def test_detector_counts_each_kind_of_sync(sync: Callable[..., Any]) -> None:
    """Each kind is seen (one at a time, so that a missed kind fails alone). (CPU
    ``tolist()`` reads memory without an op; on CUDA it copies to the host first, which
    the copy rule counts.)"""
    t = torch.ones(3)
    mask = t > 0
    with SyncDetector() as det:
        sync(t, mask)
    assert det.count >= 1
    with SyncDetector() as quiet:
        (t * 2).add_(1).sum()
        torch.where(mask, t, -t)
    assert quiet.count == 0


@torch.library.custom_op("mixprec_test::with_size", mutates_args=())
def _with_size(t: Tensor) -> Tuple[Tensor, int]:
    return t * 2, t.shape[0]


@_with_size.register_fake
def _(t: Tensor) -> Tuple[Tensor, int]:
    return torch.empty_like(t), t.shape[0]


def test_an_op_returning_a_size_is_not_a_sync() -> None:
    """An int an op returns is a size it knows on the host, not a device read (cuDNN
    attention returns its max sequence lengths so: counted as syncs, they would make
    every attention model uncapturable)."""
    with SyncDetector() as det:
        torch.ops.mixprec_test.with_size(torch.ones(3))
    assert det.count == 0, [str(e) for e in det.events]


# --------------------------------------------------------------------------- harness

def _run_eager(s: Setup, data: List[Any]) -> List[List[Tensor]]:
    states = []
    for x, y in data:
        loss = s.body(x, y)
        s.sched.step()
        states.append(s.state() + [loss.detach().clone()])
    return states


def _run_replayed(s: Setup, data: List[Any]) -> List[List[Tensor]]:
    """capture_step's phases on CPU (warm-up, checked step), then the step recorded once
    (a real step, as the replay right after a CUDA capture is) and replayed on static
    inputs; capture_step's prepare() before every call, as on CUDA."""
    step = s.capture(warmup=2)
    states = []
    static: Optional[tuple[Tensor, Tensor]] = None
    trace = None
    for n, (x, y) in enumerate(data):
        if n < 3:
            loss = step(x, y)
        else:
            step.prepare()
            if trace is None:
                static = (x.clone(), y.clone())
                trace, loss = record(s.body, *static)
            else:
                assert static is not None
                static[0].copy_(x)
                static[1].copy_(y)
                loss = trace.replay()
        s.sched.step()
        states.append(s.state() + [loss.detach().clone()])
    return states


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_replay_equals_eager_50_steps(variant: str) -> None:
    """Recorded-and-replayed steps equal eager training bit for bit over 50 steps (with
    forced overflows where there is a scaler, scale growth every 5 clean steps, an lr
    changed by StepLR every 7). Caught when planted: prepare() not filling the lr (then
    the lr stays at its value at recording: fails from step 7), the planted defects of
    test_harness_catches_*."""
    a, b = Setup(variant), Setup(variant)
    data = a.batches(50)
    eager, replayed = _run_eager(a, data), _run_replayed(b, data)
    for n, (x, y) in enumerate(zip(eager, replayed)):
        assert_same(x, y, f"{variant} step {n}")
    if a.scaler is not None:
        assert a.scaler.stats().skipped_steps == len(OVERFLOW_STEPS)
        st = b.scaler.stats()
        assert (st.steps, st.skipped_steps) == (50, len(OVERFLOW_STEPS))
        assert st.scale_increases == a.scaler.stats().scale_increases > 0
        assert st.last_overflow_step == max(OVERFLOW_STEPS)


def _manual_sgd_float_lr(s: Setup) -> Callable[..., Any]:
    def body(x: Tensor, y: Tensor) -> Tensor:
        s.opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(s.model(x[0]), y[0])
        loss.backward()
        lr = s.opt.param_groups[0]["lr"]  # PLANTED: a host float baked into the step
        with torch.no_grad():
            for p in s.model.parameters():
                p.add_(p.grad, alpha=-lr)
        return loss.detach()
    return body


def _realloc_momentum(s: Setup) -> Callable[..., Any]:
    bufs: Dict[int, Tensor] = {}

    def body(x: Tensor, y: Tensor) -> Tensor:
        s.opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(s.model(x[0]), y[0])
        loss.backward()
        with torch.no_grad():
            for p in s.model.parameters():
                old = bufs.get(id(p), torch.zeros_like(p))
                bufs[id(p)] = buf = old * 0.9 + p.grad  # PLANTED: a new tensor every step
                p.sub_(buf, alpha=0.01)
        return loss.detach()
    return body


@pytest.mark.parametrize("planted", [_manual_sgd_float_lr, _realloc_momentum])
def test_harness_catches_planted_defects(planted: Callable[..., Any]) -> None:
    """The harness is not vacuous: a Python float lr baked into the step (the scheduler's
    change does not reach the replay), and a state tensor rebuilt every step (the replay
    keeps reading the recorded one) both make replay != eager."""
    a, b = Setup("fp32"), Setup("fp32")
    a.body, b.body = planted(a), planted(b)
    data = a.batches(20)
    eager = _run_eager(a, data)
    # (the harness alone: the rebuilt buffers live in the body's own dict, which
    # capture_step's storage check does not see -- a documented limit)
    trace, static = None, (data[0][0].clone(), data[0][1].clone())
    replayed = []
    for x, y in data:
        static[0].copy_(x)
        static[1].copy_(y)
        loss = record(b.body, *static)[1] if trace is None else trace.replay()
        if trace is None:
            trace = record(b.body, *static)[0]  # record the second step instead
        b.sched.step()
        replayed.append(b.state() + [loss.detach().clone()])
    with pytest.raises(AssertionError):
        for n, (x, y) in enumerate(zip(eager, replayed)):
            assert_same(x, y, f"step {n}")


# --------------------------------------------------------------------------- invariance

def _storages(s: Setup) -> Dict[int, str]:
    return {t.untyped_storage().data_ptr(): name
            for name, t in persistent_tensors([s.opt], s.scaler, [s.model])}


def test_replay_invariance_ops_and_storages() -> None:
    """The op sequence and the storages of every persistent tensor are the same at every
    step: across an overflow step, a scale growth, a scheduler's lr change and a
    checkpoint load (optimizer, scaler and model state dicts) between calls. Caught when
    planted: prepare() not copying loaded state back (the loaded step's ops touch new
    storages); the lr fill moved into the step (an extra fill_ on the lr change step)."""
    s = Setup("fp16_accum3")
    step = s.capture(warmup=1)
    data = s.batches(30)
    for x, y in data[:2]:
        step(x, y)
    names0 = dict(persistent_tensors([s.opt], s.scaler, [s.model]))
    ptrs0 = {n: t.data_ptr() for n, t in names0.items()}
    ckpt = None
    logs = []
    for n, (x, y) in enumerate(data[2:], start=2):
        if n == 10:
            ckpt = copy.deepcopy((s.model.state_dict(), s.opt.state_dict(),
                                  s.scaler.state_dict()))
        if n == 20:
            assert ckpt is not None
            s.model.load_state_dict(ckpt[0])
            s.opt.load_state_dict(ckpt[1])
            s.scaler.load_state_dict(ckpt[2])
        step.prepare()
        with OpLog(_storages(s)) as oplog:
            step.fn(x, y)
        s.sched.step()
        logs.append(oplog.ops)
        now = {name: t.data_ptr() for name, t in persistent_tensors([s.opt], s.scaler,
                                                                      [s.model])}
        assert now == ptrs0, f"step {n}: storages moved"
    for n, ops in enumerate(logs[1:], start=3):
        assert ops == logs[0], f"step {n}: the ops differ from step 2's"
    st = s.scaler.stats()
    assert st.skipped_steps >= 2 and st.scale_increases >= 1


def test_checkpoint_load_between_replays_continues_bit_for_bit() -> None:
    """Save at step 10, train on to 16, load, train 10..20 again: equal to 20 straight
    steps, bit for bit, with replays (prepare() copies the loaded optimizer state into
    the captured storages). Caught when planted: no copy-back in prepare() (the replay
    runs on the stale storages and differs)."""
    a, b = Setup("fp16_masters_scaler"), Setup("fp16_masters_scaler")
    data = a.batches(20)
    straight = _run_eager(a, data)[-1]
    step = b.capture(warmup=1)
    trace = static = None
    ckpt = None

    def one(n: int) -> Tensor:
        nonlocal trace, static
        x, y = data[n]
        if n < 2:
            return step(x, y)
        step.prepare()
        if trace is None:
            static = (x.clone(), y.clone())
            trace, loss = record(b.body, *static)
            return loss
        assert static is not None
        static[0].copy_(x)
        static[1].copy_(y)
        return trace.replay()

    for n in range(10):
        one(n)
        b.sched.step()
    ckpt = copy.deepcopy((b.model.state_dict(), b.opt.state_dict(), b.scaler.state_dict(),
                          b.sched.state_dict()))
    for n in range(10, 16):
        one(n)
        b.sched.step()
    b.model.load_state_dict(ckpt[0])
    b.opt.load_state_dict(ckpt[1])
    b.scaler.load_state_dict(ckpt[2])
    b.sched.load_state_dict(ckpt[3])
    for n in range(10, 20):
        loss = one(n)
        b.sched.step()
    assert_same(straight, b.state() + [loss.detach().clone()], "after the load")


# --------------------------------------------------------------------------- errors

def _expect(match: str, fn: Callable[[], Any]) -> None:
    with pytest.raises(CaptureError, match=match):
        fn()


def test_non_mixprec_optimizer_with_scaler_is_refused() -> None:
    s = Setup("fp16_masters_scaler")
    s.opt = torch.optim.AdamW(s.model.parameters(), lr=1e-3)
    _expect("not a mixprec optimizer", s.capture)


def test_torch_optimizer_without_capturable_is_refused() -> None:
    s = Setup("fp32")
    s.opt = torch.optim.Adam(s.model.parameters(), lr=1e-3)
    _expect("capturable", s.capture)
    s.opt = torch.optim.Adam(s.model.parameters(), lr=1e-3, capturable=True)
    s.capture()  # accepted


def _body_with(s: Setup, what: str) -> Callable[..., Any]:
    def body(x: Tensor, y: Tensor) -> Tensor:
        s.opt.zero_grad(set_to_none=(what == "set_to_none"))
        loss = torch.nn.functional.mse_loss(s.model(x[0]), y[0])
        if what == "item":
            print_me = loss.item()  # noqa: F841
        loss.backward()
        s.opt.step()
        if what == "scheduler":
            s.sched.step()
        return loss.detach()
    return body


@pytest.mark.parametrize("what,match", [
    ("item", r"syncs with the host.*_local_scalar_dense.*test_capture.py"),
    ("set_to_none", r"zero_grad\(set_to_none=True\)"),
    ("scheduler", r"LR scheduler"),
])
def test_checked_step_names_the_cause(what: str, match: str) -> None:
    """Each would make a replay silently wrong; the checked call raises naming it (and the
    user's line for a sync). Reverting a check (e.g. the grads' storage comparison) makes
    the matching case fail."""
    s = Setup("fp32")
    s.body = _body_with(s, what)
    step = s.capture(warmup=1, schedulers=[s.sched])
    x, y = s.batches(1)[0]
    step(x, y)  # warm-up: runs
    _expect(match, lambda: step(x, y))


def test_missing_update_is_refused() -> None:
    s = Setup("fp16_masters_scaler")

    def body(x: Tensor, y: Tensor) -> None:
        s.opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.float16):
            out = s.model(x[0])
        s.scaler.scale(out.float().sum()).backward()
        s.scaler.step(s.opt)

    s.body = body
    step = s.capture(warmup=0)
    _expect("scaler.update", lambda: step(*s.batches(1)[0]))


def test_enclosing_autocast_cache_is_refused() -> None:
    s = Setup("fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _expect("autocast", s.capture)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        s.capture()


def test_distributed_setups_are_refused() -> None:
    s = Setup("fp16_masters_scaler")
    s.scaler._process_group = object()
    _expect("process_group", s.capture)


def test_several_shapes_are_several_steps_sharing_a_pool() -> None:
    """One graph per captured step: another input shape raises naming both signatures;
    a second step for it shares the first one's pool and trains the same model."""
    s = Setup("fp32")
    x, y = s.batches(1)[0]
    step = s.capture(warmup=0)
    step(x, y)
    _expect(r"inputs\[0\]: expected torch.float32 \[1, 4, 16\] on cpu .*got torch.float32 "
            r"\[1, 2, 16\]", lambda: step(x[:, :2], y[:, :2]))
    short = capture_step(s.body, (x[:, :2], y[:, :2]), optimizers=[s.opt], scaler=s.scaler,
                         modules=[s.model], warmup=0, pool=step.pool)
    assert short.pool is step.pool
    before = s.state()
    short(x[:, :2], y[:, :2])
    assert short.calls == 1 and s.state()[0].ne(before[0]).any()


def test_baked_setting_change_raises_naming_it() -> None:
    """A module's train/eval flag (or weight_decay, tests/test_capture_refusals.py) changed
    between calls: the next call raises naming it, before anything runs."""
    s = Setup("fp32")
    step = s.capture(warmup=0)
    x, y = s.batches(1)[0]
    step(x, y)
    s.model.eval()
    before = s.state()
    _expect(r"what the graph bakes in changed since the checked call: modules\[0\].training "
            "True -> False", lambda: step(x, y))
    assert_same(before, s.state(), "nothing ran")
    s.model.train()
    s.model[0].eval()  # a submodule's flag: seen by the full walk after a load
    s.opt.load_state_dict(s.opt.state_dict())
    _expect(r"modules\[0\].0.training True -> False", lambda: step(x, y))


def test_lr_reaches_the_captured_tensor_in_place() -> None:
    """A host lr change (scheduler) and an optimizer load both land in the lr tensor
    captured at the checked step, by fill_ (the optimizer keeps that tensor)."""
    s = Setup("fp32")
    step = s.capture(warmup=0)
    x, y = s.batches(1)[0]
    step(x, y)
    (_, lr_t), = [(k, t) for k, (_, t) in s.opt._lr_cache.items()]
    s.opt.param_groups[0]["lr"] = 0.125
    step.prepare()
    assert lr_t.item() == 0.125
    s.opt.load_state_dict(copy.deepcopy(s.opt.state_dict()))
    s.opt.param_groups[0]["lr"] = 0.25
    step.prepare()
    assert lr_t.item() == 0.25 and s.opt._lr_cache[(0, torch.device("cpu"))][1] is lr_t
