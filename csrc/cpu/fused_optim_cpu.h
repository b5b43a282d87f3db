// Helpers of the CPU fused-optimizer kernels (fused_adam_cpu.cpp,
// fused_sgd_cpu.cpp): the at::vec policy for common/optim_math.h, loads and
// stores of float32/float16/bfloat16 spans as pairs of float vectors, the
// rounding of results back to the param dtype (nearest or stochastic), and
// the work list over all parameters.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/optim_math.h"
#include "cpu/multi_tensor_cpu.h"

namespace mixprec {
namespace cpu {

using FVec = at::vec::Vectorized<float>;

// optim_math's Ops policy for Vectorized<float>.
struct VecOps {
  static FVec sqrt(const FVec& v) { return v.sqrt(); }
  static FVec maximum(const FVec& a, const FVec& b) {
    return at::vec::maximum(a, b);
  }
};

// Elements handled per vector step: two float vectors, which is one vector of
// a 16-bit type.
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

// Stochastic rounding of float results to bfloat16: `index` is the SR element
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

// Stores the float working values of elements [i, i + n) (n <= kStep, held in
// a, b) into the param (rounded to nearest, or stochastically when `sr`) and,
// when there is one, the master.
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

// Work list over all parameters: chunks of kCpuChunk elements, each tagged
// with its parameter, processed by at::parallel_for.
struct ParamChunks {
  std::vector<WorkItem> items;
  int64_t total = 0;

  explicit ParamChunks(const std::vector<at::Tensor>& params) {
    for (size_t t = 0; t < params.size(); ++t) {
      const int64_t n = params[t].numel();
      for (int64_t b = 0; b < n; b += kCpuChunk) {
        items.push_back({static_cast<int32_t>(t), b, std::min(n, b + kCpuChunk)});
      }
      total += n;
    }
  }

  template <typename Fn>
  void run(Fn fn) const {
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t grain = total < 2 * kCpuChunk ? n + 1 : 1;
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        fn(items[i]);
      }
    });
  }
};

// SR element-index bases: per parameter, chunk_base * 65536 where chunk_base
// counts the 65536-element chunks of the earlier params with the same
// (param dtype, grad dtype), matching the CUDA kernels' block numbering.
inline std::vector<uint32_t> sr_index_bases(const std::vector<at::Tensor>& params,
                                            const std::vector<at::Tensor>& grads) {
  std::vector<uint32_t> bases(params.size(), 0);
  std::vector<std::pair<std::pair<int, int>, int64_t>> chunks;  // group -> count
  for (size_t t = 0; t < params.size(); ++t) {
    const std::pair<int, int> group{static_cast<int>(params[t].scalar_type()),
                                    static_cast<int>(grads[t].scalar_type())};
    int64_t* count = nullptr;
    for (auto& c : chunks) {
      if (c.first == group) {
        count = &c.second;
      }
    }
    if (count == nullptr) {
      chunks.push_back({group, 0});
      count = &chunks.back().second;
    }
    bases[t] = static_cast<uint32_t>(*count * math::kSrChunk);
    *count += (params[t].numel() + math::kSrChunk - 1) / math::kSrChunk;
  }
  return bases;
}

}  // namespace cpu
}  // namespace mixprec
