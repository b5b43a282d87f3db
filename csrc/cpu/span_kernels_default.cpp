// The portable span kernels (unscale family and fused optimizers), built on
// simd.h's portable vectors (compiled for the baseline ISA); the body is
// span_kernels_isa.h, which defines span_kernels_default(). The selection
// among the per-ISA tables is span_kernels() (span_kernels.cpp).
#include "cpu/span_kernels.h"

#define MIXPREC_ISA default
#define MIXPREC_ISA_PORTABLE
#include "cpu/span_kernels_isa.h"
