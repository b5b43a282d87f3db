// C++ tests of mixprec::GradScaler and mixprec::optim (CPU), against an
// installed libmixprec. References: torch::optim (float32 params), hand-
// computed scale sequences (torch.amp.GradScaler's rule) and the error
// messages of the Python class. Plain main, no framework: the last line is
// "N passed, M failed" and the exit status is M != 0.
#include <mixprec/mixprec.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "check.h"

namespace {

const auto kInf = std::numeric_limits<float>::infinity();

// A tiny linear model with params of `dtype`.
struct Toy {
  torch::Tensor w, b;
  explicit Toy(torch::ScalarType dtype, int64_t n = 8) {
    w = torch::randn({n, 4}).to(dtype).requires_grad_();
    b = torch::randn({n}).to(dtype).requires_grad_();
  }
  std::vector<torch::Tensor> params() const { return {w, b}; }
  torch::Tensor loss(const torch::Tensor& x) const {
    auto out = torch::nn::functional::linear(x.to(w.scalar_type()), w, b);
    return out.to(torch::kFloat).pow(2).mean();
  }
};

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

// `steps` steps of two toys side by side on the same input, each with its
// optimizer.
void step_both(const Toy& a, torch::optim::Optimizer& oa, const Toy& b,
               torch::optim::Optimizer& ob, const torch::Tensor& x,
               int steps = 1) {
  for (int it = 0; it < steps; ++it) {
    oa.zero_grad();
    ob.zero_grad();
    a.loss(x).backward();
    b.loss(x).backward();
    oa.step();
    ob.step();
  }
}

mixprec::GradScaler cpu_scaler(mixprec::GradScalerOptions o = {}) {
  return mixprec::GradScaler(torch::kCPU, o);
}

// ------------------------------------------------------------------ scaler
void test_scaler_basics() {
  auto s = cpu_scaler(mixprec::GradScalerOptions().init_scale(1024.0));
  CHECK(s.is_enabled());
  CHECK(s.get_scale() == 1024.0);  // before the first scale(): init_scale
  CHECK(!s.scale_tensor().defined());
  auto loss = torch::tensor(3.0f);
  auto scaled = s.scale(loss);
  CHECK(scaled.item<float>() == 3072.0f);
  CHECK(s.scale_tensor().scalar_type() == torch::kFloat);
  CHECK(s.scale_tensor().dim() == 0);
  auto many = s.scale(
      std::vector<torch::Tensor>{torch::ones({2}), torch::full({3}, 2.0)});
  CHECK(many.size() == 2 && many[1][2].item<float>() == 2048.0f);
  // methods before scale(): torch's messages
  auto fresh = cpu_scaler();
  torch::optim::SGD sgd({torch::zeros({1}, torch::requires_grad())},
                        torch::optim::SGDOptions(0.1));
  CHECK_THROWS(
      c10::Error, fresh.unscale_(sgd),
      "Attempted unscale_ but _scale is None.  This may indicate your "
      "script did not use scaler.scale(loss or outputs) earlier in the "
      "iteration.");
  CHECK_THROWS(c10::Error, fresh.step(sgd),
               "Attempted step but _scale is None.");
  CHECK_THROWS(c10::Error, fresh.update(),
               "Attempted update but _scale is None.");
}

void test_scaler_option_errors() {
  CHECK_THROWS(c10::Error,
               cpu_scaler(mixprec::GradScalerOptions().growth_factor(1.0)),
               "The growth factor must be > 1.0.");
  CHECK_THROWS(c10::Error,
               cpu_scaler(mixprec::GradScalerOptions().backoff_factor(1.0)),
               "The backoff factor must be < 1.0.");
  CHECK_THROWS(c10::ValueError,
               cpu_scaler(mixprec::GradScalerOptions().hysteresis(0)),
               "mixprec.GradScaler: hysteresis must be an int >= 1, got 0");
  CHECK_THROWS(c10::ValueError,
               cpu_scaler(mixprec::GradScalerOptions().min_scale(-1.0)),
               "mixprec.GradScaler: min_scale must be finite and > 0");
  CHECK_THROWS(
      c10::ValueError,
      cpu_scaler(mixprec::GradScalerOptions().min_scale(4.0).max_scale(2.0)),
      "must not exceed max_scale");
  CHECK_THROWS(c10::ValueError, mixprec::GradScalerOptions::policy("apex"),
               "mixprec.GradScaler: policy must be one of");
  auto ds = mixprec::GradScalerOptions::policy("deepspeed");
  CHECK(ds.hysteresis() == 2 && ds.growth_interval() == 1000 &&
        ds.min_scale() == 1.0);
  auto mg = mixprec::GradScalerOptions::policy("megatron");
  CHECK(mg.init_scale() == 4294967296.0);
  // disabled: factors are not checked, everything is a pass-through
  auto off = cpu_scaler(
      mixprec::GradScalerOptions().enabled(false).growth_factor(0.5));
  CHECK(!off.is_enabled());
  CHECK(off.get_scale() == 1.0);
  auto t = torch::ones({2});
  CHECK(off.scale(t).data_ptr() == t.data_ptr());
  CHECK(off.state_dict().size() == 0);
}

// The state machine with an ordinary optimizer (torch::optim::SGD): skip on
// inf, backoff, growth after growth_interval clean steps, stage errors.
void test_scaler_state_machine() {
  Toy m(torch::kFloat);
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.01));
  auto s = cpu_scaler(
      mixprec::GradScalerOptions().init_scale(256.0).growth_interval(2));
  const auto x = torch::randn({5, 4});
  std::vector<double> scales;
  std::vector<bool> ran;
  for (int it = 0; it < 6; ++it) {
    opt.zero_grad();
    s.scale(m.loss(x)).backward();
    if (it == 1 || it == 4) {
      m.w.mutable_grad()[0][0].fill_(kInf);
    }
    const auto w_before = m.w.detach().clone();
    const bool stepped = s.step(opt);
    ran.push_back(stepped);
    CHECK(stepped == !(it == 1 || it == 4));
    CHECK(stepped != same(w_before, m.w.detach()));  // skipped: unchanged
    CHECK(s.stage(opt) == mixprec::OptState::STEPPED);
    CHECK_THROWS(c10::Error, s.step(opt),
                 "step() has already been called since the last update().");
    CHECK_THROWS(c10::Error, s.unscale_(opt),
                 "unscale_() is being called after step().");
    s.update();
    CHECK(s.step_was_skipped() == !stepped);
    CHECK(s.stage(opt) == mixprec::OptState::READY);
    scales.push_back(s.get_scale());
  }
  // 256 -> skip: 128 -> ok -> ok: 256 -> ok -> skip: 128 -> ok
  const std::vector<double> want = {256, 128, 128, 256, 128, 128};
  CHECK_MSG(scales == want, "scale sequence");
  auto sd = s.state_dict();
  CHECK(sd.at("_growth_tracker").toInt() == 1);
  // unscale_ twice
  opt.zero_grad();
  s.scale(m.loss(x)).backward();
  s.unscale_(opt);
  CHECK(s.stage(opt) == mixprec::OptState::UNSCALED);
  CHECK_THROWS(c10::Error, s.unscale_(opt),
               "unscale_() has already been called on this optimizer since the "
               "last update().");
  CHECK_THROWS(
      c10::Error, s.step(opt, [] { return torch::Tensor(); }),
      "Closure use is not currently supported if GradScaler is enabled.");
  CHECK(s.step(opt));
  s.update();
  // update() without any inf check recorded
  s.scale(m.loss(x));
  CHECK_THROWS(c10::Error, s.update(),
               "No inf checks were recorded prior to update.");
}

// unscale_ matches grad / scale (reciprocal in float64, rounded to float32).
void test_scaler_unscale_values() {
  Toy m(torch::kFloat, 16);
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.01));
  auto s = cpu_scaler(mixprec::GradScalerOptions().init_scale(3.0));
  s.scale(m.loss(torch::randn({3, 4}))).backward();
  const auto g = m.w.grad().clone();
  s.unscale_(opt);
  const auto inv = torch::tensor(1.0 / 3.0, torch::kDouble).to(torch::kFloat);
  CHECK(torch::equal(m.w.grad(), g * inv));
}

// FP16 gradients: rejected for ordinary optimizers, accepted with masters.
void test_scaler_fp16_grads() {
  Toy m(torch::kHalf);
  torch::optim::SGD plain(m.params(), torch::optim::SGDOptions(0.01));
  auto s = cpu_scaler();
  s.scale(m.loss(torch::randn({3, 4}))).backward();
  CHECK_THROWS(c10::ValueError, s.unscale_(plain),
               "Attempting to unscale FP16 gradients.");
  auto allow = cpu_scaler(mixprec::GradScalerOptions().allow_fp16_grads(true));
  allow.scale(torch::tensor(1.0f));
  allow.unscale_(plain);
  CHECK(allow.stage(plain) == mixprec::OptState::UNSCALED);

  Toy h(torch::kHalf);
  mixprec::optim::AdamW adamw(h.params());  // masters by default
  CHECK(adamw.master_weights());
  auto s2 = cpu_scaler();
  s2.scale(h.loss(torch::randn({3, 4}))).backward();
  s2.unscale_(adamw);  // accepted: the optimizer keeps float32 masters
  CHECK(s2.step(adamw));
  s2.update();
}

// A mixprec optimizer gets grad_scale/found_inf and skips on the device; the
// result equals unscaling first and stepping with no scaler.
void test_scaler_amp_aware() {
  torch::manual_seed(1);
  Toy a(torch::kBFloat16), b(torch::kBFloat16);
  b.w.detach().copy_(a.w.detach());
  b.b.detach().copy_(a.b.detach());
  mixprec::optim::AdamW oa(a.params(), mixprec::optim::AdamWOptions(1e-2));
  mixprec::optim::AdamW ob(b.params(), mixprec::optim::AdamWOptions(1e-2));
  auto s = cpu_scaler(mixprec::GradScalerOptions().init_scale(64.0));
  const auto x = torch::randn({6, 4});
  for (int it = 0; it < 4; ++it) {
    oa.zero_grad();
    ob.zero_grad();
    s.scale(a.loss(x)).backward();
    b.loss(x).backward();
    if (it == 2) {
      a.b.mutable_grad()[1].fill_(std::numeric_limits<float>::quiet_NaN());
    }
    const auto before = a.w.detach().clone();
    const auto masters_before = oa.master_params()[0].clone();
    const bool stepped = s.step(oa);
    CHECK(stepped == (it != 2));
    if (it == 2) {
      CHECK(same(before, a.w.detach()));
      CHECK(same(masters_before, oa.master_params()[0]));
    } else {
      ob.step();
      // grads were scaled by 64 (a power of two): unscaling is exact
      CHECK_MSG(same(a.w.detach(), b.w.detach()),
                "amp-aware step == plain step");
      CHECK(same(oa.master_params()[0], ob.master_params()[0]));
    }
    s.update();
    CHECK(s.step_was_skipped() == (it == 2));
  }
  CHECK(s.get_scale() == 32.0);
  // the step counts did not advance on the skipped step
  auto* st = dynamic_cast<mixprec::optim::AdamParamState*>(
      oa.state().at(a.w.unsafeGetTensorImpl()).get());
  CHECK(st != nullptr && st->step().item<float>() == 3.0f);
}

void test_scaler_hysteresis_bounds() {
  Toy m(torch::kFloat);
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.0));
  auto s = cpu_scaler(mixprec::GradScalerOptions()
                          .init_scale(8.0)
                          .hysteresis(2)
                          .min_scale(2.0)
                          .growth_interval(1000));
  const auto x = torch::randn({2, 4});
  std::vector<double> scales;
  for (int it = 0; it < 5; ++it) {
    opt.zero_grad();
    s.scale(m.loss(x)).backward();
    m.w.mutable_grad()[0][0].fill_(kInf);
    CHECK(!s.step(opt));
    s.update();
    scales.push_back(s.get_scale());
  }
  // hysteresis 2: first overflow tolerated, then back off each time, floor 2
  const std::vector<double> want = {8, 4, 2, 2, 2};
  CHECK_MSG(scales == want, "hysteresis/min_scale sequence");
  auto sd = s.state_dict();
  CHECK(sd.contains("_hysteresis_left"));
  CHECK(sd.size() == 6);
}

void test_scaler_update_new_scale() {
  Toy m(torch::kFloat);
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.0));
  auto s = cpu_scaler();
  s.scale(m.loss(torch::randn({2, 4}))).backward();
  s.step(opt);
  s.update(512.0);
  CHECK(s.get_scale() == 512.0);
  s.scale(torch::tensor(1.0f));
  s.update(torch::tensor(7.0f));
  CHECK(s.get_scale() == 7.0);
  const char* reason = "new_scale should be a float or a 1-element";
  CHECK_THROWS(c10::Error, s.update(torch::ones({2})), reason);
  CHECK_THROWS(c10::Error, s.update(torch::ones({}, torch::requires_grad())),
               reason);
}

void test_scaler_clip_grad_norm() {
  Toy m(torch::kFloat, 32), ref(torch::kFloat, 32);
  ref.w.detach().copy_(m.w.detach());
  ref.b.detach().copy_(m.b.detach());
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.1));
  auto s = cpu_scaler(mixprec::GradScalerOptions().init_scale(128.0));
  const auto x = torch::randn({9, 4});
  s.scale(m.loss(x)).backward();
  ref.loss(x).backward();
  const auto total = s.clip_grad_norm_(opt, 0.05);
  const double want = torch::nn::utils::clip_grad_norm_(ref.params(), 0.05);
  CHECK_MSG(
      std::abs(total.item<double>() - want) <= 1e-5 * want,
      std::to_string(total.item<double>()) + " vs " + std::to_string(want));
  CHECK(torch::allclose(m.w.grad(), ref.w.grad(), 1e-5, 1e-7));
  CHECK(s.stage(opt) == mixprec::OptState::UNSCALED);
  CHECK_THROWS(c10::Error, s.unscale_(opt),
               "unscale_() has already been called");
  CHECK(s.step(opt));
  CHECK_THROWS(c10::Error, s.clip_grad_norm_(opt, 1.0),
               "clip_grad_norm_() is being called after step().");
  s.update();
}

// A mixprec optimizer: the clip is folded into its step (grads only read),
// and the result equals the unfolded route within float32 rounding.
void test_scaler_clip_folded_into_step() {
  Toy a(torch::kFloat, 32), b(torch::kFloat, 32);
  b.w.detach().copy_(a.w.detach());
  b.b.detach().copy_(a.b.detach());
  mixprec::optim::AdamW oa(a.params(), mixprec::optim::AdamWOptions(1e-2));
  mixprec::optim::AdamW ob(b.params(), mixprec::optim::AdamWOptions(1e-2));
  auto sa = cpu_scaler(mixprec::GradScalerOptions().init_scale(128.0));
  auto sb = cpu_scaler(mixprec::GradScalerOptions().init_scale(128.0));
  for (int it = 0; it < 4; ++it) {
    oa.zero_grad();
    ob.zero_grad();
    const auto x = torch::randn({9, 4}) * 3;
    sa.scale(a.loss(x)).backward();
    sb.scale(b.loss(x)).backward();
    if (it == 2) {
      a.w.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
      b.w.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    }
    const auto grad_before = a.w.grad().clone();
    const auto ta = sa.clip_grad_norm_(oa, 0.05);
    const auto tb = sb.clip_grad_norm_(ob, 0.05, 2.0, /*fold_into_step=*/false);
    CHECK(same(a.w.grad(), grad_before));  // folded: read only
    CHECK(!same(b.w.grad(), a.w.grad()));  // unfolded: unscaled and clipped
    CHECK(sa.stage(oa) == mixprec::OptState::UNSCALED);
    CHECK_THROWS(c10::Error, sa.unscale_(oa),
                 "unscale_() has already been called");
    if (it != 2) {
      CHECK_MSG(std::abs(ta.item<double>() - tb.item<double>()) <=
                    1e-6 * tb.item<double>(),
                std::to_string(ta.item<double>()) + " vs " +
                    std::to_string(tb.item<double>()));
    }
    CHECK(sa.step(oa) == (it != 2));
    CHECK(sb.step(ob) == (it != 2));
    sa.update();
    sb.update();
    CHECK(sa.get_scale() == sb.get_scale());
  }
  CHECK(torch::allclose(a.w, b.w, 1e-6, 1e-7));
  CHECK(torch::allclose(a.b, b.b, 1e-6, 1e-7));
}

// A folded clip, then an opt-out clip in the same iteration: the second one
// measures and clips the grads the step would see (unscaled, first clip
// applied), as unscale_ + two torch clips do.
void test_scaler_clip_folded_then_opt_out() {
  Toy a(torch::kFloat, 32), ref(torch::kFloat, 32);
  ref.w.detach().copy_(a.w.detach());
  ref.b.detach().copy_(a.b.detach());
  mixprec::optim::SGD oa(a.params(), mixprec::optim::SGDOptions(0.1));
  torch::optim::SGD oref(ref.params(), torch::optim::SGDOptions(0.1));
  auto s = cpu_scaler(mixprec::GradScalerOptions().init_scale(128.0));
  const auto x = torch::randn({9, 4}) * 3;
  s.scale(a.loss(x)).backward();
  ref.loss(x).backward();
  const auto t1 = s.clip_grad_norm_(oa, 0.2);
  const auto t2 = s.clip_grad_norm_(oa, 0.05, 2.0, /*fold_into_step=*/false);
  const double w1 = torch::nn::utils::clip_grad_norm_(ref.params(), 0.2);
  const double w2 = torch::nn::utils::clip_grad_norm_(ref.params(), 0.05);
  CHECK(w1 > 0.2 && w2 > 0.05);  // both clips are active
  CHECK_MSG(std::abs(t1.item<double>() - w1) <= 1e-5 * w1,
            std::to_string(t1.item<double>()) + " vs " + std::to_string(w1));
  CHECK_MSG(std::abs(t2.item<double>() - w2) <= 1e-5 * w2,
            std::to_string(t2.item<double>()) + " vs " + std::to_string(w2));
  CHECK(torch::allclose(a.w.grad(), ref.w.grad(), 1e-5, 1e-7));
  CHECK(s.step(oa));
  oref.step();
  s.update();
  CHECK(torch::allclose(a.w, ref.w, 1e-5, 1e-7));
  CHECK(torch::allclose(a.b, ref.b, 1e-5, 1e-7));
}

void test_scaler_state_dict_roundtrip(const std::string& dir) {
  Toy m(torch::kFloat);
  torch::optim::SGD opt(m.params(), torch::optim::SGDOptions(0.0));
  auto s = cpu_scaler(mixprec::GradScalerOptions()
                          .init_scale(32.0)
                          .growth_interval(3)
                          .hysteresis(3));
  for (int it = 0; it < 4; ++it) {
    opt.zero_grad();
    s.scale(m.loss(torch::randn({2, 4}))).backward();
    if (it == 0) m.w.mutable_grad()[0][0].fill_(kInf);
    s.step(opt);
    s.update();
  }
  auto sd = s.state_dict();
  CHECK(sd.at("scale").isDouble() &&
        sd.at("scale").toDouble() == 64.0);  // 1 tolerated overflow, grew once
  CHECK(sd.at("growth_factor").toDouble() == 2.0);
  CHECK(sd.at("backoff_factor").toDouble() == 0.5);
  CHECK(sd.at("growth_interval").isInt() &&
        sd.at("growth_interval").toInt() == 3);
  CHECK(sd.at("_growth_tracker").toInt() == 0);  // grew at the 3rd clean step
  CHECK(sd.at("_hysteresis_left").toInt() == 3);
  const std::string path = dir + "/scaler_roundtrip.pt";
  s.save(path);
  auto t = cpu_scaler(mixprec::GradScalerOptions().hysteresis(3));
  t.load(path);
  CHECK(t.get_scale() == s.get_scale());
  auto sd2 = t.state_dict();
  CHECK(sd2.size() == sd.size());
  for (const auto& e : sd) {
    CHECK_MSG(sd2.contains(e.key()) && sd2.at(e.key()) == e.value(), e.key());
  }
  // archive route
  torch::serialize::OutputArchive out;
  s.save(out);
  out.save_to(dir + "/scaler_archive.pt");
  torch::serialize::InputArchive in;
  in.load_from(dir + "/scaler_archive.pt");
  auto u = cpu_scaler(mixprec::GradScalerOptions().hysteresis(3));
  u.load(in);
  CHECK(u.state_dict().at("_growth_tracker") == sd.at("_growth_tracker"));
  CHECK(u.get_scale() == 64.0);
  // errors
  auto v = cpu_scaler();
  CHECK_THROWS(
      c10::Error,
      v.load_state_dict(
          cpu_scaler(mixprec::GradScalerOptions().enabled(false)).state_dict()),
      "The source state dict is empty, possibly because it was saved "
      "from a disabled instance of GradScaler.");
  auto partial = s.state_dict().copy();
  partial.erase("growth_interval");
  CHECK_THROWS(c10::Error, v.load_state_dict(partial),
               "missing key 'growth_interval'");
  CHECK(v.get_scale() == 65536.0);  // unchanged by the rejected load
}

// ------------------------------------------------------------------ optimizers
// float32 params: the same update as torch::optim (within float rounding).
void test_optim_vs_torch() {
  torch::manual_seed(3);
  const auto x = torch::randn({7, 4});
  for (int kind = 0; kind < 3; ++kind) {
    Toy a(torch::kFloat), b(torch::kFloat);
    b.w.detach().copy_(a.w.detach());
    b.b.detach().copy_(a.b.detach());
    std::unique_ptr<torch::optim::Optimizer> ours, theirs;
    const char* name = "";
    if (kind == 0) {
      name = "AdamW";
      ours = std::make_unique<mixprec::optim::AdamW>(
          a.params(), mixprec::optim::AdamWOptions(1e-2).weight_decay(0.1));
      theirs = std::make_unique<torch::optim::AdamW>(
          b.params(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    } else if (kind == 1) {
      name = "Adam";
      ours = std::make_unique<mixprec::optim::Adam>(
          a.params(),
          mixprec::optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(true));
      theirs = std::make_unique<torch::optim::Adam>(
          b.params(),
          torch::optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(true));
    } else {
      name = "SGD";
      ours = std::make_unique<mixprec::optim::SGD>(
          a.params(), mixprec::optim::SGDOptions(1e-2)
                          .momentum(0.9)
                          .nesterov(true)
                          .weight_decay(0.01));
      theirs = std::make_unique<torch::optim::SGD>(
          b.params(), torch::optim::SGDOptions(1e-2)
                          .momentum(0.9)
                          .nesterov(true)
                          .weight_decay(0.01));
    }
    for (int it = 0; it < 5; ++it) {
      ours->zero_grad();
      theirs->zero_grad();
      a.loss(x).backward();
      b.loss(x).backward();
      ours->step();
      theirs->step();
    }
    CHECK_MSG(torch::allclose(a.w, b.w, 1e-5, 1e-6),
              std::string(name) + " vs torch::optim, max diff " +
                  std::to_string((a.w - b.w).abs().max().item<double>()));
  }
}

void test_optim_masters_and_errors() {
  Toy m(torch::kBFloat16);
  mixprec::optim::Adam opt(m.params(), mixprec::optim::AdamOptions(1e-3));
  CHECK(opt.master_params()[0].scalar_type() == torch::kFloat);
  m.loss(torch::randn({3, 4})).backward();
  opt.step();
  auto masters = opt.master_params();
  CHECK(masters.size() == 2 && masters[0].scalar_type() == torch::kFloat);
  CHECK(same(masters[0].to(torch::kBFloat16), m.w.detach()));  // rounded master
  // no masters: the params themselves
  mixprec::optim::SGD nom(
      m.params(), mixprec::optim::SGDOptions(0.1).master_weights(false));
  CHECK(!nom.master_weights());
  CHECK(nom.master_params()[0].scalar_type() == torch::kBFloat16);
  // bad options and inputs (the Python messages)
  CHECK_THROWS(
      c10::ValueError,
      mixprec::optim::AdamW(m.params(), mixprec::optim::AdamWOptions(-1.0)),
      "mixprec.optim.AdamW: lr must be a finite number >= 0, got -1");
  CHECK_THROWS(c10::ValueError,
               mixprec::optim::Adam(
                   m.params(), mixprec::optim::AdamOptions().betas({0.9, 1.0})),
               "mixprec.optim.Adam: betas[1] must be in [0, 1), got 1");
  CHECK_THROWS(c10::ValueError,
               mixprec::optim::SGD(
                   m.params(), mixprec::optim::SGDOptions(0.1).nesterov(true)),
               "mixprec.optim.SGD: nesterov=True requires momentum > 0");
  auto d = torch::randn({3}, torch::kDouble).requires_grad_();
  d.mutable_grad() = torch::ones({3}, torch::kDouble);
  mixprec::optim::AdamW dbl({d});
  CHECK_THROWS(c10::Error, dbl.step(),
               "mixprec.optim.AdamW: params must be float32, float16 or "
               "bfloat16, got Double");
  CHECK(dbl.state().empty());  // rejected before any state was created
  mixprec::optim::StepScalars bad;
  bad.found_inf = torch::zeros({2});
  CHECK_THROWS(c10::Error, opt.step_with(bad),
               "mixprec.optim.Adam.step: found_inf must be a float32 tensor "
               "with one element");
  // found_inf set: nothing changes, step count included
  const auto w = m.w.detach().clone();
  mixprec::optim::StepScalars skip;
  skip.found_inf = torch::ones({});
  opt.step_with(skip);
  CHECK(same(w, m.w.detach()));
}

// torch::save / torch::load of an optimizer: a reloaded optimizer continues
// bit for bit like the original.
void test_optim_serialize(const std::string& dir) {
  torch::manual_seed(5);
  const auto x = torch::randn({5, 4});
  for (int kind = 0; kind < 2; ++kind) {
    Toy a(torch::kHalf), b(torch::kHalf);
    std::unique_ptr<mixprec::optim::FusedOptimizer> oa, ob;
    if (kind == 0) {
      oa = std::make_unique<mixprec::optim::AdamW>(
          a.params(), mixprec::optim::AdamWOptions(1e-2).amsgrad(true));
      ob = std::make_unique<mixprec::optim::AdamW>(
          b.params(), mixprec::optim::AdamWOptions(0.5));
    } else {
      oa = std::make_unique<mixprec::optim::SGD>(
          a.params(), mixprec::optim::SGDOptions(1e-2).momentum(0.9));
      ob = std::make_unique<mixprec::optim::SGD>(
          b.params(), mixprec::optim::SGDOptions(0.5));
    }
    for (int it = 0; it < 3; ++it) {
      oa->zero_grad();
      a.loss(x).backward();
      oa->step();
    }
    const std::string path = dir + "/optim_" + std::to_string(kind) + ".pt";
    torch::save(*oa, path);
    b.w.detach().copy_(a.w.detach());
    b.b.detach().copy_(a.b.detach());
    torch::load(*ob, path);
    CHECK(ob->param_groups()[0].options().get_lr() ==
          1e-2);  // options restored
    step_both(a, *oa, b, *ob, x, 3);
    CHECK_MSG(same(a.w.detach(), b.w.detach()),
              "reloaded optimizer continues identically");
    CHECK(same(oa->master_params()[0], ob->master_params()[0]));
  }
}

// state_dict()/load_state_dict(): the Python layout, through a file.
void test_optim_state_dict(const std::string& dir) {
  torch::manual_seed(6);
  const auto x = torch::randn({5, 4});
  Toy a(torch::kBFloat16), b(torch::kBFloat16);
  mixprec::optim::Adam oa(a.params(),
                          mixprec::optim::AdamOptions(1e-2).amsgrad(true));
  for (int it = 0; it < 2; ++it) {
    oa.zero_grad();
    a.loss(x).backward();
    oa.step();
  }
  const auto sd = oa.state_dict();
  const auto groups = sd.at("param_groups").toListRef();
  CHECK(groups.size() == 1);
  const auto g = groups[0].toGenericDict();
  CHECK(g.at("lr").toDouble() == 1e-2 && g.at("amsgrad").toBool());
  CHECK(g.at("betas").isTuple());
  CHECK(g.at("params").toListRef().size() == 2);
  const auto st = sd.at("state").toGenericDict();
  CHECK(st.size() == 2);
  const auto p0 = st.at(int64_t{0}).toGenericDict();
  CHECK(p0.at("step").toTensor().item<float>() == 2.0f);
  CHECK(p0.at("master_param").toTensor().scalar_type() == torch::kFloat);
  CHECK(p0.contains("max_exp_avg_sq"));
  mixprec::torch_save(sd, dir + "/adam_sd.pt");
  b.w.detach().copy_(a.w.detach());
  b.b.detach().copy_(a.b.detach());
  mixprec::optim::Adam ob(b.params(), mixprec::optim::AdamOptions(0.5));
  ob.load_state_dict(mixprec::torch_load(dir + "/adam_sd.pt").toGenericDict());
  CHECK(ob.param_groups()[0].options().get_lr() == 1e-2);
  step_both(a, oa, b, ob, x, 2);
  CHECK_MSG(same(a.w.detach(), b.w.detach()),
            "state_dict round trip continues identically");
  // a mismatched optimizer is rejected and keeps its state
  Toy c(torch::kFloat);
  mixprec::optim::Adam oc({c.w}, mixprec::optim::AdamOptions(0.3));
  CHECK_THROWS(c10::Error, oc.load_state_dict(sd), "doesn't match the size");
  CHECK(oc.param_groups()[0].options().get_lr() == 0.3);
  CHECK(oc.state().empty());
}

// master_correction_bits(16): the steps of float32 masters, bit for bit (no
// midpoint in this data), the master as an int16 correction, decoded by
// master_params() and decode_master; 8 bits: int8; a float32 checkpoint loads
// into the split form and trains on as float32 masters; float16 refused.
void test_optim_split(const std::string& dir) {
  using mixprec::optim::AdamParamState;
  using mixprec::optim::AdamW;
  using mixprec::optim::AdamWOptions;
  torch::manual_seed(16);
  const auto x = torch::randn({5, 4});
  Toy a(torch::kBFloat16, 64), b(torch::kBFloat16, 64), c(torch::kBFloat16, 64);
  for (Toy* t : {&b, &c}) {
    t->w.detach().copy_(a.w.detach());
    t->b.detach().copy_(a.b.detach());
  }
  AdamW split(a.params(), AdamWOptions(1e-2).master_correction_bits(16));
  AdamW f32(b.params(), AdamWOptions(1e-2));
  step_both(a, split, b, f32, x, 3);
  CHECK_MSG(
      same(a.w.detach(), b.w.detach()) && same(a.b.detach(), b.b.detach()),
      "16-bit split masters step as float32 masters");
  const auto& s = static_cast<const AdamParamState&>(
      *split.state().at(a.w.unsafeGetTensorImpl()));
  CHECK(!s.master_param().defined() &&
        s.master_correction().scalar_type() == torch::kShort);
  const auto masters = split.master_params(), want = f32.master_params();
  CHECK_MSG(same(masters[0], want[0]) && same(masters[1], want[1]),
            "master_params() decodes the float32 masters");
  CHECK(same(mixprec::optim::decode_master(a.w.detach(), s.master_correction()),
             want[0]));
  const auto g =
      split.state_dict().at("param_groups").toListRef()[0].toGenericDict();
  CHECK(g.at("master_correction_bits").toInt() == 16);
  CHECK(f32.state_dict()
            .at("param_groups")
            .toListRef()[0]
            .toGenericDict()
            .at("master_correction_bits")
            .isNone());
  // a float32 checkpoint into the split form: trains on as float32 masters
  AdamW from32(c.params(), AdamWOptions(0.5).master_correction_bits(16));
  mixprec::torch_save(f32.state_dict(), dir + "/adamw_f32_sd.pt");
  from32.load_state_dict(
      mixprec::torch_load(dir + "/adamw_f32_sd.pt").toGenericDict());
  c.w.detach().copy_(b.w.detach());
  c.b.detach().copy_(b.b.detach());
  step_both(c, from32, b, f32, x);
  CHECK_MSG(
      same(c.w.detach(), b.w.detach()) && same(c.b.detach(), b.b.detach()),
      "float32 masters loaded into 16-bit split masters train on alike");
  CHECK(static_cast<const AdamParamState&>(
            *from32.state().at(c.w.unsafeGetTensorImpl()))
            .master_correction()
            .scalar_type() == torch::kShort);
  // 8 bits; errors
  Toy d(torch::kBFloat16, 64);
  mixprec::optim::SGD sgd8(
      d.params(),
      mixprec::optim::SGDOptions(1e-2).momentum(0.9).master_correction_bits(8));
  d.loss(x).backward();
  sgd8.step();
  CHECK(static_cast<const mixprec::optim::SGDParamState&>(
            *sgd8.state().at(d.w.unsafeGetTensorImpl()))
            .master_correction()
            .scalar_type() == torch::kChar);
  Toy h(torch::kHalf, 8);
  CHECK_THROWS(c10::ValueError,
               AdamW(h.params(), AdamWOptions().master_correction_bits(16)),
               "param_groups[0]['params'][0] is float16 in a group with "
               "master_correction_bits=16");
  CHECK_THROWS(
      c10::ValueError,
      AdamW(a.params(), AdamWOptions().master_correction_bits(4)),
      "master_correction_bits must be 0 (float32 masters), 16 or 8, got 4");
  AdamW(h.params(),
        AdamWOptions().master_correction_bits(16).master_weights(false));
}

// state_bits(8): 8-bit moments for the big param (w: 300 x 4), float32 for
// the small one; the first step equals the 32-bit step (the update uses the
// unquantized new moments); checkpoints convert between 8 and 32 bits; a
// corrupted 8-bit checkpoint is refused and changes nothing.
void test_optim_8bit(const std::string& dir) {
  torch::manual_seed(8);
  const auto x = torch::randn({5, 4});
  Toy a(torch::kBFloat16, 300), b(torch::kBFloat16, 300);
  b.w.detach().copy_(a.w.detach());
  b.b.detach().copy_(a.b.detach());
  mixprec::optim::AdamW o8(
      a.params(),
      mixprec::optim::AdamWOptions(1e-2).state_bits(8).min_8bit_size(1000));
  mixprec::optim::AdamW o32(b.params(), mixprec::optim::AdamWOptions(1e-2));
  a.loss(x).backward();
  b.loss(x).backward();
  o8.step();
  o32.step();
  CHECK_MSG(
      same(a.w.detach(), b.w.detach()) && same(a.b.detach(), b.b.detach()),
      "the first 8-bit step is the 32-bit step");
  const auto sd = o8.state_dict();
  const auto st = sd.at("state").toGenericDict();
  const auto w8 = st.at(int64_t{0}).toGenericDict();
  const auto b8 = st.at(int64_t{1}).toGenericDict();
  CHECK(w8.at("exp_avg").toTensor().scalar_type() == torch::kByte);
  CHECK(w8.at("exp_avg_sq").toTensor().scalar_type() == torch::kByte);
  CHECK(w8.at("exp_avg_absmax").toTensor().sizes() ==
        torch::IntArrayRef({300, 1}));  // 300 rows of 4: a block each
  CHECK(w8.at("quant").toStringRef() == "dynamic8/rows/b256");
  CHECK(b8.at("exp_avg").toTensor().scalar_type() == torch::kFloat);
  CHECK(b8.at("exp_avg_absmax").toTensor().numel() == 0 &&
        !b8.contains("quant"));
  const auto g = sd.at("param_groups").toListRef()[0].toGenericDict();
  CHECK(g.at("state_bits").toInt() == 8 &&
        g.at("min_8bit_size").toInt() == 1000);
  // 8 -> 32: the moments read back; 32 -> 8: quantized again, same codes
  mixprec::torch_save(sd, dir + "/adamw8_sd.pt");
  mixprec::optim::AdamW to32(b.params(), mixprec::optim::AdamWOptions(0.5));
  to32.load_state_dict(
      mixprec::torch_load(dir + "/adamw8_sd.pt").toGenericDict());
  const auto& s32 = static_cast<const mixprec::optim::AdamParamState&>(
      *to32.state().at(b.w.unsafeGetTensorImpl()));
  CHECK(s32.exp_avg().scalar_type() == torch::kFloat &&
        !s32.exp_avg_absmax().defined());
  CHECK(to32.param_groups()[0].options().get_lr() == 1e-2);
  mixprec::optim::AdamW back(
      b.params(),
      mixprec::optim::AdamWOptions(0.5).state_bits(8).min_8bit_size(1000));
  back.load_state_dict(to32.state_dict());
  const auto& s8 = static_cast<const mixprec::optim::AdamParamState&>(
      *back.state().at(b.w.unsafeGetTensorImpl()));
  CHECK_MSG(same(s8.exp_avg(), w8.at("exp_avg").toTensor()) &&
                same(s8.exp_avg_sq(), w8.at("exp_avg_sq").toTensor()) &&
                same(s8.exp_avg_absmax(), w8.at("exp_avg_absmax").toTensor()),
            "8 -> 32 -> 8 bits gives the same codes and maxima");
  // errors: bad options; a corrupted 8-bit entry (nothing changes)
  CHECK_THROWS(c10::ValueError,
               mixprec::optim::AdamW(
                   a.params(), mixprec::optim::AdamWOptions().state_bits(4)),
               "mixprec.optim.AdamW: state_bits must be 8 or 32, got 4");
  CHECK_THROWS(c10::ValueError,
               mixprec::optim::Adam(
                   a.params(),
                   mixprec::optim::AdamOptions().state_bits(8).amsgrad(true)),
               "amsgrad=True needs state_bits=32");
  auto bad = mixprec::torch_load(dir + "/adamw8_sd.pt").toGenericDict();
  auto bad_w = bad.at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  bad_w.insert_or_assign("exp_avg_absmax", torch::zeros({4}));
  mixprec::optim::AdamW fresh(
      b.params(),
      mixprec::optim::AdamWOptions(0.5).state_bits(8).min_8bit_size(1000));
  CHECK_THROWS(c10::ValueError, fresh.load_state_dict(bad), "exp_avg_absmax");
  CHECK(fresh.state().empty() &&
        fresh.param_groups()[0].options().get_lr() == 0.5);
  // SGD with an 8-bit momentum buffer trains (and its state is 8-bit)
  mixprec::optim::SGD sgd(a.params(), mixprec::optim::SGDOptions(1e-2)
                                          .momentum(0.9)
                                          .state_bits(8)
                                          .min_8bit_size(0));
  const double before = a.loss(x).item<double>();
  for (int it = 0; it < 5; ++it) {
    sgd.zero_grad();
    a.loss(x).backward();
    sgd.step();
  }
  CHECK(a.loss(x).item<double>() < before);
  // (w 8-bit; the 1-D bias keeps a float32 buffer, as in Python)
  const auto sgd_sd = sgd.state_dict().at("state").toGenericDict();
  const auto buffer = [&](int64_t i) {
    return sgd_sd.at(i).toGenericDict().at("momentum_buffer").toTensor();
  };
  CHECK(buffer(0).scalar_type() == torch::kByte);
  CHECK(buffer(1).scalar_type() == torch::kFloat);
}

// torch_save replaces its file atomically: a reader holding the previous file
// still reads all of it (written in place, its bytes would be rewritten), the
// new file is whole, nothing is left beside it, and a save that cannot be
// written throws and leaves nothing.
void test_torch_save_atomic(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string sub = dir + "/atomic_save";
  fs::remove_all(sub);
  fs::create_directories(sub);
  const std::string path = sub + "/state.pt";
  c10::impl::GenericDict a(c10::StringType::get(), c10::AnyType::get());
  a.insert("w", torch::arange(64, torch::kFloat));
  c10::impl::GenericDict b(c10::StringType::get(), c10::AnyType::get());
  b.insert("w", torch::ones({64}));
  mixprec::torch_save(a, path);
  const std::vector<char> old_bytes = mixprec::pickle_save(a);
  std::ifstream held(path, std::ios::binary);
  mixprec::torch_save(b, path);
  const std::vector<char> seen((std::istreambuf_iterator<char>(held)),
                               std::istreambuf_iterator<char>());
  CHECK(seen == old_bytes);
  CHECK(
      torch::equal(mixprec::torch_load(path).toGenericDict().at("w").toTensor(),
                   torch::ones({64})));
  int files = 0;
  for (const auto& e : fs::directory_iterator(sub)) {
    CHECK_MSG(e.path().filename() == "state.pt", e.path().string());
    ++files;
  }
  CHECK(files == 1);
  CHECK_THROWS(c10::Error, mixprec::torch_save(b, sub + "/no/such/dir/x.pt"),
               "mixprec::torch_save: cannot open");
  CHECK(!fs::exists(sub + "/no"));
}

void test_autocast_guard() {
  CHECK(!at::autocast::is_autocast_enabled(torch::kCPU));
  auto w = torch::randn({4, 4});
  {
    mixprec::AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    CHECK(at::autocast::is_autocast_enabled(torch::kCPU));
    CHECK(torch::mm(w, w).scalar_type() == torch::kBFloat16);
    {
      mixprec::AutocastGuard inner(torch::kCPU, torch::kBFloat16,
                                   /*enabled=*/false);
      CHECK(torch::mm(w, w).scalar_type() == torch::kFloat);
    }
    CHECK(torch::mm(w, w).scalar_type() == torch::kBFloat16);
  }
  CHECK(!at::autocast::is_autocast_enabled(torch::kCPU));
  CHECK(torch::mm(w, w).scalar_type() == torch::kFloat);
}

// The CPU kernels' loops run on torch's thread pool (torch's stable
// parallel_for, inside libtorch).
void test_cpu_kernel_threads() {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  CHECK(mixprec::cpu_kernel_threads() == 2);
  at::set_num_threads(1);
  CHECK(mixprec::cpu_kernel_threads() == 1);
  at::set_num_threads(before);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir =
      argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  const mixprec_test::TestList tests = {
      {"scaler basics", test_scaler_basics},
      {"scaler option errors", test_scaler_option_errors},
      {"scaler state machine + skip on inf", test_scaler_state_machine},
      {"scaler unscale values", test_scaler_unscale_values},
      {"scaler fp16 grads", test_scaler_fp16_grads},
      {"scaler + mixprec optimizer (amp-aware)", test_scaler_amp_aware},
      {"scaler hysteresis/bounds", test_scaler_hysteresis_bounds},
      {"scaler update(new_scale)", test_scaler_update_new_scale},
      {"scaler clip_grad_norm_", test_scaler_clip_grad_norm},
      {"scaler clip folded into the step", test_scaler_clip_folded_into_step},
      {"scaler clip folded, then opted out",
       test_scaler_clip_folded_then_opt_out},
      {"scaler state dict + save/load",
       [&] { test_scaler_state_dict_roundtrip(dir); }},
      {"optim vs torch::optim (fp32)", test_optim_vs_torch},
      {"optim masters + errors", test_optim_masters_and_errors},
      {"optim torch::save/load", [&] { test_optim_serialize(dir); }},
      {"optim state_dict (Python layout)", [&] { test_optim_state_dict(dir); }},
      {"optim state_bits(8)", [&] { test_optim_8bit(dir); }},
      {"optim master_correction_bits", [&] { test_optim_split(dir); }},
      {"torch_save is atomic", [&] { test_torch_save_atomic(dir); }},
      {"AutocastGuard", test_autocast_guard},
      {"CPU kernels on torch's threads", test_cpu_kernel_threads},
  };
  return mixprec_test::run_tests(tests);
}
