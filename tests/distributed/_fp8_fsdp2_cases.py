"""What tests/distributed/test_fp8_fsdp2.py runs in each gloo process: the FP8 level
(torchao's Float8 linears) on a model sharded with ``fully_shard``, side by side with its
unsharded twin trained on the same data in the same process (as
tests/distributed/_fsdp2_cases.py does for the other levels: every rank feeds the same
batch, so the sharded run can match bit for bit)."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch import nn

import mixprec
from _fsdp2_cases import DEVICE, bitwise, params_of
from mixprec import _dtensor

Result = Dict[str, Any]


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        run_all(rank, world, out_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # leave without the interpreter's shutdown (see tests/distributed/_fsdp2_cases.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(world: int) -> Dict[int, Result]:
    """Run :func:`run_all` in ``world`` gloo processes; the results by rank."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world,
                 join=True)
        return {k: torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False)
                for k in range(world)}


def model16() -> nn.Module:
    """fc0 (first) and fc3 (last) stay bfloat16 by default; fc1, fc2 become Float8. 24 and
    40 rows: uneven-free shards on 2 ranks, different shard sizes per layer."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 48), nn.LayerNorm(48), nn.ReLU(),
        nn.Linear(48, 32), nn.Tanh(), nn.Linear(32, 16),
    ).to(DEVICE)


def shard(model: nn.Module, mesh: Any) -> nn.Module:
    fully_shard, _ = _dtensor.fsdp2()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def data() -> List[Any]:
    out = []
    for k in range(4):
        g = torch.Generator().manual_seed(k)
        out.append((torch.randn(8, 16, generator=g).to(DEVICE),
                    torch.randn(8, 16, generator=g).to(DEVICE)))
    return out


CASES = {
    # name: (mode, recipe, config overrides, mixprec AdamW kwargs)
    "automatic_tensorwise": ("automatic", "tensorwise", {}, {}),
    "automatic_rowwise": ("automatic", "rowwise", {"max_grad_norm": 0.5}, {}),
    "automatic_rowwise_with_gw_hp": ("automatic", "rowwise_with_gw_hp", {}, {}),
    # 8-bit moments on the weights (>= 512 elements): each rank's shard is a multiple of
    # the 256-element quantization block, so the blocks are those of the unsharded run
    "manual_tensorwise_8bit": ("manual", "tensorwise", {"optimizer_state_bits": 8},
                               {"min_8bit_size": 512}),
    # (no clipping here: MANUAL + max_grad_norm under FSDP2 ends one float32 ulp off in
    # the float32 LayerNorm params at the bf16 level too, without FP8)
    "manual_rowwise_scaler": ("manual", "rowwise", {"loss_scaling": True}, {}),
}


def run_case(mesh: Any, mode: str, recipe: str, over: Dict[str, Any],
             opt_kw: Dict[str, Any]) -> Result:
    from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer
    from mixprec.train.fp8 import convert_model, float8_linears
    from mixprec.train.modes import convert_params

    finals, losses, types, f8, codes8 = [], [], [], [], []
    for sharded in (True, False):
        model = model16()
        # the documented order: convert (and MANUAL's bf16 params), then fully_shard; the
        # twin the same (MANUAL's masters then start from the bf16 params on both sides)
        convert_model(model, recipe)
        if mode == "manual":
            convert_params(model, torch.bfloat16)
        if sharded:
            shard(model, mesh)
        cfg = MixedPrecisionConfig(mode=mode, precision_level="fp8", fp8_recipe=recipe,
                                   logging_frequency=1000, **over)
        trainer = MixedPrecisionTrainer(cfg, device=DEVICE)
        trainer.setup_training(model, mixprec.optim.AdamW(model.parameters(), lr=1e-2,
                                                          **opt_kw),
                               torch.nn.functional.mse_loss)
        epoch = trainer.train_epoch(data())
        losses.append(epoch["epoch_loss"])
        finals.append(params_of(model))
        f8.append(float8_linears(model))
        codes8.append(sum(v.dtype == torch.uint8 for st in trainer.optimizer.state.values()
                          for v in st.values() if isinstance(v, torch.Tensor)))
        types.append(sorted({type(v).__name__ for st in trainer.optimizer.state.values()
                             for k, v in st.items() if isinstance(v, torch.Tensor)
                             and k != "step" and v.numel() > 0}))  # (not the empty maxima
        # of a 32-bit param of an 8-bit optimizer)
    return {"bitwise": bitwise(finals[0], finals[1]),
            "max_diff": max(float((a.double() - b.double()).abs().max())
                            for a, b in zip(finals[0], finals[1])),
            "losses": losses, "state_types": types, "float8": f8, "codes8": codes8}


def run_all(rank: int, world: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer

    mesh = init_device_mesh(DEVICE, (world,))
    r: Result = {name: run_case(mesh, *case) for name, case in CASES.items()}
    # the wrong order: sharded first, converted after
    model = shard(model16(), mesh)
    try:
        MixedPrecisionTrainer(MixedPrecisionConfig(precision_level="fp8"),
                              device=DEVICE).setup_training(
            model, mixprec.optim.AdamW(model.parameters()), torch.nn.functional.mse_loss)
        r["convert_after_shard"] = None
    except ValueError as e:
        r["convert_after_shard"] = str(e)
    torch.save(r, os.path.join(out_dir, f"rank{rank}.pt"))
