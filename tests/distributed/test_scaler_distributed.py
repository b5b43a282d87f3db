"""process_group=: inf checks (and clip norms) reduced over ranks.

Two gloo processes on CPU, each holding a different shard of the parameters.
An inf appears on one rank only; with ``process_group`` both ranks skip and
back off together, without it they diverge (the control).
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mixprec

WORLD = 2
pytestmark = pytest.mark.skipif(
    not dist.is_available() or sys.platform == "win32", reason="torch.distributed unavailable"
)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        results = {}
        for use_group in (True, False):
            torch.manual_seed(100 + rank)  # each rank: its own shard
            shard = torch.nn.Linear(4, 4)
            idle = torch.nn.Parameter(torch.zeros(2))  # never gets a grad
            params = list(shard.parameters()) + ([idle] if rank == 0 else [])
            opt = torch.optim.SGD(params, lr=0.1)
            scaler = mixprec.GradScaler(
                "cpu", init_scale=64.0, growth_interval=1,
                process_group=dist.group.WORLD if use_group else None,
            )
            skipped, scales, norms = [], [], []
            for it in range(4):
                opt.zero_grad()
                scaler.scale(shard(torch.randn(3, 4)).pow(2).sum()).backward()
                if it == 1 and rank == 1:
                    shard.weight.grad[0, 0] = float("inf")
                if it == 3:
                    unscaled = [p.grad / scaler.get_scale() for p in params if p.grad is not None]
                    local_sq = sum(g.double().pow(2).sum() for g in unscaled)
                    norms.append((scaler.clip_grad_norm_(opt, 1e9).item(), local_sq.item()))
                before = [p.detach().clone() for p in params]
                scaler.step(opt)
                scaler.update()
                skipped.append(all(torch.equal(a, b) for a, b in zip(before, params)))
                scales.append(scaler.get_scale())
            results[use_group] = {"skipped": skipped, "scales": scales, "norms": norms,
                                  "was_skipped": scaler.step_was_skipped}
        # a rank whose optimizer has no grads at all still joins the reduction
        p = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([p], lr=0.1)
        scaler = mixprec.GradScaler("cpu", init_scale=8.0, process_group=dist.group.WORLD)
        scaler.scale(torch.ones(()))
        if rank == 1:
            p.grad = torch.full((3,), float("nan"))
        scaler.step(opt)
        scaler.update()
        results["no_grad_rank_scale"] = scaler.get_scale()
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # every rank done with its collectives before any tears down
    finally:
        dist.destroy_process_group()
    # leave without the interpreter's shutdown, during which a gloo worker thread may free a
    # finished all_reduce and abort the process (see tests/distributed/_fsdp2_cases.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_two_gloo_ranks_agree_on_skips_and_norm():
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(init_file, tmp), nprocs=WORLD, join=True)
        r = [torch.load(os.path.join(tmp, f"rank{k}.pt")) for k in range(WORLD)]
    for k in range(WORLD):
        reduced = r[k][True]
        assert reduced["skipped"] == [False, True, False, False]
        assert reduced["scales"] == [128.0, 64.0, 128.0, 256.0]
        assert reduced["was_skipped"] is False
        assert r[k]["no_grad_rank_scale"] == 4.0
    # the global norm is the same on both ranks and combines both shards
    (n0, sq0), = r[0][True]["norms"]
    (n1, sq1), = r[1][True]["norms"]
    assert n0 == n1
    assert n0 == pytest.approx((sq0 + sq1) ** 0.5, rel=1e-6)
    # control: without the group only rank 1 sees its inf
    assert r[0][False]["skipped"] == [False, False, False, False]
    assert r[1][False]["skipped"] == [False, True, False, False]
    assert r[0][False]["scales"] != r[1][False]["scales"]
    (m0, s0), = r[0][False]["norms"]
    assert m0 == pytest.approx(s0**0.5, rel=1e-6)
