#include "common/checks.h"

#include "common/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mixprec {
namespace checks {

bool is_supported_float(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Half ||
         t == ScalarType::BFloat16 || t == ScalarType::Double;
}

namespace {

// torch's name of the dtypes these checks ask for (float32, not Float)
const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return "float32";
    case ScalarType::Double:
      return "float64";
    case ScalarType::Int:
      return "int32";
    default:
      return dtype_str(t);
  }
}

}  // namespace

void check_scalar_tensor(const char* op, const char* name, const Tensor& t,
                         ScalarType dtype, const Device& device,
                         const char* device_of, ScalarType alt) {
  const bool has_alt = alt != ScalarType::Undefined;
  MIXPREC_CHECK(t.defined(), "mixprec.", op, ": ", name, " is undefined");
  MIXPREC_CHECK(t.layout() == Layout::Strided, "mixprec.", op, ": ", name,
                " must be a dense (strided) tensor, got layout ", t.layout());
  MIXPREC_CHECK(t.scalar_type() == dtype || (has_alt && t.scalar_type() == alt),
                "mixprec.", op, ": ", name, " must be a ", dtype_name(dtype),
                has_alt ? " or " : "", has_alt ? dtype_name(alt) : "",
                " tensor, got ", t.scalar_type());
  MIXPREC_CHECK(t.numel() == 1, "mixprec.", op, ": ", name,
                " must be a one-element tensor, got shape ", t.sizes());
  MIXPREC_CHECK(t.device() == device, "mixprec.", op, ": ", name,
                " must be on ", device, " (the device of ", device_of,
                "), got ", t.device());
}

void check_grad_member(const char* op, const char* name, size_t i,
                       const Tensor& t, const Device& device, bool written) {
  MIXPREC_CHECK(t.defined(), "mixprec.", op, ": ", name, "[", i,
                "] is undefined");
  MIXPREC_CHECK(t.layout() == Layout::Strided, "mixprec.", op, ": ", name, "[",
                i, "] must be a dense (strided) tensor, got layout ",
                t.layout(),
                "; coalesce sparse gradients and pass "
                "their values() instead");
  MIXPREC_CHECK(is_supported_float(t.scalar_type()), "mixprec.", op, ": ", name,
                "[", i, "] must be float32, float16, bfloat16 or float64, got ",
                t.scalar_type());
  MIXPREC_CHECK(t.device() == device, "mixprec.", op, ": ", name, "[", i,
                "] is on ", t.device(), " but found_inf is on ", device,
                "; call the op once per device");
  if (written && !is_dense(t)) {
    MIXPREC_CHECK(!has_internal_overlap(t), "mixprec.", op, ": ", name, "[", i,
                  "] has internal overlap (e.g. an expanded tensor), so an "
                  "in-place write would touch an element more than once");
  }
}

void check_disjoint(const char* op, const char* name, TensorList tensors) {
  if (tensors.size() < 2) {
    return;
  }
  struct Span {
    uintptr_t begin;
    uintptr_t end;
    size_t index;
  };
  // (an undefined first tensor has no device to compare with: named here, as
  // the member checks would name it)
  MIXPREC_CHECK(tensors[0].defined(), "mixprec.", op, ": ", name,
                "[0] is undefined");
  const Device device = tensors[0].device();
  std::vector<Span> spans;
  spans.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined() || t.layout() != Layout::Strided) {
      continue;
    }
    const int64_t numel = t.numel();
    if (numel == 0 || !is_dense(t)) {
      continue;
    }
    const void* data = t.data_ptr();
    if (data == nullptr || t.device() != device) {
      continue;
    }
    const auto begin = reinterpret_cast<uintptr_t>(data);
    spans.push_back(
        {begin,
         begin + static_cast<uintptr_t>(numel *
                                        static_cast<int64_t>(t.element_size())),
         i});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < spans.size(); ++k) {
    const Span& a = spans[k - 1];
    const Span& b = spans[k];
    MIXPREC_CHECK(
        b.begin >= a.end, "mixprec.", op, ": ", name, "[",
        std::min(a.index, b.index), "] and ", name, "[",
        std::max(a.index, b.index),
        "] share memory (the same tensor twice, or overlapping views "
        "of one), so an in-place update would write an element twice");
  }
}

void check_grad_list(const char* op, const char* name, TensorList tensors,
                     const Device& device, bool written) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_grad_member(op, name, i, tensors[i], device, written);
  }
}

}  // namespace checks
}  // namespace mixprec

namespace mixprec {
namespace checks {

void check_update_scale_args(const char* op, const Tensor& scale,
                             const Tensor& growth_tracker,
                             const Tensor* hysteresis_left,
                             const Tensor& found_inf, int64_t growth_interval) {
  MIXPREC_CHECK(scale.defined(), "mixprec.", op, ": scale is undefined");
  const Device device = scale.device();
  check_scalar_tensor(op, "scale", scale, ScalarType::Float, device, "scale");
  check_scalar_tensor(op, "growth_tracker", growth_tracker, ScalarType::Int,
                      device, "scale");
  if (hysteresis_left != nullptr) {
    check_scalar_tensor(op, "hysteresis_left", *hysteresis_left,
                        ScalarType::Int, device, "scale");
  }
  check_scalar_tensor(op, "found_inf", found_inf, ScalarType::Float, device,
                      "scale");
  MIXPREC_CHECK(growth_interval >= 1 && growth_interval <= INT32_MAX,
                "mixprec.", op,
                ": growth_interval must be a positive 32-bit integer, got ",
                growth_interval);
}

bool check_scale_stats(const char* op, const std::optional<Tensor>& counts,
                       const std::optional<Tensor>& prev_scale,
                       const Device& device) {
  const bool has_counts = counts.has_value() && counts->defined();
  const bool has_prev = prev_scale.has_value() && prev_scale->defined();
  MIXPREC_CHECK(has_counts == has_prev, "mixprec.", op,
                ": counts and prev_scale go together, got ",
                has_counts ? "counts" : "prev_scale", " alone");
  if (!has_counts) return false;
  const Tensor& c = *counts;
  MIXPREC_CHECK(c.layout() == Layout::Strided, "mixprec.", op,
                ": counts must be a dense (strided) tensor, got layout ",
                c.layout());
  MIXPREC_CHECK(c.scalar_type() == ScalarType::Long, "mixprec.", op,
                ": counts must be an int64 tensor, got ", c.scalar_type());
  MIXPREC_CHECK(c.dim() == 1 && c.numel() == 5 && is_dense(c), "mixprec.", op,
                ": counts must be a dense 1-D tensor of 5 elements, got shape ",
                c.sizes(), " strides ", c.strides());
  MIXPREC_CHECK(c.device() == device, "mixprec.", op, ": counts must be on ",
                device, " (the device of scale), got ", c.device());
  check_scalar_tensor(op, "prev_scale", *prev_scale, ScalarType::Float, device,
                      "scale");
  return true;
}

ScaleBounds check_update_scale_ext_args(
    const OpArgs<Op::update_scale_ext_>& a) {
  MIXPREC_BIND(a, scale, growth_tracker, hysteresis_left, found_inf,
               growth_factor, backoff_factor, growth_interval, min_scale,
               max_scale, hysteresis)
  const char* op = "update_scale_ext_";
  check_update_scale_args(op, scale, growth_tracker, &hysteresis_left,
                          found_inf, growth_interval);
  MIXPREC_CHECK(growth_factor > 1.0 && std::isfinite(growth_factor), "mixprec.",
                op, ": growth_factor must be a finite number > 1, got ",
                growth_factor);
  MIXPREC_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0, "mixprec.", op,
                ": backoff_factor must be in (0, 1), got ", backoff_factor);
  MIXPREC_CHECK(hysteresis >= 1 && hysteresis <= INT32_MAX, "mixprec.", op,
                ": hysteresis must be a positive 32-bit integer, got ",
                hysteresis);
  ScaleBounds b{0.0, std::numeric_limits<double>::infinity()};
  if (min_scale.has_value()) {
    MIXPREC_CHECK(*min_scale > 0.0 && std::isfinite(*min_scale), "mixprec.", op,
                  ": min_scale must be a finite number > 0, got ", *min_scale);
    b.min_scale = *min_scale;
  }
  if (max_scale.has_value()) {
    MIXPREC_CHECK(*max_scale > 0.0 && std::isfinite(*max_scale), "mixprec.", op,
                  ": max_scale must be a finite number > 0, got ", *max_scale);
    b.max_scale = *max_scale;
  }
  MIXPREC_CHECK(b.min_scale <= b.max_scale, "mixprec.", op, ": min_scale (",
                b.min_scale, ") must not exceed max_scale (", b.max_scale, ")");
  return b;
}

}  // namespace checks
}  // namespace mixprec

namespace mixprec {
namespace checks {

Device check_unscale_args(const char* op, TensorList tensors,
                          const Tensor& found_inf, const Tensor* inv_scale,
                          DeviceType backend, bool read_only,
                          bool each_tensor) {
  MIXPREC_CHECK(
      found_inf.defined() && found_inf.device().type() == backend, "mixprec.",
      op, ": found_inf must be a ", device_str(backend),
      " tensor on the device of the tensors, got ",
      found_inf.defined() ? device_str(found_inf.device()) : "undefined");
  const Device device = found_inf.device();
  check_scalar_tensor(op, "found_inf", found_inf, ScalarType::Float, device,
                      "found_inf");
  if (inv_scale != nullptr) {
    check_scalar_tensor(op, "inv_scale", *inv_scale, ScalarType::Float, device,
                        "found_inf");
  }
  const bool written = inv_scale != nullptr && !read_only;
  if (written) {
    check_disjoint(op, "grads", tensors);
  }
  if (each_tensor) {
    check_grad_list(op, inv_scale != nullptr ? "grads" : "tensors", tensors,
                    device, written);
  }
  return device;
}

void check_norm_type(const char* op, double norm_type) {
  MIXPREC_CHECK(norm_type > 0.0, "mixprec.", op,
                ": norm_type must be > 0 or inf, got ", norm_type);
}

}  // namespace checks
}  // namespace mixprec
