// fused_sgd_ and fused_sgd8_ for the CUDA backend: the block functors and
// the launchers,
// templated on the executor (DeviceExec in fused_sgd_cuda.cu,
// cuda_emulation::HostExec in CI). One plan per (param dtype, grad dtype)
// group, then the step-count increment; found_inf, lr, grad_scale and
// clip_coef are read on the device (no host sync, graph-capturable).
#pragma once

#include "common/tensor.h"

#include <array>
#include <optional>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "cuda/fused_optim.h"
#include "cuda/fused_optim8.h"

namespace mixprec {
namespace cuda {

// The lists of TensorListMeta, by slot; scoped for the reason given at
// AdamSlot (fused_adam.h). Unused slots (buffer without momentum, master
// without masters) hold the param's address and are never dereferenced.
struct SgdSlot {
  enum : int {
    kParam = 0,
    kGrad,
    kMomentumBuffer,
    kMaster,
    kStep,
    kSrBase,  // (an integer: the SR number of element 0)
    kDepth
  };
};

struct SgdKernelArgs : OptimKernelArgs {
  math::SgdConsts k;
};

// SGD's part of OptimOp (fused_optim.h): the momentum buffer when momentum
// != 0, not read on a param's first real step (step count 0), when the rule
// initialises it from the grad; torch.optim's update (math::sgd_update).
template <bool kMomentum>
struct SgdRule : RuleSlots<SgdSlot, 1> {
  using Args = SgdKernelArgs;
  struct Block {
    bool first;
    float neg_lr;
  };
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

template <typename P, typename G, typename M, bool kMomentum>
using SgdOp = OptimOp<P, G, M, SgdRule<kMomentum>>;

// The kernel arguments of fused_sgd_ or fused_sgd8_ (read by name; host).
template <class A>
SgdKernelArgs sgd_kernel_args(const A& op_args) {
  MIXPREC_BIND(op_args, lr, weight_decay, momentum, dampening, nesterov,
               maximize, grad_scale, found_inf, clip_coef, seed)
  SgdKernelArgs args;
  args.set_common(lr, grad_scale, found_inf, clip_coef, maximize, seed);
  args.k = math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  return args;
}

template <class Exec>
void fused_sgd_launch(const OpArgs<Op::fused_sgd_>& op_args) {
  MIXPREC_BIND(op_args, state_steps, weight_decay, momentum, dampening,
               nesterov, stochastic_rounding)
  const bool has_mom = momentum != 0.0;
  auto fill = [&](const FlatRows& fs, const Tensor* const* v, size_t i,
                  void*(&a)[SgdSlot::kDepth]) {
    const int buf_view = fs.state_view[0];  // momentum_buffers (momentum != 0)
    void* p = v[0]->data_ptr();
    a[SgdSlot::kParam] = p;
    a[SgdSlot::kGrad] = v[1]->data_ptr();
    a[SgdSlot::kMomentumBuffer] = buf_view >= 0 ? v[buf_view]->data_ptr() : p;
    a[SgdSlot::kMaster] =
        fs.master_view >= 0 ? v[fs.master_view]->data_ptr() : p;
    a[SgdSlot::kStep] = state_steps[i].data_ptr();
  };
  auto make_args = [&] { return sgd_kernel_args(op_args); };
  launch_optim<Exec, SgdSlot::kDepth, SgdOp>(
      optim::check_fused_sgd_args(op_args, Exec::kBackend,
                                  /*each_param=*/false),
      [&] {
        optim::check_sgd_hparams(weight_decay, momentum, dampening, nesterov);
      },
      fill, make_args, has_mom, stochastic_rounding,
      /*row_slot=*/-1, SgdSlot::kSrBase);
}

// fused_sgd8_'s slots: the momentum buffer as codes and maxima.
struct Sgd8Slot {
  enum : int {
    kParam = 0,
    kGrad,
    kMomentumBuffer,
    kMomentumAbsmax,
    kMaster,
    kStep,
    kRow,     // (an integer: elements per row of the state)
    kSrBase,  // (an integer: the SR number of element 0)
    kDepth
  };
};

// SGD's part of Optim8Op (fused_optim8.h): the momentum buffer (signed
// codes), SgdRule's update with momentum.
struct Sgd8Rule : RuleSlots8<Sgd8Slot, 1> {
  using Args = SgdKernelArgs;
  using Block = SgdRule<true>::Block;
  MIXPREC_HD static constexpr int codes_slot(int) {
    return Sgd8Slot::kMomentumBuffer;
  }
  MIXPREC_HD static constexpr int absmax_slot(int) {
    return Sgd8Slot::kMomentumAbsmax;
  }
  MIXPREC_HD static constexpr int table(int) { return q8::kSigned; }
  MIXPREC_HD static Block block(const Args& a, float step_before) {
    return SgdRule<true>::block(a, step_before);
  }
  MIXPREC_HD static bool loads_states(const Block& blk) { return !blk.first; }
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    math::sgd_update(w, g, x[0], a.k, blk.first, blk.neg_lr);
  }
};

template <typename P, typename G, typename M, bool>
using Sgd8Op = Optim8Op<P, G, M, Sgd8Rule>;

template <class Exec>
void fused_sgd8_launch(const OpArgs<Op::fused_sgd8_>& op_args) {
  MIXPREC_BIND(op_args, momentum_absmax, state_steps, weight_decay, momentum,
               dampening, nesterov, stochastic_rounding)
  auto fill = [&](const FlatRows& fs, const Tensor* const* v, size_t i,
                  void*(&a)[Sgd8Slot::kDepth]) {
    void* p = v[0]->data_ptr();
    a[Sgd8Slot::kParam] = p;
    a[Sgd8Slot::kGrad] = v[1]->data_ptr();
    a[Sgd8Slot::kMomentumBuffer] = v[fs.state_view[0]]->data_ptr();
    a[Sgd8Slot::kMomentumAbsmax] = momentum_absmax[i].data_ptr();
    a[Sgd8Slot::kMaster] =
        fs.master_view >= 0 ? v[fs.master_view]->data_ptr() : p;
    a[Sgd8Slot::kStep] = state_steps[i].data_ptr();
  };
  auto make_args = [&] { return sgd_kernel_args(op_args); };
  launch_optim<Exec, Sgd8Slot::kDepth, Sgd8Op>(
      optim::check_fused_sgd8_args(op_args, Exec::kBackend,
                                   /*each_param=*/false),
      [&] {
        optim::check_sgd8_momentum(momentum);
        optim::check_sgd_hparams(weight_decay, momentum, dampening, nesterov,
                                 "fused_sgd8_");
      },
      fill, make_args, false, stochastic_rounding, Sgd8Slot::kRow,
      Sgd8Slot::kSrBase);
}

}  // namespace cuda
}  // namespace mixprec
