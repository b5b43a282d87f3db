// The block function shared by unscale_and_check_, check_finite_ and
// unscale_and_norm_ on CUDA, plus the host-side grouping of a tensor list by
// dtype.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include <map>
#include <utility>
#include <vector>

#include "common/norm_math.h"
#include "common/unscale_math.h"
#include "cuda/multi_tensor_apply.cuh"

namespace mixprec {
namespace cuda {

constexpr int kNoNorm = -1;

// Sums (or maxes, for inf) a per-thread double across the block; the result
// is valid in thread 0. Fixed shuffle order: deterministic.
template <int Kind>
__device__ __forceinline__ double block_reduce(double v) {
  __shared__ double warp_partials[kBlockSize / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    v = math::combine<Kind, double>(v, __shfl_down_sync(0xffffffffu, v, offset));
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

// One block's chunk: check for inf/NaN, multiply by inv_scale when kUnscale
// (stored in place when kWrite and inv_scale != 1), and, when Kind != kNoNorm,
// write the chunk's norm partial of the unscaled values to
// partials[block number].
template <typename scalar_t, bool kUnscale, int Kind, bool kWrite = true>
struct UnscaleOp {
  __device__ __forceinline__ void operator()(const TensorListMeta<1>& meta,
                                             float* found_inf,
                                             const float* inv_scale,
                                             double* partials,
                                             float norm_type) const {
    using opmath_t = at::opmath_type<scalar_t>;
    constexpr int kVec = 16 / sizeof(scalar_t);
    using VecT = AlignedVector<scalar_t, kVec>;
    constexpr bool kNorm = Kind != kNoNorm;
    constexpr int kAcc = kNorm ? Kind : math::kNormL2;

    const BlockSpan s = block_span(meta);
    scalar_t* p = static_cast<scalar_t*>(meta.addresses[0][s.tensor]) + s.start;
    opmath_t inv = opmath_t(1);
    bool write = false;
    if constexpr (kUnscale) {
      const float f = *inv_scale;
      inv = static_cast<opmath_t>(f);
      write = kWrite && f != 1.0f;  // torch stores nothing when it is 1
    }
    const opmath_t pn = static_cast<opmath_t>(norm_type);
    opmath_t probe = opmath_t(0);
    opmath_t acc = opmath_t(0);
    auto visit = [&](scalar_t& x) {
      const opmath_t v = static_cast<opmath_t>(x);
      probe += math::nonfinite_probe(v);
      const opmath_t u = math::unscale(v, inv);
      if constexpr (kNorm) {
        acc = math::combine<kAcc>(acc, math::norm_term<kAcc>(u, pn));
      }
      x = static_cast<scalar_t>(u);
    };
    int64_t tail_begin = 0;
    if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      const int64_t nvec = s.length / kVec;
      VecT* pv = reinterpret_cast<VecT*>(p);
      for (int64_t base = threadIdx.x; base < nvec;
           base += static_cast<int64_t>(blockDim.x) * kILP) {
        VecT r[kILP];
#pragma unroll
        for (int j = 0; j < kILP; ++j) {
          const int64_t idx = base + j * static_cast<int64_t>(blockDim.x);
          if (idx < nvec) {
            r[j] = pv[idx];
          }
        }
#pragma unroll
        for (int j = 0; j < kILP; ++j) {
          const int64_t idx = base + j * static_cast<int64_t>(blockDim.x);
          if (idx < nvec) {
#pragma unroll
            for (int k = 0; k < kVec; ++k) {
              visit(r[j].val[k]);
            }
            if (write) {
              pv[idx] = r[j];
            }
          }
        }
      }
      tail_begin = nvec * kVec;
    }
    for (int64_t i = tail_begin + threadIdx.x; i < s.length; i += blockDim.x) {
      scalar_t x = p[i];
      visit(x);
      if (write) {
        p[i] = x;
      }
    }
    if (math::is_nan_acc(probe)) {
      *found_inf = 1.0f;  // every writer stores the same value
    }
    if constexpr (kNorm) {
      const double total = block_reduce<kAcc>(static_cast<double>(acc));
      if (threadIdx.x == 0) {
        partials[meta.block_offset + blockIdx.x] = total;
      }
    }
  }
};

// Non-empty tensors grouped by dtype, as dense tensors (strided ones replaced
// by contiguous copies, remembered in copy_back when `written`).
struct DtypeGroups {
  std::map<at::ScalarType, std::vector<at::Tensor>> groups;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (orig, dense)

  DtypeGroups(at::TensorList tensors, bool written) {
    for (const at::Tensor& t : tensors) {
      if (t.numel() == 0) {
        continue;
      }
      at::Tensor d = t.is_non_overlapping_and_dense() ? t : t.contiguous();
      if (written && !d.is_same(t)) {
        copy_back.emplace_back(t, d);
      }
      groups[t.scalar_type()].push_back(std::move(d));
    }
  }

  void finish() {
    for (auto& pr : copy_back) {
      pr.first.copy_(pr.second);
    }
  }
};

}  // namespace cuda
}  // namespace mixprec
