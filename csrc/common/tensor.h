// The tensor vocabulary of mixprec's kernels: torch's stable ABI
// (torch/csrc/stable, torch/headeronly) and the few helpers the kernels need
// on top of it. Every kernel, check and launcher includes this header instead
// of ATen or c10, so the op libraries build with TORCH_TARGET_VERSION and load
// into every torch from that version on.
//
// Errors: MIXPREC_CHECK throws with the message its arguments stream:
// std::runtime_error in the op libraries (a RuntimeError in Python), c10::Error
// where the same sources build libmixprec against the full LibTorch;
// MIXPREC_INTERNAL_ASSERT marks a bug in mixprec, not a user error.
#pragma once

#include <torch/csrc/stable/device.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixprec {

using Tensor = torch::stable::Tensor;
// A view of a list of tensors (the op's std::vector<Tensor> argument).
using TensorList = torch::headeronly::HeaderOnlyArrayRef<Tensor>;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;
using ScalarType = torch::headeronly::ScalarType;
using Layout = torch::headeronly::Layout;
using DeviceType = torch::headeronly::DeviceType;
using Device = torch::stable::Device;

namespace detail {

inline void stream_all(std::ostringstream&) {}

template <typename T, typename... Rest>
void stream_all(std::ostringstream& os, const T& first, const Rest&... rest);

}  // namespace detail

// "cpu", "cuda", "cuda:1", ...
inline std::string device_str(DeviceType type, int index = -1) {
  std::string s = type == DeviceType::CPU ? "cpu"
                  : type == DeviceType::CUDA
                      ? "cuda"
                      : "device type " + std::to_string(static_cast<int>(type));
  if (index >= 0) {
    s += ":" + std::to_string(index);
  }
  return s;
}

inline std::string device_str(const Device& d) {
  return device_str(d.type(), d.index());
}

// "[2, 3]": sizes or strides, for messages.
inline std::string dims_str(IntArrayRef dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  }
  return s + "]";
}

inline const char* dtype_str(ScalarType t) {
  return torch::headeronly::toString(t);
}

// The arguments streamed into one string (as c10::str).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::stream_all(os, args...);
  return os.str();
}

namespace detail {

template <typename T>
void stream_one(std::ostringstream& os, const T& v) {
  if constexpr (std::is_same_v<T, Device>) {
    os << device_str(v);
  } else if constexpr (std::is_same_v<T, DeviceType>) {
    os << device_str(v);
  } else if constexpr (std::is_same_v<T, ScalarType>) {
    os << dtype_str(v);
  } else if constexpr (std::is_same_v<T, Layout>) {
    static const char* const names[] = {"Strided",   "Sparse",    "SparseCsr",
                                        "Mkldnn",    "SparseCsc", "SparseBsr",
                                        "SparseBsc", "Jagged"};
    const auto k = static_cast<size_t>(v);
    os << (k < sizeof(names) / sizeof(names[0]) ? names[k] : "unknown layout");
  } else if constexpr (std::is_same_v<T, IntArrayRef>) {
    os << dims_str(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else {
    os << v;
  }
}

template <typename T, typename... Rest>
void stream_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  stream_one(os, first);
  stream_all(os, rest...);
}

}  // namespace detail

// Whether every element has its own memory and together they fill one
// block without gaps, in some order of the dimensions
// (at::Tensor::is_non_overlapping_and_dense).
inline bool is_dense(const Tensor& t) {
  const int64_t n = t.dim();
  const IntArrayRef sizes = t.sizes();
  const IntArrayRef strides = t.strides();
  if (n == 1) {
    return sizes[0] < 2 || strides[0] == 1;
  }
  // Dimensions of size >= 2 by increasing stride, each stride the product
  // of the sizes before it.
  std::vector<int64_t> perm;
  perm.reserve(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) {
    perm.push_back(d);
  }
  std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    if (sizes[a] < 2) {
      return false;
    }
    if (sizes[b] < 2) {
      return true;
    }
    return strides[a] < strides[b];
  });
  int64_t expected = 1;
  for (const int64_t d : perm) {
    if (sizes[d] < 2) {
      return true;
    }
    if (strides[d] != expected) {
      return false;
    }
    expected *= sizes[d];
  }
  return true;
}

// Whether some element of `t` is certainly stored at the address of another
// (a stride of 0 over a dimension of size > 1): at::has_internal_overlap ==
// MemOverlap::Yes.
inline bool has_internal_overlap(const Tensor& t) {
  if (is_dense(t)) {
    return false;
  }
  const IntArrayRef sizes = t.sizes();
  const IntArrayRef strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 1 && strides[d] == 0) {
      return true;
    }
  }
  return false;
}

// A contiguous copy of `t` (t itself when it is contiguous).
inline Tensor dense_copy(const Tensor& t) {
  return torch::stable::contiguous(t);
}

// dst.copy_(src).
inline void copy_into(Tensor& dst, const Tensor& src) {
  torch::stable::copy_(dst, src);
}

// A new 0-dim tensor of `like`'s dtype and device.
inline Tensor new_scalar(const Tensor& like) {
  return torch::stable::new_empty(like, IntArrayRef{});
}

// A new 1-dim tensor of n elements of dtype `dtype` on `like`'s device.
inline Tensor new_vector(const Tensor& like, int64_t n, ScalarType dtype) {
  return torch::stable::new_empty(like, IntArrayRef{n}, dtype);
}

}  // namespace mixprec

#ifdef TORCH_TARGET_VERSION
// The op libraries (stable ABI): std::runtime_error, a RuntimeError in Python.
#define MIXPREC_CHECK(cond, ...)                             \
  do {                                                       \
    if (!(cond)) {                                           \
      throw std::runtime_error(::mixprec::str(__VA_ARGS__)); \
    }                                                        \
  } while (false)
#else
// libmixprec (a LibTorch build): c10::Error, as every LibTorch op throws, so
// C++ callers catch mixprec's errors as torch's.
#include <c10/util/Exception.h>
#define MIXPREC_CHECK(cond, ...)                       \
  do {                                                 \
    if (!(cond)) {                                     \
      TORCH_CHECK(false, ::mixprec::str(__VA_ARGS__)); \
    }                                                  \
  } while (false)
#endif

#define MIXPREC_INTERNAL_ASSERT(cond, ...)                                 \
  do {                                                                     \
    if (!(cond)) {                                                         \
      throw std::logic_error(::mixprec::str(                               \
          "mixprec internal error (a bug; please report it) at " __FILE__, \
          ":", __LINE__, ": " #cond " ", ##__VA_ARGS__));                  \
    }                                                                      \
  } while (false)
