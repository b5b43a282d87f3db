// span_kernels(): the one selector of the CPU kernel table (span_kernels.h)
// among the per-ISA tables span_kernels_default/avx2/avx512().
#include "cpu/span_kernels.h"

#include "common/tensor.h"

#include <cstdlib>
#include <string>

namespace mixprec {
namespace cpu {
namespace {

// Highest ISA allowed by MIXPREC_CPU_CAPABILITY (else ATEN_CPU_CAPABILITY):
// 0 = default, 1 = avx2, 2 = avx512.
int capability_cap() {
  const char* env = std::getenv("MIXPREC_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0') {
    env = std::getenv("ATEN_CPU_CAPABILITY");
  }
  if (env == nullptr) {
    return 2;
  }
  const std::string v(env);
  if (v == "default") return 0;
  if (v == "avx2") return 1;
  return 2;
}

const SpanKernels& select() {
  const int cap = capability_cap();
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  const bool has_avx2 = __builtin_cpu_supports("avx2") &&
                        __builtin_cpu_supports("fma") &&
                        __builtin_cpu_supports("f16c");
  const bool has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq");
  if (cap >= 2 && has_avx512 && span_kernels_avx512() != nullptr) {
    return *span_kernels_avx512();
  }
  if (cap >= 1 && has_avx2 && span_kernels_avx2() != nullptr) {
    return *span_kernels_avx2();
  }
#endif
  (void)cap;
  const SpanKernels* portable = span_kernels_default();
  MIXPREC_INTERNAL_ASSERT(portable != nullptr);
  return *portable;
}

}  // namespace

const SpanKernels& span_kernels() {
  static const SpanKernels& chosen = select();
  return chosen;
}

}  // namespace cpu
}  // namespace mixprec
