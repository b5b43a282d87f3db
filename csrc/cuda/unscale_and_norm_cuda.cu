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

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &cu::unscale_and_norm_launch<DeviceExec>);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &cu::check_finite_and_norm_launch<DeviceExec>);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CUDA, register_kernels)
