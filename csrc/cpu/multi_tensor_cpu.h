// The CPU counterpart of multi-tensor apply: one flat work list made of the
// chunks of every tensor, processed by at::parallel_for, so that 2,000 small
// tensors keep every core busy just as one large tensor does.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "cpu/span_kernels.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace mixprec {
namespace cpu {

// Elements per work item: large enough to amortise the per-item dispatch,
// small enough that a few large tensors still split across cores.
constexpr int64_t kCpuChunk = 32768;

struct WorkItem {
  int32_t tensor;  // index into the dense tensor list
  int64_t begin;   // first element of the span
  int64_t end;     // one past the last element
};

inline SpanDtype span_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return SpanDtype::kFloat;
    case at::kHalf:
      return SpanDtype::kHalf;
    case at::kBFloat16:
      return SpanDtype::kBFloat16;
    case at::kDouble:
      return SpanDtype::kDouble;
    default:
      TORCH_INTERNAL_ASSERT(false, "unchecked dtype ", t, " reached a kernel");
  }
}

// Tensors as the kernels see them: flat spans over non-overlapping, dense
// memory. A strided tensor is replaced by a contiguous copy; when the op
// writes, `copy_back` restores the result into the original afterwards.
// Dense inputs are not copied or reference-counted here: the caller's tensor
// list outlives the DenseList, so their data pointers stay valid.
struct DenseList {
  // Per non-empty tensor, resolved once (not per chunk): data pointer, dtype
  // and element size, so the parallel loop touches no Tensor methods.
  std::vector<char*> base;
  std::vector<SpanDtype> dtype;
  std::vector<int64_t> esize;
  std::vector<at::Tensor> owned;  // contiguous copies of strided inputs
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (orig, dense)
  std::vector<WorkItem> items;
  int64_t total = 0;

  DenseList(at::TensorList tensors, bool written) {
    base.reserve(tensors.size());
    dtype.reserve(tensors.size());
    esize.reserve(tensors.size());
    items.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      const int64_t n = t.numel();
      if (n == 0) {
        continue;
      }
      const at::Tensor* d = &t;
      if (!t.is_non_overlapping_and_dense()) {
        owned.push_back(t.contiguous());
        d = &owned.back();
        if (written) {
          copy_back.emplace_back(t, *d);
        }
      }
      const auto idx = static_cast<int32_t>(base.size());
      base.push_back(static_cast<char*>(d->data_ptr()));
      dtype.push_back(span_dtype(d->scalar_type()));
      esize.push_back(static_cast<int64_t>(d->element_size()));
      for (int64_t b = 0; b < n; b += kCpuChunk) {
        items.push_back({idx, b, std::min(n, b + kCpuChunk)});
      }
      total += n;
    }
  }

  // The first element of a work item's span.
  void* ptr(const WorkItem& it) const {
    return base[it.tensor] + it.begin * esize[it.tensor];
  }

  void finish() {
    for (auto& pr : copy_back) {
      pr.first.copy_(pr.second);
    }
  }
};

// Runs `fn(const WorkItem&) -> bool` over every item, in parallel when there
// is enough work, and returns whether any call returned true.
template <typename Fn>
bool parallel_any(const std::vector<WorkItem>& items, int64_t total, Fn fn) {
  std::atomic<bool> any{false};
  const int64_t n = static_cast<int64_t>(items.size());
  // Below two chunks of work a thread hand-off costs more than it saves.
  const int64_t grain = total < 2 * kCpuChunk ? n + 1 : 1;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) {
      local |= fn(items[i]);
    }
    if (local) {
      any.store(true, std::memory_order_relaxed);
    }
  });
  return any.load();
}

}  // namespace cpu
}  // namespace mixprec
