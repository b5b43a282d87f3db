// fused_adam_ on CUDA: one multi-tensor-apply pass per (param dtype, grad
// dtype) group, then one tiny kernel that increments the step counts. Every
// kernel reads found_inf on the device and does nothing when it is set, so
// the step needs no host sync and can be captured in a CUDA graph.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_math.h"
#include "cuda/fused_optim_cuda.cuh"

namespace mixprec {
namespace cuda {
namespace {

// List slots in TensorListMeta: unused slots (vm without amsgrad, master
// without masters) hold the param's address and are never dereferenced.
enum AdamSlot : int { kP = 0, kG, kM, kV, kVm, kMaster, kStepSlot, kAdamDepth };

struct AdamKernelArgs {
  const float* found_inf;   // may be null
  const float* grad_scale;  // may be null
  const float* clip_coef;   // may be null
  const void* lr;           // float or double, one element
  bool lr_double;
  bool maximize;
  math::AdamConsts k;
  double beta1;
  double beta2;
  double weight_decay;
  bool sr;
  uint64_t seed;
  uint32_t stream;  // SR stream: the grad dtype's code
};

template <typename P, typename G, bool kMaster, bool kAms>
struct AdamOp {
  __device__ __forceinline__ void operator()(
      const TensorListMeta<kAdamDepth>& meta, const AdamKernelArgs& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return;
    }
    const BlockSpan s = block_span(meta);
    const int t = s.tensor;
    P* p = static_cast<P*>(meta.addresses[kP][t]) + s.start;
    const G* g = static_cast<const G*>(meta.addresses[kG][t]) + s.start;
    float* m = static_cast<float*>(meta.addresses[kM][t]) + s.start;
    float* v = static_cast<float*>(meta.addresses[kV][t]) + s.start;
    float* vm = static_cast<float*>(meta.addresses[kVm][t]) + s.start;
    float* mp = static_cast<float*>(meta.addresses[kMaster][t]) + s.start;
    const float step =
        *static_cast<const float*>(meta.addresses[kStepSlot][t]) + 1.0f;
    const double lr = a.lr_double
                          ? *static_cast<const double*>(a.lr)
                          : static_cast<double>(*static_cast<const float*>(a.lr));
    const math::AdamStep st = math::make_adam_step(lr, a.beta1, a.beta2,
                                                   a.weight_decay, step);
    const math::GradCoefs gc =
        math::make_grad_coefs(a.grad_scale, a.clip_coef, a.maximize);
    uint32_t key = 0;
    uint32_t base = 0;
    if (a.sr) {
      key = math::sr_key(a.seed, static_cast<uint32_t>(step), a.stream);
      base = static_cast<uint32_t>((meta.block_offset + blockIdx.x) *
                                   math::kSrChunk);
    }

    auto update = [&](float& w, float gi, float& mi, float& vi, float& xi) {
      gi = math::prepare_grad(gi, gc);
      math::adam_update<kAms, math::ScalarOps>(w, gi, mi, vi, xi, a.k, st);
    };

    int64_t nvec = 0;
    const bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) &&
                         vec_aligned<float>(m) && vec_aligned<float>(v) &&
                         (!kAms || vec_aligned<float>(vm)) &&
                         (!kMaster || vec_aligned<float>(mp));
    if (aligned) {
      nvec = s.length / kOptVec;
      for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
        float w[kOptVec], gr[kOptVec], mr[kOptVec], vr[kOptVec], xr[kOptVec];
        if constexpr (kMaster) {
          load_vec(mp, vi, w);
        } else {
          load_vec(p, vi, w);
        }
        load_vec(g, vi, gr);
        load_vec(m, vi, mr);
        load_vec(v, vi, vr);
        if constexpr (kAms) {
          load_vec(vm, vi, xr);
        }
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          update(w[k], gr[k], mr[k], vr[k], xr[k]);
        }
        store_vec(m, vi, mr);
        store_vec(v, vi, vr);
        if constexpr (kAms) {
          store_vec(vm, vi, xr);
        }
        if constexpr (kMaster) {
          store_vec(mp, vi, w);
        }
        AlignedVector<P, kOptVec> out;
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          out.val[k] = round_param<P>(
              w[k], a.sr, key,
              base + static_cast<uint32_t>(vi * kOptVec + k));
        }
        reinterpret_cast<AlignedVector<P, kOptVec>*>(p)[vi] = out;
      }
    }
    for (int64_t i = nvec * kOptVec + threadIdx.x; i < s.length;
         i += blockDim.x) {
      float w = kMaster ? mp[i] : static_cast<float>(p[i]);
      float mi = m[i];
      float vi = v[i];
      float xi = kAms ? vm[i] : 0.0f;
      update(w, static_cast<float>(g[i]), mi, vi, xi);
      m[i] = mi;
      v[i] = vi;
      if constexpr (kAms) {
        vm[i] = xi;
      }
      if constexpr (kMaster) {
        mp[i] = w;
      }
      p[i] = round_param<P>(
          w, a.sr, key,
          base + static_cast<uint32_t>(i));
    }
  }
};

void fused_adam_cuda(at::TensorList params, at::TensorList grads,
                     at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                     at::TensorList max_exp_avg_sqs,
                     at::TensorList master_params, at::TensorList state_steps,
                     const at::Tensor& lr, double beta1, double beta2,
                     double weight_decay, double eps, bool amsgrad,
                     bool maximize, bool decoupled_weight_decay,
                     const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf,
                     const std::optional<at::Tensor>& clip_coef,
                     bool stochastic_rounding, int64_t seed) {
  const optim::OptimLists lists = optim::check_fused_adam_args(
      params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params,
      state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, grad_scale,
      found_inf, clip_coef, stochastic_rounding, c10::DeviceType::CUDA);
  if (params.empty()) {
    return;
  }
  c10::cuda::OptionalCUDAGuard guard(params[0].device());
  const bool masters = !master_params.empty();

  optim::FlatSet fs(lists);
  const int kVmList = fs.state_view[2];  // max_exp_avg_sqs (amsgrad)
  const int kMpList = fs.master_view;

  AdamKernelArgs args;
  args.found_inf = optim::scalar_data(found_inf);
  args.grad_scale = optim::scalar_data(grad_scale);
  args.clip_coef = optim::scalar_data(clip_coef);
  args.lr = lr.data_ptr();
  args.lr_double = lr.scalar_type() == at::kDouble;
  args.maximize = maximize;
  args.k = math::make_adam_consts(beta1, beta2, weight_decay, eps,
                                  decoupled_weight_decay);
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.weight_decay = weight_decay;
  args.seed = static_cast<uint64_t>(seed);

  apply_by_dtypes<kAdamDepth, AdamOp>(
      fs, masters, amsgrad, stochastic_rounding, args,
      [&](size_t i, std::array<std::vector<at::Tensor>, kAdamDepth>& l) {
        const at::Tensor& p = fs.views[0][i];
        l[kP].push_back(p);
        l[kG].push_back(fs.views[1][i]);
        l[kM].push_back(fs.views[2][i]);
        l[kV].push_back(fs.views[3][i]);
        l[kVm].push_back(kVmList >= 0 ? fs.views[kVmList][i] : p);
        l[kMaster].push_back(kMpList >= 0 ? fs.views[kMpList][i] : p);
        l[kStepSlot].push_back(state_steps[i]);
      });
  fs.finish();
  increment_steps(state_steps, args.found_inf);
}

}  // namespace
}  // namespace cuda
}  // namespace mixprec

TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("fused_adam_", &mixprec::cuda::fused_adam_cuda);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  m.impl("fused_adam_", &mixprec::cuda::fused_adam_cuda);
}
