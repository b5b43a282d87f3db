// fused_sgd_ and fused_sgd8_ on CPU: one parallel pass over the chunks of every
// parameter; the element loops (fused_optim_span_impl.h) are vectorized for the
// best ISA of this CPU, with a scalar tail running the same element math
// (common/optim_math.h).
#include <torch/csrc/stable/library.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "cpu/fused_optim_cpu.h"

namespace mixprec {
namespace cpu {
namespace {

// What fused_sgd_cpu and fused_sgd8_cpu share around their element loops
// (as adam_pass in fused_adam_cpu.cpp).
template <class Args, class Run>
void sgd_pass(const Args& args, const optim::OptimLists& lists, Run&& run,
              bool coded = false) {
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
  const size_t n = params.size();
  std::vector<float> step_before(n);
  for (size_t t = 0; t < n; ++t) {
    step_before[t] = state_steps[t].template mutable_data_ptr<float>()[0];
  }
  // 8-bit state: each param's elements per row (the blocks' layout)
  const std::vector<int64_t> rows =
      coded ? row_lengths(fs.views[0]) : std::vector<int64_t>();
  for_each_span(
      fs, stochastic_rounding, lists.sr_bases,
      [&](const ParamSpan& s) {
        const SgdSpanArgs a{
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
        run(fs, s, a, coded ? rows[s.t] : 0);
      },
      coded ? &rows : nullptr);
  fs.finish();
  for (size_t t = 0; t < n; ++t) {
    state_steps[t].template mutable_data_ptr<float>()[0] =
        step_before[t] + 1.0f;
  }
}

void fused_sgd_cpu(const OpArgs<Op::fused_sgd_>& args) {
  const SpanKernels& kernels = span_kernels();
  sgd_pass(args, optim::check_fused_sgd_args(args, DeviceType::CPU),
           [&](const optim::FlatSet& fs, const ParamSpan& s,
               const SgdSpanArgs& a, int64_t) {
             // momentum_buffers (-1 without momentum), master_params (-1
             // without masters) in fs
             kernels.sgd(s.param_dtype, s.grad_dtype, s.p, s.g,
                         s.f32(fs, fs.state_view[0]),
                         s.master(fs, fs.master_view), s.n, a);
           });
}

// fused_sgd8_: the momentum buffer as codes + maxima.
void fused_sgd8_cpu(const OpArgs<Op::fused_sgd8_>& args) {
  MIXPREC_BIND(args, momentum_absmax)
  const SpanKernels& kernels = span_kernels();
  sgd_pass(
      args, optim::check_fused_sgd8_args(args, DeviceType::CPU),
      [&](const optim::FlatSet& fs, const ParamSpan& s, const SgdSpanArgs& a,
          int64_t row) {
        kernels.sgd8(s.param_dtype, s.grad_dtype, s.p, s.g,
                     s.coded(fs, fs.state_view[0], momentum_absmax, row),
                     s.master(fs, fs.master_view), s.n, a);
      },
      /*coded=*/true);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, fused_sgd_, &mixprec::cpu::fused_sgd_cpu);
  MIXPREC_IMPL(m, fused_sgd8_, &mixprec::cpu::fused_sgd8_cpu);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CPU, register_kernels)
