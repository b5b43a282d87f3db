// The span kernels (unscale family and fused optimizers) compiled for AVX512
// (at::vec's AVX512 Vectorized types), selected at run time by span_kernels()
// when the CPU supports it. The target pragma applies to everything below it,
// so this file must include nothing that other translation units rely on
// being portable beyond the headers of span_kernels_impl.h and
// fused_optim_span_impl.h. The body is span_kernels_isa.h (shared with
// the other ISAs' files); it defines span_kernels_avx512().
#include "cpu/span_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC's target pragma enables the instructions but not the ISA macros that
// at::vec and SLEEF test; span_kernels_isa.h defines AVX2's, these are the
// AVX512 ones, for this file only.
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#ifndef __AVX512BW__
#define __AVX512BW__ 1
#endif
#ifndef __AVX512VL__
#define __AVX512VL__ 1
#endif
#ifndef __AVX512DQ__
#define __AVX512DQ__ 1
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#endif

#define MIXPREC_ISA avx512
#include "cpu/span_kernels_isa.h"
