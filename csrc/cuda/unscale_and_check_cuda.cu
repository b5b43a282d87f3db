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

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, unscale_and_check_,
               &cu::unscale_and_check_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_, &cu::check_finite_launch<DeviceExec>);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
STABLE_TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, unscale_and_check_,
               &cu::unscale_and_check_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_, &cu::check_finite_launch<DeviceExec>);
}
