// mixprec::GradScaler -- dynamic loss scaling for LibTorch programs.
//
// The C++ twin of the Python class mixprec.GradScaler (itself a drop-in for
// torch.amp.GradScaler): the same state machine per optimizer
// (READY -> UNSCALED -> STEPPED, reset by update()), the same error messages,
// and a state dict with the same keys and values, so that a scaler state
// saved here loads in Python and back (see save()/load()). The work is done
// by the mixprec ops (<mixprec/ops.h>): one unscale_and_check_ call per
// device for all of an optimizer's gradients, the device-side
// update_scale_ / update_scale_ext_ for the scale update.
//
//   mixprec::GradScaler scaler(torch::kCUDA);
//   for (...) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     {
//       // mixprec/autocast_guard.h
//       mixprec::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
//       loss = loss_fn(model->forward(x), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.clip_grad_norm_(optimizer, 1.0);   // optional
//     bool stepped = scaler.step(optimizer);    // false: skipped (inf/NaN)
//     scaler.update();
//   }
//
// Exceptions: where the Python class raises RuntimeError or AssertionError
// this throws c10::Error, ValueError -> c10::ValueError, TypeError ->
// c10::TypeError; the message text is the same.
//
// Not thread-safe (as the Python class). Not modelled from Python:
// process_group (distributed reduction of the inf checks), stats(), and
// optimizers whose step takes a `grad_scaler` argument.
#pragma once

#include "mixprec/export.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace mixprec {

// Constructor arguments of GradScaler. Defaults are torch.amp.GradScaler's.
struct MIXPREC_API GradScalerOptions {
  GradScalerOptions() = default;

  // The presets of the Python class's `policy=` argument: "torch" (the
  // defaults), "deepspeed" (init 2**16, interval 1000, hysteresis 2,
  // min_scale 1) and "megatron" (init 2**32, interval 1000, hysteresis 2,
  // min_scale 1). c10::ValueError for another name.
  static GradScalerOptions policy(const std::string& name);

  TORCH_ARG(double, init_scale) = 65536.0;
  // > 1 (checked when enabled).
  TORCH_ARG(double, growth_factor) = 2.0;
  // < 1 (checked when enabled).
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
  // false: every method is a transparent no-op (step() just steps).
  TORCH_ARG(bool, enabled) = true;
  // Bounds of the scale (finite, > 0): backoff never goes below min_scale,
  // growth never above max_scale.
  TORCH_ARG(std::optional<double>, min_scale) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_scale) = std::nullopt;
  // Overflows tolerated (since the last growth) before backing off; 1 =
  // back off on every overflow (torch). >= 1.
  TORCH_ARG(int64_t, hysteresis) = 1;
  // Accept float16 gradients in unscale_() instead of throwing "Attempting to
  // unscale FP16 gradients.". nullopt: accept them only for optimizers that
  // keep float32 master weights (mixprec::optim with master_weights).
  TORCH_ARG(std::optional<bool>, allow_fp16_grads) = std::nullopt;
};

// Where an optimizer is in the current iteration (torch.amp's OptState).
enum class OptState { READY = 0, UNSCALED = 1, STEPPED = 2 };

class MIXPREC_API GradScaler {
 public:
  // `device`: the device type of the scale, as the Python class's first
  // argument ("cuda" by default). Enabled on CUDA without a CUDA device, it
  // warns and disables itself, as torch does.
  explicit GradScaler(c10::DeviceType device = c10::DeviceType::CUDA,
                      GradScalerOptions options = {});
  explicit GradScaler(GradScalerOptions options)
      : GradScaler(c10::DeviceType::CUDA, std::move(options)) {}

  // outputs * scale (the scale is created lazily on the first output's
  // device). Unchanged when disabled.
  at::Tensor scale(const at::Tensor& outputs);
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  // Divides the optimizer's gradients by the scale, in place, and checks them
  // for inf/NaN: one fused op per device. At most once per optimizer per
  // iteration. No host sync.
  void unscale_(torch::optim::Optimizer& optimizer);

  // Unscales (unless unscale_ ran) and steps the optimizer unless its
  // gradients hold inf/NaN. Returns whether the step ran (its parameters were
  // updated). mixprec::optim optimizers receive the scale and the inf flag and
  // skip on the device; the returned value then reads the flag (one host
  // sync, after the step is enqueued). Other optimizers: one host sync before
  // the step, as in torch. A closure is rejected while enabled (as torch);
  // when disabled it is passed to optimizer.step().
  bool step(torch::optim::Optimizer& optimizer,
            torch::optim::Optimizer::LossClosure closure = nullptr);

  // step() without the host read: a mixprec::optim optimizer's step is
  // enqueued with the scale and the inf flag and skipped on the device, and
  // nothing is returned (step_was_skipped() tells after update(), with one
  // sync). What a step captured in a CUDA graph calls (mixprec::CapturedStep,
  // <mixprec/capture.h>). c10::Error for another optimizer while enabled: it
  // can only be skipped by reading the flag on the host. Disabled: steps it.
  void step_no_sync(torch::optim::Optimizer& optimizer);

  // Unscale + inf check + total norm in one pass, then clip the gradients to
  // max_norm (torch.nn.utils.clip_grad_norm_'s coefficient). Counts as this
  // iteration's unscale_. Returns the total norm before clipping (float32
  // 0-dim on the scale's device). No host sync.
  //
  // With a mixprec::optim optimizer and fold_into_step (the default), the
  // clip is folded into the optimizer's fused step instead, as in Python:
  // this call only reads the grads (check_finite_and_norm_), and step() hands
  // the kernel the scale and the clip coefficient; the grads stay as backward
  // left them (scaled, unclipped).
  at::Tensor clip_grad_norm_(torch::optim::Optimizer& optimizer,
                             double max_norm, double norm_type = 2.0,
                             bool fold_into_step = true);

  // Ends the iteration: updates the scale from the recorded inf checks (on
  // the device), or sets it to new_scale. Call once per iteration.
  void update(std::optional<double> new_scale = std::nullopt);
  // new_scale: one-element tensor on the scale's device type, without
  // requires_grad; copied.
  void update(const at::Tensor& new_scale);

  // The scale (init_scale before the first scale() call; 1.0 when disabled).
  // Syncs.
  double get_scale() const;
  // The scale tensor (float32 0-dim on its device), undefined before the
  // first scale() call or when disabled.
  at::Tensor scale_tensor() const { return scale_; }

  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double v) {
    if (differs(v, growth_factor_)) ++settings_version_;
    growth_factor_ = v;
  }
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double v) {
    if (differs(v, backoff_factor_)) ++settings_version_;
    backoff_factor_ = v;
  }
  int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(int64_t v) {
    if (v != growth_interval_) ++settings_version_;
    growth_interval_ = v;
  }
  bool is_enabled() const { return enabled_; }
  int64_t hysteresis() const { return hysteresis_; }
  std::optional<double> min_scale() const { return min_scale_; }
  std::optional<double> max_scale() const { return max_scale_; }
  c10::DeviceType device_type() const { return device_type_; }
  // A count of the changes of the settings above (by the setters,
  // load_state_dict() and the loads): mixprec::CapturedStep compares the
  // settings its graph bakes in when it moved.
  uint64_t settings_version() const noexcept { return settings_version_; }

  // Whether the optimizer steps of the last iteration closed by update() were
  // skipped; false before the first update and when disabled. Known on the
  // host after step(); after step_no_sync() it reads the device flag: one
  // host sync per call (not cached: a replayed CUDA graph of the step
  // rewrites that flag).
  bool step_was_skipped();

  // The stage of `optimizer` in the current iteration.
  OptState stage(const torch::optim::Optimizer& optimizer) const;

  // The Python class's state_dict(): "scale" (double), "growth_factor"
  // (double), "backoff_factor" (double), "growth_interval" (int),
  // "_growth_tracker" (int), and "_hysteresis_left" (int) when hysteresis !=
  // 1; empty when disabled. Syncs.
  c10::Dict<std::string, c10::IValue> state_dict() const;
  // Loads a state dict of this class, of the Python class or of
  // torch.amp.GradScaler. No-op when disabled; c10::Error for an empty dict
  // (torch's message) or a missing key.
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state);

  // The state dict as a torch.save file (mixprec::torch_save): Python reads
  // it with torch.load(path, weights_only=True) and passes the dict to
  // GradScaler.load_state_dict. load() reads such a file, or a file
  // written by Python's torch.save(scaler.state_dict(), path).
  void save(const std::string& path) const;
  void load(const std::string& path);
  // As entries of a torch::serialize archive (torch::save(scaler, ...)).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  struct PerOptimizerState {
    OptState stage = OptState::READY;
    // in order of first appearance, as the Python dict
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
    // A folded clip_grad_norm_: the grads still carry the scale, and the
    // optimizer's step applies clip_coef (on the scale's device).
    bool deferred_unscale = false;
    std::optional<at::Tensor> clip_coef;
  };

  // (bit for bit: -0.0 is not 0.0)
  static bool differs(double a, double b) {
    return std::bit_cast<uint64_t>(a) != std::bit_cast<uint64_t>(b);
  }
  std::pair<at::Tensor, at::Tensor> check_scale_growth_tracker(
      const char* funcname) const;
  void lazy_init_scale_growth_tracker(c10::Device device);
  bool uses_ext_rule() const;
  int64_t get_hysteresis_left() const;
  int64_t get_growth_tracker() const;
  bool fp16_grads_allowed(const torch::optim::Optimizer& optimizer) const;
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> collect_grads(
      torch::optim::Optimizer& optimizer, bool allow_fp16,
      bool coalesce_sparse = false) const;
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(
      torch::optim::Optimizer& optimizer, const at::Tensor& inv_scale,
      const at::Tensor& found_inf, bool allow_fp16);
  at::Tensor inv_scale() const;
  PerOptimizerState& state_of(const torch::optim::Optimizer& optimizer);
  PerOptimizerState& check_unscalable(torch::optim::Optimizer& optimizer,
                                      const char* what);
  void check_inf_per_device(torch::optim::Optimizer& optimizer);
  bool step_amp_aware(torch::optim::Optimizer& optimizer,
                      PerOptimizerState& state, bool read_flag);
  void record_iteration(const std::optional<at::Tensor>& found);

  c10::DeviceType device_type_;
  bool enabled_;
  double init_scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t init_growth_tracker_ = 0;
  std::optional<double> min_scale_;
  std::optional<double> max_scale_;
  int64_t hysteresis_;
  int64_t init_hysteresis_left_;
  std::optional<bool> allow_fp16_grads_;
  uint64_t settings_version_ = 0;

  at::Tensor scale_;            // float32 0-dim, lazily created
  at::Tensor growth_tracker_;   // int32 0-dim
  at::Tensor hysteresis_left_;  // int32 0-dim, only with the ext rule

  // keyed by the optimizer's address (Python: id(optimizer)), ordered
  std::vector<std::pair<const void*, PerOptimizerState>> per_optimizer_;
  std::unordered_map<const void*, bool> host_found_;
  // last completed iteration: host answer, or a device flag to read lazily
  std::optional<bool> last_found_host_;
  at::Tensor last_found_device_;
};

}  // namespace mixprec
