// The vectorized element loops of fused_adam_ and fused_sgd_ on CPU: the
// at::vec policy for common/optim_math.h, loads/stores of float32, float16
// and bfloat16 spans as pairs of float vectors, rounding back to the param
// dtype (nearest or stochastic), and a scalar tail running the same math.
//
// Included once per instruction set by span_kernels_isa.h, which defines
// MIXPREC_SPAN_NS (and, for an ISA, CPU_CAPABILITY so at::vec picks its
// intrinsics) first; everything lands in mixprec::cpu::MIXPREC_SPAN_NS, next
// to the unscale loops of span_kernels_impl.h, and both fill that ISA's
// SpanKernels table (span_kernels.h).
#ifndef MIXPREC_SPAN_NS
#error "define MIXPREC_SPAN_NS before including fused_optim_span_impl.h"
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "common/optim_math.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace MIXPREC_SPAN_NS {

using FVec = at::vec::Vectorized<float>;

// optim_math's Ops policy for Vectorized<float>.
struct VecOps {
  static FVec sqrt(const FVec& v) { return v.sqrt(); }
  static FVec maximum(const FVec& a, const FVec& b) {
    return at::vec::maximum(a, b);
  }
};

// Elements per vector step: two float vectors = one vector of a 16-bit type.
constexpr int64_t kStep = 2 * FVec::size();
static_assert(at::vec::Vectorized<c10::Half>::size() == kStep &&
                  at::vec::Vectorized<c10::BFloat16>::size() == kStep,
              "a 16-bit vector must hold two float vectors");

template <typename T>
inline void load2(const T* p, FVec& a, FVec& b) {
  if constexpr (std::is_same_v<T, float>) {
    a = FVec::loadu(p);
    b = FVec::loadu(p + FVec::size());
  } else {
    auto ab = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p));
    a = std::get<0>(ab);
    b = std::get<1>(ab);
  }
}

template <typename T>
inline void store2(T* p, const FVec& a, const FVec& b) {
  if constexpr (std::is_same_v<T, float>) {
    a.store(p);
    b.store(p + FVec::size());
  } else {
    at::vec::convert_from_float<T>(a, b).store(p);
  }
}

// Stochastic rounding of float results to bfloat16; `index` is the SR element
// index of out[0] (see common/optim_math.h).
inline void store_bf16_stochastic(c10::BFloat16* out, const float* x, int64_t n,
                                  uint32_t key, uint32_t index) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t r =
        math::sr_bits(key, index + static_cast<uint32_t>(j)) >> 16;
    out[j] = c10::BFloat16(math::bf16_bits_stochastic(x[j], r),
                           c10::BFloat16::from_bits());
  }
}

// Stores the working values of elements [i, i + kStep) (in a, b) into the
// param (rounded to nearest, or stochastically when `sr`) and the master.
template <typename P>
inline void store_param(P* p, float* master, int64_t i, const FVec& a,
                        const FVec& b, bool sr, uint32_t key,
                        uint32_t index_base) {
  if (master != nullptr) {
    store2(master + i, a, b);
  }
  if constexpr (std::is_same_v<P, c10::BFloat16>) {
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

template <typename P>
inline void store_param_scalar(P* p, float* master, int64_t i, float w, bool sr,
                               uint32_t key, uint32_t index_base) {
  if (master != nullptr) {
    master[i] = w;
  }
  if constexpr (std::is_same_v<P, c10::BFloat16>) {
    if (sr) {
      store_bf16_stochastic(p + i, &w, 1, key,
                            index_base + static_cast<uint32_t>(i));
      return;
    }
  }
  p[i] = static_cast<P>(w);
}

// What the element loops report of each new state value: nothing (the
// 32-bit steps), or, through a Seen of the same shape, their running |max|
// (the 8-bit steps need each block's new absmax: StateMax in
// fused_optim8_span_impl.h). State k: 0 = m or the momentum buffer, 1 = v.
struct NoStateMax {
  void see(int, const FVec&, const FVec&) {}
  void see(int, float) {}
};

template <typename P, typename G, bool kMaster, bool kAms,
          class Seen = NoStateMax>
void adam_span(P* p, const G* g, float* m, float* v, float* vm, float* master,
               int64_t n, const AdamSpanArgs& a, Seen&& seen = Seen{}) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    FVec w0, w1, g0, g1, m0, m1, v0, v1, x0, x1;
    if constexpr (kMaster) {
      load2(master + i, w0, w1);
    } else {
      load2(p + i, w0, w1);
    }
    load2(g + i, g0, g1);
    load2(m + i, m0, m1);
    load2(v + i, v0, v1);
    if constexpr (kAms) {
      load2(vm + i, x0, x1);
    }
    g0 = math::prepare_grad(g0, a.gc);
    g1 = math::prepare_grad(g1, a.gc);
    math::adam_update<kAms, VecOps>(w0, g0, m0, v0, x0, a.k, a.s);
    math::adam_update<kAms, VecOps>(w1, g1, m1, v1, x1, a.k, a.s);
    store2(m + i, m0, m1);
    store2(v + i, v0, v1);
    seen.see(0, m0, m1);
    seen.see(1, v0, v1);
    if constexpr (kAms) {
      store2(vm + i, x0, x1);
    }
    store_param(p, kMaster ? master : nullptr, i, w0, w1, a.sr, a.key,
                a.index_base);
  }
  for (; i < n; ++i) {
    float w = kMaster ? master[i] : static_cast<float>(p[i]);
    float gi = math::prepare_grad(static_cast<float>(g[i]), a.gc);
    float mi = m[i];
    float vi = v[i];
    float xi = kAms ? vm[i] : 0.0f;
    math::adam_update<kAms, math::ScalarOps>(w, gi, mi, vi, xi, a.k, a.s);
    m[i] = mi;
    v[i] = vi;
    seen.see(0, mi);
    seen.see(1, vi);
    if constexpr (kAms) {
      vm[i] = xi;
    }
    store_param_scalar(p, kMaster ? master : nullptr, i, w, a.sr, a.key,
                       a.index_base);
  }
}

template <typename P, typename G, bool kMaster, bool kMom,
          class Seen = NoStateMax>
void sgd_span(P* p, const G* g, float* buf, float* master, int64_t n,
              const SgdSpanArgs& a, Seen&& seen = Seen{}) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    FVec w0, w1, g0, g1, b0, b1;
    if constexpr (kMaster) {
      load2(master + i, w0, w1);
    } else {
      load2(p + i, w0, w1);
    }
    load2(g + i, g0, g1);
    if constexpr (kMom) {
      if (!a.first) {
        load2(buf + i, b0, b1);
      }
    }
    g0 = math::prepare_grad(g0, a.gc);
    g1 = math::prepare_grad(g1, a.gc);
    math::sgd_update(w0, g0, b0, a.k, a.first, a.neg_lr);
    math::sgd_update(w1, g1, b1, a.k, a.first, a.neg_lr);
    if constexpr (kMom) {
      store2(buf + i, b0, b1);
      seen.see(0, b0, b1);
    }
    store_param(p, kMaster ? master : nullptr, i, w0, w1, a.sr, a.key,
                a.index_base);
  }
  for (; i < n; ++i) {
    float w = kMaster ? master[i] : static_cast<float>(p[i]);
    const float gi = math::prepare_grad(static_cast<float>(g[i]), a.gc);
    float bi = (kMom && !a.first) ? buf[i] : 0.0f;
    math::sgd_update(w, gi, bi, a.k, a.first, a.neg_lr);
    if constexpr (kMom) {
      buf[i] = bi;
      seen.see(0, bi);
    }
    store_param_scalar(p, kMaster ? master : nullptr, i, w, a.sr, a.key,
                       a.index_base);
  }
}

// Calls f(P*, G*) (null pointers typed by the dtypes).
template <typename F>
void dispatch2(SpanDtype pd, SpanDtype gd, F&& f) {
  auto with_grad = [&](auto* ptag) {
    switch (gd) {
      case SpanDtype::kHalf:
        f(ptag, static_cast<c10::Half*>(nullptr));
        return;
      case SpanDtype::kBFloat16:
        f(ptag, static_cast<c10::BFloat16*>(nullptr));
        return;
      default:
        f(ptag, static_cast<float*>(nullptr));
        return;
    }
  };
  switch (pd) {
    case SpanDtype::kHalf:
      with_grad(static_cast<c10::Half*>(nullptr));
      return;
    case SpanDtype::kBFloat16:
      with_grad(static_cast<c10::BFloat16*>(nullptr));
      return;
    default:
      with_grad(static_cast<float*>(nullptr));
      return;
  }
}

// Calls f(P* p, const G* g, kMaster) with the span pointers typed by the
// dtypes; kMaster (std::true_type or std::false_type) says whether the
// element loop keeps a float32 master: a 16-bit param with one.
template <typename F>
void dispatch_span(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                   const float* master, F&& f) {
  dispatch2(pd, gd, [&](auto* ptag, auto* gtag) {
    using PT = std::remove_pointer_t<decltype(ptag)>;
    using GT = std::remove_pointer_t<decltype(gtag)>;
    PT* pp = static_cast<PT*>(p);
    const GT* gp = static_cast<const GT*>(g);
    if constexpr (std::is_same_v<PT, float>) {
      f(pp, gp, std::false_type{});
    } else if (master != nullptr) {
      f(pp, gp, std::true_type{});
    } else {
      f(pp, gp, std::false_type{});
    }
  });
}

// The element types of dispatch_span's pointers.
template <typename Ptr>
using Elem = std::remove_const_t<std::remove_pointer_t<Ptr>>;

inline void adam(SpanDtype pd, SpanDtype gd, void* p, const void* g, float* m,
                 float* v, float* vm, float* master, int64_t n,
                 const AdamSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto kmaster) {
    using PT = Elem<decltype(pp)>;
    using GT = Elem<decltype(gp)>;
    constexpr bool kM = decltype(kmaster)::value;
    float* mp = kM ? master : nullptr;
    vm != nullptr ? adam_span<PT, GT, kM, true>(pp, gp, m, v, vm, mp, n, a)
                  : adam_span<PT, GT, kM, false>(pp, gp, m, v, vm, mp, n, a);
  });
}

inline void sgd(SpanDtype pd, SpanDtype gd, void* p, const void* g, float* buf,
                float* master, int64_t n, const SgdSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto kmaster) {
    using PT = Elem<decltype(pp)>;
    using GT = Elem<decltype(gp)>;
    constexpr bool kM = decltype(kmaster)::value;
    float* mp = kM ? master : nullptr;
    buf != nullptr ? sgd_span<PT, GT, kM, true>(pp, gp, buf, mp, n, a)
                   : sgd_span<PT, GT, kM, false>(pp, gp, buf, mp, n, a);
  });
}

}  // namespace MIXPREC_SPAN_NS
}  // namespace cpu
}  // namespace mixprec
