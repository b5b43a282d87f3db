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
// patterns (c, or c * 256 for int8). (GCC lowers the generic int8 -> int32
// conversion to scalar sign extensions: the x86 sets use vpmovsx.)
template <typename C>
inline IVec load_correction(const C* c) {
#if defined(MIXPREC_SIMD_AVX512)
  if constexpr (sizeof(C) == 2) {
    return IVec((IVec::native)_mm512_cvtepi16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))));
  } else {
    return IVec((IVec::native)_mm512_slli_epi32(
        _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(c))),
        8));
  }
#elif defined(MIXPREC_SIMD_AVX2)
  if constexpr (sizeof(C) == 2) {
    return IVec((IVec::native)_mm256_cvtepi16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
  } else {
    return IVec((IVec::native)_mm256_slli_epi32(
        _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))),
        8));
  }
#else
  typename NarrowVec<C>::type n;
  std::memcpy(&n, c, sizeof(n));
  const IVec w(__builtin_convertvector(n, IVec::native));
  if constexpr (sizeof(C) == 1) {
    return IVec(w.v << 8);
  } else {
    return w;
  }
#endif
}

// Stores the int32 lanes of lo, then hi, as 2 * IVec::size() values of C,
// each saturated to C's range (signed): the x86 sets' saturating packs, the
// clamp in the portable set.
template <typename C>
inline void store2_correction(C* c, const IVec& lo, const IVec& hi) {
#if defined(MIXPREC_SIMD_AVX512)
  // packs interleaves the 128-bit lanes of lo and hi (4 lanes of each per
  // 128 bits); the permutes restore their order.
  const __m512i w = _mm512_packs_epi32((__m512i)lo.v, (__m512i)hi.v);
  if constexpr (sizeof(C) == 2) {
    _mm512_storeu_si512(c, _mm512_permutexvar_epi64(
                               _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), w));
  } else {
    // dword 4k of each 128 bits: lo's lanes 4k..4k+3, dword 4k+1: hi's
    const __m512i b = _mm512_permutexvar_epi32(
        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0),
        _mm512_packs_epi16(w, w));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                        _mm512_castsi512_si256(b));
  }
#elif defined(MIXPREC_SIMD_AVX2)
  const __m256i w = _mm256_packs_epi32((__m256i)lo.v, (__m256i)hi.v);
  if constexpr (sizeof(C) == 2) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                        _mm256_permute4x64_epi64(w, 0xd8));
  } else {
    const __m256i b = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(w, w), _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c), _mm256_castsi256_si128(b));
  }
#else
  constexpr int32_t kMax = sizeof(C) == 2 ? 0x7fff : 0x7f;
  const auto one = [](C* cc, const IVec& x) {
    const IVec s = maximum(minimum(x, IVec(kMax)), IVec(-kMax - 1));
    const typename NarrowVec<C>::type n =
        __builtin_convertvector(s.v, typename NarrowVec<C>::type);
    std::memcpy(cc, &n, sizeof(n));
  };
  one(c, lo);
  one(c + IVec::size(), hi);
#endif
}

typedef uint32_t UWords __attribute__((vector_size(kBytes)));

// The float32 masters of 2 * FVec::size() elements from the bf16 params p
// and corrections c: (P << 16) + correction, the param's NaN where P is NaN.
template <typename C>
inline void load2_split(const bf16* p, const C* c, FVec& a, FVec& b) {
  load2(p, a, b);  // the params' values: P << 16
  const auto one = [](const FVec& x, const C* cc) {
  // P is NaN exactly where P << 16 is a float NaN: no correction there
#if defined(MIXPREC_SIMD_AVX512)
    const __m512i xi = (__m512i)x.v;
    return FVec((FVec::native)_mm512_mask_add_epi32(
        xi, _mm512_cmp_ps_mask(x.v, x.v, _CMP_ORD_Q), xi,
        (__m512i)load_correction(cc).v));
#else
    const IVec off = select(x != x, IVec(0), load_correction(cc));
    return FVec((FVec::native)((UWords)x.v + (UWords)off.v));
#endif
  };
  a = one(a, c);
  b = one(b, c + FVec::size());
}

// The correction of each lane of x (float32 masters) to its param bits pb,
// before store2_correction's saturation: d = bits(x) - (pb << 16), 0 where x
// (so P) is NaN, for int16 (saturated: min(d, 0x7fff), as d >= -0x8000); d /
// 256 rounded half to even for int8 (saturated: clamped to [-128, 127]).
template <typename C>
inline IVec split_correction(const FVec& x, const IVec& pb) {
  const IVec d0((IVec::native)((UWords)x.v - ((UWords)pb.v << 16)));
  const IVec d(d0.v & ~(x != x).v);  // (an and-not, not a blend, on AVX2)
  if constexpr (sizeof(C) == 2) {
    return d;
  } else {
    return (d + IVec(127) + ((d >> IVec(8)) & IVec(1))) >> IVec(8);
  }
}

// Stores the masters a, b (2 * FVec::size() elements) as params p (rounded to
// nearest even) and corrections c.
template <typename C>
inline void store2_split(bf16* p, C* c, const FVec& a, const FVec& b) {
  const IVec pa = bf16_round_bits(a);
  const IVec pb = bf16_round_bits(b);
  store2_bits(p, pa, pb);
  store2_correction(c, split_correction<C>(a, pa), split_correction<C>(b, pb));
}

}  // namespace MIXPREC_SIMD_ISA
}  // namespace simd
}  // namespace mixprec
