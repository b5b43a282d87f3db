// What the steps (optim.cpp) and the state conversion (optim_state.cpp) of
// mixprec::optim share: a param's fresh step and the shape of an 8-bit
// moment's maxima.
#pragma once

#include "common/quant8_math.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mixprec::optim::detail {

inline at::Tensor step_zero(const at::Tensor& p) {
  return at::zeros({}, at::TensorOptions(p.device()).dtype(at::kFloat));
}

inline std::vector<int64_t> absmax_sizes(const at::Tensor& t) {
  return q8::absmax_sizes<std::vector<int64_t>>(t.sizes().data(), t.dim());
}

}  // namespace mixprec::optim::detail
