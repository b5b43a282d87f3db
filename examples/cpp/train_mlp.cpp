// Mixed-precision training of a small MLP from C++ (LibTorch) with mixprec:
//   * the model's parameters are 16-bit (bfloat16 or float16) and
//     mixprec::optim::AdamW keeps float32 master weights for them;
//   * the forward pass runs under autocast (mixprec::AutocastGuard, the C++
//     form of `with torch.autocast(device, dtype)`);
//   * mixprec::GradScaler scales the loss, unscales + clips the gradients in
//     one pass (clip_grad_norm_) and skips the step whose gradients hold
//     inf/NaN -- at --inject-inf STEP an inf is written into one gradient to
//     show the skip and the scale backoff.
// Prints the loss and the scale of every step. examples/cpp/train_mlp_twin.py
// is the same program in Python; their loss sequences agree (ctest checks it).
//
//   train_mlp [--device cpu|cuda] [--dtype bf16|fp16] [--steps N]
//             [--inject-inf STEP] [--seed S] [--lr LR]
#include <mixprec/mixprec.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace {

struct Args {
  std::string device = "cpu";
  std::string dtype = "bf16";
  int steps = 40;
  int inject_inf = 20;  // 0: never
  int64_t seed = 0;
  double lr = 1e-3;
};

[[noreturn]] void usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [--device cpu|cuda] [--dtype bf16|fp16] [--steps N] "
               "[--inject-inf STEP] [--seed S] [--lr LR]\n",
               prog);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0]);
    const std::string v = argv[++i];
    if (k == "--device")
      a.device = v;
    else if (k == "--dtype")
      a.dtype = v;
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--inject-inf")
      a.inject_inf = std::stoi(v);
    else if (k == "--seed")
      a.seed = std::stoll(v);
    else if (k == "--lr")
      a.lr = std::stod(v);
    else
      usage(argv[0]);
  }
  if ((a.device != "cpu" && a.device != "cuda") ||
      (a.dtype != "bf16" && a.dtype != "fp16")) {
    usage(argv[0]);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const torch::Device device(args.device == "cuda" ? torch::kCUDA
                                                   : torch::kCPU);
  const torch::ScalarType dtype =
      args.dtype == "fp16" ? torch::kHalf : torch::kBFloat16;
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "train_mlp: --device cuda but no CUDA device\n");
    return 1;
  }
  const auto info = mixprec::build_info();
  std::printf(
      "mixprec %s | torch %s | device %s | dtype %s | CUDA kernels %s\n",
      info.version.c_str(), info.torch_version.c_str(), args.device.c_str(),
      args.dtype.c_str(), info.cuda_kernels ? "yes" : "no");

  // Model: initialised in float32 from the seed (same as the Python twin),
  // then cast to 16 bits.
  torch::manual_seed(args.seed);
  // (one statement per layer: the order of the random initialisations must
  // be that of Python's nn.Sequential(...), and C++ leaves the evaluation
  // order of constructor arguments unspecified)
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(16, 64));
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::Linear(64, 64));
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::Linear(64, 1));
  model->to(device, dtype);

  // Data: a fixed random regression problem, float32 (autocast casts it).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(args.seed + 1);
  const torch::Tensor x = torch::randn({256, 16}, gen).to(device);
  const torch::Tensor w = torch::randn({16, 1}, gen).to(device);
  const torch::Tensor y = torch::tanh(x.matmul(w));

  mixprec::optim::AdamW optimizer(
      model->parameters(),
      mixprec::optim::AdamWOptions(args.lr).weight_decay(0.01));
  mixprec::GradScaler scaler(
      device.type(),
      mixprec::GradScalerOptions().init_scale(1024.0).growth_interval(10));

  int skipped = 0;
  for (int step = 1; step <= args.steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      mixprec::AutocastGuard autocast(device.type(), dtype);
      loss = torch::mse_loss(model->forward(x), y);  // float32 under autocast
    }
    scaler.scale(loss).backward();
    if (step == args.inject_inf) {
      // an overflow in one gradient: the step must be skipped
      auto g = model->parameters()[0].mutable_grad();
      g.view(-1)[0].fill_(std::numeric_limits<float>::infinity());
    }
    scaler.clip_grad_norm_(optimizer, 1.0);
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    if (!stepped) ++skipped;
    std::printf("step %d loss %.9e scale %.1f%s\n", step, loss.item<double>(),
                scaler.get_scale(), stepped ? "" : " skipped");
  }
  std::printf("done: %d steps, %d skipped\n", args.steps, skipped);
  return 0;
}
