// C++ tests of mixprec::CapturedStep (mixprec/capture.h) on CPU, where it
// runs every call eagerly with the checks a CUDA graph needs: a captured run
// equals the hand-written eager loop bit for bit (16-bit params with masters,
// AdamW or SGD, GradScaler, folded clipping, overflows, scale growth), an lr
// set between calls reaches the step before it runs, a checkpoint loaded
// between calls continues bit for bit in the captured storages, and each
// refusal names its cause. The CUDA run (graph vs eager, 50 steps, sync
// debug mode) is test_capture_cuda.cpp.
#include <mixprec/mixprec.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
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
  CHECK(!same_snapshots(fixed_lr.snapshot(), captured.snapshot()));
}

// A checkpoint (mixprec::torch_save of the params and the optimizer's
// state_dict, GradScaler::save) loaded between calls: the loads make new
// state tensors; the next call copies them into the captured ones, puts
// those back into the state, and the run continues bit for bit.
void test_checkpoint_between_calls(const std::string& dir) {
  Run run(torch::kHalf);
  auto step = run.capture();
  const std::vector<int> overflow = {7};
  for (int k = 0; k < 5; ++k) (*step)(batch(k, overflow));
  const auto captured_state = run.state_addresses();
  mixprec::torch_save(
      c10::List<at::Tensor>({run.w.detach().clone(), run.b.detach().clone()}),
      dir + "/capture_params.pt");
  mixprec::torch_save(run.opt->state_dict(), dir + "/capture_optim.pt");
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
  run.opt->load_state_dict(
      mixprec::torch_load(dir + "/capture_optim.pt").toGenericDict());
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

// Refusals: at construction, by the checked call, and between calls.
void test_refusals() {
  {
    Run run(torch::kFloat);
    torch::optim::SGD sgd({run.w}, torch::optim::SGDOptions(0.1));
    CHECK_THROWS(c10::Error,
                 CapturedStep([](const Inputs& in) { return in[0].sum(); },
                              batch(0), {&sgd}, nullptr),
                 "optimizers[0] is not a mixprec::optim optimizer");
    CHECK_THROWS(c10::Error,
                 CapturedStep([](const Inputs& in) { return in[0].sum(); },
                              batch(0), {run.opt.get()}, nullptr,
                              mixprec::CapturedStepOptions().warmup(0)),
                 "warmup must be >= 1");
    CHECK_THROWS(c10::Error, run.scaler->step_no_sync(sgd),
                 "is not a mixprec::optim optimizer");
  }
  // The checked call (the second, with warmup 1) runs the step, then refuses.
  const auto checked_refuses =
      [](const std::function<torch::Tensor(Run&, const Inputs&)>& body,
         const std::string& needle) {
        Run run(torch::kHalf);
        CapturedStep step([&](const Inputs& in) { return body(run, in); },
                          batch(0), {run.opt.get()}, run.scaler.get(),
                          mixprec::CapturedStepOptions().warmup(1));
        step(batch(0));
        CHECK_THROWS(c10::Error, step(batch(1)), needle);
      };
  checked_refuses(
      [](Run& r, const Inputs& in) {
        r.opt->zero_grad(/*set_to_none=*/false);
        auto loss = r.w.to(torch::kFloat).sum() * in[0].sum();
        r.scaler->scale(loss).backward();
        r.scaler->step(*r.opt);  // returns whether it ran: a host read
        r.scaler->update();
        return loss;
      },
      "the step reads a device value on the host (aten::");
  checked_refuses(
      [](Run& r, const Inputs& in) {
        auto loss = r.step(in);
        if (loss.item<float>() > 1e30f) r.w.grad().zero_();  // a host read
        return loss;
      },
      "the step reads a device value on the host (aten::");
  checked_refuses(
      [](Run& r, const Inputs& in) {
        r.opt->zero_grad();  // LibTorch's default: set_to_none=true
        return r.step(in);
      },
      "'s grad is a new tensor after the step");
  checked_refuses(
      [](Run& r, const Inputs& in) {
        r.opt->zero_grad(false);
        auto loss = r.w.to(torch::kFloat).sum() * in[0].sum();
        r.scaler->scale(loss).backward();
        r.scaler->step_no_sync(*r.opt);
        if (r.calls++ == 0) r.scaler->update();  // not in the checked call
        return loss;
      },
      "end it with scaler.update()");
  checked_refuses(
      [](Run& r, const Inputs& in) {
        auto& o = r.opt->param_groups()[0].options();
        o.set_lr(o.get_lr() * 0.5);  // a scheduler inside the step
        return r.step(in);
      },
      "'s lr changed inside the step");
  // Between calls, after the checked call: what the graph holds must stay.
  const auto between_refuses = [](const std::function<void(Run&)>& change,
                                  const std::string& needle) {
    Run run(torch::kHalf);
    auto step = run.capture(mixprec::CapturedStepOptions().warmup(1));
    for (int k = 0; k < 3; ++k) (*step)(batch(k));
    change(run);
    const auto before = run.snapshot();
    CHECK_THROWS(c10::Error, (*step)(batch(3)), needle);
    CHECK(same_snapshots(before, run.snapshot()));
  };
  between_refuses([](Run& r) { r.opt->zero_grad(); },
                  "optimizers[0] group 0 param 0's grad is gone since the "
                  "checked call");
  between_refuses(
      [](Run& r) {
        torch::NoGradGuard no_grad;
        r.b.set_(r.b.detach().clone());
      },
      "optimizers[0] group 0 param 1 is another tensor or in new storage");
  between_refuses(
      [](Run& r) {
        static_cast<mixprec::optim::AdamWOptions&>(
            r.opt->param_groups()[0].options())
            .weight_decay(0.5);
      },
      "param group 0's options changed since the checked call");
  between_refuses([](Run& r) { r.scaler->set_growth_factor(4.0); },
                  "the scaler's rule changed since the checked call");
  between_refuses(
      [](Run& r) {
        auto& s = static_cast<mixprec::optim::AdamParamState&>(
            *r.opt->state().at(r.w.unsafeGetTensorImpl()));
        s.exp_avg(torch::zeros({3}));
      },
      "param 0's state 'exp_avg' was Float [8, 4] on cpu and is now Float "
      "[3] on cpu (since the checked call)");
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
      {"checkpoint between calls", [&] { test_checkpoint_between_calls(dir); }},
      {"refusals", test_refusals},
  };
  return mixprec_test::run_tests(tests);
}
