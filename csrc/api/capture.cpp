// mixprec::CapturedStep (mixprec/capture.h): python/mixprec/capture.py's
// capture_step for LibTorch programs, under the same contract
// (docs/capture.md): one graph per captured step, an error naming the change
// when what the graph bakes in changes, the sync ops and baked settings of
// capture_rules.h.
#include "mixprec/capture.h"

#include "mixprec/grad_scaler.h"
#include "mixprec/optim.h"

#include "capture_rules.h"
#include "mixprec_build_config.h"
#include "options_table.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#if MIXPREC_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace mixprec {

namespace {

constexpr const char* kWho = "mixprec::CapturedStep: ";

// ---- host syncs: the rules of capture_rules.h (shared with Python's
// SyncDetector), applied to the ops seen through a RecordFunction observer
// (C++ has no dispatch mode). On CUDA the checked call also runs under
// c10::cuda's sync debug mode, which catches any other sync.
enum class SyncRule { reads, bool_mask, to_host };

struct SyncOp {
  const char* name;
  SyncRule rule;
};

constexpr SyncOp kSyncOps[] = {
#define MIXPREC_SYNC_OP_ROW(name, rule) {name, SyncRule::rule},
    MIXPREC_FOR_EACH_SYNC_OP(MIXPREC_SYNC_OP_ROW)
#undef MIXPREC_SYNC_OP_ROW
};

std::mutex g_sync_mutex;
std::vector<std::string>* g_sync_seen = nullptr;  // the watch's list

void saw(const char* name, const char* why) {
  std::lock_guard<std::mutex> lock(g_sync_mutex);
  if (g_sync_seen != nullptr)
    g_sync_seen->push_back(c10::str(name, " (", why, ")"));
}

bool on_host(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu();
}
bool on_device(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && !v.toTensor().is_cpu() &&
         !v.toTensor().is_meta();
}

// Why the op of row `op` syncs, from its inputs (at the start of the call);
// nullptr when it does not, or, for a copy whose destination is its output
// (aten::_to_copy, aten::to), when that is known only at its end.
const char* why_syncs(const SyncOp& op, c10::ArrayRef<const c10::IValue> in) {
  switch (op.rule) {
    case SyncRule::reads:
      return "reads a device value on the host";
    case SyncRule::bool_mask:
      if (in.size() > 1 && in[1].isList()) {
        for (const c10::IValue& t : in[1].toListRef()) {
          if (t.isTensor() && (t.toTensor().scalar_type() == at::kBool ||
                               t.toTensor().scalar_type() == at::kByte)) {
            return "boolean-mask indexing (a nonzero on the device)";
          }
        }
      }
      return nullptr;
    case SyncRule::to_host:
      // copy_(self <- src), _copy_from(src -> dst)
      if (in.size() > 1 && std::strcmp(op.name, "aten::copy_") == 0 &&
          on_device(in[1]) && on_host(in[0])) {
        return "copies a device tensor to the host";
      }
      if (in.size() > 1 && std::strcmp(op.name, "aten::_copy_from") == 0 &&
          on_device(in[0]) && on_host(in[1])) {
        return "copies a device tensor to the host";
      }
      return nullptr;
  }
  return nullptr;
}

const SyncOp* find_sync_op(const char* name) {
  for (const SyncOp& op : kSyncOps) {
    if (std::strcmp(name, op.name) == 0) return &op;
  }
  return nullptr;
}

// The start of an op whose output decides (a copy from a device tensor).
struct FromDevice : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  const SyncOp* op = find_sync_op(fn.name());
  if (op == nullptr) return nullptr;
  const auto in = fn.inputs();
  if (const char* why = why_syncs(*op, in)) {
    saw(op->name, why);
  } else if (op->rule == SyncRule::to_host && !in.empty() && on_device(in[0])) {
    return std::make_unique<FromDevice>();
  }
  return nullptr;
}

// Any other op returning a float or a bool; a copy from a device tensor
// whose output is on the host.
void on_op_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  const auto& out = fn.outputs();
  if (ctx != nullptr) {
    if (!out.empty() && on_host(out[0])) {
      saw(fn.name(), "copies a device tensor to the host");
    }
    return;
  }
  if (find_sync_op(fn.name()) != nullptr) return;  // decided at its start
  for (const c10::IValue& v : out) {
    if (v.isDouble() || v.isBool() || v.isComplexDouble()) {
      saw(fn.name(), v.isBool() ? "returns a bool" : "returns a float");
      return;
    }
  }
}

// While alive: the sync ops this thread runs (and the autograd threads its
// backward calls use: they inherit the thread-local observer) are appended to
// `seen`; on CUDA any sync raises (SyncDebugMode::L_ERROR).
class SyncWatch {
 public:
  SyncWatch(std::vector<std::string>& seen, bool cuda) {
    {
      std::lock_guard<std::mutex> lock(g_sync_mutex);
      TORCH_CHECK(g_sync_seen == nullptr, kWho,
                  "another thread is in a checked call; run them one at a "
                  "time");
      g_sync_seen = &seen;
    }
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&on_op_start, &on_op_end)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION}));
#if MIXPREC_WITH_CUDA_KERNELS
    if (cuda) {
      previous_ = c10::cuda::warning_state().get_sync_debug_mode();
      c10::cuda::warning_state().set_sync_debug_mode(
          c10::cuda::SyncDebugMode::L_ERROR);
      cuda_ = true;
    }
#else
    (void)cuda;
#endif
  }
  ~SyncWatch() {
#if MIXPREC_WITH_CUDA_KERNELS
    if (cuda_) c10::cuda::warning_state().set_sync_debug_mode(previous_);
#endif
    at::removeCallback(handle_);
    std::lock_guard<std::mutex> lock(g_sync_mutex);
    g_sync_seen = nullptr;
  }
  SyncWatch(const SyncWatch&) = delete;
  SyncWatch& operator=(const SyncWatch&) = delete;

 private:
  at::CallbackHandle handle_;
#if MIXPREC_WITH_CUDA_KERNELS
  c10::cuda::SyncDebugMode previous_ = c10::cuda::SyncDebugMode::L_DISABLED;
  bool cuda_ = false;
#endif
};

// ---- what a graph holds: tensors by address, hyperparameters by value.

// A tensor and the address of its data when recorded.
struct Held {
  at::Tensor t;
  const void* data = nullptr;
  explicit Held(at::Tensor x = {})
      : t(std::move(x)), data(t.defined() ? t.data_ptr() : nullptr) {}
  // x is this tensor, with its data where it was
  bool same(const at::Tensor& x) const {
    if (!t.defined()) return !x.defined();
    return x.defined() && x.is_same(t) && x.data_ptr() == data;
  }
};

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "nothing";
  return c10::str(t.scalar_type(), " ", t.sizes(), " on ", t.device());
}

// The state tensors of a mixprec::optim param state, by name (its list:
// MIXPREC_ADAM_STATE, MIXPREC_SGD_STATE).
std::vector<std::pair<const char*, at::Tensor*>> state_slots(
    torch::optim::OptimizerParamState& s) {
  std::vector<std::pair<const char*, at::Tensor*>> out;
  const bool known = optim::options_table::visit_state(s, [&](auto& typed) {
    optim::options_table::for_each_state(
        typed,
        [&](const char* name, at::Tensor& t) { out.emplace_back(name, &t); });
  });
  TORCH_CHECK(known, kWho,
              "a param's optimizer state is not a mixprec::optim state");
  return out;
}

// A setting a graph bakes in, as (name, value shown in full precision); an
// option's name is written as Python indexes its group ("['eps']").
using Settings = std::vector<std::pair<std::string, std::string>>;

template <typename T>
std::string show(const T& v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}
std::string show(bool v) { return v ? "True" : "False"; }
std::string show(const std::optional<double>& v) {
  return v ? show(*v) : "None";
}
std::string show(const std::tuple<double, double>& v) {
  return c10::str("(", show(std::get<0>(v)), ", ", show(std::get<1>(v)), ")");
}

// The options a graph bakes in: every row of the options' list
// (api/options_table.h) but the live ones (kLive: lr, a device tensor
// filled before every call).
Settings baked_options(const torch::optim::OptimizerOptions& options) {
  Settings out;
  const bool known = optim::options_table::visit(options, [&](const auto& o) {
    optim::options_table::for_each_option(
        o, [&](const char* name, const auto& value, unsigned flags, auto) {
          if (flags & optim::options_flag::kLive) return;
          out.emplace_back(c10::str("['", name, "']"), show(value));
        });
  });
  TORCH_CHECK(known, kWho, "a param group has options of another optimizer");
  return out;
}

// Whether two values of an option are the same bits (-0.0 is not 0.0, as
// their shown forms differ).
template <typename T>
bool same_value(const T& a, const T& b) {
  return a == b;
}
bool same_value(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}
bool same_value(const std::tuple<double, double>& a,
                const std::tuple<double, double>& b) {
  return same_value(std::get<0>(a), std::get<0>(b)) &&
         same_value(std::get<1>(a), std::get<1>(b));
}

// Whether `now` holds the options `was` holds, but for the live ones: what
// baked_options compares, without building its text (the per-call check).
bool same_baked(const torch::optim::OptimizerOptions& was,
                const torch::optim::OptimizerOptions& now) {
  bool same = false;
  optim::options_table::visit(now, [&](const auto& n) {
    using O = std::decay_t<decltype(n)>;
    const auto* w = dynamic_cast<const O*>(&was);
    if (w == nullptr) return;
    same = true;
    optim::options_table::for_each_option_pair(
        *w, n, [&](const char*, const auto& a, const auto& b, unsigned flags) {
          if (!(flags & optim::options_flag::kLive) && !same_value(a, b)) {
            same = false;
          }
        });
  });
  return same;
}

// The scaler's settings a graph bakes in (capture_rules.h).
Settings scaler_settings(const GradScaler* s) {
  Settings out;
  if (s == nullptr) return out;
#define MIXPREC_SCALER_SETTING_ROW(name, accessor) \
  out.emplace_back(#name, show(s->accessor()));
  MIXPREC_FOR_EACH_SCALER_SETTING(MIXPREC_SCALER_SETTING_ROW)
#undef MIXPREC_SCALER_SETTING_ROW
  return out;
}

// c10::Error naming the first setting of `now` that differs from `was`;
// `where` prefixes its name.
void check_settings(const Settings& was, const Settings& now,
                    const std::string& where, const char* when) {
  for (size_t i = 0; i < was.size() && i < now.size(); ++i) {
    TORCH_CHECK(was[i] == now[i], kWho, "what the graph bakes in changed ",
                when, ": ", where, now[i].first, " ", was[i].second, " -> ",
                now[i].second,
                ". Build a new CapturedStep to change it (sharing the pool: "
                "CapturedStepOptions().pool(...))");
  }
}

std::string param_name(size_t k, size_t g, size_t j) {
  return c10::str("optimizers[", k, "].param_groups[", g, "]['params'][", j,
                  "]");
}

struct ParamRecord {
  Held param, grad;
  bool has_state = false;
  std::vector<std::pair<const char*, Held>> state;
};

struct OptimizerRecord {
  std::vector<size_t> group_sizes;
  std::vector<Settings> options;  // baked_options per group
  // each group's options, for the per-call check (same_baked)
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> option_values;
  std::vector<double> lrs;
  std::vector<ParamRecord> params;  // in group order
  uint64_t version = 0;             // FusedOptimizer::version()
};

// Everything the step's graph holds, at one moment.
struct Record {
  std::vector<OptimizerRecord> optimizers;
  Held scale;
  Settings scaler;
  uint64_t scaler_version = 0;  // GradScaler::settings_version()
};

// A captured tensor to put back where the step finds it (a grad dropped
// between calls), refilled first from the one there now (`copy`: a state
// tensor or grad replaced, e.g. by a checkpoint load).
struct Restore {
  at::Tensor* slot;
  at::Tensor captured;
  bool copy;
};

// c10::Error for an input that the static buffer `like` cannot take.
void check_input(size_t i, const at::Tensor& x, const at::Tensor& like) {
  TORCH_CHECK(x.defined(), kWho, "inputs[", i, "] is undefined");
  TORCH_CHECK(
      x.sizes() == like.sizes() && x.scalar_type() == like.scalar_type() &&
          x.device() == like.device(),
      kWho, "inputs[", i, "]: expected ", describe(like),
      " (as the example input), got ", describe(x),
      "; a step is captured for one input signature: another shape, dtype "
      "or device needs its own CapturedStep (sharing the pool: "
      "CapturedStepOptions().pool(...)), or pad the batch");
}

}  // namespace

// ================================================================ Impl
struct CapturedStep::Impl {
  StepFn fn;
  std::vector<at::Tensor> inputs;  // the static buffers
  std::vector<optim::FusedOptimizer*> optimizers;
  GradScaler* scaler = nullptr;
  int64_t warmup = 2;
  int64_t calls = 0;
  std::optional<Record> fixed;  // what the graph holds, from the checked call
  bool cuda = false;
  c10::Device device = c10::kCPU;
  at::Tensor loss;  // the graph's output
#if MIXPREC_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> side;
  c10::MempoolId_t pool{0, 0};
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  // the (param group, device) of each lr tensor the graph reads, per
  // optimizer (from the checked call)
  std::vector<std::vector<std::pair<size_t, c10::Device>>> lr_keys;

  Record record() const;
  std::vector<Restore> check_against(const Record& rec, const char* when,
                                     bool restorable);
  bool unchanged() const;
  void rebind();
  void fill_lr();
  at::Tensor run_eager();
  at::Tensor run_checked();
  at::Tensor capture_and_replay();
};

Record CapturedStep::Impl::record() const {
  Record rec;
  for (auto* opt : optimizers) {
    OptimizerRecord o;
    for (auto& group : opt->param_groups()) {
      o.group_sizes.push_back(group.params().size());
      o.options.push_back(baked_options(group.options()));
      o.option_values.push_back(group.options().clone());
      o.lrs.push_back(group.options().get_lr());
      for (auto& p : group.params()) {
        ParamRecord r;
        r.param = Held(p);
        r.grad = Held(p.grad());
        auto it = opt->state().find(p.unsafeGetTensorImpl());
        if (it != opt->state().end()) {
          r.has_state = true;
          for (const auto& [name, slot] : state_slots(*it->second)) {
            r.state.emplace_back(name, Held(*slot));
          }
        }
        o.params.push_back(std::move(r));
      }
    }
    o.version = opt->version();
    rec.optimizers.push_back(std::move(o));
  }
  if (scaler != nullptr) {
    rec.scale = Held(scaler->scale_tensor());
    rec.scaler_version = scaler->settings_version();
  }
  rec.scaler = scaler_settings(scaler);
  return rec;
}

// The live params, grads, optimizer state and options and the scaler against
// `rec`: c10::Error at the first difference the graph cannot follow. When
// `restorable` (before a call), a grad dropped since `rec` is put back, and a
// state tensor or grad replaced by one of the same shape, dtype and device (a
// checkpoint loaded between calls) is returned for copying back; otherwise
// (after the step) a replaced one is an error. A grad or state tensor `rec`
// does not hold (created by the step) is not checked.
std::vector<Restore> CapturedStep::Impl::check_against(const Record& rec,
                                                       const char* when,
                                                       bool restorable) {
  std::vector<Restore> restores;
  for (size_t k = 0; k < optimizers.size(); ++k) {
    auto* opt = optimizers[k];
    const OptimizerRecord& o = rec.optimizers[k];
    auto& groups = opt->param_groups();
    TORCH_CHECK(groups.size() == o.group_sizes.size(), kWho,
                "what the graph bakes in changed ", when, ": optimizers[", k,
                "] has ", groups.size(), " param groups, the graph ",
                o.group_sizes.size());
    size_t index = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto& params = groups[g].params();
      TORCH_CHECK(params.size() == o.group_sizes[g], kWho,
                  "what the graph bakes in changed ", when, ": optimizers[", k,
                  "].param_groups[", g, "] has ", params.size(),
                  " params, the graph ", o.group_sizes[g]);
      check_settings(o.options[g], baked_options(groups[g].options()),
                     c10::str("optimizers[", k, "].param_groups[", g, "]"),
                     when);
      for (size_t j = 0; j < params.size(); ++j, ++index) {
        const at::Tensor& p = params[j];
        const ParamRecord& r = o.params[index];
        const std::string where = param_name(k, g, j);
        TORCH_CHECK(r.param.same(p), kWho, where,
                    " is another tensor or in new storage ", when,
                    " (the graph holds the old address): load values into "
                    "params in place (copy_ under a NoGradGuard), not with "
                    "set_ / set_data / to()");
        if (r.grad.t.defined() && !r.grad.same(p.grad())) {
          const at::Tensor& now = p.grad();
          const bool fits = now.defined() && now.sizes() == r.grad.t.sizes() &&
                            now.scalar_type() == r.grad.t.scalar_type() &&
                            now.device() == r.grad.t.device();
          TORCH_CHECK(
              restorable && (fits || !now.defined()), kWho,
              restorable ? "" : "the step changes the storage of ", where,
              ".grad", restorable ? c10::str(" was replaced ", when) : "",
              " (zero_grad(set_to_none=True) in the step? use "
              "set_to_none=False: the graph accumulates into the old grad)");
          restores.push_back({&p.mutable_grad(), r.grad.t, now.defined()});
        }
        if (!r.has_state) continue;
        auto it = opt->state().find(p.unsafeGetTensorImpl());
        TORCH_CHECK(it != opt->state().end(), kWho, where,
                    " has no optimizer state ", when,
                    " (the graph updates the state it was captured with)");
        const auto slots = state_slots(*it->second);
        TORCH_CHECK(slots.size() == r.state.size(), kWho, where,
                    "'s optimizer state is of another optimizer ", when);
        for (size_t m = 0; m < slots.size(); ++m) {
          const Held& held = r.state[m].second;
          const at::Tensor& now = *slots[m].second;
          if (held.same(now)) continue;
          const bool fits = held.t.defined() && now.defined() &&
                            held.t.data_ptr() == held.data &&
                            now.sizes() == held.t.sizes() &&
                            now.scalar_type() == held.t.scalar_type() &&
                            now.device() == held.t.device();
          TORCH_CHECK(fits, kWho, where, " state['", r.state[m].first,
                      "'] was ", describe(held.t), " and is now ",
                      describe(now), " (", when,
                      "); the graph holds the old tensor: load a checkpoint "
                      "of the same layout");
          TORCH_CHECK(restorable, kWho, "the step changes the storage of ",
                      where, " state['", r.state[m].first,
                      "'] (a tensor rebuilt instead of updated in place)");
          restores.push_back({slots[m].second, held.t, true});
        }
      }
    }
  }
  if (scaler != nullptr) {
    TORCH_CHECK(
        !rec.scale.t.defined() || rec.scale.same(scaler->scale_tensor()), kWho,
        "the scaler's scale tensor is another tensor ", when,
        " (the graph holds the old one)");
    check_settings(rec.scaler, scaler_settings(scaler), "scaler.", when);
  }
  return restores;
}

// The per-call check, O(param groups): whether, as far as it can tell
// without visiting every param, everything `fixed` holds is where it was.
// False when an optimizer's version() or the scaler's settings_version()
// moved (a load, an added group, a setter), a group count, param count or
// baked option differs, or a group's first param or its grad is another
// tensor or in new storage (a grad dropped by zero_grad(), a param set_ to
// new storage). Not seen here (the full walk sees them): a later param of a
// group in new storage, its grad dropped alone, state replaced through
// state() by hand.
bool CapturedStep::Impl::unchanged() const {
  const Record& rec = *fixed;
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const auto* opt = optimizers[k];
    const OptimizerRecord& o = rec.optimizers[k];
    if (opt->version() != o.version) return false;
    const auto& groups = opt->param_groups();
    if (groups.size() != o.group_sizes.size()) return false;
    size_t first = 0;  // the group's first param in o.params
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      if (params.size() != o.group_sizes[g]) return false;
      if (!same_baked(*o.option_values[g], groups[g].options())) return false;
      if (!params.empty()) {
        const ParamRecord& r = o.params[first];
        if (!r.param.same(params[0])) return false;
        if (r.grad.t.defined() && !r.grad.same(params[0].grad())) return false;
      }
      first += params.size();
    }
  }
  if (scaler != nullptr) {
    if (scaler->settings_version() != rec.scaler_version) return false;
    if (rec.scale.t.defined() && !rec.scale.same(scaler->scale_tensor())) {
      return false;
    }
  }
  return true;
}

// The full walk between calls (check_against every param, grad and state
// tensor), then its restores; then the per-call check's baseline (versions,
// options) is brought up to date. c10::Error before any write.
void CapturedStep::Impl::rebind() {
  const std::vector<Restore> restores =
      check_against(*fixed, "since the checked call", /*restorable=*/true);
  {
    at::NoGradGuard no_grad;
    for (const auto& r : restores) {
      if (r.copy) r.captured.copy_(*r.slot);  // a checkpoint's values
      *r.slot = r.captured;
    }
  }
  for (size_t k = 0; k < optimizers.size(); ++k) {
    OptimizerRecord& o = fixed->optimizers[k];
    o.version = optimizers[k]->version();
    const auto& groups = optimizers[k]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      o.option_values[g] = groups[g].options().clone();
    }
  }
  if (scaler != nullptr) fixed->scaler_version = scaler->settings_version();
}

// Each param group's lr into the device tensor the fused kernels read: after
// the checked call only those the graph reads (O(param groups)), before it
// every one (lr_tensors()).
void CapturedStep::Impl::fill_lr() {
  at::NoGradGuard no_grad;
  if (!fixed) {
    for (auto* opt : optimizers) opt->lr_tensors();
    return;
  }
  for (size_t k = 0; k < optimizers.size(); ++k) {
    for (const auto& [group, device] : lr_keys[k]) {
      optimizers[k]->lr_tensor(group, device);
    }
  }
}

at::Tensor CapturedStep::Impl::run_eager() {
#if MIXPREC_WITH_CUDA_KERNELS
  if (cuda) {
    // on a side stream, ordered after the current stream's work and before
    // its next (as torch.cuda.graph's warm-up)
    c10::cuda::CUDAGuard device_guard(device);
    const auto current = c10::cuda::getCurrentCUDAStream(device.index());
    c10::cuda::CUDAEvent before;
    before.record(current);
    before.block(*side);
    at::Tensor loss;
    {
      c10::cuda::CUDAStreamGuard stream_guard(*side);
      loss = fn(inputs);
    }
    c10::cuda::CUDAEvent after;
    after.record(*side);
    after.block(current);
    return loss;
  }
#endif
  return fn(inputs);
}

at::Tensor CapturedStep::Impl::run_checked() {
  Record before = record();
  std::vector<std::string> syncs;
  at::Tensor loss;
  {
    SyncWatch watch(syncs, cuda);
    loss = run_eager();
  }
  TORCH_CHECK(
      syncs.empty(), kWho,
      "the step syncs with the host: ", syncs.empty() ? "" : syncs.front(),
      " (", syncs.size(),
      " op(s) in all). A CUDA graph cannot capture a host read (capture "
      "fails, or the value read at capture is replayed forever). "
      "GradScaler::step() returns whether the step ran, which reads the inf "
      "flag: call scaler.step_no_sync(opt) in the step; .item(), "
      "bool(tensor), printing a tensor, nonzero() and boolean-mask indexing "
      "read the device too");
  if (scaler != nullptr) {
    for (auto* opt : optimizers) {
      TORCH_CHECK(scaler->stage(*opt) == OptState::READY, kWho,
                  "the step leaves the scaler's iteration open; end the step "
                  "body with scaler.update()");
    }
  }
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const auto& groups = optimizers[k]->param_groups();
    for (size_t g = 0; g < groups.size() && g < before.optimizers[k].lrs.size();
         ++g) {
      TORCH_CHECK(groups[g].options().get_lr() == before.optimizers[k].lrs[g],
                  kWho, "the step changes optimizers[", k, "].param_groups[", g,
                  "]['lr'] (an LR scheduler stepped inside the step?): host "
                  "code a replay does not run. Set the lr between calls: "
                  "CapturedStep writes it into the graph");
    }
  }
  check_against(before, "after the step", /*restorable=*/false);
  fixed = record();  // (with what the step created: state, grads, scale)
  lr_keys.clear();
  for (auto* opt : optimizers) {
    std::vector<std::pair<size_t, c10::Device>> keys;
    const auto& groups = opt->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const size_t from = keys.size();
      for (const auto& p : groups[g].params()) {
        const auto seen = std::find_if(
            keys.begin() + from, keys.end(),
            [&](const auto& key) { return key.second == p.device(); });
        if (seen == keys.end()) keys.emplace_back(g, p.device());
      }
    }
    lr_keys.push_back(std::move(keys));
  }
  return loss;
}

at::Tensor CapturedStep::Impl::capture_and_replay() {
#if MIXPREC_WITH_CUDA_KERNELS
  c10::cuda::CUDAGuard device_guard(device);
  const auto current = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAEvent before;
  before.record(current);
  before.block(*side);
  if (pool == c10::MempoolId_t{0, 0}) pool = at::cuda::graph_pool_handle();
  auto captured = std::make_unique<at::cuda::CUDAGraph>();
  {
    c10::cuda::CUDAStreamGuard stream_guard(*side);
    captured->capture_begin(pool);
    try {
      loss = fn(inputs);
    } catch (...) {
      try {
        captured->capture_end();
      } catch (...) {  // the step's error is the one to report
      }
      throw;
    }
    captured->capture_end();
  }
  c10::cuda::CUDAEvent after;
  after.record(*side);
  after.block(current);
  TORCH_CHECK(loss.defined(), kWho, "the step must return the loss");
  loss = loss.detach();
  graph = std::move(captured);
  check_against(*fixed, "after capture", /*restorable=*/false);
  graph->replay();
  return loss.clone();
#else
  TORCH_INTERNAL_ASSERT(false, "capture without CUDA kernels");
#endif
}

// ================================================================ public
CapturedStep::CapturedStep(StepFn step,
                           const std::vector<at::Tensor>& example_inputs,
                           std::vector<torch::optim::Optimizer*> optimizers,
                           GradScaler* scaler, CapturedStepOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  TORCH_CHECK(step, kWho, "the step is empty");
  TORCH_CHECK_VALUE(options.warmup() >= 0, kWho, "warmup must be >= 0, got ",
                    options.warmup());
  TORCH_CHECK_VALUE(!optimizers.empty(), kWho,
                    "give the optimizers the step steps");
  std::vector<at::Tensor> tensors;
  for (size_t k = 0; k < optimizers.size(); ++k) {
    TORCH_CHECK_VALUE(optimizers[k] != nullptr, kWho, "optimizers[", k,
                      "] is null");
    auto* fused = dynamic_cast<optim::FusedOptimizer*>(optimizers[k]);
    TORCH_CHECK_VALUE(
        fused != nullptr, kWho, "optimizers[", k,
        "] is not a mixprec::optim optimizer: torch::optim's C++ optimizers "
        "count steps and compute their bias corrections on the host, which a "
        "graph would replay frozen");
    for (const auto& g : fused->param_groups()) {
      (void)baked_options(g.options());  // (throws for foreign options)
      for (const auto& p : g.params()) tensors.push_back(p);
    }
    s.optimizers.push_back(fused);
  }
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    TORCH_CHECK_VALUE(example_inputs[i].defined(), kWho, "example_inputs[", i,
                      "] is undefined");
    tensors.push_back(example_inputs[i]);
  }
  for (const auto& t : tensors) {
    if (t.is_cuda() && !s.cuda) {
      s.cuda = true;
      s.device = t.device();
    }
  }
  if (s.cuda) {
#if MIXPREC_WITH_CUDA_KERNELS
    for (const auto& t : tensors) {
      TORCH_CHECK_VALUE(t.device() == s.device, kWho,
                        "a captured step runs on one CUDA device: the params "
                        "and inputs are on ",
                        s.device, " and ", t.device());
    }
    s.side = c10::cuda::getStreamFromPool(false, s.device.index());
    s.pool = options.pool();
#else
    TORCH_CHECK(false, kWho,
                "this libmixprec was built without CUDA kernels; it cannot "
                "run or capture a CUDA step");
#endif
  }
  for (const auto& x : example_inputs) {
    s.inputs.push_back(at::empty_like(x));
  }
  s.fn = std::move(step);
  s.scaler = scaler;
  s.warmup = options.warmup();
}

CapturedStep::~CapturedStep() = default;

int64_t CapturedStep::calls() const { return impl_->calls; }

void CapturedStep::rebind() {
  if (impl_->fixed) impl_->rebind();
}

bool CapturedStep::graphed() const {
#if MIXPREC_WITH_CUDA_KERNELS
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

at::Tensor CapturedStep::operator()(const std::vector<at::Tensor>& inputs) {
  Impl& s = *impl_;
  // Every check before any write.
  TORCH_CHECK(inputs.size() == s.inputs.size(), kWho, "expected ",
              s.inputs.size(), " inputs (as the example), got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(i, inputs[i], s.inputs[i]);
  }
  for (auto type : {c10::DeviceType::CUDA, c10::DeviceType::CPU}) {
    TORCH_CHECK(!at::autocast::is_autocast_enabled(type) ||
                    !at::autocast::is_autocast_cache_enabled(),
                kWho,
                "called inside an autocast region with its cast cache on: "
                "the weights' casts made at capture would outlive the graph; "
                "open the region inside the step");
  }
  // the full walk (its checks, then its restores) only when the per-call
  // check sees a change
  if (s.fixed && !s.unchanged()) s.rebind();
  s.fill_lr();
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      s.inputs[i].copy_(inputs[i]);
    }
  }
  at::Tensor loss;
  if (s.calls < s.warmup) {
    loss = s.run_eager();
  } else if (s.calls == s.warmup) {
    loss = s.run_checked();
  } else if (!s.cuda) {
    loss = s.run_eager();
  } else {
#if MIXPREC_WITH_CUDA_KERNELS
    if (s.graph == nullptr) {
      loss = s.capture_and_replay();
    } else {
      s.graph->replay();
      loss = s.loss.clone();
    }
#endif
  }
  TORCH_CHECK(loss.defined(), kWho, "the step must return the loss");
  ++s.calls;
  return loss.detach();
}

}  // namespace mixprec
