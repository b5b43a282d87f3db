#include "mixprec/build_info.h"

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

std::string cpu_capability() {
  return cpu::span_kernels().name;
}

}  // namespace mixprec

