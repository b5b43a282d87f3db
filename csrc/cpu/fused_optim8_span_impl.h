// The vectorized element loops of fused_adam8_ and fused_sgd8_ on CPU: per
// block of q8::kBlock elements, read the codes back to float32 (a gather from
// the code table), run the element update of fused_optim_span_impl.h, write
// the param (and master) at once, keep the new moments in a block-sized
// buffer with their absmax, then write the codes of the new moments
// (common/quant8_math.h's rounding, vectorized: bucket gather, one midpoint
// comparison, the nonzero rule) and the new absmax. A scalar tail runs the
// same math on the last elements of a block.
//
// Included by span_kernels_isa.h after fused_optim_span_impl.h, inside its
// MIXPREC_SPAN_NS.
#ifndef MIXPREC_SPAN_NS
#error "define MIXPREC_SPAN_NS before including fused_optim8_span_impl.h"
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <type_traits>

#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cpu/span_kernels.h"

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

namespace mixprec {
namespace cpu {
namespace MIXPREC_SPAN_NS {

using IVec = at::vec::Vectorized<int32_t>;
static_assert(IVec::size() == FVec::size(), "int32 and float vectors differ");

// FVec::size() codes widened to int32.
inline IVec load_codes(const uint8_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return IVec(_mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(CPU_CAPABILITY_AVX2)
  return IVec(_mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  alignas(64) int32_t tmp[IVec::size()];
  for (int k = 0; k < IVec::size(); ++k) {
    tmp[k] = p[k];
  }
  return IVec::loadu(tmp);
#endif
}

// Stores FVec::size() codes (int32 lanes in [0, 255]) as bytes.
inline void store_codes(uint8_t* p, const IVec& c) {
#if defined(CPU_CAPABILITY_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(c));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i v = c;
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v),
                                     _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
#else
  alignas(64) int32_t tmp[IVec::size()];
  c.store(tmp);
  for (int k = 0; k < IVec::size(); ++k) {
    p[k] = static_cast<uint8_t>(tmp[k]);
  }
#endif
}

// out[0, n) = the values of codes[0, n) in a block of absmax `a`.
inline void decode_block(const uint8_t* codes, float a, int table, int64_t n,
                         float* out) {
  const float* values = q8::kQ8Values + table * 256;
  const FVec av(a);
  int64_t j = 0;
  // (A lookup by sixteen AVX-512 register permutes instead of the gather
  // measured the same on an AMD EPYC: 2.93 vs 3.00 ns per element.)
  for (; j + FVec::size() <= n; j += FVec::size()) {
    const FVec v =
        at::vec::gather<sizeof(float)>(values, load_codes(codes + j));
    (v * av).store(out + j);
  }
  for (; j < n; ++j) {
    out[j] = q8::decode(codes[j], a, table);
  }
}

// codes[0, n) = the codes of x[0, n) in a block of absmax `a` (>= every |x|):
// q8::encode_fraction, lane by lane.
inline void encode_block(const float* x, float a, int table, int64_t n,
                         uint8_t* codes) {
  const float* enc =
      reinterpret_cast<const float*>(q8::kQ8Encode + table * 2 * q8::kBuckets);
  const IVec base(static_cast<int32_t>(q8::kBucketBaseBits));
  const IVec shift(q8::kBucketShift);
  const IVec last(q8::kBuckets - 1);
  const IVec neg_offset(q8::kBuckets);
  const IVec abs_bits(0x7fffffff);
  const IVec low_bits(0xffff);
  const IVec code_bits(0xff);
  const IVec eight(8);
  const IVec zlo(q8::zero_lo(table) - 1);  // c > zlo <=> c >= zero_lo
  const IVec zhi(q8::zero_hi(table) + 1);  // c < zhi <=> c <= zero_hi
  const IVec zero_code(q8::zero_lo(table));
  const IVec spos(q8::small_pos(table));
  const IVec sneg(q8::small_neg(table));
  const FVec zero_f(0.0f);
  const bool nonzero_block = a > 0.0f;
  const FVec av(a);
  int64_t j = 0;
  for (; j + FVec::size() <= n; j += FVec::size()) {
    const FVec y = nonzero_block ? FVec::loadu(x + j) / av : zero_f;
    const IVec u = at::vec::maximum(at::vec::cast<int32_t>(y) & abs_bits, base);
    const IVec b = at::vec::minimum((u - base) >> shift, last);
    const IVec neg = at::vec::cast<int32_t>(y < zero_f);  // -1 or 0
    const IVec e = at::vec::cast<int32_t>(
        at::vec::gather<sizeof(float)>(enc, b + (neg & neg_offset)));
    const IVec thr = e >> eight;
    const IVec low = u & low_bits;
    const IVec up = IVec::blendv(low > thr, low < thr, neg);
    IVec c = (e & code_bits) - up;  // a true lane is -1
    const IVec on_zero =
        (c > zlo) & (c < zhi) & at::vec::cast<int32_t>(y != zero_f);
    const IVec smallest =
        IVec::blendv(sneg, spos, at::vec::cast<int32_t>(y > zero_f));
    c = IVec::blendv(c, smallest, on_zero);
    c = IVec::blendv(c, zero_code, at::vec::cast<int32_t>(y == zero_f));
    store_codes(codes + j, c);
  }
  for (; j < n; ++j) {
    codes[j] = q8::encode(x[j], a, table);
  }
}

// The NaN-propagating max of |x| over a vector accumulator and a scalar.
inline float reduce_abs_max(const FVec& acc, float scalar) {
  alignas(64) float tmp[FVec::size()];
  acc.store(tmp);
  float m = scalar;
  for (int k = 0; k < FVec::size(); ++k) {
    m = math::ScalarOps::maximum(m, tmp[k]);
  }
  return m;
}

template <typename P, typename G, bool kMaster>
void adam8_span(P* p, const G* g, const CodedSpan& mc, const CodedSpan& vc,
                float* master, int64_t n, const AdamSpanArgs& a) {
  alignas(64) float mq[q8::kBlock];
  alignas(64) float vq[q8::kBlock];
  for (int64_t off = 0, blk = 0; off < n; off += q8::kBlock, ++blk) {
    const int64_t len = n - off < q8::kBlock ? n - off : q8::kBlock;
    decode_block(mc.codes + off, mc.absmax[blk], q8::kSigned, len, mq);
    decode_block(vc.codes + off, vc.absmax[blk], q8::kUnsigned, len, vq);
    P* pb = p + off;
    const G* gb = g + off;
    float* mb = kMaster ? master + off : nullptr;
    const uint32_t index_base = a.index_base + static_cast<uint32_t>(off);
    FVec am(0.0f), av(0.0f);
    int64_t i = 0;
    for (; i + kStep <= len; i += kStep) {
      FVec w0, w1, g0, g1, m0, m1, v0, v1, x0, x1;
      if constexpr (kMaster) {
        load2(mb + i, w0, w1);
      } else {
        load2(pb + i, w0, w1);
      }
      load2(gb + i, g0, g1);
      load2(mq + i, m0, m1);
      load2(vq + i, v0, v1);
      g0 = math::prepare_grad(g0, a.gc);
      g1 = math::prepare_grad(g1, a.gc);
      math::adam_update<false, VecOps>(w0, g0, m0, v0, x0, a.k, a.s);
      math::adam_update<false, VecOps>(w1, g1, m1, v1, x1, a.k, a.s);
      store2(mq + i, m0, m1);
      store2(vq + i, v0, v1);
      am = at::vec::maximum(am, at::vec::maximum(m0.abs(), m1.abs()));
      av = at::vec::maximum(av, at::vec::maximum(v0.abs(), v1.abs()));
      store_param(pb, mb, i, w0, w1, a.sr, a.key, index_base);
    }
    float am_s = 0.0f, av_s = 0.0f;
    for (; i < len; ++i) {
      float w = kMaster ? mb[i] : static_cast<float>(pb[i]);
      const float gi = math::prepare_grad(static_cast<float>(gb[i]), a.gc);
      float xi = 0.0f;
      math::adam_update<false, math::ScalarOps>(w, gi, mq[i], vq[i], xi, a.k,
                                                a.s);
      am_s = q8::abs_max(am_s, mq[i]);
      av_s = q8::abs_max(av_s, vq[i]);
      store_param_scalar(pb, mb, i, w, a.sr, a.key, index_base);
    }
    const float new_am = reduce_abs_max(am, am_s);
    const float new_av = reduce_abs_max(av, av_s);
    encode_block(mq, new_am, q8::kSigned, len, mc.codes + off);
    encode_block(vq, new_av, q8::kUnsigned, len, vc.codes + off);
    mc.absmax[blk] = new_am;
    vc.absmax[blk] = new_av;
  }
}

template <typename P, typename G, bool kMaster>
void sgd8_span(P* p, const G* g, const CodedSpan& bc, float* master, int64_t n,
               const SgdSpanArgs& a) {
  alignas(64) float bq[q8::kBlock];
  for (int64_t off = 0, blk = 0; off < n; off += q8::kBlock, ++blk) {
    const int64_t len = n - off < q8::kBlock ? n - off : q8::kBlock;
    if (!a.first) {
      decode_block(bc.codes + off, bc.absmax[blk], q8::kSigned, len, bq);
    }
    P* pb = p + off;
    const G* gb = g + off;
    float* mb = kMaster ? master + off : nullptr;
    const uint32_t index_base = a.index_base + static_cast<uint32_t>(off);
    FVec ab(0.0f);
    int64_t i = 0;
    for (; i + kStep <= len; i += kStep) {
      FVec w0, w1, g0, g1, b0, b1;
      if constexpr (kMaster) {
        load2(mb + i, w0, w1);
      } else {
        load2(pb + i, w0, w1);
      }
      load2(gb + i, g0, g1);
      if (!a.first) {
        load2(bq + i, b0, b1);
      }
      g0 = math::prepare_grad(g0, a.gc);
      g1 = math::prepare_grad(g1, a.gc);
      math::sgd_update(w0, g0, b0, a.k, a.first, a.neg_lr);
      math::sgd_update(w1, g1, b1, a.k, a.first, a.neg_lr);
      store2(bq + i, b0, b1);
      ab = at::vec::maximum(ab, at::vec::maximum(b0.abs(), b1.abs()));
      store_param(pb, mb, i, w0, w1, a.sr, a.key, index_base);
    }
    float ab_s = 0.0f;
    for (; i < len; ++i) {
      float w = kMaster ? mb[i] : static_cast<float>(pb[i]);
      const float gi = math::prepare_grad(static_cast<float>(gb[i]), a.gc);
      float bi = a.first ? 0.0f : bq[i];
      math::sgd_update(w, gi, bi, a.k, a.first, a.neg_lr);
      bq[i] = bi;
      ab_s = q8::abs_max(ab_s, bi);
      store_param_scalar(pb, mb, i, w, a.sr, a.key, index_base);
    }
    const float new_ab = reduce_abs_max(ab, ab_s);
    encode_block(bq, new_ab, q8::kSigned, len, bc.codes + off);
    bc.absmax[blk] = new_ab;
  }
}

inline void adam8(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                  const CodedSpan& m, const CodedSpan& v, float* master,
                  int64_t n, const AdamSpanArgs& a) {
  dispatch2(pd, gd, [&](auto* ptag, auto* gtag) {
    using PT = std::remove_pointer_t<decltype(ptag)>;
    using GT = std::remove_pointer_t<decltype(gtag)>;
    PT* pp = static_cast<PT*>(p);
    const GT* gp = static_cast<const GT*>(g);
    if constexpr (std::is_same_v<PT, float>) {
      adam8_span<PT, GT, false>(pp, gp, m, v, nullptr, n, a);
    } else if (master != nullptr) {
      adam8_span<PT, GT, true>(pp, gp, m, v, master, n, a);
    } else {
      adam8_span<PT, GT, false>(pp, gp, m, v, nullptr, n, a);
    }
  });
}

inline void sgd8(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                 const CodedSpan& buf, float* master, int64_t n,
                 const SgdSpanArgs& a) {
  dispatch2(pd, gd, [&](auto* ptag, auto* gtag) {
    using PT = std::remove_pointer_t<decltype(ptag)>;
    using GT = std::remove_pointer_t<decltype(gtag)>;
    PT* pp = static_cast<PT*>(p);
    const GT* gp = static_cast<const GT*>(g);
    if constexpr (std::is_same_v<PT, float>) {
      sgd8_span<PT, GT, false>(pp, gp, buf, nullptr, n, a);
    } else if (master != nullptr) {
      sgd8_span<PT, GT, true>(pp, gp, buf, master, n, a);
    } else {
      sgd8_span<PT, GT, false>(pp, gp, buf, nullptr, n, a);
    }
  });
}

}  // namespace MIXPREC_SPAN_NS
}  // namespace cpu
}  // namespace mixprec
