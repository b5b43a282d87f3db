// mixprec ops for C++ (LibTorch) callers. Each function is a typed call
// through the PyTorch dispatcher to torch.ops.mixprec.<name>, so C++ and
// Python reach the same kernels. Semantics and argument rules: see the
// schema comments in csrc/op_table.h and the Python docs
// (mixprec.ops).
//
// These declarations are the one C++ statement of each op's signature: the
// rest of libmixprec takes it from here with decltype (csrc/op_dispatch.h).
#pragma once

#include "mixprec/export.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <type_traits>

namespace mixprec {
namespace detail {

// The typed dispatcher call of the op whose function is Fn (one handle per
// op, looked up on first use). Defined in ops.cpp and instantiated there for
// every op, so callers need no dispatcher headers.
template <auto Fn, class Sig = std::remove_pointer_t<decltype(Fn)>>
struct Dispatch;

template <auto Fn, class Ret, class... Args>
struct MIXPREC_API Dispatch<Fn, Ret(Args...)> {
  static Ret call(Args... args);
};

}  // namespace detail

// grads[i] *= inv_scale in place; found_inf = 1 if any grad held inf/NaN.
// found_inf, inv_scale: one-element float32 tensors on the grads' device.
inline void unscale_and_check_(at::TensorList grads,
                               const at::Tensor& found_inf,
                               const at::Tensor& inv_scale) {
  detail::Dispatch<&unscale_and_check_>::call(grads, found_inf, inv_scale);
}

// found_inf = 1 if any value of `tensors` is inf or NaN. Reads only.
inline void check_finite_(at::TensorList tensors, const at::Tensor& found_inf) {
  detail::Dispatch<&check_finite_>::call(tensors, found_inf);
}

// unscale_and_check_ that also returns the total norm_type-norm of the
// unscaled grads as a 0-dim float32 tensor on their device (one pass).
inline at::Tensor unscale_and_norm_(at::TensorList grads,
                                    const at::Tensor& found_inf,
                                    const at::Tensor& inv_scale,
                                    double norm_type = 2.0) {
  return detail::Dispatch<&unscale_and_norm_>::call(grads, found_inf, inv_scale,
                                                    norm_type);
}

// Read-only unscale_and_norm_: sets found_inf and returns the norm of
// grads * inv_scale; the grads are not written.
inline at::Tensor check_finite_and_norm_(at::TensorList grads,
                                         const at::Tensor& found_inf,
                                         const at::Tensor& inv_scale,
                                         double norm_type = 2.0) {
  return detail::Dispatch<&check_finite_and_norm_>::call(grads, found_inf,
                                                         inv_scale, norm_type);
}

// torch._amp_update_scale_ semantics. scale: float32, growth_tracker: int32,
// found_inf: float32; one element each, same device. counts (int64, 5) and
// prev_scale (float32, one element), both or neither: the update's statistics
// counted by the same kernel (see csrc/op_table.h).
inline void update_scale_(
    const at::Tensor& scale, const at::Tensor& growth_tracker,
    const at::Tensor& found_inf, double growth_factor, double backoff_factor,
    int64_t growth_interval,
    const std::optional<at::Tensor>& counts = std::nullopt,
    const std::optional<at::Tensor>& prev_scale = std::nullopt) {
  detail::Dispatch<&update_scale_>::call(scale, growth_tracker, found_inf,
                                         growth_factor, backoff_factor,
                                         growth_interval, counts, prev_scale);
}

// update_scale_ with hysteresis and min/max bounds (hysteresis_left: int32);
// counts and prev_scale as in update_scale_.
inline void update_scale_ext_(
    const at::Tensor& scale, const at::Tensor& growth_tracker,
    const at::Tensor& hysteresis_left, const at::Tensor& found_inf,
    double growth_factor, double backoff_factor, int64_t growth_interval,
    std::optional<double> min_scale = std::nullopt,
    std::optional<double> max_scale = std::nullopt, int64_t hysteresis = 1,
    const std::optional<at::Tensor>& counts = std::nullopt,
    const std::optional<at::Tensor>& prev_scale = std::nullopt) {
  detail::Dispatch<&update_scale_ext_>::call(
      scale, growth_tracker, hysteresis_left, found_inf, growth_factor,
      backoff_factor, growth_interval, min_scale, max_scale, hysteresis, counts,
      prev_scale);
}

// One fused Adam/AdamW step (decoupled_weight_decay selects AdamW) over all
// params of one device; see the schema comment in csrc/op_table.h and
// mixprec.ops.fused_adam_. Lists: params (fp32/fp16/bf16), grads (same
// shapes, fp32/fp16/bf16), exp_avgs/exp_avg_sqs (fp32), max_exp_avg_sqs (fp32,
// empty unless amsgrad), master_params (empty, or one per 16-bit param, all of
// one dtype: fp32 masters, or int16 / int8 split-master corrections of bf16
// params, mixprec::optim::decode_master), state_steps (fp32, one element
// each; incremented). lr: one-element fp32/fp64 tensor.
// grad_scale/found_inf/clip_coef: optional one-element fp32 tensors.
inline void fused_adam_(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
    at::TensorList master_params, at::TensorList state_steps,
    const at::Tensor& lr, double beta1, double beta2, double weight_decay,
    double eps, bool amsgrad, bool maximize, bool decoupled_weight_decay,
    const std::optional<at::Tensor>& grad_scale = std::nullopt,
    const std::optional<at::Tensor>& found_inf = std::nullopt,
    const std::optional<at::Tensor>& clip_coef = std::nullopt,
    bool stochastic_rounding = false, int64_t seed = 0,
    at::OptionalIntArrayRef sr_bases = std::nullopt) {
  detail::Dispatch<&fused_adam_>::call(
      params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params,
      state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
      decoupled_weight_decay, grad_scale, found_inf, clip_coef,
      stochastic_rounding, seed, sr_bases);
}

// One fused SGD step (torch.optim.SGD's rule); momentum_buffers (fp32) is empty
// when momentum == 0. Other conventions as fused_adam_.
inline void fused_sgd_(
    at::TensorList params, at::TensorList grads,
    at::TensorList momentum_buffers, at::TensorList master_params,
    at::TensorList state_steps, const at::Tensor& lr, double weight_decay,
    double momentum, double dampening, bool nesterov, bool maximize,
    const std::optional<at::Tensor>& grad_scale = std::nullopt,
    const std::optional<at::Tensor>& found_inf = std::nullopt,
    const std::optional<at::Tensor>& clip_coef = std::nullopt,
    bool stochastic_rounding = false, int64_t seed = 0,
    at::OptionalIntArrayRef sr_bases = std::nullopt) {
  detail::Dispatch<&fused_sgd_>::call(
      params, grads, momentum_buffers, master_params, state_steps, lr,
      weight_decay, momentum, dampening, nesterov, maximize, grad_scale,
      found_inf, clip_coef, stochastic_rounding, seed, sr_bases);
}

// One fused Adam/AdamW step with block-wise 8-bit moments: exp_avgs and
// exp_avg_sqs are contiguous uint8 codes of each param's shape,
// exp_avg_absmax / exp_avg_sq_absmax float32 of shape (rows, blocks per row)
// (common/quant8_math.h's row layout).
// No amsgrad. Other conventions as fused_adam_.
inline void fused_adam8_(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_absmax, at::TensorList exp_avg_sqs,
    at::TensorList exp_avg_sq_absmax, at::TensorList master_params,
    at::TensorList state_steps, const at::Tensor& lr, double beta1,
    double beta2, double weight_decay, double eps, bool maximize,
    bool decoupled_weight_decay,
    const std::optional<at::Tensor>& grad_scale = std::nullopt,
    const std::optional<at::Tensor>& found_inf = std::nullopt,
    const std::optional<at::Tensor>& clip_coef = std::nullopt,
    bool stochastic_rounding = false, int64_t seed = 0,
    at::OptionalIntArrayRef sr_bases = std::nullopt) {
  detail::Dispatch<&fused_adam8_>::call(
      params, grads, exp_avgs, exp_avg_absmax, exp_avg_sqs, exp_avg_sq_absmax,
      master_params, state_steps, lr, beta1, beta2, weight_decay, eps, maximize,
      decoupled_weight_decay, grad_scale, found_inf, clip_coef,
      stochastic_rounding, seed, sr_bases);
}

// One fused SGD step (momentum > 0) with a block-wise 8-bit momentum buffer
// (uint8 codes and float32 maxima as fused_adam8_'s exp_avgs).
inline void fused_sgd8_(
    at::TensorList params, at::TensorList grads,
    at::TensorList momentum_buffers, at::TensorList momentum_absmax,
    at::TensorList master_params, at::TensorList state_steps,
    const at::Tensor& lr, double weight_decay, double momentum,
    double dampening, bool nesterov, bool maximize,
    const std::optional<at::Tensor>& grad_scale = std::nullopt,
    const std::optional<at::Tensor>& found_inf = std::nullopt,
    const std::optional<at::Tensor>& clip_coef = std::nullopt,
    bool stochastic_rounding = false, int64_t seed = 0,
    at::OptionalIntArrayRef sr_bases = std::nullopt) {
  detail::Dispatch<&fused_sgd8_>::call(
      params, grads, momentum_buffers, momentum_absmax, master_params,
      state_steps, lr, weight_decay, momentum, dampening, nesterov, maximize,
      grad_scale, found_inf, clip_coef, stochastic_rounding, seed, sr_bases);
}

}  // namespace mixprec
