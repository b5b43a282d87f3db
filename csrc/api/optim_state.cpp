// mixprec::optim's state-dict and archive conversion: FusedOptimizer's
// state_dict() / load_state_dict() (the Python class's layout), torch::save
// archives (save/load and the options' and states' serialize), and
// fix_loaded_state(), which puts a loaded state on the params' devices in the
// layout each group's state_bits wants, converting 8-bit moments both ways.
// The steps are optim.cpp.
#include "mixprec/optim.h"

#include "common/quant8_math.h"
#include "optim_internal.h"
#include "options_table.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <string>

namespace mixprec::optim {

namespace {

using detail::absmax_sizes;
using detail::step_zero;

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

// The two serialize overrides of an options or param-state class: its entries
// through `write` and `read` (write_options/read_options or
// write_state/read_state).
#define MIXPREC_SERIALIZE_THROUGH(Class, write, read)                     \
  void Class::serialize(torch::serialize::OutputArchive& archive) const { \
    write(*this, archive);                                                \
  }                                                                       \
  void Class::serialize(torch::serialize::InputArchive& archive) {        \
    read(*this, archive);                                                 \
  }

MIXPREC_SERIALIZE_THROUGH(AdamOptions, write_options, read_options)
MIXPREC_SERIALIZE_THROUGH(AdamWOptions, write_options, read_options)
MIXPREC_SERIALIZE_THROUGH(AdamParamState, write_state, read_state)

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

template void AdamBase<AdamOptions>::save(
    torch::serialize::OutputArchive& archive) const;
template void AdamBase<AdamOptions>::load(
    torch::serialize::InputArchive& archive);
template void AdamBase<AdamWOptions>::save(
    torch::serialize::OutputArchive& archive) const;
template void AdamBase<AdamWOptions>::load(
    torch::serialize::InputArchive& archive);

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
        s->master_correction(to_param(s->master_correction(), p, false));
        // (a master of the other form is converted at the next step, from
        // the param as it is then: bucket_param)
        if (master_form(p, group) == at::kFloat &&
            !s->master_param().defined() && !s->master_correction().defined()) {
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
        s2->master_correction(to_param(s2->master_correction(), p, false));
        if (master_form(p, group) == at::kFloat &&
            !s2->master_param().defined() &&
            !s2->master_correction().defined()) {
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
    options_table::for_each_option(o, [&](const char* name, const auto& value,
                                          unsigned flags, auto) {
      if (static_cast<bool>(flags & options_flag::kTorch) != torch_part) {
        return;
      }
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int64_t>) {
        if (value == 0 && std::string(name) == "master_correction_bits") {
          g.insert(name, c10::IValue());  // float32 masters: Python's None
          return;
        }
      }
      g.insert(name, group_value(value));
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

// A saved master_correction: int16 or int8 of the param's shape, for a
// bfloat16 param; c10::ValueError naming the entry otherwise.
void check_correction(const char* cls, const c10::IValue& key,
                      const c10::impl::GenericDict& ps, const at::Tensor& p) {
  const at::Tensor c = state_tensor(ps, "master_correction");
  if (!c.defined()) return;
  const std::string where =
      c10::str("mixprec.optim.", cls, ".load_state_dict: state[", key,
               "]['master_correction']");
  TORCH_CHECK_VALUE(
      c.scalar_type() == at::kShort || c.scalar_type() == at::kChar, where,
      ": expected an int16 or int8 correction, got ", c.scalar_type());
  TORCH_CHECK_VALUE(
      p.scalar_type() == at::kBFloat16, where,
      ": only a bfloat16 param keeps a split master; this one is ",
      p.scalar_type());
  TORCH_CHECK_VALUE(c.sizes() == p.sizes(), where,
                    ": expected the param's shape ", p.sizes(), ", got ",
                    c.sizes());
  TORCH_CHECK_VALUE(!state_tensor(ps, "master_param").defined(),
                    "mixprec.optim.", cls, ".load_state_dict: state[", key,
                    "] holds both 'master_param' and 'master_correction'");
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
      check_correction(name(), ids[j], found->value().toGenericDict(),
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

MIXPREC_SERIALIZE_THROUGH(SGDOptions, write_options, read_options)
MIXPREC_SERIALIZE_THROUGH(SGDParamState, write_state, read_state)
#undef MIXPREC_SERIALIZE_THROUGH

void SGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
}

void SGD::load(torch::serialize::InputArchive& archive) {
  count_change();
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
  fix_loaded_state();
}

}  // namespace mixprec::optim
