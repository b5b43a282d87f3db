// update_scale_ and update_scale_ext_ on CPU: the shared scalar rule applied
// to the state tensors in place.
#include <torch/csrc/stable/library.h>

#include "common/checks.h"
#include "op_table.h"
#include "common/update_scale_math.h"

namespace mixprec {
namespace cpu {
namespace {

void update_scale_cpu(const OpArgs<Op::update_scale_>& a) {
  MIXPREC_BIND(a, scale, growth_tracker, found_inf, growth_factor,
               backoff_factor, growth_interval)
  checks::check_update_scale_args("update_scale_", scale, growth_tracker,
                                  nullptr, found_inf, growth_interval);
  math::update_scale(scale.mutable_data_ptr<float>(),
                     growth_tracker.mutable_data_ptr<int>(),
                     found_inf.mutable_data_ptr<float>()[0], growth_factor,
                     backoff_factor, static_cast<int>(growth_interval));
}

void update_scale_ext_cpu(const OpArgs<Op::update_scale_ext_>& a) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(a);
  MIXPREC_BIND(a, scale, growth_tracker, hysteresis_left, found_inf,
               growth_factor, backoff_factor, growth_interval, hysteresis)
  math::update_scale_ext(
      scale.mutable_data_ptr<float>(), growth_tracker.mutable_data_ptr<int>(),
      hysteresis_left.mutable_data_ptr<int>(),
      found_inf.mutable_data_ptr<float>()[0], growth_factor, backoff_factor,
      static_cast<int>(growth_interval), b.min_scale, b.max_scale,
      static_cast<int>(hysteresis));
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  MIXPREC_IMPL(m, update_scale_, &mixprec::cpu::update_scale_cpu);
  MIXPREC_IMPL(m, update_scale_ext_, &mixprec::cpu::update_scale_ext_cpu);
}
