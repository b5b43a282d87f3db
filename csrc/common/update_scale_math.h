// Loss-scale update rules, shared by the CPU kernel and the one-thread CUDA
// kernel of update_scale_ / update_scale_ext_. No ATen types.
#pragma once

#include <torch/headeronly/macros/Macros.h>

#include <cstdint>

#ifndef __CUDACC__
#include <cmath>
#endif

namespace mixprec {
namespace math {

C10_HOST_DEVICE C10_ALWAYS_INLINE bool finite_f32(float v) {
#ifdef __CUDA_ARCH__
  return isfinite(v);
#else
  return std::isfinite(v);
#endif
}

// torch._amp_update_scale_, bit for bit: the products are taken in double
// (the factors are doubles) and rounded to float; growth is skipped when the
// grown scale is not finite; growth_tracker counts consecutive clean steps.
C10_HOST_DEVICE C10_ALWAYS_INLINE void update_scale(
    float* scale, int* growth_tracker, float found_inf, double growth_factor,
    double backoff_factor, int growth_interval) {
  if (found_inf != 0.0f) {
    *scale = static_cast<float>((*scale) * backoff_factor);
    *growth_tracker = 0;
  } else {
    const int successful = (*growth_tracker) + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>((*scale) * growth_factor);
      if (finite_f32(grown)) {
        *scale = grown;
      }
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful;
    }
  }
}

// The extended rule (update_scale_ext_). State: scale, growth_tracker and
// hysteresis_left (units of hysteresis still available).
//
//  overflow:  growth_tracker = 0; hysteresis_left = max(hysteresis_left - 1,
//  0);
//             if hysteresis_left == 0:
//                 scale = max(scale * backoff_factor, min_scale)
//             (so the first `hysteresis - 1` overflows since the last growth
//             are absorbed and every later one backs off).
//  clean:     growth_tracker += 1;
//             if growth_tracker == growth_interval:
//                 grown = scale * growth_factor
//                 if grown is finite: scale = min(grown, max_scale)
//                 growth_tracker = 0; hysteresis_left = hysteresis (refill).
//
// Products and clamps are taken in double and rounded to float once, so
// with hysteresis == 1 and no bounds this is exactly update_scale above.
// The refill happens on every completed growth interval, including when the
// grown scale was not finite or was capped by max_scale.
C10_HOST_DEVICE C10_ALWAYS_INLINE void update_scale_ext(
    float* scale, int* growth_tracker, int* hysteresis_left, float found_inf,
    double growth_factor, double backoff_factor, int growth_interval,
    double min_scale, double max_scale, int hysteresis) {
  if (found_inf != 0.0f) {
    *growth_tracker = 0;
    const int left = (*hysteresis_left) > 0 ? (*hysteresis_left) - 1 : 0;
    *hysteresis_left = left;
    if (left == 0) {
      double s = (*scale) * backoff_factor;
      s = s < min_scale ? min_scale : s;
      *scale = static_cast<float>(s);
    }
  } else {
    const int successful = (*growth_tracker) + 1;
    if (successful == growth_interval) {
      double grown = (*scale) * growth_factor;
      if (finite_f32(static_cast<float>(grown))) {
        grown = grown > max_scale ? max_scale : grown;
        *scale = static_cast<float>(grown);
      }
      *growth_tracker = 0;
      *hysteresis_left = hysteresis;
    } else {
      *growth_tracker = successful;
    }
  }
}

// The statistics of one update, after it (mixprec.GradScaler.stats(): what
// amp/stats.py's _StatsTracker.record computes with torch ops): counts =
// [updates, overflowed updates, updates after which the scale was larger than
// *prev_scale, ... smaller, the index of the last overflowed update (-1:
// none)]; the index is the update count before this one. *prev_scale becomes
// the new scale. A NaN found_inf counts as an overflow, as in the rules.
C10_HOST_DEVICE C10_ALWAYS_INLINE void count_update(int64_t* counts,
                                                    float* prev_scale,
                                                    float scale,
                                                    float found_inf) {
  const bool overflow = found_inf != 0.0f;
  if (overflow) counts[4] = counts[0];
  counts[0] += 1;
  counts[1] += overflow ? 1 : 0;
  counts[2] += scale > *prev_scale ? 1 : 0;
  counts[3] += scale < *prev_scale ? 1 : 0;
  *prev_scale = scale;
}

}  // namespace math
}  // namespace mixprec
