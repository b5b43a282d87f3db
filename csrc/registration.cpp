// The one TORCH_LIBRARY block of mixprec: every schema, one contract comment
// each. Kernels register themselves per backend (csrc/cpu, csrc/cuda).
//
// Conventions: in-place ops end in `_`, declare what they mutate and return
// nothing; step-varying scalars (scale, found_inf, ...) are one-element device
// tensors so no op needs a host sync; found_inf is float32 and is only ever
// set to 1.0, never cleared.
#include <torch/library.h>

TORCH_LIBRARY(mixprec, m) {
  // grads *= inv_scale in place (math in float32 for fp16/bf16, float64 for
  // float64); found_inf = 1 if any input value was inf or NaN. Bitwise equal
  // to torch._amp_foreach_non_finite_check_and_unscale_ wherever that accepts
  // the input; also bf16, and lists mixing dtypes.
  m.def(
      "unscale_and_check_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
      "Tensor inv_scale) -> ()");
  // found_inf = 1 if any value of `tensors` is inf or NaN; reads only.
  m.def("check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()");
  // unscale_and_check_ that also returns the total norm_type-norm of the
  // unscaled grads (0-dim float32, on their device), all in one pass; the
  // norm of clip_grad_norm_ after unscale_. norm_type > 0 or inf.
  m.def(
      "unscale_and_norm_(Tensor(a!)[] grads, Tensor(b!) found_inf, "
      "Tensor inv_scale, float norm_type=2.0) -> Tensor");
  // torch._amp_update_scale_, bit for bit.
  m.def(
      "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor found_inf, float growth_factor, float backoff_factor, "
      "int growth_interval) -> ()");
  // update_scale_ with hysteresis (state in hysteresis_left) and optional
  // min/max bounds on the scale; the rule is in common/update_scale_math.h.
  m.def(
      "update_scale_ext_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor(c!) hysteresis_left, Tensor found_inf, float growth_factor, "
      "float backoff_factor, int growth_interval, float? min_scale=None, "
      "float? max_scale=None, int hysteresis=1) -> ()");
}
