// mixprec::optim::{Adam, AdamW, SGD}: the C++ twins of mixprec.optim
// (python/mixprec/optim/). Same state layout, buckets, lr handling, seeds and
// checks as the Python FusedOptimizer, so that both run the same fused op
// calls on the same data and give the same results. This file: the options'
// checks, the buckets and the steps; the state-dict and archive conversion
// (with the 8-bit layouts) is optim_state.cpp.
#include "mixprec/optim.h"

#include "mixprec/ops.h"

#include "common/quant8_math.h"
#include "optim_internal.h"
#include "options_table.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace mixprec::optim {

namespace {

using detail::absmax_sizes;
using detail::step_zero;

bool is_low_precision(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

bool is_supported(at::ScalarType t) {
  return t == at::kFloat || is_low_precision(t);
}

// An options object's checks: each row's (the list's check column), then
// those relating two options; c10::ValueError naming the option.
template <typename Options>
const Options& check_options(const Options& o) {
  const char* cls = options_table::class_name<Options>();
  options_table::for_each_option(
      o, [&](const char* name, const auto& value, unsigned, auto check) {
        check(cls, name, value);
      });
  if constexpr (std::is_same_v<Options, SGDOptions>) {
    TORCH_CHECK_VALUE(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                      "mixprec.optim.SGD: nesterov=True requires momentum > 0 "
                      "and dampening == 0, got momentum=",
                      o.momentum(), ", dampening=", o.dampening());
  } else {
    TORCH_CHECK_VALUE(!(o.state_bits() == 8 && o.amsgrad()), "mixprec.optim.",
                      cls, ": amsgrad=True needs state_bits=32");
  }
  return o;
}

// float16 params are refused in a group with masters and
// master_correction_bits (a split master is a bfloat16 param plus a
// correction); c10::ValueError naming the param and the alternative.
void check_split_dtypes(const char* cls, size_t index, const at::Tensor& p,
                        size_t k, bool masters, int64_t bits) {
  TORCH_CHECK_VALUE(
      !(masters && bits != 0 && p.defined() && p.scalar_type() == at::kHalf),
      "mixprec.optim.", cls, ": param_groups[", index, "]['params'][", k,
      "] is float16 in a group with master_correction_bits=", bits,
      ": a split master is a bfloat16 param plus a fixed-width correction, "
      "and float16's exponent range differs from float32's, so a float16 "
      "param cannot carry one. Use master_correction_bits(0) (float32 "
      "masters) for float16 params (e.g. a param group of their own), or "
      "bfloat16 params");
}

// The checks of a param group's own options (added after construction).
template <typename Options>
void check_groups(const torch::optim::Optimizer& opt) {
  size_t index = 0;
  for (const auto& g : opt.param_groups()) {
    const auto* o = dynamic_cast<const Options*>(&g.options());
    TORCH_CHECK(o != nullptr, "mixprec.optim.",
                options_table::class_name<Options>(),
                ": a param group has options of another optimizer");
    check_options(*o);
    for (size_t k = 0; k < g.params().size(); ++k) {
      check_split_dtypes(options_table::class_name<Options>(), index,
                         g.params()[k], k, o->master_weights(),
                         o->master_correction_bits());
    }
    ++index;
  }
}

int64_t correction_bits_of(const torch::optim::OptimizerParamGroup& group) {
  int64_t bits = 0;
  options_table::visit(group.options(), [&](const auto& o) {
    bits = o.master_weights() ? o.master_correction_bits() : 0;
  });
  return bits;
}

// FusedOptimizer::group_options for Options: a copy of `defaults` with the
// fields of `own` that differ from a default-constructed Options.
template <typename Options>
std::unique_ptr<torch::optim::OptimizerOptions> merged_group_options(
    const torch::optim::OptimizerOptions& defaults,
    const torch::optim::OptimizerOptions& own) {
  const auto* typed = dynamic_cast<const Options*>(&own);
  TORCH_CHECK(typed != nullptr, "mixprec.optim.",
              options_table::class_name<Options>(),
              ": a param group has options of another optimizer");
  auto out = std::make_unique<Options>(static_cast<const Options&>(defaults));
  const Options fresh;
#define MIXPREC_MERGE_OPTION_(type, name, default_value, check, flags) \
  if (!(typed->name() == fresh.name())) out->name(typed->name());
  if constexpr (std::is_same_v<Options, AdamOptions>) {
    MIXPREC_ADAM_OPTIONS(MIXPREC_MERGE_OPTION_)
  } else if constexpr (std::is_same_v<Options, AdamWOptions>) {
    MIXPREC_ADAMW_OPTIONS(MIXPREC_MERGE_OPTION_)
  } else {
    static_assert(std::is_same_v<Options, SGDOptions>);
    MIXPREC_SGD_OPTIONS(MIXPREC_MERGE_OPTION_)
  }
#undef MIXPREC_MERGE_OPTION_
  return out;
}

at::Tensor zeros_f32_like(const at::Tensor& p) {
  return at::zeros_like(p, p.options().dtype(at::kFloat),
                        at::MemoryFormat::Preserve);
}

// A fresh 8-bit moment of p: the codes of zero (contiguous) and zero maxima.
std::pair<at::Tensor, at::Tensor> zero_codes(const at::Tensor& p, int table) {
  const auto opts = at::TensorOptions(p.device());
  return {at::full(p.sizes(), q8::zero_lo(table), opts.dtype(at::kByte)),
          at::zeros(absmax_sizes(p), opts.dtype(at::kFloat))};
}

}  // namespace

// ================================================================ base
bool FusedOptimizer::wants_master(
    const at::Tensor& p, const torch::optim::OptimizerParamGroup& group) const {
  return group_master_weights(group) && is_low_precision(p.scalar_type());
}

at::ScalarType FusedOptimizer::master_form(
    const at::Tensor& p, const torch::optim::OptimizerParamGroup& group) const {
  if (!wants_master(p, group)) return at::ScalarType::Undefined;
  const int64_t bits = correction_bits_of(group);
  return bits != 0 && p.scalar_type() == at::kBFloat16
             ? detail::correction_dtype(bits)
             : at::kFloat;
}

namespace {

// Gives a param state the master of `form` (float32, or an int16/int8
// correction), converting the one it holds, as the Python _complete_master:
// a float32 master becomes RNE_bf16(master), written into p, and its
// correction; a correction of the other width is re-encoded against p (p
// kept); float32 from a correction: decoded with p. No master yet: p's value.
template <class State>
void complete_master(State& s, const at::Tensor& p, at::ScalarType form) {
  at::NoGradGuard no_grad;
  const at::Tensor master = s.master_param(), c = s.master_correction();
  if (form == at::kFloat) {
    if (!master.defined()) {
      s.master_param(c.defined() ? decode_master(p, c)
                                 : p.detach().to(at::kFloat, false, true));
    }
    s.master_correction(at::Tensor());
    return;
  }
  if (!master.defined() && c.defined() && c.scalar_type() == form) return;
  if (!master.defined() && !c.defined()) {
    s.master_correction(
        at::zeros_like(p, p.options().dtype(form), at::MemoryFormat::Preserve));
  } else if (!master.defined()) {
    s.master_correction(detail::recode(p, c, form));
  } else {
    auto [param, correction] = detail::split_master(master, form);
    p.detach().copy_(param);  // what the next float32-master step writes
    s.master_correction(correction);
    s.master_param(at::Tensor());
  }
}

}  // namespace

template <class State>
State& FusedOptimizer::bucket_param(const at::Tensor& p,
                                    torch::optim::OptimizerParamGroup& group,
                                    Bucket& b) {
  auto& slot = state()[p.unsafeGetTensorImpl()];
  if (!slot) slot = std::make_unique<State>();
  auto& s = static_cast<State&>(*slot);
  if (!s.step().defined()) s.step(step_zero(p));
  const at::ScalarType form = master_form(p, group);
  if (form != at::ScalarType::Undefined) complete_master(s, p, form);
  b.params.push_back(p);
  b.grads.push_back(p.grad());
  b.state_steps.push_back(s.step());
  if (form == at::kFloat) b.master_params.push_back(s.master_param());
  if (form == at::kShort || form == at::kChar) {
    b.master_params.push_back(s.master_correction());
  }
  return s;
}

at::Tensor FusedOptimizer::lr_tensor(
    size_t index, const torch::optim::OptimizerParamGroup& group,
    c10::Device device) {
  const double value = group.options().get_lr();
  const auto key = std::make_pair(index, device.str());
  auto it = lr_cache_.find(key);
  if (it == lr_cache_.end()) {
    at::Tensor t =
        at::full({}, value, at::TensorOptions(device).dtype(at::kDouble));
    lr_cache_.emplace(key, std::make_pair(value, t));
    return t;
  }
  if (it->second.first != value) {
    it->second.second.fill_(value);  // no sync
    it->second.first = value;
  }
  return it->second.second;
}

at::Tensor FusedOptimizer::lr_tensor(size_t index, c10::Device device) {
  TORCH_CHECK(index < param_groups().size(), "mixprec.optim.", name(),
              ".lr_tensor: no param group ", index, " (", param_groups().size(),
              " groups)");
  return lr_tensor(index, param_groups()[index], device);
}

void FusedOptimizer::add_param_group(
    const torch::optim::OptimizerParamGroup& param_group) {
  count_change();
  torch::optim::Optimizer::add_param_group(param_group);
  try {
    if (param_group.has_options()) {
      param_groups_.back().set_options(group_options(param_group.options()));
    }
    check_param_groups();
  } catch (...) {
    param_groups_.pop_back();
    throw;
  }
}

std::vector<at::Tensor> FusedOptimizer::lr_tensors() {
  std::vector<at::Tensor> out;
  const auto& groups = param_groups();
  for (size_t index = 0; index < groups.size(); ++index) {
    std::vector<c10::Device> devices;
    for (const auto& p : groups[index].params()) {
      if (std::find(devices.begin(), devices.end(), p.device()) ==
          devices.end()) {
        devices.push_back(p.device());
      }
    }
    for (const auto& device : devices) {
      out.push_back(lr_tensor(index, groups[index], device));
    }
  }
  return out;
}

std::vector<at::Tensor> FusedOptimizer::master_params() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (const auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      at::Tensor master, correction;
      auto it = state().find(p.unsafeGetTensorImpl());
      if (it != state().end()) {
        if (auto* s = dynamic_cast<AdamParamState*>(it->second.get())) {
          master = s->master_param();
          correction = s->master_correction();
        } else if (auto* s2 = dynamic_cast<SGDParamState*>(it->second.get())) {
          master = s2->master_param();
          correction = s2->master_correction();
        }
      }
      if (!master.defined() && correction.defined()) {
        out.push_back(decode_master(p, correction));
      } else if (master.defined()) {
        out.push_back(master);
      } else if (wants_master(p, group)) {
        out.push_back(p.detach().to(at::kFloat));
      } else {
        out.push_back(p);
      }
    }
  }
  return out;
}

at::Tensor FusedOptimizer::step(LossClosure closure) {
  return step_with(StepScalars{}, std::move(closure));
}

at::Tensor FusedOptimizer::step_with(const StepScalars& scalars,
                                     LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  const std::pair<const char*, const std::optional<at::Tensor>*> named[] = {
      {"grad_scale", &scalars.grad_scale},
      {"found_inf", &scalars.found_inf},
      {"clip_coef", &scalars.clip_coef}};
  for (const auto& [n, t] : named) {
    if (t->has_value()) {
      const at::Tensor& v = **t;
      TORCH_CHECK(
          v.defined() && v.scalar_type() == at::kFloat && v.numel() == 1,
          "mixprec.optim.", name(), ".step: ", n,
          " must be a float32 tensor with one element, got ",
          v.defined() ? c10::toString(v.scalar_type()) : "undefined",
          v.defined() ? " of shape " + c10::str(v.sizes()) : std::string());
    }
  }
  // Checked before any state is created, so a rejected step changes nothing.
  for (size_t index = 0; index < param_groups().size(); ++index) {
    const auto& group = param_groups()[index];
    const int64_t bits = correction_bits_of(group);
    for (size_t k = 0; k < group.params().size(); ++k) {
      const at::Tensor& p = group.params()[k];
      if (!p.grad().defined()) continue;
      check_split_dtypes(name(), index, p, k, bits != 0, bits);
      TORCH_CHECK(!p.grad().is_sparse(), "mixprec.optim.", name(),
                  " does not support sparse gradients");
      TORCH_CHECK(is_supported(p.scalar_type()), "mixprec.optim.", name(),
                  ": params must be float32, float16 or bfloat16, got ",
                  p.scalar_type(), "; use torch::optim for other dtypes");
    }
  }
  auto& groups = param_groups();
  for (size_t index = 0; index < groups.size(); ++index) {
    auto& group = groups[index];
    // (device, master form, 8-bit) buckets in order of first appearance: one
    // master dtype per op call
    std::vector<std::pair<std::pair<c10::Device, at::ScalarType>, Bucket>>
        buckets;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::ScalarType master = master_form(p, group);
      const bool eight = coded(p, group);
      Bucket* b = nullptr;
      for (auto& [key, bucket] : buckets) {
        if (key.first == p.device() && key.second == master &&
            bucket.coded == eight) {
          b = &bucket;
          break;
        }
      }
      if (b == nullptr) {
        buckets.emplace_back(std::make_pair(p.device(), master), Bucket{});
        b = &buckets.back().second;
        b->coded = eight;
      }
      add_to_bucket(p, group, *b);
    }
    const uint64_t seed =
        (static_cast<uint64_t>(group_seed(group)) * 1000003ULL +
         static_cast<uint64_t>(index)) &
        0x7FFFFFFFFFFFFFFFULL;
    for (auto& [key, bucket] : buckets) {
      const c10::Device device = key.first;
      StepScalars on;
      const auto move = [&](const std::optional<at::Tensor>& t) {
        if (!t.has_value() || t->device() == device) return t;
        return std::optional<at::Tensor>(t->to(device, /*non_blocking=*/true));
      };
      on.grad_scale = move(scalars.grad_scale);
      on.found_inf = move(scalars.found_inf);
      on.clip_coef = move(scalars.clip_coef);
      run_bucket(bucket, group, lr_tensor(index, group, device), on,
                 static_cast<int64_t>(seed),
                 key.second != at::ScalarType::Undefined);
    }
  }
  return loss;
}

// ================================================================ Adam/AdamW
AdamOptions::AdamOptions(double lr) : lr_(lr) {}
AdamWOptions::AdamWOptions(double lr) : lr_(lr) {}

double AdamOptions::get_lr() const { return lr(); }
void AdamOptions::set_lr(const double lr) { this->lr(lr); }
double AdamWOptions::get_lr() const { return lr(); }
void AdamWOptions::set_lr(const double lr) { this->lr(lr); }

// The members of the Adam template and SGD that differ only in their option
// and state types.
namespace {

template <typename Opts>
bool any_group_master_weights(const torch::optim::Optimizer& opt) {
  for (const auto& g : opt.param_groups()) {
    if (static_cast<const Opts&>(g.options()).master_weights()) return true;
  }
  return false;
}

// Whether the decay is decoupled (AdamW's always is).
bool decoupled(const AdamOptions& o) { return o.decoupled_weight_decay(); }
bool decoupled(const AdamWOptions&) { return true; }

}  // namespace

template <typename Options>
AdamBase<Options>::AdamBase(
    const std::vector<torch::optim::OptimizerParamGroup>& groups,
    Options defaults)
    : FusedOptimizer(groups,
                     std::make_unique<Options>(check_options(defaults))) {
  // torch's constructor kept only the defaults for each group
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].has_options()) {
      param_groups_[i].set_options(group_options(groups[i].options()));
    }
  }
  check_groups<Options>(*this);
}

template <typename Options>
std::unique_ptr<torch::optim::OptimizerOptions>
AdamBase<Options>::group_options(
    const torch::optim::OptimizerOptions& own) const {
  return merged_group_options<Options>(defaults(), own);
}

template <typename Options>
const char* AdamBase<Options>::name() const {
  return options_table::class_name<Options>();
}

template <typename Options>
void AdamBase<Options>::check_param_groups() const {
  check_groups<Options>(*this);
}

template <typename Options>
bool AdamBase<Options>::master_weights() const {
  return any_group_master_weights<Options>(*this);
}

template <typename Options>
bool AdamBase<Options>::group_master_weights(
    const torch::optim::OptimizerParamGroup& group) const {
  return static_cast<const Options&>(group.options()).master_weights();
}

template <typename Options>
int64_t AdamBase<Options>::group_seed(
    const torch::optim::OptimizerParamGroup& group) const {
  return static_cast<const Options&>(group.options()).seed();
}

template <typename Options>
bool AdamBase<Options>::coded(
    const at::Tensor& p, const torch::optim::OptimizerParamGroup& group) const {
  const auto& o = static_cast<const Options&>(group.options());
  return o.state_bits() == 8 && p.dim() >= 2 && p.numel() >= o.min_8bit_size();
}

template <typename Options>
void AdamBase<Options>::add_to_bucket(const at::Tensor& p,
                                      torch::optim::OptimizerParamGroup& group,
                                      Bucket& b) {
  const auto& o = static_cast<const Options&>(group.options());
  auto& s = bucket_param<AdamParamState>(p, group, b);
  if (b.coded) {
    if (!s.exp_avg().defined()) {
      auto [m, ma] = zero_codes(p, q8::kSigned);
      auto [v, va] = zero_codes(p, q8::kUnsigned);
      s.exp_avg(m).exp_avg_absmax(ma).exp_avg_sq(v).exp_avg_sq_absmax(va);
    }
    b.buf0.push_back(s.exp_avg());
    b.buf1.push_back(s.exp_avg_sq());
    b.absmax0.push_back(s.exp_avg_absmax());
    b.absmax1.push_back(s.exp_avg_sq_absmax());
    return;
  }
  if (o.state_bits() == 8 && !s.exp_avg_absmax().defined()) {
    // (a small param of an 8-bit group: float32 moments, empty maxima)
    const auto f32 = at::TensorOptions(p.device()).dtype(at::kFloat);
    s.exp_avg_absmax(at::zeros({0}, f32))
        .exp_avg_sq_absmax(at::zeros({0}, f32));
  }
  if (!s.exp_avg().defined()) s.exp_avg(zeros_f32_like(p));
  if (!s.exp_avg_sq().defined()) s.exp_avg_sq(zeros_f32_like(p));
  if (o.amsgrad() && !s.max_exp_avg_sq().defined()) {
    s.max_exp_avg_sq(zeros_f32_like(p));
  }
  b.buf0.push_back(s.exp_avg());
  b.buf1.push_back(s.exp_avg_sq());
  if (o.amsgrad()) b.buf2.push_back(s.max_exp_avg_sq());
}

template <typename Options>
void AdamBase<Options>::run_bucket(Bucket& b,
                                   torch::optim::OptimizerParamGroup& group,
                                   const at::Tensor& lr, const StepScalars& sc,
                                   int64_t seed, bool has_masters) {
  const auto& o = static_cast<const Options&>(group.options());
  // the arguments named as in the schema (op_table.h), checked by
  // clang-tidy's bugprone-argument-comment
  if (b.coded) {
    mixprec::fused_adam8_(
        /*params=*/b.params, /*grads=*/b.grads, /*exp_avgs=*/b.buf0,
        /*exp_avg_absmax=*/b.absmax0, /*exp_avg_sqs=*/b.buf1,
        /*exp_avg_sq_absmax=*/b.absmax1, /*master_params=*/b.master_params,
        /*state_steps=*/b.state_steps, /*lr=*/lr,
        /*beta1=*/std::get<0>(o.betas()), /*beta2=*/std::get<1>(o.betas()),
        /*weight_decay=*/o.weight_decay(), /*eps=*/o.eps(),
        /*maximize=*/o.maximize(),
        /*decoupled_weight_decay=*/decoupled(o),
        /*grad_scale=*/sc.grad_scale, /*found_inf=*/sc.found_inf,
        /*clip_coef=*/sc.clip_coef,
        /*stochastic_rounding=*/o.stochastic_rounding() && !has_masters,
        /*seed=*/seed, /*sr_bases=*/std::nullopt);
    return;
  }
  mixprec::fused_adam_(
      /*params=*/b.params, /*grads=*/b.grads, /*exp_avgs=*/b.buf0,
      /*exp_avg_sqs=*/b.buf1, /*max_exp_avg_sqs=*/b.buf2,
      /*master_params=*/b.master_params, /*state_steps=*/b.state_steps,
      /*lr=*/lr, /*beta1=*/std::get<0>(o.betas()),
      /*beta2=*/std::get<1>(o.betas()), /*weight_decay=*/o.weight_decay(),
      /*eps=*/o.eps(), /*amsgrad=*/o.amsgrad(), /*maximize=*/o.maximize(),
      /*decoupled_weight_decay=*/decoupled(o),
      /*grad_scale=*/sc.grad_scale, /*found_inf=*/sc.found_inf,
      /*clip_coef=*/sc.clip_coef,
      /*stochastic_rounding=*/o.stochastic_rounding() && !has_masters,
      /*seed=*/seed, /*sr_bases=*/std::nullopt);
}

template class AdamBase<AdamOptions>;
template class AdamBase<AdamWOptions>;

// ================================================================ SGD
SGDOptions::SGDOptions(double lr) : lr_(lr) {}
double SGDOptions::get_lr() const { return lr(); }
void SGDOptions::set_lr(const double lr) { this->lr(lr); }

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups,
         SGDOptions defaults)
    : FusedOptimizer(groups,
                     std::make_unique<SGDOptions>(check_options(defaults))) {
  // torch's constructor kept only the defaults for each group
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].has_options()) {
      param_groups_[i].set_options(group_options(groups[i].options()));
    }
  }
  check_groups<SGDOptions>(*this);
}

std::unique_ptr<torch::optim::OptimizerOptions> SGD::group_options(
    const torch::optim::OptimizerOptions& own) const {
  return merged_group_options<SGDOptions>(defaults(), own);
}

void SGD::check_param_groups() const { check_groups<SGDOptions>(*this); }

bool SGD::master_weights() const {
  return any_group_master_weights<SGDOptions>(*this);
}

bool SGD::group_master_weights(
    const torch::optim::OptimizerParamGroup& group) const {
  return static_cast<const SGDOptions&>(group.options()).master_weights();
}

int64_t SGD::group_seed(const torch::optim::OptimizerParamGroup& group) const {
  return static_cast<const SGDOptions&>(group.options()).seed();
}

bool SGD::coded(const at::Tensor& p,
                const torch::optim::OptimizerParamGroup& group) const {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  return o.state_bits() == 8 && o.momentum() != 0 && p.dim() >= 2 &&
         p.numel() >= o.min_8bit_size();
}

void SGD::add_to_bucket(const at::Tensor& p,
                        torch::optim::OptimizerParamGroup& group, Bucket& b) {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  auto& s = bucket_param<SGDParamState>(p, group, b);
  if (b.coded) {
    if (!s.momentum_buffer().defined()) {
      auto [c, a] = zero_codes(p, q8::kSigned);
      s.momentum_buffer(c).momentum_buffer_absmax(a);
    }
    b.buf0.push_back(s.momentum_buffer());
    b.absmax0.push_back(s.momentum_buffer_absmax());
    return;
  }
  if (o.state_bits() == 8 && o.momentum() != 0 &&
      !s.momentum_buffer_absmax().defined()) {
    s.momentum_buffer_absmax(
        at::zeros({0}, at::TensorOptions(p.device()).dtype(at::kFloat)));
  }
  if (o.momentum() != 0 && !s.momentum_buffer().defined()) {
    s.momentum_buffer(zeros_f32_like(p));
  }
  if (o.momentum() != 0) b.buf0.push_back(s.momentum_buffer());
}

void SGD::run_bucket(Bucket& b, torch::optim::OptimizerParamGroup& group,
                     const at::Tensor& lr, const StepScalars& sc, int64_t seed,
                     bool has_masters) {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  if (b.coded) {
    mixprec::fused_sgd8_(
        /*params=*/b.params, /*grads=*/b.grads, /*momentum_buffers=*/b.buf0,
        /*momentum_absmax=*/b.absmax0, /*master_params=*/b.master_params,
        /*state_steps=*/b.state_steps, /*lr=*/lr,
        /*weight_decay=*/o.weight_decay(), /*momentum=*/o.momentum(),
        /*dampening=*/o.dampening(), /*nesterov=*/o.nesterov(),
        /*maximize=*/o.maximize(), /*grad_scale=*/sc.grad_scale,
        /*found_inf=*/sc.found_inf, /*clip_coef=*/sc.clip_coef,
        /*stochastic_rounding=*/o.stochastic_rounding() && !has_masters,
        /*seed=*/seed, /*sr_bases=*/std::nullopt);
    return;
  }
  mixprec::fused_sgd_(
      /*params=*/b.params, /*grads=*/b.grads, /*momentum_buffers=*/b.buf0,
      /*master_params=*/b.master_params, /*state_steps=*/b.state_steps,
      /*lr=*/lr, /*weight_decay=*/o.weight_decay(), /*momentum=*/o.momentum(),
      /*dampening=*/o.dampening(), /*nesterov=*/o.nesterov(),
      /*maximize=*/o.maximize(), /*grad_scale=*/sc.grad_scale,
      /*found_inf=*/sc.found_inf, /*clip_coef=*/sc.clip_coef,
      /*stochastic_rounding=*/o.stochastic_rounding() && !has_masters,
      /*seed=*/seed, /*sr_bases=*/std::nullopt);
}

}  // namespace mixprec::optim
