// Host-side helpers of the CPU fused-optimizer kernels (fused_adam_cpu.cpp,
// fused_sgd_cpu.cpp): the work list over all parameters and the stochastic-
// rounding element numbering. The element loops are in
// fused_optim_span_impl.h, compiled per ISA (fused_optim_span.h).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/optim_math.h"
#include "cpu/fused_optim_span.h"
#include "cpu/multi_tensor_cpu.h"

namespace mixprec {
namespace cpu {

// span_dtype(ScalarType) comes from multi_tensor_cpu.h.

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
