// The span kernels (unscale family and fused optimizers) compiled for AVX2 (at::vec's AVX2 Vectorized types),
// selected at run time by span_kernels() when the CPU supports it. The target
// pragma applies to everything below it, so this file must include nothing
// that other translation units rely on being portable beyond the headers of
// span_kernels_impl.h and fused_optim_span_impl.h.
#include "cpu/fused_optim_span.h"
#include "cpu/span_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

#pragma GCC target("avx2,fma,f16c")
// GCC's target pragma enables the instructions but not the ISA macros that
// at::vec and SLEEF test, so they are defined here for this file only.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#define MIXPREC_SPAN_NS isa_avx2
#define MIXPREC_OPT_NS opt_avx2
#include "cpu/fused_optim_span_impl.h"
#include "cpu/span_kernels_impl.h"

namespace mixprec {
namespace cpu {
const SpanKernels* span_kernels_avx2() {
  return isa_avx2::table("avx2");
}
const OptimSpanKernels* optim_span_kernels_avx2() {
  return opt_avx2::table("avx2");
}
}  // namespace cpu
}  // namespace mixprec

#else

namespace mixprec {
namespace cpu {
const SpanKernels* span_kernels_avx2() {
  return nullptr;
}
const OptimSpanKernels* optim_span_kernels_avx2() {
  return nullptr;
}
}  // namespace cpu
}  // namespace mixprec

#endif
