// What this copy of libmixprec was built with.
#pragma once

#include "mixprec/export.h"

#include <string>

namespace mixprec {

struct BuildInfo {
  std::string version;  // mixprec version
  std::string
      torch_version;  // torch.__version__ / libtorch version built against
  bool cuda_kernels;  // whether CUDA kernels were compiled in
  std::string cuda_version;  // CUDA toolkit version, "" without CUDA kernels
  std::string cuda_archs;    // e.g. "8.0;9.0", "" without CUDA kernels
  std::string
      cxx_compiler;  // the C++ compiler (path) the library was built with
  std::string cxx_compiler_version;  // first line of its `--version`
  std::string nvcc_version;  // nvcc's "release" line, "" without CUDA kernels
};

MIXPREC_API BuildInfo build_info();

// The CPU kernel set chosen at run time for this machine: "avx512", "avx2" or
// "default" (capped by MIXPREC_CPU_CAPABILITY / ATEN_CPU_CAPABILITY).
MIXPREC_API std::string cpu_capability();

// How many threads the CPU kernels' loops run on now: the size of torch's
// intra-op pool (the kernels run their loops through torch's stable
// parallel_for).
MIXPREC_API int cpu_kernel_threads();

}  // namespace mixprec
