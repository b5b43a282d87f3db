#include "common/optim_args.h"

#include "common/checks.h"
#include "common/quant8_math.h"

#include "common/tensor.h"

#include <cmath>

namespace mixprec {
namespace optim {
namespace {

bool is_param_dtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Half ||
         t == ScalarType::BFloat16;
}

void check_scalar(const char* op, const char* name, const Tensor& t,
                  const Device& device, bool allow_double) {
  checks::check_scalar_tensor(
      op, name, t, ScalarType::Float, device, "params",
      allow_double ? ScalarType::Double : ScalarType::Undefined);
}

void check_member(const char* op, const char* name, size_t i, const Tensor& t,
                  const Tensor& param, const Device& device, bool written) {
  MIXPREC_CHECK(t.defined(), "mixprec.", op, ": ", name, "[", i,
                "] is undefined");
  MIXPREC_CHECK(t.layout() == Layout::Strided, "mixprec.", op, ": ", name, "[",
                i, "] must be a dense (strided) tensor, got layout ",
                t.layout(), "; sparse gradients are not supported");
  MIXPREC_CHECK(t.device() == device, "mixprec.", op, ": ", name, "[", i,
                "] is on ", t.device(), " but params[0] is on ", device,
                "; call the op once per device");
  MIXPREC_CHECK(checks::same_dims(t.sizes(), param.sizes()), "mixprec.", op,
                ": ", name, "[", i, "] has shape ", t.sizes(), " but params[",
                i, "] has shape ", param.sizes());
  if (written && !is_dense(t)) {  // (dense: no overlap)
    MIXPREC_CHECK(!has_internal_overlap(t), "mixprec.", op, ": ", name, "[", i,
                  "] has internal overlap (e.g. an expanded tensor), so an "
                  "in-place update would write an element more than once");
  }
}

}  // namespace

void check_optim_args(const OptimLists& lists,
                      const std::vector<bool>& state_required,
                      const OptimScalars& scalars, bool stochastic_rounding,
                      DeviceType backend, bool each_param) {
  MIXPREC_INTERNAL_ASSERT(lists.op != nullptr);
  const char* op = lists.op;
  const size_t n = lists.params.size();
  MIXPREC_CHECK(lists.grads.size() == n, "mixprec.", op, ": grads has ",
                lists.grads.size(), " tensors but params has ", n);
  MIXPREC_INTERNAL_ASSERT(state_required.size() == lists.states.size());
  for (size_t s = 0; s < lists.states.size(); ++s) {
    const char* name = lists.states[s].name;
    const TensorList list = lists.states[s].list;
    const size_t want = state_required[s] ? n : 0;
    MIXPREC_CHECK(list.size() == want, "mixprec.", op, ": ", name,
                  " must have ", want, " tensors (",
                  state_required[s]
                      ? "one per param"
                      : "empty unless the option that uses it is on",
                  "), got ", list.size());
    if (lists.states[s].coded) {
      MIXPREC_CHECK(lists.states[s].absmax.size() == want, "mixprec.", op, ": ",
                    lists.states[s].absmax_name, " must have ", want,
                    " tensors (one per param), got ",
                    lists.states[s].absmax.size());
    }
  }
  MIXPREC_CHECK(lists.master_params.empty() || lists.master_params.size() == n,
                "mixprec.", op,
                ": master_params must be empty or have one "
                "tensor per param (",
                n, "), got ", lists.master_params.size());
  MIXPREC_CHECK(!lists.sr_bases.has_value() || lists.sr_bases->size() == n,
                "mixprec.", op,
                ": sr_bases must be None or have one number per "
                "param (",
                n, "), got ",
                lists.sr_bases.has_value() ? lists.sr_bases->size() : 0);
  MIXPREC_CHECK(lists.state_steps.size() == n, "mixprec.", op,
                ": state_steps has ", lists.state_steps.size(),
                " tensors but params has ", n);
  const bool masters = !lists.master_params.empty();
  MIXPREC_CHECK(!(stochastic_rounding && masters), "mixprec.", op,
                ": stochastic_rounding applies to bfloat16 params updated in "
                "place; it cannot be combined with master_params");

  const Tensor& lr = *scalars.lr;
  MIXPREC_CHECK(lr.defined(), "mixprec.", op, ": lr is undefined");
  // The device of the call: params[0]'s, or lr's when there are no params.
  const Device device = n > 0 ? lists.params[0].device() : lr.device();
  MIXPREC_CHECK(device.type() == backend, "mixprec.", op, ": params must be ",
                device_str(backend), " tensors for this kernel, got ", device);
  check_scalar(op, "lr", lr, device, /*allow_double=*/true);
  if (scalars.grad_scale->has_value()) {
    check_scalar(op, "grad_scale", **scalars.grad_scale, device, false);
  }
  if (scalars.found_inf->has_value()) {
    check_scalar(op, "found_inf", **scalars.found_inf, device, false);
  }
  if (scalars.clip_coef->has_value()) {
    check_scalar(op, "clip_coef", **scalars.clip_coef, device, false);
  }

  checks::check_disjoint(op, "params", lists.params);
  for (const StateList& st : lists.states) {
    checks::check_disjoint(op, st.name, st.list);
  }
  checks::check_disjoint(op, "master_params", lists.master_params);
  if (each_param) {
    for (size_t i = 0; i < n; ++i) {
      check_optim_param(lists, i, device);
    }
  }
}

void check_optim_param(const OptimLists& lists, size_t i,
                       const Device& device) {
  const char* op = lists.op;
  const bool masters = !lists.master_params.empty();
  {
    const Tensor& p = lists.params[i];
    MIXPREC_CHECK(p.defined(), "mixprec.", op, ": params[", i,
                  "] is undefined");
    MIXPREC_CHECK(is_param_dtype(p.scalar_type()), "mixprec.", op, ": params[",
                  i, "] must be float32, float16 or bfloat16, got ",
                  p.scalar_type());
    check_member(op, "params", i, p, p, device, true);
    const Tensor& g = lists.grads[i];
    check_member(op, "grads", i, g, p, device, false);
    MIXPREC_CHECK(is_param_dtype(g.scalar_type()), "mixprec.", op, ": grads[",
                  i, "] must be float32, float16 or bfloat16, got ",
                  g.scalar_type());
    for (const StateList& st : lists.states) {
      if (st.list.empty()) {
        continue;
      }
      const Tensor& x = st.list[i];
      check_member(op, st.name, i, x, p, device, true);
      if (!st.coded) {
        MIXPREC_CHECK(x.scalar_type() == ScalarType::Float, "mixprec.", op,
                      ": ", st.name, "[", i, "] must be float32, got ",
                      x.scalar_type());
        continue;
      }
      MIXPREC_CHECK(x.scalar_type() == ScalarType::Byte && x.is_contiguous(),
                    "mixprec.", op, ": ", st.name, "[", i,
                    "] must be contiguous uint8 codes, got ", x.scalar_type(),
                    x.is_contiguous() ? "" : " (not contiguous)");
      const Tensor& a = st.absmax[i];
      const std::vector<int64_t> want_v =
          q8::absmax_sizes<std::vector<int64_t>>(p.sizes().data(), p.dim());
      const IntArrayRef want(want_v);
      MIXPREC_CHECK(a.defined() && a.layout() == Layout::Strided &&
                        a.scalar_type() == ScalarType::Float &&
                        checks::same_dims(a.sizes(), want) && a.is_contiguous(),
                    "mixprec.", op, ": ", st.absmax_name, "[", i,
                    "] must be a contiguous float32 tensor of shape ", want,
                    " (one per block of up to ", q8::kBlock,
                    " elements of each row of params[", i, "]), got ",
                    a.defined() ? dtype_str(a.scalar_type()) : "undefined",
                    " of shape ", a.defined() ? a.sizes() : IntArrayRef{});
      MIXPREC_CHECK(a.device() == device, "mixprec.", op, ": ", st.absmax_name,
                    "[", i, "] is on ", a.device(), " but params[0] is on ",
                    device);
    }
    if (masters) {
      const Tensor& mp = lists.master_params[i];
      check_member(op, "master_params", i, mp, p, device, true);
      const ScalarType mt = mp.scalar_type();
      MIXPREC_CHECK(mt == ScalarType::Float || mt == ScalarType::Short ||
                        mt == ScalarType::Char,
                    "mixprec.", op, ": master_params[", i,
                    "] must be float32 (a float32 master) or int16 / int8 "
                    "(the correction of a split master of a bfloat16 param), "
                    "got ",
                    mt);
      const Tensor& m0 = lists.master_params[0];
      MIXPREC_CHECK(!m0.defined() || mt == m0.scalar_type(), "mixprec.", op,
                    ": master_params[", i, "] is ", mt,
                    " but master_params[0] is ", m0.scalar_type(),
                    "; every master of one call has one dtype (call the op "
                    "once per master form)");
      MIXPREC_CHECK(p.scalar_type() != ScalarType::Float, "mixprec.", op,
                    ": params[", i,
                    "] is float32 and needs no master copy; pass float32 "
                    "params in a call without master_params");
      MIXPREC_CHECK(
          mt == ScalarType::Float || p.scalar_type() == ScalarType::BFloat16,
          "mixprec.", op, ": master_params[", i, "] is ", mt,
          " (a split-master correction) but params[", i, "] is ",
          p.scalar_type(),
          "; split masters need bfloat16 params (use float32 "
          "master_params for float16 params)");
    }
    const Tensor& st = lists.state_steps[i];
    MIXPREC_CHECK(st.defined(), "mixprec.", op, ": state_steps[", i,
                  "] is undefined");
    MIXPREC_CHECK(st.scalar_type() == ScalarType::Float && st.numel() == 1 &&
                      st.layout() == Layout::Strided,
                  "mixprec.", op, ": state_steps[", i,
                  "] must be a one-element float32 tensor, got ",
                  st.scalar_type(), " of shape ", st.sizes());
    MIXPREC_CHECK(st.device() == device, "mixprec.", op, ": state_steps[", i,
                  "] is on ", st.device(), " but params[0] is on ", device);
  }
}

void check_adam_hparams(double beta1, double beta2, double weight_decay,
                        double eps, const char* op) {
  MIXPREC_CHECK(beta1 >= 0.0 && beta1 < 1.0, "mixprec.", op,
                ": beta1 must be in [0, 1), got ", beta1);
  MIXPREC_CHECK(beta2 >= 0.0 && beta2 < 1.0, "mixprec.", op,
                ": beta2 must be in [0, 1), got ", beta2);
  MIXPREC_CHECK(weight_decay >= 0.0 && std::isfinite(weight_decay), "mixprec.",
                op, ": weight_decay must be a finite number >= 0, got ",
                weight_decay);
  MIXPREC_CHECK(eps >= 0.0 && std::isfinite(eps), "mixprec.", op,
                ": eps must be a finite number >= 0, got ", eps);
}

void check_sgd8_momentum(double momentum) {
  MIXPREC_CHECK(
      momentum > 0.0 && std::isfinite(momentum),
      "mixprec.fused_sgd8_: momentum must be a finite number > 0 (the "
      "8-bit state is the momentum buffer; without momentum call "
      "fused_sgd_), got ",
      momentum);
}

void check_sgd_hparams(double weight_decay, double momentum, double dampening,
                       bool nesterov, const char* op) {
  MIXPREC_CHECK(weight_decay >= 0.0 && std::isfinite(weight_decay), "mixprec.",
                op, ": weight_decay must be a finite number >= 0, got ",
                weight_decay);
  MIXPREC_CHECK(momentum >= 0.0 && std::isfinite(momentum), "mixprec.", op,
                ": momentum must be a finite number >= 0, got ", momentum);
  MIXPREC_CHECK(std::isfinite(dampening), "mixprec.", op,
                ": dampening must be finite, got ", dampening);
  MIXPREC_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0), "mixprec.",
                op,
                ": nesterov requires momentum > 0 and dampening == 0 (got "
                "momentum ",
                momentum, ", dampening ", dampening, ")");
}

FlatSet::FlatSet(const OptimLists& in) {
  // params, grads, the states in use, the masters; all but grads written
  std::vector<TensorList> lists{in.params, in.grads};
  std::vector<bool> written{true, false};
  for (const StateList& state : in.states) {
    const TensorList list = state.list;
    state_view.push_back(list.empty() ? -1 : static_cast<int>(lists.size()));
    if (!list.empty()) {
      lists.push_back(list);
      written.push_back(true);
    }
  }
  if (!in.master_params.empty()) {
    master_view = static_cast<int>(lists.size());
    lists.push_back(in.master_params);
    written.push_back(true);
  }
  views.resize(lists.size());
  const size_t n = in.params.size();
  for (auto& v : views) {
    v.reserve(n);
  }
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = lists[0][i];
    bool direct = is_dense(p);
    for (size_t l = 1; l < lists.size() && direct; ++l) {
      const Tensor& t = lists[l][i];
      direct = is_dense(t) && checks::same_dims(t.strides(), p.strides());
    }
    for (size_t l = 0; l < lists.size(); ++l) {
      const Tensor& t = lists[l][i];
      if (direct) {
        views[l].push_back(&t);
      } else {
        owned.push_back(dense_copy(t));
        if (written[l] && owned.back().data_ptr() != t.data_ptr()) {
          copy_back.emplace_back(t, owned.back());
        }
        views[l].push_back(&owned.back());
      }
    }
  }
}

void FlatSet::finish() {
  for (auto& pr : copy_back) {
    copy_into(pr.first, pr.second);
  }
}

bool found_inf_cpu(const std::optional<Tensor>& found_inf) {
  return found_inf.has_value() &&
         found_inf->mutable_data_ptr<float>()[0] != 0.0f;
}

double read_lr_cpu(const Tensor& lr) {
  return lr.scalar_type() == ScalarType::Double
             ? lr.mutable_data_ptr<double>()[0]
             : static_cast<double>(lr.mutable_data_ptr<float>()[0]);
}

}  // namespace optim
}  // namespace mixprec
