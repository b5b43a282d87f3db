// Split masters (master_correction_bits): the float32 master of a bfloat16
// param kept as the param plus an int16 or int8 correction. The encoding of
// python/mixprec/optim/_masters.py, in ATen ops on the tensors' device (state
// conversions and export, not the step: the kernels update the pair in place).
//   d = bits(m) - (P << 16)   (wrapping 32-bit; 0 where P is NaN)
//   16 bits: c = min(d, 0x7FFF);               decode (P << 16) + c
//    8 bits: c = clamp(round_half_even(d / 256), -128, 127);
//                                              decode (P << 16) + 256 c
#include "mixprec/optim.h"

#include "optim_internal.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace mixprec::optim {

namespace {

// int64 x reduced to the int32 of its low 32 bits, as int64.
at::Tensor wrap32(const at::Tensor& x) {
  return at::remainder(x + (int64_t{1} << 31), int64_t{1} << 32) -
         (int64_t{1} << 31);
}

// int32(uint32(P) << 16) of a bf16 tensor, as int64.
at::Tensor high(const at::Tensor& param) {
  return param.contiguous().view(at::kShort).to(at::kLong) * 65536;
}

at::Tensor encode(const at::Tensor& m, const at::Tensor& param,
                  at::ScalarType dtype) {
  at::Tensor d =
      wrap32(m.contiguous().view(at::kInt).to(at::kLong) - high(param));
  d = at::where(param.isnan(), at::zeros_like(d), d);
  if (dtype == at::kShort) return d.clamp_max(0x7FFF).to(at::kShort);
  return ((d + 127 + d.bitwise_right_shift(8).bitwise_and(1))
              .bitwise_right_shift(8))
      .clamp(-128, 127)
      .to(at::kChar);
}

}  // namespace

at::Tensor decode_master(const at::Tensor& param,
                         const at::Tensor& correction) {
  TORCH_CHECK_TYPE(
      param.defined() && param.scalar_type() == at::kBFloat16,
      "mixprec.optim.decode_master: param must be a bfloat16 "
      "tensor, got ",
      param.defined() ? c10::toString(param.scalar_type()) : "undefined");
  TORCH_CHECK_TYPE(
      correction.defined() && (correction.scalar_type() == at::kShort ||
                               correction.scalar_type() == at::kChar),
      "mixprec.optim.decode_master: correction must be an int16 "
      "or int8 tensor (the master_correction state), got ",
      correction.defined() ? c10::toString(correction.scalar_type())
                           : "undefined");
  TORCH_CHECK_VALUE(param.sizes() == correction.sizes(),
                    "mixprec.optim.decode_master: correction has shape ",
                    correction.sizes(), ", the param ", param.sizes());
  at::NoGradGuard no_grad;
  const at::Tensor p = param.detach();
  at::Tensor c = correction.detach().to(at::kLong);
  if (correction.scalar_type() == at::kChar) c = c * 256;
  const at::Tensor m =
      wrap32(high(p) + c).to(at::kInt).view(at::kFloat).view(p.sizes());
  return at::where(p.isnan(), p.to(at::kFloat), m);
}

namespace detail {

at::ScalarType correction_dtype(int64_t bits) {
  return bits == 16 ? at::kShort : at::kChar;
}

std::pair<at::Tensor, at::Tensor> split_master(const at::Tensor& master,
                                               at::ScalarType dtype) {
  const at::Tensor m = master.detach().to(at::kFloat).contiguous();
  const at::Tensor param = m.to(at::kBFloat16);
  return {param, encode(m, param, dtype)};
}

at::Tensor recode(const at::Tensor& param, const at::Tensor& correction,
                  at::ScalarType dtype) {
  const at::Tensor p = param.detach().contiguous();
  return encode(decode_master(p, correction), p, dtype);
}

}  // namespace detail
}  // namespace mixprec::optim
