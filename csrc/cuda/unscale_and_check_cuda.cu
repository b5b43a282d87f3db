// unscale_and_check_ and check_finite_ on CUDA (csrc/cuda/unscale.h): one
// multi-tensor pass per dtype present in the list, 16-byte vector loads when a
// tensor is 16-byte aligned, no host sync.
#include <torch/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/unscale.h"

namespace mixprec {
namespace cuda {
namespace {

void unscale_and_check_cuda(const OpArgs<&unscale_and_check_>& a) {
  unscale_and_check_launch<DeviceExec>(
      "unscale_and_check_", MIXPREC_ARG(a, grads), MIXPREC_ARG(a, found_inf),
      &MIXPREC_ARG(a, inv_scale));
}

void check_finite_cuda(const OpArgs<&check_finite_>& a) {
  unscale_and_check_launch<DeviceExec>("check_finite_", MIXPREC_ARG(a, tensors),
                                       MIXPREC_ARG(a, found_inf), nullptr);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, unscale_and_check_, &mixprec::cuda::unscale_and_check_cuda);
  MIXPREC_IMPL(m, check_finite_, &mixprec::cuda::check_finite_cuda);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, unscale_and_check_, &mixprec::cuda::unscale_and_check_cuda);
  MIXPREC_IMPL(m, check_finite_, &mixprec::cuda::check_finite_cuda);
}
