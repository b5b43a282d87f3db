// What the steps (optim.cpp) and the state conversion (optim_state.cpp) of
// mixprec::optim share: a param's fresh step, the shape of an 8-bit
// moment's maxima and the split masters' conversions.
#pragma once

#include "common/quant8_math.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace mixprec::optim::detail {

inline at::Tensor step_zero(const at::Tensor& p) {
  return at::zeros({}, at::TensorOptions(p.device()).dtype(at::kFloat));
}

inline std::vector<int64_t> absmax_sizes(const at::Tensor& t) {
  return q8::absmax_sizes<std::vector<int64_t>>(t.sizes().data(), t.dim());
}

// Split masters (optim_masters.cpp): the correction dtype of
// master_correction_bits 16 (int16) or 8 (int8); (RNE_bf16(master), its
// correction); a correction re-encoded at another width against the same
// param.
at::ScalarType correction_dtype(int64_t bits);
std::pair<at::Tensor, at::Tensor> split_master(const at::Tensor& master,
                                               at::ScalarType dtype);
at::Tensor recode(const at::Tensor& param, const at::Tensor& correction,
                  at::ScalarType dtype);

}  // namespace mixprec::optim::detail
