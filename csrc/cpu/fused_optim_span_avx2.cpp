// The fused-optimizer span kernels compiled for AVX2 (at::vec's AVX2 Vectorized types),
// selected at run time by optim_span_kernels() when span_kernels() picked this ISA. The target
// pragma applies to everything below it, so this file must include nothing
// that other translation units rely on being portable beyond the headers of
// fused_optim_span_impl.h.
#include "cpu/fused_optim_span.h"

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
#define MIXPREC_OPT_NS opt_avx2
#include "cpu/fused_optim_span_impl.h"

namespace mixprec {
namespace cpu {
const OptimSpanKernels* optim_span_kernels_avx2() {
  return opt_avx2::table("avx2");
}
}  // namespace cpu
}  // namespace mixprec

#else

namespace mixprec {
namespace cpu {
const OptimSpanKernels* optim_span_kernels_avx2() {
  return nullptr;
}
}  // namespace cpu
}  // namespace mixprec

#endif
