// fused_sgd_ on CUDA: one multi-tensor-apply pass per (param dtype, grad
// dtype) group, then the step-count increment; found_inf, lr, grad_scale and
// clip_coef are read on the device (no host sync, graph-capturable).
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

// Unused slots (buffer without momentum, master without masters) hold the
// param's address and are never dereferenced.
enum SgdSlot : int { kP = 0, kG, kBuf, kMaster, kStepSlot, kSgdDepth };

struct SgdKernelArgs {
  const float* found_inf;
  const float* grad_scale;
  const float* clip_coef;
  const void* lr;
  bool lr_double;
  bool maximize;
  math::SgdConsts k;
  bool sr;
  uint64_t seed;
  uint32_t stream;
};

template <typename P, typename G, bool kMaster, bool kMom>
struct SgdOp {
  __device__ __forceinline__ void operator()(
      const TensorListMeta<kSgdDepth>& meta, const SgdKernelArgs& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return;
    }
    const BlockSpan s = block_span(meta);
    const int t = s.tensor;
    P* p = static_cast<P*>(meta.addresses[kP][t]) + s.start;
    const G* g = static_cast<const G*>(meta.addresses[kG][t]) + s.start;
    float* buf = static_cast<float*>(meta.addresses[kBuf][t]) + s.start;
    float* mp = static_cast<float*>(meta.addresses[kMaster][t]) + s.start;
    const float step_before =
        *static_cast<const float*>(meta.addresses[kStepSlot][t]);
    const bool first = step_before == 0.0f;
    const double lr = a.lr_double
                          ? *static_cast<const double*>(a.lr)
                          : static_cast<double>(*static_cast<const float*>(a.lr));
    const float neg_lr = static_cast<float>(-lr);
    const math::GradCoefs gc =
        math::make_grad_coefs(a.grad_scale, a.clip_coef, a.maximize);
    uint32_t key = 0;
    uint32_t base = 0;
    if (a.sr) {
      key = math::sr_key(a.seed, static_cast<uint32_t>(step_before + 1.0f),
                         a.stream);
      base = static_cast<uint32_t>((meta.block_offset + blockIdx.x) *
                                   math::kSrChunk);
    }

    int64_t nvec = 0;
    const bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) &&
                         (!kMom || vec_aligned<float>(buf)) &&
                         (!kMaster || vec_aligned<float>(mp));
    if (aligned) {
      nvec = s.length / kOptVec;
      for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
        float w[kOptVec], gr[kOptVec], br[kOptVec] = {};
        if constexpr (kMaster) {
          load_vec(mp, vi, w);
        } else {
          load_vec(p, vi, w);
        }
        load_vec(g, vi, gr);
        if constexpr (kMom) {
          if (!first) {
            load_vec(buf, vi, br);
          }
        }
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          math::sgd_update(w[k], math::prepare_grad(gr[k], gc), br[k], a.k,
                           first, neg_lr);
        }
        if constexpr (kMom) {
          store_vec(buf, vi, br);
        }
        if constexpr (kMaster) {
          store_vec(mp, vi, w);
        }
        AlignedVector<P, kOptVec> out;
#pragma unroll
        for (int k = 0; k < kOptVec; ++k) {
          out.val[k] = round_param<P>(w[k], a.sr, key,
                                      base + static_cast<uint32_t>(vi * kOptVec + k));
        }
        reinterpret_cast<AlignedVector<P, kOptVec>*>(p)[vi] = out;
      }
    }
    for (int64_t i = nvec * kOptVec + threadIdx.x; i < s.length;
         i += blockDim.x) {
      float w = kMaster ? mp[i] : static_cast<float>(p[i]);
      float bi = (kMom && !first) ? buf[i] : 0.0f;
      math::sgd_update(w, math::prepare_grad(static_cast<float>(g[i]), gc), bi,
                       a.k, first, neg_lr);
      if constexpr (kMom) {
        buf[i] = bi;
      }
      if constexpr (kMaster) {
        mp[i] = w;
      }
      p[i] = round_param<P>(w, a.sr, key, base + static_cast<uint32_t>(i));
    }
  }
};

void fused_sgd_cuda(at::TensorList params, at::TensorList grads,
                    at::TensorList momentum_buffers,
                    at::TensorList master_params, at::TensorList state_steps,
                    const at::Tensor& lr, double weight_decay, double momentum,
                    double dampening, bool nesterov, bool maximize,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf,
                    const std::optional<at::Tensor>& clip_coef,
                    bool stochastic_rounding, int64_t seed) {
  const optim::OptimLists lists = optim::check_fused_sgd_args(
      params, grads, momentum_buffers, master_params, state_steps, lr,
      weight_decay, momentum, dampening, nesterov, grad_scale, found_inf,
      clip_coef, stochastic_rounding, c10::DeviceType::CUDA);
  if (params.empty()) {
    return;
  }
  c10::cuda::OptionalCUDAGuard guard(params[0].device());
  const bool masters = !master_params.empty();
  const bool has_mom = momentum != 0.0;

  optim::FlatSet fs(lists);
  const int kBufList = fs.state_view[0];  // momentum_buffers (momentum != 0)
  const int kMpList = fs.master_view;

  SgdKernelArgs args;
  args.found_inf = optim::scalar_data(found_inf);
  args.grad_scale = optim::scalar_data(grad_scale);
  args.clip_coef = optim::scalar_data(clip_coef);
  args.lr = lr.data_ptr();
  args.lr_double = lr.scalar_type() == at::kDouble;
  args.maximize = maximize;
  args.k = math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  args.seed = static_cast<uint64_t>(seed);

  apply_by_dtypes<kSgdDepth, SgdOp>(
      fs, masters, has_mom, stochastic_rounding, args,
      [&](size_t i, std::array<std::vector<at::Tensor>, kSgdDepth>& l) {
        const at::Tensor& p = fs.views[0][i];
        l[kP].push_back(p);
        l[kG].push_back(fs.views[1][i]);
        l[kBuf].push_back(kBufList >= 0 ? fs.views[kBufList][i] : p);
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
  m.impl("fused_sgd_", &mixprec::cuda::fused_sgd_cuda);
}

// A sparse grad routes the call here; the argument checks then reject it with
// a message naming the grad (instead of a missing-kernel error).
TORCH_LIBRARY_IMPL(mixprec, SparseCUDA, m) {
  m.impl("fused_sgd_", &mixprec::cuda::fused_sgd_cuda);
}
