// mixprec::GradScaler: the Python class mixprec.GradScaler (python/mixprec/amp/
// grad_scaler.py, built on torch.amp.GradScaler) for LibTorch programs. The
// structure, state machine and messages follow the Python code method by
// method; the comments name the Python method each part mirrors.
#include "mixprec/grad_scaler.h"

#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/serialize.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace mixprec {

namespace {

constexpr double kTorchInitScale = 65536.0;
constexpr int64_t kTorchGrowthInterval = 2000;

std::string repr_double(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The checks of resolve_options() in python/mixprec/amp/policies.py.
void check_extras(const GradScalerOptions& o) {
  TORCH_CHECK_VALUE(o.hysteresis() >= 1,
                    "mixprec.GradScaler: hysteresis must be an int >= 1, got ",
                    o.hysteresis());
  const std::pair<const char*, std::optional<double>> bounds[] = {
      {"min_scale", o.min_scale()}, {"max_scale", o.max_scale()}};
  for (const auto& [name, value] : bounds) {
    TORCH_CHECK_VALUE(!value || (*value > 0.0 && std::isfinite(*value)),
                      "mixprec.GradScaler: ", name,
                      " must be finite and > 0, got ",
                      value ? repr_double(*value) : std::string("None"));
  }
  if (o.min_scale() && o.max_scale()) {
    TORCH_CHECK_VALUE(
        *o.min_scale() <= *o.max_scale(), "mixprec.GradScaler: min_scale (",
        repr_double(*o.min_scale()), ") must not exceed max_scale (",
        repr_double(*o.max_scale()), ")");
  }
}

double ivalue_to_double(const c10::IValue& v, const char* key) {
  TORCH_CHECK(v.isDouble() || v.isInt() || v.isBool(),
              "GradScaler.load_state_dict: '", key, "' must be a number, got ",
              v.tagKind());
  return v.toScalar().toDouble();
}

int64_t ivalue_to_int(const c10::IValue& v, const char* key) {
  TORCH_CHECK(v.isInt() || v.isBool(), "GradScaler.load_state_dict: '", key,
              "' must be an int, got ", v.tagKind());
  return v.toScalar().toLong();
}

const c10::IValue& required(const c10::Dict<std::string, c10::IValue>& d,
                            const char* key) {
  auto it = d.find(key);
  TORCH_CHECK(it != d.end(), "GradScaler.load_state_dict: missing key '", key,
              "'");
  return it->value();
}

// c10::Dict<std::string, IValue> has no default constructor: made from a
// generic dict with those element types.
c10::Dict<std::string, c10::IValue> make_state_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

}  // namespace

// ---------------------------------------------------------------- options
GradScalerOptions GradScalerOptions::policy(const std::string& name) {
  GradScalerOptions o;
  if (name == "torch") {
    return o;
  }
  if (name == "deepspeed") {
    return o.init_scale(65536.0).growth_interval(1000).hysteresis(2).min_scale(
        1.0);
  }
  if (name == "megatron") {
    return o.init_scale(4294967296.0)
        .growth_interval(1000)
        .hysteresis(2)
        .min_scale(1.0);
  }
  TORCH_CHECK_VALUE(false,
                    "mixprec.GradScaler: policy must be one of ['deepspeed', "
                    "'megatron', 'torch'], got '",
                    name, "'");
}

// ---------------------------------------------------------------- __init__
GradScaler::GradScaler(c10::DeviceType device, GradScalerOptions options)
    : device_type_(device),
      enabled_(options.enabled()),
      init_scale_(options.init_scale()),
      growth_factor_(options.growth_factor()),
      backoff_factor_(options.backoff_factor()),
      growth_interval_(options.growth_interval()),
      min_scale_(options.min_scale()),
      max_scale_(options.max_scale()),
      hysteresis_(options.hysteresis()),
      init_hysteresis_left_(options.hysteresis()),
      allow_fp16_grads_(options.allow_fp16_grads()) {
  check_extras(options);
  if (device_type_ == c10::DeviceType::CUDA && enabled_ &&
      !torch::cuda::is_available()) {
    TORCH_WARN(
        "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  "
        "Disabling.");
    enabled_ = false;
  }
  if (enabled_) {
    TORCH_CHECK(growth_factor_ > 1.0, "The growth factor must be > 1.0.");
    TORCH_CHECK(backoff_factor_ < 1.0, "The backoff factor must be < 1.0.");
  }
}

// ---------------------------------------------------------------- lazy state
std::pair<at::Tensor, at::Tensor> GradScaler::check_scale_growth_tracker(
    const char* funcname) const {
  const char* fix =
      "This may indicate your script did not use scaler.scale(loss or "
      "outputs) earlier in the iteration.";
  TORCH_CHECK(scale_.defined(), "Attempted ", funcname,
              " but _scale is None.  ", fix);
  TORCH_CHECK(growth_tracker_.defined(), "Attempted ", funcname,
              " but _growth_tracker is None.  ", fix);
  return {scale_, growth_tracker_};
}

bool GradScaler::uses_ext_rule() const {
  return hysteresis_ != 1 || min_scale_.has_value() || max_scale_.has_value();
}

void GradScaler::lazy_init_scale_growth_tracker(c10::Device device) {
  TORCH_CHECK(!growth_tracker_.defined(),
              "_growth_tracker initialized before _scale");
  scale_ =
      at::full({}, init_scale_, at::TensorOptions(device).dtype(at::kFloat));
  growth_tracker_ = at::full({}, init_growth_tracker_,
                             at::TensorOptions(device).dtype(at::kInt));
  if (uses_ext_rule()) {
    hysteresis_left_ = at::full({}, init_hysteresis_left_,
                                at::TensorOptions(device).dtype(at::kInt));
  }
}

int64_t GradScaler::get_hysteresis_left() const {
  if (!hysteresis_left_.defined()) {
    return init_hysteresis_left_;
  }
  return hysteresis_left_.item<int64_t>();
}

int64_t GradScaler::get_growth_tracker() const {
  if (!enabled_) {
    return 0;
  }
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>()
                                   : init_growth_tracker_;
}

// ---------------------------------------------------------------- scale
at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!enabled_) {
    return outputs;
  }
  TORCH_CHECK_VALUE(outputs.defined(),
                    "outputs must be a Tensor or an iterable of Tensors");
  if (!scale_.defined()) {
    lazy_init_scale_growth_tracker(outputs.device());
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(
    const std::vector<at::Tensor>& outputs) {
  if (!enabled_) {
    return outputs;
  }
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  // _MultiDeviceReplicator: one copy of the scale per device.
  std::vector<std::pair<c10::Device, at::Tensor>> copies;
  for (const auto& t : outputs) {
    TORCH_CHECK_VALUE(t.defined(),
                      "outputs must be a Tensor or an iterable of Tensors");
    if (!scale_.defined()) {
      lazy_init_scale_growth_tracker(t.device());
    }
    at::Tensor s;
    for (const auto& [dev, copy] : copies) {
      if (dev == t.device()) s = copy;
    }
    if (!s.defined()) {
      s = scale_.to(t.device(), /*non_blocking=*/true);
      copies.emplace_back(t.device(), s);
    }
    out.push_back(t * s);
  }
  return out;
}

// ---------------------------------------------------------------- gradients
GradScaler::PerOptimizerState& GradScaler::state_of(
    const torch::optim::Optimizer& optimizer) {
  const void* key = &optimizer;
  for (auto& [k, s] : per_optimizer_) {
    if (k == key) return s;
  }
  per_optimizer_.emplace_back(key, PerOptimizerState{});
  return per_optimizer_.back().second;
}

OptState GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  for (const auto& [k, s] : per_optimizer_) {
    if (k == &optimizer) return s.stage;
  }
  return OptState::READY;
}

bool GradScaler::fp16_grads_allowed(
    const torch::optim::Optimizer& optimizer) const {
  if (allow_fp16_grads_.has_value()) {
    return *allow_fp16_grads_;
  }
  const auto* fused = dynamic_cast<const optim::FusedOptimizer*>(&optimizer);
  return fused != nullptr && fused->master_weights();
}

std::vector<std::pair<c10::Device, std::vector<at::Tensor>>>
GradScaler::collect_grads(torch::optim::Optimizer& optimizer, bool allow_fp16,
                          bool coalesce_sparse) const {
  allow_fp16 = allow_fp16 || fp16_grads_allowed(optimizer);
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> per_device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      at::Tensor grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      TORCH_CHECK_VALUE(allow_fp16 || grad.scalar_type() != at::kHalf,
                        "Attempting to unscale FP16 gradients.");
      if (grad.is_sparse()) {
        if (coalesce_sparse || grad.scalar_type() == at::kHalf) {
          grad = grad.coalesce();
          param.mutable_grad() = grad;
        }
        grad = grad._values();
      }
      bool placed = false;
      for (auto& [dev, grads] : per_device) {
        if (dev == grad.device()) {
          grads.push_back(grad);
          placed = true;
          break;
        }
      }
      if (!placed) {
        per_device.emplace_back(grad.device(), std::vector<at::Tensor>{grad});
      }
    }
  }
  return per_device;
}

// _unscale_grads_: one unscale_and_check_ per device; the caller's found_inf
// is used for the grads on its own device, copies elsewhere.
std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(
    torch::optim::Optimizer& optimizer, const at::Tensor& inv_scale,
    const at::Tensor& found_inf, bool allow_fp16) {
  auto per_device = collect_grads(optimizer, allow_fp16);
  const c10::Device home = found_inf.device();
  at::NoGradGuard no_grad;
  std::vector<std::pair<c10::Device, std::pair<at::Tensor, at::Tensor>>>
      targets;
  for (const auto& [dev, grads] : per_device) {
    if (dev == home) {
      targets.emplace_back(dev, std::make_pair(found_inf, inv_scale));
    } else {
      targets.emplace_back(
          dev, std::make_pair(found_inf.to(dev, true, /*copy=*/true),
                              inv_scale.to(dev, true, /*copy=*/true)));
    }
  }
  std::vector<std::pair<c10::Device, at::Tensor>> flags;
  for (size_t i = 0; i < per_device.size(); ++i) {
    const auto& [flag, inv] = targets[i].second;
    mixprec::unscale_and_check_(per_device[i].second, flag, inv);
    flags.emplace_back(per_device[i].first, flag);
  }
  return flags;
}

at::Tensor GradScaler::inv_scale() const {
  // 1/scale in float64, rounded to float32, as torch does.
  return scale_.to(at::kDouble).reciprocal().to(at::kFloat);
}

GradScaler::PerOptimizerState& GradScaler::check_unscalable(
    torch::optim::Optimizer& optimizer, const char* what) {
  auto& state = state_of(optimizer);
  TORCH_CHECK(state.stage != OptState::UNSCALED, what,
              "() has already been called on this optimizer since the last "
              "update().");
  TORCH_CHECK(state.stage != OptState::STEPPED, what,
              "() is being called after step().");
  return state;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!enabled_) {
    return;
  }
  check_scale_growth_tracker("unscale_");
  auto& state = check_unscalable(optimizer, "unscale_");
  at::Tensor found_inf =
      at::zeros({}, at::TensorOptions(scale_.device()).dtype(at::kFloat));
  state.found_inf_per_device =
      unscale_grads(optimizer, inv_scale(), found_inf, false);
  state.stage = OptState::UNSCALED;
}

// _check_inf_per_device: read-only check (check_finite_) for optimizers that
// unscale inside their own step.
void GradScaler::check_inf_per_device(torch::optim::Optimizer& optimizer) {
  check_scale_growth_tracker("_check_inf_per_device");
  auto per_device = collect_grads(optimizer, true);
  std::vector<std::pair<c10::Device, at::Tensor>> flags;
  at::NoGradGuard no_grad;
  for (const auto& [dev, grads] : per_device) {
    at::Tensor flag = at::zeros({}, at::TensorOptions(dev).dtype(at::kFloat));
    mixprec::check_finite_(grads, flag);
    flags.emplace_back(dev, flag);
  }
  state_of(optimizer).found_inf_per_device = std::move(flags);
}

// ---------------------------------------------------------------- step
bool GradScaler::step(torch::optim::Optimizer& optimizer,
                      torch::optim::Optimizer::LossClosure closure) {
  if (!enabled_) {
    optimizer.step(std::move(closure));
    return true;
  }
  TORCH_CHECK(!closure,
              "Closure use is not currently supported if GradScaler is "
              "enabled.");
  check_scale_growth_tracker("step");
  auto& state = state_of(optimizer);
  TORCH_CHECK(state.stage != OptState::STEPPED,
              "step() has already been called since the last update().");
  if (dynamic_cast<optim::FusedOptimizer*>(&optimizer) != nullptr) {
    return step_amp_aware(optimizer, state, /*read_flag=*/true);
  }
  if (state.stage == OptState::READY) {
    unscale_(optimizer);
  }
  TORCH_CHECK(!state.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer.");
  // _maybe_opt_step: one .item() per device.
  double found = 0.0;
  for (const auto& [dev, flag] : state.found_inf_per_device) {
    found += flag.item<double>();
  }
  host_found_[&optimizer] = found != 0.0;
  bool ran = false;
  if (found == 0.0) {
    optimizer.step();
    ran = true;
  }
  state.stage = OptState::STEPPED;
  return ran;
}

void GradScaler::step_no_sync(torch::optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return;
  }
  TORCH_CHECK(dynamic_cast<optim::FusedOptimizer*>(&optimizer) != nullptr,
              "GradScaler::step_no_sync: the optimizer is not a "
              "mixprec::optim optimizer; stepping it only when its grads are "
              "finite reads the inf flag on the host (use step())");
  check_scale_growth_tracker("step");
  auto& state = state_of(optimizer);
  TORCH_CHECK(state.stage != OptState::STEPPED,
              "step() has already been called since the last update().");
  step_amp_aware(optimizer, state, /*read_flag=*/false);
}

bool GradScaler::step_amp_aware(torch::optim::Optimizer& optimizer,
                                PerOptimizerState& state, bool read_flag) {
  auto& fused = dynamic_cast<optim::FusedOptimizer&>(optimizer);
  if (state.stage == OptState::READY) {
    check_inf_per_device(optimizer);
  }
  const at::Tensor& scale = scale_;
  const auto& flags = state.found_inf_per_device;
  std::optional<at::Tensor> found_inf;
  if (flags.size() == 1 && flags[0].first == scale.device()) {
    found_inf = flags[0].second;
  } else if (!flags.empty()) {
    at::Tensor f = flags[0].second.to(scale.device(), true);
    for (size_t i = 1; i < flags.size(); ++i) {
      f = f + flags[i].second.to(scale.device(), true);
    }
    found_inf = f;
  }
  optim::StepScalars scalars;
  if (state.stage != OptState::UNSCALED || state.deferred_unscale) {
    scalars.grad_scale = scale;
  }
  scalars.found_inf = found_inf;
  scalars.clip_coef = state.clip_coef;
  fused.step_with(scalars);
  state.stage = OptState::STEPPED;
  if (!found_inf) {
    host_found_[&optimizer] = false;
    return true;
  }
  if (!read_flag) {
    return true;  // (not known on the host: update() keeps the device flag)
  }
  const bool skipped = found_inf->item<double>() != 0.0;
  host_found_[&optimizer] = skipped;
  return !skipped;
}

// ---------------------------------------------------------------- clipping
at::Tensor GradScaler::clip_grad_norm_(torch::optim::Optimizer& optimizer,
                                       double max_norm, double norm_type,
                                       bool fold_into_step) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  at::NoGradGuard no_grad;
  const auto clip = [&](const at::Tensor& total) {
    // torch.nn.utils.clip_grads_with_norm_
    at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
    for (auto& p : params) {
      if (p.grad().defined()) {
        p.mutable_grad().mul_(coef.to(p.grad().device()));
      }
    }
  };
  const auto total_norm = [&](c10::Device home) {
    std::vector<at::Tensor> norms;
    for (const auto& p : params) {
      if (p.grad().defined()) {
        norms.push_back(at::linalg_vector_norm(p.grad(), norm_type).to(home));
      }
    }
    if (norms.empty()) {
      return at::zeros({}, at::TensorOptions(home).dtype(at::kFloat));
    }
    return at::linalg_vector_norm(at::stack(norms), norm_type)
        .to(home, at::kFloat);
  };
  if (!enabled_) {
    c10::Device home =
        params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    at::Tensor total = total_norm(home);
    clip(total);
    return total;
  }
  check_scale_growth_tracker("clip_grad_norm_");
  auto& state = state_of(optimizer);
  TORCH_CHECK(state.stage != OptState::STEPPED,
              "clip_grad_norm_() is being called after step().");
  const c10::Device home = scale_.device();
  // One norm op call per device with a fresh inf flag: the flags and the
  // total norm (float32 0-dim on `home`).
  using NormOp = at::Tensor (*)(at::TensorList, const at::Tensor&,
                                const at::Tensor&, double);
  const auto norm_pass = [&](bool coalesce_sparse, NormOp op) {
    auto per_device = collect_grads(optimizer, false, coalesce_sparse);
    at::Tensor inv = inv_scale();
    std::vector<std::pair<c10::Device, at::Tensor>> flags;
    std::vector<at::Tensor> norms;
    for (const auto& [dev, grads] : per_device) {
      at::Tensor flag = at::zeros({}, at::TensorOptions(dev).dtype(at::kFloat));
      at::Tensor inv_dev = dev == home ? inv : inv.to(dev, true);
      norms.push_back(op(grads, flag, inv_dev, norm_type).to(home));
      flags.emplace_back(dev, flag);
    }
    at::Tensor norm =
        norms.empty() ? at::zeros({}, at::TensorOptions(home).dtype(at::kFloat))
        : norms.size() == 1
            ? norms[0]
            : at::linalg_vector_norm(at::stack(norms), norm_type);
    return std::make_pair(std::move(flags), norm);
  };
  bool any_sparse = false;
  for (const auto& p : params) {
    any_sparse = any_sparse || (p.grad().defined() && p.grad().is_sparse());
  }
  const bool fold = fold_into_step && norm_type > 0 && !any_sparse &&
                    dynamic_cast<optim::FusedOptimizer*>(&optimizer) != nullptr;
  if (state.deferred_unscale && !fold) {
    // An earlier folded clip of this iteration left the grads scaled, its
    // coefficient pending: apply both now, so that this clip measures and
    // clips the grads the step would see, and the step then neither
    // unscales nor clips them again. The folded pass's inf flags stay valid.
    at::Tensor factor = inv_scale();
    if (state.clip_coef) {
      factor = factor * *state.clip_coef;
    }
    for (const auto& [dev, grads] : collect_grads(optimizer, false)) {
      const at::Tensor f = dev == home ? factor : factor.to(dev, true);
      for (const auto& g : grads) {
        g.mul_(f);
      }
    }
    state.deferred_unscale = false;
    state.clip_coef.reset();
  }
  at::Tensor total;
  if (fold && (state.stage == OptState::READY || state.deferred_unscale)) {
    // Read-only pass: found_inf and the norm of grad * inv_scale.
    auto [flags, norm] = norm_pass(false, &mixprec::check_finite_and_norm_);
    if (!state.deferred_unscale) {
      state.found_inf_per_device = std::move(flags);
      state.stage = OptState::UNSCALED;
      state.deferred_unscale = true;
    }
    total = norm;
  } else if (state.stage == OptState::READY && norm_type > 0) {
    auto [flags, norm] = norm_pass(true, &mixprec::unscale_and_norm_);
    state.found_inf_per_device = std::move(flags);
    state.stage = OptState::UNSCALED;
    total = norm;
  } else {
    if (state.stage == OptState::READY) {
      for (auto& p : params) {
        if (p.grad().defined() && p.grad().is_sparse()) {
          p.mutable_grad() = p.grad().coalesce();
        }
      }
      unscale_(optimizer);
    }
    total = total_norm(home);
  }
  if (state.clip_coef) {
    // An earlier folded clip of this iteration: the grads it would have
    // produced are the current ones times its coefficient.
    total = total * *state.clip_coef;
  }
  if (fold) {
    at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
    state.clip_coef = state.clip_coef
                          ? std::optional<at::Tensor>(*state.clip_coef * coef)
                          : std::optional<at::Tensor>(coef);
  } else {
    clip(total);
  }
  return total;
}

// ---------------------------------------------------------------- update
void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) {
    return;
  }
  auto [scale, tracker] = check_scale_growth_tracker("update");
  std::optional<at::Tensor> found;
  if (new_scale.has_value()) {
    scale.fill_(*new_scale);
    std::vector<at::Tensor> flags;
    for (const auto& [k, s] : per_optimizer_) {
      for (const auto& [dev, f] : s.found_inf_per_device) {
        flags.push_back(f.to(scale.device(), true));
      }
    }
    if (!flags.empty()) found = at::stack(flags).sum();
  } else {
    std::vector<at::Tensor> flags;
    for (const auto& [k, s] : per_optimizer_) {
      for (const auto& [dev, f] : s.found_inf_per_device) {
        flags.push_back(f.to(scale.device(), true));
      }
    }
    TORCH_CHECK(!flags.empty(), "No inf checks were recorded prior to update.");
    at::Tensor f = flags[0];
    for (size_t i = 1; i < flags.size(); ++i) {
      f.add_(flags[i]);  // in place, as torch
    }
    found = f;
    if (uses_ext_rule()) {
      if (!hysteresis_left_.defined()) {
        hysteresis_left_ =
            at::full({}, init_hysteresis_left_,
                     at::TensorOptions(scale.device()).dtype(at::kInt));
      }
      mixprec::update_scale_ext_(
          scale, tracker, hysteresis_left_, f, growth_factor_, backoff_factor_,
          growth_interval_, min_scale_, max_scale_, hysteresis_);
    } else {
      mixprec::update_scale_(scale, tracker, f, growth_factor_, backoff_factor_,
                             growth_interval_);
    }
  }
  record_iteration(found);
  per_optimizer_.clear();
}

void GradScaler::update(const at::Tensor& new_scale) {
  if (!enabled_) {
    return;
  }
  auto [scale, tracker] = check_scale_growth_tracker("update");
  const char* reason =
      "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
      "torch.FloatTensor with requires_grad=False.";
  TORCH_CHECK(new_scale.defined() && new_scale.device().type() == device_type_,
              reason);
  TORCH_CHECK(new_scale.numel() == 1, reason);
  TORCH_CHECK(!new_scale.requires_grad(), reason);
  scale.copy_(new_scale.reshape({}));
  std::vector<at::Tensor> flags;
  for (const auto& [k, s] : per_optimizer_) {
    for (const auto& [dev, f] : s.found_inf_per_device) {
      flags.push_back(f.to(scale.device(), true));
    }
  }
  std::optional<at::Tensor> found;
  if (!flags.empty()) found = at::stack(flags).sum();
  record_iteration(found);
  per_optimizer_.clear();
}

void GradScaler::record_iteration(const std::optional<at::Tensor>& found) {
  last_found_device_ = at::Tensor();
  last_found_host_.reset();
  std::vector<const void*> checked;
  for (const auto& [k, s] : per_optimizer_) {
    if (!s.found_inf_per_device.empty()) checked.push_back(k);
  }
  bool all_known = !checked.empty();
  bool any = false;
  for (const void* k : checked) {
    auto it = host_found_.find(k);
    if (it == host_found_.end()) {
      all_known = false;
      break;
    }
    any = any || it->second;
  }
  if (!found.has_value()) {
    last_found_host_ = false;
  } else if (all_known) {
    last_found_host_ = any;
  } else {
    last_found_device_ = found->clone();
  }
  host_found_.clear();
}

bool GradScaler::step_was_skipped() {
  if (!enabled_) {
    return false;
  }
  if (last_found_device_.defined()) {
    return last_found_device_.item<double>() != 0.0;
  }
  return last_found_host_.value_or(false);
}

double GradScaler::get_scale() const {
  if (!enabled_) {
    return 1.0;
  }
  return scale_.defined() ? scale_.item<double>() : init_scale_;
}

// ---------------------------------------------------------------- state
c10::Dict<std::string, c10::IValue> GradScaler::state_dict() const {
  c10::Dict<std::string, c10::IValue> out = make_state_dict();
  if (!enabled_) {
    return out;
  }
  out.insert("scale", get_scale());
  out.insert("growth_factor", growth_factor_);
  out.insert("backoff_factor", backoff_factor_);
  out.insert("growth_interval", growth_interval_);
  out.insert("_growth_tracker", get_growth_tracker());
  if (hysteresis_ != 1) {
    out.insert("_hysteresis_left", get_hysteresis_left());
  }
  return out;
}

void GradScaler::load_state_dict(
    const c10::Dict<std::string, c10::IValue>& state) {
  if (!enabled_) {
    return;
  }
  TORCH_CHECK(state.size() != 0,
              "The source state dict is empty, possibly because it was saved "
              "from a disabled instance of GradScaler.");
  // Everything is read (and checked) before anything changes.
  const double scale = ivalue_to_double(required(state, "scale"), "scale");
  const double growth =
      ivalue_to_double(required(state, "growth_factor"), "growth_factor");
  const double backoff =
      ivalue_to_double(required(state, "backoff_factor"), "backoff_factor");
  const int64_t interval =
      ivalue_to_int(required(state, "growth_interval"), "growth_interval");
  const int64_t tracker =
      ivalue_to_int(required(state, "_growth_tracker"), "_growth_tracker");
  int64_t left = hysteresis_;
  auto it = state.find("_hysteresis_left");
  if (it != state.end()) {
    left = ivalue_to_int(it->value(), "_hysteresis_left");
  }
  if (differs(growth, growth_factor_) || differs(backoff, backoff_factor_) ||
      interval != growth_interval_) {
    ++settings_version_;
  }
  init_scale_ = scale;
  if (scale_.defined()) scale_.fill_(scale);
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = interval;
  init_growth_tracker_ = tracker;
  if (growth_tracker_.defined()) growth_tracker_.fill_(tracker);
  init_hysteresis_left_ = left;
  if (hysteresis_left_.defined()) hysteresis_left_.fill_(left);
}

void GradScaler::save(const std::string& path) const {
  mixprec::torch_save(c10::IValue(state_dict()), path);
}

void GradScaler::load(const std::string& path) {
  const c10::IValue value = mixprec::torch_load(path);
  TORCH_CHECK(value.isGenericDict(), "GradScaler.load: '", path,
              "' does not hold a dict (got ", value.tagKind(), ")");
  c10::Dict<std::string, c10::IValue> state = make_state_dict();
  for (const auto& entry : value.toGenericDict()) {
    TORCH_CHECK(entry.key().isString(),
                "GradScaler.load: the dict's keys must be strings");
    state.insert(entry.key().toStringRef(), entry.value());
  }
  load_state_dict(state);
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& entry : state_dict()) {
    archive.write("mixprec_grad_scaler/" + entry.key(), entry.value());
  }
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  c10::Dict<std::string, c10::IValue> state = make_state_dict();
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval",
        "_growth_tracker", "_hysteresis_left"}) {
    c10::IValue v;
    if (archive.try_read(std::string("mixprec_grad_scaler/") + key, v)) {
      state.insert(key, v);
    }
  }
  load_state_dict(state);
}

}  // namespace mixprec
