// Element math of the block-wise 8-bit optimizer state (fused_adam8_,
// fused_sgd8_), shared by the CPU kernels, the CUDA kernels and their host
// emulation. No ATen types.
//
// The format is python/mixprec/optim/_quant8.py's, which is the reference: a
// state tensor is cut into rows (numel / size(0) elements for two or more
// dims; a tensor of fewer dims is one row), each row, in element order, into
// blocks of kBlock = 256 (the last block of a row holds the rest: a block
// never spans two rows, so no sharding by rows cuts one; RowBlocks); a block
// keeps one float32 absmax A and one code per element. Reading back:
// value(table, code) * A. Writing: the code of y = x / A (IEEE division; y = 0
// when A = 0) is the number of table midpoints below y (ties take the lower
// entry), except that a nonzero y that lands on a zero entry takes the
// smallest entry of its sign. encode() computes that without a search: one
// read of the folded encoding table by the sign and the bucket of |y|'s
// float32 bits gives the low bits of the one midpoint that may lie in the
// bucket and the code on either side of it, the nonzero rule applied; one
// integer comparison picks the code (tools/gen_quant8_tables.py explains and
// checks the table; tools/quant8_fold_check.cpp proves the folded form equal
// to the unfolded one for every float32).
//
// The tables live in common/quant8_tables.h (generated). Host code reads the
// constexpr arrays, device code by default copies in device global memory;
// the 8-bit CUDA optimizers read a copy their CUDA block staged in shared
// memory (SharedTables), through the same functions (Tables: where to read).
#pragma once

#include <torch/headeronly/macros/Macros.h>

#include <cstdint>

#include "common/optim_math.h"
#include "common/quant8_tables.h"

namespace mixprec {
namespace q8 {

constexpr int kBlock = 256;  // elements per absmax (at most: see RowBlocks)

// The blocks of a state tensor of `row` elements per row (> 0), numbered row
// by row: block k is the (k % per_row)-th of row k / per_row.
struct RowBlocks {
  int64_t row;      // elements per row
  int64_t per_row;  // blocks per row

  C10_HOST_DEVICE explicit RowBlocks(int64_t row_elements)
      : row(row_elements), per_row((row_elements + kBlock - 1) / kBlock) {}
  // The first element of block k.
  C10_HOST_DEVICE int64_t start(int64_t k) const {
    return (k / per_row) * row + (k % per_row) * kBlock;
  }
  // The elements of block k (kBlock, or the rest of its row).
  C10_HOST_DEVICE int64_t length(int64_t k) const {
    const int64_t rest = row - (k % per_row) * kBlock;
    return rest < kBlock ? rest : kBlock;
  }
  // The block that starts at element e (a block start).
  C10_HOST_DEVICE int64_t block_at(int64_t e) const {
    return (e / row) * per_row + (e % row) / kBlock;
  }
};

// Elements per row of a tensor with `dim` sizes `sizes` (host): the product
// of sizes[1:] for two or more dims, of all sizes for fewer.
inline int64_t row_length(const int64_t* sizes, int64_t dim) {
  int64_t n = 1;
  for (int64_t d = dim >= 2 ? 1 : 0; d < dim; ++d) {
    n *= sizes[d];
  }
  return n;
}

// The sizes of the block maxima of such a tensor (host): {sizes[0], blocks
// per row} for two or more dims, {blocks} for fewer (_quant8.absmax_shape).
template <class Sizes>
Sizes absmax_sizes(const int64_t* sizes, int64_t dim) {
  const int64_t per_row = RowBlocks(row_length(sizes, dim)).per_row;
  return dim >= 2 ? Sizes{sizes[0], per_row} : Sizes{per_row};
}

// The tables: 0 for first moments and momentum (signed), 1 for second
// moments (unsigned).
enum Table : int { kSigned = 0, kUnsigned = 1 };

#define MIXPREC_Q8_HOST_ARRAY(name, type, size, ...) \
  inline constexpr type name[size] = __VA_ARGS__;
MIXPREC_Q8_ARRAYS(MIXPREC_Q8_HOST_ARRAY)
#undef MIXPREC_Q8_HOST_ARRAY

#if defined(__CUDACC__)
#define MIXPREC_Q8_DEVICE_ARRAY(name, type, size, ...) \
  static __device__ const type name##Dev[size] = __VA_ARGS__;
MIXPREC_Q8_ARRAYS(MIXPREC_Q8_DEVICE_ARRAY)
#undef MIXPREC_Q8_DEVICE_ARRAY
#define MIXPREC_Q8_READ(name, i) name##Dev[i]
#else
#define MIXPREC_Q8_READ(name, i) name[i]
#endif

// Both tables, as one CUDA block keeps them in shared memory (53,264 bytes):
// filled by stage_tables, read through Tables::of.
struct SharedTables {
  float values[sizeof(kQ8Values) / sizeof(float)];
  uint32_t folded[sizeof(kQ8EncodeFolded) / sizeof(uint32_t)];
};

// Where the functions below read the tables: the values (kQ8Values' layout)
// and the folded encoding table (kQ8EncodeFolded's).
struct Tables {
  const float* values;
  const uint32_t* folded;

  // The generated arrays: the host's, or their device global copies.
  C10_HOST_DEVICE C10_ALWAYS_INLINE static Tables global() {
#ifdef __CUDA_ARCH__
    return Tables{kQ8ValuesDev, kQ8EncodeFoldedDev};
#else
    return Tables{kQ8Values, kQ8EncodeFolded};
#endif
  }
  C10_HOST_DEVICE C10_ALWAYS_INLINE static Tables of(const SharedTables& s) {
    return Tables{s.values, s.folded};
  }
};

// Thread `thread` of `threads`' share of copying the generated arrays into
// `s` (every thread of a block runs it, then the block synchronizes).
C10_HOST_DEVICE C10_ALWAYS_INLINE void stage_tables(SharedTables& s, int thread,
                                                    int threads) {
  const Tables from = Tables::global();
  constexpr int kValues = sizeof(s.values) / sizeof(float);
  constexpr int kFolded = sizeof(s.folded) / sizeof(uint32_t);
  for (int i = thread; i < kValues; i += threads) {
    s.values[i] = from.values[i];
  }
  for (int i = thread; i < kFolded; i += threads) {
    s.folded[i] = from.folded[i];
  }
}

// The table value of `code` (a fraction of the block's absmax).
C10_HOST_DEVICE C10_ALWAYS_INLINE float value(int table, int code,
                                              const Tables& t) {
  return t.values[table * 256 + code];
}
C10_HOST_DEVICE C10_ALWAYS_INLINE float value(int table, int code) {
  return value(table, code, Tables::global());
}

// The bucket of u, the bits of |y| (see tools/gen_quant8_tables.py): u is
// clamped up to kBucketBaseBits first, and NaN or |y| > 1 take the last.
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t clamp_bits(uint32_t u) {
  return u < kBucketBaseBits ? kBucketBaseBits : u;
}
C10_HOST_DEVICE C10_ALWAYS_INLINE int bucket(uint32_t clamped) {
  const uint32_t b = (clamped - kBucketBaseBits) >> kBucketShift;
  return b < static_cast<uint32_t>(kBuckets) ? static_cast<int>(b)
                                             : kBuckets - 1;
}

// The code of y = x / A (already divided; |y| <= 1), the reference's rounding:
// one read of the folded encoding table (the bucket's threshold and its two
// codes, the nonzero rule applied; tools/gen_quant8_tables.py), one
// comparison, one select, and zero.
C10_HOST_DEVICE C10_ALWAYS_INLINE uint32_t folded_index(float y, int table,
                                                        uint32_t u) {
  return static_cast<uint32_t>((table * 2 + (y < 0.0f ? 1 : 0)) * kBuckets +
                               bucket(u));
}
// The code of a folded entry `e` for the clamped bits u.
C10_HOST_DEVICE C10_ALWAYS_INLINE int folded_code(uint32_t e, uint32_t u) {
  return static_cast<int>((u & 0xffffu) > (e & 0xffffu) ? e >> 24
                                                        : (e >> 16) & 0xffu);
}
C10_HOST_DEVICE C10_ALWAYS_INLINE int encode_fraction(float y, int table,
                                                      const Tables& t) {
  const uint32_t u = clamp_bits(math::float_bits(y) & 0x7fffffffu);
  const uint32_t e = t.folded[folded_index(y, table, u)];
  const int c = folded_code(e, u);  // (read unconditionally: no branch)
  return y == 0.0f ? zero_lo(table) : c;
}
C10_HOST_DEVICE C10_ALWAYS_INLINE int encode_fraction(float y, int table) {
  return encode_fraction(y, table, Tables::global());
}

#if !defined(__CUDA_ARCH__)
#define MIXPREC_Q8_UNFOLDED_ARRAY(name, type, size, ...) \
  inline constexpr type name[size] = __VA_ARGS__;
MIXPREC_Q8_UNFOLDED_ARRAYS(MIXPREC_Q8_UNFOLDED_ARRAY)
#undef MIXPREC_Q8_UNFOLDED_ARRAY

// encode_fraction from the unfolded table (host only): the comparison by the
// sign, then zero and the nonzero rule. The folded table is proven against it
// for every float32 (tests/project/test_quant8_fold.py).
inline int encode_fraction_unfolded(float y, int table) {
  const uint32_t u = clamp_bits(math::float_bits(y) & 0x7fffffffu);
  const bool neg = y < 0.0f;
  const int index = (table * 2 + (neg ? 1 : 0)) * kBuckets + bucket(u);
  const uint32_t e = static_cast<uint32_t>(kQ8Encode[index]);
  int c = static_cast<int>(e & 0xffu);
  const uint32_t thr = e >> 8;
  const uint32_t low = u & 0xffffu;
  if (neg ? low < thr : low > thr) {
    ++c;
  }
  if (y == 0.0f) {
    c = zero_lo(table);
  } else if (c >= zero_lo(table) && c <= zero_hi(table)) {
    c = y > 0.0f ? small_pos(table) : small_neg(table);
  }
  return c;
}
#endif

// The fraction of x in a block of absmax `a` (a >= |x|): x / a, or 0 when
// the block is all zeros.
C10_HOST_DEVICE C10_ALWAYS_INLINE float fraction(float x, float a) {
  return a > 0.0f ? x / a : 0.0f;
}

C10_HOST_DEVICE C10_ALWAYS_INLINE uint8_t encode(float x, float a, int table) {
  return static_cast<uint8_t>(encode_fraction(fraction(x, a), table));
}

C10_HOST_DEVICE C10_ALWAYS_INLINE float decode(uint8_t code, float a, int table,
                                               const Tables& t) {
  return value(table, code, t) * a;
}
C10_HOST_DEVICE C10_ALWAYS_INLINE float decode(uint8_t code, float a,
                                               int table) {
  return decode(code, a, table, Tables::global());
}

// |x|, and the NaN-propagating maximum that takes a block's absmax (the
// reference's amax; any order gives the same bits for non-NaN values).
C10_HOST_DEVICE C10_ALWAYS_INLINE float abs_max(float m, float x) {
  // (the sign bit cleared: |-0| is +0, as torch's abs)
  const float a = math::float_from_bits(math::float_bits(x) & 0x7fffffffu);
  return math::ScalarOps::maximum(m, a);
}

}  // namespace q8
}  // namespace mixprec
