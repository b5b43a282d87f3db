// unscale_and_norm_ and check_finite_and_norm_ on CUDA (csrc/cuda/unscale.h):
// the unscale (or read-only check) pass also writes one norm partial per
// block; a one-block kernel then combines the partials in double, in a fixed
// order (deterministic), and writes the norm. No host sync.
#include <torch/csrc/stable/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/unscale.h"

// The kernels are unscale.h's op launchers with the CUDA executor.
namespace {
namespace cu = mixprec::cuda;
using cu::DeviceExec;
}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &cu::unscale_and_norm_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &cu::check_finite_and_norm_launch<DeviceExec>);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
STABLE_TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &cu::unscale_and_norm_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &cu::check_finite_and_norm_launch<DeviceExec>);
}
