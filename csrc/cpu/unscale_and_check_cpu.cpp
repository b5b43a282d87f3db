// unscale_and_check_ and check_finite_ on CPU: one parallel pass over the
// chunks of all tensors, whatever their dtypes.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cpu/multi_tensor_cpu.h"
#include "cpu/nonfinite_kernel_cpu.h"

namespace mixprec {
namespace cpu {
namespace {

bool run_span(const at::Tensor& t, const WorkItem& item, float inv_scale,
              bool write) {
  bool found = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, t.scalar_type(), "mixprec_unscale_cpu", [&] {
        scalar_t* base = static_cast<scalar_t*>(t.data_ptr());
        found = unscale_check_span<scalar_t>(base + item.begin,
                                             item.end - item.begin, inv_scale,
                                             write);
      });
  return found;
}

void run(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
         const at::Tensor* inv_scale) {
  TORCH_CHECK(found_inf.defined() && found_inf.is_cpu(), "mixprec.", op,
              ": found_inf must be a CPU tensor here, got ",
              found_inf.defined() ? found_inf.device().str() : "undefined");
  const c10::Device device = found_inf.device();
  checks::check_state_tensor(op, "found_inf", found_inf, at::kFloat, device);
  float inv = 1.0f;
  if (inv_scale != nullptr) {
    checks::check_state_tensor(op, "inv_scale", *inv_scale, at::kFloat,
                               device);
    inv = inv_scale->data_ptr<float>()[0];
  }
  checks::check_grad_list(op, inv_scale ? "grads" : "tensors", tensors,
                          device, inv_scale != nullptr);

  // Skip the write when inv_scale == 1: torch stores the value unchanged.
  const bool write = inv_scale != nullptr && inv != 1.0f;
  DenseList list(tensors, write);
  const bool found = parallel_any(list.items, list.total, [&](const WorkItem& it) {
    return run_span(list.dense[it.tensor], it, inv, write);
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
