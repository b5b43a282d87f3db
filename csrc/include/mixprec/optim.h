// mixprec::optim -- fused master-weight optimizers for LibTorch programs.
//
// AdamW, Adam and SGD are torch::optim::Optimizer subclasses (param groups,
// zero_grad, torch::save/torch::load work as for torch's own) and the C++
// twins of mixprec.optim.AdamW/Adam/SGD in Python: params may be float32,
// float16 or bfloat16; for 16-bit params, master_weights (default true) keeps
// a float32 master copy in the state, the update runs on it and the param
// receives it rounded to nearest. Grads may be float32/float16/bfloat16 and
// are only read. Each step is one fused mixprec op (fused_adam_ /
// fused_sgd_, or fused_adam8_ / fused_sgd8_ for params with 8-bit state) per
// (device, with/without masters, 8-bit or not) bucket of a param group, with
// lr and step counts on the param's device: no host sync. state_bits(8) keeps
// the moments (the momentum buffer) of every param of at least
// min_8bit_size elements as block-wise 8-bit codes, the layout of Python's
// state_bits=8. master_correction_bits(16) or (8) keeps the master of a
// bfloat16 param as the param plus an int16 / int8 correction
// (master_correction; Python's option of that name, 0 for its None).
//
// With mixprec::GradScaler the optimizers unscale in the kernel and skip a
// step with inf/NaN grads on the device (step counts included); see
// FusedOptimizer::step_with.
//
// Checkpoints: torch::save/torch::load (LibTorch archives), or state_dict()/
// load_state_dict() in the layout of the Python classes' state_dict(), which
// mixprec::torch_save writes as a file Python's torch.load reads (and back).
//
//   mixprec::optim::AdamW opt(model->parameters(),
//                             mixprec::optim::AdamWOptions(1e-3));
#pragma once

#include "mixprec/export.h"
#include "mixprec/optim_options.h"

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace mixprec::optim {

// The scalars GradScaler hands to an optimizer that unscales in its own
// kernel (Python: step(grad_scale=, found_inf=, clip_coef=)). Each, when
// given, is a one-element float32 tensor; they may live on another device
// than the params (they are copied there without a sync).
struct StepScalars {
  // the scale the grads carry: they are multiplied by its float64 reciprocal
  std::optional<at::Tensor> grad_scale;
  // non-zero: the step is skipped on the device (nothing changes)
  std::optional<at::Tensor> found_inf;
  // multiplied into the grads (gradient clipping folded into the step)
  std::optional<at::Tensor> clip_coef;
};

// The float32 master a bfloat16 param and its master_correction (int16 or
// int8, the param's shape) carry, a fresh tensor (Python:
// mixprec.optim.decode_master). c10::TypeError for other dtypes,
// c10::ValueError for another shape.
MIXPREC_API at::Tensor decode_master(const at::Tensor& param,
                                     const at::Tensor& correction);

// Base of AdamW, Adam and SGD; not used directly.
class MIXPREC_API FusedOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  // One step over every param that has a grad.
  at::Tensor step(LossClosure closure = nullptr) override;
  // step() with GradScaler's scalars (see StepScalars). A rejected call
  // (bad scalars, bad dtypes, sparse grads) changes nothing.
  at::Tensor step_with(const StepScalars& scalars,
                       LossClosure closure = nullptr);

  // True when some param group keeps float32 masters for 16-bit params (a
  // GradScaler then accepts float16 grads).
  virtual bool master_weights() const = 0;

  // The float32 weights the optimizer updates, one per param in group order:
  // the master of a 16-bit param (the state tensor; a split master decoded,
  // decode_master, a fresh tensor; a fresh float32 copy before its first
  // step), else the param itself.
  std::vector<at::Tensor> master_params();

  // The float64 0-dim tensors the fused kernels read the lr from, one per
  // (param group, device of its params), in group order, each holding its
  // group's current lr (filled where the lr changed, created where missing;
  // no host sync). step() does this for the groups it steps; a replayed CUDA
  // graph of a step does not, so mixprec::CapturedStep refreshes the ones
  // its graph reads before every call (lr_tensor()): an lr set between calls
  // reaches the graph. They are the same tensors for the optimizer's life
  // (a load refills them), as a graph holding their addresses needs.
  std::vector<at::Tensor> lr_tensors();
  // The one of param group `index` (c10::Error where there is none) for its
  // params on `device`, as lr_tensors() makes it; without walking the
  // group's params (Python: FusedOptimizer.lr_tensor(index, device)).
  at::Tensor lr_tensor(size_t index, c10::Device device);

  // torch::optim::Optimizer::add_param_group (not virtual there), counted
  // in version(); the group's own options are merged with the defaults
  // (group_options) and checked as the constructor's are (c10::ValueError
  // naming the option; the group is not added then).
  // (Called through a torch::optim::Optimizer, it is torch's: neither
  // counted nor checked.)
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  // A count of the changes made through this optimizer to what a captured
  // step holds besides the values it updates: bumped by load() (torch::load),
  // load_state_dict() (new state tensors, the groups' options) and
  // add_param_group(). mixprec::CapturedStep compares it before every call
  // and checks every param, grad and state tensor when it moved. Changes
  // made through param_groups() and state() are not counted (the options,
  // the group and param counts and each group's first param and grad are
  // compared at every call instead).
  uint64_t version() const noexcept { return version_; }

  // The optimizer as the Python class's state_dict(): {"state": {index:
  // {"step", "exp_avg", ..., "master_param"}}, "param_groups": [{"lr", ...,
  // "params": [indices]}]}, params numbered in group order. Save it with
  // mixprec::torch_save; Python's mixprec.optim.<Class>.load_state_dict
  // takes what torch.load returns (and torch.optim.<Class> too, ignoring
  // the extra keys). Tensors are the state's own (not copies).
  c10::impl::GenericDict state_dict() const;
  // Loads such a dict, from C++ or from Python (torch.save of
  // optimizer.state_dict(), read with mixprec::torch_load): group options
  // and per-param state (copied to the param's device, float32; masters
  // rebuilt from the params when absent). The groups must have the same
  // sizes as this optimizer's (c10::Error otherwise; nothing changes then).
  void load_state_dict(const c10::impl::GenericDict& state_dict);

 protected:
  // Per-bucket work of a subclass: `bucket` holds, for the params of one
  // device with or without masters, the lists the fused op takes.
  struct Bucket {
    std::vector<at::Tensor> params, grads, master_params, state_steps;
    std::vector<at::Tensor> buf0, buf1, buf2;  // optimizer-specific state
    // 8-bit state: buf0/buf1 hold codes, these their maxima
    std::vector<at::Tensor> absmax0, absmax1;
    bool coded = false;
  };
  // Whether p's state is 8-bit (its group's state_bits, its size).
  virtual bool coded(const at::Tensor& p,
                     const torch::optim::OptimizerParamGroup& group) const = 0;
  virtual void add_to_bucket(const at::Tensor& p,
                             torch::optim::OptimizerParamGroup& group,
                             Bucket& bucket) = 0;
  virtual void run_bucket(Bucket& bucket,
                          torch::optim::OptimizerParamGroup& group,
                          const at::Tensor& lr, const StepScalars& scalars,
                          int64_t seed, bool has_masters) = 0;
  virtual bool group_master_weights(
      const torch::optim::OptimizerParamGroup& group) const = 0;
  virtual int64_t group_seed(
      const torch::optim::OptimizerParamGroup& group) const = 0;
  virtual const char* name() const = 0;
  // The checks of every param group's options (c10::ValueError naming the
  // option; c10::Error for options of another optimizer).
  virtual void check_param_groups() const = 0;
  // A group's own options merged with the optimizer's defaults as torch's
  // C++ optimizers merge theirs (a field set to other than its constructor
  // default is the group's, the rest the defaults'; Python: the keys a
  // group's dict sets). torch::optim::Optimizer::add_param_group merges only
  // for its own classes and keeps the defaults alone for any other, so the
  // constructors and add_param_group apply this instead. c10::Error for
  // options of another optimizer.
  virtual std::unique_ptr<torch::optim::OptimizerOptions> group_options(
      const torch::optim::OptimizerOptions& own) const = 0;

  bool wants_master(const at::Tensor& p,
                    const torch::optim::OptimizerParamGroup& group) const;
  // The dtype of p's master state: Undefined without a master, float32
  // (master_param), int16 or int8 (master_correction of a bf16 param under
  // master_correction_bits).
  at::ScalarType master_form(
      const at::Tensor& p,
      const torch::optim::OptimizerParamGroup& group) const;
  // The part of add_to_bucket every optimizer shares: p's state (created as
  // a State where missing) with its step count and, where the group wants
  // one, its master copy; appends p, its grad, step and master to `bucket`.
  // Returns the state for the subclass's own buffers (defined in optim.cpp).
  template <class State>
  State& bucket_param(const at::Tensor& p,
                      torch::optim::OptimizerParamGroup& group, Bucket& bucket);
  // After torch::load: state tensors to the param's device, float32.
  void fix_loaded_state();
  // Counts a change in version(); called before it is made.
  void count_change() noexcept { ++version_; }

 private:
  at::Tensor lr_tensor(size_t index,
                       const torch::optim::OptimizerParamGroup& group,
                       c10::Device device);
  // (group index, device) -> (lr value, float64 0-dim tensor)
  std::map<std::pair<size_t, std::string>, std::pair<double, at::Tensor>>
      lr_cache_;
  uint64_t version_ = 0;
};

// ------------------------------------------------------------------ options
// Each options class is generated from one list of its options: the
// X-macros of mixprec/optim_options.h.

// A row as a TORCH_ARG member with its default.
#define MIXPREC_OPTIM_OPTION_MEMBER(type, name, default_value, check, flags) \
  TORCH_ARG(type, name) = default_value;

// ------------------------------------------------------------------ Adam
struct MIXPREC_API AdamOptions
    : public torch::optim::OptimizerCloneableOptions<AdamOptions> {
  AdamOptions(double lr = 1e-3);
  typedef std::tuple<double, double> betas_t;
  MIXPREC_ADAM_OPTIONS(MIXPREC_OPTIM_OPTION_MEMBER)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

// AdamW's options: AdamOptions without decoupled_weight_decay (always on),
// weight_decay 1e-2 by default.
struct MIXPREC_API AdamWOptions
    : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  AdamWOptions(double lr = 1e-3);
  typedef std::tuple<double, double> betas_t;
  MIXPREC_ADAMW_OPTIONS(MIXPREC_OPTIM_OPTION_MEMBER)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

// Per-param state, one list per class as for the options: the members here,
// and in csrc/api the torch::save archive, the state_dict() entries (the
// names are the Python state dict's keys), their loading and the tensors a
// CapturedStep holds. All float32 on the param's device except the codes.
//   step: 0-dim; master_param: 16-bit params only; master_correction: int16
//   or int8, instead of master_param for a bf16 param of a group with
//   master_correction_bits (decode_master gives the float32 master);
//   max_exp_avg_sq: amsgrad only; momentum_buffer: momentum != 0 only.
//   state_bits 8: exp_avg / exp_avg_sq / momentum_buffer hold uint8 codes and
//   the *_absmax their block maxima (empty for a param left at 32 bits).
#define MIXPREC_ADAM_STATE(X) \
  X(step)                     \
  X(exp_avg)                  \
  X(exp_avg_sq)               \
  X(max_exp_avg_sq)           \
  X(master_param)             \
  X(exp_avg_absmax)           \
  X(exp_avg_sq_absmax)        \
  X(master_correction)

#define MIXPREC_SGD_STATE(X) \
  X(step)                    \
  X(momentum_buffer)         \
  X(master_param)            \
  X(momentum_buffer_absmax)  \
  X(master_correction)

#define MIXPREC_OPTIM_STATE_MEMBER(name) TORCH_ARG(at::Tensor, name);

// Per-param state of Adam/AdamW.
struct MIXPREC_API AdamParamState
    : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  MIXPREC_ADAM_STATE(MIXPREC_OPTIM_STATE_MEMBER)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// Adam and AdamW: one implementation over their option types, as the Python
// classes share one (mixprec.optim.AdamW subclasses Adam). Construct Adam or
// AdamW, not this; Options is AdamOptions or AdamWOptions (instantiated in
// the library for those two only).
template <typename Options>
class MIXPREC_API AdamBase : public FusedOptimizer {
 public:
  explicit AdamBase(
      const std::vector<torch::optim::OptimizerParamGroup>& groups,
      Options defaults = {});
  explicit AdamBase(std::vector<at::Tensor> params, Options defaults = {})
      : AdamBase({torch::optim::OptimizerParamGroup(std::move(params))},
                 std::move(defaults)) {}

  bool master_weights() const override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  void add_to_bucket(const at::Tensor& p,
                     torch::optim::OptimizerParamGroup& group,
                     Bucket& bucket) override;
  void run_bucket(Bucket& bucket, torch::optim::OptimizerParamGroup& group,
                  const at::Tensor& lr, const StepScalars& scalars,
                  int64_t seed, bool has_masters) override;
  bool group_master_weights(
      const torch::optim::OptimizerParamGroup& group) const override;
  int64_t group_seed(
      const torch::optim::OptimizerParamGroup& group) const override;
  const char* name() const override;
  void check_param_groups() const override;
  std::unique_ptr<torch::optim::OptimizerOptions> group_options(
      const torch::optim::OptimizerOptions& own) const override;
  bool coded(const at::Tensor& p,
             const torch::optim::OptimizerParamGroup& group) const override;
};

extern template class AdamBase<AdamOptions>;
extern template class AdamBase<AdamWOptions>;

// Adam (decoupled_weight_decay selects AdamW's decay), one fused kernel.
//   Adam(groups, AdamOptions defaults = {}), Adam(params, defaults)
class MIXPREC_API Adam : public AdamBase<AdamOptions> {
 public:
  using AdamBase<AdamOptions>::AdamBase;
};

// AdamW: decoupled weight decay (default 1e-2), one fused kernel.
//   AdamW(groups, AdamWOptions defaults = {}), AdamW(params, defaults)
class MIXPREC_API AdamW : public AdamBase<AdamWOptions> {
 public:
  using AdamBase<AdamWOptions>::AdamBase;
};

// ------------------------------------------------------------------ SGD
struct MIXPREC_API SGDOptions
    : public torch::optim::OptimizerCloneableOptions<SGDOptions> {
  SGDOptions(double lr = 1e-3);
  MIXPREC_SGD_OPTIONS(MIXPREC_OPTIM_OPTION_MEMBER)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct MIXPREC_API SGDParamState
    : public torch::optim::OptimizerCloneableParamState<SGDParamState> {
  MIXPREC_SGD_STATE(MIXPREC_OPTIM_STATE_MEMBER)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// SGD (momentum, dampening, Nesterov, weight decay), one fused kernel.
class MIXPREC_API SGD : public FusedOptimizer {
 public:
  explicit SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups,
               SGDOptions defaults = {});
  explicit SGD(std::vector<at::Tensor> params, SGDOptions defaults = {})
      : SGD({torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}

  bool master_weights() const override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  void add_to_bucket(const at::Tensor& p,
                     torch::optim::OptimizerParamGroup& group,
                     Bucket& bucket) override;
  void run_bucket(Bucket& bucket, torch::optim::OptimizerParamGroup& group,
                  const at::Tensor& lr, const StepScalars& scalars,
                  int64_t seed, bool has_masters) override;
  bool group_master_weights(
      const torch::optim::OptimizerParamGroup& group) const override;
  int64_t group_seed(
      const torch::optim::OptimizerParamGroup& group) const override;
  const char* name() const override { return "SGD"; }
  void check_param_groups() const override;
  std::unique_ptr<torch::optim::OptimizerOptions> group_options(
      const torch::optim::OptimizerOptions& own) const override;
  bool coded(const at::Tensor& p,
             const torch::optim::OptimizerParamGroup& group) const override;
};

}  // namespace mixprec::optim
