// mixprec::AutocastGuard (mixprec/autocast_guard.h): what torch.autocast's
// __enter__/__exit__ do, on ATen's autocast state.
#include "mixprec/autocast_guard.h"

#include <ATen/autocast_mode.h>

namespace mixprec {

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype,
                             bool enabled, bool cache_enabled)
    : device_(device),
      prev_enabled_(at::autocast::is_autocast_enabled(device)),
      prev_dtype_(at::autocast::get_autocast_dtype(device)),
      prev_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

}  // namespace mixprec
