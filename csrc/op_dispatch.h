// libmixprec only (a LibTorch build, not the stable op libraries): each op's
// public C++ function (include/mixprec/ops.h) tied to its entry in the op
// table, for the typed dispatcher calls (ops.cpp) and the Autograd-key
// kernels (autograd.cpp).
#pragma once

#include <type_traits>

#include "mixprec/ops.h"
#include "op_table.h"

namespace mixprec {

// The C++ function type of the op whose public function is Fn
// (&mixprec::fused_adam_, ...).
template <auto Fn>
using OpSig = std::remove_pointer_t<decltype(Fn)>;

// The table entry of the op whose public function is Fn.
template <auto Fn>
struct OpOfFn;

#define MIXPREC_OP_OF_FN_(op)           \
  template <>                           \
  struct OpOfFn<&::mixprec::op> {       \
    static constexpr Op value = Op::op; \
  };
MIXPREC_FOR_EACH_OP(MIXPREC_OP_OF_FN_)
#undef MIXPREC_OP_OF_FN_

}  // namespace mixprec
