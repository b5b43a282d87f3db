// fused_sgd_ for the CUDA backend: the block functor and the launcher,
// templated on the executor (DeviceExec in fused_sgd_cuda.cu,
// cuda_emulation::HostExec in CI). One plan per (param dtype, grad dtype)
// group, then the step-count increment; found_inf, lr, grad_scale and
// clip_coef are read on the device (no host sync, graph-capturable).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "cuda/fused_optim.h"

namespace mixprec {
namespace cuda {

// The lists of TensorListMeta, by slot; scoped for the reason given at
// AdamSlot (fused_adam.h). Unused slots (buffer without momentum, master
// without masters) hold the param's address and are never dereferenced.
struct SgdSlot {
  enum : int { kParam = 0, kGrad, kMomentumBuffer, kMaster, kStep, kDepth };
};

struct SgdKernelArgs {
  const float* found_inf;
  const float* grad_scale;
  const float* clip_coef;
  const void* lr;
  bool lr_double;
  bool maximize;
  math::SgdConsts k;
  bool sr;
  uint64_t seed;
  uint32_t stream;
};

template <typename P, typename G, bool kHasMaster, bool kMomentum>
struct SgdOp {
  using Meta = TensorListMeta<SgdSlot::kDepth>;

  MIXPREC_HD void operator()(const Meta& meta, GridPos pos,
                             const SgdKernelArgs& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return;
    }
    const BlockSpan s = block_span(meta, pos.block);
    const int t = s.tensor;
    auto list = [&](int slot) { return meta.addresses[slot][t]; };
    P* p = static_cast<P*>(list(SgdSlot::kParam)) + s.start;
    const G* g = static_cast<const G*>(list(SgdSlot::kGrad)) + s.start;
    float* buf = nullptr;
    if constexpr (kMomentum) {
      buf = static_cast<float*>(list(SgdSlot::kMomentumBuffer)) + s.start;
    }
    float* mp = nullptr;
    if constexpr (kHasMaster) {
      mp = static_cast<float*>(list(SgdSlot::kMaster)) + s.start;
    }
    const float step_before = *static_cast<const float*>(list(SgdSlot::kStep));
    const bool first = step_before == 0.0f;
    const float neg_lr = static_cast<float>(-read_lr(a.lr, a.lr_double));
    const math::GradCoefs gc =
        math::make_grad_coefs(a.grad_scale, a.clip_coef, a.maximize);
    uint32_t key = 0;
    uint32_t base = 0;
    if (a.sr) {
      key = math::sr_key(a.seed, static_cast<uint32_t>(step_before + 1.0f),
                         a.stream);
      base = sr_block_base(meta, pos);
    }

    int64_t nvec = 0;
    const bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) &&
                         (!kMomentum || vec_aligned<float>(buf)) &&
                         (!kHasMaster || vec_aligned<float>(mp));
    if (aligned) {
      nvec = s.length / kOptVec;
      for (int64_t vi = pos.thread; vi < nvec; vi += pos.threads) {
        float w[kOptVec], gr[kOptVec], br[kOptVec] = {};
        if constexpr (kHasMaster) {
          load_vec(mp, vi, w);
        } else {
          load_vec(p, vi, w);
        }
        load_vec(g, vi, gr);
        if constexpr (kMomentum) {
          if (!first) {
            load_vec(buf, vi, br);
          }
        }
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          math::sgd_update(w[k], math::prepare_grad(gr[k], gc), br[k], a.k,
                           first, neg_lr);
        }
        if constexpr (kMomentum) {
          store_vec(buf, vi, br);
        }
        if constexpr (kHasMaster) {
          store_vec(mp, vi, w);
        }
        AlignedVector<P, kOptVec> out;
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          out.val[k] = round_param<P>(w[k], a.sr, key,
                                      base + static_cast<uint32_t>(vi * kOptVec + k));
        }
        reinterpret_cast<AlignedVector<P, kOptVec>*>(p)[vi] = out;
      }
    }
    for (int64_t i = nvec * kOptVec + pos.thread; i < s.length;
         i += pos.threads) {
      float w;
      if constexpr (kHasMaster) {
        w = mp[i];
      } else {
        w = static_cast<float>(p[i]);
      }
      float bi = 0.0f;
      if constexpr (kMomentum) {
        bi = first ? 0.0f : buf[i];
      }
      math::sgd_update(w, math::prepare_grad(static_cast<float>(g[i]), gc), bi,
                       a.k, first, neg_lr);
      if constexpr (kMomentum) {
        buf[i] = bi;
      }
      if constexpr (kHasMaster) {
        mp[i] = w;
      }
      p[i] = round_param<P>(w, a.sr, key, base + static_cast<uint32_t>(i));
    }
  }
};

template <class Exec>
void fused_sgd_launch(at::TensorList params, at::TensorList grads,
                    at::TensorList momentum_buffers,
                    at::TensorList master_params, at::TensorList state_steps,
                    const at::Tensor& lr, double weight_decay, double momentum,
                    double dampening, bool nesterov, bool maximize,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf,
                    const std::optional<at::Tensor>& clip_coef,
                    bool stochastic_rounding, int64_t seed) {
  const optim::OptimLists lists = optim::check_fused_sgd_args(
      params, grads, momentum_buffers, master_params, state_steps, lr,
      weight_decay, momentum, dampening, nesterov, grad_scale, found_inf,
      clip_coef, stochastic_rounding, Exec::kBackend);
  if (params.empty()) {
    return;
  }
  typename Exec::Guard guard(params[0].device());
  const bool masters = !master_params.empty();
  const bool has_mom = momentum != 0.0;

  optim::FlatSet fs(lists);
  const int buf_view = fs.state_view[0];  // momentum_buffers (momentum != 0)
  const int master_view = fs.master_view;

  SgdKernelArgs args;
  args.found_inf = optim::scalar_data(found_inf);
  args.grad_scale = optim::scalar_data(grad_scale);
  args.clip_coef = optim::scalar_data(clip_coef);
  args.lr = lr.data_ptr();
  args.lr_double = lr.scalar_type() == at::kDouble;
  args.maximize = maximize;
  args.k = math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  args.seed = static_cast<uint64_t>(seed);

  apply_by_dtypes<Exec, SgdSlot::kDepth, SgdOp>(
      fs, masters, has_mom, stochastic_rounding, args,
      [&](size_t i, void* (&a)[SgdSlot::kDepth]) {
        void* p = fs.views[0][i]->data_ptr();
        a[SgdSlot::kParam] = p;
        a[SgdSlot::kGrad] = fs.views[1][i]->data_ptr();
        a[SgdSlot::kMomentumBuffer] = buf_view >= 0 ? fs.views[buf_view][i]->data_ptr() : p;
        a[SgdSlot::kMaster] = master_view >= 0 ? fs.views[master_view][i]->data_ptr() : p;
        a[SgdSlot::kStep] = state_steps[i].data_ptr();
      });
  fs.finish();
  increment_steps<Exec>(state_steps, args.found_inf);
}

}  // namespace cuda
}  // namespace mixprec
