// The body of the per-ISA translation units span_kernels_default.cpp,
// span_kernels_avx2.cpp and span_kernels_avx512.cpp: every span loop of the
// CPU backend (span_kernels_impl.h: unscale and norm; fused_optim_span_impl.h:
// the fused-optimizer element loops) compiled for one instruction set, and
// span_kernels_<isa>(), which hands out that set's SpanKernels table
// (span_kernels.h). A new loop is a new table field, filled in here once.
//
// The including file names the ISA (MIXPREC_ISA: default, avx2, avx512). For
// an x86 ISA it has already set, on x86-64 GCC/Clang, its `#pragma GCC
// target` and MIXPREC_SIMD_AVX2 or MIXPREC_SIMD_AVX512, which picks simd.h's
// vectors; everything it compiles is below its pragma. The baseline also
// defines MIXPREC_ISA_PORTABLE: it is compiled on every target, with
// simd.h's portable vectors; an x86 ISA elsewhere yields nullptr.
// Included once per such file: no include guard.
#ifndef MIXPREC_ISA
#error "define MIXPREC_ISA before including span_kernels_isa.h"
#endif

#include "cpu/span_kernels.h"

#define MIXPREC_ISA_CAT_(a, b) a##b
#define MIXPREC_ISA_CAT(a, b) MIXPREC_ISA_CAT_(a, b)
#define MIXPREC_ISA_STR_(a) #a
#define MIXPREC_ISA_STR(a) MIXPREC_ISA_STR_(a)

#if defined(MIXPREC_ISA_PORTABLE) || (defined(__x86_64__) && defined(__GNUC__))

#if !defined(MIXPREC_ISA_PORTABLE) && !defined(MIXPREC_SIMD_AVX2) && \
    !defined(MIXPREC_SIMD_AVX512)
#error "span_kernels_isa.h: set the target pragma and MIXPREC_SIMD_<ISA> first"
#endif

#define MIXPREC_SPAN_NS MIXPREC_ISA_CAT(isa_, MIXPREC_ISA)
#include "cpu/fused_optim_span_impl.h"
#include "cpu/fused_optim8_span_impl.h"
#include "cpu/span_kernels_impl.h"

namespace mixprec {
namespace cpu {
const SpanKernels* MIXPREC_ISA_CAT(span_kernels_, MIXPREC_ISA)() {
  static const SpanKernels table{
      &MIXPREC_SPAN_NS::unscale_check, &MIXPREC_SPAN_NS::unscale_norm,
      &MIXPREC_SPAN_NS::adam,          &MIXPREC_SPAN_NS::sgd,
      &MIXPREC_SPAN_NS::adam8,         &MIXPREC_SPAN_NS::sgd8,
      MIXPREC_ISA_STR(MIXPREC_ISA)};
  return &table;
}
}  // namespace cpu
}  // namespace mixprec

#else

namespace mixprec {
namespace cpu {
const SpanKernels* MIXPREC_ISA_CAT(span_kernels_, MIXPREC_ISA)() {
  return nullptr;
}
}  // namespace cpu
}  // namespace mixprec

#endif
