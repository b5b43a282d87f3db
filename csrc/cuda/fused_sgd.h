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

struct SgdKernelArgs : OptimKernelArgs {
  math::SgdConsts k;
};

// SGD's part of OptimOp (fused_optim.h): the momentum buffer when momentum
// != 0, not read on a param's first real step (step count 0), when the rule
// initialises it from the grad; torch.optim's update (math::sgd_update).
template <bool kMomentum>
struct SgdRule {
  using Args = SgdKernelArgs;
  struct Block {
    bool first;
    float neg_lr;
  };
  static constexpr int kDepth = SgdSlot::kDepth;
  static constexpr int kParam = SgdSlot::kParam;
  static constexpr int kGrad = SgdSlot::kGrad;
  static constexpr int kMaster = SgdSlot::kMaster;
  static constexpr int kStep = SgdSlot::kStep;
  static constexpr int kStates = 1;
  MIXPREC_HD static constexpr int state_slot(int) {
    return SgdSlot::kMomentumBuffer;
  }
  MIXPREC_HD static constexpr bool uses_state(int) { return kMomentum; }
  MIXPREC_HD static Block block(const Args& a, float step_before) {
    return Block{step_before == 0.0f,
                 static_cast<float>(-read_lr(a.lr, a.lr_double))};
  }
  MIXPREC_HD static bool loads_states(const Block& blk) { return !blk.first; }
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    math::sgd_update(w, g, x[0], a.k, blk.first, blk.neg_lr);
  }
};

template <typename P, typename G, bool kHasMaster, bool kMomentum>
using SgdOp = OptimOp<P, G, kHasMaster, SgdRule<kMomentum>>;

template <class Exec>
void fused_sgd_launch(const OpArgs<&fused_sgd_>& op_args) {
  MIXPREC_BIND(op_args, params, grads, momentum_buffers, master_params,
               state_steps, lr, weight_decay, momentum, dampening, nesterov,
               maximize, grad_scale, found_inf, clip_coef, stochastic_rounding,
               seed)
  // The plan's key (PlanCache, launch_plan.h): every list and the flags and
  // scalars that check_optim_args reads; the hyper-parameters are checked
  // every call.
  const bool has_mom = momentum != 0.0;
  static thread_local PlanCache<OptimPlan<SgdSlot::kDepth>> cache;
  auto visit = [&](auto& k) {
    return k.value(has_mom) && k.value(stochastic_rounding) && k.list(params) &&
           k.list(grads) && k.list(momentum_buffers) && k.list(master_params) &&
           k.list(state_steps) && k.scalar(lr) &&
           k.optional_scalar(grad_scale) && k.optional_scalar(found_inf) &&
           k.optional_scalar(clip_coef);
  };
  auto fill = [&](const optim::FlatSet& fs, size_t i,
                  void*(&a)[SgdSlot::kDepth]) {
    const std::vector<optim::TensorRefs>& v = fs.views;
    const int buf_view = fs.state_view[0];  // momentum_buffers (momentum != 0)
    void* p = v[0][i]->data_ptr();
    a[SgdSlot::kParam] = p;
    a[SgdSlot::kGrad] = v[1][i]->data_ptr();
    a[SgdSlot::kMomentumBuffer] =
        buf_view >= 0 ? v[buf_view][i]->data_ptr() : p;
    a[SgdSlot::kMaster] =
        fs.master_view >= 0 ? v[fs.master_view][i]->data_ptr() : p;
    a[SgdSlot::kStep] = state_steps[i].data_ptr();
  };
  auto make_args = [&] {
    SgdKernelArgs args;
    args.set_common(lr, grad_scale, found_inf, clip_coef, maximize, seed);
    args.k = math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
    return args;
  };
  launch_optim<Exec, SgdSlot::kDepth, SgdOp>(
      cache, visit,
      [&] { return optim::check_fused_sgd_args(op_args, Exec::kBackend); },
      [&] {
        optim::check_sgd_hparams(weight_decay, momentum, dampening, nesterov);
      },
      fill, make_args, params, master_params, state_steps, has_mom,
      stochastic_rounding);
}

}  // namespace cuda
}  // namespace mixprec
