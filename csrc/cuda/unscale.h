// unscale_and_check_, check_finite_, unscale_and_norm_ and
// check_finite_and_norm_ for the CUDA backend: the block functors and the
// launchers, templated on the executor (DeviceExec in the .cu files,
// cuda_emulation::HostExec in CI). Plain C++, see launch_plan.h.
#pragma once

#include "common/tensor.h"

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <array>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/checks.h"
#include "op_table.h"
#include "common/norm_math.h"
#include "common/unscale_math.h"
#include "cuda/launch_plan.h"

namespace mixprec {
namespace cuda {

constexpr int kNoNorm = -1;

// The type the unscale arithmetic runs in: float for fp16/bf16, the dtype
// itself for float32/float64.
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<torch::headeronly::Half> {
  using type = float;
};
template <>
struct OpMath<torch::headeronly::BFloat16> {
  using type = float;
};

// Calls f(T*) with a null pointer whose type is the C++ type of `dtype`
// (float32, float64, float16 or bfloat16: the dtypes the checks let through).
template <typename F>
void dispatch_unscale_dtype(ScalarType dtype, F&& f) {
  switch (dtype) {
    case ScalarType::Float:
      f(static_cast<float*>(nullptr));
      return;
    case ScalarType::Double:
      f(static_cast<double*>(nullptr));
      return;
    case ScalarType::Half:
      f(static_cast<torch::headeronly::Half*>(nullptr));
      return;
    case ScalarType::BFloat16:
      f(static_cast<torch::headeronly::BFloat16*>(nullptr));
      return;
    default:
      MIXPREC_INTERNAL_ASSERT(false, "unchecked dtype ", dtype,
                              " reached an unscale launcher");
  }
}

// The per-thread part of one block's chunk: check for inf/NaN, multiply by
// inv_scale when kUnscale (stored in place when kWrite and inv_scale != 1),
// and, when Kind != kNoNorm, the thread's norm partial of the unscaled
// values. For norms the block's total goes to partials[block number].
template <typename scalar_t, bool kUnscale, int Kind, bool kWrite>
struct UnscaleOpBase {
  template <class Meta>  // TensorListMeta<1> or SmallTensorListMeta<1>
  MIXPREC_HD double run(const Meta& meta, GridPos pos, float* found_inf,
                        const float* inv_scale, float norm_type) const {
    using opmath_t = typename OpMath<scalar_t>::type;
    constexpr int kVec = 16 / sizeof(scalar_t);
    using VecT = AlignedVector<scalar_t, kVec>;
    constexpr bool kNorm = Kind != kNoNorm;
    [[maybe_unused]] constexpr int kAcc = kNorm ? Kind : math::kNormL2;

    const BlockSpan s = block_span(meta, pos.block);
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
    const int64_t stride = pos.threads;
    int64_t tail_begin = 0;
    if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      const int64_t nvec = s.length / kVec;
      VecT* pv = reinterpret_cast<VecT*>(p);
      for (int64_t base = pos.thread; base < nvec; base += stride * kILP) {
        VecT r[kILP];
#pragma unroll
        for (int j = 0; j < kILP; ++j) {
          const int64_t idx = base + j * stride;
          if (idx < nvec) {
            r[j] = pv[idx];
          }
        }
#pragma unroll
        for (int j = 0; j < kILP; ++j) {
          const int64_t idx = base + j * stride;
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
    for (int64_t i = tail_begin + pos.thread; i < s.length; i += stride) {
      scalar_t x = p[i];
      visit(x);
      if (write) {
        p[i] = x;
      }
    }
    if (math::is_nan_acc(probe)) {
      *found_inf = 1.0f;  // every writer stores the same value
    }
    return static_cast<double>(acc);
  }
};

template <typename scalar_t, bool kUnscale, int Kind, bool kWrite = true>
struct UnscaleOp : UnscaleOpBase<scalar_t, kUnscale, Kind, kWrite> {
  static constexpr int kReduceKind = Kind;
  template <class Meta>
  MIXPREC_HD double operator()(const Meta& meta, GridPos pos, float* found_inf,
                               const float* inv_scale, double* /*partials*/,
                               float norm_type) const {
    return this->run(meta, pos, found_inf, inv_scale, norm_type);
  }
  template <class Meta>
  MIXPREC_HD void block_result(const Meta& meta, GridPos pos, double total,
                               float*, const float*, double* partials,
                               float) const {
    partials[meta.block_offset + pos.block] = total;
  }
};

// Without a norm there is nothing to reduce.
template <typename scalar_t, bool kUnscale, bool kWrite>
struct UnscaleOp<scalar_t, kUnscale, kNoNorm, kWrite>
    : UnscaleOpBase<scalar_t, kUnscale, kNoNorm, kWrite> {
  template <class Meta>
  MIXPREC_HD void operator()(const Meta& meta, GridPos pos, float* found_inf,
                             const float* inv_scale, double* /*partials*/,
                             float norm_type) const {
    this->run(meta, pos, found_inf, inv_scale, norm_type);
  }
};

// One block: combines the n partials (thread-strided, then block-reduced)
// and writes the norm.
template <int Kind>
struct FinishNormOp {
  static constexpr int kReduceKind = Kind;
  MIXPREC_HD double operator()(NoMeta, GridPos pos, const double* partials,
                               int64_t n, double /*norm_type*/,
                               float* /*out*/) const {
    double v = 0.0;  // neutral for sums and for the max of |u|
    for (int64_t i = pos.thread; i < n; i += pos.threads) {
      v = math::combine<Kind, double>(v, partials[i]);
    }
    return v;
  }
  MIXPREC_HD void block_result(NoMeta, GridPos, double total, const double*,
                               int64_t, double norm_type, float* out) const {
    *out = static_cast<float>(math::finish<Kind, double>(total, norm_type));
  }
};

// The plan of one call of the unscale family, built in one pass over the
// list: each tensor is checked (check_grad_member), then planned in its
// dtype's group -- a dense tensor by its own address (not copied, not
// reference-counted: the caller's list outlives the plan), a strided one by
// a contiguous copy, copied back by finish() when written.
struct UnscalePlan {
  // Group order (fixed: it orders the norm partials).
  static constexpr std::array<ScalarType, 4> kDtypes{
      ScalarType::Half, ScalarType::Float, ScalarType::Double,
      ScalarType::BFloat16};
  std::array<Launches<1>, 4> groups;  // empty for a dtype not in the list
  std::vector<Tensor> owned;          // contiguous copies of strided inputs
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (orig, dense)

  // Checks the call (check_unscale_args) and plans `tensors`; `device` is set
  // to the call's device once the scalars are checked.
  template <class Guard>
  UnscalePlan(const char* op, TensorList tensors, const Tensor& found_inf,
              const Tensor* inv_scale, DeviceType backend, bool read_only,
              std::optional<Guard>& guard) {
    const Device device =
        checks::check_unscale_args(op, tensors, found_inf, inv_scale, backend,
                                   read_only, /*each_tensor=*/false);
    guard.emplace(device);
    const bool written = inv_scale != nullptr && !read_only;
    const char* name = inv_scale != nullptr ? "grads" : "tensors";
    std::array<std::optional<LaunchPlanner<1>>, 4> planners;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      checks::check_grad_member(op, name, i, t, device, written);
      const int64_t n = t.numel();
      if (n == 0) {
        continue;
      }
      void* data = nullptr;
      if (is_dense(t)) {
        data = t.data_ptr();
      } else {
        owned.push_back(dense_copy(t));
        data = owned.back().data_ptr();
        if (written) {
          copy_back.emplace_back(t, owned.back());
        }
      }
      const int k = dtype_index(kDtypes, t.scalar_type());
      if (!planners[k]) {
        planners[k].emplace(groups[k], tensors.size() - i);
      }
      void* const addresses[1] = {data};
      planners[k]->add(addresses, n);
    }
    for (auto& p : planners) {
      if (p) {
        p->finish();
      }
    }
  }

  // f(dtype, launches) for each non-empty group, in group order.
  template <typename F>
  void for_each(F&& f) const {
    for (int k = 0; k < 4; ++k) {
      if (!groups[k].empty()) {
        f(kDtypes[k], groups[k]);
      }
    }
  }

  // Copies the written copies back into the caller's strided tensors.
  void finish() {
    for (auto& pr : copy_back) {
      copy_into(pr.first, pr.second);
    }
  }
};

// unscale_and_check_ (inv_scale given) and check_finite_ (inv_scale null):
// one plan per dtype present in the list.
template <class Exec>
void finite_check_launch(const char* op, TensorList tensors,
                         const Tensor& found_inf, const Tensor* inv_scale) {
  const bool unscale = inv_scale != nullptr;
  std::optional<typename Exec::Guard> guard;
  UnscalePlan plan(op, tensors, found_inf, inv_scale, Exec::kBackend,
                   /*read_only=*/false, guard);
  float* found_ptr = found_inf.mutable_data_ptr<float>();
  const float* inv_ptr = unscale ? inv_scale->const_data_ptr<float>() : nullptr;
  plan.for_each([&](ScalarType dtype, const Launches<1>& launches) {
    dispatch_unscale_dtype(dtype, [&](auto* type_tag) {
      using scalar_t = std::remove_pointer_t<decltype(type_tag)>;
      auto go = [&](auto op_fn) {
        run_launches<Exec, 1>(launches, op_fn, found_ptr, inv_ptr,
                              static_cast<double*>(nullptr), 0.0f);
      };
      if (unscale) {
        go(UnscaleOp<scalar_t, true, kNoNorm>{});
      } else {
        go(UnscaleOp<scalar_t, false, kNoNorm>{});
      }
    });
  });
  plan.finish();
}

// unscale_and_norm_ (in_place) and check_finite_and_norm_: the pass writes
// one norm partial per block; one block then combines the partials in
// double, in a fixed order (deterministic), and writes the norm.
template <class Exec, int Kind>
Tensor norm_run(UnscalePlan& plan, const Tensor& found_inf,
                const Tensor& inv_scale, double norm_type, bool in_place) {
  int64_t blocks = 0;
  plan.for_each([&](ScalarType, const Launches<1>& launches) {
    blocks += count_blocks(launches);
  });
  Tensor partials =
      new_vector(found_inf, std::max<int64_t>(blocks, 1), ScalarType::Double);
  double* part_ptr = partials.mutable_data_ptr<double>();
  float* found_ptr = found_inf.mutable_data_ptr<float>();
  const float* inv_ptr = inv_scale.const_data_ptr<float>();
  int64_t offset = 0;
  plan.for_each([&](ScalarType dtype, const Launches<1>& launches) {
    dispatch_unscale_dtype(dtype, [&](auto* type_tag) {
      using scalar_t = std::remove_pointer_t<decltype(type_tag)>;
      auto go = [&](auto op_fn) {
        run_launches<Exec, 1>(launches, op_fn, found_ptr, inv_ptr,
                              part_ptr + offset, static_cast<float>(norm_type));
      };
      if (in_place) {
        go(UnscaleOp<scalar_t, true, Kind>{});
      } else {
        go(UnscaleOp<scalar_t, true, Kind, /*kWrite=*/false>{});
      }
    });
    offset += count_blocks(launches);
  });
  plan.finish();
  Tensor out = new_scalar(found_inf);
  Exec::launch_single_block(kBlockSize, FinishNormOp<Kind>{},
                            static_cast<const double*>(part_ptr), blocks,
                            norm_type, out.mutable_data_ptr<float>());
  return out;
}

template <class Exec>
Tensor norm_launch(const char* op, TensorList grads, const Tensor& found_inf,
                   const Tensor& inv_scale, double norm_type, bool in_place) {
  std::optional<typename Exec::Guard> guard;
  UnscalePlan plan(op, grads, found_inf, &inv_scale, Exec::kBackend,
                   /*read_only=*/!in_place, guard);
  checks::check_norm_type(op, norm_type);
  return math::dispatch_norm_kind(math::norm_kind(norm_type), [&](auto kind) {
    return norm_run<Exec, decltype(kind)::value>(plan, found_inf, inv_scale,
                                                 norm_type, in_place);
  });
}

// The four ops' launchers, <op>launch<Exec>(OpArgs) as every op's (the name
// the emulation's registration derives from the op table): the CUDA build
// registers them with DeviceExec, the host emulation with HostExec and
// PlanOnlyExec.
template <class Exec>
void unscale_and_check_launch(const OpArgs<Op::unscale_and_check_>& a) {
  finite_check_launch<Exec>("unscale_and_check_", MIXPREC_ARG(a, grads),
                            MIXPREC_ARG(a, found_inf),
                            &MIXPREC_ARG(a, inv_scale));
}

template <class Exec>
void check_finite_launch(const OpArgs<Op::check_finite_>& a) {
  finite_check_launch<Exec>("check_finite_", MIXPREC_ARG(a, tensors),
                            MIXPREC_ARG(a, found_inf), nullptr);
}

template <class Exec>
Tensor unscale_and_norm_launch(const OpArgs<Op::unscale_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_launch<Exec>("unscale_and_norm_", grads, found_inf, inv_scale,
                           norm_type, /*in_place=*/true);
}

template <class Exec>
Tensor check_finite_and_norm_launch(
    const OpArgs<Op::check_finite_and_norm_>& a) {
  MIXPREC_BIND(a, grads, found_inf, inv_scale, norm_type)
  return norm_launch<Exec>("check_finite_and_norm_", grads, found_inf,
                           inv_scale, norm_type, /*in_place=*/false);
}

}  // namespace cuda
}  // namespace mixprec
