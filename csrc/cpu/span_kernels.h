// Runtime CPU-capability dispatch for the vectorized span kernels.
//
// The span kernels (span_kernels_impl.h) are compiled once per instruction set
// (span_kernels_default.cpp, _avx2.cpp, _avx512.cpp — the way ATen compiles its
// own CPU kernels per CPU_CAPABILITY), and the best table this CPU supports is
// picked at first use. MIXPREC_CPU_CAPABILITY=default|avx2|avx512 (or torch's
// ATEN_CPU_CAPABILITY) caps the choice, e.g. to test the portable path.
//
// The tables take raw pointers so the per-ISA translation units include no
// ATen tensor code.
#pragma once

#include <cstdint>

namespace mixprec {
namespace cpu {

enum class SpanDtype : int { kFloat = 0, kHalf = 1, kBFloat16 = 2, kDouble = 3 };

struct SpanNorm {
  bool found;      // a non-finite input value was seen
  double partial;  // sum of |u|^p, or max |u| for p = inf
};

struct SpanKernels {
  // Checks p[0, n) for inf/NaN and, when `write`, multiplies by inv_scale in
  // place. Returns whether a non-finite input value was seen.
  bool (*unscale_check)(SpanDtype dtype, void* p, int64_t n, float inv_scale,
                        bool write);
  // unscale_check plus the norm partial (kind: math::NormKind) of the
  // unscaled values.
  SpanNorm (*unscale_norm)(SpanDtype dtype, int kind, void* p, int64_t n,
                           float inv_scale, bool write, double norm_type);
  const char* name;
};

// The table for this CPU (chosen once, thread-safe).
const SpanKernels& span_kernels();

// Per-ISA tables; nullptr where not compiled in (non-x86 builds).
const SpanKernels* span_kernels_default();
const SpanKernels* span_kernels_avx2();
const SpanKernels* span_kernels_avx512();

}  // namespace cpu
}  // namespace mixprec
