// The optimizers' options against their lists (the X-macros of
// mixprec/optim.h): every row of AdamOptions, AdamWOptions and SGDOptions,
// changed alone, must survive a torch::save archive and a state_dict()
// (except the rows flagged kKept, which the loading optimizer keeps), be a
// key of the state dict's group, refuse a captured step's call once changed
// (except the rows flagged kLive), and be checked by the constructor when
// its row names a check; and every entry of the per-param state lists
// survives both checkpoints bit for bit. A place that leaves an option or a
// state entry out fails here.
#include <mixprec/mixprec.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "check.h"

namespace {

using namespace mixprec::optim::options_flag;  // the rows' flags

struct Row {
  const char* name;
  const char* check;
  unsigned flags;
};

// A valid value other than v, of v's type, for a row with that check.
double other(double v, const std::string&) { return v == 0 ? 0.125 : v * 0.5; }
bool other(bool v, const std::string&) { return !v; }
int64_t other(int64_t v, const std::string& check) {
  if (check == "correction") return v == 16 ? 8 : 16;  // 0 (float32) -> 16
  return v == 32 ? 8 : v + 3;                          // state_bits 32 -> 8
}
std::tuple<double, double> other(const std::tuple<double, double>& v,
                                 const std::string&) {
  return {std::get<0>(v) * 0.5, std::get<1>(v) * 0.5};
}

// A value the row's check refuses (v itself for check none).
double bad(double v, const std::string& check) {
  return check == "nonneg" ? -1.0 : v;
}
bool bad(bool v, const std::string&) { return v; }
int64_t bad(int64_t v, const std::string& check) {
  return check == "bits"         ? 16
         : check == "count"      ? -1
         : check == "correction" ? 12
                                 : v;
}
std::tuple<double, double> bad(const std::tuple<double, double>& v,
                               const std::string& check) {
  return check == "betas" ? std::make_tuple(0.9, 1.0) : v;
}

template <typename Options>
struct Table;

#define MIXPREC_TEST_ROW(type, name, default_value, check, flags) \
  {#name, #check, static_cast<unsigned>(flags)},
#define MIXPREC_TEST_CHANGE(type, name, default_value, check, flags) \
  if (k++ == i) o.name(other(o.name(), #check));
#define MIXPREC_TEST_BAD(type, name, default_value, check, flags) \
  if (k++ == i) o.name(bad(o.name(), #check));
#define MIXPREC_TEST_DIFF(type, name, default_value, check, flags) \
  if (!(a.name() == b.name())) out.emplace_back(#name);

// rows(); change(o, i): row i set to other(); bad(o, i): to a refused value;
// differ(a, b): the names of the rows where a and b differ.
#define MIXPREC_TEST_TABLE(Options, LIST)                               \
  template <>                                                           \
  struct Table<Options> {                                               \
    static std::vector<Row> rows() { return {LIST(MIXPREC_TEST_ROW)}; } \
    static void change(Options& o, size_t i) {                          \
      size_t k = 0;                                                     \
      LIST(MIXPREC_TEST_CHANGE)                                         \
    }                                                                   \
    static void set_bad(Options& o, size_t i) {                         \
      size_t k = 0;                                                     \
      LIST(MIXPREC_TEST_BAD)                                            \
    }                                                                   \
    static std::vector<std::string> differ(const Options& a,            \
                                           const Options& b) {          \
      std::vector<std::string> out;                                     \
      LIST(MIXPREC_TEST_DIFF)                                           \
      return out;                                                       \
    }                                                                   \
  };

MIXPREC_TEST_TABLE(mixprec::optim::AdamOptions, MIXPREC_ADAM_OPTIONS)
MIXPREC_TEST_TABLE(mixprec::optim::AdamWOptions, MIXPREC_ADAMW_OPTIONS)
MIXPREC_TEST_TABLE(mixprec::optim::SGDOptions, MIXPREC_SGD_OPTIONS)

std::string join(const std::vector<std::string>& v) {
  std::string out = "{";
  for (const auto& s : v) out += (out.size() > 1 ? ", " : "") + s;
  return out + "}";
}

template <typename Options>
const Options& options_of(const torch::optim::Optimizer& opt) {
  return static_cast<const Options&>(opt.param_groups()[0].options());
}

// Runs one place's checks of one option; an exception fails that pair only.
void place(const std::string& what, const char* where,
           const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    CHECK_MSG(false, what + " (" + where +
                         "): " + std::string(e.what()).substr(0, 200));
  }
}

// Every row of Opt's options list, changed alone from `base`, through each
// place that uses it.
template <typename Opt, typename Options>
void check_rows(const char* cls, const Options& base, const std::string& dir) {
  using T = Table<Options>;
  const auto rows = T::rows();
  CHECK(!rows.empty());
  const auto params = [] {
    return std::vector<torch::Tensor>{torch::randn({16, 4}).requires_grad_(),
                                      torch::randn({16}).requires_grad_()};
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const std::string what = std::string(cls) + "." + row.name;
    Options changed = base;
    T::change(changed, i);
    // the setter and getter of the row are its own member's
    CHECK_MSG(T::differ(base, changed) == std::vector<std::string>{row.name},
              what + ": changing it changed " + join(T::differ(base, changed)));

    place(what, "torch::save/torch::load", [&] {
      Opt saved(params(), changed);
      const std::string path = dir + "/" + what + ".pt";
      torch::save(saved, path);
      Opt loaded(params(), base);
      torch::load(loaded, path);
      const auto got = T::differ(changed, options_of<Options>(loaded));
      CHECK_MSG(got.empty(),
                what + ": torch::load gave other values of " + join(got));
    });

    place(what, "state_dict", [&] {
      // a key per row; loaded except kKept rows
      Opt saved(params(), changed);
      const auto sd = saved.state_dict();
      const auto group = sd.at("param_groups").toListRef()[0].toGenericDict();
      CHECK_MSG(group.contains(row.name),
                what + ": not a key of the state dict's group");
      Opt from_dict(params(), base);
      from_dict.load_state_dict(sd);
      const auto got = T::differ(changed, options_of<Options>(from_dict));
      const auto want = (row.flags & kKept) ? std::vector<std::string>{row.name}
                                            : std::vector<std::string>{};
      CHECK_MSG(got == want, what + ": load_state_dict left " + join(got) +
                                 " unlike the saved group, expected " +
                                 join(want));
    });

    place(what, "CapturedStep", [&] {
      // a captured step bakes in every row but kLive ones
      auto ps = params();
      Opt opt(ps, base);
      mixprec::CapturedStep step(
          [&](const std::vector<torch::Tensor>& in) {
            opt.zero_grad(/*set_to_none=*/false);
            auto loss = torch::nn::functional::linear(in[0], ps[0], ps[1])
                            .pow(2)
                            .mean();
            loss.backward();
            opt.step();
            return loss.detach();
          },
          {torch::randn({3, 4})}, {&opt}, nullptr,
          mixprec::CapturedStepOptions().warmup(1));
      for (int k = 0; k < 3; ++k) step({torch::randn({3, 4})});
      T::change(static_cast<Options&>(opt.param_groups()[0].options()), i);
      if (row.flags & kLive) {
        step({torch::randn({3, 4})});  // read at every call
        return;
      }
      std::string msg;
      try {
        step({torch::randn({3, 4})});
      } catch (const c10::Error& e) {
        msg = e.what_without_backtrace();
      }
      CHECK_MSG(
          msg.find("what the graph bakes in changed since the checked call: "
                   "optimizers[0].param_groups[0]['" +
                   std::string(row.name) + "']") != std::string::npos,
          what + ": a change not refused by a captured step (" + msg + ")");
    });

    if (std::string(row.check) != "none") {
      place(what, "check", [&] {
        Options refused = base;
        T::set_bad(refused, i);
        std::string msg;
        try {
          Opt opt(params(), refused);
        } catch (const c10::ValueError& e) {
          msg = e.what_without_backtrace();
        }
        const std::string want =
            std::string("mixprec.optim.") + cls + ": " + row.name;
        CHECK_MSG(msg.find(want) != std::string::npos,
                  what + ": a bad value (check " + row.check +
                      ") not refused with '" + want + "...' (" + msg + ")");
      });
    }
  }
}

void test_adam_rows(const std::string& dir) {
  check_rows<mixprec::optim::Adam>("Adam", mixprec::optim::AdamOptions(), dir);
}

void test_adamw_rows(const std::string& dir) {
  check_rows<mixprec::optim::AdamW>("AdamW", mixprec::optim::AdamWOptions(),
                                    dir);
}

void test_sgd_rows(const std::string& dir) {
  // (momentum > 0: nesterov alone is then valid)
  check_rows<mixprec::optim::SGD>(
      "SGD", mixprec::optim::SGDOptions().momentum(0.9), dir);
}

// ---- per-param state: every entry of the state lists (MIXPREC_ADAM_STATE,
// MIXPREC_SGD_STATE) survives torch::save and state_dict() bit for bit, under
// the configurations that together define every entry.
#define MIXPREC_TEST_STATE_ENTRY(name) out.emplace_back(#name, s.name());

using Entries = std::vector<std::pair<std::string, torch::Tensor>>;

Entries entries(const mixprec::optim::AdamParamState& s) {
  Entries out;
  MIXPREC_ADAM_STATE(MIXPREC_TEST_STATE_ENTRY)
  return out;
}

Entries entries(const mixprec::optim::SGDParamState& s) {
  Entries out;
  MIXPREC_SGD_STATE(MIXPREC_TEST_STATE_ENTRY)
  return out;
}

// Every defined entry replaced by a copy in new storage (as a checkpoint
// load does).
#define MIXPREC_TEST_STATE_REPLACE(name) \
  if (s.name().defined()) s.name(s.name().clone());

void replace_all(mixprec::optim::AdamParamState& s) {
  MIXPREC_ADAM_STATE(MIXPREC_TEST_STATE_REPLACE)
}

void replace_all(mixprec::optim::SGDParamState& s) {
  MIXPREC_SGD_STATE(MIXPREC_TEST_STATE_REPLACE)
}

bool bitwise(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         torch::equal(a, b);
}

template <typename Opt, typename State, typename Options>
void check_state_entries(const std::string& what, const Options& options,
                         const std::string& dir,
                         std::vector<std::string>& defined) {
  torch::manual_seed(3);
  const auto make = [] {
    return std::vector<torch::Tensor>{
        torch::randn({64, 4}).to(torch::kBFloat16).requires_grad_(),
        torch::randn({64}).to(torch::kBFloat16).requires_grad_()};
  };
  auto ps = make();
  Opt opt(ps, options);
  for (int k = 0; k < 2; ++k) {
    opt.zero_grad();
    (torch::nn::functional::linear(torch::randn({3, 4}).to(torch::kBFloat16),
                                   ps[0], ps[1])
         .to(torch::kFloat)
         .pow(2)
         .mean())
        .backward();
    opt.step();
  }
  const auto state_of = [](const Opt& o, const torch::Tensor& p) {
    return entries(
        static_cast<const State&>(*o.state().at(p.unsafeGetTensorImpl())));
  };
  for (size_t j = 0; j < ps.size(); ++j) {
    for (const auto& [name, t] : state_of(opt, ps[j])) {
      if (t.defined()) defined.push_back(name);
    }
  }
  // every entry of opt's state, bitwise, against `other`'s after its load
  const auto compare = [&](const char* how, const Opt& other,
                           const std::vector<torch::Tensor>& qs) {
    for (size_t j = 0; j < ps.size(); ++j) {
      const auto mine = state_of(opt, ps[j]);
      const auto theirs = state_of(other, qs[j]);
      for (size_t e = 0; e < mine.size(); ++e) {
        CHECK_MSG(bitwise(mine[e].second, theirs[e].second),
                  what + " param " + std::to_string(j) + " " + mine[e].first +
                      ": differs after " + how);
      }
    }
  };
  place(what, "torch::save/torch::load", [&] {
    const std::string path = dir + "/" + what + "_state.pt";
    torch::save(opt, path);
    auto qs = make();
    Opt loaded(qs, options);
    torch::load(loaded, path);
    compare("torch::save/torch::load", loaded, qs);
  });
  place(what, "state_dict", [&] {
    const auto sd = opt.state_dict();
    const auto saved = sd.at("state").toGenericDict();
    for (size_t j = 0; j < ps.size(); ++j) {
      const auto entry = saved.at(static_cast<int64_t>(j)).toGenericDict();
      for (const auto& [name, t] : state_of(opt, ps[j])) {
        CHECK_MSG(t.defined() == entry.contains(name),
                  what + " param " + std::to_string(j) + " " + name +
                      ": a key of the state dict iff defined");
      }
    }
    auto rs = make();
    Opt from_dict(rs, options);
    from_dict.load_state_dict(sd);
    compare("state_dict/load_state_dict", from_dict, rs);
  });

  place(what, "CapturedStep", [&] {
    // a captured step holds every entry: replaced ones (by hand, which
    // rebind() walks for; a load moves the optimizer's version()) are copied
    // back into the tensors it captured
    auto cs = make();
    Opt copt(cs, options);
    mixprec::CapturedStep step(
        [&](const std::vector<torch::Tensor>& in) {
          copt.zero_grad(/*set_to_none=*/false);
          auto loss = torch::nn::functional::linear(in[0], cs[0], cs[1])
                          .to(torch::kFloat)
                          .pow(2)
                          .mean();
          loss.backward();
          copt.step();
          return loss.detach();
        },
        {torch::randn({3, 4}).to(torch::kBFloat16)}, {&copt}, nullptr,
        mixprec::CapturedStepOptions().warmup(1));
    const auto call = [&] {
      step({torch::randn({3, 4}).to(torch::kBFloat16)});
    };
    for (int k = 0; k < 3; ++k) call();
    std::vector<Entries> held;
    for (const auto& p : cs) held.push_back(state_of(copt, p));
    for (const auto& p : cs) {
      replace_all(
          static_cast<State&>(*copt.state().at(p.unsafeGetTensorImpl())));
    }
    step.rebind();
    call();
    for (size_t j = 0; j < cs.size(); ++j) {
      const auto now = state_of(copt, cs[j]);
      for (size_t e = 0; e < now.size(); ++e) {
        const auto& [name, t] = now[e];
        if (!t.defined()) continue;
        CHECK_MSG(t.data_ptr() == held[j][e].second.data_ptr(),
                  what + " param " + std::to_string(j) + " " + name +
                      ": a replaced entry not put back by a captured step");
      }
    }
  });
}

void test_state_entries(const std::string& dir) {
  using namespace mixprec::optim;
  const auto all_of = [](const Entries& e) {
    std::vector<std::string> out;
    for (const auto& [name, t] : e) out.push_back(name);
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto covered = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  std::vector<std::string> adam;
  check_state_entries<Adam, AdamParamState>(
      "adam_amsgrad", AdamOptions(1e-2).amsgrad(true), dir, adam);
  check_state_entries<AdamW, AdamParamState>(
      "adamw8", AdamWOptions(1e-2).state_bits(8).min_8bit_size(0), dir, adam);
  check_state_entries<AdamW, AdamParamState>(
      "adamw_split16", AdamWOptions(1e-2).master_correction_bits(16), dir,
      adam);
  CHECK_MSG(covered(adam) == all_of(entries(AdamParamState())),
            "Adam's state entries defined by the configurations: " +
                join(covered(adam)));
  std::vector<std::string> sgd;
  check_state_entries<SGD, SGDParamState>(
      "sgd8", SGDOptions(1e-2).momentum(0.9).state_bits(8).min_8bit_size(0),
      dir, sgd);
  check_state_entries<SGD, SGDParamState>(
      "sgd_split8", SGDOptions(1e-2).momentum(0.9).master_correction_bits(8),
      dir, sgd);
  CHECK_MSG(covered(sgd) == all_of(entries(SGDParamState())),
            "SGD's state entries defined by the configurations: " +
                join(covered(sgd)));
}

// Adam and AdamW share torch.optim.Adam's rows and mixprec's; Adam has
// decoupled_weight_decay besides, and SGD the same mixprec rows.
void test_shared_rows() {
  const auto names = [](const std::vector<Row>& rows) {
    std::vector<std::string> out;
    for (const auto& r : rows) out.emplace_back(r.name);
    return out;
  };
  auto adam = names(Table<mixprec::optim::AdamOptions>::rows());
  const auto adamw = names(Table<mixprec::optim::AdamWOptions>::rows());
  const auto sgd = names(Table<mixprec::optim::SGDOptions>::rows());
  std::erase(adam, "decoupled_weight_decay");
  CHECK_MSG(adam == adamw, join(adam) + " vs " + join(adamw));
  CHECK(std::vector<std::string>(adamw.end() - 5, adamw.end()) ==
        std::vector<std::string>(sgd.end() - 5, sgd.end()));
  CHECK(mixprec::optim::AdamOptions().weight_decay() == 0.0);
  CHECK(mixprec::optim::AdamWOptions().weight_decay() == 1e-2);
}

// A group added later gets the constructor's checks, and a refused one is
// not added: amsgrad=True with 8-bit state (no step keeps an 8-bit
// max_exp_avg_sq), a negative lr, another optimizer's options.
void test_added_group_checked() {
  using mixprec::optim::AdamW;
  using mixprec::optim::AdamWOptions;
  AdamW opt({torch::zeros({64, 64})}, AdamWOptions(1e-3).state_bits(8));
  const auto version = opt.version();
  const auto add = [&](std::unique_ptr<torch::optim::OptimizerOptions> o) {
    opt.add_param_group(torch::optim::OptimizerParamGroup(
        {torch::zeros({64, 64})}, std::move(o)));
  };
  CHECK_THROWS(c10::ValueError,
               add(std::make_unique<AdamWOptions>(
                   AdamWOptions(1e-3).state_bits(8).amsgrad(true))),
               "amsgrad=True needs state_bits=32");
  CHECK_THROWS(c10::ValueError,
               add(std::make_unique<AdamWOptions>(AdamWOptions(-1.0))), "lr");
  CHECK_THROWS(c10::Error,
               add(std::make_unique<mixprec::optim::SGDOptions>(1e-3)),
               "options of another optimizer");
  CHECK(opt.param_groups().size() == 1);
  add(std::make_unique<AdamWOptions>(AdamWOptions(2e-3)));
  CHECK(opt.param_groups().size() == 2);
  CHECK(opt.version() > version);
}

// A group's own options are kept, merged with the defaults as torch's C++
// optimizers merge theirs (a field left at its constructor default takes
// the optimizer's), in the constructor and in add_param_group.
void test_group_options_kept() {
  using mixprec::optim::AdamW;
  using mixprec::optim::AdamWOptions;
  using mixprec::optim::SGDOptions;
  const auto defaults = AdamWOptions(1e-3).weight_decay(0.5).state_bits(8);
  AdamW adamw(
      {torch::optim::OptimizerParamGroup({torch::zeros({64, 64})}),
       torch::optim::OptimizerParamGroup(
           {torch::zeros({64, 64})},
           std::make_unique<AdamWOptions>(AdamWOptions(5e-3).eps(1e-6)))},
      defaults);
  adamw.add_param_group(torch::optim::OptimizerParamGroup(
      {torch::zeros({64, 64})},
      std::make_unique<AdamWOptions>(AdamWOptions(7e-3).state_bits(32))));
  const auto& g = adamw.param_groups();
  const auto opts = [&](size_t i) {
    return static_cast<const AdamWOptions&>(g[i].options());
  };
  CHECK(opts(0).lr() == 1e-3 && opts(0).eps() == 1e-8);
  CHECK(opts(1).lr() == 5e-3 && opts(1).eps() == 1e-6);
  CHECK(opts(1).weight_decay() == 0.5 && opts(1).state_bits() == 8);
  CHECK(opts(2).lr() == 7e-3 && opts(2).weight_decay() == 0.5);
  CHECK(opts(2).state_bits() == 8);  // 32 is the constructor default
  mixprec::optim::SGD sgd(
      {torch::optim::OptimizerParamGroup(
          {torch::zeros({4})},
          std::make_unique<SGDOptions>(SGDOptions(0.1).nesterov(true)))},
      SGDOptions(1e-2).momentum(0.9));
  const auto& s =
      static_cast<const SGDOptions&>(sgd.param_groups()[0].options());
  CHECK(s.lr() == 0.1 && s.momentum() == 0.9 && s.nesterov());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir =
      argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  std::filesystem::create_directories(dir);
  const mixprec_test::TestList tests = {
      {"Adam's rows", [&] { test_adam_rows(dir); }},
      {"AdamW's rows", [&] { test_adamw_rows(dir); }},
      {"SGD's rows", [&] { test_sgd_rows(dir); }},
      {"shared rows", test_shared_rows},
      {"state entries", [&] { test_state_entries(dir); }},
      {"an added group is checked", test_added_group_checked},
      {"a group's own options are kept", test_group_options_kept},
  };
  return mixprec_test::run_tests(tests);
}
