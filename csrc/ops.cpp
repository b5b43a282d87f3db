// C++ entry points: typed dispatcher calls, one per schema.
#include "mixprec/ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "common/op_signatures.h"

namespace mixprec {
namespace {

template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .template typed<Sig>();
}

}  // namespace

void unscale_and_check_(at::TensorList grads, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale) {
  static auto op = handle<sig::UnscaleAndCheck>(sig::kUnscaleAndCheck);
  op.call(grads, found_inf, inv_scale);
}

void check_finite_(at::TensorList tensors, const at::Tensor& found_inf) {
  static auto op = handle<sig::CheckFinite>(sig::kCheckFinite);
  op.call(tensors, found_inf);
}

at::Tensor unscale_and_norm_(at::TensorList grads, const at::Tensor& found_inf,
                             const at::Tensor& inv_scale, double norm_type) {
  static auto op = handle<sig::Norm>(sig::kUnscaleAndNorm);
  return op.call(grads, found_inf, inv_scale, norm_type);
}

at::Tensor check_finite_and_norm_(at::TensorList grads,
                                  const at::Tensor& found_inf,
                                  const at::Tensor& inv_scale,
                                  double norm_type) {
  static auto op = handle<sig::Norm>(sig::kCheckFiniteAndNorm);
  return op.call(grads, found_inf, inv_scale, norm_type);
}

void update_scale_(const at::Tensor& scale, const at::Tensor& growth_tracker,
                   const at::Tensor& found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval) {
  static auto op = handle<sig::UpdateScale>(sig::kUpdateScale);
  op.call(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
          growth_interval);
}

void update_scale_ext_(const at::Tensor& scale,
                       const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_left,
                       const at::Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval,
                       std::optional<double> min_scale,
                       std::optional<double> max_scale, int64_t hysteresis) {
  static auto op = handle<sig::UpdateScaleExt>(sig::kUpdateScaleExt);
  op.call(scale, growth_tracker, hysteresis_left, found_inf, growth_factor,
          backoff_factor, growth_interval, min_scale, max_scale, hysteresis);
}

void fused_adam_(at::TensorList params, at::TensorList grads,
                 at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList master_params,
                 at::TensorList state_steps, const at::Tensor& lr, double beta1,
                 double beta2, double weight_decay, double eps, bool amsgrad,
                 bool maximize, bool decoupled_weight_decay,
                 const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf,
                 const std::optional<at::Tensor>& clip_coef,
                 bool stochastic_rounding, int64_t seed) {
  static auto op = handle<sig::FusedAdam>(sig::kFusedAdam);
  op.call(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params,
          state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
          decoupled_weight_decay, grad_scale, found_inf, clip_coef,
          stochastic_rounding, seed);
}

void fused_sgd_(at::TensorList params, at::TensorList grads,
                at::TensorList momentum_buffers, at::TensorList master_params,
                at::TensorList state_steps, const at::Tensor& lr,
                double weight_decay, double momentum, double dampening,
                bool nesterov, bool maximize,
                const std::optional<at::Tensor>& grad_scale,
                const std::optional<at::Tensor>& found_inf,
                const std::optional<at::Tensor>& clip_coef,
                bool stochastic_rounding, int64_t seed) {
  static auto op = handle<sig::FusedSgd>(sig::kFusedSgd);
  op.call(params, grads, momentum_buffers, master_params, state_steps, lr,
          weight_decay, momentum, dampening, nesterov, maximize, grad_scale,
          found_inf, clip_coef, stochastic_rounding, seed);
}

}  // namespace mixprec
