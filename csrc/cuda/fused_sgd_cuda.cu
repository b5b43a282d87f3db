// fused_sgd_ on CUDA: one multi-tensor-apply pass per (param dtype, grad
// dtype) group, then the step-count increment; found_inf, lr, grad_scale and
// clip_coef are read on the device (no host sync, graph-capturable).
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <type_traits>
#include <vector>

#include "common/optim_args.h"
#include "common/optim_dispatch.h"
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
    math::GradCoefs gc{1.0f, 1.0f, a.grad_scale != nullptr,
                       a.clip_coef != nullptr, a.maximize};
    if (gc.has_scale) {
      gc.inv_scale = math::reciprocal_scale(*a.grad_scale);
    }
    if (gc.has_clip) {
      gc.clip = *a.clip_coef;
    }
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
  const char* op = "fused_sgd_";
  const bool has_mom = momentum != 0.0;
  optim::OptimLists lists{params,
                          grads,
                          {{"momentum_buffers", momentum_buffers}},
                          master_params,
                          state_steps};
  optim::check_optim_args(op, lists, {has_mom},
                          {&lr, &grad_scale, &found_inf, &clip_coef},
                          stochastic_rounding, c10::DeviceType::CUDA);
  optim::check_sgd_hparams(weight_decay, momentum, dampening, nesterov);
  if (params.empty()) {
    return;
  }
  c10::cuda::OptionalCUDAGuard guard(params[0].device());
  const bool masters = !master_params.empty();

  std::vector<at::TensorList> flat_in{params, grads};
  std::vector<bool> written{true, false};
  const int kBufList = has_mom ? static_cast<int>(flat_in.size()) : -1;
  if (has_mom) {
    flat_in.push_back(momentum_buffers);
    written.push_back(true);
  }
  const int kMpList = masters ? static_cast<int>(flat_in.size()) : -1;
  if (masters) {
    flat_in.push_back(master_params);
    written.push_back(true);
  }
  optim::FlatSet fs(flat_in, written);

  SgdKernelArgs args;
  args.found_inf = found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr;
  args.grad_scale =
      grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr;
  args.clip_coef = clip_coef.has_value() ? clip_coef->data_ptr<float>() : nullptr;
  args.lr = lr.data_ptr();
  args.lr_double = lr.scalar_type() == at::kDouble;
  args.maximize = maximize;
  args.k = math::make_sgd_consts(weight_decay, momentum, dampening, nesterov);
  args.seed = static_cast<uint64_t>(seed);

  const auto groups = group_by_dtypes(fs.views[0], fs.views[1]);
  for (const auto& [dtypes, idx] : groups) {
    std::array<std::vector<at::Tensor>, kSgdDepth> l;
    for (size_t i : idx) {
      const at::Tensor& p = fs.views[0][i];
      l[kP].push_back(p);
      l[kG].push_back(fs.views[1][i]);
      l[kBuf].push_back(kBufList >= 0 ? fs.views[kBufList][i] : p);
      l[kMaster].push_back(kMpList >= 0 ? fs.views[kMpList][i] : p);
      l[kStepSlot].push_back(state_steps[i]);
    }
    const auto pdt = static_cast<at::ScalarType>(dtypes.first);
    const auto gdt = static_cast<at::ScalarType>(dtypes.second);
    args.sr = stochastic_rounding && pdt == at::kBFloat16;
    args.stream = static_cast<uint32_t>(gdt);
    optim::dispatch_param_grad(pdt, gdt, [&](auto* ptag, auto* gtag) {
      using PT = std::remove_pointer_t<decltype(ptag)>;
      using GT = std::remove_pointer_t<decltype(gtag)>;
      auto go = [&](auto master_tag, auto mom_tag) {
        constexpr bool kMs = decltype(master_tag)::value;
        constexpr bool kB = decltype(mom_tag)::value;
        if constexpr (kMs && std::is_same_v<PT, float>) {
          TORCH_INTERNAL_ASSERT(false, "float32 params have no master");
        } else {
          multi_tensor_apply<kSgdDepth>(l, SgdOp<PT, GT, kMs, kB>{}, args);
        }
      };
      using T = std::true_type;
      using F = std::false_type;
      if (masters) {
        has_mom ? go(T{}, T{}) : go(T{}, F{});
      } else {
        has_mom ? go(F{}, T{}) : go(F{}, F{});
      }
    });
  }
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
