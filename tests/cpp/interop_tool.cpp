// The C++ half of the C++ <-> Python checks (tests/cpp/interop.py drives it):
//
//   interop_tool scaler-save PATH        run a fixed scaler scenario, save
//                                        its state (torch.save format)
//   interop_tool scaler-show PATH        load a scaler state (e.g. written
//                                        by Python) and print its state dict
//   interop_tool optim-run KIND DTYPE OUT
//                                        train a small MLP with
//                                        mixprec::optim::KIND (adamw, adam,
//                                        sgd) on DTYPE params (fp32, bf16,
//                                        fp16) + GradScaler, an inf injected
//                                        at one step; save data, initial and
//                                        final weights, masters and losses
//   interop_tool optim-ckpt KIND DTYPE DIR start|resume
//                                        optimizer state dicts C++ <-> Python
#include <mixprec/mixprec.h>

#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kScalerIters = 7;
// iterations (0-based) whose gradients get an inf in the scaler scenario
bool scaler_inf_at(int it) { return it == 1 || it == 2 || it == 5; }

mixprec::GradScalerOptions scaler_options() {
  return mixprec::GradScalerOptions()
      .init_scale(512.0)
      .growth_interval(2)
      .hysteresis(2);
}

int scaler_save(const std::string& path) {
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.0));
  mixprec::GradScaler scaler(torch::kCPU, scaler_options());
  for (int it = 0; it < kScalerIters; ++it) {
    opt.zero_grad();
    scaler.scale((w * w).sum()).backward();
    if (scaler_inf_at(it))
      w.mutable_grad()[0].fill_(std::numeric_limits<float>::infinity());
    scaler.step(opt);
    scaler.update();
  }
  scaler.save(path);
  return 0;
}

int scaler_show(const std::string& path) {
  mixprec::GradScaler scaler(torch::kCPU, scaler_options());
  scaler.load(path);
  for (const auto& e : scaler.state_dict()) {
    if (e.value().isDouble()) {
      std::printf("%s float %.17g\n", e.key().c_str(), e.value().toDouble());
    } else {
      std::printf("%s int %lld\n", e.key().c_str(),
                  static_cast<long long>(e.value().toInt()));
    }
  }
  return 0;
}

// The model of the optimizer parity check (interop.py has the same).
torch::Tensor forward(const std::vector<torch::Tensor>& p,
                      const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  auto h = torch::relu(F::linear(x.to(p[0].scalar_type()), p[0], p[1]));
  auto out = F::linear(h, p[2], p[3]);
  return out;
}

std::unique_ptr<mixprec::optim::FusedOptimizer> make_optimizer(
    const std::string& kind, const std::vector<torch::Tensor>& params,
    double lr) {
  // (adamw8 / sgd8: 8-bit state for the 32x16 weight, float32 moments with
  // empty maxima for the three tensors below min_8bit_size; a suffix -s16 or
  // -s8: master_correction_bits 16 or 8)
  int64_t split = 0;
  const auto suffix = kind.find("-s");
  if (suffix != std::string::npos) split = std::stoll(kind.substr(suffix + 2));
  const std::string base = kind.substr(0, suffix);
  if (base == "adamw" || base == "adamw8") {
    auto o = mixprec::optim::AdamWOptions(lr).weight_decay(0.1);
    if (base == "adamw8") o.state_bits(8).min_8bit_size(64);
    o.master_correction_bits(split);
    return std::make_unique<mixprec::optim::AdamW>(params, o);
  }
  if (base == "adam") {
    return std::make_unique<mixprec::optim::Adam>(
        params, mixprec::optim::AdamOptions(lr)
                    .weight_decay(0.01)
                    .amsgrad(true)
                    .master_correction_bits(split));
  }
  TORCH_CHECK(base == "sgd" || base == "sgd8", "unknown optimizer ", kind);
  auto o =
      mixprec::optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(
          1e-3);
  if (base == "sgd8") o.state_bits(8).min_8bit_size(64);
  o.master_correction_bits(split);
  return std::make_unique<mixprec::optim::SGD>(params, o);
}

int optim_run(const std::string& kind, const std::string& dtype_name,
              const std::string& out_path) {
  const torch::ScalarType dtype = dtype_name == "bf16"   ? torch::kBFloat16
                                  : dtype_name == "fp16" ? torch::kHalf
                                                         : torch::kFloat;
  const int steps = 12;
  const int inject = 4;  // 0-based iteration with an inf gradient
  torch::manual_seed(1234);
  const auto x = torch::randn({64, 16});
  const auto y = torch::randn({64, 1});
  std::vector<torch::Tensor> params = {
      (torch::randn({32, 16}) * 0.25).to(dtype),
      (torch::randn({32}) * 0.1).to(dtype),
      (torch::randn({1, 32}) * 0.25).to(dtype),
      (torch::randn({1}) * 0.1).to(dtype)};
  for (auto& p : params) p.requires_grad_();
  std::vector<torch::Tensor> initial;
  for (const auto& p : params) initial.push_back(p.detach().clone());

  std::unique_ptr<mixprec::optim::FusedOptimizer> opt;
  try {
    opt = make_optimizer(kind, params, 1e-2);
  } catch (const c10::Error&) {
    std::fprintf(stderr, "unknown optimizer %s\n", kind.c_str());
    return 2;
  }
  mixprec::GradScaler scaler(
      torch::kCPU,
      mixprec::GradScalerOptions().init_scale(1024.0).growth_interval(3));
  std::vector<double> losses, scales;
  std::vector<int64_t> stepped;
  for (int it = 0; it < steps; ++it) {
    opt->zero_grad();
    auto loss = torch::mse_loss(forward(params, x).to(torch::kFloat), y);
    scaler.scale(loss).backward();
    if (it == inject) {
      params[2].mutable_grad().view(-1)[3].fill_(
          std::numeric_limits<float>::infinity());
    }
    if (it % 2 == 1) scaler.clip_grad_norm_(*opt, 0.5);  // exercise both routes
    stepped.push_back(scaler.step(*opt) ? 1 : 0);
    scaler.update();
    losses.push_back(loss.item<double>());
    scales.push_back(scaler.get_scale());
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("kind", kind);
  out.insert("dtype", dtype_name);
  out.insert("steps", static_cast<int64_t>(steps));
  out.insert("inject", static_cast<int64_t>(inject));
  out.insert("x", x);
  out.insert("y", y);
  out.insert("initial", c10::List<torch::Tensor>(initial));
  std::vector<torch::Tensor> final_params;
  for (const auto& p : params) final_params.push_back(p.detach().clone());
  out.insert("final", c10::List<torch::Tensor>(final_params));
  out.insert("masters", c10::List<torch::Tensor>(opt->master_params()));
  out.insert("losses", torch::tensor(losses, torch::kDouble));
  out.insert("scales", torch::tensor(scales, torch::kDouble));
  out.insert("stepped", torch::tensor(stepped, torch::kLong));
  mixprec::torch_save(c10::IValue(out), out_path);
  return 0;
}

std::vector<torch::Tensor> tensor_list(const c10::IValue& v) {
  std::vector<torch::Tensor> out;
  for (const auto& e : v.toListRef()) out.push_back(e.toTensor());
  return out;
}

c10::Dict<c10::IValue, c10::IValue> load_dict(const std::string& path) {
  return mixprec::torch_load(path).toGenericDict();
}

// Plain optimizer steps (no scaler); returns the losses.
std::vector<double> train(mixprec::optim::FusedOptimizer& opt,
                          const std::vector<torch::Tensor>& params,
                          const torch::Tensor& x, const torch::Tensor& y,
                          int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto loss = torch::mse_loss(forward(params, x).to(torch::kFloat), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// Optimizer checkpoints between C++ and Python (see interop.py):
//  start:  3 steps, save data + params + optimizer.state_dict(), 3 more steps
//  resume: load params + an optimizer state dict saved by Python (the
//          optimizer is built with another lr: the groups must come from the
//          file), 3 steps
int optim_ckpt(const std::string& kind, const std::string& dtype_name,
               const std::string& dir, const std::string& phase) {
  const torch::ScalarType dtype = dtype_name == "bf16"   ? torch::kBFloat16
                                  : dtype_name == "fp16" ? torch::kHalf
                                                         : torch::kFloat;
  if (phase == "start") {
    torch::manual_seed(99);
    const auto x = torch::randn({32, 16});
    const auto y = torch::randn({32, 1});
    std::vector<torch::Tensor> params = {
        (torch::randn({32, 16}) * 0.25).to(dtype),
        (torch::randn({32}) * 0.1).to(dtype),
        (torch::randn({1, 32}) * 0.25).to(dtype),
        (torch::randn({1}) * 0.1).to(dtype)};
    for (auto& p : params) p.requires_grad_();
    auto opt = make_optimizer(kind, params, 1e-2);
    train(*opt, params, x, y, 3);
    c10::impl::GenericDict data(c10::StringType::get(), c10::AnyType::get());
    data.insert("x", x);
    data.insert("y", y);
    std::vector<torch::Tensor> snap;
    for (const auto& p : params) snap.push_back(p.detach().clone());
    data.insert("params", c10::List<torch::Tensor>(snap));
    mixprec::torch_save(data, dir + "/data.pt");
    mixprec::torch_save(opt->state_dict(), dir + "/opt_cpp.pt");
    const auto losses = train(*opt, params, x, y, 3);
    c10::impl::GenericDict cont(c10::StringType::get(), c10::AnyType::get());
    cont.insert("losses", c10::List<double>(losses));
    std::vector<torch::Tensor> final_params;
    for (const auto& p : params) final_params.push_back(p.detach().clone());
    cont.insert("final", c10::List<torch::Tensor>(final_params));
    mixprec::torch_save(cont, dir + "/cpp_cont.pt");
    return 0;
  }
  TORCH_CHECK(phase == "resume", "phase must be start or resume");
  const auto data = load_dict(dir + "/data.pt");
  const auto x = data.at("x").toTensor();
  const auto y = data.at("y").toTensor();
  std::vector<torch::Tensor> params;
  for (const auto& t :
       tensor_list(load_dict(dir + "/py_params.pt").at("params"))) {
    params.push_back(t.clone().requires_grad_());
  }
  auto opt = make_optimizer(kind, params, 0.5);  // lr must come from the file
  opt->load_state_dict(load_dict(dir + "/opt_py.pt"));
  const auto losses = train(*opt, params, x, y, 3);
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("losses", c10::List<double>(losses));
  out.insert("lr", opt->param_groups()[0].options().get_lr());
  mixprec::torch_save(out, dir + "/cpp_resume.pt");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 2 && a[0] == "scaler-save") return scaler_save(a[1]);
    if (a.size() == 2 && a[0] == "scaler-show") return scaler_show(a[1]);
    if (a.size() == 4 && a[0] == "optim-run")
      return optim_run(a[1], a[2], a[3]);
    if (a.size() == 5 && a[0] == "optim-ckpt")
      return optim_ckpt(a[1], a[2], a[3], a[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "interop_tool: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: interop_tool scaler-save PATH | scaler-show PATH | "
               "optim-run adamw|adam|sgd fp32|bf16|fp16 OUT | "
               "optim-ckpt adamw|adam|sgd fp32|bf16|fp16 DIR start|resume\n");
  return 2;
}
