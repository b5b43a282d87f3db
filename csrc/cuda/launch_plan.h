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
// with 8 bytes of arguments, 4.2 us with 4 KB and 8.0 us with 32 KB on an
// H100 host. So a launch whose tensors and blocks
// fit the small table (SmallTensorListMeta, under 4 KB) is launched with it,
// and only bigger launches pay for the large one; the planner fills the large
// table and copies a launch that fits into the small one (Launch::small).
#pragma once

#include "common/tensor.h"
#include <torch/headeronly/macros/Macros.h>

#include <algorithm>
#include <array>
#include <cstdint>
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

// Packs the chunks of tensors into launches, one tensor at a time, appended
// to `out` in order: the planners call add() in their one pass over the
// argument lists (no per-tensor allocation: the tables are filled in place),
// then finish(). Empty tensors are skipped. A tensor too long for the blocks
// left in a launch goes on in the next launch as its tensor 0. block_offset
// numbers the planner's blocks from 0 across its launches.
template <int Depth>
class LaunchPlanner {
 public:
  static constexpr int kMaxTensors = TensorListMeta<Depth>::kMaxTensors;

  // `tensors`: how many add() calls to expect (reserves the launches they
  // need at least; more are appended when blocks run out first).
  LaunchPlanner(Launches<Depth>& out, size_t tensors) : out_(out) {
    out_.reserve(out_.size() + tensors / kMaxTensors + 1);
  }
  LaunchPlanner(const LaunchPlanner&) = delete;
  LaunchPlanner& operator=(const LaunchPlanner&) = delete;

  void add(void* const (&addresses)[Depth], int64_t numel) {
    if (numel == 0) {
      return;
    }
    if (meta_ == nullptr) {
      open();
    }
    for (int d = 0; d < Depth; ++d) {
      meta_->addresses[d][nt_] = addresses[d];
    }
    meta_->numel[nt_] = numel;
    ++nt_;
    const int64_t chunks = (numel + kChunkSize - 1) / kChunkSize;
    MIXPREC_CHECK(chunks <= INT32_MAX, "mixprec: tensor too large (", numel,
                  " elements)");
    for (int64_t c = 0; c < chunks; ++c) {
      meta_->block_to_tensor[nb_] = static_cast<uint16_t>(nt_ - 1);
      meta_->block_to_chunk[nb_] = static_cast<int32_t>(c);
      ++nb_;
      const bool last_chunk = c == chunks - 1;
      if (nb_ == kMaxBlocks || (nt_ == kMaxTensors && last_chunk)) {
        close();
        if (last_chunk) {
          meta_ = nullptr;  // the next non-empty tensor opens a launch
        } else {  // the current tensor goes on in the next launch, as tensor 0
          open();
          for (int d = 0; d < Depth; ++d) {
            meta_->addresses[d][0] = addresses[d];
          }
          meta_->numel[0] = numel;
          nt_ = 1;
        }
      }
    }
  }

  // Closes the last launch (call once, after the last add()).
  void finish() {
    if (nb_ > 0) {
      close();
    }
    meta_ = nullptr;
  }

 private:
  void open() {
    out_.emplace_back();
    meta_ = &out_.back().meta;
    meta_->block_offset = offset_;
  }
  void close() {  // nb_ blocks over nt_ tensors
    Launch<Depth>& l = out_.back();
    l.blocks = nb_;
    l.tensors = nt_;
    l.shrink();
    offset_ += nb_;
    nb_ = 0;
    nt_ = 0;
  }

  Launches<Depth>& out_;
  TensorListMeta<Depth>* meta_ = nullptr;  // the open launch's table
  int nt_ = 0;                             // its tensors
  int nb_ = 0;                             // its blocks
  int64_t offset_ = 0;                     // blocks of the closed launches
};

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

// The position of dtype `t` in a launcher's dtype groups `dtypes`. The op's
// checks let only those dtypes through, so any other reaching here is a bug.
template <size_t N>
int dtype_index(const std::array<ScalarType, N>& dtypes, ScalarType t) {
  for (size_t k = 0; k < N; ++k) {
    if (dtypes[k] == t) {
      return static_cast<int>(k);
    }
  }
  MIXPREC_INTERNAL_ASSERT(false, "unchecked dtype ", t, " reached a launcher");
}

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

// A functor that cooperates within warps (Op::kWarpMaxes defined): a plan
// block's work is rounds, round r taken by warp r % (kRoundThreads / 32).
// Such a functor runs on a persistent grid of CUDA blocks of kRoundThreads
// threads: CUDA block c of C takes the plan blocks c, c + C, c + 2C, ...
// (persistent_blocks), and first stages what its rounds read from shared
// memory, Op::stage(shared, thread, threads) by every thread, then a barrier
// (shared: an Op::Shared, the CUDA block's dynamic shared memory; the
// emulation's copy per emulated CUDA block). Per plan block each thread makes
// its cursor, c = op.cursor(meta, block, first, stride, shared, args...)
// (first: its warp's first round, stride: the warps of the CUDA block), which
// gives Op::rounds(c) (the same count for every thread of a block) and is
// moved to the thread's next round by Op::advance(c). A round's global reads
// are op.load(c, l, in), into an Op::In; the first round's are made before
// the loop, every other round's during the round before it (software
// pipelining: the rounds of a plan block touch disjoint elements). In a
// round every lane l runs
//   phase1(c, l, in, lane_state, maxes, args...)
// which fills maxes[kWarpMaxes], then the next round's load(next, l, in)
// (phase 1 has used `in`), the warp takes the maximum of each over its 32
// lanes (kWarpMax; a xor-shuffle butterfly on the device, a loop in the
// emulation: max is exact, so any order gives the same bits), and every lane
// runs phase2(c, l, lane_state, maxes, args...). Op::Lane carries a lane's
// registers from one phase to the other.
template <typename Op, typename = void>
struct WarpRounds : std::false_type {};
template <typename Op>
struct WarpRounds<Op, std::void_t<decltype(Op::kWarpMaxes)>> : std::true_type {
};

constexpr int kWarpSize = 32;

// The CUDA blocks of WarpRounds functors: kRoundThreads threads, at least
// kRoundBlocksPerSm of them resident per SM (the register budget:
// __launch_bounds__).
constexpr int kRoundThreads = 256;
constexpr int kRoundWarps = kRoundThreads / kWarpSize;
constexpr int kRoundBlocksPerSm = 2;

// The CUDA blocks of a persistent launch of `blocks` plan blocks when
// `resident` CUDA blocks fit on the device at once: one per plan block up to
// that (each CUDA block then takes every `persistent_blocks`-th plan block).
inline int persistent_blocks(int blocks, int resident) {
  return std::max(1, std::min(blocks, resident));
}

// The combine of the warp maximum: NaN-propagating, as torch.amax.
MIXPREC_HD float warp_max_combine(float a, float b) {
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}

}  // namespace cuda
}  // namespace mixprec
