"""Benchmark: mixprec.ops.unscale_and_check_ vs torch._amp_foreach_non_finite_check_and_unscale_.

Sets: (a) GPT-2 small gradient shapes (148 tensors, 124M elements), (b) 2,000 tensors of
4,096 elements, (c) one tensor of 2^28 elements; fp32, fp16, bf16 (torch's op has no bf16:
shown as n/a). Prints time, GB/s (each element read and written once), the ratio
torch/mixprec (> 1: mixprec faster), the fraction of the copy bandwidth measured in this
run for the same number of bytes and, on CUDA, kernel launches per call.

    python benchmarks/bench_unscale.py [--device cpu|cuda] [--sets a,b,c] [--min-run-time S]
"""

from __future__ import annotations

import argparse

import torch

import mixprec
from _common import copy_bandwidth, count_cuda_launches, gpt2_small_shapes, header, time_fn

SETS = {
    "a": ("gpt2-small (148 t, 124M)", lambda: gpt2_small_shapes()),
    "b": ("2000 x 4096", lambda: [(4096,)] * 2000),
    "c": ("1 x 2^28", lambda: [(2**28,)]),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# inv_scale != 1 (so both ops really write) yet close enough to 1 that repeated runs neither
# overflow nor drift into denormals.
INV_SCALE = 1.0 + 2.0**-20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sets", default="a,b,c")
    ap.add_argument("--dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--min-run-time", type=float, default=1.0)
    args = ap.parse_args()
    device = torch.device(args.device)
    print(header("bench_unscale: unscale + inf/NaN check", device))
    cols = (f"{'set':<26}{'dtype':<6}{'mixprec ms':>11}{'torch ms':>10}{'ratio':>7}"
            f"{'GB/s':>8}{'copy GB/s':>10}{'% copy':>7}")
    if device.type == "cuda":
        cols += f"{'launches m/t':>14}"
    print(cols)
    for key in args.sets.split(","):
        name, shapes_fn = SETS[key]
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            grads = [torch.randn(s, device=device).to(dtype) for s in shapes_fn()]
            nbytes = sum(g.numel() * g.element_size() for g in grads)
            found = torch.zeros((), device=device)
            inv = torch.full((), INV_SCALE, device=device)

            def ours(grads=grads, found=found, inv=inv):
                mixprec.ops.unscale_and_check_(grads, found, inv)

            def theirs(grads=grads, found=found, inv=inv):
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)

            torch_ok = dtype != torch.bfloat16  # torch._amp_* has no bf16 kernel
            t_ours = time_fn(ours, device, args.min_run_time)
            t_theirs = time_fn(theirs, device, args.min_run_time) if torch_ok else None
            copy = copy_bandwidth(nbytes, device, args.min_run_time)
            gbs = 2 * nbytes / t_ours / 1e9
            line = (f"{name:<26}{dname:<6}{t_ours * 1e3:>11.3f}"
                    f"{(f'{t_theirs * 1e3:.3f}' if t_theirs else 'n/a'):>10}"
                    f"{(f'{t_theirs / t_ours:.2f}' if t_theirs else 'n/a'):>7}"
                    f"{gbs:>8.1f}{copy:>10.1f}{100 * gbs / copy:>6.0f}%")
            if device.type == "cuda":
                lt = count_cuda_launches(theirs) if torch_ok else 0
                line += f"{count_cuda_launches(ours):>8}/{lt if torch_ok else 'n/a'}"
            print(line, flush=True)
            del grads


if __name__ == "__main__":
    main()
