// Vectorized CPU span kernel behind unscale_and_check_ and check_finite_.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

#include "common/unscale_math.h"

namespace mixprec {
namespace cpu {

template <typename V>
inline bool any_nan_lane(const V& acc) {
  using T = typename V::value_type;
  alignas(64) T lanes[V::size()];
  acc.store(lanes);
  bool nan = false;
  for (int k = 0; k < V::size(); ++k) {
    nan |= math::is_nan_acc(lanes[k]);
  }
  return nan;
}

// Checks p[0, n) for inf/NaN and, when `write`, multiplies it by inv_scale in
// place (math in opmath, one rounding back to scalar_t). Returns whether a
// non-finite input value was seen.
template <typename scalar_t>
bool unscale_check_span(scalar_t* p, int64_t n, float inv_scale_f,
                        bool write) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<opmath_t>;
  const opmath_t inv = static_cast<opmath_t>(inv_scale_f);
  const Vec vinv(inv);
  Vec acc(opmath_t(0));
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, opmath_t>) {
    for (; i + Vec::size() <= n; i += Vec::size()) {
      const Vec v = Vec::loadu(p + i);
      acc = acc + math::nonfinite_probe(v);
      if (write) {
        math::unscale(v, vinv).store(p + i);
      }
    }
  } else {
    using VecS = at::vec::Vectorized<scalar_t>;
    for (; i + VecS::size() <= n; i += VecS::size()) {
      auto [a, b] = at::vec::convert_to_float<scalar_t>(VecS::loadu(p + i));
      acc = acc + math::nonfinite_probe(a);
      acc = acc + math::nonfinite_probe(b);
      if (write) {
        at::vec::convert_from_float<scalar_t>(math::unscale(a, vinv),
                                              math::unscale(b, vinv))
            .store(p + i);
      }
    }
  }
  opmath_t tail = 0;
  for (; i < n; ++i) {
    const opmath_t v = static_cast<opmath_t>(p[i]);
    tail += math::nonfinite_probe(v);
    if (write) {
      p[i] = static_cast<scalar_t>(math::unscale(v, inv));
    }
  }
  return any_nan_lane(acc) || math::is_nan_acc(tail);
}

}  // namespace cpu
}  // namespace mixprec
