// mixprec::AutocastGuard -- an autocast region for LibTorch programs, the C++
// form of Python's `with torch.autocast(device, dtype)`:
//
//   {
//     mixprec::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
//     loss = loss_fn(model->forward(x), y);
//   }  // autocast state restored here
//
// Used with mixprec::GradScaler (<mixprec/grad_scaler.h>) for mixed-precision
// training; <mixprec/mixprec.h> includes both.
#pragma once

#include "mixprec/export.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace mixprec {

// RAII autocast region: enables autocast for `device` with `dtype` (or
// disables it, enabled = false), and on exit restores the previous state and
// clears the cast cache when the outermost region ends.
class MIXPREC_API AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype,
                bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

}  // namespace mixprec
