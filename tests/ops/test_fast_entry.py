"""The eager fast entry as one seam with one switch.

``mixprec._C.fast_<op>`` (csrc/python_entry/fast_call.h) is the only part of mixprec that reads
CPython and torch-binding internals. ``MIXPREC_FAST_ENTRY=0``, read once at import,
routes every op through ``torch.ops.mixprec.*`` instead. These tests prove:

- a representative run (every kind of op, optimizer steps with FP32 masters, scaler
  iterations with clipping and a skipped step) gives the same bits with the switch off as
  with it on, and the switch decides which entry the ops take;
- no C++ source outside the fast entry reads those internals (a grep of csrc/).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch

from _helpers import REPO, assert_bitwise_equal

ROOT = REPO
CSRC = ROOT / "csrc"
#: The fast entry, the one file allowed to read CPython / torch-binding internals.
ALLOWED = {"python_entry/fast_call.h"}

# One run: ops, optimizer steps and scaler iterations; the results and which fast
# entries were called (each mixprec._C.fast_<op> wrapped by a counter) go to argv[1].
SCRIPT = r"""
import sys

import torch

import mixprec
from mixprec import _extension

calls = {}
ext = _extension.EXT
for name in ext.op_names:
    def spy(*a, _real=getattr(ext, "fast_" + name), _name=name):
        calls[_name] = calls.get(_name, 0) + 1
        return _real(*a)
    setattr(ext, "fast_" + name, spy)

torch.manual_seed(0)
out = {}
g = [torch.randn(37) * 8, (torch.randn(5, 3) * 8).half(), (torch.randn(70) * 8).bfloat16(),
     torch.randn(40)[::2]]
found, inv = torch.zeros(()), torch.full((), 0.125)
mixprec.ops.unscale_and_check_(g, found, inv)
out["unscale"] = g + [found]
out["norm"] = [mixprec.ops.unscale_and_norm_(g, torch.zeros(()), torch.full((), 0.5), 2.0),
               mixprec.ops.check_finite_and_norm_(g, torch.zeros(()), inv, 1.0)]
f2 = torch.zeros(())
mixprec.ops.check_finite_(g + [torch.tensor([float("inf")])], f2)
scale, tracker = torch.full((), 1024.0), torch.zeros((), dtype=torch.int32)
mixprec.ops.update_scale_(scale, tracker, f2, 2.0, 0.5, 2)
out["scale"] = [f2, scale, tracker]

def train(opt_cls, dtype, clip, **kw):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(dtype)
    opt = opt_cls(model.parameters(), **kw)
    scaler = mixprec.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    x, y = torch.randn(32, 8, dtype=dtype), torch.randn(32, 4, dtype=dtype)
    for step in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y).float()
        if step == 2:
            loss = loss * float("inf")  # a skipped step
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return [p.detach() for p in model.parameters()] + state + [scaler.scale_tensor()]

out["adamw"] = train(mixprec.optim.AdamW, torch.float32, False, lr=1e-2, weight_decay=0.1)
out["adamw_bf16"] = train(mixprec.optim.AdamW, torch.bfloat16, True, lr=1e-2)
out["sgd_fp16"] = train(mixprec.optim.SGD, torch.float16, False, lr=1e-2, momentum=0.9)
out["adamw8"] = train(mixprec.optim.AdamW8bit, torch.float32, False, lr=1e-2,
                      min_8bit_size=1)
torch.save({"out": out, "calls": calls}, sys.argv[1])
"""


def _run(tmp_path: Path, switch: str) -> Dict[str, Any]:
    path = tmp_path / f"fast_entry_{switch}.pt"
    env = dict(os.environ, MIXPREC_FAST_ENTRY=switch)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests")] + [p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(path)


def _flat(x: Any) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in _flat(x[k])]
    return [t for v in x for t in _flat(v)]


def test_switch_off_gives_the_same_bits_through_torch_ops(tmp_path: Path) -> None:
    on, off = _run(tmp_path, "1"), _run(tmp_path, "0")
    # the switch decides the entry: on, every op of the run came through its fast entry;
    # off, none did
    used = {"unscale_and_check_", "unscale_and_norm_", "check_finite_",
            "check_finite_and_norm_", "update_scale_", "fused_adam_", "fused_sgd_",
            "fused_adam8_"}
    assert used <= set(on["calls"]), on["calls"]
    assert off["calls"] == {}
    a, b = _flat(on["out"]), _flat(off["out"])
    assert len(a) == len(b) and len(a) > 30
    for x, y in zip(a, b):
        assert_bitwise_equal(x, y)


def test_the_switch_is_read_once_at_import() -> None:
    from mixprec import _extension

    assert _extension.FAST_ENTRY is (os.environ.get("MIXPREC_FAST_ENTRY", "1").strip().lower()
                                     not in ("0", "false", "no", "off"))


# What reads CPython or torch-binding internals: the Python tensor's C struct and its
# unpacking, borrowed list/tuple items, an object's type slot, raw member offsets, and raw
# reads of a TensorImpl's memory (a cast of unsafeGetTensorImpl() to bytes, prefetches).
# (LibTorch idioms -- unsafeGetTensorImpl() as a map key, bump_version() -- are fine.)
FORBIDDEN = [
    r"THPVariable_",
    r"PyList_GET_ITEM",
    r"PyTuple_GET_ITEM",
    r"Py_TYPE\(",
    r"\bob_item\b",
    r"\boffsetof\s*\(",
    r"__builtin_prefetch",
    r"reinterpret_cast<\s*(?:const\s+)?(?:char|uint8_t|std::byte|unsigned char)\s*\*\s*>"
    r"\s*\([^;]*unsafeGetTensorImpl",
]


def _internals_outside_the_fast_entry(root: Path) -> List[str]:
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or path.suffix not in (".h", ".cpp", ".cu", ".cuh", ".in"):
            continue
        if rel in ALLOWED:
            continue
        text = path.read_text()
        for pattern in FORBIDDEN:
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"csrc/{rel}:{line}: {m.group(0)[:60]}")
    return found


def test_only_the_fast_entry_reads_python_internals() -> None:
    assert _internals_outside_the_fast_entry(CSRC) == []


def test_the_grep_finds_what_it_looks_for(tmp_path: Path) -> None:
    # each pattern, planted in a file outside the fast entry, is found
    planted = tmp_path / "cuda" / "x.h"
    planted.parent.mkdir()
    planted.write_text(
        "PyObject* o = PyList_GET_ITEM(l, 0);\nTHPVariable_Unpack(o);\n"
        "PyTuple_GET_ITEM(t, 1); Py_TYPE(o); ((PyListObject*)l)->ob_item;\n"
        "offsetof(THPVariable, cdata);\n__builtin_prefetch(p);\n"
        "const char* impl =\n    reinterpret_cast<const char*>(ts[i].unsafeGetTensorImpl());\n"
        "auto& s = state()[p.unsafeGetTensorImpl()];  // a LibTorch idiom: fine\n")
    found = _internals_outside_the_fast_entry(tmp_path)
    assert len(found) == 8, found
    assert not any("state()" in f for f in found)
