// fused_sgd_ on CPU: one parallel pass over the chunks of every parameter,
// vectorized with a scalar tail running the same element math
// (common/optim_math.h).
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

struct SgdSpanArgs {
  math::GradCoefs gc;
  math::SgdConsts k;
  float neg_lr;
  bool first;
  bool sr;
  uint32_t key;
  uint32_t index_base;
};

template <typename P, typename G, bool kMaster, bool kMom>
void sgd_span(P* p, const G* g, float* buf, float* master, int64_t n,
              const SgdSpanArgs& a) {
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    FVec w0, w1, g0, g1, b0, b1;
    if constexpr (kMaster) {
      load2(master + i, w0, w1);
    } else {
      load2(p + i, w0, w1);
    }
    load2(g + i, g0, g1);
    if constexpr (kMom) {
      if (!a.first) {
        load2(buf + i, b0, b1);
      }
    }
    g0 = math::prepare_grad(g0, a.gc);
    g1 = math::prepare_grad(g1, a.gc);
    math::sgd_update(w0, g0, b0, a.k, a.first, a.neg_lr);
    math::sgd_update(w1, g1, b1, a.k, a.first, a.neg_lr);
    if constexpr (kMom) {
      store2(buf + i, b0, b1);
    }
    store_param(p, kMaster ? master : nullptr, i, w0, w1, a.sr, a.key,
                a.index_base);
  }
  for (; i < n; ++i) {
    float w = kMaster ? master[i] : static_cast<float>(p[i]);
    const float gi = math::prepare_grad(static_cast<float>(g[i]), a.gc);
    float bi = (kMom && !a.first) ? buf[i] : 0.0f;
    math::sgd_update(w, gi, bi, a.k, a.first, a.neg_lr);
    if constexpr (kMom) {
      buf[i] = bi;
    }
    store_param_scalar(p, kMaster ? master : nullptr, i, w, a.sr, a.key,
                       a.index_base);
  }
}

void fused_sgd_cpu(at::TensorList params, at::TensorList grads,
                   at::TensorList momentum_buffers,
                   at::TensorList master_params, at::TensorList state_steps,
                   const at::Tensor& lr, double weight_decay, double momentum,
                   double dampening, bool nesterov, bool maximize,
                   const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef,
                   bool stochastic_rounding, int64_t seed) {
  const char* op = "fused_sgd_";
  const bool has_mom = momentum != 0.0;
  optim::OptimLists lists{params,
                          grads,
                          {{"momentum_buffers", momentum_buffers}},
                          master_params,
                          state_steps};
  optim::check_optim_args(op, lists, {has_mom},
                          {&lr, &grad_scale, &found_inf, &clip_coef},
                          stochastic_rounding, c10::DeviceType::CPU);
  optim::check_sgd_hparams(weight_decay, momentum, dampening, nesterov);
  if (params.empty()) {
    return;
  }
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
  const math::SgdConsts k =
      math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  const float neg_lr = static_cast<float>(-lr_v);
  const bool masters = !master_params.empty();

  std::vector<at::TensorList> flat_in{params, grads};
  std::vector<bool> written{true, false};
  const int kBuf = has_mom ? static_cast<int>(flat_in.size()) : -1;
  if (has_mom) {
    flat_in.push_back(momentum_buffers);
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
  std::vector<float> step_before(n);
  for (size_t t = 0; t < n; ++t) {
    step_before[t] = state_steps[t].data_ptr<float>()[0];
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
    SgdSpanArgs a{gc,
                  k,
                  neg_lr,
                  step_before[t] == 0.0f,
                  sr,
                  sr ? math::sr_key(static_cast<uint64_t>(seed),
                                    static_cast<uint32_t>(step_before[t] + 1.0f),
                                    static_cast<uint32_t>(gt.scalar_type()))
                     : 0u,
                  sr_base[t] + static_cast<uint32_t>(it.begin)};
    const int64_t b = it.begin;
    const int64_t len = it.end - it.begin;
    float* buf = kBuf >= 0 ? fs.views[kBuf][t].data_ptr<float>() + b : nullptr;
    float* mp = kMp >= 0 ? fs.views[kMp][t].data_ptr<float>() + b : nullptr;
    optim::dispatch_param_grad(
        pt.scalar_type(), gt.scalar_type(), [&](auto* ptag, auto* gtag) {
          using PT = std::remove_pointer_t<decltype(ptag)>;
          using GT = std::remove_pointer_t<decltype(gtag)>;
          PT* pp = static_cast<PT*>(pt.data_ptr()) + b;
          const GT* gp = static_cast<const GT*>(gt.data_ptr()) + b;
          auto go = [&](auto master_tag, auto mom_tag) {
            constexpr bool kM = decltype(master_tag)::value;
            constexpr bool kB = decltype(mom_tag)::value;
            if constexpr (kM && std::is_same_v<PT, float>) {
              TORCH_INTERNAL_ASSERT(false, "float32 params have no master");
            } else {
              sgd_span<PT, GT, kM, kB>(pp, gp, buf, mp, len, a);
            }
          };
          using T = std::true_type;
          using F = std::false_type;
          if (mp != nullptr) {
            buf != nullptr ? go(T{}, T{}) : go(T{}, F{});
          } else {
            buf != nullptr ? go(F{}, T{}) : go(F{}, F{});
          }
        });
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
  m.impl("fused_sgd_", &mixprec::cpu::fused_sgd_cpu);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
TORCH_LIBRARY_IMPL(mixprec, SparseCPU, m) {
  m.impl("fused_sgd_", &mixprec::cpu::fused_sgd_cpu);
}
