// The CPU counterpart of multi-tensor apply: one flat work list made of the
// chunks of every tensor (WorkList), processed by torch::stable::parallel_for,
// so that 2,000 small tensors keep every core busy just as one large tensor
// does. Every CPU kernel over tensor lists runs through it: the unscale family
// over a DenseTensors, the fused optimizers over a FlatSet (fused_optim_cpu.h).
#pragma once

#include "common/tensor.h"

#include "cpu/span_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace mixprec {
namespace cpu {

// Elements per work item: large enough to amortise the per-item dispatch,
// small enough that a few large tensors still split across cores.
constexpr int64_t kCpuChunk = 32768;

struct WorkItem {
  int32_t tensor;  // index of the tensor in the caller's list
  int64_t begin;   // first element of the span
  int64_t end;     // one past the last element
};

// The chunks of kCpuChunk elements of a list of tensors, in list order, and
// the parallel loops over them.
struct WorkList {
  std::vector<WorkItem> items;
  int64_t total = 0;  // elements over all items

  // Appends the chunks of `numel` elements of tensor `tensor` (none when 0).
  void add(int32_t tensor, int64_t numel) {
    for (int64_t b = 0; b < numel; b += kCpuChunk) {
      items.push_back({tensor, b, std::min(numel, b + kCpuChunk)});
    }
    total += numel;
  }

  // The position of `it` (a reference into `items`) in the list.
  size_t index(const WorkItem& it) const {
    return static_cast<size_t>(&it - items.data());
  }

  // Calls fn(const WorkItem&) on every item, in parallel when there is
  // enough work (see claim_items).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    claim_items([&](const WorkItem& it) {
      fn(it);
      return false;
    });
  }

  // Runs `fn(const WorkItem&) -> bool` over every item (as for_each) and
  // returns whether any call returned true.
  template <typename Fn>
  bool any(Fn&& fn) const {
    return claim_items(fn);
  }

 private:
  // Below two chunks of work a thread hand-off costs more than it saves: the
  // items run on the calling thread. Else one worker per thread of torch's
  // pool claims the next unclaimed item until none is left (an atomic
  // counter), instead of each thread taking a fixed share. That costs one
  // atomic add per 32768-element item. Where other processes compete for the
  // cores (a shared VM, a data loader), a thread that is descheduled holds up
  // the call by at most the item it is on, not by the rest of its share,
  // which the other threads take over. Which thread runs an item changes
  // nothing in the results: each item's work is independent, and the callers
  // combine per-item results in item order (WorkList::index).
  template <typename Fn>
  bool claim_items(Fn&& fn) const {
    const int64_t n = static_cast<int64_t>(items.size());
    const auto threads = static_cast<int64_t>(torch::stable::get_num_threads());
    if (total < 2 * kCpuChunk || n < 2 || threads < 2) {
      bool found = false;
      for (int64_t i = 0; i < n; ++i) {
        found |= fn(items[i]);
      }
      return found;
    }
    const int64_t workers = std::min<int64_t>(threads, n);
    std::atomic<int64_t> next{0};
    std::atomic<bool> found{false};
    torch::stable::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
      bool local = false;
      for (int64_t w = begin; w < end; ++w) {
        for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
             i = next.fetch_add(1, std::memory_order_relaxed)) {
          local |= fn(items[i]);
        }
      }
      if (local) {
        found.store(true, std::memory_order_relaxed);
      }
    });
    return found.load();
  }
};

inline SpanDtype span_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return SpanDtype::kFloat;
    case ScalarType::Half:
      return SpanDtype::kHalf;
    case ScalarType::BFloat16:
      return SpanDtype::kBFloat16;
    case ScalarType::Double:
      return SpanDtype::kDouble;
    default:
      MIXPREC_INTERNAL_ASSERT(false, "unchecked dtype ", t,
                              " reached a kernel");
  }
}

// A tensor list as the unscale kernels see it: flat spans over
// non-overlapping, dense memory, and their WorkList. A strided tensor is
// replaced by a contiguous copy; when the op writes, finish() restores the
// result into the original. Dense inputs are not copied or reference-counted
// here: the caller's tensor list outlives the DenseTensors, so their data
// pointers stay valid. (The fused optimizers' counterpart is optim::FlatSet.)
struct DenseTensors {
  // Per non-empty tensor (WorkItem::tensor indexes these), resolved once (not
  // per chunk): data pointer, dtype and element size, so the parallel loop
  // touches no Tensor methods.
  std::vector<char*> base;
  std::vector<SpanDtype> dtype;
  std::vector<int64_t> esize;
  std::vector<Tensor> owned;  // contiguous copies of strided inputs
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (orig, dense)
  WorkList work;

  DenseTensors(TensorList tensors, bool written) {
    base.reserve(tensors.size());
    dtype.reserve(tensors.size());
    esize.reserve(tensors.size());
    work.items.reserve(tensors.size());
    for (const Tensor& t : tensors) {
      const int64_t n = t.numel();
      if (n == 0) {
        continue;
      }
      const Tensor* d = &t;
      if (!is_dense(t)) {
        owned.push_back(dense_copy(t));
        d = &owned.back();
        if (written) {
          copy_back.emplace_back(t, *d);
        }
      }
      const auto idx = static_cast<int32_t>(base.size());
      base.push_back(static_cast<char*>(d->data_ptr()));
      dtype.push_back(span_dtype(d->scalar_type()));
      esize.push_back(static_cast<int64_t>(d->element_size()));
      work.add(idx, n);
    }
  }

  // The first element of a work item's span.
  void* ptr(const WorkItem& it) const {
    return base[it.tensor] + it.begin * esize[it.tensor];
  }

  void finish() {
    for (auto& pr : copy_back) {
      copy_into(pr.first, pr.second);
    }
  }
};

}  // namespace cpu
}  // namespace mixprec
