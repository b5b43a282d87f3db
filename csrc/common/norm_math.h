// Element math of unscale_and_norm_ (the total p-norm of the unscaled
// gradients), shared by the CPU and CUDA kernels. No ATen types.
//
// A norm is accumulated as a "partial": the sum of |u|^p (p = 1, 2, or any
// p > 0) or the max of |u| (p = inf). Partials combine with `combine` and the
// norm is `finish(partial)`. NaN propagates through both (the max included),
// as in torch.linalg.vector_norm.
#pragma once

#include <torch/headeronly/macros/Macros.h>

#include <type_traits>

#ifndef __CUDACC__
#include <cmath>
#endif

namespace mixprec {
namespace math {

enum NormKind : int { kNormL1 = 0, kNormL2 = 1, kNormInf = 2, kNormP = 3 };

template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T abs_(T v) {
  return v < T(0) ? -v : v;
}

template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T pow_(T v, T p) {
#ifdef __CUDA_ARCH__
  return pow(v, p);
#else
  return std::pow(v, p);
#endif
}

// NaN-propagating max.
template <typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T max_nan_(T a, T b) {
  return (a != a || a > b) ? a : b;
}

// The contribution of one unscaled value u.
template <int Kind, typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T norm_term(T u, T p) {
  if constexpr (Kind == kNormL2) {
    return u * u;
  } else if constexpr (Kind == kNormL1 || Kind == kNormInf) {
    return abs_(u);
  } else {
    return pow_(abs_(u), p);
  }
}

template <int Kind, typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T combine(T a, T b) {
  if constexpr (Kind == kNormInf) {
    return max_nan_(a, b);
  } else {
    return a + b;
  }
}

template <int Kind, typename T>
C10_HOST_DEVICE C10_ALWAYS_INLINE T finish(T partial, T p) {
  if constexpr (Kind == kNormL2) {
#ifdef __CUDA_ARCH__
    return sqrt(partial);
#else
    return std::sqrt(partial);
#endif
  } else if constexpr (Kind == kNormL1 || Kind == kNormInf) {
    return partial;
  } else {
    return pow_(partial, T(1) / p);
  }
}

// Maps a norm_type to a kind; p must be > 0 (inf allowed).
C10_HOST_DEVICE inline int norm_kind(double p) {
  if (p == 1.0) return kNormL1;
  if (p == 2.0) return kNormL2;
  if (p > 1.0e308) return kNormInf;
  return kNormP;
}

// Host side: calls f(std::integral_constant<int, Kind>{}) for `kind` (a
// NormKind), so a kernel template can be instantiated per kind.
template <class F>
decltype(auto) dispatch_norm_kind(int kind, F&& f) {
  switch (kind) {
    case kNormL1:
      return f(std::integral_constant<int, kNormL1>{});
    case kNormL2:
      return f(std::integral_constant<int, kNormL2>{});
    case kNormInf:
      return f(std::integral_constant<int, kNormInf>{});
    default:
      return f(std::integral_constant<int, kNormP>{});
  }
}

}  // namespace math
}  // namespace mixprec
