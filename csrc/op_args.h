// The argument machinery of the op table (op_table.h): the schema parser
// (constexpr, at compile time), the C++ type of each schema type, OpArgs (one
// call's arguments, read by schema name with MIXPREC_ARG / MIXPREC_BIND) and
// boxed_kernel / MIXPREC_IMPL, which adapt a backend kernel to the stable
// ABI's boxed calling convention. Included by op_table.h; kernels include
// op_table.h.
//
// Nothing here includes ATen or c10 (TORCH_TARGET_VERSION builds). A name
// that is not in the schema, or a schema type with no C++ type here, fails
// to compile.
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

namespace mixprec {

// The ops and their table entries (op_table.h).
enum class Op;
template <Op O>
struct OpInfo;

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
