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
// them communicates between threads except through block_reduce and the
// warp maximum of warp-cooperative functors (WarpRounds, launch_plan.h),
// which are replayed here: a kernel that did otherwise would be a data race
// on the device.
#pragma once

#include "common/tensor.h"

#include <atomic>
#include <cstdint>
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

  template <typename Op, typename Where, typename... Args>
  static void run_block(int block, int threads, const Op& op,
                        const Where& where, const Args&... args) {
    if constexpr (cuda::WarpRounds<Op>::value) {
      // The rounds of one warp, lane after lane, phase after phase (the
      // device's rounds of different warps touch disjoint elements).
      constexpr int K = Op::kWarpMaxes;
      constexpr int W = cuda::kWarpSize;
      const int warps = threads / W;
      // one cursor per warp: warp w's threads start at round w and take
      // every warps-th round (all lanes of a warp hold the same cursor)
      using Cursor = decltype(op.cursor(where, block, 0, warps, args...));
      std::vector<Cursor> cursors;
      for (int w = 0; w < warps; ++w) {
        cursors.push_back(op.cursor(where, block, w, warps, args...));
      }
      const int rounds = Op::rounds(cursors[0]);
      std::vector<typename Op::Lane> state(W);
      struct Maxes {
        float v[K];
      };
      std::vector<Maxes> maxes(W);
      for (int r = 0; r < rounds; ++r) {
        Cursor& cursor = cursors[r % warps];
        float total[K];
        for (int l = 0; l < W; ++l) {
          op.phase1(cursor, l, state[l], maxes[l].v, args...);
        }
        for (int k = 0; k < K; ++k) {
          total[k] = maxes[0].v[k];
          for (int l = 1; l < W; ++l) {
            total[k] = cuda::warp_max_combine(total[k], maxes[l].v[k]);
          }
        }
        for (int l = 0; l < W; ++l) {
          op.phase2(cursor, l, state[l], total, args...);
        }
        Op::advance(cursor);
      }
    } else if constexpr (cuda::ReducesBlock<Op>::value) {
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
  template <class Meta, typename Op, typename... Args>
  static void launch(const Meta& meta, int blocks, const Op& op,
                     const Args&... args) {
    MIXPREC_INTERNAL_ASSERT(blocks > 0 && blocks <= Meta::kMaxBlocks);
    for (int b = 0; b < blocks; ++b) {
      run_block(b, kBlockSize, op, meta, args...);
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
