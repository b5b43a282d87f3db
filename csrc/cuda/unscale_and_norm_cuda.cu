// unscale_and_norm_ and check_finite_and_norm_ on CUDA (csrc/cuda/unscale.h):
// the unscale (or read-only check) pass also writes one norm partial per
// block; a one-block kernel then combines the partials in double, in a fixed
// order (deterministic), and writes the norm. No host sync.
#include <torch/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/unscale.h"

namespace mixprec {
namespace cuda {
namespace {

at::Tensor unscale_and_norm_cuda(const OpArgs<&unscale_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_launch<DeviceExec>("unscale_and_norm_", grads, found_inf,
                                 inv_scale, norm_type, /*in_place=*/true);
}

at::Tensor check_finite_and_norm_cuda(
    const OpArgs<&check_finite_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_launch<DeviceExec>("check_finite_and_norm_", grads, found_inf,
                                 inv_scale, norm_type, /*in_place=*/false);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &mixprec::cuda::unscale_and_norm_cuda);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &mixprec::cuda::check_finite_and_norm_cuda);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &mixprec::cuda::unscale_and_norm_cuda);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &mixprec::cuda::check_finite_and_norm_cuda);
}
