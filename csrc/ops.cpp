// The typed dispatcher calls behind the public C++ functions
// (include/mixprec/ops.h), instantiated for every op of the table.
#include "mixprec/ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "op_dispatch.h"

namespace mixprec {
namespace detail {

template <auto Fn, class Ret, class... Args>
Ret Dispatch<Fn, Ret(Args...)>::call(Args... args) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(OpInfo<OpOfFn<Fn>::value>::kName, "")
          .template typed<Ret(Args...)>();
  return op.call(args...);
}

#define MIXPREC_INSTANTIATE_DISPATCH_(op) \
  template struct Dispatch<&::mixprec::op>;
MIXPREC_FOR_EACH_OP(MIXPREC_INSTANTIATE_DISPATCH_)
#undef MIXPREC_INSTANTIATE_DISPATCH_

}  // namespace detail
}  // namespace mixprec
