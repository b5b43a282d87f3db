// The portable span kernels — unscale family and fused optimizers — built on
// at::vec's DEFAULT implementation (auto-vectorized for the baseline ISA), and
// the runtime selection of the per-ISA tables.
#define MIXPREC_SPAN_NS isa_default
#define MIXPREC_OPT_NS opt_default
#include "cpu/fused_optim_span_impl.h"
#include "cpu/span_kernels_impl.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace mixprec {
namespace cpu {

const SpanKernels* span_kernels_default() {
  return isa_default::table("default");
}

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
  return *span_kernels_default();
}

}  // namespace

const SpanKernels& span_kernels() {
  static const SpanKernels& chosen = select();
  return chosen;
}

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
