"""Host time of one optimizer step on an FSDP2-sharded model vs the same model unsharded,
side by side in each of ``--world`` (2) gloo processes on CPU (one thread each).

The model is ``n`` bf16 Linear layers of ``--width`` x ``--width`` side by side (2 params
each, the outputs summed), tiny so that a step costs what the host spends on it. Cases,
each timed sharded (``fully_shard`` over the ranks) and unsharded (a copy of the model in
the same process):

=====================  ==============================================================
adamw mixprec          ``mixprec.optim.AdamW.step()`` (bf16 params, fp32 masters)
iter mixprec           ``mixprec.GradScaler``: ``step(AdamW)`` + ``update()``: the inf
                       check of the shards, one all-reduce of the verdict (sharded), the
                       fused step
adamw torch            ``torch.optim.AdamW(foreach=True).step()`` (bf16 params), the
                       optimizer a user would pick instead
=====================  ==============================================================

The figure is the best of ``--rounds`` blocks of ``--calls`` steps, per step and per
param, and the ratio sharded / unsharded, and a least-squares split of each into a fixed
and a per-param part (the sharded 'iter' pays one all-reduce of the inf verdict per step,
timed alone in the same run). Checked once, untimed: every case moves every param (the
sharded ones through their local shards; mixprec's fp32 masters).

    python benchmarks/bench_fsdp2.py [--sizes 50,250,500] [--width 16] [--world 2]

With 2 ranks on this 2-core machine a sharded scaler iteration also waits, at its
all-reduce, for the slower rank, and that wait grows with the work per step; ``--world 1``
runs the very same sharded code path on a 1-rank mesh, which leaves the host cost alone.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from _common import fit_fixed_per_tensor


class _Wide(nn.Sequential):
    """``n`` Linear layers side by side (every one gets a gradient of the same size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.stack([layer(x) for layer in self]).sum(0)


def _model(n: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return _Wide(*(nn.Linear(width, width) for _ in range(n))).to(torch.bfloat16)


def _time_pair(a: Callable[[], None], b: Callable[[], None], calls: int,
               rounds: int) -> Tuple[float, float]:
    """The best of ``rounds`` blocks of ``calls`` calls of ``a`` and of ``b`` (as timeit:
    the least disturbed block), the blocks alternated, every block started by all ranks
    together (a barrier): on this 2-core machine the other rank's work, gloo's threads
    included, would otherwise land in one case's blocks and not the other's."""
    ta, tb = [], []
    gc.disable()  # as timeit: a collection's cost grows with everything else alive
    try:
        for _ in range(rounds):
            for fn, out in ((a, ta), (b, tb)):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
    finally:
        gc.enable()
    return min(ta), min(tb)


def _time(fn: Callable[[], None], calls: int, rounds: int) -> float:
    fn()  # warm up (state built, lists kept)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return min(out)


def _cases(model: nn.Module) -> Dict[str, Tuple[Callable[[], None], Any]]:
    import mixprec

    out: Dict[str, Tuple[Callable[[], None], Any]] = {}
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    out["adamw mixprec"] = (opt.step, opt)
    opt2 = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = mixprec.GradScaler("cpu", init_scale=1.0, growth_interval=10**9)
    scaler.scale(torch.ones(()))  # the scale exists (the grads are left as they are)

    def iteration() -> None:
        scaler.step(opt2)
        scaler.update()

    out["iter mixprec"] = (iteration, opt2)
    opt3 = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    out["adamw torch"] = (opt3.step, opt3)
    return out


def _worker(rank: int, init_file: str, out_dir: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.world)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from mixprec import _dtensor

        fully_shard, _ = _dtensor.fsdp2()
        mesh = init_device_mesh("cpu", (args.world,))
        rows: List[Tuple[int, str, float, float]] = []
        for n in args.sizes:
            plain = _model(n, args.width)
            sharded = copy.deepcopy(plain)
            for layer in sharded:
                fully_shard(layer, mesh=mesh)
            fully_shard(sharded, mesh=mesh)
            x = torch.randn(4, args.width, dtype=torch.bfloat16)
            timed: Dict[str, List[Tuple[Callable[[], None], List[Any]]]] = {}
            for model in (sharded, plain):
                model(x).float().pow(2).mean().backward()
                for name, (fn, opt) in _cases(model).items():
                    fn()  # the state exists from here on
                    # (mixprec keeps fp32 masters: a bf16 param may round back unmoved)
                    weights = (opt.master_params() if hasattr(opt, "master_params")
                               else list(model.parameters()))
                    timed.setdefault(name, []).append((fn, weights))
            for name, pair in timed.items():
                befores = [[_dtensor.local(w).detach().clone() for w in ws] for _, ws in pair]
                t_sharded, t_plain = _time_pair(pair[0][0], pair[1][0], args.calls,
                                                args.rounds)
                for before, (_, weights) in zip(befores, pair):
                    if not all(not torch.equal(b, _dtensor.local(w))
                               for b, w in zip(before, weights) if b.numel() > 0):
                        raise SystemExit(f"check failed: {name} did not move every param")
                rows.append((2 * n, name, t_sharded, t_plain))
        flag = torch.zeros(())
        allreduce = _time(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX), args.calls,
                          args.rounds)
        if rank == 0:
            print(f"torch {torch.__version__}, {args.world} gloo rank(s) on CPU, 1 thread each; "
                  f"bf16 params of {args.width}x{args.width} and {args.width}; best of "
                  f"{args.rounds} x {args.calls} steps")
            print(f"{'params':>7} {'case':<15} {'sharded us':>11} {'unsharded us':>13} "
                  f"{'us/param sh':>12} {'us/param un':>12} {'ratio':>6}")
            for params, name, ts, tp in rows:
                print(f"{params:>7} {name:<15} {ts * 1e6:>11.1f} {tp * 1e6:>13.1f} "
                      f"{ts * 1e6 / params:>12.3f} {tp * 1e6 / params:>12.3f} "
                      f"{ts / tp:>6.2f}")
            print(f"one-element all-reduce (MAX) over the {args.world} gloo rank(s) alone: "
                  f"{allreduce * 1e6:.1f} us (the sharded 'iter' runs one per step)")
            sizes = sorted({p for p, *_ in rows})
            if len(sizes) >= 2:
                print("least-squares fit time = fixed + params * per_param:")
                for name in dict.fromkeys(n for _, n, *_ in rows):
                    fits = []
                    for col in (2, 3):
                        ys = [r[col] * 1e6 for r in rows if r[1] == name]
                        fits.append(fit_fixed_per_tensor(sizes, ys))
                    (fs, ps), (fu, pu) = fits
                    print(f"  {name:<15} sharded {fs:8.1f} us + {ps:.3f} us/param; "
                          f"unsharded {fu:8.1f} us + {pu:.3f} us/param; per-param ratio "
                          f"{ps / pu if pu > 0 else float('nan'):.2f}")
        dist.barrier()  # every rank done with its collectives before any tears down
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's shutdown, during which a gloo worker thread (alive
    # after destroy_process_group() once fully_shard ran) may free a finished collective
    # and abort the process (docs/troubleshooting.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[50, 250, 500], help="layers (2 params each)")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--world", type=int, default=2,
                    help="gloo ranks; 1 isolates the host cost of the sharded path (a 1-rank "
                         "mesh: the same DTensor code, no waiting for another rank)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp, args), nprocs=args.world,
                 join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
