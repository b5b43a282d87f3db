// The span kernels (unscale family and fused optimizers) compiled for AVX512
// (simd.h's 64-byte vectors with AVX-512 F/BW/VL/DQ instructions), selected
// at run time by span_kernels() when the CPU supports it. The target pragma
// applies to everything below it, so the standard headers the kernels use
// are included above it, and this file includes nothing else that other
// translation units rely on being portable. The body is span_kernels_isa.h
// (shared with the other ISAs' files); it defines span_kernels_avx512().
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu/span_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define MIXPREC_SIMD_AVX512
#endif

#define MIXPREC_ISA avx512
#include "cpu/span_kernels_isa.h"
