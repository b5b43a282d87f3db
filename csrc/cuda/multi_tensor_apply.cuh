// Multi-tensor apply: process the chunks of many tensors in as few kernel
// launches as the kernel-parameter space allows. The tensor addresses, sizes
// and the block -> (tensor, chunk) map travel by value as one kernel argument,
// so a launch needs no host-to-device copy and no host sync.
//
// CUDA >= 12.1 allows 32,764 bytes of kernel parameters on sm_70 and newer
// (the classic limit is 4,096); the tables are sized for whichever this
// toolkit gives.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <vector>

namespace mixprec {
namespace cuda {

constexpr int64_t kChunkSize = 65536;  // elements per block
constexpr int kBlockSize = 512;        // threads per block
constexpr int kILP = 4;                // 16-byte vectors in flight per thread

#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010
constexpr int kParamBytes = 32000;
constexpr int kMaxBlocks = 1280;
#else
constexpr int kParamBytes = 3900;
constexpr int kMaxBlocks = 320;
#endif

// Depth = number of tensor lists walked together (1 for unscale; the
// optimizers walk param, grad, master and moments together).
template <int Depth>
struct TensorListMeta {
  static constexpr int kMaxTensors =
      (kParamBytes - kMaxBlocks * 6 - 64) / (8 * (Depth + 1));
  static_assert(kMaxTensors > 0 && kMaxTensors < 65536, "bad table size");

  void* addresses[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  uint16_t block_to_tensor[kMaxBlocks];
  int32_t block_to_chunk[kMaxBlocks];
  // Blocks launched before this launch by the same multi_tensor_apply call:
  // blockIdx.x + block_offset numbers every block of the call uniquely (for
  // per-block outputs such as reduction partials).
  int64_t block_offset;
};

// The span of this block: tensor index, first element, length.
struct BlockSpan {
  int tensor;
  int64_t start;
  int64_t length;
};

template <int Depth>
__device__ __forceinline__ BlockSpan block_span(const TensorListMeta<Depth>& m) {
  const int t = m.block_to_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(m.block_to_chunk[blockIdx.x]) *
                        kChunkSize;
  const int64_t rest = m.numel[t] - start;
  return BlockSpan{t, start, rest < kChunkSize ? rest : kChunkSize};
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T val[N];
};

template <int Depth, typename Op, typename... Args>
__global__ void __launch_bounds__(kBlockSize)
    multi_tensor_kernel(TensorListMeta<Depth> meta, Op op, Args... args) {
  op(meta, args...);
}

// Calls `op(meta, args...)` in kernels over the non-empty tensors of `lists`
// (all lists the same length; list d's tensor t has the numel of list 0's),
// on the current stream of the current device (the caller holds the guard).
// Returns the number of kernels launched.
template <int Depth, typename Op, typename... Args>
int multi_tensor_apply(const std::array<std::vector<at::Tensor>, Depth>& lists,
                       Op op, Args... args) {
  using Meta = TensorListMeta<Depth>;
  constexpr int kMaxTensors = Meta::kMaxTensors;
  const size_t n = lists[0].size();
  for (int d = 1; d < Depth; ++d) {
    TORCH_INTERNAL_ASSERT(lists[d].size() == n, "tensor lists differ in length");
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  Meta meta;
  int nt = 0;
  int nb = 0;
  int launches = 0;
  meta.block_offset = 0;
  auto launch = [&] {
    multi_tensor_kernel<Depth><<<nb, kBlockSize, 0, stream>>>(meta, op,
                                                              args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    ++launches;
    meta.block_offset += nb;
    nb = 0;
  };
  for (size_t t = 0; t < n; ++t) {
    const int64_t numel = lists[0][t].numel();
    if (numel == 0) {
      continue;
    }
    for (int d = 0; d < Depth; ++d) {
      meta.addresses[d][nt] = lists[d][t].data_ptr();
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

// Number of blocks multi_tensor_apply launches for tensors of these sizes.
inline int64_t count_blocks(const std::vector<at::Tensor>& tensors) {
  int64_t blocks = 0;
  for (const at::Tensor& t : tensors) {
    blocks += (t.numel() + kChunkSize - 1) / kChunkSize;
  }
  return blocks;
}

}  // namespace cuda
}  // namespace mixprec
