// The one schema block of mixprec: every op of MIXPREC_FOR_EACH_OP, with its
// schema from csrc/op_table.h (where the contract comments are). Kernels
// register themselves per backend (csrc/cpu, csrc/cuda) and at the Autograd
// key (libmixprec: autograd.cpp; the Python package:
// python/mixprec/ops/_autograd.py).
#include <torch/csrc/stable/library.h>

#include "op_table.h"

STABLE_TORCH_LIBRARY(mixprec, m) {
#define MIXPREC_DEF_(op) m.def(::mixprec::OpInfo<::mixprec::Op::op>::kSchema);
  MIXPREC_FOR_EACH_OP(MIXPREC_DEF_)
#undef MIXPREC_DEF_
}
