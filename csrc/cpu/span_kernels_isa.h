// The body of the per-ISA translation units span_kernels_avx2.cpp and
// span_kernels_avx512.cpp: the span kernels (span_kernels_impl.h) and the
// fused-optimizer element loops (fused_optim_span_impl.h) compiled for one
// instruction set, and the two functions that hand out their tables,
// span_kernels_<isa>() and optim_span_kernels_<isa>() (span_kernels.h,
// fused_optim_span.h). On other targets those functions return nullptr.
//
// The including file names the ISA (MIXPREC_ISA, e.g. avx2) and, on x86-64
// GCC/Clang, has already set its `#pragma GCC target`, CPU_CAPABILITY and the
// ISA macros beyond AVX2's; everything it compiles is below its pragma.
// Included once per such file: no include guard.
#ifndef MIXPREC_ISA
#error "define MIXPREC_ISA before including span_kernels_isa.h"
#endif

#include "cpu/fused_optim_span.h"
#include "cpu/span_kernels.h"

#define MIXPREC_ISA_CAT_(a, b) a##b
#define MIXPREC_ISA_CAT(a, b) MIXPREC_ISA_CAT_(a, b)
#define MIXPREC_ISA_STR_(a) #a
#define MIXPREC_ISA_STR(a) MIXPREC_ISA_STR_(a)

#if defined(__x86_64__) && defined(__GNUC__)

#ifndef CPU_CAPABILITY
#error "span_kernels_isa.h: set the target pragma and CPU_CAPABILITY first"
#endif
// GCC's target pragma enables the instructions but not the ISA macros that
// at::vec and SLEEF test, so they are defined here for this file only (those
// of AVX2, which every ISA here includes; the file defines the others).
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
#define MIXPREC_SPAN_NS MIXPREC_ISA_CAT(isa_, MIXPREC_ISA)
#define MIXPREC_OPT_NS MIXPREC_ISA_CAT(opt_, MIXPREC_ISA)
#include "cpu/fused_optim_span_impl.h"
#include "cpu/span_kernels_impl.h"

namespace mixprec {
namespace cpu {
const SpanKernels* MIXPREC_ISA_CAT(span_kernels_, MIXPREC_ISA)() {
  return MIXPREC_SPAN_NS::table(MIXPREC_ISA_STR(MIXPREC_ISA));
}
const OptimSpanKernels* MIXPREC_ISA_CAT(optim_span_kernels_, MIXPREC_ISA)() {
  return MIXPREC_OPT_NS::table(MIXPREC_ISA_STR(MIXPREC_ISA));
}
}  // namespace cpu
}  // namespace mixprec

#else

namespace mixprec {
namespace cpu {
const SpanKernels* MIXPREC_ISA_CAT(span_kernels_, MIXPREC_ISA)() {
  return nullptr;
}
const OptimSpanKernels* MIXPREC_ISA_CAT(optim_span_kernels_, MIXPREC_ISA)() {
  return nullptr;
}
}  // namespace cpu
}  // namespace mixprec

#endif
