// Links mixprec::mixprec but calls none of its symbols: the ops must still be
// registered, i.e. libmixprec must stay on the link line (--no-as-needed on the
// exported target) and its static registrations must run at load.
//
// The ops come from MIXPREC_FOR_EACH_OP (csrc/op_table.h; only the
// names are used, no libmixprec symbol), and the list is checked against the
// dispatcher both ways, so an op added to the library but not to the list
// fails here too.
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>
#include <set>
#include <string>

#include "op_table.h"

namespace {

#define MIXPREC_LINK_KEPT_NAME(op) "mixprec::" #op,
constexpr const char* kOps[] = {MIXPREC_FOR_EACH_OP(MIXPREC_LINK_KEPT_NAME)};
#undef MIXPREC_LINK_KEPT_NAME

}  // namespace

int main() {
  int passed = 0, failed = 0;
  std::set<std::string> listed;
  for (const char* name : kOps) {
    listed.insert(name);
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    const bool ok =
        op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
    if (ok) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL %s is not registered with a CPU kernel\n", name);
    }
  }
  // Every registered mixprec op is in MIXPREC_FOR_EACH_OP.
  int registered = 0;
  for (const c10::OperatorName& op :
       c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name.rfind("mixprec::", 0) != 0) {
      continue;
    }
    ++registered;
    if (listed.count(op.name) != 0) {
      ++passed;
    } else {
      ++failed;
      std::printf(
          "FAIL %s is registered but missing from MIXPREC_FOR_EACH_OP\n",
          op.name.c_str());
    }
  }
  std::printf("%zu ops listed, %d registered\n", listed.size(), registered);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
