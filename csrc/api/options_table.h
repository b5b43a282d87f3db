// The places an optimizer option is used, generated from the option lists of
// mixprec/optim.h (MIXPREC_ADAM_OPTIONS, MIXPREC_ADAMW_OPTIONS,
// MIXPREC_SGD_OPTIONS): for_each_option visits every row of an options
// object's list with its name, value, flags and check (for_each_option_pair:
// two objects' values side by side). optim.cpp builds the
// archive, the state-dict group entries and the checks on it, capture.cpp
// the settings a graph bakes in. for_each_state does the same for the
// per-param state lists (MIXPREC_ADAM_STATE, MIXPREC_SGD_STATE). Private to
// csrc/api.
#pragma once

#include "mixprec/optim.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace mixprec::optim::options_table {

using namespace options_flag;  // the rows' flags

// ---- the rows' checks (the `check` column): (class, option name, value);
// c10::ValueError naming both.
struct check_none {
  template <typename T>
  void operator()(const char*, const char*, const T&) const {}
};

struct check_nonneg {
  void operator()(const char* cls, const char* name, double value) const {
    TORCH_CHECK_VALUE(value >= 0.0 && std::isfinite(value), "mixprec.optim.",
                      cls, ": ", name, " must be a finite number >= 0, got ",
                      value);
  }
};

struct check_betas {
  void operator()(const char* cls, const char* name,
                  const std::tuple<double, double>& value) const {
    const double b[] = {std::get<0>(value), std::get<1>(value)};
    for (int i = 0; i < 2; ++i) {
      TORCH_CHECK_VALUE(b[i] >= 0.0 && b[i] < 1.0, "mixprec.optim.", cls, ": ",
                        name, "[", i, "] must be in [0, 1), got ", b[i]);
    }
  }
};

struct check_bits {
  void operator()(const char* cls, const char* name, int64_t value) const {
    TORCH_CHECK_VALUE(value == 8 || value == 32, "mixprec.optim.", cls, ": ",
                      name, " must be 8 or 32, got ", value);
  }
};

struct check_correction {
  void operator()(const char* cls, const char* name, int64_t value) const {
    TORCH_CHECK_VALUE(value == 0 || value == 16 || value == 8, "mixprec.optim.",
                      cls, ": ", name,
                      " must be 0 (float32 masters), 16 or 8, got ", value);
  }
};

struct check_count {
  void operator()(const char* cls, const char* name, int64_t value) const {
    TORCH_CHECK_VALUE(value >= 0, "mixprec.optim.", cls, ": ", name,
                      " must be an int >= 0, got ", value);
  }
};

// The Python class an options type belongs to.
template <typename O>
constexpr const char* class_name() {
  using T = std::remove_const_t<O>;
  if constexpr (std::is_same_v<T, AdamOptions>) {
    return "Adam";
  } else if constexpr (std::is_same_v<T, AdamWOptions>) {
    return "AdamW";
  } else {
    static_assert(std::is_same_v<T, SGDOptions>);
    return "SGD";
  }
}

// Calls f(name, value, flags, check) for every row of o's list, in order;
// value is o's own member (a reference: assignable when o is not const).
template <typename O, typename F>
void for_each_option(O& o, F&& f) {
  using T = std::remove_const_t<O>;
#define MIXPREC_VISIT_OPTION(type, name, default_value, check, flags) \
  f(#name, o.name(), static_cast<unsigned>(flags), check_##check{});
  if constexpr (std::is_same_v<T, AdamOptions>) {
    MIXPREC_ADAM_OPTIONS(MIXPREC_VISIT_OPTION)
  } else if constexpr (std::is_same_v<T, AdamWOptions>) {
    MIXPREC_ADAMW_OPTIONS(MIXPREC_VISIT_OPTION)
  } else {
    static_assert(std::is_same_v<T, SGDOptions>);
    MIXPREC_SGD_OPTIONS(MIXPREC_VISIT_OPTION)
  }
#undef MIXPREC_VISIT_OPTION
}

// Calls f(name, a's value, b's value, flags) for every row of the list of
// a's and b's type, in order.
template <typename O, typename F>
void for_each_option_pair(const O& a, const O& b, F&& f) {
#define MIXPREC_VISIT_OPTION_PAIR(type, name, default_value, check, flags) \
  f(#name, a.name(), b.name(), static_cast<unsigned>(flags));
  if constexpr (std::is_same_v<O, AdamOptions>) {
    MIXPREC_ADAM_OPTIONS(MIXPREC_VISIT_OPTION_PAIR)
  } else if constexpr (std::is_same_v<O, AdamWOptions>) {
    MIXPREC_ADAMW_OPTIONS(MIXPREC_VISIT_OPTION_PAIR)
  } else {
    static_assert(std::is_same_v<O, SGDOptions>);
    MIXPREC_SGD_OPTIONS(MIXPREC_VISIT_OPTION_PAIR)
  }
#undef MIXPREC_VISIT_OPTION_PAIR
}

// Calls f(o) with `options` as the mixprec options type it is (const);
// false when it is none of them.
template <typename F>
bool visit(const torch::optim::OptimizerOptions& options, F&& f) {
  if (const auto* a = dynamic_cast<const AdamOptions*>(&options)) {
    f(*a);
  } else if (const auto* w = dynamic_cast<const AdamWOptions*>(&options)) {
    f(*w);
  } else if (const auto* s = dynamic_cast<const SGDOptions*>(&options)) {
    f(*s);
  } else {
    return false;
  }
  return true;
}

// As above, for options to change.
template <typename F>
bool visit(torch::optim::OptimizerOptions& options, F&& f) {
  if (auto* a = dynamic_cast<AdamOptions*>(&options)) {
    f(*a);
  } else if (auto* w = dynamic_cast<AdamWOptions*>(&options)) {
    f(*w);
  } else if (auto* s = dynamic_cast<SGDOptions*>(&options)) {
    f(*s);
  } else {
    return false;
  }
  return true;
}

// Calls f(name, tensor) for every entry of s's state list
// (MIXPREC_ADAM_STATE, MIXPREC_SGD_STATE), in order; tensor is s's member.
template <typename S, typename F>
void for_each_state(S& s, F&& f) {
  using T = std::remove_const_t<S>;
#define MIXPREC_VISIT_STATE(name) f(#name, s.name());
  if constexpr (std::is_same_v<T, AdamParamState>) {
    MIXPREC_ADAM_STATE(MIXPREC_VISIT_STATE)
  } else {
    static_assert(std::is_same_v<T, SGDParamState>);
    MIXPREC_SGD_STATE(MIXPREC_VISIT_STATE)
  }
#undef MIXPREC_VISIT_STATE
}

// Calls f(s) with a param state as the mixprec state type it is; false when
// it is none of them.
template <typename State, typename F>
bool visit_state(State& state, F&& f) {
  using Adam = std::conditional_t<std::is_const_v<State>, const AdamParamState,
                                  AdamParamState>;
  using Sgd = std::conditional_t<std::is_const_v<State>, const SGDParamState,
                                 SGDParamState>;
  if (auto* a = dynamic_cast<Adam*>(&state)) {
    f(*a);
  } else if (auto* g = dynamic_cast<Sgd*>(&state)) {
    f(*g);
  } else {
    return false;
  }
  return true;
}

}  // namespace mixprec::optim::options_table
