// The one TORCH_LIBRARY block of mixprec: every schema, one contract comment
// each. Kernels register themselves per backend (csrc/cpu, csrc/cuda).
//
// Conventions: in-place ops end in `_`, declare what they mutate and return
// nothing; step-varying scalars (scale, found_inf, ...) are one-element device
// tensors so no op needs a host sync; found_inf is float32 and is only ever
// set to 1.0, never cleared.
#include <torch/library.h>

TORCH_LIBRARY(mixprec, m) {
  // grads *= inv_scale in place (math in float32 for fp16/bf16, float64 for
  // float64); found_inf = 1 if any input value was inf or NaN. Bitwise equal
  // to torch._amp_foreach_non_finite_check_and_unscale_ wherever that accepts
  // the input; also bf16, and lists mixing dtypes.
  m.def(
      "unscale_and_check_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
      "Tensor inv_scale) -> ()");
  // found_inf = 1 if any value of `tensors` is inf or NaN; reads only.
  m.def("check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()");
  // unscale_and_check_ that also returns the total norm_type-norm of the
  // unscaled grads (0-dim float32, on their device), all in one pass; the
  // norm of clip_grad_norm_ after unscale_. norm_type > 0 or inf.
  m.def(
      "unscale_and_norm_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
      "Tensor inv_scale, float norm_type=2.0) -> Tensor");
  // unscale_and_norm_ that reads only: found_inf as above and the norm of
  // grads * inv_scale (computed in float32/float64, not rounded to the grad
  // dtype), grads untouched. For optimizers that unscale (and clip) in their
  // own kernel: clip_grad_norm_ then costs one read of the grads.
  m.def(
      "check_finite_and_norm_(Tensor[] grads, Tensor(a!) found_inf, "
      "Tensor inv_scale, float norm_type=2.0) -> Tensor");
  // torch._amp_update_scale_, bit for bit.
  m.def(
      "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor found_inf, float growth_factor, float backoff_factor, "
      "int growth_interval) -> ()");
  // update_scale_ with hysteresis (state in hysteresis_left) and optional
  // min/max bounds on the scale; the rule is in common/update_scale_math.h.
  m.def(
      "update_scale_ext_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor(c!) hysteresis_left, Tensor found_inf, float growth_factor, "
      "float backoff_factor, int growth_interval, float? min_scale=None, "
      "float? max_scale=None, int hysteresis=1) -> ()");
  // One Adam (decoupled_weight_decay=False) or AdamW step over every param,
  // torch.optim's formula and order; skipped entirely (step counts included)
  // when found_inf != 0. grads (fp32/fp16/bf16) are multiplied by 1/grad_scale
  // and clip_coef in float32; moments (and masters, when given: one fp32 copy
  // per 16-bit param, which then receives the rounded master) are float32;
  // state_steps (float32, one element each) are incremented on the device; lr
  // is a one-element float32/float64 tensor. stochastic_rounding rounds bf16
  // params (no masters) with a hash of (seed, step, element).
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, "
      "Tensor(e!)[] master_params, Tensor(f!)[] state_steps, Tensor lr, "
      "float beta1, float beta2, float weight_decay, float eps, bool amsgrad, "
      "bool maximize, bool decoupled_weight_decay, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor? clip_coef=None, "
      "bool stochastic_rounding=False, int seed=0) -> ()");
  // One SGD step (torch.optim.SGD's momentum/dampening/nesterov/weight_decay
  // rule) with the grad, master, found_inf, step and rounding conventions of
  // fused_adam_; momentum_buffers is empty when momentum == 0 and is
  // initialised from the grad on a param's first real step (step count 0).
  m.def(
      "fused_sgd_(Tensor(a!)[] params, Tensor[] grads, "
      "Tensor(b!)[] momentum_buffers, Tensor(c!)[] master_params, "
      "Tensor(d!)[] state_steps, Tensor lr, float weight_decay, "
      "float momentum, float dampening, bool nesterov, bool maximize, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor? clip_coef=None, bool stochastic_rounding=False, int seed=0) "
      "-> ()");
}

