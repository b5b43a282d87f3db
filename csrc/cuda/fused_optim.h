// Shared pieces of the CUDA fused-optimizer kernels (fused_adam.h,
// fused_sgd.h): per-element vector loads, rounding of the float result to the
// param dtype (nearest or stochastic), the device-side step-count increment,
// and the host-side grouping of parameters by (param dtype, grad dtype) with
// the plan of each group. Plain C++, templated on the executor (see
// launch_plan.h).
#pragma once

#include "common/tensor.h"
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <array>
#include <deque>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/checks.h"
#include "common/master_math.h"
#include "common/optim_args.h"
#include "common/optim_dispatch.h"
#include "common/optim_math.h"
#include "common/quant8_math.h"
#include "cuda/launch_plan.h"

namespace mixprec {
namespace cuda {

static_assert(kChunkSize == math::kSrChunk,
              "SR element numbering assumes one block per 65536 elements");

// Elements per thread per iteration of the vector path (16 bytes of fp32).
constexpr int kOptVec = 4;

template <typename T>
MIXPREC_HD bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kOptVec) == 0;
}

template <typename T>
MIXPREC_HD void load_vec(const T* p, int64_t vi, float (&out)[kOptVec]) {
  const AlignedVector<T, kOptVec> r =
      reinterpret_cast<const AlignedVector<T, kOptVec>*>(p)[vi];
#pragma unroll
  for (int k = 0; k < kOptVec; ++k) {
    out[k] = static_cast<float>(r.val[k]);
  }
}

template <typename T>
MIXPREC_HD void store_vec(T* p, int64_t vi, const float (&in)[kOptVec]) {
  AlignedVector<T, kOptVec> r;
#pragma unroll
  for (int k = 0; k < kOptVec; ++k) {
    r.val[k] = static_cast<T>(in[k]);
  }
  reinterpret_cast<AlignedVector<T, kOptVec>*>(p)[vi] = r;
}

// The float result w rounded to P; bf16 stochastically when `sr`, with the
// bits of SR element `index`.
template <typename P>
MIXPREC_HD P round_param(float w, bool sr, uint32_t key, uint32_t index) {
  if constexpr (std::is_same_v<P, torch::headeronly::BFloat16>) {
    if (sr) {
      const uint32_t r = math::sr_bits(key, index) >> 16;
      return torch::headeronly::BFloat16(
          math::bf16_bits_stochastic(w, r),
          torch::headeronly::BFloat16::from_bits());
    }
  }
  return static_cast<P>(w);
}

// The masters of the functors, by type M: void (none: the param is the
// working copy), float (a float32 master) or int16_t / int8_t (a split
// master: the bf16 param plus that correction, common/master_math.h). The
// functors read and write the working value through these helpers.
template <typename M>
constexpr bool has_master_v = !std::is_void_v<M>;

// mp + i where there is a master list (M not void), else mp.
template <typename M>
MIXPREC_HD M* master_at(M* mp, int64_t i) {
  if constexpr (has_master_v<M>) {
    return mp + i;
  } else {
    return mp;
  }
}

// Whether the master list allows the functors' vector loads at mp.
template <typename M>
MIXPREC_HD bool master_aligned(const M* mp) {
  if constexpr (has_master_v<M>) {
    return vec_aligned<M>(mp);
  } else {
    return true;
  }
}

// The float32 working value of element i: the param, its master, or its
// split master decoded.
template <typename P, typename M>
MIXPREC_HD float load_working(const P* p, const M* mp, int64_t i) {
  if constexpr (std::is_same_v<M, float>) {
    return mp[i];
  } else if constexpr (has_master_v<M>) {
    static_assert(std::is_same_v<P, torch::headeronly::BFloat16>);
    return master::decode<M>(p[i].x, mp[i]);
  } else {
    return static_cast<float>(p[i]);
  }
}

// The working values of vector vi (elements kOptVec * vi on).
template <typename P, typename M>
MIXPREC_HD void load_working_vec(const P* p, const M* mp, int64_t vi,
                                 float (&w)[kOptVec]) {
  if constexpr (std::is_same_v<M, float>) {
    load_vec(mp, vi, w);
  } else if constexpr (has_master_v<M>) {
    static_assert(std::is_same_v<P, torch::headeronly::BFloat16>);
    const AlignedVector<P, kOptVec> pv =
        reinterpret_cast<const AlignedVector<P, kOptVec>*>(p)[vi];
    const AlignedVector<M, kOptVec> cv =
        reinterpret_cast<const AlignedVector<M, kOptVec>*>(mp)[vi];
#pragma unroll
    for (int k = 0; k < kOptVec; ++k) {
      w[k] = master::decode<M>(pv.val[k].x, cv.val[k]);
    }
  } else {
    load_vec(p, vi, w);
  }
}

// Element i's new working value w into the master (float32, or the
// correction to the rounded param) and the param (rounded to nearest, or
// stochastically when `sr`: never with masters).
template <typename P, typename M>
MIXPREC_HD void store_working(P* p, M* mp, int64_t i, float w, bool sr,
                              uint32_t key, uint32_t index) {
  const P r = round_param<P>(w, sr, key, index);
  if constexpr (std::is_same_v<M, float>) {
    mp[i] = w;
  } else if constexpr (has_master_v<M>) {
    mp[i] = master::encode<M>(math::float_bits(w), r.x);
  }
  p[i] = r;
}

// store_working for the kOptVec elements of vector vi; `index` is the SR
// number of its first element.
template <typename P, typename M>
MIXPREC_HD void store_working_vec(P* p, M* mp, int64_t vi,
                                  const float (&w)[kOptVec], bool sr,
                                  uint32_t key, uint32_t index) {
  AlignedVector<P, kOptVec> out;
#pragma unroll
  for (int e = 0; e < kOptVec; ++e) {
    out.val[e] =
        round_param<P>(w[e], sr, key, index + static_cast<uint32_t>(e));
  }
  if constexpr (std::is_same_v<M, float>) {
    store_vec(mp, vi, w);
  } else if constexpr (has_master_v<M>) {
    AlignedVector<M, kOptVec> cv;
#pragma unroll
    for (int e = 0; e < kOptVec; ++e) {
      cv.val[e] = master::encode<M>(math::float_bits(w[e]), out.val[e].x);
    }
    reinterpret_cast<AlignedVector<M, kOptVec>*>(mp)[vi] = cv;
  }
  reinterpret_cast<AlignedVector<P, kOptVec>*>(p)[vi] = out;
}

// The SR number of element `start` of the block's tensor: its base (the
// Rule's kSrBase slot, an integer launch_optim writes) plus `start`.
template <class Rule, class Meta>
MIXPREC_HD uint32_t sr_number(const Meta& meta, int tensor, int64_t start) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(
             meta.addresses[Rule::kSrBase][tensor])) +
         static_cast<uint32_t>(start);
}

// The float32 or float64 learning rate, read on the device.
MIXPREC_HD double read_lr(const void* lr, bool lr_double) {
  return lr_double ? *static_cast<const double*>(lr)
                   : static_cast<double>(*static_cast<const float*>(lr));
}

// state_steps[i] += 1 unless *found_inf != 0, for up to kStepsPerLaunch
// tensors per launch. Runs after the update kernels on the same stream, which
// read the counts before the increment.
constexpr int kStepsPerLaunch = 256;

struct StepPtrs {
  float* ptr[kStepsPerLaunch];
  int n;
};

struct IncrementStepsOp {
  MIXPREC_HD void operator()(NoMeta, GridPos pos, const StepPtrs& s,
                             const float* found_inf) const {
    if (pos.thread < s.n && (found_inf == nullptr || *found_inf == 0.0f)) {
      *s.ptr[pos.thread] += 1.0f;
    }
  }
};

template <class Exec>
void increment_steps(const std::vector<StepPtrs>& launches,
                     const float* found_inf) {
  for (const StepPtrs& s : launches) {
    Exec::launch_single_block(kStepsPerLaunch, IncrementStepsOp{}, s,
                              found_inf);
  }
}

// The kernel arguments every optimizer reads the same way (OptimOp uses
// them); AdamKernelArgs / SgdKernelArgs add their hyper-parameters.
struct OptimKernelArgs {
  const float* found_inf;   // may be null
  const float* grad_scale;  // may be null
  const float* clip_coef;   // may be null
  const void* lr;           // float or double, one element
  bool lr_double;
  bool maximize;
  bool sr;  // set per (param dtype, grad dtype) group
  uint64_t seed;
  uint32_t stream;  // SR stream: the grad dtype's code, set per group

  // Fills the fields above from a launcher's arguments (host).
  void set_common(const Tensor& lr_t, const std::optional<Tensor>& grad_scale_t,
                  const std::optional<Tensor>& found_inf_t,
                  const std::optional<Tensor>& clip_coef_t, bool maximize_,
                  int64_t seed_) {
    found_inf = optim::scalar_data(found_inf_t);
    grad_scale = optim::scalar_data(grad_scale_t);
    clip_coef = optim::scalar_data(clip_coef_t);
    lr = lr_t.data_ptr();
    lr_double = lr_t.scalar_type() == ScalarType::Double;
    maximize = maximize_;
    sr = false;
    seed = static_cast<uint64_t>(seed_);
    stream = 0;
  }
};

// What every fused-optimizer functor reads first in a CUDA block: the
// block's span, its param and grad (and master: M, as has_master_v) pointers
// at the
// span's start, the step's constants (Rule::block, Rule::loads_states), the
// grad coefficients, and the stochastic-rounding key and element base (both
// 0 unless a.sr). OptimOp below and Optim8Op (fused_optim8.h) start here.
template <typename P, typename G, typename M, class Rule>
struct StepFrame {
  BlockSpan s;
  P* p;
  const G* g;
  M* mp;  // null without a master
  typename Rule::Block blk;
  bool load_states;
  math::GradCoefs gc;
  uint32_t key;
  uint32_t base;

  // The frame at element `start` of the block's tensor (the span's first
  // element unless given: Optim8Op starts at each state block).
  template <class Meta>
  MIXPREC_HD static StepFrame make(const Meta& meta, GridPos pos,
                                   const typename Rule::Args& a,
                                   int64_t start = -1) {
    const BlockSpan s = block_span(meta, pos.block);
    if (start < 0) {
      start = s.start;
    }
    auto list = [&](int slot) { return meta.addresses[slot][s.tensor]; };
    M* mp = nullptr;
    if constexpr (has_master_v<M>) {
      mp = static_cast<M*>(list(Rule::kMaster)) + start;
    }
    const float step_before = *static_cast<const float*>(list(Rule::kStep));
    const typename Rule::Block blk = Rule::block(a, step_before);
    uint32_t key = 0;
    uint32_t base = 0;
    if (a.sr) {
      key = math::sr_key(a.seed, static_cast<uint32_t>(step_before + 1.0f),
                         a.stream);
      base = sr_number<Rule>(meta, s.tensor, start);
    }
    return StepFrame{
        s,
        static_cast<P*>(list(Rule::kParam)) + start,
        static_cast<const G*>(list(Rule::kGrad)) + start,
        mp,
        blk,
        Rule::loads_states(blk),
        math::make_grad_coefs(a.grad_scale, a.clip_coef, a.maximize),
        key,
        base};
  }
};

// A rule's slot constants, from its op's slot enum (Slot: kParam, kGrad,
// kMaster, kStep, kSrBase, kDepth) and its number of states: a rule derives
// from RuleSlots<Slot, n> (OptimOp) or RuleSlots8<Slot, n> (Optim8Op, which
// also reads kRow) instead of repeating them.
template <class Slot, int kNumStates>
struct RuleSlots {
  static constexpr int kDepth = Slot::kDepth;
  static constexpr int kParam = Slot::kParam;
  static constexpr int kGrad = Slot::kGrad;
  static constexpr int kMaster = Slot::kMaster;
  static constexpr int kStep = Slot::kStep;
  static constexpr int kSrBase = Slot::kSrBase;
  static constexpr int kStates = kNumStates;
};

template <class Slot, int kNumStates>
struct RuleSlots8 : RuleSlots<Slot, kNumStates> {
  static constexpr int kRow = Slot::kRow;
};

// The block functor of every fused optimizer: param, grad and master (M:
// none, float32, or a split master's correction), float32 state lists, and the
// step count, updated element by element in float32 with 16-byte vectors where
// every list in use is aligned and a scalar tail. Rule supplies what differs
// between optimizers:
//   kDepth, slots kParam/kGrad/kMaster/kStep, kStates and state_slot(k),
//   uses_state(k) (the optional state in use?), Args (the kernel arguments,
//   with found_inf/grad_scale/clip_coef/maximize/lr/lr_double/sr/seed/stream),
//   Block block(args, step_before) (the block's constants), loads_states(blk)
//   (read the states this step?), update(w, g, x[kStates], args, blk).
// A step with found_inf set changes nothing. Stochastic rounding numbers the
// elements as sr_number says, with key (seed, step_before + 1, stream).
template <typename P, typename G, typename M, class Rule>
struct OptimOp {
  static constexpr int kStates = Rule::kStates;
  using Args = typename Rule::Args;

  // Meta: TensorListMeta<Rule::kDepth> or its SmallTensorListMeta.
  template <class Meta>
  MIXPREC_HD void operator()(const Meta& meta, GridPos pos,
                             const Args& a) const {
    if (a.found_inf != nullptr && *a.found_inf != 0.0f) {
      return;
    }
    const auto [s, p, g, mp, blk, load_states, gc, key, base] =
        StepFrame<P, G, M, Rule>::make(meta, pos, a);
    float* st[kStates];
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      st[k] = Rule::uses_state(k)
                  ? static_cast<float*>(
                        meta.addresses[Rule::state_slot(k)][s.tensor]) +
                        s.start
                  : nullptr;
    }

    bool aligned = vec_aligned<P>(p) && vec_aligned<G>(g) && master_aligned(mp);
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      aligned = aligned && (st[k] == nullptr || vec_aligned<float>(st[k]));
    }
    int64_t nvec = 0;
    if (aligned) {
      nvec = s.length / kOptVec;
      for (int64_t vi = pos.thread; vi < nvec; vi += pos.threads) {
        float w[kOptVec], gr[kOptVec], sv[kStates][kOptVec] = {};
        load_working_vec(p, mp, vi, w);
        load_vec(g, vi, gr);
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          if (st[k] != nullptr && load_states) {
            load_vec(st[k], vi, sv[k]);
          }
        }
#pragma unroll
        for (int e = 0; e < kOptVec; ++e) {
          float x[kStates];
#pragma unroll
          for (int k = 0; k < kStates; ++k) {
            x[k] = sv[k][e];
          }
          Rule::update(w[e], math::prepare_grad(gr[e], gc), x, a, blk);
#pragma unroll
          for (int k = 0; k < kStates; ++k) {
            sv[k][e] = x[k];
          }
        }
#pragma unroll
        for (int k = 0; k < kStates; ++k) {
          if (st[k] != nullptr) {
            store_vec(st[k], vi, sv[k]);
          }
        }
        store_working_vec(p, mp, vi, w, a.sr, key,
                          base + static_cast<uint32_t>(vi * kOptVec));
      }
    }
    for (int64_t i = nvec * kOptVec + pos.thread; i < s.length;
         i += pos.threads) {
      float w = load_working(p, mp, i);
      float x[kStates] = {};
#pragma unroll
      for (int k = 0; k < kStates; ++k) {
        if (st[k] != nullptr && load_states) {
          x[k] = st[k][i];
        }
      }
      Rule::update(w, math::prepare_grad(static_cast<float>(g[i]), gc), x, a,
                   blk);
#pragma unroll
      for (int k = 0; k < kStates; ++k) {
        if (st[k] != nullptr) {
          st[k][i] = x[k];
        }
      }
      store_working(p, mp, i, w, a.sr, key, base + static_cast<uint32_t>(i));
    }
  }
};

// The tensors of one parameter as the kernels see them, param by param:
// row(i) holds param i's tensor in every list in use -- params, grads, the
// states in use, the masters (FlatSet's lists, optim_args.h) -- the caller's
// own tensors when all are dense with the param's strides, else contiguous
// copies, the written ones copied back by finish(). FlatSet's rule, one
// param at a time, so that a launcher plans in one pass over its lists.
class FlatRows {
 public:
  static constexpr int kMaxLists = 6;  // params, grads, 3 states, masters

  explicit FlatRows(const optim::OptimLists& in) {
    add(in.params, true);
    add(in.grads, false);
    MIXPREC_INTERNAL_ASSERT(in.states.size() <= state_view.size());
    for (size_t s = 0; s < in.states.size(); ++s) {
      const TensorList list = in.states[s].list;
      state_view[s] = list.empty() ? -1 : count_;
      if (!list.empty()) {
        add(list, true);
      }
    }
    if (!in.master_params.empty()) {
      master_view = count_;
      add(in.master_params, true);
    }
  }

  // Param i's tensors, by list (index with state_view / master_view); valid
  // until the next call.
  const Tensor* const* row(size_t i) {
    const Tensor& p = lists_[0][i];
    bool direct = is_dense(p);
    for (int l = 1; l < count_ && direct; ++l) {
      const Tensor& t = lists_[l][i];
      direct = is_dense(t) && checks::same_dims(t.strides(), p.strides());
    }
    for (int l = 0; l < count_; ++l) {
      const Tensor& t = lists_[l][i];
      if (direct) {
        row_[l] = &t;
      } else {
        owned_.push_back(dense_copy(t));
        if (written_[l] && owned_.back().data_ptr() != t.data_ptr()) {
          copy_back_.emplace_back(t, owned_.back());
        }
        row_[l] = &owned_.back();
      }
    }
    return row_.data();
  }

  void finish() {
    for (auto& pr : copy_back_) {
      copy_into(pr.first, pr.second);
    }
  }

  // The row index of the call's state list s; -1 for a state not in use.
  std::array<int, 3> state_view{-1, -1, -1};
  int master_view = -1;  // the row index of the masters; -1 without

 private:
  void add(TensorList list, bool written) {
    MIXPREC_INTERNAL_ASSERT(count_ < kMaxLists);
    lists_[count_] = list;
    written_[count_] = written;
    ++count_;
  }

  std::array<TensorList, kMaxLists> lists_;
  std::array<bool, kMaxLists> written_{};
  int count_ = 0;
  std::array<const Tensor*, kMaxLists> row_{};
  std::deque<Tensor> owned_;  // contiguous copies (stable addresses)
  std::vector<std::pair<Tensor, Tensor>> copy_back_;  // (orig, flat)
};

// The (param dtype, grad dtype) groups of a plan: params grouped by the
// pair, in list order within a group; groups in a fixed order (param dtype,
// then grad dtype, each as half, float, bfloat16).
struct DtypePairGroups {
  static constexpr std::array<ScalarType, 3> kDtypes{
      ScalarType::Half, ScalarType::Float, ScalarType::BFloat16};
  static int group(ScalarType param, ScalarType grad) {
    return 3 * dtype_index(kDtypes, param) + dtype_index(kDtypes, grad);
  }
};

// The plan of one fused-optimizer call: the launches of each (param dtype,
// grad dtype) group (DtypePairGroups order; empty for a pair not present)
// and the step-increment launches.
template <int Depth>
struct OptimPlan {
  std::array<Launches<Depth>, 9> groups;
  std::vector<StepPtrs> steps;
};

// Runs the groups of `plan` with Op<P, G, M, kHasOption> per (param dtype,
// grad dtype) group, where M is the masters' element type (void without
// masters: `master_dtype` Undefined; float; int16_t / int8_t, bf16 params
// only) and kHasOption whether the optimizer's optional state (amsgrad's
// max_exp_avg_sqs, SGD's momentum buffers) is in use; args.sr and args.stream
// are set per group. (The step increments are run by increment_steps.)
template <class Exec, int Depth,
          template <typename, typename, typename, bool> class Op, typename Args>
void run_optim_plan(const OptimPlan<Depth>& plan, ScalarType master_dtype,
                    bool option, bool stochastic_rounding, Args& args) {
  for (int k = 0; k < 9; ++k) {
    const Launches<Depth>& launches = plan.groups[k];
    if (launches.empty()) {
      continue;
    }
    const ScalarType pdt = DtypePairGroups::kDtypes[k / 3];
    const ScalarType gdt = DtypePairGroups::kDtypes[k % 3];
    args.sr = stochastic_rounding && pdt == ScalarType::BFloat16;
    args.stream = static_cast<uint32_t>(gdt);
    optim::dispatch_param_grad(pdt, gdt, [&](auto* ptag, auto* gtag) {
      // (remove_reference: g++ gives the captured parameter's type as a
      // reference where the nested lambda below names PT.)
      using PT = std::remove_pointer_t<std::remove_reference_t<decltype(ptag)>>;
      using GT = std::remove_pointer_t<std::remove_reference_t<decltype(gtag)>>;
      auto go = [&](auto* master_tag) {
        using MT = std::remove_pointer_t<decltype(master_tag)>;
        if (option) {
          run_launches<Exec, Depth>(launches, Op<PT, GT, MT, true>{}, args);
        } else {
          run_launches<Exec, Depth>(launches, Op<PT, GT, MT, false>{}, args);
        }
      };
      if (master_dtype == ScalarType::Undefined) {
        go(static_cast<void*>(nullptr));
        return;
      }
      if constexpr (std::is_same_v<PT, float>) {
        MIXPREC_INTERNAL_ASSERT(false, "float32 params have no master");
      } else if constexpr (std::is_same_v<PT, torch::headeronly::BFloat16>) {
        if (master_dtype == ScalarType::Short) {
          go(static_cast<int16_t*>(nullptr));
        } else if (master_dtype == ScalarType::Char) {
          go(static_cast<int8_t*>(nullptr));
        } else {
          go(static_cast<float*>(nullptr));
        }
      } else {
        MIXPREC_INTERNAL_ASSERT(master_dtype == ScalarType::Float,
                                "split masters need bfloat16 params");
        go(static_cast<float*>(nullptr));
      }
    });
  }
}

// What every fused-optimizer launcher does around its own parts (the
// checks, the slot wiring, the kernel arguments), in one pass over the lists:
// - `lists` are the call's, checked as a call (check_fused_*_args with
//   each_param false: lengths, device, scalars);
// - for each param i: its checks (check_optim_param), its flat tensors
//   (FlatRows), its step pointer, and, unless it is empty, its slots wired by
//   `fill(rows, row, i, addresses)` into the launches of its dtype group;
// - then the hyper-parameter checks `check_hparams` (after every tensor
//   check, as check_fused_*_args orders them);
// - run Op over the plan with the kernel arguments `make_args()` (made after
//   the checks, so a bad argument gets the checks' message), copy the
//   flattened copies back, then increment the step counts unless found_inf.
// Slot `sr_slot` of each param carries an integer, not an address: the SR
// number of its element 0 (lists.sr_bases', or the kSrChunk chunks of the
// params before it in its dtype group, as the CPU kernels number them). 8-bit
// state (Optim8Op) also gives `row_slot`: each param is then planned over
// kBlock slots per state block (q8::RowBlocks), and that slot carries its
// elements per row.
template <class Exec, int Depth,
          template <typename, typename, typename, bool> class Op,
          class CheckHparams, class Fill, class MakeArgs>
void launch_optim(const optim::OptimLists& lists,
                  const CheckHparams& check_hparams, const Fill& fill,
                  const MakeArgs& make_args, bool option,
                  bool stochastic_rounding, int row_slot, int sr_slot) {
  const size_t n = lists.params.size();
  if (n == 0) {
    check_hparams();
    return;
  }
  const Device device = lists.params[0].device();
  typename Exec::Guard guard(device);
  const bool masters = !lists.master_params.empty();

  FlatRows rows(lists);
  OptimPlan<Depth> plan;
  std::array<std::optional<LaunchPlanner<Depth>>, 9> planners;
  std::array<int64_t, 9> sr_chunks{};  // per group: kSrChunk chunks so far
  plan.steps.reserve(n / kStepsPerLaunch + 1);
  for (size_t i = 0; i < n; ++i) {
    optim::check_optim_param(lists, i, device);
    if (i % kStepsPerLaunch == 0) {
      plan.steps.emplace_back();
      plan.steps.back().n = 0;
    }
    StepPtrs& s = plan.steps.back();
    s.ptr[s.n++] = static_cast<float*>(lists.state_steps[i].data_ptr());
    const int64_t numel = lists.params[i].numel();
    if (numel == 0) {
      continue;  // no chunks (its step count is still incremented)
    }
    const Tensor* const* row = rows.row(i);
    const int k =
        DtypePairGroups::group(row[0]->scalar_type(), row[1]->scalar_type());
    if (!planners[k]) {
      planners[k].emplace(plan.groups[k], n - i);
    }
    void* addresses[Depth];
    fill(rows, row, i, addresses);
    int64_t planned = numel;
    if (row_slot >= 0) {
      const Tensor& p = lists.params[i];
      const q8::RowBlocks rb(q8::row_length(p.sizes().data(), p.dim()));
      addresses[row_slot] =
          reinterpret_cast<void*>(static_cast<uintptr_t>(rb.row));
      planned = numel / rb.row * rb.per_row * q8::kBlock;
    }
    addresses[sr_slot] =
        reinterpret_cast<void*>(static_cast<uintptr_t>(static_cast<uint32_t>(
            lists.sr_bases.has_value() ? (*lists.sr_bases)[i]
                                       : sr_chunks[k] * math::kSrChunk)));
    sr_chunks[k] += (numel + math::kSrChunk - 1) / math::kSrChunk;
    planners[k]->add(addresses, planned);
  }
  for (auto& p : planners) {
    if (p) {
      p->finish();
    }
  }
  check_hparams();

  auto args = make_args();
  run_optim_plan<Exec, Depth, Op>(
      plan,
      masters ? lists.master_params[0].scalar_type() : ScalarType::Undefined,
      option, stochastic_rounding, args);
  rows.finish();
  increment_steps<Exec>(plan.steps, args.found_inf);
}

}  // namespace cuda
}  // namespace mixprec
