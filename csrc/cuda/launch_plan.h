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
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

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
constexpr int kMaxBlocks = 1280;
#endif

// Depth = number of tensor lists walked together (1 for unscale; the
// optimizers walk param, grad, master, moments and step together). List d's
// tensor t is addresses[d][t]; every list's tensor t has numel[t] elements
// (the step slot, one element per tensor, is only read at offset 0).
template <int Depth>
struct TensorListMeta {
  static constexpr int kMaxTensors =
      (kParamBytes - kMaxBlocks * 6 - 64) / (8 * (Depth + 1));
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

template <int Depth>
MIXPREC_HD BlockSpan block_span(const TensorListMeta<Depth>& m, int block) {
  const int t = m.block_to_tensor[block];
  const int64_t start = static_cast<int64_t>(m.block_to_chunk[block]) * kChunkSize;
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

// Builds the launches over the non-empty entries and calls
// `emit(meta, blocks)` for each, in order. Returns the number of launches.
// A tensor too long for the blocks left in a launch goes on in the next
// launch as its tensor 0.
template <int Depth, typename Emit>
int plan_multi_tensor(const PlanList<Depth>& entries, Emit&& emit) {
  using Meta = TensorListMeta<Depth>;
  constexpr int kMaxTensors = Meta::kMaxTensors;
  Meta meta;
  int nt = 0;
  int nb = 0;
  int launches = 0;
  meta.block_offset = 0;
  auto launch = [&] {
    emit(static_cast<const Meta&>(meta), nb);
    ++launches;
    meta.block_offset += nb;
    nb = 0;
  };
  for (const PlanEntry<Depth>& e : entries) {
    const int64_t numel = e.numel;
    if (numel == 0) {
      continue;
    }
    for (int d = 0; d < Depth; ++d) {
      meta.addresses[d][nt] = e.addresses[d];
    }
    meta.numel[nt] = numel;
    ++nt;
    const int64_t chunks = (numel + kChunkSize - 1) / kChunkSize;
    TORCH_CHECK(chunks <= INT32_MAX, "mixprec: tensor too large (", numel,
                " elements)");
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[nb] = static_cast<uint16_t>(nt - 1);
      meta.block_to_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (nt == kMaxTensors && last_chunk)) {
        launch();
        if (last_chunk) {
          nt = 0;
        } else {  // the current tensor goes on in the next launch, as tensor 0
          for (int d = 0; d < Depth; ++d) {
            meta.addresses[d][0] = meta.addresses[d][nt - 1];
          }
          meta.numel[0] = meta.numel[nt - 1];
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) {
    launch();
  }
  return launches;
}

// Runs `op(meta, pos, args...)` over every block of the plan of `entries`
// with executor Exec (DeviceExec: CUDA kernels; HostExec: the emulated grid).
template <class Exec, int Depth, typename Op, typename... Args>
int run_multi_tensor(const PlanList<Depth>& entries, const Op& op,
                     const Args&... args) {
  return plan_multi_tensor<Depth>(
      entries, [&](const TensorListMeta<Depth>& meta, int blocks) {
        Exec::launch(meta, blocks, op, args...);
      });
}

// The `where` of functors that run as one block, not over a plan (step
// increments, the scale update, the final norm).
struct NoMeta {};

// Number of blocks plan_multi_tensor makes for these entries.
template <int Depth>
int64_t count_blocks(const PlanList<Depth>& entries) {
  int64_t blocks = 0;
  for (const PlanEntry<Depth>& e : entries) {
    blocks += (e.numel + kChunkSize - 1) / kChunkSize;
  }
  return blocks;
}

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

}  // namespace cuda
}  // namespace mixprec
