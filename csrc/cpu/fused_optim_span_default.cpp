// The portable fused-optimizer span kernels (at::vec's DEFAULT implementation)
// and the runtime selection, which follows span_kernels()'s choice.
#define MIXPREC_OPT_NS opt_default
#include "cpu/fused_optim_span_impl.h"

#include <cstring>

namespace mixprec {
namespace cpu {

const OptimSpanKernels* optim_span_kernels_default() {
  return opt_default::table("default");
}

namespace {

const OptimSpanKernels& select_optim() {
  const char* isa = span_kernels().name;
  if (std::strcmp(isa, "avx512") == 0 && optim_span_kernels_avx512() != nullptr) {
    return *optim_span_kernels_avx512();
  }
  if (std::strcmp(isa, "avx2") == 0 && optim_span_kernels_avx2() != nullptr) {
    return *optim_span_kernels_avx2();
  }
  return *optim_span_kernels_default();
}

}  // namespace

const OptimSpanKernels& optim_span_kernels() {
  static const OptimSpanKernels& chosen = select_optim();
  return chosen;
}

}  // namespace cpu
}  // namespace mixprec
