// C++ tests of mixprec::CapturedStep (mixprec/capture.h) on CPU, where it
// runs every call eagerly with the checks a CUDA graph needs: a captured run
// equals the hand-written eager loop bit for bit (16-bit params with masters,
// AdamW or SGD, GradScaler, folded clipping, overflows, scale growth), an lr
// set between calls reaches the step before it runs (after a load too), a
// checkpoint loaded between calls (state_dict or torch::load) continues bit
// for bit in the captured storages, each refusal of the table both twins
// test (tests/data/capture_refusals.txt) names its cause, and so does each
// change between calls that the per-call check must see (a load of another
// layout or other options, an added group, a replaced param, a changed
// option or scaler setting). The CUDA run (graph vs eager, 50 steps, sync
// debug mode) is test_capture_cuda.cpp.
#include <mixprec/mixprec.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check.h"

namespace {

using mixprec::CapturedStep;
using Inputs = std::vector<torch::Tensor>;

const auto kInf = std::numeric_limits<float>::infinity();

// a and b hold the same bits (same dtype and shape)
bool bitwise(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  const auto bytes = [](const torch::Tensor& t) {
    return t.detach().contiguous().reshape({-1}).view(torch::kByte);
  };
  return torch::equal(bytes(a), bytes(b));
}

// The inputs of step k: x (5 x 4), y (5 x 8); x holds an inf at the steps
// in `overflow` (the step is then skipped and the scale backs off).
Inputs batch(int k, const std::vector<int>& overflow = {}) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + k);
  auto x = torch::randn({5, 4}, gen);
  auto y = torch::randn({5, 8}, gen);
  for (int o : overflow) {
    if (o == k) x[0][0] = kInf;
  }
  return {x, y};
}

// One training setup: a linear layer with params of `dtype` (float32 masters
// in the optimizer), AdamW (or SGD with momentum), GradScaler on CPU growing
// every 3 clean steps.
struct Run {
  torch::Tensor w, b;
  std::unique_ptr<mixprec::optim::FusedOptimizer> opt;
  std::unique_ptr<mixprec::GradScaler> scaler;

  explicit Run(torch::ScalarType dtype, bool sgd = false) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    w = torch::randn({8, 4}, gen).to(dtype).requires_grad_();
    b = torch::randn({8}, gen).to(dtype).requires_grad_();
    if (sgd) {
      opt = std::make_unique<mixprec::optim::SGD>(
          std::vector<torch::Tensor>{w, b},
          mixprec::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true));
    } else {
      opt = std::make_unique<mixprec::optim::AdamW>(
          std::vector<torch::Tensor>{w, b},
          mixprec::optim::AdamWOptions(1e-2).weight_decay(0.1));
    }
    scaler = std::make_unique<mixprec::GradScaler>(
        torch::kCPU,
        mixprec::GradScalerOptions().init_scale(256.0).growth_interval(3));
  }

  // The training step, as an eager loop writes it. no_sync: the form a
  // captured step needs (GradScaler::step_no_sync); else step(), which
  // returns whether the step ran (stored in `stepped`).
  torch::Tensor step(const Inputs& in, bool no_sync = true) {
    opt->zero_grad(/*set_to_none=*/false);
    auto out = torch::nn::functional::linear(in[0].to(w.scalar_type()), w, b);
    auto loss = (out.to(torch::kFloat) - in[1]).pow(2).mean();
    scaler->scale(loss).backward();
    scaler->clip_grad_norm_(*opt, 1.0);
    if (no_sync) {
      scaler->step_no_sync(*opt);
    } else {
      stepped = scaler->step(*opt);
    }
    scaler->update();
    return loss;
  }

  // everything a step changes
  std::vector<torch::Tensor> snapshot() {
    const auto scale = scaler->scale_tensor();  // (none before the first)
    std::vector<torch::Tensor> out = {
        w.detach().clone(), b.detach().clone(),
        scale.defined() ? scale.clone() : torch::Tensor()};
    for (const auto& m : opt->master_params()) out.push_back(m.clone());
    return out;
  }

  // the data addresses of the optimizer's state tensors, in param order
  std::vector<const void*> state_addresses() {
    std::vector<const void*> out;
    for (const auto& p : {w, b}) {
      auto& s = static_cast<mixprec::optim::AdamParamState&>(
          *opt->state().at(p.unsafeGetTensorImpl()));
      for (const auto& t :
           {s.step(), s.exp_avg(), s.exp_avg_sq(), s.master_param()}) {
        out.push_back(t.data_ptr());
      }
    }
    return out;
  }

  std::unique_ptr<CapturedStep> capture(
      mixprec::CapturedStepOptions options = {}) {
    return std::make_unique<CapturedStep>(
        [this](const Inputs& in) { return step(in); }, batch(0),
        std::vector<torch::optim::Optimizer*>{opt.get()}, scaler.get(),
        options);
  }

  bool stepped = true;
  int calls = 0;
};

bool same_snapshots(const std::vector<torch::Tensor>& a,
                    const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!bitwise(a[i], b[i])) return false;
  }
  return true;
}

// ------------------------------------------------------------------ tests
// 12 calls (2 warm-up, the checked call, 9 "replays"), overflows in warm-up
// and after capture, scale growth: each call's loss, params, masters, scale
// and skip equal the eager loop's (which uses GradScaler::step()).
void test_equals_eager_loop() {
  for (auto [dtype, sgd] :
       {std::pair{torch::kHalf, false}, std::pair{torch::kBFloat16, false},
        std::pair{torch::kHalf, true}}) {
    const std::vector<int> overflow = {1, 6};
    Run eager(dtype, sgd), captured(dtype, sgd);
    auto step = captured.capture();
    int skipped = 0;
    bool grew = false;
    for (int k = 0; k < 12; ++k) {
      const Inputs in = batch(k, overflow);
      const double scale_before = eager.scaler->get_scale();
      auto loss_e = eager.step(in, /*no_sync=*/false);
      auto loss_c = (*step)(in);
      CHECK_MSG(bitwise(loss_e, loss_c),
                c10::str(dtype, sgd ? " SGD" : " AdamW", " loss, step ", k));
      CHECK_MSG(same_snapshots(eager.snapshot(), captured.snapshot()),
                c10::str(dtype, sgd ? " SGD" : " AdamW",
                         " params/masters/scale, step ", k));
      CHECK_MSG(captured.scaler->step_was_skipped() == !eager.stepped,
                c10::str(dtype, sgd ? " SGD" : " AdamW", " skip, step ", k));
      skipped += eager.stepped ? 0 : 1;
      grew = grew || eager.scaler->get_scale() > scale_before;
    }
    CHECK(skipped == 2 && grew);  // the run covers both rules
    CHECK(step->calls() == 12);
    CHECK(!step->graphed());  // CPU: no graph
  }
}

// An input of another shape, dtype or count is refused before anything
// runs, whether before or after capture.
void test_input_mismatch() {
  Run run(torch::kHalf);
  auto step = run.capture(mixprec::CapturedStepOptions().warmup(1));
  for (int k = 0; k < 4; ++k) {
    const auto before = run.snapshot();
    const Inputs good = batch(k);
    CHECK_THROWS(c10::Error, (*step)({torch::randn({6, 4}), good[1]}),
                 "inputs[0]: expected Float [5, 4] on cpu (as the example "
                 "input), got Float [6, 4] on cpu");
    CHECK_THROWS(c10::Error, (*step)({good[0], good[1].to(torch::kDouble)}),
                 "inputs[1]: expected Float [5, 8] on cpu");
    CHECK_THROWS(c10::Error, (*step)({good[0]}),
                 "expected 2 inputs (as the example), got 1");
    CHECK(same_snapshots(before, run.snapshot()));  // nothing changed
    CHECK(step->calls() == k);
    (*step)(good);
  }
}

// An lr set between calls (a scheduler's job) is in the device tensor the
// kernels read before the step runs, and the run equals the eager loop with
// the same schedule.
void test_lr_between_calls() {
  Run eager(torch::kHalf), captured(torch::kHalf), fixed_lr(torch::kHalf);
  const at::Tensor lr_tensor = captured.opt->lr_tensors().at(0);
  std::vector<double> seen;  // the lr tensor as each step starts
  CapturedStep step(
      [&](const Inputs& in) {
        seen.push_back(*lr_tensor.const_data_ptr<double>());  // (no op)
        return captured.step(in);
      },
      batch(0), {captured.opt.get()}, captured.scaler.get());
  std::vector<double> lrs;
  for (int k = 0; k < 9; ++k) {
    if (k == 5) {
      // a checkpoint of itself loaded: new state tensors, same values; the
      // lr tensor the step reads is still the one the lr is written into
      captured.opt->load_state_dict(captured.opt->state_dict());
    }
    const double lr = 1e-2 / (1 + k);  // changes before every call
    lrs.push_back(lr);
    eager.opt->param_groups()[0].options().set_lr(lr);
    captured.opt->param_groups()[0].options().set_lr(lr);
    eager.step(batch(k));
    step(batch(k));
    fixed_lr.step(batch(k));
    CHECK_MSG(same_snapshots(eager.snapshot(), captured.snapshot()),
              c10::str("step ", k));
  }
  CHECK(seen == lrs);
  CHECK(captured.opt->lr_tensors().at(0).is_same(lr_tensor));
  CHECK(!same_snapshots(fixed_lr.snapshot(), captured.snapshot()));
}

// A checkpoint (mixprec::torch_save of the params and the optimizer's
// state_dict, or with `archive` torch::save of the optimizer; GradScaler::
// save) loaded between calls: the loads make new state tensors and move the
// optimizer's version(); the next call copies them into the captured ones,
// puts those back into the state, and the run continues bit for bit.
void test_checkpoint_between_calls(const std::string& dir, bool archive) {
  Run run(torch::kHalf);
  auto step = run.capture();
  const std::vector<int> overflow = {7};
  for (int k = 0; k < 5; ++k) (*step)(batch(k, overflow));
  const auto captured_state = run.state_addresses();
  mixprec::torch_save(
      c10::List<at::Tensor>({run.w.detach().clone(), run.b.detach().clone()}),
      dir + "/capture_params.pt");
  const std::string optim_file =
      dir + (archive ? "/capture_optim_archive.pt" : "/capture_optim.pt");
  if (archive) {
    torch::save(*run.opt, optim_file);
  } else {
    mixprec::torch_save(run.opt->state_dict(), optim_file);
  }
  run.scaler->save(dir + "/capture_scaler.pt");
  std::vector<std::vector<torch::Tensor>> first;
  std::vector<torch::Tensor> first_losses;
  for (int k = 5; k < 10; ++k) {
    first_losses.push_back((*step)(batch(k, overflow)));
    first.push_back(run.snapshot());
  }
  // load: params in place, the optimizer's state as new tensors
  {
    torch::NoGradGuard no_grad;
    const auto params = mixprec::torch_load(dir + "/capture_params.pt");
    run.w.copy_(params.toListRef().at(0).toTensor());
    run.b.copy_(params.toListRef().at(1).toTensor());
  }
  const uint64_t version = run.opt->version();
  if (archive) {
    torch::load(*run.opt, optim_file);
  } else {
    run.opt->load_state_dict(mixprec::torch_load(optim_file).toGenericDict());
  }
  CHECK(run.opt->version() != version);
  run.scaler->load(dir + "/capture_scaler.pt");
  CHECK(run.state_addresses() != captured_state);  // the load replaced them
  for (int k = 5; k < 10; ++k) {
    auto loss = (*step)(batch(k, overflow));
    CHECK_MSG(run.state_addresses() == captured_state,
              c10::str("the captured state tensors are back, step ", k));
    CHECK_MSG(bitwise(loss, first_losses[k - 5]), c10::str("loss, step ", k));
    CHECK_MSG(same_snapshots(run.snapshot(), first[k - 5]),
              c10::str("params/masters/scale, step ", k));
  }
}

// The refusals of the table both twins test (tests/data/capture_refusals.txt;
// the Python twin: tests/test_capture_refusals.py): id -> the planted defect,
// run until it throws.
using Planting = std::function<void()>;

// The checked call (the second, with warmup 1) runs `body`, then refuses.
Planting checked_refuses(
    std::function<torch::Tensor(Run&, const Inputs&)> body) {
  return [body] {
    Run run(torch::kHalf);
    CapturedStep step([&](const Inputs& in) { return body(run, in); }, batch(0),
                      {run.opt.get()}, run.scaler.get(),
                      mixprec::CapturedStepOptions().warmup(1));
    step(batch(0));
    step(batch(1));
  };
}

// After the checked call, `change` between calls; the next call (with
// `rebind`: CapturedStep::rebind()) refuses, and changes nothing.
Planting between_refuses(std::function<void(Run&)> change,
                         bool rebind = false) {
  return [change, rebind] {
    Run run(torch::kHalf);
    auto step = run.capture(mixprec::CapturedStepOptions().warmup(1));
    for (int k = 0; k < 3; ++k) (*step)(batch(k));
    change(run);
    const auto before = run.snapshot();
    try {
      if (rebind) {
        step->rebind();
      } else {
        (*step)(batch(3));
      }
    } catch (...) {
      CHECK(same_snapshots(before, run.snapshot()));
      throw;
    }
  };
}

std::map<std::string, Planting> plantings() {
  std::map<std::string, Planting> out;
  out["not_mixprec_optimizer"] = [] {
    Run run(torch::kFloat);
    torch::optim::SGD sgd({run.w}, torch::optim::SGDOptions(0.1));
    CapturedStep([](const Inputs& in) { return in[0].sum(); }, batch(0), {&sgd},
                 nullptr);
  };
  out["negative_warmup"] = [] {
    Run run(torch::kFloat);
    run.capture(mixprec::CapturedStepOptions().warmup(-1));
  };
  out["input_signature"] = [] {
    Run run(torch::kHalf);
    (*run.capture())({torch::randn({6, 4}), batch(0)[1]});
  };
  out["autocast_cache"] = [] {
    Run run(torch::kHalf);
    auto step = run.capture();
    mixprec::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    (*step)(batch(0));
  };
  out["sync_item"] = checked_refuses([](Run& r, const Inputs& in) {
    auto loss = r.step(in);
    if (loss.item<float>() > 1e30f) r.w.grad().zero_();  // a host read
    return loss;
  });
  out["sync_bool_mask"] = checked_refuses([](Run& r, const Inputs& in) {
    auto loss = r.step(in);
    return loss + in[0].index({in[0].abs() > 1e30}).sum();  // a mask index
  });
  out["grads_set_to_none"] = checked_refuses([](Run& r, const Inputs& in) {
    r.opt->zero_grad();  // LibTorch's default: set_to_none=true
    return r.step(in);
  });
  out["lr_in_step"] = checked_refuses([](Run& r, const Inputs& in) {
    auto& o = r.opt->param_groups()[0].options();
    o.set_lr(o.get_lr() * 0.5);  // a scheduler inside the step
    return r.step(in);
  });
  out["no_update"] = checked_refuses([](Run& r, const Inputs& in) {
    r.opt->zero_grad(false);
    auto loss = r.w.to(torch::kFloat).sum() * in[0].sum();
    r.scaler->scale(loss).backward();
    r.scaler->step_no_sync(*r.opt);
    if (r.calls++ == 0) r.scaler->update();  // not in the checked call
    return loss;
  });
  out["option_changed"] = between_refuses([](Run& r) {
    static_cast<mixprec::optim::AdamWOptions&>(
        r.opt->param_groups()[0].options())
        .weight_decay(0.5);
  });
  out["scaler_setting_changed"] =
      between_refuses([](Run& r) { r.scaler->set_growth_factor(4.0); });
  out["param_new_storage"] = between_refuses([](Run& r) {
    torch::NoGradGuard no_grad;
    r.w.set_(r.w.detach().clone());
  });
  return out;
}

// Whether `message` holds the pieces of `text` (split at '*'), in order.
bool matches(const std::string& message, const std::string& text) {
  size_t at = 0, from = 0;
  while (true) {
    const size_t star = text.find('*', from);
    const std::string piece = text.substr(from, star - from);
    const size_t found = message.find(piece, at);
    if (found == std::string::npos) return false;
    at = found + piece.size();
    if (star == std::string::npos) return true;
    from = star + 1;
  }
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' ');
  const size_t b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

void test_refusal_table(const std::string& table) {
  std::ifstream in(table);
  CHECK_MSG(in.good(), "cannot read " + table);
  auto planted = plantings();
  size_t rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t bar1 = line.find('|'), bar2 = line.find('|', bar1 + 1);
    const std::string id = trim(line.substr(0, bar1));
    const std::string text = trim(line.substr(bar2 + 1));
    ++rows;
    auto it = planted.find(id);
    CHECK_MSG(it != planted.end(), "no planting for row " + id);
    if (it == planted.end()) continue;
    bool threw = false;
    try {
      it->second();
    } catch (const c10::Error& e) {
      threw = true;
      const std::string msg = e.what_without_backtrace();
      CHECK_MSG(matches(msg, text), id + ": '" + text + "' not in: " + msg);
    }
    CHECK_MSG(threw, id + ": nothing thrown");
  }
  CHECK_MSG(rows == planted.size(), "plantings without a row");
}

// The optimizer's state_dict with `edit` applied to it.
c10::impl::GenericDict edited_state_dict(
    Run& r, const std::function<void(c10::impl::GenericDict&)>& edit) {
  auto sd = r.opt->state_dict();
  edit(sd);
  return sd;
}

// param group g of a state dict (shared with it: an edit edits the dict)
c10::impl::GenericDict group_of(c10::impl::GenericDict& sd, size_t g) {
  return sd.at("param_groups").toList().get(g).toGenericDict();
}

// Changes between calls that only the optimizer or the scaler can tell the
// per-call check about (their version counters), and those it compares
// itself (counts, options, each group's first param): each is refused by
// the next call, naming it, and changes nothing. The counters move.
void test_changes_between_calls() {
  // a checkpoint of another layout, loaded (its new state tensors are seen
  // through version() only)
  CHECK_THROWS(
      c10::Error, between_refuses([](Run& r) {
        const uint64_t version = r.opt->version();
        r.opt->load_state_dict(edited_state_dict(r, [](c10::impl::GenericDict&
                                                           sd) {
          sd.at("state").toGenericDict().at(0).toGenericDict().insert_or_assign(
              "exp_avg", torch::zeros({3}));
        }));
        CHECK(r.opt->version() != version);
      })(),
      "optimizers[0].param_groups[0]['params'][0] state['exp_avg'] was Float "
      "[8, 4] on cpu and is now Float [3] on cpu (since the checked call)");
  // a checkpoint with another baked option, loaded
  CHECK_THROWS(
      c10::Error, between_refuses([](Run& r) {
        const uint64_t version = r.opt->version();
        r.opt->load_state_dict(
            edited_state_dict(r, [](c10::impl::GenericDict& sd) {
              group_of(sd, 0).insert_or_assign("weight_decay", 0.5);
            }));
        CHECK(r.opt->version() != version);
      })(),
      "what the graph bakes in changed since the checked call: "
      "optimizers[0].param_groups[0]['weight_decay'] 0.10000000000000001 -> "
      "0.5");
  // an added param group
  CHECK_THROWS(
      c10::Error, between_refuses([](Run& r) {
        const uint64_t version = r.opt->version();
        r.opt->add_param_group(torch::optim::OptimizerParamGroup(
            {torch::zeros({3}, torch::kHalf).requires_grad_()},
            std::make_unique<mixprec::optim::AdamWOptions>(1e-2)));
        CHECK(r.opt->version() != version);
      })(),
      "what the graph bakes in changed since the checked call: optimizers[0] "
      "has 2 param groups, the graph 1");
  // a param added to a group through param_groups() (not counted)
  CHECK_THROWS(c10::Error, between_refuses([](Run& r) {
                 r.opt->param_groups()[0].params().push_back(
                     torch::zeros({3}, torch::kHalf).requires_grad_());
               })(),
               "optimizers[0].param_groups[0] has 3 params, the graph 2");
  // a group's first param replaced by another tensor of its layout (with
  // the captured grad)
  CHECK_THROWS(c10::Error, between_refuses([](Run& r) {
                 auto& params = r.opt->param_groups()[0].params();
                 auto fresh = params[0].detach().clone().requires_grad_();
                 fresh.mutable_grad() = params[0].grad();
                 params[0] = fresh;
               })(),
               "optimizers[0].param_groups[0]['params'][0] is another tensor "
               "or in new storage since the checked call");
  // a baked option changed through a new options object
  CHECK_THROWS(
      c10::Error, between_refuses([](Run& r) {
        r.opt->param_groups()[0].set_options(
            std::make_unique<mixprec::optim::AdamWOptions>(
                mixprec::optim::AdamWOptions(1e-2).weight_decay(0.1).eps(
                    1e-6)));
      })(),
      "what the graph bakes in changed since the checked call: "
      "optimizers[0].param_groups[0]['eps'] 1e-08 -> 9.9999999999999995e-07");
  // the scaler's settings: each setter, and a load
  CHECK_THROWS(c10::Error, between_refuses([](Run& r) {
                 r.scaler->set_backoff_factor(0.25);
               })(),
               "what the graph bakes in changed since the checked call: "
               "scaler.backoff_factor 0.5 -> 0.25");
  CHECK_THROWS(c10::Error, between_refuses([](Run& r) {
                 r.scaler->set_growth_interval(5);
               })(),
               "what the graph bakes in changed since the checked call: "
               "scaler.growth_interval 3 -> 5");
  CHECK_THROWS(c10::Error, between_refuses([](Run& r) {
                 const uint64_t version = r.scaler->settings_version();
                 auto sd = r.scaler->state_dict();
                 sd.insert_or_assign("growth_factor", 4.0);
                 r.scaler->load_state_dict(sd);
                 CHECK(r.scaler->settings_version() != version);
               })(),
               "what the graph bakes in changed since the checked call: "
               "scaler.growth_factor 2 -> 4");
  // a later param of a group in new storage, or a state tensor replaced by
  // hand: not seen by the per-call check; rebind() sees them
  CHECK_THROWS(c10::Error,
               between_refuses(
                   [](Run& r) {
                     torch::NoGradGuard no_grad;
                     r.b.set_(r.b.detach().clone());
                   },
                   /*rebind=*/true)(),
               "optimizers[0].param_groups[0]['params'][1] is another tensor "
               "or in new storage since the checked call");
}

// What moves the counters the per-call check compares, for each optimizer
// class: a load (torch::load, load_state_dict), add_param_group, a changed
// scaler setting (a setter, a load); and what does not: a step, zero_grad,
// the lr tensors, a save, a scaler setter or load that keeps the settings.
void test_version_counters(const std::string& dir) {
  for (int kind = 0; kind < 3; ++kind) {
    const char* name = kind == 0 ? "AdamW" : kind == 1 ? "Adam" : "SGD";
    auto w = torch::randn({8, 4}).to(torch::kHalf).requires_grad_();
    std::unique_ptr<mixprec::optim::FusedOptimizer> opt;
    std::unique_ptr<torch::optim::OptimizerOptions> extra;
    if (kind == 0) {
      opt = std::make_unique<mixprec::optim::AdamW>(
          std::vector<torch::Tensor>{w});
      extra = std::make_unique<mixprec::optim::AdamWOptions>();
    } else if (kind == 1) {
      opt =
          std::make_unique<mixprec::optim::Adam>(std::vector<torch::Tensor>{w});
      extra = std::make_unique<mixprec::optim::AdamOptions>();
    } else {
      opt = std::make_unique<mixprec::optim::SGD>(
          std::vector<torch::Tensor>{w},
          mixprec::optim::SGDOptions(0.1).momentum(0.9));
      extra = std::make_unique<mixprec::optim::SGDOptions>();
    }
    w.mutable_grad() = torch::ones_like(w);
    uint64_t v = opt->version();
    const auto moved = [&](const char* what, bool expected) {
      const uint64_t now = opt->version();
      CHECK_MSG((now != v) == expected,
                c10::str(name, ": ", what, expected ? " moves" : " keeps",
                         " version()"));
      v = now;
    };
    opt->step();
    opt->zero_grad();
    opt->lr_tensors();
    opt->lr_tensor(0, torch::kCPU);
    const auto sd = opt->state_dict();
    const std::string file = dir + "/version_" + name + ".pt";
    torch::save(*opt, file);
    moved("step, zero_grad, lr_tensors, state_dict, save", false);
    torch::load(*opt, file);
    moved("torch::load", true);
    opt->load_state_dict(sd);
    moved("load_state_dict", true);
    opt->add_param_group(torch::optim::OptimizerParamGroup(
        {torch::zeros({3}).requires_grad_()}, std::move(extra)));
    moved("add_param_group", true);
  }
  mixprec::GradScaler scaler(torch::kCPU);
  uint64_t v = scaler.settings_version();
  const auto moved = [&](const char* what, bool expected) {
    const uint64_t now = scaler.settings_version();
    CHECK_MSG((now != v) == expected,
              c10::str("GradScaler: ", what, expected ? " moves" : " keeps",
                       " settings_version()"));
    v = now;
  };
  scaler.set_growth_factor(scaler.get_growth_factor());
  scaler.set_backoff_factor(scaler.get_backoff_factor());
  scaler.set_growth_interval(scaler.get_growth_interval());
  scaler.load_state_dict(scaler.state_dict());
  moved("a setter or a load of the same settings", false);
  scaler.set_growth_factor(3.0);
  moved("set_growth_factor", true);
  scaler.set_backoff_factor(0.25);
  moved("set_backoff_factor", true);
  scaler.set_growth_interval(7);
  moved("set_growth_interval", true);
  auto sd = scaler.state_dict();
  sd.insert_or_assign("growth_interval", int64_t{9});
  scaler.load_state_dict(sd);
  moved("load_state_dict", true);
}

// C++-only checks: a state tensor of another layout put in by hand is
// refused by rebind(); grads dropped between calls are put back; warmup 0
// runs.
void test_between_calls() {
  CHECK_THROWS(
      c10::Error,
      between_refuses(
          [](Run& r) {
            auto& s = static_cast<mixprec::optim::AdamParamState&>(
                *r.opt->state().at(r.w.unsafeGetTensorImpl()));
            s.exp_avg(torch::zeros({3}));
          },
          /*rebind=*/true)(),
      "optimizers[0].param_groups[0]['params'][0] state['exp_avg'] was Float "
      "[8, 4] on cpu and is now Float [3] on cpu (since the checked call)");
  Run run(torch::kHalf), eager(torch::kHalf);
  auto step = run.capture(mixprec::CapturedStepOptions().warmup(0));
  for (int k = 0; k < 4; ++k) {
    const auto grad = run.w.grad();
    if (k == 2) run.opt->zero_grad();  // set_to_none=true, between calls
    (*step)(batch(k));
    eager.step(batch(k));
    if (k >= 1)
      CHECK_MSG(run.w.grad().is_same(grad), c10::str("grad, call ", k));
    CHECK_MSG(same_snapshots(eager.snapshot(), run.snapshot()),
              c10::str("warmup 0, call ", k));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir =
      argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  std::filesystem::create_directories(dir);
  const mixprec_test::TestList tests = {
      {"captured (CPU) == eager loop", test_equals_eager_loop},
      {"input mismatch refused", test_input_mismatch},
      {"lr set between calls", test_lr_between_calls},
      {"checkpoint between calls (state_dict)",
       [&] { test_checkpoint_between_calls(dir, /*archive=*/false); }},
      {"checkpoint between calls (torch::save)",
       [&] { test_checkpoint_between_calls(dir, /*archive=*/true); }},
      {"refusals (the twins' table)",
       [&] {
         test_refusal_table(argc > 2 ? argv[2] : "capture_refusals.txt");
       }},
      {"changes between calls", test_changes_between_calls},
      {"version counters", [&] { test_version_counters(dir); }},
      {"between calls", test_between_calls},
  };
  return mixprec_test::run_tests(tests);
}
