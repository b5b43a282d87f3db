"""A hand-written mixed-precision training loop on mixprec's fused ops.

Trains a small MLP classifier on synthetic data with autocast (bf16 on CPU, fp16 on CUDA)
and dynamic loss scaling done by hand with three ops:

* ``mixprec.ops.unscale_and_check_`` — unscale every grad and detect inf/NaN in one call;
* ``mixprec.ops.update_scale_`` — grow/back off the loss scale on the device;
* the optimizer step is skipped when ``found_inf`` is set.

At step 30 an inf is injected into one gradient to show the skip and the backoff.
Run: ``python examples/train_minimal.py``.
"""

from __future__ import annotations

import time

import torch
from torch import nn

import mixprec


def make_data(n: int, dim: int, classes: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, dim, generator=g) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centers[labels] + torch.randn(n, dim, generator=g)
    return x.to(device), labels.to(device)


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    print(f"mixprec {mixprec.__version__} | device {device} | autocast {amp_dtype} | "
          f"CUDA kernels: {mixprec.has_cuda_kernels()}")

    x, y = make_data(4096, 32, 8, device)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = [p for p in model.parameters()]

    scale = torch.full((), 2.0**16, device=device)
    growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
    found_inf = torch.zeros((), device=device)
    skipped = 0
    start = time.perf_counter()
    for step in range(1, 121):
        idx = torch.randint(0, x.shape[0], (256,), device=device)
        with torch.autocast(device.type, dtype=amp_dtype):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        (loss.float() * scale).backward()
        if step == 30:
            params[0].grad.view(-1)[0] = float("inf")  # simulate an overflow
        grads = [p.grad for p in params if p.grad is not None]
        found_inf.zero_()
        inv_scale = scale.double().reciprocal().float()
        mixprec.ops.unscale_and_check_(grads, found_inf, inv_scale)
        # The demo reads found_inf on the host to decide the step (one sync per step);
        # mixprec's GradScaler and optimizers make this decision on the device instead.
        overflow = bool(found_inf.item())
        if overflow:
            skipped += 1
        else:
            opt.step()
        mixprec.ops.update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 20)
        if step % 10 == 0 or overflow:
            print(f"step {step:4d}  loss {loss.item():.4f}  scale {scale.item():>9.0f}"
                  f"{'  <- overflow: step skipped, scale backed off' if overflow else ''}")
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"done in {time.perf_counter() - start:.1f}s: accuracy {acc:.3f}, skipped steps "
          f"{skipped}, final scale {scale.item():.0f}")
    assert skipped == 1, "exactly the injected overflow should have been skipped"
    assert acc > 0.9, "the model should have learned the synthetic task"


if __name__ == "__main__":
    main()
