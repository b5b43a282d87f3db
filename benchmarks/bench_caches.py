"""What each small host-path cache saves: the same call with the cache as it is and with
the cache emptied before every call, side by side (CPU, one thread, tiny tensors, so a
call costs what the host spends on it).

The caches are the two small host-path caches left (the third, ``mixprec.ops._ROUTES``,
went with the pure-PyTorch fallback it chose between):

=====================  ==============================================================
lr tensors             ``Optimizer._lr_cache``: per (group, device), the float64 lr
                       tensor the kernel reads. Timed: ``mixprec.optim.AdamW.step()``
                       over ``--tensors`` one-element params, lr changed every step (as
                       a scheduler does: the cached tensor is refilled in place).
step signatures        ``amp.capability._STEP_SIG_CACHE``: whether an optimizer's ``step``
                       takes torch's deprecated ``grad_scaler`` argument. Timed:
                       ``mixprec.GradScaler`` ``step`` + ``update`` with
                       ``torch.optim.AdamW(fused=True)`` (the path that asks).
=====================  ==============================================================

Each figure is the best of ``--rounds`` blocks of ``--calls`` calls; the blocks of the two
variants alternate. The noise is the spread of the cached variant's blocks (median minus
best, relative); a saving below it is "within noise", and by the project's rule such a
cache goes. Checked once, untimed, on the timed objects: both variants move every param
and step the optimizer through the scaler.

    python benchmarks/bench_caches.py [--tensors 10] [--calls 200] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

import mixprec
from _common import CheckFailed
from mixprec.amp import capability

Variant = Callable[[], None]


def _blocks(a: Variant, b: Variant, calls: int, rounds: int) -> Tuple[List[float], List[float]]:
    """Per-call seconds of ``rounds`` blocks of ``calls`` calls of ``a`` and of ``b``,
    alternated (a drift of the machine lands in both)."""
    ta: List[float] = []
    tb: List[float] = []
    a(), b()  # warm up
    for _ in range(rounds):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) / calls)
    return ta, tb


def _params(n: int) -> List[torch.nn.Parameter]:
    out = []
    for _ in range(n):
        p = torch.nn.Parameter(torch.randn(1))
        p.grad = torch.randn(1)
        out.append(p)
    return out


def _moves_every_param(params: List[torch.nn.Parameter], variants: Tuple[Variant, Variant],
                       what: str) -> Callable[[], None]:
    """The untimed check of an optimizer case: each variant moves every param."""
    def check() -> None:
        for fn in variants:
            before = [p.detach().clone() for p in params]
            fn()
            if any(torch.equal(a, p) for a, p in zip(before, params)):
                raise CheckFailed(what)

    return check


def _lr_tensors(n: int) -> Tuple[Variant, Variant, Callable[[], None]]:
    params = _params(n)
    opt = mixprec.optim.AdamW(params, lr=1e-3)
    group = opt.param_groups[0]
    lrs = (1e-3, 2e-3)
    k = [0]

    def cached() -> None:
        k[0] ^= 1
        group["lr"] = lrs[k[0]]  # a scheduler's new value every step
        opt.step()

    def emptied() -> None:
        opt._lr_cache.clear()
        cached()

    return cached, emptied, _moves_every_param(params, (cached, emptied),
                                               "lr tensors: a param did not move")


def _step_signatures(n: int) -> Tuple[Variant, Variant, Callable[[], None]]:
    params = _params(n)
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    scaler = mixprec.GradScaler("cpu", init_scale=1.0, growth_interval=10**9)
    scaler.scale(torch.ones(()))

    def cached() -> None:
        scaler.step(opt)
        scaler.update()

    def emptied() -> None:
        capability._STEP_SIG_CACHE.clear()
        cached()

    return cached, emptied, _moves_every_param(
        params, (cached, emptied), "step signatures: the scaler did not step the optimizer")


CASES: Dict[str, Callable[[int], Tuple[Variant, Variant, Callable[[], None]]]] = {
    "lr tensors": _lr_tensors,
    "step signatures": _step_signatures,
}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, mixprec {mixprec.__version__}, CPU, 1 thread; "
          f"{args.tensors} one-element tensors; best of {args.rounds} x {args.calls} calls")
    print(f"{'cache':<16} {'cached us':>10} {'emptied us':>11} {'saving us':>10} "
          f"{'saving':>7} {'noise':>7}  verdict")
    status = 0
    for name, make in CASES.items():
        cached, emptied, check = make(args.tensors)
        try:
            check()
        except CheckFailed as exc:
            print(f"check failed: {exc}")
            status = 1
            continue
        tc, te = _blocks(cached, emptied, args.calls, args.rounds)
        best_c, best_e = min(tc), min(te)
        noise = (statistics.median(tc) - best_c) / best_c
        saving = (best_e - best_c) / best_c
        verdict = "saves" if saving > noise else "within noise"
        print(f"{name:<16} {best_c * 1e6:>10.2f} {best_e * 1e6:>11.2f} "
              f"{(best_e - best_c) * 1e6:>10.2f} {saving:>7.1%} {noise:>7.1%}  {verdict}")
    return status


if __name__ == "__main__":
    sys.exit(main())
