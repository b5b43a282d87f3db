// The GPU proof of mixprec::CapturedStep: a captured run (one CUDA graph,
// replayed) and an eager run of identical copies, 50 steps on the same data:
// an MLP with float16 params (float32 masters), fp16 autocast, AdamW,
// GradScaler, clipping folded into the step, forced overflows (an inf in the
// input at 4 steps), scale growth, an lr changed every 10 steps between
// calls. Both runs go under c10::cuda's sync debug mode set to error after
// setup, so any host sync raises; every loss, param, master, moment, step
// count and the scale are compared bit for bit at the end. Exit 0: equal;
// 1: a mismatch or an error; 77: no CUDA device (ctest: skipped).
//
//   ctest --test-dir build/cmake-tests -L gpu --output-on-failure
#include <mixprec/mixprec.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using Inputs = std::vector<torch::Tensor>;
constexpr int kSteps = 50;

bool bitwise(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  const auto bytes = [](const torch::Tensor& t) {
    return t.detach().contiguous().reshape({-1}).view(torch::kByte).cpu();
  };
  return torch::equal(bytes(a), bytes(b));
}

struct Run {
  std::vector<torch::Tensor> params;  // w1, b1, w2, b2 (float16)
  std::unique_ptr<mixprec::optim::AdamW> opt;
  std::unique_ptr<mixprec::GradScaler> scaler;

  Run() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    for (auto shape :
         std::vector<std::vector<int64_t>>{{256, 64}, {256}, {16, 256}, {16}}) {
      params.push_back((torch::randn(shape, gen) * 0.1)
                           .to(torch::kCUDA, torch::kHalf)
                           .requires_grad_());
    }
    opt = std::make_unique<mixprec::optim::AdamW>(
        params, mixprec::optim::AdamWOptions(1e-3).weight_decay(0.05));
    scaler = std::make_unique<mixprec::GradScaler>(
        torch::kCUDA,
        mixprec::GradScalerOptions().init_scale(4096.0).growth_interval(5));
  }

  torch::Tensor step(const Inputs& in) {
    opt->zero_grad(/*set_to_none=*/false);
    torch::Tensor loss;
    {
      mixprec::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
      auto h = torch::relu(
          torch::nn::functional::linear(in[0], params[0], params[1]));
      auto out = torch::nn::functional::linear(h, params[2], params[3]);
      loss = torch::mse_loss(out.to(torch::kFloat), in[1]);
    }
    scaler->scale(loss).backward();
    scaler->clip_grad_norm_(*opt, 1.0);
    scaler->step_no_sync(*opt);
    scaler->update();
    return loss;
  }

  // every tensor the step changes (clones: no host read)
  std::vector<torch::Tensor> snapshot() {
    std::vector<torch::Tensor> out;
    for (const auto& p : params) {
      out.push_back(p.detach().clone());
      auto& s = static_cast<mixprec::optim::AdamParamState&>(
          *opt->state().at(p.unsafeGetTensorImpl()));
      for (const auto& t :
           {s.step(), s.exp_avg(), s.exp_avg_sq(), s.master_param()}) {
        out.push_back(t.clone());
      }
    }
    out.push_back(scaler->scale_tensor().clone());
    return out;
  }
};

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  try {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<Inputs> data;
    for (int k = 0; k < kSteps; ++k) {
      auto x = torch::randn({32, 64}, gen);
      if (k == 2 || k == 9 || k == 23 || k == 41) {
        x[0][0] = std::numeric_limits<float>::infinity();  // an overflow
      }
      data.push_back({x.cuda(), torch::randn({32, 16}, gen).cuda()});
    }
    Run eager, captured;
    mixprec::CapturedStep step(
        [&](const Inputs& in) { return captured.step(in); }, data[0],
        {captured.opt.get()}, captured.scaler.get());
    std::vector<torch::Tensor> losses_e, losses_c;
    std::vector<std::vector<torch::Tensor>> snaps_e, snaps_c;
    torch::cuda::synchronize();
    // from here on, any host sync raises
    c10::cuda::warning_state().set_sync_debug_mode(
        c10::cuda::SyncDebugMode::L_ERROR);
    for (int k = 0; k < kSteps; ++k) {
      if (k % 10 == 0) {
        const double lr = 1e-3 / (1 + k / 10);
        eager.opt->param_groups()[0].options().set_lr(lr);
        captured.opt->param_groups()[0].options().set_lr(lr);
      }
      losses_e.push_back(eager.step(data[k]));
      losses_c.push_back(step(data[k]));
      snaps_e.push_back(eager.snapshot());
      snaps_c.push_back(captured.snapshot());
    }
    c10::cuda::warning_state().set_sync_debug_mode(
        c10::cuda::SyncDebugMode::L_DISABLED);
    int mismatches = 0;
    for (int k = 0; k < kSteps; ++k) {
      bool ok = bitwise(losses_e[k], losses_c[k]);
      for (size_t i = 0; i < snaps_e[k].size(); ++i) {
        ok = ok && bitwise(snaps_e[k][i], snaps_c[k][i]);
      }
      if (!ok) {
        ++mismatches;
        std::printf("FAIL step %d: captured != eager\n", k);
      }
    }
    const bool graphed = step.graphed();
    if (!graphed) std::printf("FAIL: no graph was captured\n");
    const double scale = captured.scaler->get_scale();
    std::printf(
        "%s: captured == eager bit for bit over %d steps (%d "
        "mismatched), graphed %d, final scale %g, no host sync\n",
        mismatches == 0 && graphed ? "ok" : "FAIL", kSteps, mismatches,
        graphed ? 1 : 0, scale);
    return mismatches == 0 && graphed ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
