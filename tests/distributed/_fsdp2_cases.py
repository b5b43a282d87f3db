"""What the FSDP2 tests run in each gloo process (test_fsdp2.py beside it spawns them once per
module and checks the results): the unchanged user code on a model sharded with
``fully_shard``, side by side with an unsharded copy of the same model trained on the
same data in the same process.

Every rank feeds the same batch, so FSDP2's averaged gradient of the whole is the
unsharded gradient itself (a sum of equal terms divided by their count: exact), and the
sharded run can be compared with the unsharded one bit for bit.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.distributed as dist
from torch import nn

import mixprec
from mixprec import _dtensor

Result = Dict[str, Any]

#: where the cases run: "cpu" (gloo; the default, what CI runs) or "cuda" (nccl, one GPU
#: per rank: ``MIXPREC_FSDP2_DEVICE=cuda MIXPREC_FSDP2_WORLD=1`` is the GPU check's run)
DEVICE = os.environ.get("MIXPREC_FSDP2_DEVICE", "cpu")
#: the number of processes tests/distributed/test_fsdp2.py spawns
WORLD = int(os.environ.get("MIXPREC_FSDP2_WORLD", "2"))

_WHY = _dtensor.fsdp2_unavailable()
#: the FSDP2 test modules' mark: skipped, with the reason, where FSDP2 or gloo is missing
needs_fsdp2 = pytest.mark.skipif(
    _WHY is not None or sys.platform == "win32",
    reason=_WHY or "torch.distributed with gloo unavailable on this platform")


def _worker(rank: int, world: int, entry: str, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo",
                            init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        module, _, name = entry.rpartition(".")
        (getattr(importlib.import_module(module), name) if module else globals()[entry])(
            rank, world, out_dir)
        dist.barrier()  # every rank done with its collectives before any tears down
    finally:
        dist.destroy_process_group()
    # Results are saved: leave without the interpreter's shutdown, during which a gloo
    # worker thread (alive after destroy_process_group() once fully_shard ran) may free a
    # finished collective and abort the process (docs/troubleshooting.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(world: int, entry: str) -> Dict[int, Result]:
    """Run ``entry`` (a function of this module, or ``"module.function"`` of another
    beside it: ``(rank, world, out_dir)``, saving
    ``out_dir/rank<k>.pt``) in ``world`` processes (gloo on CPU, one thread each; or nccl
    on ``DEVICE`` cuda); returns
    the results by rank. The tests call it once per module."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, entry, os.path.join(tmp, "init"), tmp), nprocs=world,
                 join=True)
        return {k: torch.load(os.path.join(tmp, f"rank{k}.pt"), weights_only=False)
                for k in range(world)}


def tiny_model(dtype: torch.dtype = torch.float32) -> nn.Module:
    """Uneven shards on 2 ranks (7 and 3 rows: 4+3 and 2+1) and, for the last layer's
    single row, an empty shard on rank 1."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 7), nn.LayerNorm(7), nn.ReLU(), nn.Linear(7, 3), nn.Tanh(),
        nn.Linear(3, 1),
    ).to(device=DEVICE, dtype=dtype)


def shard(model: nn.Module, mesh: Any, **kwargs: Any) -> nn.Module:
    fully_shard, _ = _dtensor.fsdp2()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if _dtensor.is_dtensor(t) else t


def batch(step: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, 5, generator=g).to(device=DEVICE, dtype=dtype)


def bitwise(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    return all(x.dtype == y.dtype and x.shape == y.shape and
               torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           y.view(torch.int16 if y.element_size() == 2 else torch.int32))
               for x, y in zip(a, b))


def params_of(model: nn.Module) -> List[torch.Tensor]:
    return [full(p.detach()).clone() for p in model.parameters()]


def train_pair(mesh: Any, dtype: torch.dtype, make_opt: Callable[[Any], Any],
               use_scaler: bool, steps: int = 4, policy: Optional[torch.dtype] = None,
               clip: Optional[float] = None, inf_at: Optional[Tuple[int, int]] = None,
               init_scale: float = 2.0**10) -> Result:
    """Train a sharded model and its unsharded twin side by side.

    ``policy``: the sharded model stays float32 under MixedPrecisionPolicy(param_dtype=
    policy, reduce_dtype=float32); its twin computes on a ``policy`` copy of float32
    params and steps on the float32 params with the grads cast to float32.
    ``inf_at=(step, rank)``: that rank writes inf into its local grad shard (and every
    rank into its twin's grad, which then skips the same step).
    """
    rank = dist.get_rank()
    ref = tiny_model(dtype)
    model = copy.deepcopy(ref)
    if policy is not None:
        _, MixedPrecisionPolicy = _dtensor.fsdp2()
        shard(model, mesh, mp_policy=MixedPrecisionPolicy(param_dtype=policy,
                                                          reduce_dtype=torch.float32))
    else:
        shard(model, mesh)
    opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
    scalers = [mixprec.GradScaler(DEVICE, init_scale=init_scale, growth_interval=2)
               if use_scaler else None for _ in range(2)]
    norms: List[Tuple[float, float]] = []
    skipped: List[Tuple[bool, bool]] = []
    scales: List[float] = []
    for step in range(steps):
        x = batch(step, policy or dtype)
        outs = []
        for k, (m, o, s) in enumerate(((model, opt, scalers[0]), (ref, ref_opt, scalers[1]))):
            o.zero_grad()
            if k == 1 and policy is not None:
                low = copy.deepcopy(m).to(policy)
                loss = low(x).float().pow(2).mean()
                (s.scale(loss) if s else loss).backward()
                for p, q in zip(m.parameters(), low.parameters()):
                    p.grad = q.grad.float()
            else:
                loss = m(x).float().pow(2).mean()
                (s.scale(loss) if s else loss).backward()
            if inf_at is not None and step == inf_at[0] and (k == 1 or rank == inf_at[1]):
                # the sharded model: in one rank's local shard; its twin: in the whole grad
                g = next(m.parameters()).grad
                _dtensor.local(g).view(-1)[0] = float("inf")
            before = params_of(m)
            n = None
            if clip is not None and s is not None:
                n = s.clip_grad_norm_(o, clip)
            elif clip is not None:
                n = torch.nn.utils.clip_grad_norm_(list(m.parameters()), clip)
                n = full(n)
            if s is not None:
                s.step(o)
                s.update()
            else:
                o.step()
            outs.append((None if n is None else float(n),
                         bitwise(before, params_of(m)),
                         s.get_scale() if s else 1.0))
        norms.append((outs[0][0], outs[1][0]))
        skipped.append((outs[0][1], outs[1][1]))
        scales.append(outs[0][2])
    return {
        "bitwise": bitwise(params_of(model), params_of(ref)),
        "max_diff": max(float((a.double() - b.double()).abs().max())
                        for a, b in zip(params_of(model), params_of(ref))),
        "norms": norms, "skipped": skipped, "scales": scales,
        "opt": opt, "model": model,
    }


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of this rank's optimizer state: the local shards of DTensor state tensors."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                t = _dtensor.local(v)
                total += t.numel() * t.element_size()
    return total


def run_all(rank: int, world: int, out_dir: str) -> None:
    """Every case; the results (plain values) go to out_dir/rank<k>.pt."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE, (world,))
    r: Result = {}

    def adamw(params: Any) -> Any:
        return mixprec.optim.AdamW(params, lr=1e-2)

    def adam(params: Any) -> Any:
        return mixprec.optim.Adam(params, lr=1e-2, weight_decay=0.1)

    def sgd(params: Any) -> Any:
        return mixprec.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True)

    cases: Dict[str, Dict[str, Any]] = {
        "bf16_adamw": dict(dtype=torch.bfloat16, make_opt=adamw, use_scaler=False),
        "bf16_adam": dict(dtype=torch.bfloat16, make_opt=adam, use_scaler=False),
        "bf16_sgd": dict(dtype=torch.bfloat16, make_opt=sgd, use_scaler=False),
        "fp16_adamw_scaler": dict(dtype=torch.float16, make_opt=adamw, use_scaler=True),
        "fp16_sgd_scaler": dict(dtype=torch.float16, make_opt=sgd, use_scaler=True),
        "fp32_adamw": dict(dtype=torch.float32, make_opt=adamw, use_scaler=False),
        "fp32_policy_bf16": dict(dtype=torch.float32, make_opt=adamw, use_scaler=False,
                                 policy=torch.bfloat16),
        "fp32_policy_fp16_scaler": dict(dtype=torch.float32, make_opt=adamw, use_scaler=True,
                                        policy=torch.float16),
        "bf16_clip_folded": dict(dtype=torch.bfloat16, make_opt=adamw, use_scaler=True,
                                 clip=0.05),
        "fp32_clip_unfused": dict(
            dtype=torch.float32, make_opt=lambda p: torch.optim.AdamW(p, lr=1e-2),
            use_scaler=True, clip=0.05),
        # (at world size 1 both go into rank 0's shard)
        "fp16_inf_rank1": dict(dtype=torch.float16, make_opt=adamw, use_scaler=True,
                               inf_at=(1, min(1, world - 1))),
        "fp16_inf_rank0_sgd": dict(dtype=torch.float16, make_opt=sgd, use_scaler=True,
                                   inf_at=(2, 0)),
    }
    for name, kw in cases.items():
        res = train_pair(mesh, **kw)
        opt = res.pop("opt")
        model = res.pop("model")
        res["state_types"] = sorted({type(v).__name__ for st in opt.state.values()
                                     for k, v in st.items() if k != "step"})
        res["local_numels"] = [_dtensor.local(p).numel() for p in model.parameters()]
        r[name] = res

    r["plain_tensors_on_shards"] = plain_tensors_on_shards(mesh)
    r["memory"] = memory(mesh, world)
    r["dcp"] = dcp_resume(mesh, os.path.join(out_dir, "ckpt"))
    r["dcp8"] = dcp_resume(mesh, os.path.join(out_dir, "ckpt8"), state_bits=8)
    r["eight_bit"] = eight_bit(mesh, world)
    r["ops"] = ops_on_dtensors(mesh)
    r["trainer"] = trainer_modes(mesh, out_dir)
    torch.save(r, os.path.join(out_dir, f"rank{rank}.pt"))


def plain_tensors_on_shards(mesh: Any) -> Result:
    """Whether every step hands the op plain local tensors (the optimizer unwraps the
    DTensors itself: no DTensor dispatch per step)."""
    model = shard(tiny_model(torch.bfloat16), mesh)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    op = mixprec.ops.fused_adam_
    seen = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        named = dict(zip(("params", "grads"), args), **kwargs)
        seen.append(all(type(t) is torch.Tensor for t in named["params"] + named["grads"]))
        return op(*args, **kwargs)

    mixprec.ops.fused_adam_ = spy
    try:
        for step in range(4):
            opt.zero_grad()
            model(batch(step, torch.bfloat16)).float().pow(2).mean().backward()
            opt.step()
    finally:
        mixprec.ops.fused_adam_ = op
    return {"plain": seen}


def memory(mesh: Any, world: int) -> Result:
    """Per-rank optimizer state bytes, sharded vs unsharded (bf16 params + masters)."""
    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 33)).to(DEVICE, torch.bfloat16)
    ref = copy.deepcopy(big)
    fully_shard, _ = _dtensor.fsdp2()
    for layer in big:
        fully_shard(layer, mesh=mesh)
    fully_shard(big, mesh=mesh)
    out = {}
    for name, m in (("sharded", big), ("unsharded", ref)):
        opt = mixprec.optim.AdamW(m.parameters(), lr=1e-3)
        m(torch.randn(2, 64, dtype=torch.bfloat16, device=DEVICE)).float().sum().backward()
        opt.step()
        out[name] = state_bytes(opt)
    out["world"] = world
    return out


def dcp_resume(mesh: Any, path: str, state_bits: int = 32) -> Result:
    """DCP save after 2 steps, then 2 more steps; a fresh model + optimizer loaded from the
    checkpoint and stepped the same 2 steps must end bit for bit where the first did.
    ``state_bits=8``: every 2-D param with 8-bit moments (blocks inside rows)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    eight = {"state_bits": 8, "min_8bit_size": 0} if state_bits == 8 else {}

    def make() -> Tuple[nn.Module, Any, Any]:
        m = shard(tiny_model(torch.float16), mesh)
        return m, mixprec.optim.AdamW(m.parameters(), lr=1e-2, **eight), mixprec.GradScaler(
            DEVICE, init_scale=2.0**10, growth_interval=1)

    def step(m: nn.Module, o: Any, s: Any, k: int) -> None:
        o.zero_grad()
        s.scale(m(batch(k, torch.float16)).float().pow(2).mean()).backward()
        s.step(o)
        s.update()

    m, o, s = make()
    for k in range(2):
        step(m, o, s, k)
    msd, osd = get_state_dict(m, o)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    plain = o.state_dict()  # torch's state_dict with DTensor state
    scaler_state = s.state_dict()
    for k in range(2, 4):
        step(m, o, s, k)
    first = params_of(m)
    masters = [full(t).clone() for t in o.master_params()]

    m2, o2, s2 = make()
    msd2, osd2 = get_state_dict(m2, o2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(m2, o2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    s2.load_state_dict(scaler_state)
    for k in range(2, 4):
        step(m2, o2, s2, k)
    second = params_of(m2)
    masters2 = [full(t).clone() for t in o2.master_params()]

    # the plain state_dict round trip: a third optimizer loads it and matches o's after 2
    m3, o3, _ = make()
    o3.load_state_dict(plain)
    loaded_types = sorted({type(v).__name__ for st in o3.state.values() for k, v in st.items()
                           if k != "step"})
    # an unsharded optimizer's state dict (a single-device checkpoint) loads into the
    # sharded optimizer: each rank takes its shard of every state tensor
    # (8-bit: each rank quantizes its shard of the read-back moments, so the codes differ
    # from the unsharded ones; compare the values read back, within one quantization)
    ref = tiny_model(torch.float16)
    ref_opt = mixprec.optim.AdamW(ref.parameters(), lr=1e-2)
    ref(batch(0, torch.float16)).float().pow(2).mean().backward()
    ref_opt.step()
    m4, o4, _ = make()
    o4.load_state_dict(ref_opt.state_dict())

    def values(opt: Any, p: torch.Tensor, k: str) -> torch.Tensor:
        t = opt.state[p][k]
        if t.dtype != torch.uint8:
            return full(t)
        from mixprec.optim import _state8

        table = "dynamic8-signed" if k == "exp_avg" else "dynamic8-unsigned"
        return full(_state8.read_back(t, opt.state[p][k + "_absmax"], table, p))

    from_unsharded = all(
        _dtensor.is_dtensor(o4.state[p][k]) and (
            torch.equal(values(o4, p, k), ref_opt.state[q][k]) if state_bits == 32 else
            bool(((values(o4, p, k) - ref_opt.state[q][k]).abs()
                  <= ref_opt.state[q][k].abs().max() * 0.1).all()))
        for p, q in zip(m4.parameters(), ref.parameters())
        for k in ("exp_avg", "exp_avg_sq", "master_param"))
    return {"bitwise": bitwise(first, second), "masters": bitwise(masters, masters2),
            "from_unsharded": from_unsharded,
            "osd_keys": sorted(next(iter(osd.get("state", {}).values()), {}).keys()),
            "loaded_types": loaded_types}


def eight_bit(mesh: Any, world: int) -> Result:
    """8-bit state on a sharded model (every 2-D param 8-bit, the 1-D ones float32): the
    blocks lie inside rows, which the shards keep whole, so the sharded run equals the
    unsharded one bit for bit, uneven and empty shards included. ``world``: the ranks a
    param is sharded over (on an HSDP mesh, the size of its shard dimension)."""
    out: Result = {}
    for cls, kw in (("AdamW8bit", {"lr": 1e-2}),
                    ("SGD8bit", {"lr": 1e-1, "momentum": 0.9, "nesterov": True})):
        ref = tiny_model(torch.bfloat16)
        model = shard(copy.deepcopy(ref), mesh)
        make = getattr(mixprec.optim, cls)
        opt = make(model.parameters(), min_8bit_size=0, **kw)
        ref_opt = make(ref.parameters(), min_8bit_size=0, **kw)
        for step in range(3):
            x = batch(step, torch.bfloat16)
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                m(x).float().pow(2).mean().backward()
                o.step()
        first = "exp_avg" if cls == "AdamW8bit" else "momentum_buffer"
        p0 = next(iter(model.parameters()))
        out[cls] = {
            "bitwise": bitwise(params_of(model), params_of(ref)),
            "absmax_placements": str(opt.state[p0][first + "_absmax"].placements),
            "codes_dtensor": all(_dtensor.is_dtensor(opt.state[p][first]) and
                                 (opt.state[p][first].dtype == torch.uint8) == (p.dim() >= 2)
                                 for p in model.parameters()),
            "state_bytes": state_bytes(opt),
        }
    return out


def ops_on_dtensors(mesh: Any) -> Result:
    """mixprec.ops.* and torch.ops.mixprec.* called with DTensor lists."""
    from torch.distributed.tensor import Shard, distribute_tensor

    rank, last = dist.get_rank(), dist.get_world_size() - 1
    out: Result = {}
    torch.manual_seed(5)
    whole = [torch.randn(n).view(*s).to(DEVICE) for n, s in ((21, (7, 3)), (1, (1,)), (5, (5,)))]
    dts = [distribute_tensor(t, mesh, [Shard(0)]) for t in whole]
    # check_finite_ with an inf in the last rank's shard only (the last element of the whole)
    if rank == last:
        dts[0]._local_tensor.view(-1)[-1] = float("inf")
    for via in ("mixprec", "torch"):
        flag = torch.zeros((), device=DEVICE)
        if via == "mixprec":
            mixprec.ops.check_finite_(dts, flag)
        else:
            torch.ops.mixprec.check_finite_(dts, flag)
        out[f"check_{via}"] = float(flag)
    inv = torch.full((), 0.25, device=DEVICE)
    for via in ("mixprec", "torch"):
        flag = torch.zeros((), device=DEVICE)
        copies = [distribute_tensor(t.clone(), mesh, [Shard(0)]) for t in whole]
        fn = (mixprec.ops.check_finite_and_norm_ if via == "mixprec"
              else torch.ops.mixprec.check_finite_and_norm_)
        n = fn(copies, flag, inv, 2.0)
        out[f"norm_{via}"] = (float(n), float(flag))
        n_inf = fn(copies, flag, inv, float("inf"))
        out[f"norm_inf_{via}"] = float(n_inf)
    out["norm_ref"] = float(torch.linalg.vector_norm(
        torch.cat([t.double().flatten() * 0.25 for t in whole])))
    out["norm_inf_ref"] = float(max(t.abs().max() for t in whole) * 0.25)
    # unscale_and_check_ on DTensors: the shards unscaled, the verdict shared
    copies = [distribute_tensor(t.clone(), mesh, [Shard(0)]) for t in whole]
    flag = torch.zeros((), device=DEVICE)
    if rank == 0:
        copies[2]._local_tensor[0] = float("nan")
    torch.ops.mixprec.unscale_and_check_(copies, flag, inv)
    out["unscale_flag"] = float(flag)
    out["unscale_ok"] = bool(torch.equal(full(copies[0]), whole[0] * 0.25))
    # fused_adam_ on DTensors = on the whole
    p_whole = torch.randn(7, 3).to(DEVICE)
    g_whole = torch.randn(7, 3).to(DEVICE)
    lists_whole = [[p_whole.clone()], [g_whole], [torch.zeros(7, 3, device=DEVICE)],
                   [torch.zeros(7, 3, device=DEVICE)]]
    lists_dt = [[distribute_tensor(t[0].clone(), mesh, [Shard(0)])] for t in lists_whole]
    lr = torch.full((), 0.1, dtype=torch.float64, device=DEVICE)
    for lists in (lists_whole, lists_dt):
        torch.ops.mixprec.fused_adam_(*lists, [], [], [torch.zeros((), device=DEVICE)], lr,
                                      0.9, 0.999, 0.01, 1e-8, False, False, True, None, None, None,
                                      False, 0)
    out["adam_equal"] = bool(torch.equal(full(lists_dt[0][0]), lists_whole[0][0]))
    # a scale update refuses DTensors, naming the op
    try:
        scale = distribute_tensor(torch.ones(1, device=DEVICE), mesh, [Shard(0)])
        tracker = torch.zeros((), dtype=torch.int32, device=DEVICE)
        torch.ops.mixprec.update_scale_(scale, tracker, torch.zeros((), device=DEVICE), 2.0,
                                        0.5, 10)
        out["update_scale_error"] = None
    except RuntimeError as e:
        out["update_scale_error"] = str(e)
    return out



def run_hsdp(rank: int, world: int, out_dir: str) -> None:
    """HSDP: a (replicate, shard) mesh of 2 x 2 processes; grads are Replicate x Shard."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE, (2, world // 2), mesh_dim_names=("replicate", "shard"))
    r: Result = {}
    cases: Dict[str, Dict[str, Any]] = {
        "clip_folded": dict(dtype=torch.bfloat16, use_scaler=True, clip=0.05,
                            make_opt=lambda p: mixprec.optim.AdamW(p, lr=1e-2)),
        "clip_unfused": dict(dtype=torch.float32, use_scaler=True, clip=0.05,
                             make_opt=lambda p: torch.optim.AdamW(p, lr=1e-2)),
        "inf_rank3": dict(dtype=torch.float16, use_scaler=True, inf_at=(1, 3),
                          make_opt=lambda p: mixprec.optim.AdamW(p, lr=1e-2)),
    }
    for name, kw in cases.items():
        res = train_pair(mesh, **kw)
        model = res.pop("model")
        res.pop("opt")
        res["placements"] = [str(p.placements) for p in model.parameters()][:1]
        r[name] = res
    r["eight_bit"] = eight_bit(mesh, mesh.size(1))  # blocks over the shard dim's chunks
    torch.save(r, os.path.join(out_dir, f"rank{rank}.pt"))


def trainer_modes(mesh: Any, out_dir: str) -> Result:
    """MixedPrecisionTrainer in each mode on a sharded model and on its unsharded twin,
    the same epoch each: whether the params end bit for bit equal, and the losses.
    MANUAL: the model converted to bfloat16 before fully_shard (and, the wrong order,
    a float32 sharded model: the error)."""
    from mixprec import MixedPrecisionConfig, MixedPrecisionTrainer

    data = [(batch(k, torch.float32),
             torch.randn(4, 1, generator=torch.Generator().manual_seed(k)).to(DEVICE))
            for k in range(4)]
    out: Result = {}
    for mode, level in (("automatic", "bf16"), ("automatic", "fp16"),
                        ("gradient_scaling", "fp32"), ("selective", "bf16"),
                        ("adaptive", "bf16"), ("manual", "bf16")):
        losses, finals = [], []
        for sharded in (True, False):
            model = tiny_model()
            if mode == "manual":  # converted before fully_shard, as the error says
                from mixprec.train.modes import convert_params

                convert_params(model, torch.bfloat16)
            if sharded:
                shard(model, mesh)
            cfg = MixedPrecisionConfig(mode=mode, precision_level=level,
                                       selective_layers=("Linear",), logging_frequency=1000)
            trainer = MixedPrecisionTrainer(cfg, device=DEVICE)
            opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
            trainer.setup_training(model, opt, torch.nn.functional.mse_loss)
            epoch = trainer.train_epoch(data)
            losses.append(epoch["epoch_loss"])
            finals.append(params_of(model))
        out[f"{mode}_{level}"] = {"bitwise": bitwise(finals[0], finals[1]),
                                  "losses": losses}
    # the trainer's own checkpoint of a sharded model: a DCP directory (every rank writes
    # its shards into the same directory); a fresh sharded trainer loads it and goes on
    # exactly as the saved one does (other world sizes: test_trainer_dcp.py)
    def sharded_trainer() -> Any:
        model = shard(tiny_model(), mesh)
        trainer = MixedPrecisionTrainer(
            MixedPrecisionConfig(mode="automatic", precision_level="fp16", logging_frequency=1000),
            device=DEVICE)
        trainer.setup_training(model, mixprec.optim.AdamW(model.parameters(), lr=1e-2),
                               torch.nn.functional.mse_loss)
        return trainer

    first = sharded_trainer()
    first.train_epoch(data[:2])
    path = os.path.join(out_dir, "trainer_ckpt")
    first.save_state(path)
    second = sharded_trainer()
    second.load_state(path, strict_config=True)
    for t in (first, second):
        t.train_epoch(data[2:])
    out["trainer_checkpoint"] = bitwise(params_of(first.model), params_of(second.model))
    # the manager's monitoring (performance_monitoring): the grad norm of the whole model
    from mixprec import MixedPrecisionManager

    norms = []
    for sharded in (True, False):
        model = tiny_model()
        if sharded:
            shard(model, mesh)
        manager = MixedPrecisionManager(
            model, mixprec.optim.AdamW(model.parameters(), lr=1e-2),
            MixedPrecisionConfig(mode="automatic", precision_level="bf16",
                                 performance_monitoring=True), device=DEVICE)
        with manager.autocast():
            loss = torch.nn.functional.mse_loss(model(data[0][0]), data[0][1])
        manager.backward(loss)
        result = manager.step()
        norms.append((float(result.grad_norm), float(result.underflow)))
    out["monitor_norms"] = norms
    model = shard(tiny_model(), mesh)
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(mode="manual", precision_level="bf16"),
                                    device=DEVICE)
    try:
        trainer.setup_training(model, mixprec.optim.AdamW(model.parameters()),
                               torch.nn.functional.mse_loss)
        out["manual_after_shard"] = None
    except ValueError as e:
        out["manual_after_shard"] = str(e)
    return out
