"""Save on one world size, load on another: the worker side of test_reshard.py.

Each configuration trains the same small model 2 steps, saves model and optimizer with
``torch.distributed.checkpoint`` (``get_state_dict`` -> ``dcp.save``), and a job of another
world size loads it (``dcp.load`` -> ``set_state_dict``) and trains 3 more steps. The
layouts (:data:`LAYOUTS`): world size 1 is a plain (unsharded) model; 2 to 4 are FSDP2
(``fully_shard``), 2 also DDP and 4 also HSDP (2 replicas of 2 shards), on gloo. Every rank
is fed the same batch, so the averaged gradient is the unsharded one wherever averaging
equal values is exact (1, 2 and 4 ranks).

The shapes are those that break a layout tied to the shards: rows of 300 elements (a block
of 256 and one of 44), 67 and 130 rows (no world size up to 4 divides 67; 3 and 4 do not
divide 130), and 5 rows (an empty shard at 4 ranks).

Each worker writes plain values to ``out_dir``: the optimizer state gathered to whole
tensors (codes, maxima, decoded moments, masters), and the params after the last step.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch import nn

import mixprec
from mixprec import _dtensor
from mixprec.optim import _quant8 as q8

#: configuration -> (param dtype, optimizer factory)
CONFIGS: Dict[str, Any] = {
    "masters32": (torch.bfloat16, lambda ps: mixprec.optim.AdamW(ps, lr=1e-2)),
    "masters8": (torch.bfloat16,
                 lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=0)),
    "fp32_8bit": (torch.float32,
                  lambda ps: mixprec.optim.AdamW8bit(ps, lr=1e-2, min_8bit_size=0)),
    "split16": (torch.bfloat16,
                lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, master_correction_bits=16)),
    "split8": (torch.bfloat16, lambda ps: mixprec.optim.AdamW8bit(
        ps, lr=1e-2, min_8bit_size=0, master_correction_bits=8)),
    "bf16_sr": (torch.bfloat16, lambda ps: mixprec.optim.AdamW(
        ps, lr=1e-2, master_weights=False, stochastic_rounding=True, seed=5)),
    "sgd8": (torch.float32, lambda ps: mixprec.optim.SGD8bit(
        ps, lr=1e-1, momentum=0.9, nesterov=True, min_8bit_size=0)),
}
WORLDS = (1, 2, 3, 4)
#: world size -> the layouts run at it
LAYOUTS = {1: ("plain",), 2: ("fsdp", "ddp"), 3: ("fsdp",), 4: ("fsdp", "hsdp")}
SAVE_AT, STEPS = 2, 5


def model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(300, 67), nn.ReLU(), nn.Linear(67, 130), nn.Tanh(),
                         nn.Linear(130, 5)).to(dtype)


def batch(step: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4, 300, generator=g).to(dtype)


def make(config: str, world: int, layout: str) -> tuple:
    dtype, opt = CONFIGS[config]
    m = model(dtype)
    if layout == "ddp":
        m = nn.parallel.DistributedDataParallel(m)
    elif layout in ("fsdp", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        fully_shard, _ = _dtensor.fsdp2()
        mesh = (init_device_mesh("cpu", (world,)) if layout == "fsdp" else
                init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard")))
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
    return m, opt(m.parameters()), dtype


def step(m: nn.Module, o: Any, dtype: torch.dtype, k: int) -> None:
    o.zero_grad()
    m(batch(k, dtype)).float().pow(2).mean().backward()
    o.step()


def full(t: torch.Tensor) -> torch.Tensor:
    if _dtensor.is_dtensor(t) and t.dtype in (torch.int16, torch.int8):
        # (gloo gathers no int16/int8: the split masters' corrections go as int32)
        return full(t.to(torch.int32)).to(t.dtype)
    return (t.full_tensor() if _dtensor.is_dtensor(t) else t).detach().clone()


def gathered_state(m: nn.Module, o: Any) -> List[Dict[str, Any]]:
    """Each param's optimizer state as whole tensors (collective: every rank calls it),
    with the 8-bit moments also read back to float32."""
    out = []
    for p in m.parameters():
        st = o.state[p]
        row: Dict[str, Any] = {}
        for k, v in st.items():
            row[k] = full(v) if isinstance(v, torch.Tensor) else v
        for name, table in (("exp_avg", q8.SIGNED), ("exp_avg_sq", q8.UNSIGNED),
                            ("momentum_buffer", q8.SIGNED)):
            if name in row and row[name].dtype == torch.uint8:
                row[name + "_decoded"] = q8.dequantize(row[name], row[name + "_absmax"],
                                                       table)
        if "master_correction" in row:
            row["master_decoded"] = mixprec.optim.decode_master(full(p),
                                                                row["master_correction"])
        out.append(row)
    return out


def params_of(m: nn.Module) -> List[torch.Tensor]:
    return [full(p) for p in m.parameters()]


def save(rank: int, world: int, out_dir: str) -> None:
    """Train SAVE_AT steps and save (DCP); then the uninterrupted run to STEPS."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: Dict[str, Any] = {}
    for layout in LAYOUTS[world]:
        for config in CONFIGS:
            m, o, dtype = make(config, world, layout)
            for k in range(SAVE_AT):
                step(m, o, dtype, k)
            msd, osd = get_state_dict(m, o)
            dcp.save({"model": msd, "optim": osd},
                     checkpoint_id=os.path.join(out_dir, f"{config}-{layout}{world}"))
            saved = gathered_state(m, o)
            for k in range(SAVE_AT, STEPS):
                step(m, o, dtype, k)
            out[(config, layout)] = {"state": saved, "final": params_of(m)}
    if rank == 0:
        torch.save(out, os.path.join(out_dir, f"save-w{world}.pt"))


def load(rank: int, world: int, out_dir: str) -> None:
    """Load every checkpoint of another world size, of every configuration, into each
    layout of this one, then step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    out: Dict[str, Any] = {}
    for layout in LAYOUTS[world]:
        for config in CONFIGS:
            for saved_world in WORLDS:
                if saved_world == world:
                    continue
                for saved_layout in LAYOUTS[saved_world]:
                    if "fsdp" not in (layout, saved_layout) and \
                            "plain" not in (layout, saved_layout):
                        continue  # (DDP and HSDP meet the others, not each other)
                    m, o, dtype = make(config, world, layout)
                    msd, osd = get_state_dict(m, o)
                    state = {"model": msd, "optim": osd}
                    dcp.load(state, checkpoint_id=os.path.join(
                        out_dir, f"{config}-{saved_layout}{saved_world}"))
                    set_state_dict(m, o, model_state_dict=state["model"],
                                   optim_state_dict=state["optim"])
                    loaded = gathered_state(m, o)
                    for k in range(SAVE_AT, STEPS):
                        step(m, o, dtype, k)
                    out[(config, layout, saved_layout, saved_world)] = {
                        "state": loaded, "final": params_of(m)}
    if rank == 0:
        torch.save(out, os.path.join(out_dir, f"load-w{world}.pt"))


def old_layout(rank: int, world: int, out_dir: str) -> None:
    """8-bit DTensor state of the previous layout ("dynamic8/b256": blocks over each rank's
    shard, maxima padded to the largest shard's count; what a torch.save of a sharded
    optimizer's state_dict held): it loads at the sharding it was saved with (requantized
    into rows, within the 8-bit bound of its values), and elsewhere raises a ValueError
    naming the layout and both shardings, the optimizer unchanged."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from mixprec.optim import _state8

    m, o, dtype = make("masters8", world, "fsdp")
    for k in range(SAVE_AT):
        step(m, o, dtype, k)
    values: Dict[Any, torch.Tensor] = {}

    def flat_layout(states: Dict[Any, Any], param_of: Dict[Any, torch.Tensor]) -> Dict[Any, Any]:
        """A copy of an optimizer state dict's "state" in the previous layout."""
        out = {k: dict(v) for k, v in states.items()}  # (o keeps its own state)
        for key, st in out.items():
            if st.get("quant") != _state8.QUANT:
                continue
            p = param_of[key]
            per_rank = q8.num_blocks(-(-p.shape[0] // world) * (p.numel() // p.shape[0]))
            for name, table in (("exp_avg", q8.SIGNED), ("exp_avg_sq", q8.UNSIGNED)):
                local = _state8.read_back(st[name], st[name + "_absmax"], table,
                                          p)._local_tensor
                codes, absmax = q8.quantize(local.reshape(-1), table)  # over the shard
                # what that layout reads back: the values the conversion starts from
                values[(key, name)] = full(DTensor.from_local(
                    q8.dequantize(codes, absmax, table).view(local.shape), p.device_mesh,
                    p.placements, run_check=False, shape=p.shape, stride=p.stride()))
                padded = torch.zeros(per_rank)
                padded[:absmax.numel()] = absmax
                st[name] = DTensor.from_local(codes.view(local.shape), p.device_mesh,
                                              p.placements, run_check=False, shape=p.shape,
                                              stride=p.stride())
                st[name + "_absmax"] = DTensor.from_local(
                    padded, p.device_mesh, [Shard(0)], run_check=False,
                    shape=torch.Size([world * per_rank]), stride=(1,))
            st["quant"] = _state8.FLAT_QUANT
        return out

    from torch.distributed.checkpoint.state_dict import get_state_dict

    osd = get_state_dict(m, o)[1]  # (FQN keys, as a DCP checkpoint has them)
    osd["state"] = flat_layout(osd["state"], dict(m.named_parameters()))
    sd = o.state_dict()
    values.clear()
    sd["state"] = flat_layout(sd["state"], dict(enumerate(m.parameters())))
    out: Dict[str, Any] = {}
    m2, o2, _ = make("masters8", world, "fsdp")
    o2.load_state_dict(sd)
    within = []
    for (key, name), want in values.items():
        p2 = list(m2.parameters())[key]
        table = q8.SIGNED if name == "exp_avg" else q8.UNSIGNED
        got = full(_state8.read_back(o2.state[p2][name], o2.state[p2][name + "_absmax"],
                                     table, p2))
        within.append(bool(((got - want).abs() <= q8.error_bound(want, table)).all())
                      and o2.state[p2]["quant"] == _state8.QUANT)
    out["same_sharding_loads"] = within
    # the same state with its codes replicated: another sharding than the param's
    for st in sd["state"].values():
        if st.get("quant") == _state8.FLAT_QUANT:
            for name in ("exp_avg", "exp_avg_sq"):
                st[name] = st[name].redistribute(st[name].device_mesh, [Replicate()])
    m3, o3, _ = make("masters8", world, "fsdp")
    step(m3, o3, dtype, 0)
    before = gathered_state(m3, o3)
    try:
        o3.load_state_dict(sd)
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    out["unchanged"] = all(
        all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
            for k in a) for a, b in zip(gathered_state(m3, o3), before))
    # the same state through DCP (what a sharded checkpoint of that layout holds): DCP itself
    # refuses it with its own words; check_checkpoint names the layout and the world size
    import torch.distributed.checkpoint as dcp

    path = os.path.join(out_dir, "old-dcp")
    dcp.save({"optim": osd}, checkpoint_id=path)
    m4, o4, _ = make("masters8", world, "fsdp")
    step(m4, o4, dtype, 0)
    target = {"optim": get_state_dict(m4, o4)[1]}
    try:
        mixprec.optim.check_checkpoint(target, path)
        out["dcp_error"] = None
    except ValueError as e:
        out["dcp_error"] = str(e)
    # a checkpoint of this layout passes the check
    good = os.path.join(out_dir, "new-dcp")
    dcp.save({"optim": get_state_dict(m, o)[1]}, checkpoint_id=good)
    mixprec.optim.check_checkpoint(target, good)
    if rank == 0:
        torch.save(out, os.path.join(out_dir, "old-layout.pt"))


def worker(rank: int, world: int, entry: str, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        globals()[entry](rank, world, out_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # (as _fsdp2_cases._worker: no interpreter shutdown with gloo threads)


def spawn(world: int, entry: str, out_dir: str, init_file: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world, entry, init_file, out_dir), nprocs=world, join=True)
