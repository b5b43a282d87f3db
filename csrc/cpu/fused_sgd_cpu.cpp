// fused_sgd_ and fused_sgd8_ on CPU: one parallel pass over the chunks of every
// parameter; the element loops (fused_optim_span_impl.h) are vectorized for the
// best ISA of this CPU, with a scalar tail running the same element math
// (common/optim_math.h).
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

void fused_sgd_cpu(const OpArgs<&fused_sgd_>& args) {
  const optim::OptimLists lists =
      optim::check_fused_sgd_args(args, c10::DeviceType::CPU);
  MIXPREC_BIND(args, params, state_steps, lr, weight_decay, momentum, dampening,
               nesterov, maximize, grad_scale, found_inf, clip_coef,
               stochastic_rounding, seed)
  if (params.empty() || optim::found_inf_cpu(found_inf)) {
    return;
  }
  const double lr_v = optim::read_lr_cpu(lr);
  const math::GradCoefs gc = math::make_grad_coefs(
      optim::scalar_data(grad_scale), optim::scalar_data(clip_coef), maximize);
  const math::SgdConsts k =
      math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  const float neg_lr = static_cast<float>(-lr_v);

  optim::FlatSet fs(lists);
  // The lists of momentum_buffers (-1 without momentum) and master_params (-1
  // without masters) in fs.
  const int kBuf = fs.state_view[0];
  const int kMp = fs.master_view;

  const size_t n = params.size();
  std::vector<float> step_before(n);
  for (size_t t = 0; t < n; ++t) {
    step_before[t] = state_steps[t].data_ptr<float>()[0];
  }

  const SpanKernels& kernels = span_kernels();
  for_each_span(fs, stochastic_rounding, [&](const ParamSpan& s) {
    SgdSpanArgs a{
        gc,
        k,
        neg_lr,
        step_before[s.t] == 0.0f,
        s.sr,
        s.sr ? math::sr_key(static_cast<uint64_t>(seed),
                            static_cast<uint32_t>(step_before[s.t] + 1.0f),
                            s.sr_stream)
             : 0u,
        s.sr_index_base};
    kernels.sgd(s.param_dtype, s.grad_dtype, s.p, s.g, s.f32(fs, kBuf),
                s.f32(fs, kMp), s.n, a);
  });
  fs.finish();
  for (size_t t = 0; t < n; ++t) {
    state_steps[t].data_ptr<float>()[0] = step_before[t] + 1.0f;
  }
}

// fused_sgd8_: as fused_sgd_cpu, with the momentum buffer as codes + maxima.
void fused_sgd8_cpu(const OpArgs<&fused_sgd8_>& args) {
  const optim::OptimLists lists =
      optim::check_fused_sgd8_args(args, c10::DeviceType::CPU);
  MIXPREC_BIND(args, params, momentum_absmax, state_steps, lr, weight_decay,
               momentum, dampening, nesterov, maximize, grad_scale, found_inf,
               clip_coef, stochastic_rounding, seed)
  if (params.empty() || optim::found_inf_cpu(found_inf)) {
    return;
  }
  const double lr_v = optim::read_lr_cpu(lr);
  const math::GradCoefs gc = math::make_grad_coefs(
      optim::scalar_data(grad_scale), optim::scalar_data(clip_coef), maximize);
  const math::SgdConsts k =
      math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  const float neg_lr = static_cast<float>(-lr_v);

  optim::FlatSet fs(lists);
  const int kBuf = fs.state_view[0];  // momentum_buffers (codes)
  const int kMp = fs.master_view;

  const size_t n = params.size();
  std::vector<float> step_before(n);
  for (size_t t = 0; t < n; ++t) {
    step_before[t] = state_steps[t].data_ptr<float>()[0];
  }

  const SpanKernels& kernels = span_kernels();
  for_each_span(fs, stochastic_rounding, [&](const ParamSpan& s) {
    SgdSpanArgs a{
        gc,
        k,
        neg_lr,
        step_before[s.t] == 0.0f,
        s.sr,
        s.sr ? math::sr_key(static_cast<uint64_t>(seed),
                            static_cast<uint32_t>(step_before[s.t] + 1.0f),
                            s.sr_stream)
             : 0u,
        s.sr_index_base};
    kernels.sgd8(s.param_dtype, s.grad_dtype, s.p, s.g,
                 s.coded(fs, kBuf, momentum_absmax), s.f32(fs, kMp), s.n, a);
  });
  fs.finish();
  for (size_t t = 0; t < n; ++t) {
    state_steps[t].data_ptr<float>()[0] = step_before[t] + 1.0f;
  }
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  MIXPREC_IMPL(m, fused_sgd_, &mixprec::cpu::fused_sgd_cpu);
  MIXPREC_IMPL(m, fused_sgd8_, &mixprec::cpu::fused_sgd8_cpu);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
TORCH_LIBRARY_IMPL(mixprec, SparseCPU, m) {
  MIXPREC_IMPL(m, fused_sgd_, &mixprec::cpu::fused_sgd_cpu);
  MIXPREC_IMPL(m, fused_sgd8_, &mixprec::cpu::fused_sgd8_cpu);
}
