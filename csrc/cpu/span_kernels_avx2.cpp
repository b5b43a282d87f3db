// The span kernels (unscale family and fused optimizers) compiled for AVX2
// (simd.h's 32-byte vectors with AVX2, FMA and F16C instructions), selected
// at run time by span_kernels() when the CPU supports it. The target pragma
// applies to everything below it, so the standard headers the kernels use
// are included above it, and this file includes nothing else that other
// translation units rely on being portable. The body is span_kernels_isa.h
// (shared with the other ISAs' files); it defines span_kernels_avx2().
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu/span_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")
#define MIXPREC_SIMD_AVX2
#endif

#define MIXPREC_ISA avx2
#include "cpu/span_kernels_isa.h"
