// What this copy of libmixprec was built with.
#pragma once

#include <string>

namespace mixprec {

struct BuildInfo {
  std::string version;        // mixprec version
  std::string torch_version;  // torch.__version__ / libtorch version built against
  bool cuda_kernels;          // whether CUDA kernels were compiled in
  std::string cuda_version;   // CUDA toolkit version, "" without CUDA kernels
  std::string cuda_archs;     // e.g. "8.0;9.0", "" without CUDA kernels
};

BuildInfo build_info();

}  // namespace mixprec
