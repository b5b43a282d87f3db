#include "mixprec/build_info.h"

#include <ATen/Parallel.h>

#include <atomic>

#include "cpu/span_kernels.h"
#include "mixprec_build_config.h"

namespace mixprec {

BuildInfo build_info() {
  return BuildInfo{MIXPREC_VERSION,
                   MIXPREC_TORCH_VERSION,
                   MIXPREC_WITH_CUDA_KERNELS != 0,
                   MIXPREC_CUDA_VERSION,
                   MIXPREC_CUDA_ARCHS,
                   MIXPREC_CXX_COMPILER,
                   MIXPREC_CXX_COMPILER_VERSION,
                   MIXPREC_NVCC_VERSION};
}

std::string cpu_capability() { return cpu::span_kernels().name; }

int cpu_kernel_threads() {
  // One item per thread: each thread of the team runs one chunk, a serial
  // at::parallel_for runs one chunk of all.
  std::atomic<int> chunks{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    chunks.fetch_add(1, std::memory_order_relaxed);
  });
  return chunks.load();
}

}  // namespace mixprec
