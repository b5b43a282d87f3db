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
//     convention.
//
// The kernels build with TORCH_TARGET_VERSION: nothing here includes ATen or
// c10. A name that is not in the schema, or a schema type with no C++ type
// here, fails to compile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/stable/library.h>

#include "common/tensor.h"

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

// torch._amp_update_scale_, bit for bit.
inline constexpr char update_scale_[] =
    "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
    "Tensor found_inf, float growth_factor, float backoff_factor, "
    "int growth_interval) -> ()";

// update_scale_ with hysteresis (state in hysteresis_left) and optional
// min/max bounds on the scale; the rule is in common/update_scale_math.h.
inline constexpr char update_scale_ext_[] =
    "update_scale_ext_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
    "Tensor(c!) hysteresis_left, Tensor found_inf, float growth_factor, "
    "float backoff_factor, int growth_interval, float? min_scale=None, "
    "float? max_scale=None, int hysteresis=1) -> ()";

// One Adam (decoupled_weight_decay=False) or AdamW step over every param,
// torch.optim's formula and order; skipped entirely (step counts included)
// when found_inf != 0. grads (fp32/fp16/bf16) are multiplied by 1/grad_scale
// and clip_coef in float32; moments (and masters, when given: one fp32 copy
// per 16-bit param, which then receives the rounded master) are float32;
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

// Whether `schema` starts with `name` followed by "(".
constexpr bool schema_is_of(const char* schema, const char* name) {
  size_t i = 0;
  for (; name[i] != '\0'; ++i) {
    if (schema[i] != name[i]) {
      return false;
    }
  }
  return schema[i] == '(';
}

// The position of argument `name` in `schema`, or -1. Arguments are split at
// the commas outside parentheses; an argument's name is its last word before
// any "=default".
constexpr int schema_arg_index(const char* schema, const char* name) {
  size_t i = 0;
  while (schema[i] != '(') {
    ++i;
  }
  ++i;
  int index = 0;
  for (;;) {
    // One argument: [start, end), ended by ',' or ')' at depth 0.
    const size_t start = i;
    int depth = 0;
    size_t eq = 0;
    while (depth > 0 || (schema[i] != ',' && schema[i] != ')')) {
      if (schema[i] == '(') {
        ++depth;
      } else if (schema[i] == ')') {
        --depth;
      } else if (schema[i] == '=' && depth == 0 && eq == 0) {
        eq = i;
      }
      ++i;
    }
    size_t name_end = eq != 0 ? eq : i;
    while (name_end > start && schema[name_end - 1] == ' ') {
      --name_end;
    }
    size_t name_begin = name_end;
    while (name_begin > start && schema[name_begin - 1] != ' ') {
      --name_begin;
    }
    size_t k = 0;
    while (name_begin + k < name_end && name[k] != '\0' &&
           schema[name_begin + k] == name[k]) {
      ++k;
    }
    if (name_begin + k == name_end && name[k] == '\0' &&
        name_end > name_begin) {
      return index;
    }
    if (schema[i] == ')') {
      return -1;
    }
    ++i;  // the ','
    while (schema[i] == ' ') {
      ++i;
    }
    ++index;
  }
}

// The kinds of argument a schema of the table uses, and their C++ types in
// a kernel (the stable ABI's: common/tensor.h).
enum class ArgKind {
  kTensor,           // Tensor, Tensor(a!)
  kTensorList,       // Tensor[], Tensor(a!)[]
  kOptionalTensor,   // Tensor?
  kFloat,            // float
  kOptionalFloat,    // float?
  kInt,              // int
  kOptionalIntList,  // int[]?
  kBool,             // bool
  kUnknown,
};

// The kind of argument `index` of `schema` (its type: the text before its
// name).
constexpr ArgKind schema_arg_kind(const char* schema, int index) {
  size_t i = 0;
  while (schema[i] != '(') {
    ++i;
  }
  ++i;
  for (int k = 0; k < index; ++k) {
    int depth = 0;
    while (depth > 0 || schema[i] != ',') {
      if (schema[i] == '(') {
        ++depth;
      } else if (schema[i] == ')') {
        if (depth == 0) {
          return ArgKind::kUnknown;
        }
        --depth;
      }
      ++i;
    }
    ++i;
    while (schema[i] == ' ') {
      ++i;
    }
  }
  // The type: up to the first space, with any alias annotation "(a!)".
  const size_t start = i;
  size_t end = i;
  while (schema[end] != ' ') {
    ++end;
  }
  auto is = [&](const char* word) {
    size_t k = 0;
    for (size_t j = start; j < end; ++j) {
      if (schema[j] == '(') {  // skip the alias annotation
        while (schema[j] != ')') {
          ++j;
        }
        continue;
      }
      if (word[k] != schema[j]) {
        return false;
      }
      ++k;
    }
    return word[k] == '\0';
  };
  if (is("Tensor")) return ArgKind::kTensor;
  if (is("Tensor[]")) return ArgKind::kTensorList;
  if (is("Tensor?")) return ArgKind::kOptionalTensor;
  if (is("float")) return ArgKind::kFloat;
  if (is("float?")) return ArgKind::kOptionalFloat;
  if (is("int")) return ArgKind::kInt;
  if (is("int[]?")) return ArgKind::kOptionalIntList;
  if (is("bool")) return ArgKind::kBool;
  return ArgKind::kUnknown;
}

// The number of arguments of `schema`.
constexpr int schema_num_args(const char* schema) {
  size_t i = 0;
  while (schema[i] != '(') {
    ++i;
  }
  ++i;
  if (schema[i] == ')') {
    return 0;
  }
  int n = 1;
  int depth = 0;
  for (; depth > 0 || schema[i] != ')'; ++i) {
    if (schema[i] == '(') {
      ++depth;
    } else if (schema[i] == ')') {
      --depth;
    } else if (schema[i] == ',' && depth == 0) {
      ++n;
    }
  }
  return n;
}

// Whether `schema` returns one Tensor ("-> Tensor"); else it returns nothing.
constexpr bool schema_returns_tensor(const char* schema) {
  size_t i = 0;
  while (!(schema[i] == '-' && schema[i + 1] == '>')) {
    ++i;
  }
  i += 2;
  while (schema[i] == ' ') {
    ++i;
  }
  return schema[i] == 'T';
}

template <ArgKind K>
struct ArgTypeOf;
template <>
struct ArgTypeOf<ArgKind::kTensor> {
  using type = Tensor;
};
template <>
struct ArgTypeOf<ArgKind::kTensorList> {
  using type = std::vector<Tensor>;
};
template <>
struct ArgTypeOf<ArgKind::kOptionalTensor> {
  using type = std::optional<Tensor>;
};
template <>
struct ArgTypeOf<ArgKind::kFloat> {
  using type = double;
};
template <>
struct ArgTypeOf<ArgKind::kOptionalFloat> {
  using type = std::optional<double>;
};
template <>
struct ArgTypeOf<ArgKind::kInt> {
  using type = int64_t;
};
template <>
struct ArgTypeOf<ArgKind::kOptionalIntList> {
  using type = std::optional<std::vector<int64_t>>;
};
template <>
struct ArgTypeOf<ArgKind::kBool> {
  using type = bool;
};

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

// The C++ type of argument I of op O, from its schema.
template <Op O, size_t I>
using OpArgType = typename ArgTypeOf<schema_arg_kind(
    OpInfo<O>::kSchema, static_cast<int>(I))>::type;

// The arguments of one call of op O, taken from the stable ABI's stack once
// (each converted to its schema type, owning what it holds): the form in
// which backend kernels take them. Read them with MIXPREC_ARG / MIXPREC_BIND,
// by schema name.
template <Op O, class Seq = std::make_index_sequence<static_cast<size_t>(
                    schema_num_args(OpInfo<O>::kSchema))>>
struct OpArgs;

// Hidden, as the stable ABI's types it holds.
template <Op O, size_t... I>
struct __attribute__((visibility("hidden")))
OpArgs<O, std::index_sequence<I...>> {
  static constexpr const char* kSchema = OpInfo<O>::kSchema;
  std::tuple<OpArgType<O, I>...> values;

  explicit OpArgs(StableIValue* stack)
      : values{torch::stable::detail::to<OpArgType<O, I>>(stack[I])...} {}
};

template <int I, class A>
constexpr const auto& op_arg(const A& a) {
  static_assert(I >= 0, "MIXPREC_ARG: no argument of that name in the schema");
  return std::get<static_cast<size_t>(I < 0 ? 0 : I)>(a.values);
}

// The argument `name` of OpArgs `a` (a const reference to it), checked
// against the schema at compile time.
#define MIXPREC_ARG(a, name)                      \
  (::mixprec::op_arg<::mixprec::schema_arg_index( \
       std::decay_t<decltype(a)>::kSchema, #name)>(a))

// MIXPREC_BIND(a, x, y, ...): local references x, y, ... to those arguments
// of `a`, in any order; only the arguments a kernel uses.
#define MIXPREC_BIND_ONE_(a, name) decltype(auto) name = MIXPREC_ARG(a, name);
#define MIXPREC_PP_1_(m, a, x) m(a, x)
#define MIXPREC_PP_2_(m, a, x, ...) m(a, x) MIXPREC_PP_1_(m, a, __VA_ARGS__)
#define MIXPREC_PP_3_(m, a, x, ...) m(a, x) MIXPREC_PP_2_(m, a, __VA_ARGS__)
#define MIXPREC_PP_4_(m, a, x, ...) m(a, x) MIXPREC_PP_3_(m, a, __VA_ARGS__)
#define MIXPREC_PP_5_(m, a, x, ...) m(a, x) MIXPREC_PP_4_(m, a, __VA_ARGS__)
#define MIXPREC_PP_6_(m, a, x, ...) m(a, x) MIXPREC_PP_5_(m, a, __VA_ARGS__)
#define MIXPREC_PP_7_(m, a, x, ...) m(a, x) MIXPREC_PP_6_(m, a, __VA_ARGS__)
#define MIXPREC_PP_8_(m, a, x, ...) m(a, x) MIXPREC_PP_7_(m, a, __VA_ARGS__)
#define MIXPREC_PP_9_(m, a, x, ...) m(a, x) MIXPREC_PP_8_(m, a, __VA_ARGS__)
#define MIXPREC_PP_10_(m, a, x, ...) m(a, x) MIXPREC_PP_9_(m, a, __VA_ARGS__)
#define MIXPREC_PP_11_(m, a, x, ...) m(a, x) MIXPREC_PP_10_(m, a, __VA_ARGS__)
#define MIXPREC_PP_12_(m, a, x, ...) m(a, x) MIXPREC_PP_11_(m, a, __VA_ARGS__)
#define MIXPREC_PP_13_(m, a, x, ...) m(a, x) MIXPREC_PP_12_(m, a, __VA_ARGS__)
#define MIXPREC_PP_14_(m, a, x, ...) m(a, x) MIXPREC_PP_13_(m, a, __VA_ARGS__)
#define MIXPREC_PP_15_(m, a, x, ...) m(a, x) MIXPREC_PP_14_(m, a, __VA_ARGS__)
#define MIXPREC_PP_16_(m, a, x, ...) m(a, x) MIXPREC_PP_15_(m, a, __VA_ARGS__)
#define MIXPREC_PP_17_(m, a, x, ...) m(a, x) MIXPREC_PP_16_(m, a, __VA_ARGS__)
#define MIXPREC_PP_18_(m, a, x, ...) m(a, x) MIXPREC_PP_17_(m, a, __VA_ARGS__)
#define MIXPREC_PP_19_(m, a, x, ...) m(a, x) MIXPREC_PP_18_(m, a, __VA_ARGS__)
#define MIXPREC_PP_20_(m, a, x, ...) m(a, x) MIXPREC_PP_19_(m, a, __VA_ARGS__)
#define MIXPREC_PP_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, \
                         _13, _14, _15, _16, _17, _18, _19, _20, NAME, ...) \
  NAME
#define MIXPREC_BIND(a, ...)                                                   \
  MIXPREC_PP_PICK_(__VA_ARGS__, MIXPREC_PP_20_, MIXPREC_PP_19_,                \
                   MIXPREC_PP_18_, MIXPREC_PP_17_, MIXPREC_PP_16_,             \
                   MIXPREC_PP_15_, MIXPREC_PP_14_, MIXPREC_PP_13_,             \
                   MIXPREC_PP_12_, MIXPREC_PP_11_, MIXPREC_PP_10_,             \
                   MIXPREC_PP_9_, MIXPREC_PP_8_, MIXPREC_PP_7_, MIXPREC_PP_6_, \
                   MIXPREC_PP_5_, MIXPREC_PP_4_, MIXPREC_PP_3_, MIXPREC_PP_2_, \
                   MIXPREC_PP_1_)                                              \
  (MIXPREC_BIND_ONE_, a, __VA_ARGS__)

// A backend kernel `Impl` (taking `const OpArgs<O>&`, returning a Tensor
// when the schema does, else nothing) as a boxed kernel of the stable ABI.
template <Op O, auto Impl>
void boxed_kernel(StableIValue* stack, uint64_t /*num_args*/,
                  uint64_t /*num_outputs*/) {
  OpArgs<O> args(stack);
  using Ret = decltype(Impl(args));
  static_assert(
      std::is_void_v<Ret> != schema_returns_tensor(OpInfo<O>::kSchema),
      "a kernel's return type differs from its op's schema");
  if constexpr (std::is_void_v<Ret>) {
    Impl(args);
  } else {
    stack[0] = torch::stable::detail::from(Impl(args));
  }
}

// m.impl of `kernel_fn` (a function taking `const OpArgs<Op::op>&`) for op
// `op`, in a STABLE_TORCH_LIBRARY_IMPL(mixprec, <key>, m) block.
#define MIXPREC_IMPL(m, op, kernel_fn) \
  (m).impl(#op, &::mixprec::boxed_kernel<::mixprec::Op::op, kernel_fn>)

// MIXPREC_IMPL_DENSE_AND_SPARSE(CPU, register_fn): register_fn(m) (its
// MIXPREC_IMPL calls) in the STABLE_TORCH_LIBRARY_IMPL blocks of `backend`
// and of its sparse key (CPU and SparseCPU, CUDA and SparseCUDA). A sparse
// tensor routes the call to the sparse key, where the kernels' argument
// checks reject it with a message naming the tensor (instead of a
// missing-kernel error).
#define MIXPREC_IMPL_DENSE_AND_SPARSE(backend, register_fn)          \
  STABLE_TORCH_LIBRARY_IMPL(mixprec, backend, m) { register_fn(m); } \
  STABLE_TORCH_LIBRARY_IMPL(mixprec, Sparse##backend, m) { register_fn(m); }

}  // namespace mixprec
