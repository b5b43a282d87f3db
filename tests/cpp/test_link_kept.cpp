// Links mixprec::mixprec but calls none of its symbols: the ops must still be
// registered, i.e. libmixprec must stay on the link line (--no-as-needed on the
// exported target) and its static registrations must run at load.
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>

int main() {
  int passed = 0, failed = 0;
  for (const char* name : {"mixprec::unscale_and_check_", "mixprec::check_finite_",
                           "mixprec::unscale_and_norm_", "mixprec::update_scale_",
                           "mixprec::update_scale_ext_", "mixprec::fused_adam_",
                           "mixprec::fused_sgd_"}) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    const bool ok = op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
    if (ok) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL %s is not registered with a CPU kernel\n", name);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
