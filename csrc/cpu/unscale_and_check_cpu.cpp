// unscale_and_check_ and check_finite_ on CPU: one parallel pass over the
// chunks of all tensors, whatever their dtypes.
#include <torch/csrc/stable/library.h>

#include "common/checks.h"
#include "op_table.h"
#include "cpu/multi_tensor_cpu.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace {

void run(const char* op, TensorList tensors, const Tensor& found_inf,
         const Tensor* inv_scale) {
  checks::check_unscale_args(op, tensors, found_inf, inv_scale,
                             DeviceType::CPU);
  const float inv =
      inv_scale != nullptr ? inv_scale->mutable_data_ptr<float>()[0] : 1.f;
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
    found_inf.mutable_data_ptr<float>()[0] = 1.0f;
  }
}

void unscale_and_check_cpu(const OpArgs<Op::unscale_and_check_>& a) {
  run("unscale_and_check_", MIXPREC_ARG(a, grads), MIXPREC_ARG(a, found_inf),
      &MIXPREC_ARG(a, inv_scale));
}

void check_finite_cpu(const OpArgs<Op::check_finite_>& a) {
  run("check_finite_", MIXPREC_ARG(a, tensors), MIXPREC_ARG(a, found_inf),
      nullptr);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, unscale_and_check_, &mixprec::cpu::unscale_and_check_cpu);
  MIXPREC_IMPL(m, check_finite_, &mixprec::cpu::check_finite_cpu);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CPU, register_kernels)
