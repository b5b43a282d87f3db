"""The tests' shared helpers, in one module (``from _helpers import ...``).

* Paths: :data:`REPO` (the repository root), :data:`TESTS` (this folder, whatever
  subfolder a test module sits in), :data:`DATA` (tests/data).
* Stored files: :func:`load_stored` (a file of tests/data, listed in :data:`STORED`
  with what in it may be compared bit for bit).
* Devices: :data:`DEVICES` is the one device parametrization. Tests take a
  ``device`` argument and get it from the ``device`` fixture in conftest.py,
  which runs over :data:`DEVICES`; a test that needs a GPU whatever its
  arguments is decorated with :func:`cuda_only`. CUDA cases are skipped only
  where there is no GPU. On a machine with a GPU they always run, and
  conftest.py makes them fail when the build has no CUDA kernels, unless the
  run is the CPU-only build's (``MIXPREC_EXPECT_CUDA_KERNELS=0``).
* Bits: :func:`bits`, :func:`assert_bitwise_equal`, :func:`assert_same_tree`, :func:`ulps`.
* Checkpoints: :func:`saved_and_loaded` (an object through ``torch.save`` and
  ``torch.load(weights_only=True)``).
* Setup: :func:`torch_threads` (a thread count for a block), :func:`load_module`
  (a Python file that is not a package module, e.g. an example).
* GradScaler: :data:`SCALERS` (mixprec's and torch's as a control),
  :func:`two_layer`, :func:`scaling_case`, :class:`RecordingOptimizer`, ...
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, List, Optional, TypeVar

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mixprec

#: the repository root, the tests folder and its data folder (a test module in any
#: subfolder of tests/ names paths from these, never from its own ``__file__``)
REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
DATA = TESTS / "data"

#: The files of tests/data that tests read with :func:`load_stored`, each with what in it a
#: test may compare bit for bit. The rule: **a test compares only bits this machine computed
#: in the same run, or bits mixprec's own kernels wrote and stored** (optimizer state, codes
#: and maxima, counters, the scaler's state). Anything that went through torch's CPU
#: GEMMs or other CPU-dependent arithmetic on the machine that wrote the file (params
#: after training, losses, grad norms) differs between CPUs (Intel and AMD machines,
#: AVX-512 or AVX2): a test checks its keys, dtypes and shapes only, and compares the
#: training it stands for with a run computed here. tests/project/test_stored_data.py
#: holds every ``.pt`` file here to this list and every test to :func:`load_stored`.
STORED = {
    "flat_buffer_checkpoint.pt":
        "optimizer state of the removed flat-buffer mode (bitwise); model params, "
        "'init' and 'continued' through another CPU's GEMMs (form only)",
    "optim8_flat_layout.pt":
        "8-bit codes, maxima and their decoded values from random grads, no GEMM (bitwise)",
    "trainer_automatic_fp16.pt": "a format-1 trainer checkpoint: the state loads bitwise",
    "trainer_manual_bf16.pt": "a format-1 trainer checkpoint: the state loads bitwise",
    "trainer_adaptive_fp16.pt": "a format-1 trainer checkpoint: the state loads bitwise",
    "trainer_automatic_fp16_expected.pt":
        "what that trainer reported at the save (read back, exact); params and stats "
        "after training on through another CPU's GEMMs (form only)",
    "trainer_manual_bf16_expected.pt": "as trainer_automatic_fp16_expected.pt",
    "trainer_adaptive_fp16_expected.pt": "as trainer_automatic_fp16_expected.pt",
}


def load_stored(name: str) -> Any:
    """``torch.load`` (``weights_only=True``) of the file ``tests/data/<name>``, which
    must be listed in :data:`STORED` (read its rule before comparing what it holds)."""
    if name not in STORED:
        raise KeyError(f"tests/data/{name} is not listed in _helpers.STORED: add it there "
                       "with what in it may be compared bit for bit (see the rule above it)")
    return torch.load(DATA / name, weights_only=True)


HAS_CUDA = torch.cuda.is_available()
_NO_GPU = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
_F = TypeVar("_F", bound=Callable[..., Any])

# The device parametrization: CPU always, CUDA whenever a GPU is present.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, _NO_GPU])]


def cuda_only(test: _F) -> _F:
    """Mark a test that needs a GPU: skipped without one, run (and required to
    have CUDA kernels, see conftest.py) with one."""
    return pytest.mark.cuda(_NO_GPU(test))


_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.int32: torch.int32,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (as a same-width integer tensor), for bitwise equality."""
    t = t.contiguous()
    return (t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t).cpu()


def assert_bitwise_equal(
    actual: torch.Tensor, expected: torch.Tensor, msg: str = "", *, any_nan_payload: bool = False
) -> None:
    """Bit-for-bit equality (``msg`` says what is compared); with ``any_nan_payload``, NaNs
    need only sit at the same places (float->bf16 conversions in different code paths
    canonicalise NaN payloads differently)."""
    where = f"{msg}: " if msg else ""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{where}{actual.dtype} {list(actual.shape)} against {expected.dtype} "
        f"{list(expected.shape)}")
    if any_nan_payload:
        nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
        assert torch.equal(nan_a, nan_e), f"{where}NaNs at different positions"
        actual = actual.masked_fill(nan_a, 0)
        expected = expected.masked_fill(nan_e, 0)
    assert torch.equal(bits(actual), bits(expected)), (
        f"{where}not bitwise equal: max abs diff "
        f"{(actual.double() - expected.double()).abs().nan_to_num(0).max().item()}"
    )


def assert_same_tree(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts, lists and tuples of tensors and plain values equal: the same keys and
    lengths, tensors bit for bit (:func:`assert_bitwise_equal`), NaN floats as NaN, other
    values ``==``; ``where`` names the path of a difference (``state.exp_avg[2]``)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert_bitwise_equal(a.cpu(), b.cpu(), msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, where
    else:
        assert a == b, (where, a, b)


def saved_and_loaded(obj: Any) -> Any:
    """``obj`` through ``torch.save`` into memory and back with ``torch.load(weights_only=True)``
    (what a checkpoint file gives back)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


class HostReads(TorchDispatchMode):
    """Records the ops that read a device value on the host (``aten::_local_scalar_dense``,
    ``aten::item``) while it is entered: ``ops`` lists their names in order."""

    READS = ("aten::_local_scalar_dense", "aten::item")

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func._schema.name in self.READS:
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))


# GradScaler behaviour shared with torch is parametrized over both scaler classes,
# so each such test also runs against torch.amp.GradScaler as a control.
SCALERS = [
    pytest.param(mixprec.GradScaler, id="mixprec"),
    pytest.param(torch.amp.GradScaler, id="torch"),
]

INF = float("inf")
NAN = float("nan")


def make_scaler(cls: type, device: str, **kwargs: Any) -> torch.amp.GradScaler:
    return cls(device, **kwargs)


def two_layer(device: str, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device)


def scaling_case(
    device: str,
    optimizer_ctor: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
    optimizer_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
) -> tuple[Any, ...]:
    """A control model and an identical model to train with scaling, their
    optimizers, 4 batches of random data, the loss and the iteration (2) at
    which an inf is injected."""
    kwargs = {"lr": 1.0} if optimizer_kwargs is None else optimizer_kwargs
    control = two_layer(device, seed)
    scaling = copy.deepcopy(control)
    opt_control = optimizer_ctor(control.parameters(), **kwargs)
    opt_scaling = optimizer_ctor(scaling.parameters(), **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    data = [
        (torch.randn(8, 8, generator=g).to(device), torch.randn(8, 8, generator=g).to(device))
        for _ in range(4)
    ]
    return control, scaling, opt_control, opt_scaling, data, torch.nn.MSELoss(), 2


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module, atol: float, rtol: float = 1e-5):
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=rtol)
        if pa.grad is not None or pb.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, atol=atol, rtol=rtol)


def assert_same_opt_state(oa: torch.optim.Optimizer, ob: torch.optim.Optimizer, atol: float):
    for pa, pb in zip(
        [p for g in oa.param_groups for p in g["params"]],
        [p for g in ob.param_groups for p in g["params"]],
    ):
        sa, sb = oa.state[pa], ob.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], atol=atol, rtol=1e-5)


class RecordingOptimizer(torch.optim.SGD):
    """SGD that records its step calls and supports AMP scaling itself.

    With ``supports_amp=True`` it plays a fused optimizer: it reads
    ``self.grad_scale``/``self.found_inf`` at step time, unscales, and skips the
    update when found_inf is set (on the device, no sync).
    """

    def __init__(self, params: Any, supports_amp: bool = False, **kwargs: Any) -> None:
        super().__init__(params, lr=kwargs.pop("lr", 0.1), **kwargs)
        self.calls: list[dict[str, Any]] = []
        if supports_amp:
            self._step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Any = None, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        gs = getattr(self, "grad_scale", "absent")
        fi = getattr(self, "found_inf", "absent")
        self.calls.append(
            {
                "closure": closure,
                "args": args,
                "kwargs": kwargs,
                "grad_scale": gs.clone() if isinstance(gs, torch.Tensor) else gs,
                "found_inf": fi.clone() if isinstance(fi, torch.Tensor) else fi,
            }
        )
        if getattr(self, "_step_supports_amp_scaling", False):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad if gs is None or gs == "absent" else p.grad / gs
                    if isinstance(fi, torch.Tensor):
                        g = torch.where(fi != 0, torch.zeros_like(g), g)
                    p.add_(g, alpha=-group["lr"])
            return "stepped"
        super().step()
        return "stepped"


# ---------------------------------------------------------------- optimizers
# Edge sizes: empty, scalar, below/above one vector, a chunk boundary, 2-D,
# and a non-contiguous (transposed) param.
OPTIM_SHAPES = [(0,), (), (1,), (7,), (33,), (300,), (17, 31)]


def optim_params(device: str, dtype: torch.dtype, gen: torch.Generator,
            transposed: bool = True) -> List[torch.nn.Parameter]:
    ps = [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in OPTIM_SHAPES]
    if transposed:
        ps.append(torch.randn(9, 13, generator=gen).to(device=device, dtype=dtype).t())
    return [torch.nn.Parameter(p) for p in ps]


def set_grads(params: List[torch.Tensor], gen: torch.Generator,
               dtype: Optional[torch.dtype] = None, scale: float = 1.0) -> None:
    for p in params:
        g = torch.randn(p.shape, generator=gen) * scale
        assign_grad(p, g.to(device=p.device, dtype=dtype or p.dtype))


def assign_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    if g.dtype != p.dtype and hasattr(p, "grad_dtype"):
        p.grad_dtype = None  # newer torch checks grad dtypes; allow any
    p.grad = g


def rel_err(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> float:
    """max |a - b| relative to the tensor's magnitude: max(|b|), and at least
    `scale` (the magnitude the params started at: after many steps a value
    that drifted towards 0 carries the absolute rounding error of the larger
    values it was computed from)."""
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    if a64.numel() == 0:
        return 0.0
    return float((a64 - b64).abs().max() / max(float(b64.abs().max()), scale))


def snapshot_optimizer(opt: torch.optim.Optimizer) -> List[torch.Tensor]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            out.append(p.detach().clone())
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    out.append(v.detach().clone())
    return out


def all_bitwise_equal(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        xb = x.reshape(-1).view(torch.uint8) if x.numel() else x
        yb = y.reshape(-1).view(torch.uint8) if y.numel() else y
        if not torch.equal(xb.cpu(), yb.cpu()):
            return False
    return True


def assert_within_one_ulp(x: torch.Tensor, y: torch.Tensor) -> None:
    """Equal, or one unit in the last place apart, elementwise (same dtype and shape)."""
    assert x.dtype == y.dtype and x.shape == y.shape
    if x.numel() == 0 or torch.equal(x, y):
        return
    ints = {4: torch.int32, 2: torch.int16}[x.element_size()]
    bits_x = x.contiguous().view(ints).long()
    bits_y = y.contiguous().view(ints).long()
    assert int((bits_x - bits_y).abs().max()) <= 1


def ulps(x: torch.Tensor, y: torch.Tensor) -> int:
    """Largest distance in units in the last place between two same-dtype tensors."""
    assert x.dtype == y.dtype and x.shape == y.shape
    if x.numel() == 0:
        return 0
    ints = {4: torch.int32, 2: torch.int16}[x.element_size()]
    bx = x.contiguous().view(ints).long()
    by = y.contiguous().view(ints).long()
    # map sign-magnitude bit patterns onto a monotonic integer line
    sign = {4: 1 << 31, 2: 1 << 15}[x.element_size()]
    bx = torch.where(bx < 0, -(bx + sign), bx)
    by = torch.where(by < 0, -(by + sign), by)
    return int((bx - by).abs().max())


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``n``, restored after."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def load_module(name: str, path: Path) -> ModuleType:
    """Import the Python file ``path`` as a fresh module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runnable_blocks(text: str) -> List[str]:
    """The code of the fenced blocks marked ``<!-- runnable -->`` on the line before."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == "<!-- runnable -->" and i + 1 < len(lines) and \
                lines[i + 1].startswith("```python"):
            j = i + 2
            while not lines[j].startswith("```"):
                j += 1
            blocks.append("\n".join(lines[i + 2:j]))
            i = j
        i += 1
    return blocks


def scaled_grad_params(device: str, dtypes: List[torch.dtype],
                       seed: int = 0) -> List[torch.nn.Parameter]:
    """One param per dtype (shape ``(5 + k, 3)``) on ``device``, each with a grad scaled by
    1024 (a scaler's loss scale), from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    ps = []
    for k, dt in enumerate(dtypes):
        p = torch.nn.Parameter(torch.randn(5 + k, 3, generator=g).to(device, dt))
        p.grad = (torch.randn(5 + k, 3, generator=g) * 1024).to(device, dt)
        ps.append(p)
    return ps
