"""The HF Trainer with ``fp16=True`` and forced overflows: the LR schedule each optimizer gets.

A tiny GPT-2 (transformers) trained by ``transformers.Trainer(fp16=True)`` for ``--steps``
steps, linear schedule without warm-up, an inf planted in one grad at the steps of
``--overflow`` (1-based), once with ``torch.optim.AdamW`` (torch's default implementation)
once with ``mixprec.optim.AdamW`` and once with ``mixprec.optim.AdamW`` given
``lr_by_steps_taken(scheduler, steps)``; the same model, data and schedule. After every step it
records the scheduler's lr (what the next step will use), the number of optimizer steps
actually taken (torch: the state's ``step``; mixprec: its device step count) and whether
Accelerate reported the step as skipped. Prints one table, side by side.

Needs a GPU: transformers/Accelerate make a GradScaler only on CUDA (on CPU, ``fp16=True``
runs without loss scaling, so nothing overflows into a skipped step)::

    python tools/gpu_hf_overflow.py --steps 12 --overflow 3,7
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

import torch


def run(kind: str, steps: int, overflow: List[int], device: str) -> List[Dict[str, Any]]:
    """One training run; returns one record per optimizer step the Trainer made."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        get_linear_schedule_with_warmup,
    )

    import mixprec

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                       n_positions=32))
    gen = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 128, (32,), generator=gen),
             "labels": torch.randint(0, 128, (32,), generator=gen)} for _ in range(8 * steps)]
    lr = 1e-3
    if kind == "torch":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    else:
        opt = mixprec.optim.AdamW(model.parameters(), lr=lr)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)
    if kind == "mixprec+table":
        opt.lr_by_steps_taken(sched, steps)  # type: ignore[attr-defined]
    state = {"step": 0}
    records: List[Dict[str, Any]] = []
    target = model.lm_head.weight  # tied to the embedding: always has a grad

    def plant(grad: torch.Tensor) -> torch.Tensor:
        if state["step"] + 1 in overflow:
            grad = grad.clone()
            grad.view(-1)[-1] = float("inf")
        return grad

    target.register_hook(plant)

    class Record(TrainerCallback):
        def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            state["step"] = st.global_step
            p = next(iter(opt.state))
            taken = int(opt.state[p]["step"])  # a sync: fine in a check
            acc = kw.get("accelerator") or trainer.accelerator
            # the lr the next step applies: the scheduler's, or with the table the
            # schedule's value at the steps taken (linear, no warm-up)
            lr_next = (lr * max(0.0, (steps - taken) / steps) if kind == "mixprec+table"
                       else sched.get_last_lr()[0])
            records.append({"step": st.global_step, "lr_next": lr_next,
                            "taken": taken,
                            "skipped_seen": bool(acc.optimizer_step_was_skipped)})

    args = TrainingArguments(output_dir="/tmp/gpu_hf_overflow", max_steps=steps,
                             per_device_train_batch_size=8, fp16=True, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             use_cpu=device == "cpu", max_grad_norm=0.0)
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, sched),
                      callbacks=[Record()])
    trainer.train()
    return records


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--overflow", default="3,7", help="1-based steps with an inf grad")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    overflow = [int(s) for s in a.overflow.split(",") if s]
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_hf_overflow: needs a GPU (see the docstring)")
        return 2
    kinds = ("torch", "mixprec", "mixprec+table")
    runs = {k: run(k, a.steps, overflow, a.device) for k in kinds}
    print(f"HF Trainer fp16=True, linear schedule over {a.steps} steps from lr 1e-3, "
          f"inf planted at steps {overflow}")
    print(f"{'step':>4} | " + " | ".join(f"{k + ': lr next':>22} {'taken':>5} {'skip seen':>9}"
                                        for k in kinds))
    for rows in zip(*(runs[k] for k in kinds)):
        print(f"{rows[0]['step']:>4} | " + " | ".join(
            f"{r['lr_next']:>22.6g} {r['taken']:>5} {str(r['skipped_seen']):>9}" for r in rows))
    for k in kinds[1:]:
        same = all(abs(t["lr_next"] - m["lr_next"]) < 1e-12 and t["taken"] == m["taken"]
                   for t, m in zip(runs["torch"], runs[k]))
        print(f"{k} vs torch: schedules {'AGREE' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
