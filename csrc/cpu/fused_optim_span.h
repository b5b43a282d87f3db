// Runtime CPU-capability dispatch for the fused-optimizer span kernels.
//
// The element loops of fused_adam_ / fused_sgd_ (fused_optim_span_impl.h) are
// compiled once per instruction set, in the same translation units as the
// unscale span kernels (span_kernels_default.cpp, _avx2.cpp, _avx512.cpp), and the table
// of the ISA that span_kernels() chose is used, so MIXPREC_CPU_CAPABILITY /
// ATEN_CPU_CAPABILITY cap both the same way. Every ISA computes the same bits:
// the builds use -ffp-contract=off, so no product is fused into an FMA.
//
// The tables take raw pointers so the per-ISA translation units include no
// ATen tensor code.
#pragma once

#include <cstdint>

#include "common/optim_math.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {

// Scalars of one Adam span.
struct AdamSpanArgs {
  math::GradCoefs gc;
  math::AdamConsts k;
  math::AdamStep s;
  bool sr;              // stochastic rounding (bf16 params only)
  uint32_t key;         // SR key of (seed, step, stream)
  uint32_t index_base;  // SR index of element 0 of the span
};

// Scalars of one SGD span.
struct SgdSpanArgs {
  math::GradCoefs gc;
  math::SgdConsts k;
  float neg_lr;
  bool first;  // the param's first real step (buffer starts from the grad)
  bool sr;
  uint32_t key;
  uint32_t index_base;
};

struct OptimSpanKernels {
  // Adam/AdamW over elements [0, n) of one param span. `master` null: the
  // param is the working copy; `vm` null unless amsgrad.
  void (*adam)(SpanDtype param, SpanDtype grad, void* p, const void* g,
               float* m, float* v, float* vm, float* master, int64_t n,
               const AdamSpanArgs& a);
  // SGD over [0, n); `buf` null unless momentum != 0, `master` as above.
  void (*sgd)(SpanDtype param, SpanDtype grad, void* p, const void* g,
              float* buf, float* master, int64_t n, const SgdSpanArgs& a);
  const char* name;
};

// The table of the ISA span_kernels() chose (chosen once, thread-safe).
const OptimSpanKernels& optim_span_kernels();

// Per-ISA tables; nullptr where not compiled in (non-x86 builds).
const OptimSpanKernels* optim_span_kernels_default();
const OptimSpanKernels* optim_span_kernels_avx2();
const OptimSpanKernels* optim_span_kernels_avx512();

}  // namespace cpu
}  // namespace mixprec
