"""The ADAPTIVE mode's controller: finds the module that overflows and promotes it.

While training it counts, on the device and without a sync, which modules produced a
non-finite forward output (a forward hook per module that owns parameters) and whose
gradients were non-finite (from the per-parameter norms of each step). At an evaluation
(every ``logging_frequency`` optimizer steps) it reads both counts back and decides:

* memory use above ``adaptive_threshold`` while the model runs in float32: turn low
  precision on for the whole model;
* an overflow rate above ``overflow_threshold``, or the scale down at ``min_scale``: promote
  one low-precision module, fp16 -> bf16 where bfloat16 is supported, else -> fp32. The
  first module (in forward order) whose output was non-finite, else the one closest to the
  loss whose gradients were.

Decisions are logged (logger ``mixprec.trainer``) and kept in the manager's
``adaptive_decisions``; the promotions are its ``overrides``, which are saved and re-applied.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch
from torch import Tensor, nn

from ..amp.autocast import resolve_precision
from ..amp.module_policy import PolicyHandle
from .config import PREC_NAME, MixedPrecisionConfig
from .metrics import logger, memory_capacity, memory_usage

__all__ = ["AdaptiveController", "PlanHost"]


class PlanHost(Protocol):
    """The precision plan of a managed model, read and changed in place.

    Attributes:
        model: the managed model.
        config: its configuration.
        device: where the model runs.
        compute_dtype: the low-precision dtype in use (``None``: float32).
        eventual_dtype: the low-precision dtype the mode may switch to.
        root_precision: the model-wide precision name (``"fp16"``, ``"bf16"``,
            ``"fp32"``), or ``None`` before the first plan.
        overrides: per-module precision names that differ from the root.
        policy_handle: the installed precision policy, or ``None``.
        loss_scaling: whether the loss is scaled.
        adaptive_decisions: the ADAPTIVE decisions so far (appended to).
    """

    model: nn.Module
    config: MixedPrecisionConfig
    device: torch.device
    compute_dtype: Optional[torch.dtype]
    eventual_dtype: Optional[torch.dtype]
    root_precision: Optional[str]
    overrides: dict[str, str]
    policy_handle: Optional[PolicyHandle]
    loss_scaling: bool
    adaptive_decisions: list[dict[str, Any]]

    def install_policy(self) -> None:
        """(Re)install the precision policy that the plan describes."""


class AdaptiveController:
    """Counts non-finite module outputs and gradients; promotes modules at evaluations.

    Args:
        manager: the :class:`~mixprec.train.manager.MixedPrecisionManager` whose precision
            plan (``root_precision``, ``overrides``, ``compute_dtype``) it changes.

    Installs one forward hook per module that owns parameters; :meth:`remove` takes
    them off.
    """

    def __init__(self, manager: PlanHost) -> None:
        self.manager = manager
        # candidates: modules owning parameters, in registration order; the
        # forward order is learned at the first forward
        self.names: list[str] = []
        self.fwd_order: list[int] = []
        self._fwd_seen: set[int] = set()
        self._param_owner: dict[int, int] = {}
        self._hooks: list[Any] = []
        for name, module in manager.model.named_modules():
            params = list(module.parameters(recurse=False))
            if not name or not params:
                continue
            for p in params:
                self._param_owner[id(p)] = len(self.names)
            self._hooks.append(module.register_forward_hook(self._make_hook(len(self.names))))
            self.names.append(name)
        self.fwd_counts = torch.zeros(len(self.names), device=manager.device)
        self.bwd_counts = torch.zeros(len(self.names), device=manager.device)

    def remove(self) -> None:
        """Take the forward hooks off the model."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- counting (no host sync) -------------------------------------------------------
    def _make_hook(self, idx: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not module.training:
                return
            if idx not in self._fwd_seen:
                self._fwd_seen.add(idx)
                self.fwd_order.append(idx)
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(out, Tensor) and out.is_floating_point():
                with torch.no_grad():
                    self.fwd_counts[idx] += (~torch.isfinite(out)).any().float()

        return hook

    def record_grads(self, params: list[Tensor], norms: list[Tensor]) -> None:
        """Count the modules whose gradients (per-param ``norms``) are non-finite."""
        device = self.manager.device
        owners = torch.tensor(
            [self._param_owner.get(id(p), -1) for p in params],
            dtype=torch.long,
            pin_memory=device.type == "cuda",
        )
        index = owners.to(device, non_blocking=True)  # (pinned on CUDA: the host never waits)
        bad = (~torch.isfinite(torch.stack(norms).to(device))).float()
        keep = index >= 0
        self.bwd_counts.index_add_(0, index.clamp(min=0), bad * keep)

    # -- deciding (one host sync) ------------------------------------------------------
    def _precision(self, name: str) -> str:
        m = self.manager
        if name in m.overrides:
            return m.overrides[name]
        handle = m.policy_handle
        if handle is not None and name in handle.precisions:
            return handle.precisions[name]
        return m.root_precision or "fp32"

    def evaluate(self, overflows: float, steps: int, last_scale: float, step: int) -> None:
        """Decide after a window of ``steps`` optimizer steps, ``overflows`` of which
        overflowed, ending at optimizer step ``step`` with scale ``last_scale``.
        Reads and clears the counts (one host sync)."""
        m = self.manager
        cfg = m.config
        fwd, bwd = torch.stack((self.fwd_counts, self.bwd_counts)).tolist()  # the one sync
        self.fwd_counts.zero_()
        self.bwd_counts.zero_()
        # memory pressure: turn low precision on
        cap = memory_capacity(m.device)
        if m.root_precision == "fp32" and cap > 0 and m.eventual_dtype is not None:
            frac = memory_usage(m.device) / cap
            if frac > cfg.adaptive_threshold:
                new = PREC_NAME[m.eventual_dtype]
                self._decide(step, "<model>", "fp32", new, f"memory use {frac:.1%} > "
                             f"adaptive_threshold {cfg.adaptive_threshold:.1%}")
                m.root_precision = new
                m.compute_dtype = m.eventual_dtype
                m.install_policy()
                return
        rate = overflows / max(steps, 1)
        at_min = (m.loss_scaling and cfg.min_scale is not None and last_scale <= cfg.min_scale
                  and overflows > 0)
        if not (rate > cfg.overflow_threshold or at_min):
            return
        reason = (f"overflow rate {rate:.0%} > overflow_threshold {cfg.overflow_threshold:.0%}"
                  if rate > cfg.overflow_threshold else f"scale reached min_scale {cfg.min_scale}")
        low = [i for i in self.fwd_order if self._precision(self.names[i]) in ("fp16", "bf16")]
        # the forward origin (the first module whose output was non-finite), else the
        # backward one (the module closest to the loss whose gradients were)
        found = [(i, "; its forward output was non-finite") for i in low if fwd[i] > 0] + [
            (i, "; its gradients were non-finite") for i in reversed(low) if bwd[i] > 0]
        if not found:
            logger.info("adaptive: %s, but no low-precision module overflowed", reason)
            return
        name = self.names[found[0][0]]
        reason += found[0][1]
        old = self._precision(name)
        dev_type = m.device.type
        bf16_ok = resolve_precision(dev_type, "bf16")[0] is not None and (
            dev_type != "cuda" or torch.cuda.is_bf16_supported())
        new = "bf16" if (old == "fp16" and bf16_ok) else "fp32"
        self._decide(step, name, old, new, reason)
        m.overrides[name] = new
        m.install_policy()

    def _decide(self, step: int, module: str, old: str, new: str, reason: str) -> None:
        decision = {"step": step, "module": module, "from": old, "to": new, "reason": reason}
        self.manager.adaptive_decisions.append(decision)
        logger.warning("adaptive: step %d: %s %s -> %s (%s)", step, module, old, new, reason)

    # -- state ------------------------------------------------------------------------
    def load_counts(self, fwd: Tensor, bwd: Tensor) -> None:
        """Restore saved counts (``fwd_counts`` / ``bwd_counts`` of a checkpoint)."""
        self.fwd_counts = fwd.to(self.manager.device)
        self.bwd_counts = bwd.to(self.manager.device)
