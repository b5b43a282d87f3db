// update_scale_ and update_scale_ext_ for the CUDA backend: the shared scalar
// rule (common/update_scale_math.h) run by one thread on the device, so the
// scale never leaves the GPU; launchers templated on the executor (see
// launch_plan.h).
#pragma once

#include "common/tensor.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "common/checks.h"
#include "common/update_scale_math.h"
#include "cuda/launch_plan.h"

namespace mixprec {
namespace cuda {

// counts / prev_scale: the statistics (math::count_update), or null.
struct UpdateScaleOp {
  MIXPREC_HD void operator()(NoMeta, GridPos, float* scale, int* growth_tracker,
                             const float* found_inf, double growth_factor,
                             double backoff_factor, int growth_interval,
                             int64_t* counts, float* prev_scale) const {
    const float found = *found_inf;
    math::update_scale(scale, growth_tracker, found, growth_factor,
                       backoff_factor, growth_interval);
    if (counts != nullptr) {
      math::count_update(counts, prev_scale, *scale, found);
    }
  }
};

struct UpdateScaleExtOp {
  MIXPREC_HD void operator()(NoMeta, GridPos, float* scale, int* growth_tracker,
                             int* hysteresis_left, const float* found_inf,
                             double growth_factor, double backoff_factor,
                             int growth_interval, double min_scale,
                             double max_scale, int hysteresis, int64_t* counts,
                             float* prev_scale) const {
    const float found = *found_inf;
    math::update_scale_ext(scale, growth_tracker, hysteresis_left, found,
                           growth_factor, backoff_factor, growth_interval,
                           min_scale, max_scale, hysteresis);
    if (counts != nullptr) {
      math::count_update(counts, prev_scale, *scale, found);
    }
  }
};

// The statistics' pointers for the kernel (null when not given).
inline std::pair<int64_t*, float*> stats_pointers(
    bool given, const std::optional<Tensor>& counts,
    const std::optional<Tensor>& prev_scale) {
  if (!given) return {nullptr, nullptr};
  return {counts->mutable_data_ptr<int64_t>(),
          prev_scale->mutable_data_ptr<float>()};
}

template <class Exec>
void update_scale_launch(const OpArgs<Op::update_scale_>& a) {
  MIXPREC_BIND(a, scale, growth_tracker, found_inf, growth_factor,
               backoff_factor, growth_interval, counts, prev_scale)
  checks::check_update_scale_args("update_scale_", scale, growth_tracker,
                                  nullptr, found_inf, growth_interval);
  const auto [c, p] =
      stats_pointers(checks::check_scale_stats("update_scale_", counts,
                                               prev_scale, scale.device()),
                     counts, prev_scale);
  typename Exec::Guard guard(scale.device());
  Exec::launch_single_block(
      1, UpdateScaleOp{}, scale.mutable_data_ptr<float>(),
      growth_tracker.mutable_data_ptr<int>(), found_inf.const_data_ptr<float>(),
      growth_factor, backoff_factor, static_cast<int>(growth_interval), c, p);
}

template <class Exec>
void update_scale_ext_launch(const OpArgs<Op::update_scale_ext_>& a) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(a);
  MIXPREC_BIND(a, scale, growth_tracker, hysteresis_left, found_inf,
               growth_factor, backoff_factor, growth_interval, hysteresis,
               counts, prev_scale)
  const auto [c, p] =
      stats_pointers(checks::check_scale_stats("update_scale_ext_", counts,
                                               prev_scale, scale.device()),
                     counts, prev_scale);
  typename Exec::Guard guard(scale.device());
  Exec::launch_single_block(
      1, UpdateScaleExtOp{}, scale.mutable_data_ptr<float>(),
      growth_tracker.mutable_data_ptr<int>(),
      hysteresis_left.mutable_data_ptr<int>(),
      found_inf.const_data_ptr<float>(), growth_factor, backoff_factor,
      static_cast<int>(growth_interval), b.min_scale, b.max_scale,
      static_cast<int>(hysteresis), c, p);
}

}  // namespace cuda
}  // namespace mixprec
