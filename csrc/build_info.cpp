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

// The toolchain fields of build_info() for `python -m mixprec.info`, read with
// ctypes (the Python module's attributes are set in csrc/python/module.cpp):
// "key=value" lines. A plain C symbol, visible despite -fvisibility=hidden.
extern "C" __attribute__((visibility("default"))) const char*
mixprec_build_toolchain() {
  return "cxx_compiler=" MIXPREC_CXX_COMPILER
         "\ncxx_compiler_version=" MIXPREC_CXX_COMPILER_VERSION
         "\nnvcc_version=" MIXPREC_NVCC_VERSION "\n";
}
