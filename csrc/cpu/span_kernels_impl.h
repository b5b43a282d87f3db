// Vectorized CPU span kernels behind unscale_and_check_, check_finite_ and
// unscale_and_norm_. Math in opmath (float for fp16/bf16), one rounding back.
//
// Included once per instruction set by span_kernels_isa.h, which defines
// MIXPREC_SPAN_NS (and, for an ISA, the MIXPREC_SIMD_* macro that picks
// simd.h's vectors) first; everything lands in mixprec::cpu::MIXPREC_SPAN_NS.
#ifndef MIXPREC_SPAN_NS
#error "define MIXPREC_SPAN_NS before including span_kernels_impl.h"
#endif

#include <type_traits>
#include <utility>

#include "common/norm_math.h"
#include "common/unscale_math.h"
#include "cpu/simd.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace MIXPREC_SPAN_NS {

template <typename scalar_t>
using OpVec = simd::Vec<simd::opmath_t<scalar_t>>;

// Elements of scalar_t per storage vector: one OpVec, or two for the 16-bit
// types.
template <typename scalar_t>
constexpr int64_t kStorageLanes =
    std::is_same_v<scalar_t, simd::opmath_t<scalar_t>>
        ? OpVec<scalar_t>::size()
        : 2 * OpVec<scalar_t>::size();

// Calls f(OpVec&) on every full storage vector of p[0, n) converted to opmath
// (two calls per vector for fp16/bf16); when `write`, stores what f left in
// the vector back, rounded to scalar_t. Returns how many elements it covered;
// the caller handles the scalar tail [returned, n).
template <typename scalar_t, typename F>
int64_t map_vectors(scalar_t* p, int64_t n, bool write, F&& f) {
  using Vec = OpVec<scalar_t>;
  constexpr int64_t kS = kStorageLanes<scalar_t>;
  int64_t i = 0;
  for (; i + kS <= n; i += kS) {
    if constexpr (std::is_same_v<scalar_t, simd::opmath_t<scalar_t>>) {
      Vec v = Vec::loadu(p + i);
      f(v);
      if (write) {
        v.store(p + i);
      }
    } else {
      Vec a, b;
      simd::load2(p + i, a, b);
      f(a);
      f(b);
      if (write) {
        simd::store2(p + i, a, b);
      }
    }
  }
  return i;
}

template <typename T, typename V, typename Op>
T reduce_lanes(const V& v, T init, Op op) {
  alignas(64) typename V::value_type lanes[V::size()];
  v.store(lanes);
  T r = init;
  for (int k = 0; k < V::size(); ++k) {
    r = op(r, lanes[k]);
  }
  return r;
}

// One storage vector of unscale_check_span at p: the non-finite probe of its
// values (in opmath) added into `acc` and, with kWrite, the unscaled values
// stored back, rounded once to scalar_t.
template <bool kWrite, typename scalar_t>
C10_ALWAYS_INLINE void unscale_check_vector(scalar_t* p,
                                            const OpVec<scalar_t>& vinv,
                                            OpVec<scalar_t>& acc) {
  using Vec = OpVec<scalar_t>;
  if constexpr (std::is_same_v<scalar_t, simd::opmath_t<scalar_t>>) {
    const Vec v = Vec::loadu(p);
    acc = acc + math::nonfinite_probe(v);
    if constexpr (kWrite) {
      math::unscale(v, vinv).store(p);
    }
  } else {
    Vec a, b;
    simd::load2(p, a, b);
    acc = acc + math::nonfinite_probe(a) + math::nonfinite_probe(b);
    if constexpr (kWrite) {
      simd::store2(p, math::unscale(a, vinv), math::unscale(b, vinv));
    }
  }
}

// unscale_check_span for a fixed `write`. Four storage vectors per step, each
// with its own probe accumulator: no add-latency chain through one
// accumulator and no test of `write` per vector, so a span that sits in cache
// runs at the load/store rate. Out of cache each element is still read once
// and (with kWrite) written once, in one pass. The probes are zeros and NaNs,
// so whether their sum is NaN does not depend on the order of the adds: the
// result, like every unscaled value, is the same on every ISA.
template <bool kWrite, typename scalar_t>
bool unscale_check_span_impl(scalar_t* p, int64_t n, float inv_scale_f) {
  using opmath_t = simd::opmath_t<scalar_t>;
  using Vec = OpVec<scalar_t>;
  constexpr int64_t kS = kStorageLanes<scalar_t>;
  const opmath_t inv = static_cast<opmath_t>(inv_scale_f);
  const Vec vinv(inv);
  Vec a0(opmath_t(0)), a1(opmath_t(0)), a2(opmath_t(0)), a3(opmath_t(0));
  int64_t i = 0;
  for (; i + 4 * kS <= n; i += 4 * kS) {
    unscale_check_vector<kWrite>(p + i, vinv, a0);
    unscale_check_vector<kWrite>(p + i + kS, vinv, a1);
    unscale_check_vector<kWrite>(p + i + 2 * kS, vinv, a2);
    unscale_check_vector<kWrite>(p + i + 3 * kS, vinv, a3);
  }
  for (; i + kS <= n; i += kS) {
    unscale_check_vector<kWrite>(p + i, vinv, a0);
  }
  opmath_t tail = 0;
  for (; i < n; ++i) {
    const opmath_t v = simd::widen(p[i]);
    tail += math::nonfinite_probe(v);
    if constexpr (kWrite) {
      p[i] = simd::narrow<scalar_t>(math::unscale(v, inv));
    }
  }
  const Vec acc = (a0 + a1) + (a2 + a3);
  const bool nan_lane = reduce_lanes<bool>(
      acc, false, [](bool r, opmath_t x) { return r || math::is_nan_acc(x); });
  return nan_lane || math::is_nan_acc(tail);
}

// Checks p[0, n) for inf/NaN and, when `write`, multiplies it by inv_scale in
// place. Returns whether a non-finite input value was seen.
template <typename scalar_t>
bool unscale_check_span(scalar_t* p, int64_t n, float inv_scale_f, bool write) {
  return write ? unscale_check_span_impl<true>(p, n, inv_scale_f)
               : unscale_check_span_impl<false>(p, n, inv_scale_f);
}

template <int Kind, typename V>
V vec_norm_term(const V& u, const V& p) {
  if constexpr (Kind == math::kNormL2) {
    return u * u;
  } else if constexpr (Kind == math::kNormL1 || Kind == math::kNormInf) {
    return simd::abs(u);
  } else {
    return simd::pow(simd::abs(u), p);
  }
}

template <int Kind, typename V>
V vec_combine(const V& a, const V& b) {
  if constexpr (Kind == math::kNormInf) {
    return simd::maximum(a, b);  // propagates NaN
  } else {
    return a + b;
  }
}

// unscale_check_span plus the norm partial of the unscaled values. Vector
// accumulators are flushed into a double every kFlush vectors, which keeps
// float rounding error far below 1e-6 relative whatever the tensor size.
template <typename scalar_t, int Kind>
SpanNorm unscale_norm_span(scalar_t* p, int64_t n, float inv_scale_f,
                           bool write, double norm_type) {
  using opmath_t = simd::opmath_t<scalar_t>;
  using Vec = OpVec<scalar_t>;
  constexpr int kFlush = 32;
  const opmath_t inv = static_cast<opmath_t>(inv_scale_f);
  const opmath_t pn = static_cast<opmath_t>(norm_type);
  const Vec vinv(inv);
  const Vec vp(pn);
  Vec probe(opmath_t(0));
  Vec acc(opmath_t(0));
  int pending = 0;
  double partial = 0.0;
  auto flush = [&] {
    partial = reduce_lanes<double>(acc, partial, [](double r, double x) {
      return math::combine<Kind, double>(r, x);
    });
    acc = Vec(opmath_t(0));
    pending = 0;
  };
  int64_t i = map_vectors(p, n, write, [&](Vec& v) {
    probe = probe + math::nonfinite_probe(v);
    v = math::unscale(v, vinv);
    acc = vec_combine<Kind>(acc, vec_norm_term<Kind>(v, vp));
    if (++pending == kFlush) {
      flush();
    }
  });
  flush();
  opmath_t tail_probe = 0;
  for (; i < n; ++i) {
    const opmath_t v = simd::widen(p[i]);
    tail_probe += math::nonfinite_probe(v);
    const opmath_t u = math::unscale(v, inv);
    partial = math::combine<Kind, double>(
        partial, static_cast<double>(math::norm_term<Kind>(u, pn)));
    if (write) {
      p[i] = simd::narrow<scalar_t>(u);
    }
  }
  const bool nan_lane = reduce_lanes<bool>(
      probe, false,
      [](bool r, opmath_t x) { return r || math::is_nan_acc(x); });
  return SpanNorm{nan_lane || math::is_nan_acc(tail_probe), partial};
}

template <typename F>
decltype(auto) dispatch_dtype(SpanDtype dtype, F&& f) {
  switch (dtype) {
    case SpanDtype::kFloat:
      return f(float{});
    case SpanDtype::kHalf:
      return f(simd::fp16{});
    case SpanDtype::kBFloat16:
      return f(simd::bf16{});
    case SpanDtype::kDouble:
    default:
      return f(double{});
  }
}

inline bool unscale_check(SpanDtype dtype, void* p, int64_t n, float inv,
                          bool write) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return unscale_check_span<T>(static_cast<T*>(p), n, inv, write);
  });
}

inline SpanNorm unscale_norm(SpanDtype dtype, int kind, void* p, int64_t n,
                             float inv, bool write, double norm_type) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* q = static_cast<T*>(p);
    return math::dispatch_norm_kind(kind, [&](auto k) {
      return unscale_norm_span<T, decltype(k)::value>(q, n, inv, write,
                                                      norm_type);
    });
  });
}

}  // namespace MIXPREC_SPAN_NS
}  // namespace cpu
}  // namespace mixprec
