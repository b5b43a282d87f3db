// Host-side dispatch of the fused-optimizer kernels on (param dtype, grad
// dtype), both among float32 / float16 / bfloat16. Used by the CPU and CUDA
// launchers.
#pragma once

#include "common/tensor.h"
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

namespace mixprec {
namespace optim {

// Calls f(P*, G*) with null pointers whose types are the C++ types of `p`
// and `g`.
template <typename G, typename F>
void dispatch_param(ScalarType p, F&& f) {
  switch (p) {
    case ScalarType::Float:
      f(static_cast<float*>(nullptr), static_cast<G*>(nullptr));
      return;
    case ScalarType::Half:
      f(static_cast<torch::headeronly::Half*>(nullptr),
        static_cast<G*>(nullptr));
      return;
    case ScalarType::BFloat16:
      f(static_cast<torch::headeronly::BFloat16*>(nullptr),
        static_cast<G*>(nullptr));
      return;
    default:
      MIXPREC_INTERNAL_ASSERT(false, "unexpected param dtype ", p);
  }
}

template <typename F>
void dispatch_param_grad(ScalarType p, ScalarType g, F&& f) {
  switch (g) {
    case ScalarType::Float:
      dispatch_param<float>(p, f);
      return;
    case ScalarType::Half:
      dispatch_param<torch::headeronly::Half>(p, f);
      return;
    case ScalarType::BFloat16:
      dispatch_param<torch::headeronly::BFloat16>(p, f);
      return;
    default:
      MIXPREC_INTERNAL_ASSERT(false, "unexpected grad dtype ", g);
  }
}

}  // namespace optim
}  // namespace mixprec
