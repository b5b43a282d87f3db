// SIMD vectors for the CPU span kernels: float, double and int32 vectors of
// one instruction set's width on GCC/Clang vector types, plus the few
// intrinsics each set needs (broadcast, NaN-propagating max, sqrt, gather,
// fp16 conversion, byte packing). Includes no ATen, c10 or torch header.
//
// The including translation unit picks the set before including: with
// MIXPREC_SIMD_AVX512 the vectors are 64 bytes, with MIXPREC_SIMD_AVX2 32
// bytes; with neither, the portable 32-byte vectors that the compiler lowers
// to whatever the target has. Everything lands in an inline namespace named
// after the set, so translation units of different sets define no function
// twice.
//
// The functions are plain inline, not always_inline: the math templates of
// common/ that call them are defined before an ISA file's target pragma, and
// GCC refuses to force a function of that target into them; plain inline
// functions are inlined once those templates are inlined into the ISA's
// loops (as at::vec's were).
//
// Every operation gives the same bits as ATen's at::vec::Vectorized did in
// the same set: arithmetic is IEEE per lane (the builds use
// -ffp-contract=off), and where at::vec's sets differed, each set here keeps
// its own behaviour (maximum's NaN, fp16 and bf16 rounding of NaN). The one
// thing no source fixes: when both operands of an add or a multiply are NaNs
// with different payloads, which one comes out depends on the operand order
// the compiler picks for that instruction (x86 returns the first), in this
// header as in at::vec. The exception is pow (below): std::pow per lane,
// where at::vec called SLEEF.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(MIXPREC_SIMD_AVX2) || defined(MIXPREC_SIMD_AVX512)
#include <immintrin.h>
#endif

#if defined(MIXPREC_SIMD_AVX512)
#define MIXPREC_SIMD_ISA avx512
#elif defined(MIXPREC_SIMD_AVX2)
#define MIXPREC_SIMD_ISA avx2
#else
#define MIXPREC_SIMD_ISA portable
#endif

// 32-byte vectors passed between inline functions of the portable set on a
// target without AVX: nothing crosses a non-inline ABI boundary.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace mixprec {
namespace simd {

// The bits of one IEEE binary16 / bfloat16 value, as stored in a tensor.
struct fp16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

// The type the kernels compute a storage type in: float for the 16-bit
// types, the type itself otherwise.
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<fp16> {
  using type = float;
};
template <>
struct OpMath<bf16> {
  using type = float;
};
template <typename T>
using opmath_t = typename OpMath<T>::type;

inline namespace MIXPREC_SIMD_ISA {

#if defined(MIXPREC_SIMD_AVX512)
constexpr int kBytes = 64;
#else
constexpr int kBytes = 32;
#endif

// The compiler's vector of kBytes / sizeof(T) lanes.
template <typename T>
struct Native;
template <>
struct Native<float> {
  typedef float type __attribute__((vector_size(kBytes)));
};
template <>
struct Native<double> {
  typedef double type __attribute__((vector_size(kBytes)));
};
template <>
struct Native<int32_t> {
  typedef int32_t type __attribute__((vector_size(kBytes)));
};

template <typename T>
struct Vec;

using FVec = Vec<float>;
using DVec = Vec<double>;
using IVec = Vec<int32_t>;

// A vector of kBytes / sizeof(T) lanes: float, double or int32_t.
template <typename T>
struct Vec {
  using value_type = T;
  using native = typename Native<T>::type;
  static constexpr int size() { return kBytes / sizeof(T); }

  native v;

  Vec() = default;
  inline explicit Vec(native x) : v(x) {}
  // Every lane x, by the set's broadcast (no arithmetic: -0.0 stays -0.0).
  inline explicit Vec(T x) : v(splat(x)) {}

  inline static Vec loadu(const T* p) {
    Vec r;
    std::memcpy(&r.v, p, sizeof(native));
    return r;
  }
  inline void store(T* p) const { std::memcpy(p, &v, sizeof(native)); }

 private:
  inline static native splat(T x) {
#if defined(MIXPREC_SIMD_AVX512)
    if constexpr (std::is_same_v<T, float>) {
      return _mm512_set1_ps(x);
    } else if constexpr (std::is_same_v<T, double>) {
      return _mm512_set1_pd(x);
    } else {
      return (native)_mm512_set1_epi32(x);
    }
#elif defined(MIXPREC_SIMD_AVX2)
    if constexpr (std::is_same_v<T, float>) {
      return _mm256_set1_ps(x);
    } else if constexpr (std::is_same_v<T, double>) {
      return _mm256_set1_pd(x);
    } else {
      return (native)_mm256_set1_epi32(x);
    }
#else
    return splat_lanes(x, std::make_index_sequence<size()>{});
#endif
  }
  // The portable broadcast: one braced initializer of all lanes (what the
  // x86 sets' set1 intrinsics are in GCC and Clang).
  template <size_t... I>
  inline static native splat_lanes(T x, std::index_sequence<I...>) {
    return native{((void)I, x)...};
  }
};

// Lane-wise arithmetic (IEEE, one rounding each) and integer bit operations.
template <typename T>
inline Vec<T> operator+(const Vec<T>& a, const Vec<T>& b) {
  return Vec<T>(a.v + b.v);
}
template <typename T>
inline Vec<T> operator-(const Vec<T>& a, const Vec<T>& b) {
  return Vec<T>(a.v - b.v);
}
template <typename T>
inline Vec<T> operator*(const Vec<T>& a, const Vec<T>& b) {
  return Vec<T>(a.v * b.v);
}
template <typename T>
inline Vec<T> operator/(const Vec<T>& a, const Vec<T>& b) {
  return Vec<T>(a.v / b.v);
}
inline IVec operator&(const IVec& a, const IVec& b) { return IVec(a.v & b.v); }
// Arithmetic shift of each lane by the matching lane of `s`.
inline IVec operator>>(const IVec& a, const IVec& s) {
  return IVec(a.v >> s.v);
}

// Comparisons of float or int32 lanes: an int32 mask, -1 where true, else 0.
// != is true for NaN lanes, the others false.
#define MIXPREC_SIMD_COMPARE(op)                          \
  inline IVec operator op(const FVec& a, const FVec& b) { \
    return IVec(a.v op b.v);                              \
  }                                                       \
  inline IVec operator op(const IVec& a, const IVec& b) { \
    return IVec(a.v op b.v);                              \
  }
MIXPREC_SIMD_COMPARE(<)
MIXPREC_SIMD_COMPARE(>)
MIXPREC_SIMD_COMPARE(==)
MIXPREC_SIMD_COMPARE(!=)
#undef MIXPREC_SIMD_COMPARE

// The lanes of `yes` where `mask` (-1 or 0 per lane) is set, else of `no`.
inline IVec select(const IVec& mask, const IVec& yes, const IVec& no) {
  return IVec(mask.v ? yes.v : no.v);
}

// The bits of `x` read as another vector type of the same size.
template <typename To, typename From>
inline To bit_cast(const From& x) {
  static_assert(sizeof(typename To::native) == sizeof(typename From::native));
  return To((typename To::native)x.v);
}

// |x|: the sign bit cleared (NaN payloads kept).
template <typename T>
inline Vec<T> abs(const Vec<T>& x) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef I bits __attribute__((vector_size(kBytes)));
  constexpr I kMagnitude = ~(I(1) << (8 * sizeof(T) - 1));
  return Vec<T>((typename Vec<T>::native)((bits)x.v & kMagnitude));
}

// Runs f on each lane of the portable set's vectors.
template <typename T, typename F>
inline Vec<T> lanewise(const Vec<T>& a, const Vec<T>& b, F f) {
  Vec<T> r;
  for (int k = 0; k < Vec<T>::size(); ++k) {
    r.v[k] = f(a.v[k], b.v[k]);
  }
  return r;
}

template <typename T>
inline Vec<T> sqrt(const Vec<T>& x) {
#if defined(MIXPREC_SIMD_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    return Vec<T>(_mm512_sqrt_ps(x.v));
  } else {
    return Vec<T>(_mm512_sqrt_pd(x.v));
  }
#elif defined(MIXPREC_SIMD_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    return Vec<T>(_mm256_sqrt_ps(x.v));
  } else {
    return Vec<T>(_mm256_sqrt_pd(x.v));
  }
#else
  return lanewise(x, x, [](T a, T) { return std::sqrt(a); });
#endif
}

// IEEE maximum / minimum that propagates NaN. For float and double lanes of
// the x86 sets a NaN result is all ones (the max instruction OR'ed with the
// unordered mask); in the portable set it is a's NaN, else b's. For int32
// lanes, the plain max / min.
template <typename T>
inline Vec<T> maximum(const Vec<T>& a, const Vec<T>& b) {
  if constexpr (std::is_same_v<T, int32_t>) {
    return Vec<T>(a.v > b.v ? a.v : b.v);
  } else {
#if defined(MIXPREC_SIMD_AVX512)
    if constexpr (std::is_same_v<T, float>) {
      const __mmask16 nan = _mm512_cmp_ps_mask(a.v, b.v, _CMP_UNORD_Q);
      return Vec<T>(
          _mm512_or_ps(_mm512_max_ps(a.v, b.v),
                       _mm512_castsi512_ps(_mm512_maskz_set1_epi32(nan, -1))));
    } else {
      const __mmask8 nan = _mm512_cmp_pd_mask(a.v, b.v, _CMP_UNORD_Q);
      return Vec<T>(
          _mm512_or_pd(_mm512_max_pd(a.v, b.v),
                       _mm512_castsi512_pd(_mm512_maskz_set1_epi64(nan, -1))));
    }
#elif defined(MIXPREC_SIMD_AVX2)
    if constexpr (std::is_same_v<T, float>) {
      return Vec<T>(_mm256_or_ps(_mm256_max_ps(a.v, b.v),
                                 _mm256_cmp_ps(a.v, b.v, _CMP_UNORD_Q)));
    } else {
      return Vec<T>(_mm256_or_pd(_mm256_max_pd(a.v, b.v),
                                 _mm256_cmp_pd(a.v, b.v, _CMP_UNORD_Q)));
    }
#else
    const typename Vec<T>::native m = a.v > b.v ? a.v : b.v;
    return Vec<T>(a.v != a.v ? a.v : m);
#endif
  }
}

inline IVec minimum(const IVec& a, const IVec& b) {
  return IVec(a.v < b.v ? a.v : b.v);
}

// x^p per lane, with std::pow: SLEEF's vector pow is torch's own, not part
// of its stable surface (the p-norms of p other than 1, 2 and inf are the only
// users, and match torch's to within an ulp per element, not bit for bit).
template <typename T>
inline Vec<T> pow(const Vec<T>& x, const Vec<T>& p) {
  return lanewise(x, p, [](T a, T b) { return std::pow(a, b); });
}

// base[idx] per lane.
inline FVec gather(const float* base, const IVec& idx) {
#if defined(MIXPREC_SIMD_AVX512)
  return FVec(_mm512_i32gather_ps((__m512i)idx.v, base, 4));
#elif defined(MIXPREC_SIMD_AVX2)
  return FVec(_mm256_i32gather_ps(base, (__m256i)idx.v, 4));
#else
  FVec r;
  for (int k = 0; k < FVec::size(); ++k) {
    r.v[k] = base[idx.v[k]];
  }
  return r;
#endif
}

// IVec::size() bytes, zero-extended to int32 lanes.
inline IVec load_u8(const uint8_t* p) {
#if defined(MIXPREC_SIMD_AVX512)
  return IVec((IVec::native)_mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(MIXPREC_SIMD_AVX2)
  return IVec((IVec::native)_mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  IVec r;
  for (int k = 0; k < IVec::size(); ++k) {
    r.v[k] = p[k];
  }
  return r;
#endif
}

// Stores int32 lanes in [0, 255] as IVec::size() bytes.
inline void store_u8(uint8_t* p, const IVec& c) {
#if defined(MIXPREC_SIMD_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm512_cvtepi32_epi8((__m512i)c.v));
#elif defined(MIXPREC_SIMD_AVX2)
  const __m256i v = (__m256i)c.v;
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v),
                                     _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
#else
  for (int k = 0; k < IVec::size(); ++k) {
    p[k] = static_cast<uint8_t>(c.v[k]);
  }
#endif
}

// ---------------------------------------------------------------------------
// fp16 and bf16 <-> float.

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// fp16 -> float, exact; a NaN keeps its payload, quieted.
inline float to_float(fp16 h) {
#if defined(MIXPREC_SIMD_AVX2) || defined(MIXPREC_SIMD_AVX512)
  return _cvtsh_ss(h.bits);
#else
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) {  // inf, NaN
    return bits_float(sign | 0x7f800000u | (man << 13) |
                      (man != 0 ? 0x00400000u : 0u));
  }
  if (exp == 0) {  // zero, subnormal: man * 2^-24, exact in float
    return bits_float(sign | float_bits(static_cast<float>(man) * 0x1p-24f));
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

// float -> fp16, rounded to nearest even; overflow gives inf. A NaN becomes
// the quiet NaN 0x7e00 with x's sign in the portable set and keeps the top
// of its payload, quieted, under F16C.
inline fp16 to_fp16(float x) {
#if defined(MIXPREC_SIMD_AVX2) || defined(MIXPREC_SIMD_AVX512)
  return fp16{static_cast<uint16_t>(
      _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
#else
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) {
    return fp16{static_cast<uint16_t>(sign | 0x7e00u)};
  }
  if (mag >= 0x477ff000u) {  // >= 65520: rounds to inf
    return fp16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal (or zero) fp16
    // Adding 0.5 leaves 2^-24 as the last place of the sum, so the float
    // addition rounds |x| to the fp16 grid (to nearest even), and the low
    // bits of the sum are the fp16 mantissa (0x400: rounded up to normal).
    const float sum = bits_float(mag) + 0.5f;
    return fp16{static_cast<uint16_t>(sign | (float_bits(sum) - 0x3f000000u))};
  }
  // A normal fp16: rebias the exponent (127 -> 15), round off 13 bits to
  // nearest even; a carry out of the mantissa steps the exponent up.
  const uint32_t r = mag - 0x38000000u;
  const uint32_t h = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  return fp16{static_cast<uint16_t>(sign | h)};
#endif
}

// bf16 -> float, exact.
inline float to_float(bf16 b) {
  return bits_float(static_cast<uint32_t>(b.bits) << 16);
}

// float -> bf16, rounded to nearest even; a NaN becomes 0x7fc0.
inline bf16 to_bf16(float x) {
  if (x != x) {
    return bf16{0x7fc0};
  }
  const uint32_t u = float_bits(x);
  return bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// The storage <-> opmath conversions of the kernels' scalar code.
inline float widen(fp16 x) { return to_float(x); }
inline float widen(bf16 x) { return to_float(x); }
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }

template <typename T>
inline T narrow(opmath_t<T> x) {
  if constexpr (std::is_same_v<T, fp16>) {
    return to_fp16(x);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(x);
  } else {
    return x;
  }
}

// 2 * FVec::size() values at p as two float vectors, and back.
inline void load2(const float* p, FVec& a, FVec& b) {
  a = FVec::loadu(p);
  b = FVec::loadu(p + FVec::size());
}

inline void store2(float* p, const FVec& a, const FVec& b) {
  a.store(p);
  b.store(p + FVec::size());
}

inline void load2(const bf16* p, FVec& a, FVec& b) {
#if defined(MIXPREC_SIMD_AVX512)
  const auto widen = [](const bf16* q) {
    return FVec((FVec::native)_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
        16));
  };
#elif defined(MIXPREC_SIMD_AVX2)
  const auto widen = [](const bf16* q) {
    return FVec((FVec::native)_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
        16));
  };
#else
  const auto widen = [](const bf16* q) {
    typedef uint16_t half_vec __attribute__((vector_size(kBytes / 2)));
    typedef uint32_t word_vec __attribute__((vector_size(kBytes)));
    half_vec h;
    std::memcpy(&h, q, sizeof(h));
    return FVec((FVec::native)(__builtin_convertvector(h, word_vec) << 16));
  };
#endif
  a = widen(p);
  b = widen(p + FVec::size());
}

// The bf16 bits of each lane of x, rounded to nearest even as to_bf16, in
// the low half of an int32 lane; a NaN lane becomes 0xffff in the x86 sets
// (at::vec's vector rounding) and 0x7fc0 in the portable set.
inline IVec bf16_round_bits(const FVec& x) {
#if defined(MIXPREC_SIMD_AVX2) || defined(MIXPREC_SIMD_AVX512)
  constexpr int32_t kNaN = 0xffff;
#else
  constexpr int32_t kNaN = 0x7fc0;
#endif
  typedef uint32_t word_vec __attribute__((vector_size(kBytes)));
  const word_vec u = (word_vec)x.v;
  const word_vec r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
#if defined(MIXPREC_SIMD_AVX2) && !defined(MIXPREC_SIMD_AVX512)
  // r <= 0xffff: or-ing 0xffff into the NaN lanes is the select (a blend on
  // AVX2; AVX-512's masked shift is shorter)
  return IVec((IVec::native)r | ((x != x).v & kNaN));
#else
  return select(x != x, IVec(kNaN), IVec((IVec::native)r));
#endif
}

// Stores two vectors of bf16 bits (int32 lanes in [0, 0xffff]) as
// 2 * IVec::size() bf16 values.
inline void store2_bits(bf16* p, const IVec& lo, const IVec& hi) {
#if defined(MIXPREC_SIMD_AVX512)
  // packus interleaves the 128-bit lanes of lo and hi; the permute restores
  // their order.
  const __m512i packed = _mm512_packus_epi32((__m512i)lo.v, (__m512i)hi.v);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi64(
                             _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), packed));
#elif defined(MIXPREC_SIMD_AVX2)
  const __m256i packed = _mm256_packus_epi32((__m256i)lo.v, (__m256i)hi.v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_permute4x64_epi64(packed, 0xd8));
#else
  typedef uint16_t half_vec __attribute__((vector_size(kBytes / 2)));
  const half_vec l = __builtin_convertvector(lo.v, half_vec);
  const half_vec h = __builtin_convertvector(hi.v, half_vec);
  std::memcpy(p, &l, sizeof(l));
  std::memcpy(p + FVec::size(), &h, sizeof(h));
#endif
}

// Rounded to nearest even (bf16_round_bits).
inline void store2(bf16* p, const FVec& a, const FVec& b) {
  store2_bits(p, bf16_round_bits(a), bf16_round_bits(b));
}

inline void load2(const fp16* p, FVec& a, FVec& b) {
#if defined(MIXPREC_SIMD_AVX512)
  a = FVec(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  b = FVec(_mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))));
#elif defined(MIXPREC_SIMD_AVX2)
  a = FVec(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  b = FVec(_mm256_cvtph_ps(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
#else
  for (int k = 0; k < FVec::size(); ++k) {
    a.v[k] = to_float(p[k]);
    b.v[k] = to_float(p[FVec::size() + k]);
  }
#endif
}

inline void store2(fp16* p, const FVec& a, const FVec& b) {
#if defined(MIXPREC_SIMD_AVX2) || defined(MIXPREC_SIMD_AVX512)
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if defined(MIXPREC_SIMD_AVX512)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(a.v, kRound));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16),
                      _mm512_cvtps_ph(b.v, kRound));
#elif defined(MIXPREC_SIMD_AVX2)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.v, kRound));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8),
                   _mm256_cvtps_ph(b.v, kRound));
#else
  for (int k = 0; k < FVec::size(); ++k) {
    p[k] = to_fp16(a.v[k]);
    p[FVec::size() + k] = to_fp16(b.v[k]);
  }
#endif
}

}  // namespace MIXPREC_SIMD_ISA
}  // namespace simd
}  // namespace mixprec
