// update_scale_ and update_scale_ext_ for the CUDA backend: the shared scalar
// rule (common/update_scale_math.h) run by one thread on the device, so the
// scale never leaves the GPU; launchers templated on the executor (see
// launch_plan.h).
#pragma once

#include "common/tensor.h"

#include <cstdint>
#include <optional>

#include "common/checks.h"
#include "common/update_scale_math.h"
#include "cuda/launch_plan.h"

namespace mixprec {
namespace cuda {

struct UpdateScaleOp {
  MIXPREC_HD void operator()(NoMeta, GridPos, float* scale, int* growth_tracker,
                             const float* found_inf, double growth_factor,
                             double backoff_factor, int growth_interval) const {
    math::update_scale(scale, growth_tracker, *found_inf, growth_factor,
                       backoff_factor, growth_interval);
  }
};

struct UpdateScaleExtOp {
  MIXPREC_HD void operator()(NoMeta, GridPos, float* scale, int* growth_tracker,
                             int* hysteresis_left, const float* found_inf,
                             double growth_factor, double backoff_factor,
                             int growth_interval, double min_scale,
                             double max_scale, int hysteresis) const {
    math::update_scale_ext(scale, growth_tracker, hysteresis_left, *found_inf,
                           growth_factor, backoff_factor, growth_interval,
                           min_scale, max_scale, hysteresis);
  }
};

template <class Exec>
void update_scale_launch(const OpArgs<Op::update_scale_>& a) {
  MIXPREC_BIND(a, scale, growth_tracker, found_inf, growth_factor,
               backoff_factor, growth_interval)
  checks::check_update_scale_args("update_scale_", scale, growth_tracker,
                                  nullptr, found_inf, growth_interval);
  typename Exec::Guard guard(scale.device());
  Exec::launch_single_block(1, UpdateScaleOp{}, scale.mutable_data_ptr<float>(),
                            growth_tracker.mutable_data_ptr<int>(),
                            found_inf.const_data_ptr<float>(), growth_factor,
                            backoff_factor, static_cast<int>(growth_interval));
}

template <class Exec>
void update_scale_ext_launch(const OpArgs<Op::update_scale_ext_>& a) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(a);
  MIXPREC_BIND(a, scale, growth_tracker, hysteresis_left, found_inf,
               growth_factor, backoff_factor, growth_interval, hysteresis)
  typename Exec::Guard guard(scale.device());
  Exec::launch_single_block(
      1, UpdateScaleExtOp{}, scale.mutable_data_ptr<float>(),
      growth_tracker.mutable_data_ptr<int>(),
      hysteresis_left.mutable_data_ptr<int>(),
      found_inf.const_data_ptr<float>(), growth_factor, backoff_factor,
      static_cast<int>(growth_interval), b.min_scale, b.max_scale,
      static_cast<int>(hysteresis));
}

}  // namespace cuda
}  // namespace mixprec
