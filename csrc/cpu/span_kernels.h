// The CPU kernel table: every vectorized span loop of the CPU backend
// (unscale / inf-check, unscale + norm, the Adam and SGD element loops, and
// their 8-bit-state twins), one
// table per instruction set, and the one selector that picks the table.
//
// The loops (span_kernels_impl.h, fused_optim_span_impl.h) are compiled once
// per instruction set, the way ATen compiles its own CPU kernels per
// CPU_CAPABILITY: span_kernels_default.cpp (the baseline), _avx2.cpp and
// _avx512.cpp, all through span_kernels_isa.h, each defining
// span_kernels_<isa>(). span_kernels() (span_kernels.cpp) picks the best table
// this CPU supports at first use; MIXPREC_CPU_CAPABILITY=default|avx2|avx512
// (else torch's ATEN_CPU_CAPABILITY) caps the choice, e.g. to test the
// portable path. Every ISA computes the same bits: the builds use
// -ffp-contract=off, so no product is fused into an FMA.
//
// The table takes raw pointers so the per-ISA translation units include no
// ATen tensor code.
#pragma once

#include <cstdint>

#include "common/optim_math.h"

namespace mixprec {
namespace cpu {

enum class SpanDtype : int {
  kFloat = 0,
  kHalf = 1,
  kBFloat16 = 2,
  kDouble = 3
};

struct SpanNorm {
  bool found;      // a non-finite input value was seen
  double partial;  // sum of |u|^p, or max |u| for p = inf
};

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

// One 8-bit state over a span that starts at a block boundary: the codes of
// its first element, the absmax of its first block, the state's elements per
// row and the column (index in its row) of the span's first element. The
// blocks run row by row (common/quant8_math.h): q8::kBlock elements, or the
// rest of a row.
struct CodedSpan {
  uint8_t* codes;
  float* absmax;
  int64_t row;
  int64_t col;
};

// The masters of a span: none, float32, or the int16 / int8 corrections of
// split masters (bf16 params only; common/master_math.h), from the span's
// first element.
enum class MasterDtype : int { kNone = 0, kFloat = 1, kInt16 = 2, kInt8 = 3 };

struct MasterSpan {
  void* p;  // null with kNone
  MasterDtype dtype;
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
  // Adam/AdamW over elements [0, n) of one param span. `master` kNone: the
  // param is the working copy; `vm` null unless amsgrad.
  void (*adam)(SpanDtype param, SpanDtype grad, void* p, const void* g,
               float* m, float* v, float* vm, const MasterSpan& master,
               int64_t n, const AdamSpanArgs& a);
  // SGD over [0, n); `buf` null unless momentum != 0, `master` as above.
  void (*sgd)(SpanDtype param, SpanDtype grad, void* p, const void* g,
              float* buf, const MasterSpan& master, int64_t n,
              const SgdSpanArgs& a);
  // fused_adam8_ / fused_sgd8_ over [0, n) of one param span that starts at
  // a block boundary: the moments (the momentum buffer) as codes + maxima.
  void (*adam8)(SpanDtype param, SpanDtype grad, void* p, const void* g,
                const CodedSpan& m, const CodedSpan& v,
                const MasterSpan& master, int64_t n, const AdamSpanArgs& a);
  void (*sgd8)(SpanDtype param, SpanDtype grad, void* p, const void* g,
               const CodedSpan& buf, const MasterSpan& master, int64_t n,
               const SgdSpanArgs& a);
  const char* name;  // "default", "avx2" or "avx512"
};

// The table for this CPU (chosen once, thread-safe).
const SpanKernels& span_kernels();

// Per-ISA tables; nullptr where not compiled in (non-x86 builds).
const SpanKernels* span_kernels_default();
const SpanKernels* span_kernels_avx2();
const SpanKernels* span_kernels_avx512();

}  // namespace cpu
}  // namespace mixprec
