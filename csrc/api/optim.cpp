// mixprec::optim::{Adam, AdamW, SGD}: the C++ twins of mixprec.optim
// (python/mixprec/optim/). Same state layout, buckets, lr handling, seeds and
// checks as the Python FusedOptimizer, so that both run the same fused op
// calls on the same data and give the same results.
#include "mixprec/optim.h"

#include "mixprec/ops.h"

#include "common/quant8_math.h"
#include "options_table.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace mixprec::optim {

namespace {

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

// The checks of a param group's own options (added after construction).
template <typename Options>
void check_groups(const torch::optim::Optimizer& opt) {
  for (const auto& g : opt.param_groups()) {
    const auto* o = dynamic_cast<const Options*>(&g.options());
    TORCH_CHECK(o != nullptr, "mixprec.optim.",
                options_table::class_name<Options>(),
                ": a param group has options of another optimizer");
    check_options(*o);
  }
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

// ---- 8-bit state: the layout of python/mixprec/optim/_quant8.py and
// optim/_state8.py ("quant" names it): blocks inside rows (q8::RowBlocks),
// encoded and decoded with the kernels' element functions
// (common/quant8_math.h), so a converted checkpoint holds the codes a step
// would write.
constexpr const char* kQuant = "dynamic8/rows/b256";
// The previous layout: blocks of kBlock over the flattened tensor. Its maxima
// are 1-D, so a 1-D maxima of codes with two or more dims marks it (for fewer
// dims the two layouts are the same).
constexpr const char* kFlatQuant = "dynamic8/b256";

int64_t num_blocks(int64_t n) { return (n + q8::kBlock - 1) / q8::kBlock; }

std::vector<int64_t> absmax_sizes(const at::Tensor& t) {
  return q8::absmax_sizes<std::vector<int64_t>>(t.sizes().data(), t.dim());
}

// A fresh 8-bit moment of p: the codes of zero (contiguous) and zero maxima.
std::pair<at::Tensor, at::Tensor> zero_codes(const at::Tensor& p, int table) {
  const auto opts = at::TensorOptions(p.device());
  return {at::full(p.sizes(), q8::zero_lo(table), opts.dtype(at::kByte)),
          at::zeros(absmax_sizes(p), opts.dtype(at::kFloat))};
}

// The blocks of a tensor of these sizes: the row layout, or with `flat` the
// previous one (one row of all its elements).
q8::RowBlocks blocks_of(const at::Tensor& t, bool flat) {
  return q8::RowBlocks(flat ? t.numel()
                            : q8::row_length(t.sizes().data(), t.dim()));
}

// (codes, absmax) of x in the row layout: _quant8.quantize, block by block on
// the host with q8::encode (a checkpoint conversion, not a step).
std::pair<at::Tensor, at::Tensor> quantize8(const at::Tensor& x, int table) {
  const at::Tensor xc = x.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor codes = at::empty(x.sizes(), at::TensorOptions().dtype(at::kByte));
  at::Tensor absmax =
      at::empty(absmax_sizes(x), at::TensorOptions().dtype(at::kFloat));
  const int64_t n = x.numel();
  if (n > 0) {
    const q8::RowBlocks rb = blocks_of(x, false);
    const float* v = xc.data_ptr<float>();
    uint8_t* c = codes.data_ptr<uint8_t>();
    float* a = absmax.data_ptr<float>();
    for (int64_t k = 0, e = 0; e < n; ++k) {
      const int64_t len = rb.length(k);
      float m = 0.0f;
      for (int64_t j = 0; j < len; ++j) m = q8::abs_max(m, v[e + j]);
      for (int64_t j = 0; j < len; ++j)
        c[e + j] = q8::encode(v[e + j], m, table);
      a[k] = m;
      e += len;
    }
  }
  return {codes.to(x.device()), absmax.to(x.device())};
}

// The float32 values of codes with per-block maxima (_quant8.dequantize; with
// `flat`, the previous layout's).
at::Tensor dequantize8(const at::Tensor& codes, const at::Tensor& absmax,
                       int table, bool flat = false) {
  const at::Tensor cc = codes.to(at::kCPU).contiguous();
  const at::Tensor ac = absmax.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor out =
      at::empty(codes.sizes(), at::TensorOptions().dtype(at::kFloat));
  const int64_t n = codes.numel();
  if (n > 0) {
    const q8::RowBlocks rb = blocks_of(codes, flat);
    const uint8_t* c = cc.data_ptr<uint8_t>();
    const float* a = ac.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t k = 0, e = 0; e < n; ++k) {
      const int64_t len = rb.length(k);
      for (int64_t j = 0; j < len; ++j)
        o[e + j] = q8::decode(c[e + j], a[k], table);
      e += len;
    }
  }
  return out.to(codes.device());
}

// A loaded moment (and its maxima) in the layout the group wants now: read
// back when saved as codes, then quantized when `coded` (as the Python
// _convert_state does); a 32-bit moment in an 8-bit group keeps empty maxima.
void convert_moment(at::Tensor& m, at::Tensor& absmax, int table, bool coded,
                    bool eight_bit_group, const at::Tensor& p) {
  if (!m.defined()) return;
  if (m.scalar_type() == at::kByte) {
    const bool flat = m.dim() >= 2 && absmax.dim() == 1;  // (kFlatQuant)
    m = dequantize8(m, absmax, table, flat);
  }
  if (coded) {
    std::tie(m, absmax) = quantize8(m, table);
  } else {
    m = m.to(at::kFloat);
    absmax =
        eight_bit_group
            ? at::zeros({0}, at::TensorOptions(p.device()).dtype(at::kFloat))
            : at::Tensor();
  }
}

at::Tensor step_zero(const at::Tensor& p) {
  return at::zeros({}, at::TensorOptions(p.device()).dtype(at::kFloat));
}

// A loaded state tensor, as the Python _convert_state does: on the param's
// device, float32 when floating; steps become float32 0-dim.
at::Tensor to_param(const at::Tensor& t, const at::Tensor& p, bool is_step) {
  if (!t.defined()) return t;
  if (is_step) {
    return t.detach().to(p.device(), at::kFloat, false, true).reshape({});
  }
  const auto dtype = t.is_floating_point() ? at::kFloat : t.scalar_type();
  return t.detach().to(p.device(), dtype, false, true);
}

// ---- the options in a torch::save archive (torch::optim's
// _TORCH_OPTIM_SERIALIZE_TORCH_ARG layout: one entry per option, by name).
template <typename Options>
void write_options(const Options& o, torch::serialize::OutputArchive& archive) {
  options_table::for_each_option(
      o, [&](const char* name, const auto& value, unsigned, auto) {
        archive.write(name, c10::IValue(value));
      });
}

// torch.optim's options must be there; mixprec's keep their defaults where
// absent (an archive written before the option existed).
template <typename Options>
void read_options(Options& o, torch::serialize::InputArchive& archive) {
  options_table::for_each_option(
      o, [&](const char* name, auto& value, unsigned flags, auto) {
        c10::IValue v;
        if (archive.try_read(name, v)) {
          value = v.to<std::decay_t<decltype(value)>>();
        } else {
          TORCH_CHECK(!(flags & options_flag::kTorch), "mixprec.optim.",
                      options_table::class_name<Options>(),
                      ": the archive has no option '", name, "'");
        }
      });
}

// A param state in an archive: its defined tensors, by name.
template <typename State>
void write_state(const State& s, torch::serialize::OutputArchive& archive) {
  options_table::for_each_state(s, [&](const char* name, const at::Tensor& t) {
    if (t.defined()) archive.write(name, t);
  });
}

template <typename State>
void read_state(State& s, torch::serialize::InputArchive& archive) {
  options_table::for_each_state(s, [&](const char* name, at::Tensor& t) {
    c10::IValue v;
    if (archive.try_read(name, v)) t = v.toTensor();
  });
}

}  // namespace

// ================================================================ base
bool FusedOptimizer::wants_master(
    const at::Tensor& p, const torch::optim::OptimizerParamGroup& group) const {
  return group_master_weights(group) && is_low_precision(p.scalar_type());
}

template <class State>
State& FusedOptimizer::bucket_param(const at::Tensor& p,
                                    torch::optim::OptimizerParamGroup& group,
                                    Bucket& b) {
  auto& slot = state()[p.unsafeGetTensorImpl()];
  if (!slot) slot = std::make_unique<State>();
  auto& s = static_cast<State&>(*slot);
  if (!s.step().defined()) s.step(step_zero(p));
  const bool master = wants_master(p, group);
  if (master && !s.master_param().defined()) {
    s.master_param(p.detach().to(at::kFloat, false, true));
  }
  b.params.push_back(p);
  b.grads.push_back(p.grad());
  b.state_steps.push_back(s.step());
  if (master) b.master_params.push_back(s.master_param());
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
      at::Tensor master;
      auto it = state().find(p.unsafeGetTensorImpl());
      if (it != state().end()) {
        if (auto* s = dynamic_cast<AdamParamState*>(it->second.get())) {
          master = s->master_param();
        } else if (auto* s2 = dynamic_cast<SGDParamState*>(it->second.get())) {
          master = s2->master_param();
        }
      }
      if (master.defined()) {
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
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
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
    // (device, has masters, 8-bit) buckets in order of first appearance
    std::vector<std::pair<std::pair<c10::Device, bool>, Bucket>> buckets;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const bool master = wants_master(p, group);
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
                 static_cast<int64_t>(seed), key.second);
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

void AdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  write_options(*this, archive);
}
void AdamOptions::serialize(torch::serialize::InputArchive& archive) {
  read_options(*this, archive);
}
void AdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  write_options(*this, archive);
}
void AdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  read_options(*this, archive);
}

void AdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  write_state(*this, archive);
}
void AdamParamState::serialize(torch::serialize::InputArchive& archive) {
  read_state(*this, archive);
}

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
void AdamBase<Options>::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamParamState, Options>(archive, *this);
}

template <typename Options>
void AdamBase<Options>::load(torch::serialize::InputArchive& archive) {
  count_change();
  torch::optim::serialize<AdamParamState, Options>(archive, *this);
  fix_loaded_state();
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

namespace {

int64_t state_bits_of(const torch::optim::OptimizerParamGroup& group) {
  int64_t bits = 32;
  options_table::visit(group.options(),
                       [&](const auto& o) { bits = o.state_bits(); });
  return bits;
}

}  // namespace

void FusedOptimizer::fix_loaded_state() {
  // (lr_cache_ is kept: lr_tensor() refills a tensor whose group's lr the
  // load changed, and a captured graph reads these tensors)
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      auto it = state().find(p.unsafeGetTensorImpl());
      if (it == state().end()) continue;
      if (auto* s = dynamic_cast<AdamParamState*>(it->second.get())) {
        s->step(s->step().defined() ? to_param(s->step(), p, true)
                                    : step_zero(p));
        s->exp_avg(to_param(s->exp_avg(), p, false));
        s->exp_avg_sq(to_param(s->exp_avg_sq(), p, false));
        s->max_exp_avg_sq(to_param(s->max_exp_avg_sq(), p, false));
        s->master_param(to_param(s->master_param(), p, false));
        if (wants_master(p, group) && !s->master_param().defined()) {
          s->master_param(p.detach().to(at::kFloat, false, true));
        }
        // the moments in the layout of this group's state_bits
        const bool eight = state_bits_of(group) == 8;
        const bool c = coded(p, group);
        at::Tensor m = s->exp_avg(), ma = s->exp_avg_absmax();
        at::Tensor v = s->exp_avg_sq(), va = s->exp_avg_sq_absmax();
        convert_moment(m, ma, q8::kSigned, c, eight, p);
        convert_moment(v, va, q8::kUnsigned, c, eight, p);
        s->exp_avg(m).exp_avg_absmax(ma).exp_avg_sq(v).exp_avg_sq_absmax(va);
      } else if (auto* s2 = dynamic_cast<SGDParamState*>(it->second.get())) {
        if (s2->step().defined()) {
          s2->step(to_param(s2->step(), p, true));
        } else {
          // no step saved: a stored buffer means steps were taken
          const double taken = s2->momentum_buffer().defined() ? 1.0 : 0.0;
          s2->step(at::full({}, taken,
                            at::TensorOptions(p.device()).dtype(at::kFloat)));
        }
        s2->momentum_buffer(to_param(s2->momentum_buffer(), p, false));
        s2->master_param(to_param(s2->master_param(), p, false));
        if (wants_master(p, group) && !s2->master_param().defined()) {
          s2->master_param(p.detach().to(at::kFloat, false, true));
        }
        const auto& so = static_cast<const SGDOptions&>(group.options());
        at::Tensor b = s2->momentum_buffer(), ba = s2->momentum_buffer_absmax();
        convert_moment(b, ba, q8::kSigned, coded(p, group),
                       so.state_bits() == 8 && so.momentum() != 0, p);
        s2->momentum_buffer(b).momentum_buffer_absmax(ba);
      }
    }
  }
}

// ================================================================ state dicts
namespace {

c10::impl::GenericDict any_dict(c10::TypePtr key) {
  return c10::impl::GenericDict(std::move(key), c10::AnyType::get());
}

// ---- a param group's options as the Python class's state_dict() group:
// torch.optim's entries (the rows flagged kTorch, then torch's fixed ones),
// then mixprec's; keys are the options' names.

c10::IValue group_value(double v) { return v; }
c10::IValue group_value(bool v) { return v; }
c10::IValue group_value(int64_t v) { return v; }
c10::IValue group_value(const std::tuple<double, double>& v) {
  return c10::ivalue::Tuple::create(std::get<0>(v), std::get<1>(v));
}

// torch.optim's entries that are no option here (their values in a fused
// mixprec optimizer), in the Python class's order.
template <typename O>
void torch_fixed_to(c10::impl::GenericDict& g) {
  if constexpr (std::is_same_v<O, SGDOptions>) {
    g.insert("foreach", c10::IValue());
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
    g.insert("capturable", false);
  } else {
    g.insert("foreach", c10::IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
  }
  // (AdamW's decay is always decoupled: Python's AdamW has the key)
  if constexpr (std::is_same_v<O, AdamWOptions>) {
    g.insert("decoupled_weight_decay", true);
  }
}

template <typename O>
void group_to(const O& o, c10::impl::GenericDict& g) {
  const auto insert = [&](bool torch_part) {
    options_table::for_each_option(
        o, [&](const char* name, const auto& value, unsigned flags, auto) {
          if (static_cast<bool>(flags & options_flag::kTorch) == torch_part) {
            g.insert(name, group_value(value));
          }
        });
  };
  insert(true);
  torch_fixed_to<O>(g);
  insert(false);
}

double num(const c10::impl::GenericDict& g, const char* key, double dflt) {
  auto it = g.find(key);
  if (it == g.end() || it->value().isNone()) return dflt;
  TORCH_CHECK(
      it->value().isDouble() || it->value().isInt() || it->value().isBool(),
      "load_state_dict: param group entry '", key, "' must be a number, got ",
      it->value().tagKind());
  return it->value().toScalar().toDouble();
}

bool flag(const c10::impl::GenericDict& g, const char* key, bool dflt) {
  auto it = g.find(key);
  if (it == g.end() || it->value().isNone()) return dflt;
  return it->value().toScalar().toBool();
}

void group_value_from(const c10::impl::GenericDict& g, const char* key,
                      double& v) {
  v = num(g, key, v);
}
void group_value_from(const c10::impl::GenericDict& g, const char* key,
                      bool& v) {
  v = flag(g, key, v);
}
void group_value_from(const c10::impl::GenericDict& g, const char* key,
                      int64_t& v) {
  v = static_cast<int64_t>(num(g, key, static_cast<double>(v)));
}
// (a tuple or a list of two numbers)
void group_value_from(const c10::impl::GenericDict& g, const char* key,
                      std::tuple<double, double>& v) {
  auto it = g.find(key);
  if (it == g.end()) return;
  const c10::IValue& b = it->value();
  std::vector<c10::IValue> elems;
  if (b.isTuple()) {
    for (const auto& e : b.toTupleRef().elements()) elems.push_back(e);
  } else if (b.isList()) {
    for (const auto& e : b.toListRef()) elems.push_back(e);
  }
  TORCH_CHECK(elems.size() == 2, "load_state_dict: ", key,
              " must have two values");
  v = std::make_tuple(elems[0].toScalar().toDouble(),
                      elems[1].toScalar().toDouble());
}

// The options of a saved group (group_to's); an absent entry keeps the
// option's value, and those flagged kKept are not read.
template <typename O>
void group_from(const c10::impl::GenericDict& g, O& o) {
  options_table::for_each_option(
      o, [&](const char* name, auto& value, unsigned flags, auto) {
        if (!(flags & options_flag::kKept)) group_value_from(g, name, value);
      });
}

at::Tensor state_tensor(const c10::impl::GenericDict& s, const char* key) {
  auto it = s.find(key);
  if (it == s.end() || it->value().isNone()) return at::Tensor();
  if (it->value().isTensor()) return it->value().toTensor();
  // torch.optim keeps some steps as Python numbers
  TORCH_CHECK(it->value().isDouble() || it->value().isInt(),
              "load_state_dict: state entry '", key, "' must be a tensor, got ",
              it->value().tagKind());
  return at::scalar_tensor(it->value().toScalar(), at::kDouble);
}

// The checks of one saved param state's 8-bit entries (codes: uint8 of the
// param's shape; maxima: float32 of the shape of the layout "quant" names);
// c10::Error naming the entry otherwise.
void check_coded(const char* cls, const c10::IValue& key,
                 const c10::impl::GenericDict& ps, const at::Tensor& p) {
  static const std::pair<const char*, const char*> kMoments[] = {
      {"exp_avg", "exp_avg_absmax"},
      {"exp_avg_sq", "exp_avg_sq_absmax"},
      {"momentum_buffer", "momentum_buffer_absmax"}};
  const std::string where =
      c10::str("mixprec.optim.", cls, ".load_state_dict: state[", key, "]");
  bool any = false;
  for (const auto& [codes_name, absmax_name] : kMoments) {
    const at::Tensor c = state_tensor(ps, codes_name);
    if (c.defined() && c.scalar_type() == at::kByte) any = true;
  }
  if (!any) return;
  auto q = ps.find("quant");
  const std::string layout = q != ps.end() && q->value().isString()
                                 ? q->value().toStringRef()
                                 : std::string("(none)");
  TORCH_CHECK_VALUE(layout == kQuant || layout == kFlatQuant, where,
                    ": unknown 8-bit layout '", layout,
                    "' (this version reads '", kQuant, "' and '", kFlatQuant,
                    "')");
  for (const auto& [codes_name, absmax_name] : kMoments) {
    const at::Tensor c = state_tensor(ps, codes_name);
    if (!c.defined() || c.scalar_type() != at::kByte) continue;
    TORCH_CHECK_VALUE(c.sizes() == p.sizes(), where, "['", codes_name,
                      "']: expected uint8 codes of shape ", p.sizes(),
                      ", got shape ", c.sizes());
    const at::Tensor a = state_tensor(ps, absmax_name);
    const std::vector<int64_t> want =
        layout == kQuant ? absmax_sizes(p)
                         : std::vector<int64_t>{num_blocks(p.numel())};
    TORCH_CHECK_VALUE(
        a.defined() && a.scalar_type() == at::kFloat &&
            a.sizes() == at::IntArrayRef(want),
        where, "['", absmax_name, "']: expected float32 of shape ",
        at::IntArrayRef(want), " ('", layout, "' layout), got ",
        a.defined() ? c10::str(a.scalar_type(), " of shape ", a.sizes())
                    : std::string("nothing"));
  }
}

}  // namespace

c10::impl::GenericDict FusedOptimizer::state_dict() const {
  c10::impl::GenericDict state = any_dict(c10::IntType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : param_groups()) {
    c10::impl::GenericDict g = any_dict(c10::StringType::get());
    options_table::visit(group.options(),
                         [&](const auto& o) { group_to(o, g); });
    c10::List<int64_t> ids;
    for (const auto& p : group.params()) {
      auto it = this->state().find(p.unsafeGetTensorImpl());
      if (it != this->state().end()) {
        c10::impl::GenericDict ps = any_dict(c10::StringType::get());
        bool codes = false;
        options_table::visit_state(*it->second, [&](const auto& s) {
          options_table::for_each_state(
              s, [&](const char* k, const at::Tensor& t) {
                if (!t.defined()) return;
                ps.insert(k, t);
                codes = codes || t.scalar_type() == at::kByte;
              });
        });
        if (codes) ps.insert("quant", std::string(kQuant));  // their layout
        state.insert(index, ps);
      }
      ids.push_back(index++);
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  c10::impl::GenericDict out = any_dict(c10::StringType::get());
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void FusedOptimizer::load_state_dict(const c10::impl::GenericDict& sd) {
  auto st = sd.find("state");
  auto pg = sd.find("param_groups");
  TORCH_CHECK(st != sd.end() && pg != sd.end() && st->value().isGenericDict() &&
                  pg->value().isList(),
              "load_state_dict: expected a dict with 'state' (dict) and "
              "'param_groups' (list)");
  const auto saved_groups = pg->value().toListRef();
  auto& groups = param_groups();
  TORCH_CHECK(saved_groups.size() == groups.size(),
              "loaded state dict has a different number of parameter groups");
  // Check everything first: a rejected load changes nothing.
  for (size_t i = 0; i < groups.size(); ++i) {
    TORCH_CHECK(saved_groups[i].isGenericDict(),
                "load_state_dict: a param group is not a dict");
    const auto g = saved_groups[i].toGenericDict();
    auto ids = g.find("params");
    TORCH_CHECK(
        ids != g.end() && ids->value().isList() &&
            ids->value().toListRef().size() == groups[i].params().size(),
        "loaded state dict contains a parameter group that doesn't match the "
        "size of "
        "optimizer's group");
  }
  const auto saved_state = st->value().toGenericDict();
  // Every 8-bit entry is checked before anything is loaded (as the Python
  // _check_loadable of optim/_state8.py): its layout name, the codes' shape and
  // the maxima's.
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto ids =
        saved_groups[i].toGenericDict().find("params")->value().toListRef();
    for (size_t j = 0; j < ids.size(); ++j) {
      auto found = saved_state.find(ids[j]);
      if (found == saved_state.end() || !found->value().isGenericDict()) {
        continue;
      }
      check_coded(name(), ids[j], found->value().toGenericDict(),
                  groups[i].params()[j]);
    }
  }
  count_change();
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto g = saved_groups[i].toGenericDict();
    auto& opts = groups[i].options();
    options_table::visit(opts, [&](auto& o) { group_from(g, o); });
    const auto ids = g.find("params")->value().toListRef();
    for (size_t j = 0; j < ids.size(); ++j) {
      const at::Tensor& p = groups[i].params()[j];
      auto found = saved_state.find(ids[j]);
      if (found == saved_state.end()) continue;
      TORCH_CHECK(found->value().isGenericDict(),
                  "load_state_dict: a param state is not a dict");
      const auto ps = found->value().toGenericDict();
      std::unique_ptr<torch::optim::OptimizerParamState> fresh;
      if (dynamic_cast<const SGDOptions*>(&opts) != nullptr) {
        fresh = std::make_unique<SGDParamState>();
      } else {
        fresh = std::make_unique<AdamParamState>();
      }
      options_table::visit_state(*fresh, [&](auto& s) {
        options_table::for_each_state(
            s, [&](const char* k, at::Tensor& t) { t = state_tensor(ps, k); });
      });
      state()[p.unsafeGetTensorImpl()] = std::move(fresh);
    }
  }
  fix_loaded_state();  // copies onto the params' devices, float32
}

// ================================================================ SGD
SGDOptions::SGDOptions(double lr) : lr_(lr) {}
double SGDOptions::get_lr() const { return lr(); }
void SGDOptions::set_lr(const double lr) { this->lr(lr); }

void SGDOptions::serialize(torch::serialize::OutputArchive& archive) const {
  write_options(*this, archive);
}
void SGDOptions::serialize(torch::serialize::InputArchive& archive) {
  read_options(*this, archive);
}

void SGDParamState::serialize(torch::serialize::OutputArchive& archive) const {
  write_state(*this, archive);
}
void SGDParamState::serialize(torch::serialize::InputArchive& archive) {
  read_state(*this, archive);
}

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

void SGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
}

void SGD::load(torch::serialize::InputArchive& archive) {
  count_change();
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
  fix_loaded_state();
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
