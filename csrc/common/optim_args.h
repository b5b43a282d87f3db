// Argument checks and host-side tensor preparation shared by the CPU and CUDA
// kernels of the fused optimizers (fused_adam_, fused_sgd_).
//
// Every check runs before any tensor is written, and every message names the
// op and the argument (with its list index), so an op that rejects its input
// modifies nothing.
#pragma once

#include "common/tensor.h"

#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "op_table.h"

namespace mixprec {
namespace optim {

// One per-element state list of a fused-optimizer call: float32 values, or
// (coded) contiguous uint8 codes of the 8-bit ops, whose float32 block maxima
// are the list `absmax` names (one per block of q8::kBlock elements).
struct StateList {
  const char* name;
  TensorList list;
  bool coded = false;
  const char* absmax_name = nullptr;
  TensorList absmax = {};
};

// The tensor lists of one fused-optimizer call. Lists that an optimizer does
// not use (max_exp_avg_sqs without amsgrad, momentum buffers without momentum,
// masters when params are updated in place) are empty.
struct OptimLists {
  TensorList params;
  TensorList grads;
  std::vector<StateList> states;
  TensorList master_params;
  TensorList state_steps;
  const char* op = nullptr;  // the op's name, for messages
  // Stochastic rounding's element number of each param's element 0
  // (op_table.h); none: the numbering of an unsharded call.
  std::optional<std::vector<int64_t>> sr_bases = std::nullopt;
};

// The one-element scalars of a call.
struct OptimScalars {
  const Tensor* lr;  // float32 or float64
  const std::optional<Tensor>* grad_scale;
  const std::optional<Tensor>* found_inf;
  const std::optional<Tensor>* clip_coef;
};

// Checks lists and scalars: equal lengths (states: empty or len(params), as
// `state_required` says), one device of type `backend`, dtypes (params and
// grads float32/float16/bfloat16; states and steps float32; masters only for
// 16-bit params: float32, or the int16 / int8 split-master corrections
// (common/master_math.h) of bfloat16 params, one dtype per call), shapes equal
// to the param's, dense layouts, no internal overlap in what is written, and
// one-element scalars on the same device. `stochastic_rounding` requires no
// masters. With each_param false, only the call is checked (list lengths, the
// device, the scalars): the caller must then run check_optim_param on every
// param before it writes anything (the CUDA launchers check while they plan, in
// one pass).
void check_optim_args(const OptimLists& lists,
                      const std::vector<bool>& state_required,
                      const OptimScalars& scalars, bool stochastic_rounding,
                      DeviceType backend, bool each_param = true);

// The checks of param i and of its tensors in every list (the per-param part
// of check_optim_args); `device` is the call's (params[0]'s).
void check_optim_param(const OptimLists& lists, size_t i, const Device& device);

// Hyper-parameter checks (host floats); `op` names the op in messages.
void check_adam_hparams(double beta1, double beta2, double weight_decay,
                        double eps, const char* op = "fused_adam_");
void check_sgd_hparams(double weight_decay, double momentum, double dampening,
                       bool nesterov, const char* op = "fused_sgd_");

// The argument checks of the fused_adam_ / fused_sgd_ kernels of `backend`
// (check_optim_args, then the hyper-parameters). They return the call's
// lists (states: exp_avgs, exp_avg_sqs, max_exp_avg_sqs / momentum_buffers)
// for FlatSet. With each_param false they check the call only
// (check_optim_args' each_param), not the hyper-parameters either: the caller
// runs check_optim_param for every param, then the hyper-parameter checks
// (the same order of checks, so the same first error).
inline OptimLists check_fused_adam_args(const OpArgs<Op::fused_adam_>& a,
                                        DeviceType backend,
                                        bool each_param = true) {
  MIXPREC_BIND(a, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
               master_params, state_steps, lr, beta1, beta2, weight_decay, eps,
               amsgrad, grad_scale, found_inf, clip_coef, stochastic_rounding)
  OptimLists lists{params,
                   grads,
                   {{"exp_avgs", exp_avgs},
                    {"exp_avg_sqs", exp_avg_sqs},
                    {"max_exp_avg_sqs", max_exp_avg_sqs}},
                   master_params,
                   state_steps};
  lists.op = "fused_adam_";
  lists.sr_bases = MIXPREC_ARG(a, sr_bases);
  check_optim_args(lists, {true, true, amsgrad},
                   {&lr, &grad_scale, &found_inf, &clip_coef},
                   stochastic_rounding, backend, each_param);
  if (!each_param) {
    return lists;
  }
  check_adam_hparams(beta1, beta2, weight_decay, eps);
  return lists;
}

inline OptimLists check_fused_sgd_args(const OpArgs<Op::fused_sgd_>& a,
                                       DeviceType backend,
                                       bool each_param = true) {
  MIXPREC_BIND(a, params, grads, momentum_buffers, master_params, state_steps,
               lr, weight_decay, momentum, dampening, nesterov, grad_scale,
               found_inf, clip_coef, stochastic_rounding)
  OptimLists lists{params,
                   grads,
                   {{"momentum_buffers", momentum_buffers}},
                   master_params,
                   state_steps};
  lists.op = "fused_sgd_";
  lists.sr_bases = MIXPREC_ARG(a, sr_bases);
  check_optim_args(lists, {momentum != 0.0},
                   {&lr, &grad_scale, &found_inf, &clip_coef},
                   stochastic_rounding, backend, each_param);
  if (!each_param) {
    return lists;
  }
  check_sgd_hparams(weight_decay, momentum, dampening, nesterov);
  return lists;
}

// The checks of the 8-bit ops (fused_adam8_, fused_sgd8_): the lists as above
// with the codes and their maxima; fused_sgd8_ requires momentum > 0.
inline OptimLists check_fused_adam8_args(const OpArgs<Op::fused_adam8_>& a,
                                         DeviceType backend,
                                         bool each_param = true) {
  MIXPREC_BIND(a, params, grads, exp_avgs, exp_avg_absmax, exp_avg_sqs,
               exp_avg_sq_absmax, master_params, state_steps, lr, beta1, beta2,
               weight_decay, eps, grad_scale, found_inf, clip_coef,
               stochastic_rounding)
  OptimLists lists{
      params,
      grads,
      {{"exp_avgs", exp_avgs, true, "exp_avg_absmax", exp_avg_absmax},
       {"exp_avg_sqs", exp_avg_sqs, true, "exp_avg_sq_absmax",
        exp_avg_sq_absmax}},
      master_params,
      state_steps};
  lists.op = "fused_adam8_";
  lists.sr_bases = MIXPREC_ARG(a, sr_bases);
  check_optim_args(lists, {true, true},
                   {&lr, &grad_scale, &found_inf, &clip_coef},
                   stochastic_rounding, backend, each_param);
  if (!each_param) {
    return lists;
  }
  check_adam_hparams(beta1, beta2, weight_decay, eps, "fused_adam8_");
  return lists;
}

void check_sgd8_momentum(double momentum);

inline OptimLists check_fused_sgd8_args(const OpArgs<Op::fused_sgd8_>& a,
                                        DeviceType backend,
                                        bool each_param = true) {
  MIXPREC_BIND(a, params, grads, momentum_buffers, momentum_absmax,
               master_params, state_steps, lr, weight_decay, momentum,
               dampening, nesterov, grad_scale, found_inf, clip_coef,
               stochastic_rounding)
  check_sgd8_momentum(momentum);
  OptimLists lists{params,
                   grads,
                   {{"momentum_buffers", momentum_buffers, true,
                     "momentum_absmax", momentum_absmax}},
                   master_params,
                   state_steps};
  lists.op = "fused_sgd8_";
  lists.sr_bases = MIXPREC_ARG(a, sr_bases);
  check_optim_args(lists, {true}, {&lr, &grad_scale, &found_inf, &clip_coef},
                   stochastic_rounding, backend, each_param);
  if (!each_param) {
    return lists;
  }
  check_sgd_hparams(weight_decay, momentum, dampening, nesterov, "fused_sgd8_");
  return lists;
}

// Tensors by address: the caller's (which outlive the call) or a FlatSet's own
// copies. Not Tensor copies: copying a tensor that Python owns
// increments its PyObject, which takes the GIL -- per tensor, per list,
// whenever the op runs without the GIL.
using TensorRefs = std::vector<const Tensor*>;

// The tensors of one parameter as the kernels see them: flat element spans
// in which index k of every tensor is the same logical element. When a
// parameter's tensors are dense with identical strides they are used as they
// are; otherwise each is replaced by a contiguous copy and the written ones are
// copied back by finish().
struct FlatSet {
  // views[list][i]: list 0 = params, 1 = grads, then each state list in use
  // (non-empty) in order, then masters (when present). Steps are not
  // flattened.
  std::vector<TensorRefs> views;
  // The list in `views` of lists.states[s]; -1 for a state not in use.
  // (A coded state's maxima are not flattened: the kernels index them by
  // block, and check_optim_args requires its codes to be contiguous.)
  std::vector<int> state_view;
  // The list in `views` of the masters; -1 without masters.
  int master_view = -1;
  std::deque<Tensor> owned;  // contiguous copies (stable addresses)
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (orig, flat)

  // `lists` as check_optim_args accepted them; every list but grads is
  // written by the op.
  explicit FlatSet(const OptimLists& lists);
  void finish();
};

// The float32 data of an optional one-element scalar; null when not given.
inline float* scalar_data(const std::optional<Tensor>& t) {
  return t.has_value() ? t->mutable_data_ptr<float>() : nullptr;
}

// Whether found_inf is given and non-zero, read on the host (CPU tensors
// only): a step with an inf/NaN gradient changes nothing, the step counts
// included.
bool found_inf_cpu(const std::optional<Tensor>& found_inf);

// Reads a one-element float32/float64 lr tensor on the host (CPU tensors only).
double read_lr_cpu(const Tensor& lr);

}  // namespace optim
}  // namespace mixprec
