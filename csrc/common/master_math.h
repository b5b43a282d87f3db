// Split float32 masters of bfloat16 params: the master m is kept as the bf16
// param P (the step sets P = RNE_bf16(m), the kernels' own rounding) plus a
// 16-bit or an 8-bit correction. Shared by the CPU kernels (scalar, and the
// vector form in cpu/master_simd.h), the CUDA kernels and their emulation. No
// ATen types; host and device.
//
// With bits(x) the uint32 pattern of float32 x and P the uint16 pattern of the
// param:
//
//   d = int32(bits(m) - (uint32(P) << 16))     (wrapping; 0 when P is NaN)
//
// m and P = RNE(m) have one sign, so |d| <= 0x8000 for every m that is not
// NaN (m above bf16's max rounds to P = inf with d in [-0x8000, -1]).
//
//   16 bits: c = int16(min(d, 0x7fff));  bits(m') = (P << 16) + c
//   8 bits:  c = clamp(round_half_even(d / 256), -128, 127)
//            bits(m') = (P << 16) + c * 256
//   P NaN:   m' = the param's NaN, (P << 16), whatever c is.
//
// The 16-bit form gives m' == m for every float32 m except d == +0x8000 (m
// exactly half a bf16 ulp from an even P, away from zero: RNE rounds it to P),
// where m' is one float32 ulp nearer P, and NaN payloads. The 8-bit form keeps
// |bits(m') - bits(m)| <= 256 (<= 128 but for the clamp at d >= 32640).
// tools/master_split_check.cpp proves both over all 2^32 float32 patterns.
#pragma once

#include <torch/headeronly/macros/Macros.h>

#include <cstdint>

#include "common/optim_math.h"

namespace mixprec {
namespace master {

// Whether the bf16 pattern p is a NaN.
C10_HOST_DEVICE C10_ALWAYS_INLINE bool bf16_is_nan(uint32_t p) {
  return (p & 0x7fffu) > 0x7f80u;
}

// d of the header comment: m's distance from its param P in float32 patterns.
C10_HOST_DEVICE C10_ALWAYS_INLINE int32_t split_diff(uint32_t m_bits,
                                                     uint32_t p) {
  return bf16_is_nan(p) ? 0 : static_cast<int32_t>(m_bits - (p << 16));
}

C10_HOST_DEVICE C10_ALWAYS_INLINE int16_t encode16(uint32_t m_bits,
                                                   uint32_t p) {
  const int32_t d = split_diff(m_bits, p);
  return static_cast<int16_t>(d < 0x7fff ? d : 0x7fff);
}

C10_HOST_DEVICE C10_ALWAYS_INLINE int8_t encode8(uint32_t m_bits, uint32_t p) {
  const int32_t d = split_diff(m_bits, p);
  // d / 256 rounded half to even (arithmetic shifts), then clamped
  const int32_t c = (d + 127 + ((d >> 8) & 1)) >> 8;
  return static_cast<int8_t>(c < -128 ? -128 : (c > 127 ? 127 : c));
}

// The master's bits from the param's pattern p and its correction, in
// float32 patterns (c16, or c8 * 256).
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t decode_bits(uint32_t p,
                                                       int32_t offset) {
  return (p << 16) + (bf16_is_nan(p) ? 0u : static_cast<uint32_t>(offset));
}

C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t decode16(uint32_t p, int16_t c) {
  return decode_bits(p, c);
}

C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t decode8(uint32_t p, int8_t c) {
  return decode_bits(p, static_cast<int32_t>(c) * 256);
}

// The correction types: C is int16_t or int8_t.
template <typename C>
C10_HOST_DEVICE C10_ALWAYS_INLINE C encode(uint32_t m_bits, uint32_t p) {
  if constexpr (sizeof(C) == 2) {
    return encode16(m_bits, p);
  } else {
    return encode8(m_bits, p);
  }
}

template <typename C>
C10_HOST_DEVICE C10_ALWAYS_INLINE float decode(uint32_t p, C c) {
  if constexpr (sizeof(C) == 2) {
    return math::float_from_bits(decode16(p, c));
  } else {
    return math::float_from_bits(decode8(p, c));
  }
}

}  // namespace master
}  // namespace mixprec
