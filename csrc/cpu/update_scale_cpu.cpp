// update_scale_ and update_scale_ext_ on CPU: the shared scalar rule applied
// to the state tensors in place.
#include <torch/library.h>

#include "common/checks.h"
#include "common/update_scale_math.h"

namespace mixprec {
namespace cpu {
namespace {

void update_scale_cpu(const at::Tensor& scale, const at::Tensor& growth_tracker,
                      const at::Tensor& found_inf, double growth_factor,
                      double backoff_factor, int64_t growth_interval) {
  checks::check_update_scale_args("update_scale_", scale, growth_tracker, nullptr,
                          found_inf, growth_interval);
  math::update_scale(scale.data_ptr<float>(), growth_tracker.data_ptr<int>(),
                     found_inf.data_ptr<float>()[0], growth_factor,
                     backoff_factor, static_cast<int>(growth_interval));
}

void update_scale_ext_cpu(const at::Tensor& scale,
                          const at::Tensor& growth_tracker,
                          const at::Tensor& hysteresis_left,
                          const at::Tensor& found_inf, double growth_factor,
                          double backoff_factor, int64_t growth_interval,
                          std::optional<double> min_scale,
                          std::optional<double> max_scale, int64_t hysteresis) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(
      scale, growth_tracker, hysteresis_left, found_inf, growth_factor,
      backoff_factor, growth_interval, min_scale, max_scale, hysteresis);
  math::update_scale_ext(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int>(),
      hysteresis_left.data_ptr<int>(), found_inf.data_ptr<float>()[0],
      growth_factor, backoff_factor, static_cast<int>(growth_interval),
      b.min_scale, b.max_scale, static_cast<int>(hysteresis));
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("update_scale_", &mixprec::cpu::update_scale_cpu);
  m.impl("update_scale_ext_", &mixprec::cpu::update_scale_ext_cpu);
}
