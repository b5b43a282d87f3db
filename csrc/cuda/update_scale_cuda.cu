// update_scale_ and update_scale_ext_ on CUDA: the shared scalar rule in a
// one-thread kernel on the current stream, so the scale never leaves the GPU.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/update_scale_math.h"

namespace mixprec {
namespace cuda {
namespace {

__global__ void update_scale_kernel(float* scale, int* growth_tracker,
                                    const float* found_inf,
                                    double growth_factor,
                                    double backoff_factor,
                                    int growth_interval) {
  math::update_scale(scale, growth_tracker, *found_inf, growth_factor,
                     backoff_factor, growth_interval);
}

__global__ void update_scale_ext_kernel(float* scale, int* growth_tracker,
                                        int* hysteresis_left,
                                        const float* found_inf,
                                        double growth_factor,
                                        double backoff_factor,
                                        int growth_interval, double min_scale,
                                        double max_scale, int hysteresis) {
  math::update_scale_ext(scale, growth_tracker, hysteresis_left, *found_inf,
                         growth_factor, backoff_factor, growth_interval,
                         min_scale, max_scale, hysteresis);
}

void update_scale_cuda(const at::Tensor& scale,
                       const at::Tensor& growth_tracker,
                       const at::Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval) {
  checks::check_update_scale_args("update_scale_", scale, growth_tracker,
                                  nullptr, found_inf, growth_interval);
  c10::cuda::OptionalCUDAGuard guard(scale.device());
  update_scale_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int>(),
      found_inf.data_ptr<float>(), growth_factor, backoff_factor,
      static_cast<int>(growth_interval));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void update_scale_ext_cuda(const at::Tensor& scale,
                           const at::Tensor& growth_tracker,
                           const at::Tensor& hysteresis_left,
                           const at::Tensor& found_inf, double growth_factor,
                           double backoff_factor, int64_t growth_interval,
                           std::optional<double> min_scale,
                           std::optional<double> max_scale,
                           int64_t hysteresis) {
  const checks::ScaleBounds b = checks::check_update_scale_ext_args(
      scale, growth_tracker, hysteresis_left, found_inf, growth_factor,
      backoff_factor, growth_interval, min_scale, max_scale, hysteresis);
  c10::cuda::OptionalCUDAGuard guard(scale.device());
  update_scale_ext_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int>(),
      hysteresis_left.data_ptr<int>(), found_inf.data_ptr<float>(),
      growth_factor, backoff_factor, static_cast<int>(growth_interval),
      b.min_scale, b.max_scale, static_cast<int>(hysteresis));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("update_scale_", &mixprec::cuda::update_scale_cuda);
  m.impl("update_scale_ext_", &mixprec::cuda::update_scale_ext_cuda);
}
