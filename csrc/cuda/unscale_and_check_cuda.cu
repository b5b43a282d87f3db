// unscale_and_check_ and check_finite_ on CUDA (csrc/cuda/unscale.h): one
// multi-tensor pass per dtype present in the list, 16-byte vector loads when a
// tensor is 16-byte aligned, no host sync.
#include <torch/csrc/stable/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/unscale.h"

// The kernels are unscale.h's op launchers with the CUDA executor.
namespace {
namespace cu = mixprec::cuda;
using cu::DeviceExec;
}  // namespace

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, unscale_and_check_,
               &cu::unscale_and_check_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_, &cu::check_finite_launch<DeviceExec>);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CUDA, register_kernels)
