// fused_adam_ and fused_adam8_ on CUDA: csrc/cuda/fused_adam.h run by
// DeviceExec.
#include <torch/csrc/stable/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/fused_adam.h"

namespace mixprec {
namespace cuda {
namespace {

constexpr auto fused_adam_cuda = &fused_adam_launch<DeviceExec>;
constexpr auto fused_adam8_cuda = &fused_adam8_launch<DeviceExec>;

}  // namespace
}  // namespace cuda
}  // namespace mixprec

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, fused_adam_, mixprec::cuda::fused_adam_cuda);
  MIXPREC_IMPL(m, fused_adam8_, mixprec::cuda::fused_adam8_cuda);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
STABLE_TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, fused_adam_, mixprec::cuda::fused_adam_cuda);
  MIXPREC_IMPL(m, fused_adam8_, mixprec::cuda::fused_adam8_cuda);
}
