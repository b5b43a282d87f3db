#include "common/optim_args.h"

#include "common/checks.h"
#include "common/quant8_math.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace mixprec {
namespace optim {
namespace {

bool is_param_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

void check_scalar(const char* op, const char* name, const at::Tensor& t,
                  const c10::Device& device, bool allow_double) {
  checks::check_scalar_tensor(
      op, name, t, at::kFloat, device, "params",
      allow_double ? at::kDouble : c10::ScalarType::Undefined);
}

void check_member(const char* op, const char* name, size_t i,
                  const at::Tensor& t, const at::Tensor& param,
                  const c10::Device& device, bool written) {
  TORCH_CHECK(t.defined(), "mixprec.", op, ": ", name, "[", i,
              "] is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, "mixprec.", op, ": ", name, "[", i,
              "] must be a dense (strided) tensor, got layout ", t.layout(),
              "; sparse gradients are not supported");
  TORCH_CHECK(t.device() == device, "mixprec.", op, ": ", name, "[", i,
              "] is on ", t.device(), " but params[0] is on ", device,
              "; call the op once per device");
  TORCH_CHECK(checks::same_dims(t.sizes(), param.sizes()), "mixprec.", op, ": ",
              name, "[", i, "] has shape ", t.sizes(), " but params[", i,
              "] has shape ", param.sizes());
  if (written && !t.is_non_overlapping_and_dense()) {  // (dense: no overlap)
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "mixprec.",
                op, ": ", name, "[", i,
                "] has internal overlap (e.g. an expanded tensor), so an "
                "in-place update would write an element more than once");
  }
}

}  // namespace

void check_optim_args(const OptimLists& lists,
                      const std::vector<bool>& state_required,
                      const OptimScalars& scalars, bool stochastic_rounding,
                      c10::DeviceType backend, bool each_param) {
  TORCH_INTERNAL_ASSERT(lists.op != nullptr);
  const char* op = lists.op;
  const size_t n = lists.params.size();
  TORCH_CHECK(lists.grads.size() == n, "mixprec.", op, ": grads has ",
              lists.grads.size(), " tensors but params has ", n);
  TORCH_INTERNAL_ASSERT(state_required.size() == lists.states.size());
  for (size_t s = 0; s < lists.states.size(); ++s) {
    const char* name = lists.states[s].name;
    const at::TensorList list = lists.states[s].list;
    const size_t want = state_required[s] ? n : 0;
    TORCH_CHECK(list.size() == want, "mixprec.", op, ": ", name, " must have ",
                want, " tensors (",
                state_required[s]
                    ? "one per param"
                    : "empty unless the option that uses it is on",
                "), got ", list.size());
    if (lists.states[s].coded) {
      TORCH_CHECK(lists.states[s].absmax.size() == want, "mixprec.", op, ": ",
                  lists.states[s].absmax_name, " must have ", want,
                  " tensors (one per param), got ",
                  lists.states[s].absmax.size());
    }
  }
  TORCH_CHECK(lists.master_params.empty() || lists.master_params.size() == n,
              "mixprec.", op,
              ": master_params must be empty or have one "
              "tensor per param (",
              n, "), got ", lists.master_params.size());
  TORCH_CHECK(!lists.sr_bases.has_value() || lists.sr_bases->size() == n,
              "mixprec.", op,
              ": sr_bases must be None or have one number per "
              "param (",
              n, "), got ",
              lists.sr_bases.has_value() ? lists.sr_bases->size() : 0);
  TORCH_CHECK(lists.state_steps.size() == n, "mixprec.", op,
              ": state_steps has ", lists.state_steps.size(),
              " tensors but params has ", n);
  const bool masters = !lists.master_params.empty();
  TORCH_CHECK(!(stochastic_rounding && masters), "mixprec.", op,
              ": stochastic_rounding applies to bfloat16 params updated in "
              "place; it cannot be combined with master_params");

  const at::Tensor& lr = *scalars.lr;
  TORCH_CHECK(lr.defined(), "mixprec.", op, ": lr is undefined");
  // The device of the call: params[0]'s, or lr's when there are no params.
  const c10::Device device = n > 0 ? lists.params[0].device() : lr.device();
  TORCH_CHECK(device.type() == backend, "mixprec.", op, ": params must be ",
              c10::DeviceTypeName(backend, /*lower_case=*/true),
              " tensors for this kernel, got ", device);
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
                       const c10::Device& device) {
  const char* op = lists.op;
  const bool masters = !lists.master_params.empty();
  {
    const at::Tensor& p = lists.params[i];
    TORCH_CHECK(p.defined(), "mixprec.", op, ": params[", i, "] is undefined");
    TORCH_CHECK(is_param_dtype(p.scalar_type()), "mixprec.", op, ": params[", i,
                "] must be float32, float16 or bfloat16, got ",
                p.scalar_type());
    check_member(op, "params", i, p, p, device, true);
    const at::Tensor& g = lists.grads[i];
    check_member(op, "grads", i, g, p, device, false);
    TORCH_CHECK(is_param_dtype(g.scalar_type()), "mixprec.", op, ": grads[", i,
                "] must be float32, float16 or bfloat16, got ",
                g.scalar_type());
    for (const StateList& st : lists.states) {
      if (st.list.empty()) {
        continue;
      }
      const at::Tensor& x = st.list[i];
      check_member(op, st.name, i, x, p, device, true);
      if (!st.coded) {
        TORCH_CHECK(x.scalar_type() == at::kFloat, "mixprec.", op, ": ",
                    st.name, "[", i, "] must be float32, got ",
                    x.scalar_type());
        continue;
      }
      TORCH_CHECK(x.scalar_type() == at::kByte && x.is_contiguous(), "mixprec.",
                  op, ": ", st.name, "[", i,
                  "] must be contiguous uint8 codes, got ", x.scalar_type(),
                  x.is_contiguous() ? "" : " (not contiguous)");
      const at::Tensor& a = st.absmax[i];
      const std::vector<int64_t> want_v =
          q8::absmax_sizes<std::vector<int64_t>>(p.sizes().data(), p.dim());
      const at::IntArrayRef want(want_v);
      TORCH_CHECK(a.defined() && a.layout() == at::kStrided &&
                      a.scalar_type() == at::kFloat && a.sizes() == want &&
                      a.is_contiguous(),
                  "mixprec.", op, ": ", st.absmax_name, "[", i,
                  "] must be a contiguous float32 tensor of shape ", want,
                  " (one per block of up to ", q8::kBlock,
                  " elements of each row of params[", i, "]), got ",
                  a.defined() ? c10::toString(a.scalar_type()) : "undefined",
                  " of shape ", a.defined() ? a.sizes() : at::IntArrayRef{});
      TORCH_CHECK(a.device() == device, "mixprec.", op, ": ", st.absmax_name,
                  "[", i, "] is on ", a.device(), " but params[0] is on ",
                  device);
    }
    if (masters) {
      const at::Tensor& mp = lists.master_params[i];
      check_member(op, "master_params", i, mp, p, device, true);
      TORCH_CHECK(mp.scalar_type() == at::kFloat, "mixprec.", op,
                  ": master_params[", i, "] must be float32, got ",
                  mp.scalar_type());
      TORCH_CHECK(p.scalar_type() != at::kFloat, "mixprec.", op, ": params[", i,
                  "] is float32 and needs no master copy; pass float32 "
                  "params in a call without master_params");
    }
    const at::Tensor& st = lists.state_steps[i];
    TORCH_CHECK(st.defined(), "mixprec.", op, ": state_steps[", i,
                "] is undefined");
    TORCH_CHECK(st.scalar_type() == at::kFloat && st.numel() == 1 &&
                    st.layout() == at::kStrided,
                "mixprec.", op, ": state_steps[", i,
                "] must be a one-element float32 tensor, got ",
                st.scalar_type(), " of shape ", st.sizes());
    TORCH_CHECK(st.device() == device, "mixprec.", op, ": state_steps[", i,
                "] is on ", st.device(), " but params[0] is on ", device);
  }
}

void check_adam_hparams(double beta1, double beta2, double weight_decay,
                        double eps, const char* op) {
  TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, "mixprec.", op,
              ": beta1 must be in [0, 1), got ", beta1);
  TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, "mixprec.", op,
              ": beta2 must be in [0, 1), got ", beta2);
  TORCH_CHECK(weight_decay >= 0.0 && std::isfinite(weight_decay), "mixprec.",
              op, ": weight_decay must be a finite number >= 0, got ",
              weight_decay);
  TORCH_CHECK(eps >= 0.0 && std::isfinite(eps), "mixprec.", op,
              ": eps must be a finite number >= 0, got ", eps);
}

void check_sgd8_momentum(double momentum) {
  TORCH_CHECK(momentum > 0.0 && std::isfinite(momentum),
              "mixprec.fused_sgd8_: momentum must be a finite number > 0 (the "
              "8-bit state is the momentum buffer; without momentum call "
              "fused_sgd_), got ",
              momentum);
}

void check_sgd_hparams(double weight_decay, double momentum, double dampening,
                       bool nesterov, const char* op) {
  TORCH_CHECK(weight_decay >= 0.0 && std::isfinite(weight_decay), "mixprec.",
              op, ": weight_decay must be a finite number >= 0, got ",
              weight_decay);
  TORCH_CHECK(momentum >= 0.0 && std::isfinite(momentum), "mixprec.", op,
              ": momentum must be a finite number >= 0, got ", momentum);
  TORCH_CHECK(std::isfinite(dampening), "mixprec.", op,
              ": dampening must be finite, got ", dampening);
  TORCH_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0), "mixprec.", op,
              ": nesterov requires momentum > 0 and dampening == 0 (got "
              "momentum ",
              momentum, ", dampening ", dampening, ")");
}

FlatSet::FlatSet(const OptimLists& in) {
  // params, grads, the states in use, the masters; all but grads written
  std::vector<at::TensorList> lists{in.params, in.grads};
  std::vector<bool> written{true, false};
  for (const StateList& state : in.states) {
    const at::TensorList list = state.list;
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
    const at::Tensor& p = lists[0][i];
    bool direct = p.is_non_overlapping_and_dense();
    for (size_t l = 1; l < lists.size() && direct; ++l) {
      const at::Tensor& t = lists[l][i];
      direct = t.is_non_overlapping_and_dense() && t.strides() == p.strides();
    }
    for (size_t l = 0; l < lists.size(); ++l) {
      const at::Tensor& t = lists[l][i];
      if (direct) {
        views[l].push_back(&t);
      } else {
        owned.push_back(t.contiguous());
        if (written[l] && !owned.back().is_same(t)) {
          copy_back.emplace_back(t, owned.back());
        }
        views[l].push_back(&owned.back());
      }
    }
  }
}

void FlatSet::finish() {
  for (auto& pr : copy_back) {
    pr.first.copy_(pr.second);
  }
}

bool found_inf_cpu(const std::optional<at::Tensor>& found_inf) {
  return found_inf.has_value() && found_inf->data_ptr<float>()[0] != 0.0f;
}

double read_lr_cpu(const at::Tensor& lr) {
  return lr.scalar_type() == at::kDouble
             ? lr.data_ptr<double>()[0]
             : static_cast<double>(lr.data_ptr<float>()[0]);
}

}  // namespace optim
}  // namespace mixprec
