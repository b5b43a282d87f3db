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

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, fused_sgd_, mixprec::cuda::fused_sgd_cuda);
  MIXPREC_IMPL(m, fused_sgd8_, mixprec::cuda::fused_sgd8_cuda);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CUDA, register_kernels)
