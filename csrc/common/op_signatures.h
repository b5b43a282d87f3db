// The C++ signature of every schema in registration.cpp, in one place, for
// the code that calls the ops through the dispatcher with typed handles
// (ops.cpp, the Autograd kernels, the Python fast path). A mismatch with the
// schema fails at the first call with a dispatcher error.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>

namespace mixprec {
namespace sig {

using at::Tensor;
using at::TensorList;
using OptTensor = const std::optional<at::Tensor>&;

using UnscaleAndCheck = void(TensorList, const Tensor&, const Tensor&);
using CheckFinite = void(TensorList, const Tensor&);
// unscale_and_norm_ and check_finite_and_norm_
using Norm = Tensor(TensorList, const Tensor&, const Tensor&, double);
using UpdateScale = void(const Tensor&, const Tensor&, const Tensor&, double,
                         double, int64_t);
using UpdateScaleExt = void(const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, double, double, int64_t,
                            std::optional<double>, std::optional<double>,
                            int64_t);
using FusedAdam = void(TensorList, TensorList, TensorList, TensorList,
                       TensorList, TensorList, TensorList, const Tensor&,
                       double, double, double, double, bool, bool, bool,
                       OptTensor, OptTensor, OptTensor, bool, int64_t);
using FusedSgd = void(TensorList, TensorList, TensorList, TensorList,
                      TensorList, const Tensor&, double, double, double, bool,
                      bool, OptTensor, OptTensor, OptTensor, bool, int64_t);

// Schema names, usable as template arguments.
inline constexpr char kUnscaleAndCheck[] = "mixprec::unscale_and_check_";
inline constexpr char kCheckFinite[] = "mixprec::check_finite_";
inline constexpr char kUnscaleAndNorm[] = "mixprec::unscale_and_norm_";
inline constexpr char kCheckFiniteAndNorm[] = "mixprec::check_finite_and_norm_";
inline constexpr char kUpdateScale[] = "mixprec::update_scale_";
inline constexpr char kUpdateScaleExt[] = "mixprec::update_scale_ext_";
inline constexpr char kFusedAdam[] = "mixprec::fused_adam_";
inline constexpr char kFusedSgd[] = "mixprec::fused_sgd_";

// Every op once, as X(name constant, signature alias): the one list of the ops
// for code that must cover all of them (tests/cpp/test_link_kept.cpp). A new
// op adds its kXxx constant above and a line here.
#define MIXPREC_FOR_EACH_OP(X)         \
  X(kUnscaleAndCheck, UnscaleAndCheck) \
  X(kCheckFinite, CheckFinite)         \
  X(kUnscaleAndNorm, Norm)             \
  X(kCheckFiniteAndNorm, Norm)         \
  X(kUpdateScale, UpdateScale)         \
  X(kUpdateScaleExt, UpdateScaleExt)   \
  X(kFusedAdam, FusedAdam)             \
  X(kFusedSgd, FusedSgd)

}  // namespace sig
}  // namespace mixprec
