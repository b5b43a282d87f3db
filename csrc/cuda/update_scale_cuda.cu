// update_scale_ and update_scale_ext_ on CUDA (csrc/cuda/update_scale.h).
#include <torch/csrc/stable/library.h>

#include "cuda/device_exec.cuh"
#include "cuda/update_scale.h"

namespace mixprec {
namespace cuda {
namespace {

constexpr auto update_scale_cuda = &update_scale_launch<DeviceExec>;
constexpr auto update_scale_ext_cuda = &update_scale_ext_launch<DeviceExec>;

}  // namespace
}  // namespace cuda
}  // namespace mixprec

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  MIXPREC_IMPL(m, update_scale_, mixprec::cuda::update_scale_cuda);
  MIXPREC_IMPL(m, update_scale_ext_, mixprec::cuda::update_scale_ext_cuda);
}
