// unscale_and_check_ and check_finite_ on CUDA: one multi-tensor-apply pass
// per dtype present in the list, 16-byte vector loads when a tensor is
// 16-byte aligned, no host sync.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cuda/unscale_kernel.cuh"

namespace mixprec {
namespace cuda {
namespace {

void run(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
         const at::Tensor* inv_scale) {
  checks::check_unscale_args(op, tensors, found_inf, inv_scale,
                             c10::DeviceType::CUDA);
  const bool unscale = inv_scale != nullptr;
  c10::cuda::OptionalCUDAGuard guard(found_inf.device());
  DtypeGroups g(tensors, unscale);
  float* found_ptr = found_inf.data_ptr<float>();
  const float* inv_ptr = unscale ? inv_scale->data_ptr<float>() : nullptr;
  for (auto& [dtype, list] : g.groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, dtype, "mixprec_unscale_cuda", [&] {
          const std::array<std::vector<at::Tensor>, 1> lists{list};
          if (unscale) {
            multi_tensor_apply<1>(lists, UnscaleOp<scalar_t, true, kNoNorm>{},
                                  found_ptr, inv_ptr, (double*)nullptr, 0.0f);
          } else {
            multi_tensor_apply<1>(lists, UnscaleOp<scalar_t, false, kNoNorm>{},
                                  found_ptr, inv_ptr, (double*)nullptr, 0.0f);
          }
        });
  }
  g.finish();
}

void unscale_and_check_cuda(at::TensorList grads, const at::Tensor& found_inf,
                            const at::Tensor& inv_scale) {
  run("unscale_and_check_", grads, found_inf, &inv_scale);
}

void check_finite_cuda(at::TensorList tensors, const at::Tensor& found_inf) {
  run("check_finite_", tensors, found_inf, nullptr);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("unscale_and_check_", &mixprec::cuda::unscale_and_check_cuda);
  m.impl("check_finite_", &mixprec::cuda::check_finite_cuda);
}

// Sparse tensors reach these kernels through the SparseCUDA key; the
// kernel's argument checks then reject them with a message naming the tensor.
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  m.impl("unscale_and_check_", &mixprec::cuda::unscale_and_check_cuda);
  m.impl("check_finite_", &mixprec::cuda::check_finite_cuda);
}
