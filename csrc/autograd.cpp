// Autograd-key kernels of every mixprec op.
//
// mixprec's ops are not differentiable: they mutate gradients, optimizer
// state and loss-scale state. Without a kernel of their own at the Autograd
// key, the dispatcher would send every call through PyTorch's boxed
// "autograd not implemented" fallback, which converts each argument to an
// IValue and back (a tensor-list op with 2,000 tensors spent most of its host
// time there). These unboxed kernels do what that fallback must do for a
// non-differentiable op, without boxing:
//
//   * with grad mode on, a tensor the schema marks as written (Tensor(a!))
//     must not require grad: writing it in place would silently corrupt
//     autograd's view of it, so this is an error naming the argument (the
//     GradScaler and the optimizers call the ops under torch.no_grad());
//   * the call is redispatched below autograd (outputs never require grad);
//   * the version counter of every written tensor is bumped, as PyTorch's own
//     in-place ops do, so autograd notices a tensor saved for backward that an
//     op changed afterwards.
//
// Built into libmixprec only (CMakeLists.txt). The Python package's op
// library leaves this file out (setup.py) and registers the same kernels from
// Python (python/mixprec/ops/_autograd.py): one Autograd kernel per op in a
// process.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "op_dispatch.h"

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mixprec {
namespace {

// Calls f(tensor, element index or -1) for each defined tensor in an argument
// (Tensor, Tensor[], Tensor?); other argument types hold none.
template <class F>
void for_each_tensor(const at::Tensor& t, F&& f) {
  if (t.defined()) {
    f(t, -1);
  }
}
template <class F>
void for_each_tensor(at::TensorList ts, F&& f) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].defined()) {
      f(ts[i], static_cast<int64_t>(i));
    }
  }
}
template <class F>
void for_each_tensor(const std::optional<at::Tensor>& t, F&& f) {
  if (t.has_value() && t->defined()) {
    f(*t, -1);
  }
}
template <class T, class F,
          std::enable_if_t<!std::is_convertible_v<const T&, at::TensorList> &&
                               !std::is_same_v<T, at::Tensor> &&
                               !std::is_same_v<T, std::optional<at::Tensor>>,
                           int> = 0>
void for_each_tensor(const T& /*unused*/, F&& /*unused*/) {}

// Per schema argument: written in place (an alias annotation with '!').
std::vector<bool> written_arguments(const c10::FunctionSchema& schema) {
  std::vector<bool> out;
  for (const c10::Argument& a : schema.arguments()) {
    out.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
  }
  return out;
}

template <const char* Name, class Sig>
struct NoGradKernel;

template <const char* Name, class Ret, class... Args>
struct NoGradKernel<Name, Ret(Args...)> {
  static Ret fn(Args... args) {
    if (at::GradMode::is_enabled()) {
      size_t index = 0;
      (check_no_grad(index++, args), ...);
    }
    if constexpr (std::is_void_v<Ret>) {
      call_below_autograd(args...);
      bump_written(args...);
    } else {
      Ret out = call_below_autograd(args...);
      bump_written(args...);
      return out;
    }
  }

 private:
  static const c10::TypedOperatorHandle<Ret(Args...)>& op() {
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow(Name, "")
                                   .template typed<Ret(Args...)>();
    return handle;
  }

  // Per argument: does the schema write it in place?
  static const std::vector<bool>& written() {
    static const std::vector<bool> w = [] {
      std::vector<bool> out = written_arguments(op().schema());
      TORCH_INTERNAL_ASSERT(out.size() == sizeof...(Args));
      return out;
    }();
    return w;
  }

  static Ret call_below_autograd(Args... args) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return op().call(args...);
  }

  template <class T>
  static void check_no_grad(size_t index, const T& arg) {
    if (!written()[index]) {
      return;
    }
    for_each_tensor(arg, [&](const at::Tensor& t, int64_t element) {
      TORCH_CHECK(!t.requires_grad(), "mixprec.",
                  op().schema().name().substr(9), ": ",
                  op().schema().arguments()[index].name(),
                  element >= 0 ? "[" + std::to_string(element) + "]" : "",
                  " requires grad, but mixprec ops are not differentiable and "
                  "write it in place; call the op under torch.no_grad() or "
                  "pass detached tensors");
    });
  }

  static void bump_written(const Args&... args) {
    size_t index = 0;
    (bump(written()[index++], args), ...);
  }

  template <class T>
  static void bump(bool is_written, const T& arg) {
    if (is_written) {
      for_each_tensor(arg, [](const at::Tensor& t, int64_t /*unused*/) {
        t.unsafeGetTensorImpl()->bump_version();
      });
    }
  }
};

}  // namespace
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, Autograd, m) {
#define MIXPREC_AUTOGRAD_IMPL_(op)                                             \
  m.impl(#op,                                                                  \
         &::mixprec::NoGradKernel<::mixprec::OpInfo<::mixprec::Op::op>::kName, \
                                  ::mixprec::OpSig<&::mixprec::op>>::fn);
  MIXPREC_FOR_EACH_OP(MIXPREC_AUTOGRAD_IMPL_)
#undef MIXPREC_AUTOGRAD_IMPL_
}
