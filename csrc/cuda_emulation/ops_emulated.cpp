// The CUDA backend's launchers (csrc/cuda/*.h), run by HostExec on CPU
// tensors: the same argument checks, flattening, dtype grouping, slot wiring,
// launch plans and functor bodies as the CUDA kernels, over an emulated grid.
// Registered as the CPU kernels of the private namespace mixprec_cuda_emu,
// whose schemas python/mixprec/_cuda_emulation.py copies from mixprec's, so
// that tests call torch.ops.mixprec_cuda_emu.<op> exactly like the real op.
//
// A testing aid: nothing in mixprec calls these kernels, and the real ops'
// dispatch never reaches them.
#include <torch/library.h>

#include "cuda/fused_adam.h"
#include "cuda/fused_sgd.h"
#include "cuda/unscale.h"
#include "cuda/update_scale.h"
#include "cuda_emulation/host_exec.h"

namespace mixprec {
namespace cuda_emulation {
namespace {

void unscale_and_check_emu(at::TensorList grads, const at::Tensor& found_inf,
                           const at::Tensor& inv_scale) {
  cuda::unscale_and_check_launch<HostExec>("unscale_and_check_", grads,
                                           found_inf, &inv_scale);
}

void check_finite_emu(at::TensorList tensors, const at::Tensor& found_inf) {
  cuda::unscale_and_check_launch<HostExec>("check_finite_", tensors, found_inf,
                                           nullptr);
}

at::Tensor unscale_and_norm_emu(at::TensorList grads,
                                const at::Tensor& found_inf,
                                const at::Tensor& inv_scale, double norm_type) {
  return cuda::norm_launch<HostExec>("unscale_and_norm_", grads, found_inf,
                                     inv_scale, norm_type, /*in_place=*/true);
}

at::Tensor check_finite_and_norm_emu(at::TensorList grads,
                                     const at::Tensor& found_inf,
                                     const at::Tensor& inv_scale,
                                     double norm_type) {
  return cuda::norm_launch<HostExec>("check_finite_and_norm_", grads,
                                     found_inf, inv_scale, norm_type,
                                     /*in_place=*/false);
}

}  // namespace
}  // namespace cuda_emulation
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec_cuda_emu, CPU, m) {
  namespace emu = mixprec::cuda_emulation;
  using emu::HostExec;
  m.impl("unscale_and_check_", &emu::unscale_and_check_emu);
  m.impl("check_finite_", &emu::check_finite_emu);
  m.impl("unscale_and_norm_", &emu::unscale_and_norm_emu);
  m.impl("check_finite_and_norm_", &emu::check_finite_and_norm_emu);
  m.impl("update_scale_", &mixprec::cuda::update_scale_launch<HostExec>);
  m.impl("update_scale_ext_", &mixprec::cuda::update_scale_ext_launch<HostExec>);
  m.impl("fused_adam_", &mixprec::cuda::fused_adam_launch<HostExec>);
  m.impl("fused_sgd_", &mixprec::cuda::fused_sgd_launch<HostExec>);
}
