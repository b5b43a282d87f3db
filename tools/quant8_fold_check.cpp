// Proves the folded 8-bit encode (q8::encode_fraction, one read of
// kQ8EncodeFolded) equal to the unfolded one it replaced
// (q8::encode_fraction_unfolded) for every float32 bit pattern -- both signs,
// +-0, subnormals, |y| > 1, +-inf and every NaN -- of both code tables.
// Prints the inputs checked and the mismatches (the first few in full) and
// exits 1 on any mismatch. Built and run by tests/project/test_quant8_fold.py:
//   c++ -O2 -std=c++17 -pthread -I csrc -I <torch include>
//   tools/quant8_fold_check.cpp
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/quant8_math.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mixprec::q8;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> checked{0};
  std::atomic<int> printed{0};
  auto work = [&](int t) {
    uint64_t bad = 0, n = 0;
    // thread t takes the patterns whose top bits are t (mod threads)
    for (uint64_t hi = t; hi < 65536; hi += threads) {
      for (uint32_t lo = 0; lo < 65536; ++lo) {
        const uint32_t bits = static_cast<uint32_t>(hi << 16) | lo;
        const float y = from_bits(bits);
        for (int table = 0; table < 2; ++table) {
          const int a = encode_fraction(y, table);
          const int b = encode_fraction_unfolded(y, table);
          n += 1;
          if (a != b) {
            ++bad;
            if (printed.fetch_add(1) < 10) {
              std::printf(
                  "mismatch: bits 0x%08x table %d folded %d unfolded %d\n",
                  bits, table, a, b);
            }
          }
        }
      }
    }
    mismatches += bad;
    checked += n;
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(work, t);
  }
  for (auto& th : pool) {
    th.join();
  }
  std::printf("checked %llu (float32 pattern, table) pairs: %llu mismatches\n",
              static_cast<unsigned long long>(checked.load()),
              static_cast<unsigned long long>(mismatches.load()));
  return mismatches.load() == 0 && checked.load() == (uint64_t{1} << 33) ? 0
                                                                         : 1;
}
