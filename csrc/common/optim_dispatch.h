// Host-side dispatch of the fused-optimizer kernels on (param dtype, grad
// dtype), both among float32 / float16 / bfloat16. Used by the CPU and CUDA
// launchers.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

namespace mixprec {
namespace optim {

// Calls f(P*, G*) with null pointers whose types are the C++ types of `p`
// and `g`.
template <typename G, typename F>
void dispatch_param(c10::ScalarType p, F&& f) {
  switch (p) {
    case c10::ScalarType::Float:
      f(static_cast<float*>(nullptr), static_cast<G*>(nullptr));
      return;
    case c10::ScalarType::Half:
      f(static_cast<c10::Half*>(nullptr), static_cast<G*>(nullptr));
      return;
    case c10::ScalarType::BFloat16:
      f(static_cast<c10::BFloat16*>(nullptr), static_cast<G*>(nullptr));
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "unexpected param dtype ", p);
  }
}

template <typename F>
void dispatch_param_grad(c10::ScalarType p, c10::ScalarType g, F&& f) {
  switch (g) {
    case c10::ScalarType::Float:
      dispatch_param<float>(p, f);
      return;
    case c10::ScalarType::Half:
      dispatch_param<c10::Half>(p, f);
      return;
    case c10::ScalarType::BFloat16:
      dispatch_param<c10::BFloat16>(p, f);
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "unexpected grad dtype ", g);
  }
}

}  // namespace optim
}  // namespace mixprec
