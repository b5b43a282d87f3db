// The vectorized element loops of fused_adam8_ and fused_sgd8_ on CPU: per
// block of q8::kBlock elements, read the codes back to float32 into a
// block-sized buffer (a gather from the code table), run the 32-bit element
// loop of fused_optim_span_impl.h on it (which writes the param and master),
// take the new absmax, then write the codes of the new moments
// (common/quant8_math.h's rounding, vectorized: a gather from the folded
// table, one comparison, one select) and the new absmax.
//
// Included by span_kernels_isa.h after fused_optim_span_impl.h, inside its
// MIXPREC_SPAN_NS.
#ifndef MIXPREC_SPAN_NS
#error "define MIXPREC_SPAN_NS before including fused_optim8_span_impl.h"
#endif

#include <cstdint>

#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cpu/simd.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace MIXPREC_SPAN_NS {

using simd::IVec;
static_assert(IVec::size() == FVec::size(), "int32 and float vectors differ");

// Runs fn(const In*, Out*) on FVec::size() lanes over in[0, n) -> out[0, n):
// whole vectors in place, the last n % FVec::size() on a zero-padded copy.
template <typename In, typename Out, typename Fn>
C10_ALWAYS_INLINE void map_lanes(const In* in, Out* out, int64_t n, Fn&& fn) {
  int64_t j = 0;
  for (; j + FVec::size() <= n; j += FVec::size()) {
    fn(in + j, out + j);
  }
  if (j < n) {
    alignas(64) In pad[FVec::size()] = {};
    alignas(64) Out res[FVec::size()];
    copy_n(pad, in + j, n - j);
    fn(pad, res);
    copy_n(out + j, res, n - j);
  }
}

// out[0, n) = the values of codes[0, n) in a block of absmax `a`.
C10_ALWAYS_INLINE void decode_block(const uint8_t* codes, float a, int table,
                                    int64_t n, float* out) {
  const float* values = q8::kQ8Values + table * 256;
  const FVec av(a);
  const auto decode = [&](const uint8_t* c, float* o) {
    // (A lookup by sixteen AVX-512 register permutes instead of the gather
    // measured the same on an AMD EPYC: 2.93 vs 3.00 ns per element.)
    const FVec v = simd::gather(values, simd::load_u8(c));
    (v * av).store(o);
  };
  map_lanes(codes, out, n, decode);
}

// codes[0, n) = the codes of x[0, n) in a block of absmax `a` (>= every |x|):
// q8::encode_fraction, lane by lane (bucket gather from the folded table, one
// comparison, one select, zero).
C10_ALWAYS_INLINE void encode_block(const float* x, float a, int table,
                                    int64_t n, uint8_t* codes) {
  const float* enc = reinterpret_cast<const float*>(q8::kQ8EncodeFolded +
                                                    table * 2 * q8::kBuckets);
  const IVec base(static_cast<int32_t>(q8::kBucketBaseBits));
  const IVec shift(q8::kBucketShift);
  const IVec last(q8::kBuckets - 1);
  const IVec neg_offset(q8::kBuckets);
  const IVec abs_bits(0x7fffffff);
  const IVec low_bits(0xffff);
  const IVec code_bits(0xff);
  const IVec at_most(16);  // the code when u's low bits <= the threshold
  const IVec above(24);    // the code when they are above it
  const IVec zero_code(q8::zero_lo(table));
  const FVec zero_f(0.0f);
  const bool nonzero_block = a > 0.0f;
  const FVec av(a);
  const auto encode = [&](const float* xs, uint8_t* out) {
    const FVec y = nonzero_block ? FVec::loadu(xs) / av : zero_f;
    const IVec u = simd::maximum(simd::bit_cast<IVec>(y) & abs_bits, base);
    const IVec b = simd::minimum((u - base) >> shift, last);
    const IVec neg = y < zero_f;  // -1 or 0
    const IVec e =
        simd::bit_cast<IVec>(simd::gather(enc, b + (neg & neg_offset)));
    const IVec up = (u & low_bits) > (e & low_bits);
    IVec c = simd::select(up, e >> above, e >> at_most) & code_bits;
    c = simd::select(y == zero_f, zero_code, c);
    simd::store_u8(out, c);
  };
  map_lanes(x, codes, n, encode);
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

// The running NaN-propagating |max| of each state a block's element loop
// writes (the Seen of adam_span and sgd_span), from which the block's new
// absmaxes come.
struct StateMax {
  FVec vec[2];
  float scalar[2];
  // User-provided, so that it is compiled for this file's ISA (an implicit
  // constructor gets no target pragma and could not inline the broadcast).
  StateMax() : vec{FVec(0.0f), FVec(0.0f)}, scalar{0.0f, 0.0f} {}
  void see(int k, const FVec& a, const FVec& b) {
    vec[k] = simd::maximum(vec[k], simd::maximum(simd::abs(a), simd::abs(b)));
  }
  void see(int k, float x) { scalar[k] = q8::abs_max(scalar[k], x); }
  float absmax(int k) const { return reduce_abs_max(vec[k], scalar[k]); }
};

// The length of the block at column `col` of a row of `row` elements.
inline int64_t coded_block_length(int64_t row, int64_t col) {
  return row - col < q8::kBlock ? row - col : q8::kBlock;
}

// One 8-bit block of Adam: `len` elements (kLen when nonzero: a whole block,
// whose loops then have a fixed trip count), its codes at m_codes/v_codes and
// absmaxes *m_max/*v_max, decoded into mq/vq, stepped, and encoded back.
template <typename P, typename G, typename M, int64_t kLen>
C10_ALWAYS_INLINE void adam8_block(P* p, const G* g, uint8_t* m_codes,
                                   uint8_t* v_codes, float* m_max, float* v_max,
                                   M* master, int64_t len,
                                   const AdamSpanArgs& a, float* mq,
                                   float* vq) {
  const int64_t n = kLen > 0 ? kLen : len;
  decode_block(m_codes, *m_max, q8::kSigned, n, mq);
  decode_block(v_codes, *v_max, q8::kUnsigned, n, vq);
  StateMax seen;
  adam_span<P, G, M, false>(p, g, mq, vq, nullptr, master, n, a, seen);
  *m_max = seen.absmax(0);
  *v_max = seen.absmax(1);
  encode_block(mq, *m_max, q8::kSigned, n, m_codes);
  encode_block(vq, *v_max, q8::kUnsigned, n, v_codes);
}

// One 8-bit block of SGD with momentum, as adam8_block.
template <typename P, typename G, typename M, int64_t kLen>
C10_ALWAYS_INLINE void sgd8_block(P* p, const G* g, uint8_t* codes,
                                  float* absmax, M* master, int64_t len,
                                  const SgdSpanArgs& a, float* bq) {
  const int64_t n = kLen > 0 ? kLen : len;
  if (!a.first) {
    decode_block(codes, *absmax, q8::kSigned, n, bq);
  }
  StateMax seen;
  sgd_span<P, G, M, true>(p, g, bq, master, n, a, seen);
  *absmax = seen.absmax(0);
  encode_block(bq, *absmax, q8::kSigned, n, codes);
}

// The 8-bit spans run the 32-bit element loops of fused_optim_span_impl.h
// on one state block at a time, its moments read back into block buffers. A
// span starts at a block and ends at one; the blocks run row by row
// (CodedSpan), so a block holds q8::kBlock elements or the rest of its row.
template <typename P, typename G, typename M>
void adam8_span(P* p, const G* g, const CodedSpan& mc, const CodedSpan& vc,
                M* master, int64_t n, const AdamSpanArgs& a) {
  alignas(64) float mq[q8::kBlock];
  alignas(64) float vq[q8::kBlock];
  const int64_t row = mc.row;
  AdamSpanArgs ab = a;
  int64_t col = mc.col;
  for (int64_t off = 0, blk = 0; off < n; ++blk) {
    const int64_t len = coded_block_length(row, col);
    ab.index_base = a.index_base + static_cast<uint32_t>(off);
    M* const w = master_at(master, off);
    if (len == q8::kBlock) {
      adam8_block<P, G, M, q8::kBlock>(p + off, g + off, mc.codes + off,
                                       vc.codes + off, mc.absmax + blk,
                                       vc.absmax + blk, w, len, ab, mq, vq);
    } else {
      adam8_block<P, G, M, 0>(p + off, g + off, mc.codes + off, vc.codes + off,
                              mc.absmax + blk, vc.absmax + blk, w, len, ab, mq,
                              vq);
    }
    off += len;
    col = col + len == row ? 0 : col + len;
  }
}

template <typename P, typename G, typename M>
void sgd8_span(P* p, const G* g, const CodedSpan& bc, M* master, int64_t n,
               const SgdSpanArgs& a) {
  alignas(64) float bq[q8::kBlock];
  const int64_t row = bc.row;
  SgdSpanArgs ab = a;
  int64_t col = bc.col;
  for (int64_t off = 0, blk = 0; off < n; ++blk) {
    const int64_t len = coded_block_length(row, col);
    ab.index_base = a.index_base + static_cast<uint32_t>(off);
    M* const w = master_at(master, off);
    if (len == q8::kBlock) {
      sgd8_block<P, G, M, q8::kBlock>(p + off, g + off, bc.codes + off,
                                      bc.absmax + blk, w, len, ab, bq);
    } else {
      sgd8_block<P, G, M, 0>(p + off, g + off, bc.codes + off, bc.absmax + blk,
                             w, len, ab, bq);
    }
    off += len;
    col = col + len == row ? 0 : col + len;
  }
}

inline void adam8(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                  const CodedSpan& m, const CodedSpan& v,
                  const MasterSpan& master, int64_t n, const AdamSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto* mp) {
    adam8_span<Elem<decltype(pp)>, Elem<decltype(gp)>, Elem<decltype(mp)>>(
        pp, gp, m, v, mp, n, a);
  });
}

inline void sgd8(SpanDtype pd, SpanDtype gd, void* p, const void* g,
                 const CodedSpan& buf, const MasterSpan& master, int64_t n,
                 const SgdSpanArgs& a) {
  dispatch_span(pd, gd, p, g, master, [&](auto* pp, auto* gp, auto* mp) {
    sgd8_span<Elem<decltype(pp)>, Elem<decltype(gp)>, Elem<decltype(mp)>>(
        pp, gp, buf, mp, n, a);
  });
}

}  // namespace MIXPREC_SPAN_NS
}  // namespace cpu
}  // namespace mixprec
