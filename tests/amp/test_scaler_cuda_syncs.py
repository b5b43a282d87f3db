"""mixprec-only GradScaler features: a scaler iteration on CUDA makes no host sync."""

from __future__ import annotations

import pytest
import torch

import mixprec
from _helpers import cuda_only, two_layer


# ------------------------------------------------------------------ CUDA: no host syncs
@cuda_only
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("policy", ["torch", "megatron"])
@pytest.mark.parametrize("optim", ["torch-fused", "mixprec-fp32", "mixprec-fp16-masters"])
def test_zero_host_syncs_with_fused_optimizer(clip, policy, optim):
    torch.manual_seed(0)
    model = two_layer("cuda")
    if optim == "torch-fused":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        if optim == "mixprec-fp16-masters":
            model = model.half()
        # clip=True then folds the clip into the optimizer's kernel
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    s = mixprec.GradScaler("cuda", policy=policy)
    x, y = torch.randn(16, 8, device="cuda"), torch.randn(16, 8, device="cuda")

    def iteration():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        s.scale(loss).backward()
        if clip:
            s.clip_grad_norm_(opt, 1.0)
        s.step(opt)
        s.update()

    iteration()  # lazy init, autograd warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(66):
            iteration()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert s.stats().steps == 67
