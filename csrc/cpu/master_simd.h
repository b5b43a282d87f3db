// Split float32 masters in simd.h's vectors: the vector form of
// common/master_math.h's encode and decode, for the CPU span kernels
// (fused_optim_span_impl.h). A master is read as the bf16 param's bits plus
// its int16 (or int8 * 256) correction, and written as the param rounded to
// nearest even (simd::bf16_round_bits, the kernels' rounding) and the
// correction of the float32 value to that param. Lane for lane the scalar
// functions of common/master_math.h (tools/master_split_check.cpp checks it
// for every float32 in each ISA it is built for).
//
// Include after simd.h, with the same ISA macro; includes no ATen header.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/simd.h"

namespace mixprec {
namespace simd {
inline namespace MIXPREC_SIMD_ISA {

// The compiler's vector of IVec::size() lanes of C (int16_t or int8_t).
template <typename C>
struct NarrowVec {
  typedef C type __attribute__((vector_size(IVec::size() * sizeof(C))));
};

// IVec::size() corrections at c, sign-extended to int32 lanes, in float32
// patterns (c, or c * 256 for int8).
template <typename C>
inline IVec load_correction(const C* c) {
  typename NarrowVec<C>::type n;
  std::memcpy(&n, c, sizeof(n));
  const IVec w(__builtin_convertvector(n, IVec::native));
  if constexpr (sizeof(C) == 1) {
    return IVec(w.v * 256);
  } else {
    return w;
  }
}

// Stores int32 lanes in C's range as IVec::size() values of C.
template <typename C>
inline void store_correction(C* c, const IVec& x) {
  const typename NarrowVec<C>::type n =
      __builtin_convertvector(x.v, typename NarrowVec<C>::type);
  std::memcpy(c, &n, sizeof(n));
}

typedef uint32_t UWords __attribute__((vector_size(kBytes)));

// The float32 masters of 2 * FVec::size() elements from the bf16 params p
// and corrections c: (P << 16) + correction, the param's NaN where P is NaN.
template <typename C>
inline void load2_split(const bf16* p, const C* c, FVec& a, FVec& b) {
  load2(p, a, b);  // the params' values: P << 16
  const auto one = [](const FVec& x, const C* cc) {
    // P is NaN exactly where P << 16 is a float NaN: no correction there
    const IVec off = select(x != x, IVec(0), load_correction(cc));
    return FVec((FVec::native)((UWords)x.v + (UWords)off.v));
  };
  a = one(a, c);
  b = one(b, c + FVec::size());
}

// The correction of each lane of x (float32 masters) to its param bits pb:
// d = bits(x) - (pb << 16), 0 where x (so P) is NaN; min(d, 0x7fff) for
// int16, d / 256 rounded half to even and clamped to [-128, 127] for int8.
template <typename C>
inline IVec split_correction(const FVec& x, const IVec& pb) {
  const IVec d0((IVec::native)((UWords)x.v - ((UWords)pb.v << 16)));
  const IVec d = select(x != x, IVec(0), d0);
  if constexpr (sizeof(C) == 2) {
    return minimum(d, IVec(0x7fff));
  } else {
    const IVec r =
        (d + IVec(127) + ((d >> IVec(8)) & IVec(1))) >> IVec(8);
    return maximum(minimum(r, IVec(127)), IVec(-128));
  }
}

// Stores the masters a, b (2 * FVec::size() elements) as params p (rounded to
// nearest even) and corrections c.
template <typename C>
inline void store2_split(bf16* p, C* c, const FVec& a, const FVec& b) {
  const IVec pa = bf16_round_bits(a);
  const IVec pb = bf16_round_bits(b);
  store2_bits(p, pa, pb);
  store_correction(c, split_correction<C>(a, pa));
  store_correction(c + FVec::size(), split_correction<C>(b, pb));
}

}  // namespace MIXPREC_SIMD_ISA
}  // namespace simd
}  // namespace mixprec
