// fused_adam_ for the CUDA backend: the block functor and the launcher,
// templated on the executor (DeviceExec in fused_adam_cuda.cu,
// cuda_emulation::HostExec in CI). One plan per (param dtype, grad dtype)
// group, then one block that increments the step counts. Every block reads
// found_inf on the device and does nothing when it is set, so the step needs
// no host sync and can be captured in a CUDA graph.
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

// The lists of TensorListMeta, by slot. Scoped (AdamSlot::kMaster), so that
// no template parameter or local name can shadow a slot: an unscoped enum
// once let the functor's `bool kMaster` parameter stand for slot 1 (the
// grads) and the master weights were read from, and written into, the grad
// buffer. Unused slots (max_exp_avg_sq without amsgrad, master without
// masters) hold the param's address and are never dereferenced.
struct AdamSlot {
  enum : int {
    kParam = 0,
    kGrad,
    kExpAvg,
    kExpAvgSq,
    kMaxExpAvgSq,
    kMaster,
    kStep,
    kDepth
  };
};

struct AdamKernelArgs {
  const float* found_inf;   // may be null
  const float* grad_scale;  // may be null
  const float* clip_coef;   // may be null
  const void* lr;           // float or double, one element
  bool lr_double;
  bool maximize;
  math::AdamConsts k;
  double beta1;
  double beta2;
  double weight_decay;
  bool sr;
  uint64_t seed;
  uint32_t stream;  // SR stream: the grad dtype's code
};

template <typename P, typename G, bool kHasMaster, bool kAmsgrad>
struct AdamOp {
  using Meta = TensorListMeta<AdamSlot::kDepth>;

  MIXPREC_HD void operator()(const Meta& meta, GridPos pos,
                             const AdamKernelArgs& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return;
    }
    const BlockSpan s = block_span(meta, pos.block);
    const int t = s.tensor;
    auto list = [&](int slot) { return meta.addresses[slot][t]; };
    P* p = static_cast<P*>(list(AdamSlot::kParam)) + s.start;
    const G* g = static_cast<const G*>(list(AdamSlot::kGrad)) + s.start;
    float* m = static_cast<float*>(list(AdamSlot::kExpAvg)) + s.start;
    float* v = static_cast<float*>(list(AdamSlot::kExpAvgSq)) + s.start;
    float* vm = nullptr;
    if constexpr (kAmsgrad) {
      vm = static_cast<float*>(list(AdamSlot::kMaxExpAvgSq)) + s.start;
    }
    float* mp = nullptr;
    if constexpr (kHasMaster) {
      mp = static_cast<float*>(list(AdamSlot::kMaster)) + s.start;
    }
    const float step = *static_cast<const float*>(list(AdamSlot::kStep)) + 1.0f;
    const math::AdamStep st = math::make_adam_step(
        read_lr(a.lr, a.lr_double), a.beta1, a.beta2, a.weight_decay, step);
    const math::GradCoefs gc =
        math::make_grad_coefs(a.grad_scale, a.clip_coef, a.maximize);
    uint32_t key = 0;
    uint32_t base = 0;
    if (a.sr) {
      key = math::sr_key(a.seed, static_cast<uint32_t>(step), a.stream);
      base = sr_block_base(meta, pos);
    }

    auto update = [&](float& w, float gi, float& mi, float& vi, float& xi) {
      gi = math::prepare_grad(gi, gc);
      math::adam_update<kAmsgrad, math::ScalarOps>(w, gi, mi, vi, xi, a.k, st);
    };

    int64_t nvec = 0;
    const bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) &&
                         vec_aligned<float>(m) && vec_aligned<float>(v) &&
                         (!kAmsgrad || vec_aligned<float>(vm)) &&
                         (!kHasMaster || vec_aligned<float>(mp));
    if (aligned) {
      nvec = s.length / kOptVec;
      for (int64_t vi = pos.thread; vi < nvec; vi += pos.threads) {
        float w[kOptVec], gr[kOptVec], mr[kOptVec], vr[kOptVec], xr[kOptVec];
        if constexpr (kHasMaster) {
          load_vec(mp, vi, w);
        } else {
          load_vec(p, vi, w);
        }
        load_vec(g, vi, gr);
        load_vec(m, vi, mr);
        load_vec(v, vi, vr);
        if constexpr (kAmsgrad) {
          load_vec(vm, vi, xr);
        }
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          update(w[k], gr[k], mr[k], vr[k], xr[k]);
        }
        store_vec(m, vi, mr);
        store_vec(v, vi, vr);
        if constexpr (kAmsgrad) {
          store_vec(vm, vi, xr);
        }
        if constexpr (kHasMaster) {
          store_vec(mp, vi, w);
        }
        AlignedVector<P, kOptVec> out;
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          out.val[k] = round_param<P>(
              w[k], a.sr, key, base + static_cast<uint32_t>(vi * kOptVec + k));
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
      float mi = m[i];
      float vi = v[i];
      float xi = 0.0f;
      if constexpr (kAmsgrad) {
        xi = vm[i];
      }
      update(w, static_cast<float>(g[i]), mi, vi, xi);
      m[i] = mi;
      v[i] = vi;
      if constexpr (kAmsgrad) {
        vm[i] = xi;
      }
      if constexpr (kHasMaster) {
        mp[i] = w;
      }
      p[i] = round_param<P>(w, a.sr, key, base + static_cast<uint32_t>(i));
    }
  }
};

template <class Exec>
void fused_adam_launch(at::TensorList params, at::TensorList grads,
                       at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                       at::TensorList max_exp_avg_sqs,
                       at::TensorList master_params,
                       at::TensorList state_steps, const at::Tensor& lr,
                       double beta1, double beta2, double weight_decay,
                       double eps, bool amsgrad, bool maximize,
                       bool decoupled_weight_decay,
                       const std::optional<at::Tensor>& grad_scale,
                       const std::optional<at::Tensor>& found_inf,
                       const std::optional<at::Tensor>& clip_coef,
                       bool stochastic_rounding, int64_t seed) {
  const optim::OptimLists lists = optim::check_fused_adam_args(
      params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params,
      state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, grad_scale,
      found_inf, clip_coef, stochastic_rounding, Exec::kBackend);
  if (params.empty()) {
    return;
  }
  typename Exec::Guard guard(params[0].device());
  const bool masters = !master_params.empty();

  optim::FlatSet fs(lists);
  const int vm_view = fs.state_view[2];  // max_exp_avg_sqs (amsgrad)
  const int master_view = fs.master_view;

  AdamKernelArgs args;
  args.found_inf = optim::scalar_data(found_inf);
  args.grad_scale = optim::scalar_data(grad_scale);
  args.clip_coef = optim::scalar_data(clip_coef);
  args.lr = lr.data_ptr();
  args.lr_double = lr.scalar_type() == at::kDouble;
  args.maximize = maximize;
  args.k = math::make_adam_consts(beta1, beta2, weight_decay, eps,
                                  decoupled_weight_decay);
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.weight_decay = weight_decay;
  args.seed = static_cast<uint64_t>(seed);

  apply_by_dtypes<Exec, AdamSlot::kDepth, AdamOp>(
      fs, masters, amsgrad, stochastic_rounding, args,
      [&](size_t i, void* (&a)[AdamSlot::kDepth]) {
        void* p = fs.views[0][i]->data_ptr();
        a[AdamSlot::kParam] = p;
        a[AdamSlot::kGrad] = fs.views[1][i]->data_ptr();
        a[AdamSlot::kExpAvg] = fs.views[fs.state_view[0]][i]->data_ptr();
        a[AdamSlot::kExpAvgSq] = fs.views[fs.state_view[1]][i]->data_ptr();
        a[AdamSlot::kMaxExpAvgSq] = vm_view >= 0 ? fs.views[vm_view][i]->data_ptr() : p;
        a[AdamSlot::kMaster] = master_view >= 0 ? fs.views[master_view][i]->data_ptr() : p;
        a[AdamSlot::kStep] = state_steps[i].data_ptr();
      });
  fs.finish();
  increment_steps<Exec>(state_steps, args.found_inf);
}

}  // namespace cuda
}  // namespace mixprec
