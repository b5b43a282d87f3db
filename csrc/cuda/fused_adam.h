// fused_adam_ and fused_adam8_ for the CUDA backend: the block functors and
// the launchers,
// templated on the executor (DeviceExec in fused_adam_cuda.cu,
// cuda_emulation::HostExec in CI). One plan per (param dtype, grad dtype)
// group, then one block that increments the step counts. Every block reads
// found_inf on the device and does nothing when it is set, so the step needs
// no host sync and can be captured in a CUDA graph.
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
    kSrBase,  // (an integer: the SR number of element 0)
    kDepth
  };
};

struct AdamKernelArgs : OptimKernelArgs {
  math::AdamConsts k;
  double beta1;
  double beta2;
  double weight_decay;
};

// Adam's part of OptimOp (fused_optim.h): states exp_avg, exp_avg_sq and,
// with amsgrad, max_exp_avg_sq; torch.optim's update (math::adam_update).
template <bool kAmsgrad>
struct AdamRule : RuleSlots<AdamSlot, 3> {
  using Args = AdamKernelArgs;
  using Block = math::AdamStep;
  MIXPREC_HD static constexpr int state_slot(int k) {
    return k == 0   ? AdamSlot::kExpAvg
           : k == 1 ? AdamSlot::kExpAvgSq
                    : AdamSlot::kMaxExpAvgSq;
  }
  MIXPREC_HD static constexpr bool uses_state(int k) {
    return k < 2 || kAmsgrad;
  }
  MIXPREC_HD static Block block(const Args& a, float step_before) {
    return math::make_adam_step(read_lr(a.lr, a.lr_double), a.beta1, a.beta2,
                                a.weight_decay, step_before + 1.0f);
  }
  MIXPREC_HD static bool loads_states(const Block&) { return true; }
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    math::adam_update<kAmsgrad, math::ScalarOps>(w, g, x[0], x[1], x[2], a.k,
                                                 blk);
  }
};

template <typename P, typename G, typename M, bool kAmsgrad>
using AdamOp = OptimOp<P, G, M, AdamRule<kAmsgrad>>;

// The kernel arguments of fused_adam_ or fused_adam8_ (read by name; host).
template <class A>
AdamKernelArgs adam_kernel_args(const A& op_args) {
  MIXPREC_BIND(op_args, lr, beta1, beta2, weight_decay, eps, maximize,
               decoupled_weight_decay, grad_scale, found_inf, clip_coef, seed)
  AdamKernelArgs args;
  args.set_common(lr, grad_scale, found_inf, clip_coef, maximize, seed);
  args.k = math::make_adam_consts(beta1, beta2, weight_decay, eps,
                                  decoupled_weight_decay);
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.weight_decay = weight_decay;
  return args;
}

template <class Exec>
void fused_adam_launch(const OpArgs<Op::fused_adam_>& op_args) {
  MIXPREC_BIND(op_args, state_steps, beta1, beta2, weight_decay, eps, amsgrad,
               stochastic_rounding)
  auto fill = [&](const FlatRows& fs, const Tensor* const* v, size_t i,
                  void*(&a)[AdamSlot::kDepth]) {
    const int vm_view = fs.state_view[2];  // max_exp_avg_sqs (amsgrad)
    void* p = v[0]->data_ptr();
    a[AdamSlot::kParam] = p;
    a[AdamSlot::kGrad] = v[1]->data_ptr();
    a[AdamSlot::kExpAvg] = v[fs.state_view[0]]->data_ptr();
    a[AdamSlot::kExpAvgSq] = v[fs.state_view[1]]->data_ptr();
    a[AdamSlot::kMaxExpAvgSq] = vm_view >= 0 ? v[vm_view]->data_ptr() : p;
    a[AdamSlot::kMaster] =
        fs.master_view >= 0 ? v[fs.master_view]->data_ptr() : p;
    a[AdamSlot::kStep] = state_steps[i].data_ptr();
  };
  auto make_args = [&] { return adam_kernel_args(op_args); };
  launch_optim<Exec, AdamSlot::kDepth, AdamOp>(
      optim::check_fused_adam_args(op_args, Exec::kBackend,
                                   /*each_param=*/false),
      [&] { optim::check_adam_hparams(beta1, beta2, weight_decay, eps); }, fill,
      make_args, amsgrad, stochastic_rounding,
      /*row_slot=*/-1, AdamSlot::kSrBase);
}

// fused_adam8_'s slots: the moments as codes (per element, flattened with
// the param) and maxima (per block, the call's contiguous lists).
struct Adam8Slot {
  enum : int {
    kParam = 0,
    kGrad,
    kExpAvg,
    kExpAvgAbsmax,
    kExpAvgSq,
    kExpAvgSqAbsmax,
    kMaster,
    kStep,
    kRow,     // (an integer: elements per row of the state)
    kSrBase,  // (an integer: the SR number of element 0)
    kDepth
  };
};

// Adam's part of Optim8Op (fused_optim8.h): exp_avg (signed codes) and
// exp_avg_sq (unsigned codes), AdamRule's update without amsgrad.
struct Adam8Rule : RuleSlots8<Adam8Slot, 2> {
  using Args = AdamKernelArgs;
  using Block = math::AdamStep;
  MIXPREC_HD static constexpr int codes_slot(int k) {
    return k == 0 ? Adam8Slot::kExpAvg : Adam8Slot::kExpAvgSq;
  }
  MIXPREC_HD static constexpr int absmax_slot(int k) {
    return k == 0 ? Adam8Slot::kExpAvgAbsmax : Adam8Slot::kExpAvgSqAbsmax;
  }
  MIXPREC_HD static constexpr int table(int k) {
    return k == 0 ? q8::kSigned : q8::kUnsigned;
  }
  MIXPREC_HD static Block block(const Args& a, float step_before) {
    return AdamRule<false>::block(a, step_before);
  }
  MIXPREC_HD static bool loads_states(const Block&) { return true; }
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    float unused = 0.0f;
    math::adam_update<false, math::ScalarOps>(w, g, x[0], x[1], unused, a.k,
                                              blk);
  }
};

// Adam8Rule for the common step, AdamW with beta1 >= 0.5 (weight decay
// decoupled and nonzero, the lerp's small-weight form: adam8_common): the
// same update with those flags compile-time constants, so that the kernel
// has no code for the other branches. The same operations as Adam8Rule's on
// such a step, so the same bits.
struct Adam8CommonRule : Adam8Rule {
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    math::AdamConsts k = a.k;
    k.has_wd = true;
    k.decoupled = true;
    k.lerp_small = true;
    float unused = 0.0f;
    math::adam_update<false, math::ScalarOps>(w, g, x[0], x[1], unused, k, blk);
  }
};

// Whether a step takes Adam8CommonRule.
inline bool adam8_common(const math::AdamConsts& k) {
  return k.has_wd && k.decoupled && k.lerp_small;
}

// (launch_optim's option flag: the step is adam8_common; there is no
// amsgrad.)
template <typename P, typename G, typename M, bool kCommon>
using Adam8Op =
    Optim8Op<P, G, M, std::conditional_t<kCommon, Adam8CommonRule, Adam8Rule>>;

template <class Exec>
void fused_adam8_launch(const OpArgs<Op::fused_adam8_>& op_args) {
  MIXPREC_BIND(op_args, exp_avg_absmax, exp_avg_sq_absmax, state_steps, beta1,
               beta2, weight_decay, eps, decoupled_weight_decay,
               stochastic_rounding)
  auto fill = [&](const FlatRows& fs, const Tensor* const* v, size_t i,
                  void*(&a)[Adam8Slot::kDepth]) {
    void* p = v[0]->data_ptr();
    a[Adam8Slot::kParam] = p;
    a[Adam8Slot::kGrad] = v[1]->data_ptr();
    a[Adam8Slot::kExpAvg] = v[fs.state_view[0]]->data_ptr();
    a[Adam8Slot::kExpAvgAbsmax] = exp_avg_absmax[i].data_ptr();
    a[Adam8Slot::kExpAvgSq] = v[fs.state_view[1]]->data_ptr();
    a[Adam8Slot::kExpAvgSqAbsmax] = exp_avg_sq_absmax[i].data_ptr();
    a[Adam8Slot::kMaster] =
        fs.master_view >= 0 ? v[fs.master_view]->data_ptr() : p;
    a[Adam8Slot::kStep] = state_steps[i].data_ptr();
  };
  auto make_args = [&] { return adam_kernel_args(op_args); };
  const bool common = adam8_common(math::make_adam_consts(
      beta1, beta2, weight_decay, eps, decoupled_weight_decay));
  launch_optim<Exec, Adam8Slot::kDepth, Adam8Op>(
      optim::check_fused_adam8_args(op_args, Exec::kBackend,
                                    /*each_param=*/false),
      [&] {
        optim::check_adam_hparams(beta1, beta2, weight_decay, eps,
                                  "fused_adam8_");
      },
      fill, make_args, common, stochastic_rounding, Adam8Slot::kRow,
      Adam8Slot::kSrBase);
}

}  // namespace cuda
}  // namespace mixprec
