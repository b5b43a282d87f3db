// fused_adam_ on CPU: one parallel pass over the chunks of every parameter,
// whatever the param/grad dtypes; the element loops (fused_optim_span_impl.h)
// are vectorized for the best ISA of this CPU, with a scalar tail running the
// same element math (common/optim_math.h).
#include <torch/library.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "cpu/fused_optim_cpu.h"

namespace mixprec {
namespace cpu {
namespace {

void fused_adam_cpu(at::TensorList params, at::TensorList grads,
                    at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                    at::TensorList max_exp_avg_sqs,
                    at::TensorList master_params, at::TensorList state_steps,
                    const at::Tensor& lr, double beta1, double beta2,
                    double weight_decay, double eps, bool amsgrad,
                    bool maximize, bool decoupled_weight_decay,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf,
                    const std::optional<at::Tensor>& clip_coef,
                    bool stochastic_rounding, int64_t seed) {
  const char* op = "fused_adam_";
  optim::OptimLists lists{params,
                          grads,
                          {{"exp_avgs", exp_avgs},
                           {"exp_avg_sqs", exp_avg_sqs},
                           {"max_exp_avg_sqs", max_exp_avg_sqs}},
                          master_params,
                          state_steps};
  optim::check_optim_args(op, lists, {true, true, amsgrad},
                          {&lr, &grad_scale, &found_inf, &clip_coef},
                          stochastic_rounding, c10::DeviceType::CPU);
  optim::check_adam_hparams(beta1, beta2, weight_decay, eps);
  if (params.empty()) {
    return;
  }
  // A step with an inf/NaN gradient changes nothing, the step count included.
  if (found_inf.has_value() && found_inf->data_ptr<float>()[0] != 0.0f) {
    return;
  }
  const double lr_v = optim::read_lr_cpu(lr);
  math::GradCoefs gc{1.0f, 1.0f, grad_scale.has_value(), clip_coef.has_value(),
                     maximize};
  if (gc.has_scale) {
    gc.inv_scale = math::reciprocal_scale(grad_scale->data_ptr<float>()[0]);
  }
  if (gc.has_clip) {
    gc.clip = clip_coef->data_ptr<float>()[0];
  }
  const math::AdamConsts k = math::make_adam_consts(
      beta1, beta2, weight_decay, eps, decoupled_weight_decay);
  const bool masters = !master_params.empty();

  std::vector<at::TensorList> flat_in{params, grads, exp_avgs, exp_avg_sqs};
  std::vector<bool> written{true, false, true, true};
  const int kVm = amsgrad ? static_cast<int>(flat_in.size()) : -1;
  if (amsgrad) {
    flat_in.push_back(max_exp_avg_sqs);
    written.push_back(true);
  }
  const int kMp = masters ? static_cast<int>(flat_in.size()) : -1;
  if (masters) {
    flat_in.push_back(master_params);
    written.push_back(true);
  }
  optim::FlatSet fs(flat_in, written);
  const auto& P = fs.views[0];

  const size_t n = params.size();
  std::vector<float> step_after(n);
  std::vector<math::AdamStep> steps(n);
  for (size_t t = 0; t < n; ++t) {
    step_after[t] = state_steps[t].data_ptr<float>()[0] + 1.0f;
    steps[t] = math::make_adam_step(lr_v, beta1, beta2, weight_decay,
                                    static_cast<double>(step_after[t]));
  }
  const std::vector<uint32_t> sr_base =
      stochastic_rounding ? sr_index_bases(P, fs.views[1])
                          : std::vector<uint32_t>(n, 0);

  const OptimSpanKernels& kernels = optim_span_kernels();
  ParamChunks chunks(P);
  chunks.run([&](const WorkItem& it) {
    const size_t t = static_cast<size_t>(it.tensor);
    const at::Tensor& pt = P[t];
    const at::Tensor& gt = fs.views[1][t];
    const bool sr = stochastic_rounding && pt.scalar_type() == at::kBFloat16;
    AdamSpanArgs a{gc,
                   k,
                   steps[t],
                   sr,
                   sr ? math::sr_key(static_cast<uint64_t>(seed),
                                     static_cast<uint32_t>(step_after[t]),
                                     static_cast<uint32_t>(gt.scalar_type()))
                      : 0u,
                   sr_base[t] + static_cast<uint32_t>(it.begin)};
    const int64_t b = it.begin;
    float* vm = kVm >= 0 ? fs.views[kVm][t].data_ptr<float>() + b : nullptr;
    float* mp = kMp >= 0 ? fs.views[kMp][t].data_ptr<float>() + b : nullptr;
    const int64_t psz = static_cast<int64_t>(pt.element_size());
    const int64_t gsz = static_cast<int64_t>(gt.element_size());
    kernels.adam(span_dtype(pt.scalar_type()), span_dtype(gt.scalar_type()),
                 static_cast<char*>(pt.data_ptr()) + b * psz,
                 static_cast<const char*>(gt.data_ptr()) + b * gsz,
                 fs.views[2][t].data_ptr<float>() + b,
                 fs.views[3][t].data_ptr<float>() + b, vm, mp,
                 it.end - it.begin, a);
  });
  fs.finish();
  for (size_t t = 0; t < n; ++t) {
    state_steps[t].data_ptr<float>()[0] = step_after[t];
  }
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("fused_adam_", &mixprec::cpu::fused_adam_cpu);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
TORCH_LIBRARY_IMPL(mixprec, SparseCPU, m) {
  m.impl("fused_adam_", &mixprec::cpu::fused_adam_cpu);
}
