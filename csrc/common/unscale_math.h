// Element math shared by the CPU and CUDA kernels of unscale_and_check_,
// check_finite_ (and, later, the fused optimizers that unscale in-kernel).
//
// Written once, as templates over the value type, so the same expressions serve
//   * a scalar float/double on the host,
//   * a scalar float/double in a CUDA kernel,
//   * simd::Vec<float/double> in the vectorized CPU loop (csrc/cpu/simd.h).
// No ATen types appear here; only c10's host/device macro.
#pragma once

#include <torch/headeronly/macros/Macros.h>

namespace mixprec {
namespace math {

// Non-finite probe: `v - v` is +0 for every finite v and NaN for +-inf and
// NaN. Summing probes into an accumulator therefore gives 0 when every value
// was finite and NaN as soon as one was not. This keeps the check branch-free
// (vectorizes on CPU, no divergent branch on GPU); the accumulator is tested
// once per chunk with `is_nan_acc`.
template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T nonfinite_probe(const T& v) {
  return v - v;
}

template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE bool is_nan_acc(T acc) {
  return acc != acc;
}

// The unscaled value, as torch._amp_foreach_non_finite_check_and_unscale_
// computes it: the product in opmath (float for fp16/bf16), rounded once to
// the storage type by the caller. When inv_scale is exactly one torch stores
// the value unchanged; our kernels then skip the write altogether, which
// leaves the same bits (NaN payloads included) and saves the store traffic.
template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T unscale(const T& v, const T& inv_scale) {
  return v * inv_scale;
}

}  // namespace math
}  // namespace mixprec
