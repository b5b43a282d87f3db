// fused_sgd_ and fused_sgd8_ on CUDA: csrc/cuda/fused_sgd.h run by DeviceExec.
#include <torch/csrc/stable/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/fused_sgd.h"

namespace mixprec {
namespace cuda {
namespace {

constexpr auto fused_sgd_cuda = &fused_sgd_launch<DeviceExec>;
constexpr auto fused_sgd8_cuda = &fused_sgd8_launch<DeviceExec>;

}  // namespace
}  // namespace cuda
}  // namespace mixprec

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, fused_sgd_, mixprec::cuda::fused_sgd_cuda);
  MIXPREC_IMPL(m, fused_sgd8_, mixprec::cuda::fused_sgd8_cuda);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
STABLE_TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  MIXPREC_IMPL(m, fused_sgd_, mixprec::cuda::fused_sgd_cuda);
  MIXPREC_IMPL(m, fused_sgd8_, mixprec::cuda::fused_sgd8_cuda);
}
