// The vectorized element loops of fused_adam_ and fused_sgd_ on CPU: the
// simd.h policy for common/optim_math.h, loads/stores of float32, float16
// and bfloat16 spans as pairs of float vectors, rounding back to the param
// dtype (nearest or stochastic), the masters (float32, or split: a bf16
// param plus an int16 / int8 correction, cpu/master_simd.h); a span's last
// partial step runs on zero-padded copies.
//
// Included once per instruction set by span_kernels_isa.h, which defines
// MIXPREC_SPAN_NS (and, for an ISA, the MIXPREC_SIMD_* macro that picks
// simd.h's vectors) first; everything lands in mixprec::cpu::MIXPREC_SPAN_NS,
// next to the unscale loops of span_kernels_impl.h, and both fill that ISA's
// SpanKernels table (span_kernels.h).
#ifndef MIXPREC_SPAN_NS
#error "define MIXPREC_SPAN_NS before including fused_optim_span_impl.h"
#endif

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "common/optim_math.h"
#include "cpu/master_simd.h"
#include "cpu/simd.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace MIXPREC_SPAN_NS {

using simd::FVec;
using simd::load2;
using simd::store2;

// optim_math's Ops policy for simd::FVec.
struct VecOps {
  static FVec sqrt(const FVec& v) { return simd::sqrt(v); }
  static FVec maximum(const FVec& a, const FVec& b) {
    return simd::maximum(a, b);
  }
};

// Elements per vector step: two float vectors (what load2 / store2 move).
constexpr int64_t kStep = 2 * FVec::size();

// Stochastic rounding of float results to bfloat16; `index` is the SR element
// index of out[0] (see common/optim_math.h).
inline void store_bf16_stochastic(simd::bf16* out, const float* x, int64_t n,
                                  uint32_t key, uint32_t index) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t r =
        math::sr_bits(key, index + static_cast<uint32_t>(j)) >> 16;
    out[j] = simd::bf16{math::bf16_bits_stochastic(x[j], r)};
  }
}

// The element loops' master type M: void (no master: the param is the
// working copy), float (a float32 master) or int16_t / int8_t (a split
// master: the bf16 param plus that correction, common/master_math.h).
template <typename M>
constexpr bool kHasMaster = !std::is_void_v<M>;
// A kStep-element buffer of masters (float when there are none).
template <typename M>
using MasterBuf = std::conditional_t<std::is_void_v<M>, float, M>;

// master + i; null without masters.
template <typename M>
inline M* master_at(M* master, int64_t i) {
  if constexpr (kHasMaster<M>) {
    return master + i;
  } else {
    return nullptr;
  }
}

// The working (float32) values of elements [0, kStep): the param, its
// float32 master, or its split master decoded.
template <typename P, typename M>
inline void load_working(const P* p, const M* master, FVec& w0, FVec& w1) {
  if constexpr (std::is_void_v<M>) {
    load2(p, w0, w1);
  } else if constexpr (std::is_same_v<M, float>) {
    load2(master, w0, w1);
  } else {
    static_assert(std::is_same_v<P, simd::bf16>, "split masters: bf16 only");
    simd::load2_split(p, master, w0, w1);
  }
}

// Stores the working values of elements [i, i + kStep) (in a, b) into the
// param (rounded to nearest, or stochastically when `sr`) and the master
// (float32, or the correction of a split master to the rounded param).
template <typename P, typename M>
inline void store_param(P* p, M* master, int64_t i, const FVec& a,
                        const FVec& b, bool sr, uint32_t key,
                        uint32_t index_base) {
  if constexpr (std::is_same_v<M, float>) {
    store2(master + i, a, b);
  } else if constexpr (kHasMaster<M>) {
    static_assert(std::is_same_v<P, simd::bf16>, "split masters: bf16 only");
    simd::store2_split(p + i, master + i, a, b);  // (no SR with masters)
    return;
  }
  if constexpr (std::is_same_v<P, simd::bf16>) {
    if (sr) {
      alignas(64) float tmp[kStep];
      a.store(tmp);
      b.store(tmp + FVec::size());
      store_bf16_stochastic(p + i, tmp, kStep, key,
                            index_base + static_cast<uint32_t>(i));
      return;
    }
  }
  store2(p + i, a, b);
}

// What the element loops report of each new state value: nothing (the
// 32-bit steps), or, through a Seen of the same shape, their running |max|
// (the 8-bit steps need each block's new absmax: StateMax in
// fused_optim8_span_impl.h). State k: 0 = m or the momentum buffer, 1 = v.
struct NoStateMax {
  void see(int, const FVec&, const FVec&) {}
  void see(int, float) {}
};

// One vector step of Adam over elements [0, kStep) of the pointers (vm and
// master may be null as in adam_span); `index` is the SR index of element 0.
template <typename P, typename G, typename M, bool kAms, class Seen>
C10_ALWAYS_INLINE void adam_step(P* p, const G* g, float* m, float* v,
                                 float* vm, M* master, const AdamSpanArgs& a,
                                 uint32_t index, Seen& seen) {
  FVec w0, w1, g0, g1, m0, m1, v0, v1;
  FVec x0(0.0f), x1(0.0f);  // read only with kAms
  load_working(p, master, w0, w1);
  load2(g, g0, g1);
  load2(m, m0, m1);
  load2(v, v0, v1);
  if constexpr (kAms) {
    load2(vm, x0, x1);
  }
  g0 = math::prepare_grad(g0, a.gc);
  g1 = math::prepare_grad(g1, a.gc);
  math::adam_update<kAms, VecOps>(w0, g0, m0, v0, x0, a.k, a.s);
  math::adam_update<kAms, VecOps>(w1, g1, m1, v1, x1, a.k, a.s);
  store2(m, m0, m1);
  store2(v, v0, v1);
  seen.see(0, m0, m1);
  seen.see(1, v0, v1);
  if constexpr (kAms) {
    store2(vm, x0, x1);
  }
  store_param(p, master, 0, w0, w1, a.sr, a.key, index);
}

// Copies n elements between a span and a kStep-element buffer.
template <typename T>
inline void copy_n(T* dst, const T* src, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    dst[j] = src[j];
  }
}

// The element loops run whole vector steps; the last n % kStep elements of a
// span run the same vector step on zero-padded copies, so every element of
// every span takes one code path. The padding lanes are dropped and never
// reach `seen`.
template <typename P, typename G, typename M, bool kAms,
          class Seen = NoStateMax>
C10_ALWAYS_INLINE void adam_span(P* p, const G* g, float* m, float* v,
                                 float* vm, M* master, int64_t n,
                                 const AdamSpanArgs& a, Seen&& seen = Seen{}) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    adam_step<P, G, M, kAms>(p + i, g + i, m + i, v + i,
                             kAms ? vm + i : nullptr, master_at(master, i), a,
                             a.index_base + static_cast<uint32_t>(i), seen);
  }
  const int64_t r = n - i;
  if (r == 0) {
    return;
  }
  alignas(64) P pt[kStep] = {};
  alignas(64) G gt[kStep] = {};
  alignas(64) float mt[kStep] = {};
  alignas(64) float vt[kStep] = {};
  alignas(64) float xt[kStep] = {};
  alignas(64) MasterBuf<M> wt[kStep] = {};
  M* const wp = kHasMaster<M> ? wt : nullptr;
  copy_n(pt, p + i, r);
  copy_n(gt, g + i, r);
  copy_n(mt, m + i, r);
  copy_n(vt, v + i, r);
  if constexpr (kAms) {
    copy_n(xt, vm + i, r);
  }
  if constexpr (kHasMaster<M>) {
    copy_n(wt, master + i, r);
  }
  NoStateMax none;
  adam_step<P, G, M, kAms>(pt, gt, mt, vt, xt, wp, a,
                           a.index_base + static_cast<uint32_t>(i), none);
  copy_n(p + i, pt, r);
  copy_n(m + i, mt, r);
  copy_n(v + i, vt, r);
  if constexpr (kAms) {
    copy_n(vm + i, xt, r);
  }
  if constexpr (kHasMaster<M>) {
    copy_n(master + i, wt, r);
  }
  for (int64_t j = 0; j < r; ++j) {
    seen.see(0, mt[j]);
    seen.see(1, vt[j]);
  }
}

// One vector step of SGD over elements [0, kStep), as adam_step.
template <typename P, typename G, typename M, bool kMom, class Seen>
C10_ALWAYS_INLINE void sgd_step(P* p, const G* g, float* buf, M* master,
                                const SgdSpanArgs& a, uint32_t index,
                                Seen& seen) {
  FVec w0, w1, g0, g1;
  FVec b0(0.0f), b1(0.0f);  // read only with kMom, after the first step
  load_working(p, master, w0, w1);
  load2(g, g0, g1);
  if constexpr (kMom) {
    if (!a.first) {
      load2(buf, b0, b1);
    }
  }
  g0 = math::prepare_grad(g0, a.gc);
  g1 = math::prepare_grad(g1, a.gc);
  math::sgd_update(w0, g0, b0, a.k, a.first, a.neg_lr);
  math::sgd_update(w1, g1, b1, a.k, a.first, a.neg_lr);
  if constexpr (kMom) {
    store2(buf, b0, b1);
    seen.see(0, b0, b1);
  }
  store_param(p, master, 0, w0, w1, a.sr, a.key, index);
}

template <typename P, typename G, typename M, bool kMom,
          class Seen = NoStateMax>
C10_ALWAYS_INLINE void sgd_span(P* p, const G* g, float* buf, M* master,
                                int64_t n, const SgdSpanArgs& a,
                                Seen&& seen = Seen{}) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    sgd_step<P, G, M, kMom>(p + i, g + i, kMom ? buf + i : nullptr,
                            master_at(master, i), a,
                            a.index_base + static_cast<uint32_t>(i), seen);
  }
  const int64_t r = n - i;
  if (r == 0) {
    return;
  }
  alignas(64) P pt[kStep] = {};
  alignas(64) G gt[kStep] = {};
  alignas(64) float bt[kStep] = {};
  alignas(64) MasterBuf<M> wt[kStep] = {};
  M* const wp = kHasMaster<M> ? wt : nullptr;
  copy_n(pt, p + i, r);
  copy_n(gt, g + i, r);
  if constexpr (kMom) {
    if (!a.first) {
      copy_n(bt, buf + i, r);
    }
  }
  if constexpr (kHasMaster<M>) {
    copy_n(wt, master + i, r);
  }
  NoStateMax none;
  sgd_step<P, G, M, kMom>(pt, gt, bt, wp, a,
                          a.index_base + static_cast<uint32_t>(i), none);
  copy_n(p + i, pt, r);
  if constexpr (kMom) {
    copy_n(buf + i, bt, r);
    for (int64_t j = 0; j < r; ++j) {
      seen.see(0, bt[j]);
    }
  }
  if constexpr (kHasMaster<M>) {
    copy_n(master + i, wt, r);
  }
}

// Calls f(P*, G*) (null pointers typed by the dtypes).
template <typename F>
void dispatch2(SpanDtype pd, SpanDtype gd, F&& f) {
  auto with_grad = [&](auto* ptag) {
    switch (gd) {
      case SpanDtype::kHalf:
        f(ptag, static_cast<simd::fp16*>(nullptr));
        return;
      case SpanDtype::kBFloat16:
        f(ptag, static_cast<simd::bf16*>(nullptr));
        return;
      default:
        f(ptag, static_cast<float*>(nullptr));
        return;
    }
  };
  switch (pd) {
    case SpanDtype::kHalf:
      with_grad(static_cast<simd::fp16*>(nullptr));
      return;
    case SpanDtype::kBFloat16:
      with_grad(static_cast<simd::bf16*>(nullptr));
      return;
    default:
      with_grad(static_cast<float*>(nullptr));
      return;
  }
}

// Calls f(P* p, const G* g, M* master) with the span pointers typed by the
// dtypes; M (the element loops' master type) is void (a null void*) for
// float32 params and for 16-bit params without masters, else float, int16_t
// or int8_t by master.dtype (the corrections only with bf16 params:
// check_optim_param refuses the rest before any kernel runs).
template <typename F>
void dispatch_span(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                   const MasterSpan& master, F&& f) {
  dispatch2(pd, gd, [&](auto* ptag, auto* gtag) {
    using PT = std::remove_pointer_t<decltype(ptag)>;
    using GT = std::remove_pointer_t<decltype(gtag)>;
    PT* pp = static_cast<PT*>(p);
    const GT* gp = static_cast<const GT*>(g);
    void* const none = nullptr;
    if constexpr (std::is_same_v<PT, float>) {
      f(pp, gp, none);
    } else {
      switch (master.dtype) {
        case MasterDtype::kFloat:
          f(pp, gp, static_cast<float*>(master.p));
          return;
        case MasterDtype::kInt16:
        case MasterDtype::kInt8:
          if constexpr (std::is_same_v<PT, simd::bf16>) {
            if (master.dtype == MasterDtype::kInt16) {
              f(pp, gp, static_cast<int16_t*>(master.p));
            } else {
              f(pp, gp, static_cast<int8_t*>(master.p));
            }
            return;
          }
          std::abort();  // unreachable: refused by check_optim_param
        case MasterDtype::kNone:
        default:
          f(pp, gp, none);
          return;
      }
    }
  });
}

// The element types of dispatch_span's pointers (void: no master).
template <typename Ptr>
using Elem = std::remove_const_t<std::remove_pointer_t<Ptr>>;

inline void adam(SpanDtype pd, SpanDtype gd, void* p, const void* g, float* m,
                 float* v, float* vm, const MasterSpan& master, int64_t n,
                 const AdamSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto* mp) {
    using PT = Elem<decltype(pp)>;
    using GT = Elem<decltype(gp)>;
    using MT = Elem<decltype(mp)>;
    vm != nullptr ? adam_span<PT, GT, MT, true>(pp, gp, m, v, vm, mp, n, a)
                  : adam_span<PT, GT, MT, false>(pp, gp, m, v, vm, mp, n, a);
  });
}

inline void sgd(SpanDtype pd, SpanDtype gd, void* p, const void* g, float* buf,
                const MasterSpan& master, int64_t n, const SgdSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto* mp) {
    using PT = Elem<decltype(pp)>;
    using GT = Elem<decltype(gp)>;
    using MT = Elem<decltype(mp)>;
    buf != nullptr ? sgd_span<PT, GT, MT, true>(pp, gp, buf, mp, n, a)
                   : sgd_span<PT, GT, MT, false>(pp, gp, buf, mp, n, a);
  });
}

}  // namespace MIXPREC_SPAN_NS
}  // namespace cpu
}  // namespace mixprec
