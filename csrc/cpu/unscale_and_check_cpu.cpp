// unscale_and_check_ and check_finite_ on CPU: one parallel pass over the
// chunks of all tensors, whatever their dtypes.
#include <torch/library.h>

#include "common/checks.h"
#include "cpu/multi_tensor_cpu.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace {

void run(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
         const at::Tensor* inv_scale) {
  checks::check_unscale_args(op, tensors, found_inf, inv_scale,
                             c10::DeviceType::CPU);
  const float inv = inv_scale != nullptr ? inv_scale->data_ptr<float>()[0] : 1.f;
  // Skip the write when inv_scale == 1: torch stores the value unchanged.
  const bool write = inv_scale != nullptr && inv != 1.0f;
  DenseTensors list(tensors, write);
  const SpanKernels& k = span_kernels();
  const bool found = list.work.any([&](const WorkItem& it) {
    return k.unscale_check(list.dtype[it.tensor], list.ptr(it),
                           it.end - it.begin, inv, write);
  });
  list.finish();
  if (found) {
    found_inf.data_ptr<float>()[0] = 1.0f;
  }
}

void unscale_and_check_cpu(at::TensorList grads, const at::Tensor& found_inf,
                           const at::Tensor& inv_scale) {
  run("unscale_and_check_", grads, found_inf, &inv_scale);
}

void check_finite_cpu(at::TensorList tensors, const at::Tensor& found_inf) {
  run("check_finite_", tensors, found_inf, nullptr);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("unscale_and_check_", &mixprec::cpu::unscale_and_check_cpu);
  m.impl("check_finite_", &mixprec::cpu::check_finite_cpu);
}

// Sparse tensors reach these kernels through the SparseCPU key; the
// kernel's argument checks then reject them with a message naming the tensor.
TORCH_LIBRARY_IMPL(mixprec, SparseCPU, m) {
  m.impl("unscale_and_check_", &mixprec::cpu::unscale_and_check_cpu);
  m.impl("check_finite_", &mixprec::cpu::check_finite_cpu);
}
