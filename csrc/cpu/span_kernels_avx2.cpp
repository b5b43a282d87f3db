// The span kernels (unscale family and fused optimizers) compiled for AVX2
// (at::vec's AVX2 Vectorized types), selected at run time by span_kernels()
// when the CPU supports it. The target pragma applies to everything below it,
// so this file must include nothing that other translation units rely on
// being portable beyond the headers of span_kernels_impl.h and
// fused_optim_span_impl.h. The body is span_kernels_isa.h (shared with
// the other ISAs' files); it defines span_kernels_avx2().
#include "cpu/span_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

#define MIXPREC_ISA avx2
#include "cpu/span_kernels_isa.h"
