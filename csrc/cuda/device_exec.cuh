// DeviceExec: runs the launch plans of csrc/cuda/*.h as CUDA kernels on the
// current stream of the current device (the launcher holds a device guard).
// Only torch's stable ABI is used: the guard is torch::stable's, the current
// stream comes from the C shim aoti_torch_get_current_cuda_stream.
// Its twin for CI without a GPU is csrc/cuda_emulation/host_exec.h; both give
// the functors the same GridPos and the same block-reduction order.
#pragma once

#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/macros.h>

#include <atomic>
#include <cstdint>

#include "common/norm_math.h"
#include "common/tensor.h"
#include "cuda/launch_plan.h"

// Exported by libtorch_cuda; shim.h declares it only under USE_CUDA.
#ifndef USE_CUDA
extern "C" AOTI_TORCH_EXPORT AOTITorchError
aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
#endif

namespace mixprec {
namespace cuda {

// Makes `device` the current CUDA device for the guard's lifetime (the
// launchers construct Exec::Guard from the call's Device).
struct CudaDeviceGuard {
  explicit CudaDeviceGuard(const Device& device) : guard(device.index()) {}
  torch::stable::accelerator::DeviceGuard guard;
};

// torch's current CUDA stream of the current device.
inline cudaStream_t current_stream() {
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(
      aoti_torch_get_current_cuda_stream(/*device_index=*/-1, &stream));
  return static_cast<cudaStream_t>(stream);
}

// Throws if the last kernel launch failed.
inline void check_launch() {
  const cudaError_t err = cudaGetLastError();
  MIXPREC_CHECK(err == cudaSuccess, "mixprec: CUDA kernel launch failed: ",
                cudaGetErrorString(err));
}

// Combines (sum, or max for the inf-norm) a per-thread double across the
// block; the result is valid in thread 0. Fixed shuffle order: deterministic
// (HostExec::block_reduce replays exactly this order).
template <int Kind>
__device__ __forceinline__ double block_reduce(double v) {
  __shared__ double warp_partials[kBlockSize / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    v = math::combine<Kind, double>(v,
                                    __shfl_down_sync(0xffffffffu, v, offset));
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_partials[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_partials[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) {
      v = math::combine<Kind, double>(v,
                                      __shfl_down_sync(0xffffffffu, v, offset));
    }
  }
  return v;
}

// One thread of `op`: its body, and for reducing ops the block's total to
// thread 0's block_result(). (WarpRounds functors run in warp_rounds_kernel.)
template <typename Op, typename Where, typename... Args>
__device__ __forceinline__ void run_thread(const Op& op, const Where& where,
                                           const Args&... args) {
  static_assert(!WarpRounds<Op>::value, "launched by warp_rounds_kernel");
  const GridPos pos{static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x),
                    static_cast<int>(blockDim.x)};
  if constexpr (ReducesBlock<Op>::value) {
    const double total = block_reduce<Op::kReduceKind>(op(where, pos, args...));
    if (threadIdx.x == 0) {
      op.block_result(where, pos, total, args...);
    }
  } else {
    op(where, pos, args...);
  }
}

// This thread's rounds of plan block `block` (WarpRounds, launch_plan.h):
// the next round's loads issued after this round's phase 1 (which has then
// used what it loaded, so they need no second set of registers), before its
// warp maximum and phase 2. HostExec::run_rounds replays the same calls.
template <typename Op, class Meta, typename... Args>
__device__ __forceinline__ void run_rounds(const Op& op, const Meta& meta,
                                           int block,
                                           const typename Op::Shared& shared,
                                           const Args&... args) {
  constexpr int K = Op::kWarpMaxes;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int first = static_cast<int>(threadIdx.x) / kWarpSize;
  auto cursor = op.cursor(meta, block, first, kRoundWarps, shared, args...);
  const int rounds = Op::rounds(cursor);
  typename Op::In in;
  if (first < rounds) {
    op.load(cursor, lane, in);
  }
  for (int r = first; r < rounds; r += kRoundWarps) {
    typename Op::Lane state;
    float maxes[K];
    op.phase1(cursor, lane, in, state, maxes, args...);
    auto next = cursor;
    Op::advance(next);
    if (r + kRoundWarps < rounds) {
      op.load(next, lane, in);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      for (int offset = 16; offset > 0; offset /= 2) {
        maxes[k] = warp_max_combine(
            maxes[k], __shfl_xor_sync(0xffffffffu, maxes[k], offset));
      }
    }
    op.phase2(cursor, lane, state, maxes, args...);
    cursor = next;
  }
}

template <class Meta, typename Op, typename... Args>
__global__ void __launch_bounds__(kBlockSize)
    multi_tensor_kernel(Meta meta, Op op, Args... args) {
  run_thread(op, meta, args...);
}

// The persistent grid of a WarpRounds functor: the CUDA block stages its
// shared memory once, then takes every gridDim.x-th of the plan's `blocks`.
template <class Meta, typename Op, typename... Args>
__global__ void __launch_bounds__(kRoundThreads, kRoundBlocksPerSm)
    warp_rounds_kernel(Meta meta, int blocks, Op op, Args... args) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<typename Op::Shared*>(shared_bytes);
  Op::stage(shared, static_cast<int>(threadIdx.x), kRoundThreads);
  __syncthreads();
  for (int b = static_cast<int>(blockIdx.x); b < blocks;
       b += static_cast<int>(gridDim.x)) {
    run_rounds(op, meta, b, shared, args...);
  }
}

template <typename Op, typename... Args>
__global__ void __launch_bounds__(kBlockSize)
    single_block_kernel(Op op, Args... args) {
  run_thread(op, NoMeta{}, args...);
}

// How many CUDA blocks of warp_rounds_kernel<Meta, Op, Args...> are resident
// on the current device at once (SMs x blocks per SM, with its dynamic shared
// memory), found once per device; the first call also raises the kernel's
// dynamic shared-memory limit to what it needs.
template <class Meta, typename Op, typename... Args>
int resident_round_blocks() {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};
  int device = 0;
  MIXPREC_CHECK(cudaGetDevice(&device) == cudaSuccess,
                "mixprec: cudaGetDevice failed");
  if (device < kDevices) {
    const int n = known[device].load(std::memory_order_relaxed);
    if (n > 0) {
      return n;
    }
  }
  const auto kernel = warp_rounds_kernel<Meta, Op, Args...>;
  constexpr int kBytes = sizeof(typename Op::Shared);
  int sms = 0;
  int per_sm = 0;
  cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                        kRoundThreads, kBytes);
  }
  MIXPREC_CHECK(
      err == cudaSuccess,
      "mixprec: the 8-bit optimizer kernel's occupancy query failed: ",
      cudaGetErrorString(err));
  MIXPREC_CHECK(per_sm > 0 && sms > 0, "mixprec: the 8-bit optimizer kernel (",
                kRoundThreads, " threads, ", kBytes,
                " bytes of shared memory) does not fit on device ", device);
  const int n = per_sm * sms;
  if (device < kDevices) {
    known[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

struct DeviceExec {
  static constexpr DeviceType kBackend = DeviceType::CUDA;
  using Guard = CudaDeviceGuard;

  // Meta: a TensorListMeta or SmallTensorListMeta (launch_plan.h).
  template <class Meta, typename Op, typename... Args>
  static void launch(const Meta& meta, int blocks, const Op& op,
                     const Args&... args) {
    if constexpr (WarpRounds<Op>::value) {
      const int grid =
          persistent_blocks(blocks, resident_round_blocks<Meta, Op, Args...>());
      warp_rounds_kernel<Meta, Op, Args...>
          <<<grid, kRoundThreads, sizeof(typename Op::Shared),
             current_stream()>>>(meta, blocks, op, args...);
    } else {
      multi_tensor_kernel<Meta>
          <<<blocks, kBlockSize, 0, current_stream()>>>(meta, op, args...);
    }
    check_launch();
  }

  template <typename Op, typename... Args>
  static void launch_single_block(int threads, const Op& op,
                                  const Args&... args) {
    single_block_kernel<<<1, threads, 0, current_stream()>>>(op, args...);
    check_launch();
  }
};

}  // namespace cuda
}  // namespace mixprec
