// Argument checks shared by every op's CPU and CUDA kernels. Every message
// names the op and the argument, and every check runs before any tensor is
// written, so an op that rejects its input modifies nothing.
#pragma once

#include "common/tensor.h"

#include <optional>
#include <string>

#include "op_table.h"

namespace mixprec {
namespace checks {

// A one-element dense tensor (found_inf, inv_scale, scale, growth_tracker,
// lr, grad_scale, ...) of dtype `dtype`, or `alt` when that is not Undefined,
// on `device`: the device of the argument named `device_of`. Every op's
// scalar-tensor arguments go through this one check.
void check_scalar_tensor(const char* op, const char* name, const Tensor& t,
                         ScalarType dtype, const Device& device,
                         const char* device_of,
                         ScalarType alt = ScalarType::Undefined);

// A list of gradient-like tensors: dense (strided layout), on `device`, of a
// floating dtype mixprec handles (float32, float16, bfloat16, float64), and,
// when `written`, without internal overlap (an in-place write must touch each
// element once).
void check_grad_list(const char* op, const char* name, TensorList tensors,
                     const Device& device, bool written);
// The same checks for tensors[i] == t alone (check_grad_list is a loop of it),
// for launchers that check while they plan, in one pass over the list.
void check_grad_member(const char* op, const char* name, size_t i,
                       const Tensor& t, const Device& device, bool written);

// No two dense tensors of a list that an op writes share memory (the same
// tensor twice, or overlapping views of one): an in-place update would write
// an element twice. Checked before the tensors one by one (tensors that are
// undefined, empty, not strided or not dense are left to those checks).
void check_disjoint(const char* op, const char* name, TensorList tensors);

bool is_supported_float(ScalarType t);

// a == b for sizes or strides, inline: the planners compare a few int64 per
// tensor, where IntArrayRef's == calls memcmp.
inline bool same_dims(IntArrayRef a, IntArrayRef b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k] != b[k]) {
      return false;
    }
  }
  return true;
}

// The arguments of the unscale family (unscale_and_check_, check_finite_,
// unscale_and_norm_): found_inf (float32, one element) on a `backend` device,
// inv_scale (when given) likewise on the same device, and the tensor list as
// in check_grad_list (written when inv_scale is given, unless read_only).
// With each_tensor false the list's tensors are left to the caller, which
// must run check_grad_member on every one of them before it writes anything.
// Returns the device of the call (found_inf's).
Device check_unscale_args(const char* op, TensorList tensors,
                          const Tensor& found_inf, const Tensor* inv_scale,
                          DeviceType backend, bool read_only = false,
                          bool each_tensor = true);

// norm_type must be > 0 (inf allowed) and not NaN.
void check_norm_type(const char* op, double norm_type);

// update_scale_: scale (float32), growth_tracker (int32), optional
// hysteresis_left (int32) and found_inf (float32), one element each, all on
// the device of scale; growth_interval >= 1.
void check_update_scale_args(const char* op, const Tensor& scale,
                             const Tensor& growth_tracker,
                             const Tensor* hysteresis_left,
                             const Tensor& found_inf, int64_t growth_interval);

// The statistics arguments of update_scale_(ext_): counts (int64, 5 elements,
// 1-D, dense) and prev_scale (float32, one element), both or neither, on
// `device`. Returns whether they are given.
bool check_scale_stats(const char* op, const std::optional<Tensor>& counts,
                       const std::optional<Tensor>& prev_scale,
                       const Device& device);

struct ScaleBounds {
  double min_scale;  // 0 when not given
  double max_scale;  // +inf when not given
};

// update_scale_ext_: the above plus growth_factor > 1, 0 < backoff_factor < 1,
// hysteresis >= 1, 0 < min_scale <= max_scale (both finite when given).
ScaleBounds check_update_scale_ext_args(const OpArgs<Op::update_scale_ext_>& a);

}  // namespace checks
}  // namespace mixprec
