"""The optimizer step table: ``mixprec.optim.AdamW`` at GPT-2 small's shapes, one row per
setting and param dtype, device time per step and its share of the copy bandwidth.

Rows (``--rows``): ``32-bit`` (float32 moments), ``8-bit`` (``state_bits=8``: whatever fused
8-bit step the build has), ``split`` (float32 masters kept as the bf16 param plus a
correction: the constructor option ``--split-option``, default
``master_correction_bits=16``, with 32-bit moments), ``split8`` (the leanest setting: the
same option at 8 with ``state_bits=8``) and
``release`` (gradient release: ``--release-call``, default
``mixprec.optim.release_gradients``, called as ``fn(model, optimizer)`` before a backward;
the row gives the peak memory of GPT-2 small's (bf16, float32 masters) forward + backward +
step with and without it). A row whose
option or call the installed mixprec does not have prints ``row <name> SKIP <why>`` and the
others still run. Each of 32-bit and 8-bit runs for every ``--dtypes`` (fp32 params; bf16
and fp16 params with float32 masters).

Timing, per row: ``--iters`` steps back to back after a warm-up, the events around the whole
run (``wall ms``: the host prologue of step n+1 overlaps step n's kernels), and a
torch.profiler pass over the same steps whose device events are summed per step (``device
ms``: kernels and copies only, no host time at all). The bytes a step moves (params read and
written, grads read, every state tensor read and written) over the device time, against the
copy bandwidth measured in the same run, is the row's ``% of copy``. Then the ratio 8-bit /
32-bit at fp32 (goal <= 0.7), the 8-bit share of copy (goal >= 85 %), and the profiler's
kernel table of the 8-bit step. Checked first, untimed: each row's step moves the params.

``--ncu`` runs only the fp32 8-bit step, ``--iters`` times, inside an NVTX range ``step8``
(for ``ncu --nvtx --nvtx-include step8/``; what ``make gpu-check``'s optim8 part does when
Nsight Compute is on the machine).

    python tools/gpu_profile8.py                          # CUDA, GPT-2 small
    python tools/gpu_profile8.py --device cpu --small     # the same code, tiny, on CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import mixprec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _common import copy_bandwidth, gpt2_small_shapes  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass
class Row:
    """One line of the table: its name, the param dtype, the optimizer's options."""

    name: str
    dtype: str
    options: Dict[str, Any]


def parse_option(text: str) -> Tuple[str, Any]:
    """``"name=value"`` -> (name, value as int, float, bool or str)."""
    if "=" not in text:
        raise ValueError(f"--split-option: {text!r} is not NAME=VALUE")
    name, raw = text.split("=", 1)
    value: Any = raw
    for cast in (int, float):
        try:
            value = cast(raw)
            break
        except ValueError:
            continue
    if raw in ("True", "False"):
        value = raw == "True"
    return name.strip(), value


def missing_option(name: str) -> Optional[str]:
    """Why ``mixprec.optim.AdamW`` cannot take the option ``name`` (None: it can)."""
    params = inspect.signature(mixprec.optim.AdamW.__init__).parameters
    if name in params:
        return None
    return (f"mixprec.optim.AdamW has no option {name!r} in mixprec {mixprec.__version__} "
            "(the split-master option has not landed; name it with --split-option)")


def find_call(dotted: str) -> Tuple[Optional[Callable[..., Any]], str]:
    """(the callable at ``dotted``, "") or (None, why it is not there)."""
    module, _, attr = dotted.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attr, None)
    except ImportError as e:
        return None, f"{module} does not import: {e}"
    if not callable(fn):
        return None, (f"{dotted} does not exist in mixprec {mixprec.__version__} (gradient "
                      "release has not landed; name its call with --release-call)")
    return fn, ""


def make_step(row: Row, shapes: List[Tuple[int, ...]], device: str
              ) -> Tuple[Callable[[], None], int]:
    """(one optimizer step, the bytes that step moves) for params of ``shapes``."""
    torch.manual_seed(0)
    dtype = DTYPES[row.dtype]
    params = [torch.nn.Parameter(torch.randn(s, device=device).to(dtype)) for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, device=device) * 1e-2).to(dtype)
    opt = mixprec.optim.AdamW(params, lr=1e-3, **row.options)
    before = [p.detach().clone() for p in params]
    opt.step()  # (creates the state)
    if all(torch.equal(a, p.detach()) for a, p in zip(before, params)):
        raise SystemExit(f"error: the {row.name} {row.dtype} step did not move the params")
    moved = 0
    for p in params:
        moved += 2 * p.nbytes + p.grad.nbytes  # type: ignore[union-attr]
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and k != "step" and v.numel() > 1:
                moved += 2 * v.nbytes
    return opt.step, moved


def wall_ms(fn: Callable[[], None], device: str, iters: int) -> float:
    """ms per step of ``iters`` steps back to back (one warm-up step first)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def profile(fn: Callable[[], None], device: str, iters: int) -> Tuple[float, Any]:
    """(device ms per step: the sum of the profiler's device events over ``iters`` steps
    divided by ``iters``; on CPU the steps' own CPU time; the profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        cpu_ms = (time.perf_counter() - t0) * 1e3
    if device != "cuda":
        return cpu_ms / iters, prof
    us = sum(e.time_range.elapsed_us() for e in prof.events()
             if e.device_type == DeviceType.CUDA)
    return us / 1e3 / iters, prof


def kernel_table(prof: Any, device: str, rows: int) -> str:
    for key in (("self_device_time_total", "self_cuda_time_total") if device == "cuda"
                else ("self_cpu_time_total",)):
        try:
            return prof.key_averages().table(sort_by=key, row_limit=rows)
        except Exception:  # noqa: BLE001  (another torch's column names)
            continue
    return prof.key_averages().table(row_limit=rows)


def release_row(fn: Callable[..., Any], device: str, small: bool) -> str:
    """Peak memory of GPT-2 small's forward + backward + step, with and without ``fn``
    (gradient release) on a fresh copy; and the params bitwise equal after both."""
    from _models import GPT, ModelConfig

    cfg = ModelConfig(2, 64, 4, 512, 32) if small else ModelConfig()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab, (1, cfg.ctx if small else 128), generator=g).to(device)
    out = []
    for release in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg).to(device=device, dtype=torch.bfloat16)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
        if release:
            fn(model, opt)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        logits = model(idx)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).backward()
        opt.step()  # (with release: the last bucket)
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
        out.append((peak, [p.detach().clone() for p in model.parameters()]))
    same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
               for a, b in zip(out[0][1], out[1][1]))
    return (f"peak {out[0][0]:.0f} MiB without release, {out[1][0]:.0f} MiB with; params "
            f"{'bitwise equal' if same else 'DIFFER'}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--iters", type=int, default=20, help="steps back to back per row")
    ap.add_argument("--rows", default="32-bit,8-bit,split,split8,release")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--split-option", default="master_correction_bits=16",
                    help="the AdamW option that keeps float32 masters split (NAME=VALUE)")
    ap.add_argument("--release-call", default="mixprec.optim.release_gradients",
                    help="the gradient-release call, fn(model, optimizer)")
    ap.add_argument("--table-rows", type=int, default=12, help="kernel table rows")
    ap.add_argument("--ncu", action="store_true", help="only the fp32 8-bit step, in NVTX "
                                                       "range step8 (under ncu)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU (use --device cpu --small here)")
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: {','.join(bad)}; of {','.join(DTYPES)}")
    shapes = [(4096,), (257, 64), (3,)] if args.small else gpt2_small_shapes()
    iters = min(args.iters, 3) if args.small else args.iters
    if args.ncu:
        step, _ = make_step(Row("8-bit", "fp32", {"state_bits": 8}), shapes, args.device)
        step()
        torch.cuda.nvtx.range_push("step8")
        for _ in range(iters):
            step()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"ncu target: {iters} fp32 8-bit steps in NVTX range step8")
        return 0
    print(f"mixprec {mixprec.__version__} ({mixprec.__file__}), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
          f"{sum(torch.Size(s).numel() for s in shapes) / 1e6:.1f}M params", flush=True)
    todo: List[Row] = []
    wanted = args.rows.split(",")
    for name in wanted:
        if name in ("32-bit", "8-bit"):
            opts = {"state_bits": 8} if name == "8-bit" else {}
            todo += [Row(name, d, dict(opts)) for d in args.dtypes.split(",")]
        elif name in ("split", "split8"):
            opt_name, value = parse_option(args.split_option)
            why = missing_option(opt_name)
            if why:
                print(f"row {name} SKIP {why}", flush=True)
            else:
                todo.append(Row(name, "bf16", {opt_name: value} if name == "split" else
                                {opt_name: 8, "state_bits": 8}))
        elif name != "release":
            ap.error(f"--rows: {name!r}; rows are 32-bit,8-bit,split,split8,release")
    results: Dict[Tuple[str, str], Tuple[float, int]] = {}
    copy: Optional[float] = None
    prof8 = None
    for row in todo:
        step, moved = make_step(row, shapes, args.device)
        if copy is None:
            copy = copy_bandwidth(moved // 2, torch.device(args.device),
                                  0.05 if args.small else 0.5)
        wall = wall_ms(step, args.device, iters)
        dev, prof = profile(step, args.device, iters)
        if dev <= 0:  # (no device events from the profiler: the wall time, said so)
            print(f"row {row.name} {row.dtype}: the profiler saw no device events; device "
                  "ms below is the wall time", flush=True)
            dev = wall
        results[(row.name, row.dtype)] = (dev, moved)
        if row.name == "8-bit" and prof8 is None:
            prof8 = prof
        print(f"row {row.name:<7} {row.dtype:<5} device {dev:8.3f} ms  wall {wall:8.3f} ms  "
              f"{moved / 1e6:8.1f} MB  {moved / dev / 1e6:8.1f} GB/s  "
              f"{100 * moved / dev / 1e6 / copy:5.1f} % of copy", flush=True)
    if "release" in wanted:
        fn, why = find_call(args.release_call)
        print(f"row release SKIP {why}" if fn is None else
              f"row release  {release_row(fn, args.device, args.small)}", flush=True)
    if copy is not None:
        print(f"copy bandwidth {copy:.1f} GB/s")
    if prof8 is not None:
        print("8-bit step, profiler kernel table:")
        print(kernel_table(prof8, args.device, args.table_rows), flush=True)
    for split, base in (("split", "32-bit"), ("split8", "8-bit")):
        a, b = results.get((split, "bf16")), results.get((base, "bf16"))
        if a and b:
            print(f"ratio {split} / {base} bf16 (float32 masters) step time: "
                  f"{a[0] / b[0]:.2f} (goal <= 1.0: it moves {a[1] / b[1]:.2f}x the bytes)")
    r32, r8 = results.get(("32-bit", "fp32")), results.get(("8-bit", "fp32"))
    if r32 and r8 and copy:
        print(f"ratio 8-bit / 32-bit step time: {r8[0] / r32[0]:.2f} (goal <= 0.7)")
        print(f"8-bit step: {r8[1] / r8[0] / 1e6:.1f} GB/s, "
              f"{100 * r8[1] / r8[0] / 1e6 / copy:.0f} % of the copy bandwidth "
              f"{copy:.1f} GB/s (goal >= 85 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
