// unscale_and_check_ and check_finite_ on CUDA: one multi-tensor-apply pass
// per dtype present in the list (grouping is internal), 16-byte vector loads
// when a tensor is 16-byte aligned, no host sync.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <map>

#include "common/checks.h"
#include "common/unscale_math.h"
#include "cuda/multi_tensor_apply.cuh"

namespace mixprec {
namespace cuda {
namespace {

template <typename scalar_t, bool kUnscale>
struct UnscaleCheckOp {
  __device__ __forceinline__ void operator()(const TensorListMeta<1>& meta,
                                             float* found_inf,
                                             const float* inv_scale) const {
    using opmath_t = at::opmath_type<scalar_t>;
    constexpr int kVec = 16 / sizeof(scalar_t);
    using VecT = AlignedVector<scalar_t, kVec>;

    const BlockSpan s = block_span(meta);
    scalar_t* p = static_cast<scalar_t*>(meta.addresses[0][s.tensor]) + s.start;
    opmath_t inv = opmath_t(1);
    bool write = false;
    if constexpr (kUnscale) {
      const float f = *inv_scale;
      inv = static_cast<opmath_t>(f);
      write = f != 1.0f;  // torch stores the value unchanged when it is 1
    }
    opmath_t acc = opmath_t(0);
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
              const opmath_t v = static_cast<opmath_t>(r[j].val[k]);
              acc += math::nonfinite_probe(v);
              r[j].val[k] = static_cast<scalar_t>(math::unscale(v, inv));
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
      const opmath_t v = static_cast<opmath_t>(p[i]);
      acc += math::nonfinite_probe(v);
      if (write) {
        p[i] = static_cast<scalar_t>(math::unscale(v, inv));
      }
    }
    if (math::is_nan_acc(acc)) {
      *found_inf = 1.0f;  // every writer stores the same value
    }
  }
};

void run(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
         const at::Tensor* inv_scale) {
  TORCH_CHECK(found_inf.defined() && found_inf.is_cuda(), "mixprec.", op,
              ": found_inf must be a CUDA tensor on the device of the "
              "tensors, got ",
              found_inf.defined() ? found_inf.device().str() : "undefined");
  const c10::Device device = found_inf.device();
  checks::check_state_tensor(op, "found_inf", found_inf, at::kFloat, device);
  if (inv_scale != nullptr) {
    checks::check_state_tensor(op, "inv_scale", *inv_scale, at::kFloat,
                               device);
  }
  const bool unscale = inv_scale != nullptr;
  checks::check_grad_list(op, unscale ? "grads" : "tensors", tensors, device,
                          unscale);

  c10::cuda::OptionalCUDAGuard guard(device);
  // Group by dtype; strided tensors go through a contiguous copy.
  std::map<at::ScalarType, std::vector<at::Tensor>> groups;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) {
      continue;
    }
    at::Tensor d = t.is_non_overlapping_and_dense() ? t : t.contiguous();
    if (unscale && !d.is_same(t)) {
      copy_back.emplace_back(t, d);
    }
    groups[t.scalar_type()].push_back(d);
  }
  float* found_ptr = found_inf.data_ptr<float>();
  const float* inv_ptr = unscale ? inv_scale->data_ptr<float>() : nullptr;
  for (auto& [dtype, list] : groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, dtype, "mixprec_unscale_cuda", [&] {
          std::array<std::vector<at::Tensor>, 1> lists{std::move(list)};
          if (unscale) {
            multi_tensor_apply<1>(lists, UnscaleCheckOp<scalar_t, true>{},
                                  found_ptr, inv_ptr);
          } else {
            multi_tensor_apply<1>(lists, UnscaleCheckOp<scalar_t, false>{},
                                  found_ptr, inv_ptr);
          }
        });
  }
  for (auto& pr : copy_back) {
    pr.first.copy_(pr.second);
  }
}

void unscale_and_check_cuda(at::TensorList grads, const at::Tensor& found_inf,
                            const at::Tensor& inv_scale) {
  run("unscale_and_check_", grads, found_inf, &inv_scale);
}

void check_finite_cuda(at::TensorList tensors, const at::Tensor& found_inf) {
  run("check_finite_", tensors, found_inf, nullptr);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("unscale_and_check_", &mixprec::cuda::unscale_and_check_cuda);
  m.impl("check_finite_", &mixprec::cuda::check_finite_cuda);
}
