// fused_adam_ and fused_adam8_ on CPU: one parallel pass over the chunks of
// every parameter, whatever the param/grad dtypes; the element loops
// (fused_optim_span_impl.h) are vectorized for the best ISA of this CPU, with a
// scalar tail running the same element math (common/optim_math.h).
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

// What fused_adam_cpu and fused_adam8_cpu share around their element loops:
// the call's scalars, each param's step constants, the parallel pass over the
// spans of `lists` (run(fs, span, span_args) calls the span kernel) and the
// step counts. Args: OpArgs of either op (arguments read by name).
template <class Args, class Run>
void adam_pass(const Args& args, const optim::OptimLists& lists, Run&& run,
               bool coded = false) {
  MIXPREC_BIND(args, params, state_steps, lr, beta1, beta2, weight_decay, eps,
               maximize, decoupled_weight_decay, grad_scale, found_inf,
               clip_coef, stochastic_rounding, seed)
  if (params.empty() || optim::found_inf_cpu(found_inf)) {
    return;
  }
  const double lr_v = optim::read_lr_cpu(lr);
  const math::GradCoefs gc = math::make_grad_coefs(
      optim::scalar_data(grad_scale), optim::scalar_data(clip_coef), maximize);
  const math::AdamConsts k = math::make_adam_consts(
      beta1, beta2, weight_decay, eps, decoupled_weight_decay);

  optim::FlatSet fs(lists);
  const size_t n = params.size();
  std::vector<float> step_after(n);
  std::vector<math::AdamStep> steps(n);
  for (size_t t = 0; t < n; ++t) {
    step_after[t] = state_steps[t].template mutable_data_ptr<float>()[0] + 1.0f;
    steps[t] = math::make_adam_step(lr_v, beta1, beta2, weight_decay,
                                    static_cast<double>(step_after[t]));
  }
  // 8-bit state: each param's elements per row (the blocks' layout)
  const std::vector<int64_t> rows =
      coded ? row_lengths(fs.views[0]) : std::vector<int64_t>();
  for_each_span(
      fs, stochastic_rounding, lists.sr_bases,
      [&](const ParamSpan& s) {
        const AdamSpanArgs a{
            gc,
            k,
            steps[s.t],
            s.sr,
            s.sr ? math::sr_key(static_cast<uint64_t>(seed),
                                static_cast<uint32_t>(step_after[s.t]),
                                s.sr_stream)
                 : 0u,
            s.sr_index_base};
        run(fs, s, a, coded ? rows[s.t] : 0);
      },
      coded ? &rows : nullptr);
  fs.finish();
  for (size_t t = 0; t < n; ++t) {
    state_steps[t].template mutable_data_ptr<float>()[0] = step_after[t];
  }
}

void fused_adam_cpu(const OpArgs<Op::fused_adam_>& args) {
  const SpanKernels& kernels = span_kernels();
  adam_pass(args, optim::check_fused_adam_args(args, DeviceType::CPU),
            [&](const optim::FlatSet& fs, const ParamSpan& s,
                const AdamSpanArgs& a, int64_t) {
              // exp_avgs, exp_avg_sqs, max_exp_avg_sqs (-1 without amsgrad)
              // and master_params (-1 without masters) in fs
              kernels.adam(s.param_dtype, s.grad_dtype, s.p, s.g,
                           s.f32(fs, fs.state_view[0]),
                           s.f32(fs, fs.state_view[1]),
                           s.f32(fs, fs.state_view[2]),
                           s.master(fs, fs.master_view), s.n, a);
            });
}

static_assert(kCpuChunk % q8::kBlock == 0,
              "every CPU chunk must start at an 8-bit state block");

// fused_adam8_: the moments as codes (fs.state_view) + maxima (the lists).
void fused_adam8_cpu(const OpArgs<Op::fused_adam8_>& args) {
  MIXPREC_BIND(args, exp_avg_absmax, exp_avg_sq_absmax)
  const SpanKernels& kernels = span_kernels();
  adam_pass(
      args, optim::check_fused_adam8_args(args, DeviceType::CPU),
      [&](const optim::FlatSet& fs, const ParamSpan& s, const AdamSpanArgs& a,
          int64_t row) {
        kernels.adam8(s.param_dtype, s.grad_dtype, s.p, s.g,
                      s.coded(fs, fs.state_view[0], exp_avg_absmax, row),
                      s.coded(fs, fs.state_view[1], exp_avg_sq_absmax, row),
                      s.master(fs, fs.master_view), s.n, a);
      },
      /*coded=*/true);
}

}  // namespace
}  // namespace cpu
}  // namespace mixprec

namespace {

void register_kernels(torch::stable::detail::StableLibrary& m) {
  MIXPREC_IMPL(m, fused_adam_, &mixprec::cpu::fused_adam_cpu);
  MIXPREC_IMPL(m, fused_adam8_, &mixprec::cpu::fused_adam8_cpu);
}

}  // namespace

MIXPREC_IMPL_DENSE_AND_SPARSE(CPU, register_kernels)
