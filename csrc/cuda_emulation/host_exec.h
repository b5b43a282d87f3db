// HostExec: the executor of the CUDA launch plans that runs on the CPU, for
// CI without a GPU. It gets the same TensorListMeta the CUDA kernels would
// get and runs the same functor bodies once per (block, thread) of the grid,
// thread after thread; blocks that reduce combine their threads' partials in
// the order of the device's block_reduce (csrc/cuda/device_exec.cuh), so the
// results are the device's bit for bit wherever the arithmetic is IEEE
// (no fused multiply-add contraction differences: the host build of these
// files uses -ffp-contract=off and the CUDA build --fmad=false, so neither
// fuses a multiply and an add that the source does not fuse).
//
// Sequential threads are a faithful model of these kernels because none of
// them communicates between threads except through block_reduce, the warp
// maximum of warp-cooperative functors (WarpRounds, launch_plan.h) and their
// CUDA block's staged shared memory (written by all its threads before a
// barrier, then only read), which are replayed here: a kernel that did
// otherwise would be a data race on the device. WarpRounds functors run on a
// persistent grid here too (launch()): the same staging call, the same plan
// block schedule and the same per-round calls as warp_rounds_kernel.
#pragma once

#include "common/tensor.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/norm_math.h"
#include "cuda/launch_plan.h"

namespace mixprec {
namespace cuda_emulation {

using cuda::GridPos;
using cuda::kBlockSize;

struct NoGuard {
  explicit NoGuard(const Device&) {}
};

// Replays block_reduce: a shuffle-down tree within each warp of 32 threads
// (lane l takes lane l + offset for offset 16, 8, 4, 2, 1; only lane 0's
// result is used), then the same tree over the warps' results (missing
// warps read 0).
template <int Kind>
double block_reduce(std::vector<double>& v) {
  const int threads = static_cast<int>(v.size());
  auto warp_tree = [](double* lane) {
    for (int offset = 16; offset > 0; offset /= 2) {
      for (int l = 0; l < offset; ++l) {
        lane[l] = math::combine<Kind, double>(lane[l], lane[l + offset]);
      }
    }
    return lane[0];
  };
  double warps[32] = {};
  const int nwarps = threads / 32;
  for (int w = 0; w < nwarps; ++w) {
    warps[w] = warp_tree(v.data() + 32 * w);
  }
  return warp_tree(warps);
}

struct HostExec {
  static constexpr DeviceType kBackend = DeviceType::CPU;
  using Guard = NoGuard;
  // The emulated device's resident CUDA blocks of a persistent launch: few,
  // so that the emulated CUDA blocks take several plan blocks each, as on a
  // GPU given more plan blocks than fit at once.
  static constexpr int kEmulatedResidentBlocks = 3;

  // The rounds of plan block `block` (WarpRounds, launch_plan.h) as the
  // device's run_rounds makes them, warp after warp in round order, lane
  // after lane, phase after phase (the device's rounds of different warps
  // touch disjoint elements): each warp's cursor and its lanes' loads, the
  // next round's loads after this round's phase 1, before its phase 2.
  template <typename Op, typename Where, typename... Args>
  static void run_rounds(const Op& op, const Where& where, int block,
                         const typename Op::Shared& shared,
                         const Args&... args) {
    constexpr int K = Op::kWarpMaxes;
    constexpr int W = cuda::kWarpSize;
    constexpr int warps = cuda::kRoundWarps;
    // warp w's threads start at round w and take every warps-th round (all
    // lanes of a warp hold the same cursor)
    using Cursor = decltype(op.cursor(where, block, 0, warps, shared, args...));
    using In = typename Op::In;
    std::vector<Cursor> cursors;
    for (int w = 0; w < warps; ++w) {
      cursors.push_back(op.cursor(where, block, w, warps, shared, args...));
    }
    const int rounds = Op::rounds(cursors[0]);
    std::vector<In> in(static_cast<size_t>(warps) * W);
    for (int w = 0; w < warps && w < rounds; ++w) {
      for (int l = 0; l < W; ++l) {
        op.load(cursors[w], l, in[w * W + l]);
      }
    }
    std::vector<typename Op::Lane> state(W);
    struct Maxes {
      float v[K];
    };
    std::vector<Maxes> maxes(W);
    for (int r = 0; r < rounds; ++r) {
      const int w = r % warps;
      Cursor& cursor = cursors[w];
      for (int l = 0; l < W; ++l) {
        op.phase1(cursor, l, in[w * W + l], state[l], maxes[l].v, args...);
      }
      Cursor next = cursor;
      Op::advance(next);
      if (r + warps < rounds) {
        for (int l = 0; l < W; ++l) {
          op.load(next, l, in[w * W + l]);
        }
      }
      float total[K];
      for (int k = 0; k < K; ++k) {
        total[k] = maxes[0].v[k];
        for (int l = 1; l < W; ++l) {
          total[k] = cuda::warp_max_combine(total[k], maxes[l].v[k]);
        }
      }
      for (int l = 0; l < W; ++l) {
        op.phase2(cursor, l, state[l], total, args...);
      }
      cursor = next;
    }
  }

  template <typename Op, typename Where, typename... Args>
  static void run_block(int block, int threads, const Op& op,
                        const Where& where, const Args&... args) {
    static_assert(!cuda::WarpRounds<Op>::value, "launched by launch()");
    if constexpr (cuda::ReducesBlock<Op>::value) {
      MIXPREC_INTERNAL_ASSERT(threads % 32 == 0 && threads <= 1024);
      std::vector<double> partial(threads);
      for (int t = 0; t < threads; ++t) {
        partial[t] = op(where, GridPos{block, t, threads}, args...);
      }
      const double total = block_reduce<Op::kReduceKind>(partial);
      op.block_result(where, GridPos{block, 0, threads}, total, args...);
    } else {
      for (int t = 0; t < threads; ++t) {
        op(where, GridPos{block, t, threads}, args...);
      }
    }
  }

  // Meta: a TensorListMeta or SmallTensorListMeta (launch_plan.h).
  // WarpRounds functors run on a persistent grid as on the device
  // (warp_rounds_kernel), of kEmulatedResidentBlocks CUDA blocks: each stages
  // its own shared copy (filled with 0xff bytes first, so that an entry not
  // staged cannot read as the right one), then takes its plan blocks.
  template <class Meta, typename Op, typename... Args>
  static void launch(const Meta& meta, int blocks, const Op& op,
                     const Args&... args) {
    MIXPREC_INTERNAL_ASSERT(blocks > 0 && blocks <= Meta::kMaxBlocks);
    if constexpr (cuda::WarpRounds<Op>::value) {
      using Shared = typename Op::Shared;
      const int grid = cuda::persistent_blocks(blocks, kEmulatedResidentBlocks);
      auto shared = std::make_unique<Shared>();
      for (int cta = 0; cta < grid; ++cta) {
        std::memset(static_cast<void*>(shared.get()), 0xff, sizeof(Shared));
        for (int t = 0; t < cuda::kRoundThreads; ++t) {
          Op::stage(*shared, t, cuda::kRoundThreads);
        }
        for (int b = cta; b < blocks; b += grid) {
          run_rounds(op, meta, b, *shared, args...);
        }
      }
    } else {
      for (int b = 0; b < blocks; ++b) {
        run_block(b, kBlockSize, op, meta, args...);
      }
    }
  }

  template <typename Op, typename... Args>
  static void launch_single_block(int threads, const Op& op,
                                  const Args&... args) {
    run_block(0, threads, op, cuda::NoMeta{}, args...);
  }
};

// The launchers' host work alone (argument checks, flattening, grouping, the
// plans): launches are counted, not run. For measuring the host cost of the
// CUDA ops per call and per tensor without a GPU
// (benchmarks/bench_host_cost.py --emulated).
struct PlanOnlyExec {
  static constexpr DeviceType kBackend = DeviceType::CPU;
  using Guard = NoGuard;
  // Totals since load, for the benchmark's check that the plans were made.
  static inline std::atomic<int64_t> launches{0};
  static inline std::atomic<int64_t> blocks{0};
  // Multi-tensor launches made with the small table (SmallTensorListMeta).
  static inline std::atomic<int64_t> small_launches{0};

  template <class Meta, typename Op, typename... Args>
  static void launch(const Meta&, int nblocks, const Op&, const Args&...) {
    MIXPREC_INTERNAL_ASSERT(nblocks > 0 && nblocks <= Meta::kMaxBlocks);
    launches.fetch_add(1, std::memory_order_relaxed);
    blocks.fetch_add(nblocks, std::memory_order_relaxed);
    if constexpr (cuda::kHasSmallTable &&
                  Meta::kBytes == cuda::kSmallParamBytes) {
      small_launches.fetch_add(1, std::memory_order_relaxed);
    }
  }

  template <typename Op, typename... Args>
  static void launch_single_block(int, const Op&, const Args&...) {
    launches.fetch_add(1, std::memory_order_relaxed);
    blocks.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace cuda_emulation
}  // namespace mixprec
