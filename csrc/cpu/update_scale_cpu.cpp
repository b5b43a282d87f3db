// update_scale_ and update_scale_ext_ on CPU: the shared scalar rule applied
// to the state tensors in place.
#include <torch/csrc/stable/library.h>

#include "common/checks.h"
#include "op_table.h"
#include "common/update_scale_math.h"

#include <optional>

namespace mixprec {
namespace cpu {
namespace {

// The statistics after the update (counts and prev_scale checked).
void count_update(const std::optional<Tensor>& counts,
                  const std::optional<Tensor>& prev_scale, const Tensor& scale,
                  float found_inf) {
  math::count_update(counts->mutable_data_ptr<int64_t>(),
                     prev_scale->mutable_data_ptr<float>(),
                     scale.const_data_ptr<float>()[0], found_inf);
}

void update_scale_cpu(const OpArgs<Op::update_scale_>& a) {
  MIXPREC_BIND(a, scale, growth_tracker, found_inf, growth_factor,
               backoff_factor, growth_interval, counts, prev_scale)
  checks::check_update_scale_args("update_scale_", scale, growth_tracker,
                                  nullptr, found_inf, growth_interval);
  const bool stats = checks::check_scale_stats("update_scale_", counts,
                                               prev_scale, scale.device());
  const float found = found_inf.const_data_ptr<float>()[0];
  math::update_scale(
      scale.mutable_data_ptr<float>(), growth_tracker.mutable_data_ptr<int>(),
      found, growth_factor, backoff_factor, static_cast<int>(growth_interval));
  if (stats) count_update(counts, prev_scale, scale, found);
}

void update_scale_ext_cpu(const OpArgs<Op::update_scale_ext_>& a) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(a);
  MIXPREC_BIND(a, scale, growth_tracker, hysteresis_left, found_inf,
               growth_factor, backoff_factor, growth_interval, hysteresis,
               counts, prev_scale)
  const bool stats = checks::check_scale_stats("update_scale_ext_", counts,
                                               prev_scale, scale.device());
  const float found = found_inf.const_data_ptr<float>()[0];
  math::update_scale_ext(
      scale.mutable_data_ptr<float>(), growth_tracker.mutable_data_ptr<int>(),
      hysteresis_left.mutable_data_ptr<int>(), found, growth_factor,
      backoff_factor, static_cast<int>(growth_interval), b.min_scale,
      b.max_scale, static_cast<int>(hysteresis));
  if (stats) count_update(counts, prev_scale, scale, found);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  MIXPREC_IMPL(m, update_scale_, &mixprec::cpu::update_scale_cpu);
  MIXPREC_IMPL(m, update_scale_ext_, &mixprec::cpu::update_scale_ext_cpu);
}
