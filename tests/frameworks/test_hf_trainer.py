"""The Hugging Face Trainer with mixprec's optimizers on CPU, a tiny GPT-2 (no
download): ``optimizer_cls_and_kwargs``, ``bf16=True`` (autocast) with ``max_grad_norm``
clipping, 8-bit state, BF16 params with FP32 masters, and ``resume_from_checkpoint``
resumed bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

STEPS = 4
CLIP = 0.05


def dataset() -> List[Dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 64, (8 * STEPS, 16), generator=g)
    return [{"input_ids": r, "labels": r} for r in rows]


def tiny_gpt2(bf16_params: bool) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    return model.to(torch.bfloat16) if bf16_params else model


def train(out: Path, opt: Tuple[type, Dict[str, Any]], bf16_params: bool,
          resume: Any = None) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=8,
        learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=1,
        max_grad_norm=CLIP, bf16=not bf16_params, use_cpu=True, seed=0,
        save_strategy="steps", save_steps=2, logging_steps=1, report_to=[],
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=tiny_gpt2(bf16_params), args=args,
                                   train_dataset=dataset(), optimizer_cls_and_kwargs=opt)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


OPTS = {
    "AdamW": (mixprec.optim.AdamW, {"weight_decay": 0.01}),
    "AdamW-state_bits8": (mixprec.optim.AdamW, {"state_bits": 8, "min_8bit_size": 64}),
}


@pytest.mark.parametrize("opt,bf16_params", [("AdamW-state_bits8", False), ("AdamW", True)])
def test_train_clip_and_resume(opt: str, bf16_params: bool, tmp_path: Path) -> None:
    straight = train(tmp_path / "a", OPTS[opt], bf16_params)
    optimizer = straight.optimizer.optimizer  # (the AcceleratedOptimizer's)
    assert type(optimizer) is mixprec.optim.AdamW
    norms = [h["grad_norm"] for h in straight.state.log_history if "grad_norm" in h]
    assert len(norms) == STEPS and all(n > CLIP for n in norms)  # every step clipped
    p = next(straight.model.parameters())
    if bf16_params:
        assert p.dtype == torch.bfloat16
        assert optimizer.state[p]["master_param"].dtype == torch.float32
    else:
        big = straight.model.transformer.wte.weight
        assert optimizer.state[big]["exp_avg"].dtype == torch.uint8
    resumed = train(tmp_path / "b", OPTS[opt], bf16_params,
                    resume=str(tmp_path / "a" / "checkpoint-2"))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    ra = straight.optimizer.optimizer.state_dict()["state"]
    rb = resumed.optimizer.optimizer.state_dict()["state"]
    for k in ra:
        for name, t in ra[k].items():
            same = torch.equal(t, rb[k][name]) if isinstance(t, torch.Tensor) else \
                t == rb[k][name]
            assert same, (k, name)
