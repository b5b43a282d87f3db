// mixprec ops for C++ (LibTorch) callers. Each function is a typed call
// through the PyTorch dispatcher to torch.ops.mixprec.<name>, so C++ and
// Python reach the same kernels. Semantics and argument rules: see the
// schema comments in csrc/registration.cpp and the Python docs (mixprec.ops).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>

namespace mixprec {

// grads[i] *= inv_scale in place; found_inf = 1 if any grad held inf/NaN.
// found_inf, inv_scale: one-element float32 tensors on the grads' device.
void unscale_and_check_(at::TensorList grads, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale);

// found_inf = 1 if any value of `tensors` is inf or NaN. Reads only.
void check_finite_(at::TensorList tensors, const at::Tensor& found_inf);

// unscale_and_check_ that also returns the total norm_type-norm of the
// unscaled grads as a 0-dim float32 tensor on their device (one pass).
at::Tensor unscale_and_norm_(at::TensorList grads, const at::Tensor& found_inf,
                             const at::Tensor& inv_scale,
                             double norm_type = 2.0);

// Read-only unscale_and_norm_: sets found_inf and returns the norm of
// grads * inv_scale; the grads are not written.
at::Tensor check_finite_and_norm_(at::TensorList grads,
                                  const at::Tensor& found_inf,
                                  const at::Tensor& inv_scale,
                                  double norm_type = 2.0);

// torch._amp_update_scale_ semantics. scale: float32, growth_tracker: int32,
// found_inf: float32; one element each, same device.
void update_scale_(const at::Tensor& scale, const at::Tensor& growth_tracker,
                   const at::Tensor& found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval);

// update_scale_ with hysteresis and min/max bounds (hysteresis_left: int32).
void update_scale_ext_(const at::Tensor& scale,
                       const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_left,
                       const at::Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval,
                       std::optional<double> min_scale = std::nullopt,
                       std::optional<double> max_scale = std::nullopt,
                       int64_t hysteresis = 1);

// One fused Adam/AdamW step (decoupled_weight_decay selects AdamW) over all
// params of one device; see the schema comment in registration.cpp and
// mixprec.ops.fused_adam_. Lists: params (fp32/fp16/bf16), grads (same
// shapes, fp32/fp16/bf16), exp_avgs/exp_avg_sqs (fp32), max_exp_avg_sqs (fp32,
// empty unless amsgrad), master_params (fp32, empty or one per 16-bit param),
// state_steps (fp32, one element each; incremented). lr: one-element fp32/fp64
// tensor. grad_scale/found_inf/clip_coef: optional one-element fp32 tensors.
void fused_adam_(at::TensorList params, at::TensorList grads,
                 at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList master_params,
                 at::TensorList state_steps, const at::Tensor& lr, double beta1,
                 double beta2, double weight_decay, double eps, bool amsgrad,
                 bool maximize, bool decoupled_weight_decay,
                 const std::optional<at::Tensor>& grad_scale = std::nullopt,
                 const std::optional<at::Tensor>& found_inf = std::nullopt,
                 const std::optional<at::Tensor>& clip_coef = std::nullopt,
                 bool stochastic_rounding = false, int64_t seed = 0);

// One fused SGD step (torch.optim.SGD's rule); momentum_buffers (fp32) is empty
// when momentum == 0. Other conventions as fused_adam_.
void fused_sgd_(at::TensorList params, at::TensorList grads,
                at::TensorList momentum_buffers, at::TensorList master_params,
                at::TensorList state_steps, const at::Tensor& lr,
                double weight_decay, double momentum, double dampening,
                bool nesterov, bool maximize,
                const std::optional<at::Tensor>& grad_scale = std::nullopt,
                const std::optional<at::Tensor>& found_inf = std::nullopt,
                const std::optional<at::Tensor>& clip_coef = std::nullopt,
                bool stochastic_rounding = false, int64_t seed = 0);

}  // namespace mixprec
