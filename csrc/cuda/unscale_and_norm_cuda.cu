// unscale_and_norm_ and check_finite_and_norm_ on CUDA: the unscale (or
// read-only check) pass also writes one norm partial
// per block; a one-block kernel then combines the partials in double, in a
// fixed order (deterministic), and writes the norm. No host sync.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cuda/unscale_kernel.cuh"

namespace mixprec {
namespace cuda {
namespace {

template <int Kind>
__global__ void __launch_bounds__(kBlockSize)
    finish_norm_kernel(const double* partials, int64_t n, double norm_type,
                       float* out) {
  double v = 0.0;  // neutral for sums and for the max of |u|
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    v = math::combine<Kind, double>(v, partials[i]);
  }
  v = block_reduce<Kind>(v);
  if (threadIdx.x == 0) {
    *out = static_cast<float>(math::finish<Kind, double>(v, norm_type));
  }
}

template <int Kind>
at::Tensor run(at::TensorList grads, const at::Tensor& found_inf,
               const at::Tensor& inv_scale, double norm_type, bool in_place) {
  DtypeGroups g(grads, /*written=*/in_place);
  int64_t blocks = 0;
  for (auto& [dtype, list] : g.groups) {
    blocks += count_blocks(list);
  }
  at::Tensor partials =
      at::empty({std::max<int64_t>(blocks, 1)},
                found_inf.options().dtype(at::kDouble));
  double* part_ptr = partials.data_ptr<double>();
  float* found_ptr = found_inf.data_ptr<float>();
  const float* inv_ptr = inv_scale.data_ptr<float>();
  int64_t offset = 0;
  for (auto& [dtype, list] : g.groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, dtype, "mixprec_norm_cuda", [&] {
          const std::array<std::vector<at::Tensor>, 1> lists{list};
          const float p = static_cast<float>(norm_type);
          if (in_place) {
            multi_tensor_apply<1>(lists, UnscaleOp<scalar_t, true, Kind>{},
                                  found_ptr, inv_ptr, part_ptr + offset, p);
          } else {
            multi_tensor_apply<1>(
                lists, UnscaleOp<scalar_t, true, Kind, /*kWrite=*/false>{},
                found_ptr, inv_ptr, part_ptr + offset, p);
          }
        });
    offset += count_blocks(list);
  }
  g.finish();
  at::Tensor out = at::empty({}, found_inf.options());
  finish_norm_kernel<Kind><<<1, kBlockSize, 0,
                             c10::cuda::getCurrentCUDAStream()>>>(
      part_ptr, blocks, norm_type, out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor norm_cuda(const char* op, at::TensorList grads,
                     const at::Tensor& found_inf, const at::Tensor& inv_scale,
                     double norm_type, bool in_place) {
  checks::check_unscale_args(op, grads, found_inf, &inv_scale,
                             c10::DeviceType::CUDA, /*read_only=*/!in_place);
  checks::check_norm_type(op, norm_type);
  c10::cuda::OptionalCUDAGuard guard(found_inf.device());
  return math::dispatch_norm_kind(math::norm_kind(norm_type), [&](auto kind) {
    return run<decltype(kind)::value>(grads, found_inf, inv_scale, norm_type,
                                      in_place);
  });
}

at::Tensor unscale_and_norm_cuda(at::TensorList grads,
                                 const at::Tensor& found_inf,
                                 const at::Tensor& inv_scale,
                                 double norm_type) {
  return norm_cuda("unscale_and_norm_", grads, found_inf, inv_scale, norm_type,
                   /*in_place=*/true);
}

at::Tensor check_finite_and_norm_cuda(at::TensorList grads,
                                      const at::Tensor& found_inf,
                                      const at::Tensor& inv_scale,
                                      double norm_type) {
  return norm_cuda("check_finite_and_norm_", grads, found_inf, inv_scale,
                   norm_type, /*in_place=*/false);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("unscale_and_norm_", &mixprec::cuda::unscale_and_norm_cuda);
  m.impl("check_finite_and_norm_",
         &mixprec::cuda::check_finite_and_norm_cuda);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  m.impl("unscale_and_norm_", &mixprec::cuda::unscale_and_norm_cuda);
  m.impl("check_finite_and_norm_",
         &mixprec::cuda::check_finite_and_norm_cuda);
}
