"""What tests/distributed/test_trainer_dcp.py runs in each gloo process: a
``MixedPrecisionTrainer`` on a model sharded with ``fully_shard`` saves its state as a DCP
directory (``save_state``) on one world size and a fresh trainer loads it
(``load_state``) on another, then both go on; and the same steps uninterrupted, sharded
and unsharded, as the reference.

Every rank feeds the same batch (as in _fsdp2_cases.py), so the averaged gradient is the
unsharded one wherever averaging equal terms is exact; the model is _fsdp2_cases's
``tiny_model`` (7, 3 and 1 rows: no world size here divides them, and some shards are
empty at 4 ranks); float32 params with 32-bit AdamW state, AUTOMATIC fp16 with loss
scaling (the scaler's state travels too) and a StepLR scheduler.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import mixprec
from _fsdp2_cases import DEVICE, batch, full, shard, tiny_model

#: the steps before the save and after it
SAVED_AT, TOTAL = 2, 5


def _target(step: int) -> torch.Tensor:
    return torch.randn(4, 1, generator=torch.Generator().manual_seed(50 + step)).to(DEVICE)


def make_trainer(sharded: bool, mesh: Any = None) -> Any:
    from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer

    model = tiny_model()
    if sharded:
        shard(model, mesh)
    sched_opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(sched_opt, 1, gamma=0.8)
    trainer = MixedPrecisionTrainer(
        MixedPrecisionConfig(mode="automatic", precision_level="fp16", logging_frequency=1000,
                             initial_scale=2.0**10, scale_window=2), device=DEVICE)
    trainer.setup_training(model, sched_opt, torch.nn.functional.mse_loss, scheduler)
    return trainer


def train(trainer: Any, start: int, stop: int) -> None:
    for k in range(start, stop):
        trainer.train_step(batch(k, torch.float32), _target(k))


def result(trainer: Any) -> Dict[str, Any]:
    opt = trainer.optimizer
    state: List[torch.Tensor] = []
    for p in trainer.model.parameters():
        for name in ("step", "exp_avg", "exp_avg_sq"):
            state.append(full(opt.state[p][name]).detach().clone().cpu())
    return {"params": [full(p.detach()).clone().cpu() for p in trainer.model.parameters()],
            "state": state, "scale": trainer.scaler.get_scale(),
            "lr": trainer.scheduler.get_last_lr(), "steps": trainer.optimizer_steps}


# -- entries (rank, world, out_dir, ckpt_dir) ------------------------------------------
def save_and_go_on(rank: int, world: int, out_dir: str, ckpt: str) -> Dict[str, Any]:
    """Train SAVED_AT steps, save (DCP), record the state at the save, go on to TOTAL."""
    mesh = dist.device_mesh.init_device_mesh(DEVICE, (world,))
    t = make_trainer(True, mesh)
    train(t, 0, SAVED_AT)
    t.save_state(ckpt)
    at_save = result(t)
    train(t, SAVED_AT, TOTAL)
    return {"at_save": at_save, "final": result(t),
            "files": sorted(os.listdir(ckpt)), "isdir": os.path.isdir(ckpt)}


def load_and_go_on(rank: int, world: int, out_dir: str, ckpt: str) -> Dict[str, Any]:
    """A fresh sharded trainer (one step on other data first: what it had is replaced)
    loads the checkpoint, records its state, and goes on to TOTAL."""
    mesh = dist.device_mesh.init_device_mesh(DEVICE, (world,))
    t = make_trainer(True, mesh)
    train(t, 7, 8)
    t.load_state(ckpt)
    loaded = result(t)
    train(t, SAVED_AT, TOTAL)
    return {"loaded": loaded, "final": result(t)}


def _worker(rank: int, world: int, entry: str, init_file: str, out_dir: str,
            ckpt: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        out = globals()[entry](rank, world, out_dir, ckpt)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # (see _fsdp2_cases._worker)


def spawn(world: int, entry: str, ckpt: str) -> Dict[int, Dict[str, Any]]:
    """Run ``entry`` in ``world`` gloo processes (one thread each); the results by rank."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, entry, os.path.join(tmp, "init"), tmp, ckpt),
                 nprocs=world, join=True)
        return {k: torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False)
                for k in range(world)}


def unsharded() -> Dict[str, Any]:
    """The uninterrupted unsharded run, in this process."""
    t = make_trainer(False)
    train(t, 0, TOTAL)
    return result(t)
