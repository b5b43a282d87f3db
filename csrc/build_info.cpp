#include "mixprec/build_info.h"

#include "mixprec_build_config.h"

namespace mixprec {

BuildInfo build_info() {
  return BuildInfo{MIXPREC_VERSION, MIXPREC_TORCH_VERSION,
                   MIXPREC_WITH_CUDA_KERNELS != 0, MIXPREC_CUDA_VERSION,
                   MIXPREC_CUDA_ARCHS};
}

}  // namespace mixprec
