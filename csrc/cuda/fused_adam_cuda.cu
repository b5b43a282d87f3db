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

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, fused_adam_, mixprec::cuda::fused_adam_cuda);
  MIXPREC_IMPL(m, fused_adam8_, mixprec::cuda::fused_adam8_cuda);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CUDA, register_kernels)
