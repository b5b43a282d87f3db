// unscale_and_norm_ and check_finite_and_norm_ on CPU: inf/NaN check + total
// p-norm of the unscaled values (+ the in-place unscale for the former) in one
// parallel pass. Per-chunk partials are combined in a fixed order, so the
// result does not depend on the thread count.
#include "common/tensor.h"
#include <torch/csrc/stable/library.h>

#include "common/checks.h"
#include "common/norm_math.h"
#include "op_table.h"
#include "cpu/multi_tensor_cpu.h"
#include "cpu/span_kernels.h"

namespace mixprec {
namespace cpu {
namespace {

template <int Kind>
Tensor run(TensorList grads, const Tensor& found_inf, float inv,
           double norm_type, bool in_place) {
  const bool write = in_place && inv != 1.0f;
  DenseTensors list(grads, write);
  std::vector<double> partials(list.work.items.size(), 0.0);
  const SpanKernels& k = span_kernels();
  const bool found = list.work.any([&](const WorkItem& it) {
    const SpanNorm r = k.unscale_norm(list.dtype[it.tensor], Kind, list.ptr(it),
                                      it.end - it.begin, inv, write, norm_type);
    partials[list.work.index(it)] = r.partial;
    return r.found;
  });
  list.finish();
  if (found) {
    found_inf.mutable_data_ptr<float>()[0] = 1.0f;
  }
  double total = 0.0;
  for (double x : partials) {
    total = math::combine<Kind, double>(total, x);
  }
  const double norm = math::finish<Kind, double>(total, norm_type);
  Tensor out = new_scalar(found_inf);
  out.mutable_data_ptr<float>()[0] = static_cast<float>(norm);
  return out;
}

Tensor norm_cpu(const char* op, TensorList grads, const Tensor& found_inf,
                const Tensor& inv_scale, double norm_type, bool in_place) {
  checks::check_unscale_args(op, grads, found_inf, &inv_scale, DeviceType::CPU,
                             /*read_only=*/!in_place);
  checks::check_norm_type(op, norm_type);
  const float inv = inv_scale.mutable_data_ptr<float>()[0];
  return math::dispatch_norm_kind(math::norm_kind(norm_type), [&](auto kind) {
    return run<decltype(kind)::value>(grads, found_inf, inv, norm_type,
                                      in_place);
  });
}

Tensor unscale_and_norm_cpu(const OpArgs<Op::unscale_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_cpu("unscale_and_norm_", grads, found_inf, inv_scale, norm_type,
                  /*in_place=*/true);
}

Tensor check_finite_and_norm_cpu(const OpArgs<Op::check_finite_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_cpu("check_finite_and_norm_", grads, found_inf, inv_scale,
                  norm_type, /*in_place=*/false);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, unscale_and_norm_, &mixprec::cpu::unscale_and_norm_cpu);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &mixprec::cpu::check_finite_and_norm_cpu);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CPU, register_kernels)
