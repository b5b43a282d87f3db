// fused_adam_ on CPU: one parallel pass over the chunks of every parameter,
// whatever the param/grad dtypes; vectorized (at::vec) with a scalar tail
// that runs the same element math (common/optim_math.h).
#include <torch/library.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_dispatch.h"
#include "common/optim_math.h"
#include "cpu/fused_optim_cpu.h"

namespace mixprec {
namespace cpu {
namespace {

struct AdamSpanArgs {
  math::GradCoefs gc;
  math::AdamConsts k;
  math::AdamStep s;
  bool sr;
  uint32_t key;
  uint32_t index_base;  // SR index of element 0 of the span
};

// Updates elements [0, n) of one parameter's span. `master` is null without
// masters (the param is then the working copy), `vm` null without amsgrad.
template <typename P, typename G, bool kMaster, bool kAms>
void adam_span(P* p, const G* g, float* m, float* v, float* vm, float* master,
               int64_t n, const AdamSpanArgs& a) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    FVec w0, w1, g0, g1, m0, m1, v0, v1, x0, x1;
    if constexpr (kMaster) {
      load2(master + i, w0, w1);
    } else {
      load2(p + i, w0, w1);
    }
    load2(g + i, g0, g1);
    load2(m + i, m0, m1);
    load2(v + i, v0, v1);
    if constexpr (kAms) {
      load2(vm + i, x0, x1);
    }
    g0 = math::prepare_grad(g0, a.gc);
    g1 = math::prepare_grad(g1, a.gc);
    math::adam_update<kAms, VecOps>(w0, g0, m0, v0, x0, a.k, a.s);
    math::adam_update<kAms, VecOps>(w1, g1, m1, v1, x1, a.k, a.s);
    store2(m + i, m0, m1);
    store2(v + i, v0, v1);
    if constexpr (kAms) {
      store2(vm + i, x0, x1);
    }
    store_param(p, kMaster ? master : nullptr, i, w0, w1, a.sr, a.key,
                a.index_base);
  }
  for (; i < n; ++i) {
    float w = kMaster ? master[i] : static_cast<float>(p[i]);
    float gi = math::prepare_grad(static_cast<float>(g[i]), a.gc);
    float mi = m[i];
    float vi = v[i];
    float xi = kAms ? vm[i] : 0.0f;
    math::adam_update<kAms, math::ScalarOps>(w, gi, mi, vi, xi, a.k, a.s);
    m[i] = mi;
    v[i] = vi;
    if constexpr (kAms) {
      vm[i] = xi;
    }
    store_param_scalar(p, kMaster ? master : nullptr, i, w, a.sr, a.key,
                       a.index_base);
  }
}

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
    const int64_t len = it.end - it.begin;
    float* m = fs.views[2][t].data_ptr<float>() + b;
    float* v = fs.views[3][t].data_ptr<float>() + b;
    float* vm = kVm >= 0 ? fs.views[kVm][t].data_ptr<float>() + b : nullptr;
    float* mp = kMp >= 0 ? fs.views[kMp][t].data_ptr<float>() + b : nullptr;
    optim::dispatch_param_grad(
        pt.scalar_type(), gt.scalar_type(), [&](auto* ptag, auto* gtag) {
          using PT = std::remove_pointer_t<decltype(ptag)>;
          using GT = std::remove_pointer_t<decltype(gtag)>;
          PT* pp = static_cast<PT*>(pt.data_ptr()) + b;
          const GT* gp = static_cast<const GT*>(gt.data_ptr()) + b;
          auto go = [&](auto master_tag, auto ams_tag) {
            constexpr bool kM = decltype(master_tag)::value;
            constexpr bool kA = decltype(ams_tag)::value;
            if constexpr (kM && std::is_same_v<PT, float>) {
              TORCH_INTERNAL_ASSERT(false, "float32 params have no master");
            } else {
              adam_span<PT, GT, kM, kA>(pp, gp, m, v, vm, mp, len, a);
            }
          };
          using T = std::true_type;
          using F = std::false_type;
          if (mp != nullptr) {
            amsgrad ? go(T{}, T{}) : go(T{}, F{});
          } else {
            amsgrad ? go(F{}, T{}) : go(F{}, F{});
          }
        });
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
