"""The Python half of the C++ <-> Python checks, run by ctest (tests/cpp).

    python interop.py scaler --tool PATH --dir DIR
        a GradScaler state saved by C++ loads in Python (mixprec's class and
        torch.amp's) with the keys and values Python's own scaler has after the
        same iterations; a state saved by Python loads in C++.
    python interop.py optim --tool PATH --dir DIR
        mixprec::optim::{AdamW,Adam,SGD} + GradScaler in C++ and
        mixprec.optim.* + mixprec.GradScaler in Python, on the same data and
        weights: equal loss sequences (1e-6 relative), skipped steps, scales
        and final weights/masters.
    python interop.py ckpt --tool PATH --dir DIR
        optimizer state dicts: one saved by C++ (mixprec::torch_save of
        optimizer.state_dict()) loads into mixprec.optim (and torch.optim) and
        continues with the same losses; one saved by Python loads in C++.
    python interop.py example --bin PATH [--twin PATH] [-- ARGS...]
        examples/cpp/train_mlp.cpp and its Python twin print the same losses
        (1e-6 relative), scales and skipped steps.

Exit status 77 (ctest: skipped) when this Python cannot import mixprec with
its compiled extension (e.g. test-cpp run before the Python build).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from pathlib import Path

SKIP = 77
REL = 1e-6

# Same thread count in this process and in the programs it runs, so that
# reductions split the same way on both sides.
os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch

    import mixprec
    from mixprec import optim as mp_optim
except Exception as exc:  # pragma: no cover - environment dependent
    print(f"SKIP: cannot import torch/mixprec: {exc}")
    sys.exit(SKIP)

_passed = 0
_failed = 0


def check(ok: bool, what: str) -> None:
    global _passed, _failed
    if ok:
        _passed += 1
    else:
        _failed += 1
        print(f"FAIL {what}")


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, sep="\n")
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    return proc.stdout


def rel_close(a: float, b: float, rel: float = REL) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


# ----------------------------------------------------------------------- scaler
SCALER_KW = dict(init_scale=512.0, growth_interval=2, hysteresis=2)
SCALER_ITERS = 7


def scaler_inf_at(it: int) -> bool:  # as interop_tool.cpp
    return it in (1, 2, 5)


def python_scaler_after_scenario() -> mixprec.GradScaler:
    w = torch.ones(4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = mixprec.GradScaler("cpu", **SCALER_KW)
    for it in range(SCALER_ITERS):
        opt.zero_grad()
        scaler.scale((w * w).sum()).backward()
        if scaler_inf_at(it):
            w.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
    return scaler


def cmd_scaler(args: argparse.Namespace) -> None:
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    # C++ -> Python
    path = d / "scaler_from_cpp.pt"
    run([args.tool, "scaler-save", str(path)])
    sd = torch.load(path, weights_only=True)
    want = python_scaler_after_scenario().state_dict()
    print("C++ state:   ", sd)
    print("Python state:", want)
    check(isinstance(sd, dict), "C++ state loads as a dict")
    check(list(sorted(sd)) == list(sorted(want)), f"keys {sorted(sd)} vs {sorted(want)}")
    for k, v in want.items():
        check(type(sd.get(k)) is type(v) and sd.get(k) == v, f"{k}: {sd.get(k)!r} vs {v!r}")
    ours = mixprec.GradScaler("cpu", **SCALER_KW)
    ours.load_state_dict(sd)
    check(ours.state_dict() == want, "mixprec.GradScaler.load_state_dict(C++ state)")
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(sd)
    check(theirs.get_scale() == want["scale"], "torch.amp.GradScaler loads the C++ state")

    # Python -> C++ (values a C++ scaler would not reach by itself)
    py = mixprec.GradScaler("cpu", **SCALER_KW)
    py.load_state_dict({"scale": 1234.5, "growth_factor": 3.0, "backoff_factor": 0.25,
                        "growth_interval": 17, "_growth_tracker": 5, "_hysteresis_left": 1})
    src = py.state_dict()
    path2 = d / "scaler_from_python.pt"
    torch.save(src, path2)
    shown = {}
    for line in run([args.tool, "scaler-show", str(path2)]).splitlines():
        key, kind, value = line.split()
        shown[key] = float(value) if kind == "float" else int(value)
        check(kind == ("float" if isinstance(src[key], float) else "int"), f"{key} type")
    check(shown == src, f"C++ loaded {shown} vs Python {src}")
    # torch.amp's state dict (no _hysteresis_left) loads too
    t = torch.amp.GradScaler("cpu", init_scale=8.0)
    t.scale(torch.ones(()))
    path3 = d / "scaler_from_torch.pt"
    torch.save(t.state_dict(), path3)
    shown = dict(line.split()[::2] for line in run([args.tool, "scaler-show", str(path3)])
                 .splitlines())
    check(float(shown["scale"]) == 8.0 and int(shown["_hysteresis_left"]) == 2,
          f"torch.amp state in C++: {shown}")


# ----------------------------------------------------------------------- optim
def forward(p: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:  # as the tool
    F = torch.nn.functional
    h = torch.relu(F.linear(x.to(p[0].dtype), p[0], p[1]))
    return F.linear(h, p[2], p[3])


def python_run(kind: str, ref: dict) -> dict:
    params = [t.clone().requires_grad_() for t in ref["initial"]]
    opt = make_python_optimizer(kind, params, lr=1e-2)
    scaler = mixprec.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    x, y = ref["x"], ref["y"]
    losses, scales, stepped = [], [], []
    for it in range(ref["steps"]):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(params, x).float(), y)
        scaler.scale(loss).backward()
        if it == ref["inject"]:
            params[2].grad.view(-1)[3] = float("inf")
        if it % 2 == 1:
            scaler.clip_grad_norm_(opt, 0.5)
        scaler.step(opt)
        scaler.update()
        stepped.append(0 if scaler.step_was_skipped else 1)
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return {"losses": losses, "scales": scales, "stepped": stepped,
            "final": [p.detach() for p in params], "masters": opt.master_params()}


def cmd_optim(args: argparse.Namespace) -> None:
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        for dtype in ("fp32", "bf16") if split_bits(kind) else ("fp32", "bf16", "fp16"):
            out = d / f"optim_{kind}_{dtype}.pt"
            run([args.tool, "optim-run", kind, dtype, str(out)])
            ref = torch.load(out, weights_only=True)
            got = python_run(kind, ref)
            name = f"{kind}/{dtype}"
            cpp_losses = ref["losses"].tolist()
            ok = len(cpp_losses) == len(got["losses"]) and all(
                rel_close(a, b) for a, b in zip(cpp_losses, got["losses"]))
            check(ok, f"{name} losses\n  C++    {cpp_losses}\n  Python {got['losses']}")
            check(ref["scales"].tolist() == got["scales"], f"{name} scales")
            check(ref["stepped"].tolist() == got["stepped"], f"{name} skipped steps")
            check(got["stepped"][ref["inject"]] == 0, f"{name}: the inf step was skipped")
            for i, (a, b) in enumerate(zip(ref["final"], got["final"])):
                check(a.dtype == b.dtype and torch.allclose(a.float(), b.float(), rtol=REL,
                                                            atol=0.0),
                      f"{name} final param {i} max diff "
                      f"{(a.float() - b.float()).abs().max().item()}")
            for i, (a, b) in enumerate(zip(ref["masters"], got["masters"])):
                check(a.dtype == b.dtype and torch.allclose(a.float(), b.float(), rtol=REL,
                                                            atol=0.0),
                      f"{name} master {i}")
            print(f"{name}: losses {cpp_losses[0]:.6g} .. {cpp_losses[-1]:.6g}, "
                  f"skipped {ref['stepped'].tolist().count(0)}")


KINDS = ("adamw", "adam", "sgd", "adamw8", "sgd8", "adamw-s16", "sgd8-s8")
EIGHT_BIT = {"state_bits": 8, "min_8bit_size": 64}  # as make_optimizer


def split_bits(kind: str) -> int | None:
    """The master_correction_bits of a kind with a -s16 / -s8 suffix, else None."""
    return int(kind.split("-s")[1]) if "-s" in kind else None


def make_python_optimizer(kind: str, params: list, lr: float):  # as make_optimizer
    base = kind.split("-s")[0]
    eight = EIGHT_BIT if base.endswith("8") else {}
    split = {"master_correction_bits": split_bits(kind)}
    if base in ("adamw", "adamw8"):
        return mp_optim.AdamW(params, lr=lr, weight_decay=0.1, **eight, **split)
    if base == "adam":
        return mp_optim.Adam(params, lr=lr, weight_decay=0.01, amsgrad=True, **split)
    return mp_optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-3,
                        **eight, **split)


def python_train(opt, params, x, y, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(params, x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def cmd_ckpt(args: argparse.Namespace) -> None:
    for kind in KINDS:
        for dtype in ("fp32", "bf16"):
            name = f"{kind}/{dtype}"
            d = Path(args.dir) / f"ckpt_{kind}_{dtype}"
            d.mkdir(parents=True, exist_ok=True)
            # C++ -> Python: the C++ optimizer state continues in Python
            run([args.tool, "optim-ckpt", kind, dtype, str(d), "start"])
            data = torch.load(d / "data.pt", weights_only=True)
            sd = torch.load(d / "opt_cpp.pt", weights_only=True)
            cont = torch.load(d / "cpp_cont.pt", weights_only=True)
            params = [t.clone().requires_grad_() for t in data["params"]]
            opt = make_python_optimizer(kind, params, lr=0.5)
            opt.load_state_dict(sd)
            check(opt.param_groups[0]["lr"] == 1e-2, f"{name}: lr from the C++ state dict")
            if dtype == "bf16" and split_bits(kind):
                want = torch.int16 if split_bits(kind) == 16 else torch.int8
                check(all(sd["state"][i]["master_correction"].dtype == want
                          and "master_param" not in sd["state"][i] for i in range(4))
                      and sd["param_groups"][0]["master_correction_bits"] == split_bits(kind),
                      f"{name}: split masters in the C++ state dict")
            elif dtype == "bf16":
                check(all("master_param" in opt.state[p] for p in params),
                      f"{name}: masters from the C++ state dict")
            if dtype == "bf16" and not split_bits(kind):
                check(sd["param_groups"][0]["master_correction_bits"] is None,
                      f"{name}: float32 masters are master_correction_bits=None")
            if kind.endswith("8"):
                first = "exp_avg" if kind == "adamw8" else "momentum_buffer"
                coded = [opt.state[p][first].dtype == torch.uint8 for p in params]
                check(coded == [True, False, False, False] and
                      sd["state"][0].get("quant") == "dynamic8/rows/b256",
                      f"{name}: 8-bit state from the C++ state dict ({coded})")
            losses = python_train(opt, params, data["x"], data["y"], 3)
            check(all(rel_close(a, b) for a, b in zip(cont["losses"], losses)),
                  f"{name}: C++ -> Python continuation {cont['losses']} vs {losses}")
            for a, b in zip(cont["final"], params):
                check(torch.allclose(a.float(), b.detach().float(), rtol=REL, atol=0.0),
                      f"{name}: params after the Python continuation")
            # a torch.optim optimizer loads it too (extra keys ignored)
            if kind in ("adamw", "adam") and dtype == "fp32":
                cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
                tparams = [t.clone().requires_grad_() for t in data["params"]]
                topt = cls(tparams, lr=0.5, amsgrad=(kind == "adam"))
                topt.load_state_dict(torch.load(d / "opt_cpp.pt", weights_only=True))
                check(topt.param_groups[0]["lr"] == 1e-2, f"{name}: torch.optim loads it")
            # Python -> C++: Python's state after its steps continues in C++
            torch.save({"params": [p.detach() for p in params]}, d / "py_params.pt")
            torch.save(opt.state_dict(), d / "opt_py.pt")
            want = python_train(opt, params, data["x"], data["y"], 3)
            run([args.tool, "optim-ckpt", kind, dtype, str(d), "resume"])
            got = torch.load(d / "cpp_resume.pt", weights_only=True)
            check(got["lr"] == 1e-2, f"{name}: lr from the Python state dict")
            check(all(rel_close(a, b) for a, b in zip(got["losses"], want)),
                  f"{name}: Python -> C++ continuation {got['losses']} vs {want}")
            print(f"{name}: checkpoints both ways ok")


# ----------------------------------------------------------------------- example
LINE = re.compile(r"^step (\d+) loss (\S+) scale (\S+)( skipped)?$")


def parse_steps(text: str) -> list[tuple[int, float, float, bool]]:
    out = []
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m:
            out.append((int(m[1]), float(m[2]), float(m[3]), bool(m[4])))
    return out


def cmd_example(args: argparse.Namespace) -> None:
    twin = args.twin or str(Path(__file__).resolve().parents[2] / "examples" / "cpp"
                            / "train_mlp_twin.py")
    extra = args.rest
    cpp = parse_steps(run([args.bin, *extra]))
    py = parse_steps(run([sys.executable, twin, *extra]))
    check(len(cpp) > 0 and len(cpp) == len(py), f"{len(cpp)} C++ steps vs {len(py)} Python")
    for (s1, l1, sc1, k1), (s2, l2, sc2, k2) in zip(cpp, py):
        check(s1 == s2 and rel_close(l1, l2) and sc1 == sc2 and k1 == k2,
              f"step {s1}: C++ loss {l1!r} scale {sc1} skipped {k1} | "
              f"Python loss {l2!r} scale {sc2} skipped {k2}")
    check(any(k for *_, k in cpp), "the injected inf skipped a step")
    if cpp:
        print(f"{len(cpp)} steps: loss {cpp[0][1]:.6g} -> {cpp[-1][1]:.6g}, "
              f"skipped {[s for s, _, _, k in cpp if k]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("scaler", "optim", "ckpt"):
        p = sub.add_parser(name)
        p.add_argument("--tool", required=True)
        p.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    p = sub.add_parser("example")
    p.add_argument("--bin", required=True)
    p.add_argument("--twin")
    p.add_argument("--need-cuda", action="store_true",
                   help="skip (77) unless a CUDA device and CUDA kernels are present")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if getattr(args, "rest", None) and args.rest[0] == "--":
        args.rest = args.rest[1:]
    if getattr(args, "need_cuda", False) and not (torch.cuda.is_available()
                                                  and mixprec.has_cuda_kernels()):
        print("SKIP: no CUDA device (or no CUDA kernels)")
        return SKIP
    {"scaler": cmd_scaler, "optim": cmd_optim, "ckpt": cmd_ckpt,
     "example": cmd_example}[args.cmd](args)
    print(f"{_passed} passed, {_failed} failed")
    return 0 if _failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
