// Proves the split float32 masters of common/master_math.h over every float32
// bit pattern m (both signs, +-0, subnormals, +-inf, every NaN), with P the
// kernels' own bf16 rounding of m (c10's round_to_nearest_even, which the
// CUDA emulation uses, equal to the CPU kernels' simd::to_bf16 and to their
// vector rounding off NaN):
//   16 bits: decode(P, encode(m, P)) == m except exactly where
//            d = bits(m) - (P << 16) == +0x8000 (P even and finite), decoded
//            one ulp toward P; the count of those is the number of even finite
//            P whose upper half-ulp midpoint rounds to P (counted separately);
//   8 bits:  the code is d / 256 rounded half to even and clamped (computed
//            here by division), |bits(m') - bits(m)| <= 256, and <= 128 unless
//            d >= 32640;
//   NaN m:   P is NaN, both decodes are NaN.
// and that the vector encode/decode of cpu/master_simd.h, in the ISA this file
// is compiled for (-DMIXPREC_SIMD_AVX512 / -DMIXPREC_SIMD_AVX2 with the
// matching -m flags, or neither: the portable vectors), gives the scalar
// functions' params, corrections and masters lane for lane (a NaN lane: a NaN
// param, correction 0, a NaN master). Prints what it checked and the first
// failures; exits 1 on any. The vector decode is also checked on every
// (param, correction) pair, not only the corrections the encoder writes.
// Arguments: the thread count (2) and, optionally, "vector": the vector checks
// only (the scalar ones are the same in every build). Built and run by
// tests/project/test_master_split.py.
#include <torch/headeronly/util/BFloat16.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/master_math.h"
#include "cpu/master_simd.h"

namespace {

using namespace mixprec;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

uint32_t rne(uint32_t m) {
  return torch::headeronly::detail::round_to_nearest_even(from_bits(m));
}

// d / 256 rounded half to even, clamped to int8: by division, not shifts.
int32_t code8_by_division(int32_t d) {
  int32_t q = d / 256;
  int32_t r = d % 256;
  if (r < 0) {  // floor division
    q -= 1;
    r += 256;
  }
  if (r > 128 || (r == 128 && (q & 1) != 0)) {
    q += 1;
  }
  return q < -128 ? -128 : (q > 127 ? 127 : q);
}

struct Tally {
  uint64_t checked = 0, exact16 = 0, exceptions16 = 0, bad = 0;
};

std::atomic<int> printed{0};

void fail(const char* what, uint32_t m, uint32_t p, int32_t x) {
  if (printed.fetch_add(1) < 12) {
    std::printf("FAIL %s: m 0x%08x P 0x%04x value %d\n", what, m, p, x);
  }
}

// The scalar checks of pattern m; returns P.
uint32_t check_scalar(uint32_t m, Tally& t) {
  const uint32_t p = rne(m);
  const uint32_t p_cpu = simd::to_bf16(from_bits(m)).bits;
  t.checked += 1;
  if (is_nan_bits(m)) {
    if (!master::bf16_is_nan(p) || !master::bf16_is_nan(p_cpu) ||
        !is_nan_bits(master::decode16(p, master::encode16(m, p))) ||
        !is_nan_bits(master::decode8(p, master::encode8(m, p)))) {
      ++t.bad;
      fail("NaN", m, p, 0);
    }
    return p;
  }
  if (p != p_cpu || master::bf16_is_nan(p)) {
    ++t.bad;
    fail("rounding", m, p, static_cast<int32_t>(p_cpu));
  }
  const int32_t d = static_cast<int32_t>(m - (p << 16));
  if (d < -0x8000 || d > 0x8000) {
    ++t.bad;
    fail("|d| > 0x8000", m, p, d);
  }
  const uint32_t m16 = master::decode16(p, master::encode16(m, p));
  if (m16 == m) {
    t.exact16 += 1;
  } else if (d == 0x8000 && (p & 1u) == 0 && m16 == m - 1u) {
    t.exceptions16 += 1;
  } else {
    ++t.bad;
    fail("16-bit decode", m, p, static_cast<int32_t>(m16 - m));
  }
  const int8_t c8 = master::encode8(m, p);
  if (c8 != code8_by_division(d)) {
    ++t.bad;
    fail("8-bit code", m, p, c8);
  }
  const int32_t err = static_cast<int32_t>(master::decode8(p, c8) - m);
  const int32_t bound = d >= 32640 ? 256 : 128;
  if (err < -bound || err > bound) {
    ++t.bad;
    fail("8-bit bound", m, p, err);
  }
  return p;
}

constexpr int kLanes = 2 * simd::FVec::size();

// The vector encode/decode of kLanes patterns from m0 against the scalar.
template <typename C>
void check_vector(uint32_t m0, const uint32_t* p_scalar, Tally& t) {
  alignas(64) float x[kLanes];
  for (int k = 0; k < kLanes; ++k) {
    x[k] = from_bits(m0 + static_cast<uint32_t>(k));
  }
  simd::FVec a, b;
  simd::load2(x, a, b);
  simd::bf16 pv[kLanes];
  C cv[kLanes];
  simd::store2_split(pv, cv, a, b);
  alignas(64) float back[kLanes];
  simd::load2_split(pv, cv, a, b);
  simd::store2(back, a, b);
  for (int k = 0; k < kLanes; ++k) {
    const uint32_t m = m0 + static_cast<uint32_t>(k);
    const uint32_t p = pv[k].bits;
    uint32_t mb;
    std::memcpy(&mb, &back[k], sizeof mb);
    bool ok;
    if (is_nan_bits(m)) {
      ok = master::bf16_is_nan(p) && cv[k] == 0 && is_nan_bits(mb);
    } else {
      const C cs = master::encode<C>(m, p_scalar[k]);
      const uint32_t ms = sizeof(C) == 2 ? master::decode16(p_scalar[k], cs)
                                         : master::decode8(p_scalar[k], cs);
      ok = p == p_scalar[k] && cv[k] == cs && mb == ms;
    }
    if (!ok) {
      ++t.bad;
      fail(sizeof(C) == 2 ? "vector int16" : "vector int8", m, p, cv[k]);
    }
  }
}

// The vector decode of every correction C with the params hi ^ k in lane k
// (so every (P, c) pair once over all hi) against the scalar decode, bit for
// bit (a NaN P: P << 16, whatever c is).
template <typename C>
void check_decode(uint32_t hi, Tally& t) {
  constexpr int64_t kCodes = int64_t{1} << (8 * sizeof(C));
  simd::bf16 pv[kLanes];
  C cv[kLanes];
  for (int k = 0; k < kLanes; ++k) {
    pv[k].bits = static_cast<uint16_t>(hi ^ static_cast<uint32_t>(k));
  }
  for (int64_t c0 = 0; c0 < kCodes; c0 += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      cv[k] = static_cast<C>(static_cast<uint64_t>(c0 + k));
    }
    simd::FVec a, b;
    simd::load2_split(pv, cv, a, b);
    alignas(64) float back[kLanes];
    simd::store2(back, a, b);
    for (int k = 0; k < kLanes; ++k) {
      uint32_t mb;
      std::memcpy(&mb, &back[k], sizeof mb);
      const uint32_t ms = sizeof(C) == 2 ? master::decode16(pv[k].bits, cv[k])
                                         : master::decode8(pv[k].bits, cv[k]);
      if (mb != ms) {
        ++t.bad;
        fail(sizeof(C) == 2 ? "vector decode int16" : "vector decode int8", mb,
             pv[k].bits, cv[k]);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const bool scalar = !(argc > 2 && std::strcmp(argv[2], "vector") == 0);
  std::vector<Tally> tallies(threads);
  auto work = [&](int th) {
    Tally& t = tallies[th];
    uint32_t ps[kLanes];
    for (uint64_t hi = th; hi < 65536; hi += threads) {
      for (uint32_t lo = 0; lo < 65536; lo += kLanes) {
        const uint32_t m0 = static_cast<uint32_t>(hi << 16) | lo;
        for (int k = 0; k < kLanes; ++k) {
          const uint32_t m = m0 + static_cast<uint32_t>(k);
          ps[k] = scalar ? check_scalar(m, t) : rne(m);
        }
        check_vector<int16_t>(m0, ps, t);
        check_vector<int8_t>(m0, ps, t);
      }
      check_decode<int16_t>(static_cast<uint32_t>(hi), t);
      check_decode<int8_t>(static_cast<uint32_t>(hi), t);
    }
  };
  std::vector<std::thread> pool;
  for (int th = 0; th < threads; ++th) {
    pool.emplace_back(work, th);
  }
  for (auto& th : pool) {
    th.join();
  }
  Tally all;
  for (const Tally& t : tallies) {
    all.checked += t.checked;
    all.exact16 += t.exact16;
    all.exceptions16 += t.exceptions16;
    all.bad += t.bad;
  }
  // the stated exception set, counted from the params: even finite P whose
  // upper half-ulp midpoint (away from zero) rounds to P
  uint64_t midpoints = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    const bool finite = (p & 0x7f80u) != 0x7f80u;
    if (finite && (p & 1u) == 0 && rne((p << 16) | 0x8000u) == p) {
      ++midpoints;
    }
  }
  const bool ok =
      all.bad == 0 &&
      (!scalar || (all.checked == (uint64_t{1} << 32) &&
                   all.exceptions16 == midpoints && midpoints == 32640));
  std::printf(
      "isa %s: vector checks of all float32 patterns; scalar: checked %llu "
      "float32 patterns: %llu exact in 16 bits, %llu "
      "exceptions (%llu midpoints of even finite params), %llu failures\n",
      simd::FVec::size() == 16 ? "avx512"
                               : (
#if defined(MIXPREC_SIMD_AVX2)
                                     "avx2"
#else
                                     "portable"
#endif
                                     ),
      static_cast<unsigned long long>(all.checked),
      static_cast<unsigned long long>(all.exact16),
      static_cast<unsigned long long>(all.exceptions16),
      static_cast<unsigned long long>(midpoints),
      static_cast<unsigned long long>(all.bad));
  return ok ? 0 : 1;
}
