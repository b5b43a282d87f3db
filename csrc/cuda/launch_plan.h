// The launch plan of mixprec's multi-tensor CUDA kernels, and the per-block
// view of it that the kernel bodies (functors) read.
//
// This header is plain C++: nvcc compiles it into the CUDA kernels, and the
// host compiler compiles the very same code into the host emulation
// (csrc/cuda_emulation), which runs the plan and the functor bodies over an
// emulated grid on CPU tensors so that CI, which has no GPU, executes them.
//
// The plan: the chunks of many tensors are processed in as few kernel
// launches as the kernel-parameter space allows. The tensor addresses, sizes
// and the block -> (tensor, chunk) map travel by value as one kernel argument
// (TensorListMeta), so a launch needs no host-to-device copy and no host sync.
// CUDA >= 12.1 allows 32,764 bytes of kernel parameters on sm_70 and newer
// (the classic limit is 4,096); the tables are sized for whichever toolkit
// builds the kernels. The host emulation uses the large tables, those of the
// toolkits the project builds with.
//
// Two table sizes. The driver copies the whole argument at every launch, and
// that costs host time: on an H100 host an empty kernel took 3.7 us to launch
// with 8 bytes of arguments, 4.2 us with 4 KB and 8.0 us with 32 KB
// (benchmarks/RESULTS.md, 2026-11-23). So a launch whose tensors and blocks
// fit the small table (SmallTensorListMeta, under 4 KB) is launched with it,
// and only bigger launches pay for the large one; the planner fills the large
// table and copies a launch that fits into the small one (Launch::small).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__CUDACC__)
#include <cuda_runtime_api.h>  // CUDART_VERSION
#endif

// Functions the kernel bodies call: device code under nvcc, inline host code
// otherwise (and in the host instantiations nvcc also makes).
#define MIXPREC_HD C10_HOST_DEVICE C10_ALWAYS_INLINE

namespace mixprec {
namespace cuda {

constexpr int64_t kChunkSize = 65536;  // elements per block
constexpr int kBlockSize = 512;        // threads per block
constexpr int kILP = 4;                // 16-byte vectors in flight per thread

#if defined(__CUDACC__) && defined(CUDART_VERSION) && CUDART_VERSION < 12010
constexpr int kParamBytes = 3900;
constexpr int kMaxBlocks = 320;
#else
constexpr int kParamBytes = 32000;
// 2,560 blocks: GPT-2 small's 124M fp32 grads in one launch, not two (the
// second launch's tail cost 2.7 % of the bandwidth on an H100).
constexpr int kMaxBlocks = 2560;
#endif
// The small table (see above); the same as the large one on old toolkits.
constexpr int kSmallParamBytes = kParamBytes < 4000 ? kParamBytes : 4000;
constexpr bool kHasSmallTable = kSmallParamBytes < kParamBytes;

// Depth = number of tensor lists walked together (1 for unscale; the
// optimizers walk param, grad, master, moments and step together). List d's
// tensor t is addresses[d][t]; every list's tensor t has numel[t] elements
// (the step slot, one element per tensor, is only read at offset 0). Bytes
// and Blocks size the table (kernel-argument bytes, blocks per launch).
template <int Depth, int Bytes, int Blocks>
struct TensorListTable {
  static constexpr int kBytes = Bytes;
  static constexpr int kMaxBlocks = Blocks;
  static constexpr int kMaxTensors =
      (Bytes - Blocks * 6 - 64) / (8 * (Depth + 1));
  static_assert(kMaxTensors > 0 && kMaxTensors < 65536, "bad table size");

  void* addresses[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  uint16_t block_to_tensor[kMaxBlocks];
  int32_t block_to_chunk[kMaxBlocks];
  // Blocks launched before this launch by the same plan: block + block_offset
  // numbers every block of the plan uniquely (per-block outputs such as
  // reduction partials, stochastic-rounding element numbers).
  int64_t block_offset;
};

template <int Depth>
using TensorListMeta = TensorListTable<Depth, kParamBytes, kMaxBlocks>;
// The small table holds as many blocks as tensors (every tensor takes at least
// one block): 178 at depth 1, 56 at depth 7.
constexpr int small_table_blocks(int depth) {
  return kHasSmallTable ? (kSmallParamBytes - 64) / (6 + 8 * (depth + 1))
                        : kMaxBlocks;
}
template <int Depth>
using SmallTensorListMeta =
    TensorListTable<Depth, kSmallParamBytes, small_table_blocks(Depth)>;

// The position of one thread in a launch: blockIdx.x, threadIdx.x and
// blockDim.x on the device, the emulated grid's loop indices on the host.
struct GridPos {
  int block;
  int thread;
  int threads;
};

// The span of one block: tensor index, first element, length.
struct BlockSpan {
  int tensor;
  int64_t start;
  int64_t length;
};

template <class Meta>
MIXPREC_HD BlockSpan block_span(const Meta& m, int block) {
  const int t = m.block_to_tensor[block];
  const int64_t start =
      static_cast<int64_t>(m.block_to_chunk[block]) * kChunkSize;
  const int64_t rest = m.numel[t] - start;
  return BlockSpan{t, start, rest < kChunkSize ? rest : kChunkSize};
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T val[N];
};

// One tensor of a plan: its address in each of the Depth lists, and its
// number of elements (the same in every list). Built by the launchers in one
// pass over their arguments, without copying or reference-counting tensors.
template <int Depth>
struct PlanEntry {
  void* addresses[Depth];
  int64_t numel;
};

template <int Depth>
using PlanList = std::vector<PlanEntry<Depth>>;

// One launch of a plan: the kernel argument and its number of blocks; when
// its tensors and blocks fit the small table, also a copy of it there, which
// is what gets launched (small). (The empty constructor leaves the tables
// uninitialized: the planner writes every entry a launch reads.)
template <int Depth>
struct Launch {
  Launch() {}
  TensorListMeta<Depth> meta;
  int blocks = 0;
  int tensors = 0;  // entries of meta in use
  bool small = false;
  SmallTensorListMeta<Depth> small_meta;

  // Copies meta into small_meta when it fits.
  void shrink() {
    using Small = SmallTensorListMeta<Depth>;
    if (!kHasSmallTable || tensors > Small::kMaxTensors ||
        blocks > Small::kMaxBlocks) {
      return;
    }
    for (int d = 0; d < Depth; ++d) {
      std::copy_n(meta.addresses[d], tensors, small_meta.addresses[d]);
    }
    std::copy_n(meta.numel, tensors, small_meta.numel);
    std::copy_n(meta.block_to_tensor, blocks, small_meta.block_to_tensor);
    std::copy_n(meta.block_to_chunk, blocks, small_meta.block_to_chunk);
    small_meta.block_offset = meta.block_offset;
    small = true;
  }
};

template <int Depth>
using Launches = std::vector<Launch<Depth>>;

// Packs the chunks of the non-empty entries into launches, appended to `out`
// in order. A tensor too long for the blocks left in a launch goes on in the
// next launch as its tensor 0. block_offset numbers the blocks of `entries`
// from 0 across the launches.
template <int Depth>
void plan_launches(const PlanList<Depth>& entries, Launches<Depth>& out) {
  constexpr int kMaxTensors = TensorListMeta<Depth>::kMaxTensors;
  int nt = 0;
  int nb = 0;
  int64_t offset = 0;
  TensorListMeta<Depth>* meta = nullptr;
  auto open = [&] {
    out.emplace_back();
    meta = &out.back().meta;
    meta->block_offset = offset;
  };
  auto close = [&](Launch<Depth>& l) {  // nb blocks over nt tensors
    l.blocks = nb;
    l.tensors = nt;
    l.shrink();
  };
  for (const PlanEntry<Depth>& e : entries) {
    const int64_t numel = e.numel;
    if (numel == 0) {
      continue;
    }
    if (meta == nullptr) {
      open();
    }
    for (int d = 0; d < Depth; ++d) {
      meta->addresses[d][nt] = e.addresses[d];
    }
    meta->numel[nt] = numel;
    ++nt;
    const int64_t chunks = (numel + kChunkSize - 1) / kChunkSize;
    TORCH_CHECK(chunks <= INT32_MAX, "mixprec: tensor too large (", numel,
                " elements)");
    for (int64_t c = 0; c < chunks; ++c) {
      meta->block_to_tensor[nb] = static_cast<uint16_t>(nt - 1);
      meta->block_to_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (nt == kMaxTensors && last_chunk)) {
        close(out.back());
        offset += nb;
        nb = 0;
        if (last_chunk) {
          nt = 0;
          meta = nullptr;  // the next non-empty entry opens a launch
        } else {  // the current tensor goes on in the next launch, as tensor 0
          const int last = nt - 1;
          open();  // (may move the vector: index the previous launch anew)
          const TensorListMeta<Depth>& prev = out[out.size() - 2].meta;
          for (int d = 0; d < Depth; ++d) {
            meta->addresses[d][0] = prev.addresses[d][last];
          }
          meta->numel[0] = prev.numel[last];
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) {
    close(out.back());
  }
}

// Blocks of a list of launches.
template <int Depth>
int64_t count_blocks(const Launches<Depth>& launches) {
  int64_t blocks = 0;
  for (const Launch<Depth>& l : launches) {
    blocks += l.blocks;
  }
  return blocks;
}

// Runs `op(meta, pos, args...)` over every block of `launches` with executor
// Exec (DeviceExec: CUDA kernels; HostExec: the emulated grid).
template <class Exec, int Depth, typename Op, typename... Args>
void run_launches(const Launches<Depth>& launches, const Op& op,
                  const Args&... args) {
  for (const Launch<Depth>& l : launches) {
    if constexpr (kHasSmallTable) {
      if (l.small) {
        Exec::launch(l.small_meta, l.blocks, op, args...);
        continue;
      }
    }
    Exec::launch(l.meta, l.blocks, op, args...);
  }
}

// ---------------------------------------------------------------------------
// Plan reuse across steps.
//
// An optimizer passes the same params, grads and states step after step, and
// the scaler the same grads (always, with zero_grad(set_to_none=False); with
// set_to_none=True the caching allocator often hands back the same addresses).
// Each launcher therefore keeps, per thread, its last kEntries plans with the
// key they were built for, and a call whose key equals a stored key skips the
// per-tensor argument checks, the flattening, the dtype grouping and the
// planning: it launches the stored launches.
//
// Why a reused plan can never be wrong. A plan (the launches' TensorListMeta
// tables, the dtype groups, the step pointers) is pure metadata: a
// deterministic function of, for every tensor of every list, its data
// pointer, dtype, device, layout, sizes and strides (numel, density, the
// direct-or-copied choice of FlatSet / DtypeGroups and every check follow from
// these), of the list lengths, and of the op's flags that the launcher passes
// to them. It holds no tensor, no reference count and no device memory, and it
// reads no tensor's values: the kernels read the data through the addresses
// at run time. The key is exactly that input, written word by word (PlanKey),
// so two calls with equal keys make equal plans, and the stored plan is the
// plan the call would build. The same holds for the per-tensor checks: they
// read only what the key holds, so a call with the key of a call that passed
// them passes them (the launchers still run every check that reads anything
// else: the hyper-parameters, norm_type). A tensor freed and another
// allocated at the same address with the same dtype, sizes and strides is, to
// the plan, the same tensor: reusing is then correct, and so is rebuilding.
// Any difference -- another address, shape, stride, dtype or device, a tensor
// added, removed, reordered or moved to another slot, a changed flag -- makes
// the keys differ and the plan is rebuilt from scratch. (The word sequence
// parses one way only: list lengths come before the lists and a tensor's tag,
// which holds its dim, before its sizes and strides; so equal sequences mean
// equal inputs.) The one-element scalars (found_inf, inv_scale, lr, ...) are
// not part of a plan: their addresses go to the kernels every call; the key
// holds their dtype, device, layout and numel, which their checks read.
// Maintenance rule: a check or a planner that comes to read another property
// of a tensor must add it to the key (KeyWriter and KeyMatcher).
//
// Calls that need contiguous copies (strided tensors) are never stored: the
// copies get new addresses every call. A plan is stored only once it is
// complete (an exception while building leaves no entry behind). No host
// sync, no device memory; memory is bounded by kEntries plans per launcher
// and thread, each the size of its call's key and launches.

// Process-wide switch and counters (for tests and benchmarks; relaxed
// atomics, one increment per call).
struct PlanReuse {
  static inline std::atomic<bool> enabled{true};
  // Entries stored before the latest clear() are ignored by every thread.
  static inline std::atomic<uint64_t> epoch{1};
  static inline std::atomic<int64_t> builds{0};       // plans built
  static inline std::atomic<int64_t> reuses{0};       // plans reused
  static inline std::atomic<int64_t> uncacheable{0};  // builds not stored
  static void clear() { epoch.fetch_add(1, std::memory_order_relaxed); }
};

// A launcher's plan key, one int64 word after another. Written by a visit
// function, the one definition of what the key holds, run either with a
// KeyWriter (store) or with a KeyMatcher (compare, stopping at the first
// difference), so that the stored key and the compared one cannot diverge:
//   template <class K> bool visit(K& k) {
//     return k.value(flag) && k.list(tensors) && k.scalar(found_inf) ...; }
// No member touches a reference count or syncs with the device.
struct PlanKey {
  std::vector<int64_t> words;

  // dtype, layout, device and dim of a defined tensor in one word; undefined
  // tensors are -1.
  static int64_t tag(const at::Tensor& t) {
    if (!t.defined()) {
      return -1;
    }
    const c10::Device d = t.device();
    return static_cast<int64_t>(static_cast<uint8_t>(t.scalar_type())) |
           static_cast<int64_t>(static_cast<uint8_t>(t.layout())) << 8 |
           static_cast<int64_t>(static_cast<uint8_t>(d.type())) << 16 |
           static_cast<int64_t>(static_cast<uint8_t>(d.index() + 1)) << 24 |
           static_cast<int64_t>(t.dim()) << 32;
  }
};

struct KeyWriter {
  std::vector<int64_t>& w;
  bool value(int64_t v) {
    w.push_back(v);
    return true;
  }
  // A tensor of a list: tag, then (strided tensors) data pointer, sizes and
  // strides. data_ptr() is the accessor the planners use.
  bool tensor(const at::Tensor& t) {
    const int64_t tg = PlanKey::tag(t);
    w.push_back(tg);
    if (tg != -1 && t.layout() == at::kStrided) {
      w.push_back(
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())));
      for (int64_t s : t.sizes()) {
        w.push_back(s);
      }
      for (int64_t s : t.strides()) {
        w.push_back(s);
      }
    }
    return true;
  }
  // A one-element argument read by the kernels through a pointer passed each
  // call (found_inf, lr, ...): its checks read tag and numel only.
  bool scalar(const at::Tensor& t) {
    const int64_t tg = PlanKey::tag(t);
    w.push_back(tg);
    if (tg != -1) {
      w.push_back(t.numel());
    }
    return true;
  }
  bool list(at::TensorList ts) {
    value(static_cast<int64_t>(ts.size()));
    for (const at::Tensor& t : ts) {
      tensor(t);
    }
    return true;
  }
  bool optional_scalar(const std::optional<at::Tensor>& t) {
    value(t.has_value());
    return !t.has_value() || scalar(*t);
  }
};

// How far ahead of the tensor being matched its list's TensorImpls are
// prefetched: a list's tensors are separate heap objects, so matching is a
// chain of cache misses the prefetches overlap (measured with
// benchmarks/bench_launch_plan.py).
constexpr size_t kPrefetchAhead = 8;

// The position of dtype `t` in a launcher's dtype groups `dtypes`. The op's
// checks let only those dtypes through, so any other reaching here is a bug.
template <size_t N>
int dtype_index(const std::array<at::ScalarType, N>& dtypes, at::ScalarType t) {
  for (size_t k = 0; k < N; ++k) {
    if (dtypes[k] == t) {
      return static_cast<int>(k);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unchecked dtype ", t, " reached a launcher");
}

// Asks for the cache lines of ts[i]'s TensorImpl that a key reads (none when
// i is past the end).
inline void prefetch_tensor(at::TensorList ts, size_t i) {
  if (i < ts.size()) {
    const char* impl =
        reinterpret_cast<const char*>(ts[i].unsafeGetTensorImpl());
    __builtin_prefetch(impl);
    __builtin_prefetch(impl + 64);
    __builtin_prefetch(impl + 128);
  }
}

struct KeyMatcher {
  const int64_t* w;
  const int64_t* end;
  bool value(int64_t v) { return w != end && *w++ == v; }
  bool tensor(const at::Tensor& t) {
    const int64_t tg = PlanKey::tag(t);
    if (!value(tg)) {
      return false;
    }
    if (tg == -1 || t.layout() != at::kStrided) {
      return true;
    }
    const int64_t dim = t.dim();
    if (end - w < 1 + 2 * dim) {
      return false;
    }
    if (*w++ !=
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()))) {
      return false;
    }
    const int64_t* sz = t.sizes().data();
    const int64_t* st = t.strides().data();
    for (int64_t i = 0; i < dim; ++i) {
      if (w[i] != sz[i] || w[dim + i] != st[i]) {
        return false;
      }
    }
    w += 2 * dim;
    return true;
  }
  bool scalar(const at::Tensor& t) {
    const int64_t tg = PlanKey::tag(t);
    return value(tg) && (tg == -1 || value(t.numel()));
  }
  bool list(at::TensorList ts) {
    if (!value(static_cast<int64_t>(ts.size()))) {
      return false;
    }
    const size_t n = ts.size();
    for (size_t i = 0; i < n; ++i) {
      prefetch_tensor(ts, i + kPrefetchAhead);
      if (!tensor(ts[i])) {
        return false;
      }
    }
    return true;
  }
  bool optional_scalar(const std::optional<at::Tensor>& t) {
    return value(t.has_value()) && (!t.has_value() || scalar(*t));
  }
};

// The last kEntries plans of one launcher on one thread (a thread_local of
// the launcher), most recently used first. Plan: a struct of vectors with
// clear().
template <class Plan>
class PlanCache {
 public:
  static constexpr int kEntries = 4;

  // The stored plan for the key that `visit` describes; null when none.
  template <class Visit>
  const Plan* find(const Visit& visit) {
    if (!PlanReuse::enabled.load(std::memory_order_relaxed)) {
      return nullptr;
    }
    const uint64_t epoch = PlanReuse::epoch.load(std::memory_order_relaxed);
    for (int i = 0; i < kEntries; ++i) {
      Entry& e = entries_[order_[i]];
      if (e.epoch != epoch) {
        continue;
      }
      const std::vector<int64_t>& w = e.key.words;
      KeyMatcher m{w.data(), w.data() + w.size()};
      if (visit(m) && m.w == m.end) {
        touch(i);
        PlanReuse::reuses.fetch_add(1, std::memory_order_relaxed);
        return &e.plan;
      }
    }
    return nullptr;
  }

  // Builds a plan with build_fn(plan) -> bool (whether it may be stored) and
  // returns it; stored, in place of the least recently used entry, under the
  // key that `visit` describes when reuse is on and build_fn says so. Call it
  // once the argument checks have passed. The plan returned is valid until the
  // next call on this cache.
  template <class Visit, class Build>
  const Plan& build(const Visit& visit, Build&& build_fn) {
    PlanReuse::builds.fetch_add(1, std::memory_order_relaxed);
    scratch_.clear();
    const bool storable = build_fn(scratch_);
    if (!storable) {
      PlanReuse::uncacheable.fetch_add(1, std::memory_order_relaxed);
    }
    if (!storable || !PlanReuse::enabled.load(std::memory_order_relaxed)) {
      return scratch_;
    }
    Entry& e = entries_[order_[kEntries - 1]];
    e.epoch = 0;                  // invalid until its key is complete
    std::swap(e.plan, scratch_);  // (scratch_ keeps the old entry's capacity)
    e.key.words.clear();
    KeyWriter wr{e.key.words};
    visit(wr);
    e.epoch = PlanReuse::epoch.load(std::memory_order_relaxed);
    touch(kEntries - 1);
    return e.plan;
  }

 private:
  struct Entry {
    PlanKey key;
    Plan plan;
    uint64_t epoch = 0;  // 0: empty
  };
  // moves order_[i] to the front
  void touch(int i) {
    const int e = order_[i];
    for (; i > 0; --i) {
      order_[i] = order_[i - 1];
    }
    order_[0] = e;
  }
  std::array<Entry, kEntries> entries_;
  std::array<int, kEntries> order_{0, 1, 2, 3};
  Plan scratch_;
};

// The `where` of functors that run as one block, not over a plan (step
// increments, the scale update, the final norm).
struct NoMeta {};

// Whether an op's functor reduces a per-thread double across its block
// (static constexpr int kReduceKind, a math::kNorm* kind): then operator()
// returns the thread's partial, the executor combines the block's partials
// (block_reduce on the device, the same order on the host) and hands the
// total to thread 0's block_result().
template <typename Op, typename = void>
struct ReducesBlock : std::false_type {};
template <typename Op>
struct ReducesBlock<Op, std::void_t<decltype(Op::kReduceKind)>>
    : std::true_type {};

// A functor that cooperates within warps (Op::kWarpMaxes defined): a block's
// work is Op::rounds(meta, block, args...) rounds, round r taken by warp
// r % (threads / 32); in a round every lane l runs
//   phase1(meta, pos, r, l, lane_state, maxes, args...)
// which fills maxes[kWarpMaxes], the warp takes the maximum of each over its
// 32 lanes (kWarpMax; a xor-shuffle butterfly on the device, a loop in the
// emulation: max is exact, so any order gives the same bits), and every lane
// runs phase2(meta, pos, r, l, lane_state, maxes, args...). Op::Lane carries
// a lane's registers from one phase to the other. rounds() must give every
// thread of a block the same count.
template <typename Op, typename = void>
struct WarpRounds : std::false_type {};
template <typename Op>
struct WarpRounds<Op, std::void_t<decltype(Op::kWarpMaxes)>> : std::true_type {
};

constexpr int kWarpSize = 32;

// The combine of the warp maximum: NaN-propagating, as torch.amax.
MIXPREC_HD float warp_max_combine(float a, float b) {
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}

}  // namespace cuda
}  // namespace mixprec
