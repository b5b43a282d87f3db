// The one list of mixprec's ops, and what is derived from it.
//
// Each op is written down in three places: its schema (below, in
// mixprec::schema), its public C++ function (include/mixprec/ops.h, with
// defaults and a doc comment; libmixprec only) and its Python wrapper
// (python/mixprec). Every other piece of C++ takes the op from this header:
//
//   * MIXPREC_FOR_EACH_OP(X) drives the schema registration
//     (registration.cpp), libmixprec's Autograd-key kernels (autograd.cpp)
//     and typed dispatcher calls (ops.cpp, through op_dispatch.h), the op
//     list the Python package reads (build_info.cpp) and the C++ link test;
//   * the backend kernels take OpArgs<Op::x_>: the call's arguments in one
//     object, each of the C++ type its schema type names (Tensor[] is a
//     std::vector<Tensor>, float a double, ...; torch's stable ABI types,
//     common/tensor.h), read by schema name (MIXPREC_ARG, MIXPREC_BIND);
//     boxed_kernel adapts such a kernel to the stable ABI's boxed calling
//     convention. That machinery, and the schema parser it rests on, is in
//     op_args.h.
//
// The kernels build with TORCH_TARGET_VERSION: nothing here includes ATen or
// c10.
#pragma once

#include "op_args.h"

// X(name) for every op, in schema order. A new op adds a line here, its schema
// below and its function in include/mixprec/ops.h.
#define MIXPREC_FOR_EACH_OP(X) \
  X(unscale_and_check_)        \
  X(check_finite_)             \
  X(unscale_and_norm_)         \
  X(check_finite_and_norm_)    \
  X(update_scale_)             \
  X(update_scale_ext_)         \
  X(fused_adam_)               \
  X(fused_sgd_)                \
  X(fused_adam8_)              \
  X(fused_sgd8_)

namespace mixprec {

// The schema of every op, one contract comment each.
//
// Conventions: in-place ops end in `_`, declare what they mutate and return
// nothing; step-varying scalars (scale, found_inf, ...) are one-element device
// tensors so no op needs a host sync; found_inf is float32 and is only ever
// set to 1.0, never cleared.
namespace schema {

// grads *= inv_scale in place (math in float32 for fp16/bf16, float64 for
// float64); found_inf = 1 if any input value was inf or NaN. Bitwise equal
// to torch._amp_foreach_non_finite_check_and_unscale_ wherever that accepts
// the input; also bf16, and lists mixing dtypes.
inline constexpr char unscale_and_check_[] =
    "unscale_and_check_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
    "Tensor inv_scale) -> ()";

// found_inf = 1 if any value of `tensors` is inf or NaN; reads only.
inline constexpr char check_finite_[] =
    "check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()";

// unscale_and_check_ that also returns the total norm_type-norm of the
// unscaled grads (0-dim float32, on their device), all in one pass; the
// norm of clip_grad_norm_ after unscale_. norm_type > 0 or inf.
inline constexpr char unscale_and_norm_[] =
    "unscale_and_norm_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
    "Tensor inv_scale, float norm_type=2.0) -> Tensor";

// unscale_and_norm_ that reads only: found_inf as above and the norm of
// grads * inv_scale (computed in float32/float64, not rounded to the grad
// dtype), grads untouched. For optimizers that unscale (and clip) in their
// own kernel: clip_grad_norm_ then costs one read of the grads.
inline constexpr char check_finite_and_norm_[] =
    "check_finite_and_norm_(Tensor[] grads, Tensor(a!) found_inf, "
    "Tensor inv_scale, float norm_type=2.0) -> Tensor";

// torch._amp_update_scale_, bit for bit. With counts and prev_scale (both or
// neither) the same kernel also counts the update, as mixprec.GradScaler's
// statistics: counts (int64, 5: updates, overflowed, grown past prev_scale,
// shrunk below it, the index of the last overflowed update or -1) and
// prev_scale (float32, one element) set to the new scale.
inline constexpr char update_scale_[] =
    "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
    "Tensor found_inf, float growth_factor, float backoff_factor, "
    "int growth_interval, Tensor(c!)? counts=None, "
    "Tensor(d!)? prev_scale=None) -> ()";

// update_scale_ with hysteresis (state in hysteresis_left) and optional
// min/max bounds on the scale; the rule is in common/update_scale_math.h.
// counts and prev_scale as in update_scale_.
inline constexpr char update_scale_ext_[] =
    "update_scale_ext_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
    "Tensor(c!) hysteresis_left, Tensor found_inf, float growth_factor, "
    "float backoff_factor, int growth_interval, float? min_scale=None, "
    "float? max_scale=None, int hysteresis=1, Tensor(d!)? counts=None, "
    "Tensor(e!)? prev_scale=None) -> ()";

// One Adam (decoupled_weight_decay=False) or AdamW step over every param,
// torch.optim's formula and order; skipped entirely (step counts included)
// when found_inf != 0. grads (fp32/fp16/bf16) are multiplied by 1/grad_scale
// and clip_coef in float32; moments (and masters, when given: one per 16-bit
// param, which then receives the rounded master, all of one dtype: fp32
// copies, or int16 / int8 corrections of bf16 params' split masters,
// common/master_math.h) are float32;
// state_steps (float32, one element each) are incremented on the device; lr
// is a one-element float32/float64 tensor. stochastic_rounding rounds bf16
// params (no masters) with a hash of (seed, step, element number): element e
// of params[t] is number sr_bases[t] + e, and without sr_bases the numbering
// of common/optim_math.h (kSrChunk); a shard of a bigger tensor passes the
// numbers its elements have there, so it rounds as the whole tensor does.
inline constexpr char fused_adam_[] =
    "fused_adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
    "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, "
    "Tensor(e!)[] master_params, Tensor(f!)[] state_steps, Tensor lr, "
    "float beta1, float beta2, float weight_decay, float eps, bool amsgrad, "
    "bool maximize, bool decoupled_weight_decay, Tensor? grad_scale=None, "
    "Tensor? found_inf=None, Tensor? clip_coef=None, "
    "bool stochastic_rounding=False, int seed=0, int[]? sr_bases=None) -> ()";

// One SGD step (torch.optim.SGD's momentum/dampening/nesterov/weight_decay
// rule) with the grad, master, found_inf, step and rounding conventions of
// fused_adam_; momentum_buffers is empty when momentum == 0 and is
// initialised from the grad on a param's first real step (step count 0).
inline constexpr char fused_sgd_[] =
    "fused_sgd_(Tensor(a!)[] params, Tensor[] grads, "
    "Tensor(b!)[] momentum_buffers, Tensor(c!)[] master_params, "
    "Tensor(d!)[] state_steps, Tensor lr, float weight_decay, "
    "float momentum, float dampening, bool nesterov, bool maximize, "
    "Tensor? grad_scale=None, Tensor? found_inf=None, "
    "Tensor? clip_coef=None, bool stochastic_rounding=False, int seed=0, "
    "int[]? sr_bases=None) "
    "-> ()";

// fused_adam_ (amsgrad off) with block-wise 8-bit moments
// (common/quant8_math.h): exp_avgs/exp_avg_sqs are contiguous uint8 codes of
// each param's shape (signed / unsigned dynamic tables), *_absmax their
// float32 maxima, one per block of 256 elements. Each moment is read back in
// float32, updated as fused_adam_ updates a float32 moment, and quantized
// again with its block's new absmax; found_inf != 0 changes nothing.
inline constexpr char fused_adam8_[] =
    "fused_adam8_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
    "Tensor(c!)[] exp_avg_absmax, Tensor(d!)[] exp_avg_sqs, "
    "Tensor(e!)[] exp_avg_sq_absmax, Tensor(f!)[] master_params, "
    "Tensor(g!)[] state_steps, Tensor lr, float beta1, float beta2, "
    "float weight_decay, float eps, bool maximize, "
    "bool decoupled_weight_decay, Tensor? grad_scale=None, "
    "Tensor? found_inf=None, Tensor? clip_coef=None, "
    "bool stochastic_rounding=False, int seed=0, int[]? sr_bases=None) -> ()";

// fused_sgd_ (momentum > 0) with a block-wise 8-bit momentum buffer (signed
// codes and float32 maxima, as fused_adam8_'s first moment).
inline constexpr char fused_sgd8_[] =
    "fused_sgd8_(Tensor(a!)[] params, Tensor[] grads, "
    "Tensor(b!)[] momentum_buffers, Tensor(c!)[] momentum_absmax, "
    "Tensor(d!)[] master_params, Tensor(e!)[] state_steps, Tensor lr, "
    "float weight_decay, float momentum, float dampening, bool nesterov, "
    "bool maximize, Tensor? grad_scale=None, Tensor? found_inf=None, "
    "Tensor? clip_coef=None, bool stochastic_rounding=False, int seed=0, "
    "int[]? sr_bases=None) "
    "-> ()";

}  // namespace schema

// Every op of the table, by name (Op::fused_adam_, ...).
enum class Op {
#define MIXPREC_OP_ENUM_(op) op,
  MIXPREC_FOR_EACH_OP(MIXPREC_OP_ENUM_)
#undef MIXPREC_OP_ENUM_
};

// Per op: kName ("mixprec::x_"), kOpName ("x_") and kSchema.
template <Op O>
struct OpInfo;

#define MIXPREC_OP_INFO_(op)                                             \
  template <>                                                            \
  struct OpInfo<Op::op> {                                                \
    static constexpr char kName[] = "mixprec::" #op;                     \
    static constexpr const char* kOpName = #op;                          \
    static constexpr const char* kSchema = ::mixprec::schema::op;        \
    static_assert(::mixprec::schema_is_of(kSchema, #op),                 \
                  "the schema of " #op " does not start with its name"); \
  };
MIXPREC_FOR_EACH_OP(MIXPREC_OP_INFO_)
#undef MIXPREC_OP_INFO_

}  // namespace mixprec
