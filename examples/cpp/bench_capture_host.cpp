// What a mixprec::CapturedStep call spends on the host besides the replay
// launch: the checks and preparation before the step (what the graph bakes
// in, params, grads, optimizer state, the scaler; the lr tensors) and the copy
// of the inputs into the static buffers. On the CPU, one thread, without a
// GPU: the step is captured as usual (warm-up calls and the checked call run
// a real training step), then the timed calls run a body that returns a
// ready loss, so that a call costs its preparation alone (on a GPU, a replay
// launch would follow it).
//
// The model: n param tensors, n / 2 float16 Linear(32, 32) layers (weight and
// bias) with float32 masters in mixprec::optim::AdamW and a GradScaler: what
// the host path walks is the count, not the size. 148 tensors is GPT-2
// small's count.
//
//   bench_capture_host [--sizes 148,1480] [--calls 200] [--blocks 9]
//
// Prints, per size, the median over the blocks of the wall time per call and
// of the thread's CPU time per call (less disturbed by other processes), and
// the fastest block, in microseconds. Built with the example (ctest's
// mixprec_example_build), not run by ctest; nothing is asserted on time.
#include <mixprec/mixprec.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
  std::vector<int> sizes = {148, 1480};
  int calls = 200;
  int blocks = 9;
};

[[noreturn]] void usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [--sizes N,N,...] [--calls C] [--blocks B]\n"
               "  N: param tensors, even (N / 2 Linear(32, 32) layers)\n",
               prog);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0]);
    const std::string v = argv[++i];
    if (k == "--sizes") {
      a.sizes.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) {
        a.sizes.push_back(std::stoi(item));
      }
    } else if (k == "--calls") {
      a.calls = std::stoi(v);
    } else if (k == "--blocks") {
      a.blocks = std::stoi(v);
    } else {
      usage(argv[0]);
    }
  }
  for (int n : a.sizes) {
    if (n < 2 || n % 2 != 0) usage(argv[0]);
  }
  if (a.calls < 1 || a.blocks < 1) usage(argv[0]);
  return a;
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Figures {
  double wall_median, cpu_median, wall_fastest;
};

Figures time_size(int n, const Args& args) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < n / 2; ++i) {
    params.push_back(
        (torch::randn({32, 32}) * 0.1).to(torch::kHalf).requires_grad_());
    params.push_back(torch::zeros({32}, torch::kHalf).requires_grad_());
  }
  mixprec::optim::AdamW opt(params, mixprec::optim::AdamWOptions(1e-3));
  mixprec::GradScaler scaler(torch::kCPU);
  bool timing = false;
  const torch::Tensor ready_loss = torch::zeros({});
  mixprec::CapturedStep step(
      [&](const std::vector<torch::Tensor>& in) {
        if (timing) return ready_loss;
        opt.zero_grad(/*set_to_none=*/false);
        const torch::Tensor x = in[0].to(torch::kHalf);
        torch::Tensor loss = torch::zeros({});
        for (size_t i = 0; i < params.size(); i += 2) {
          loss =
              loss + torch::nn::functional::linear(x, params[i], params[i + 1])
                         .to(torch::kFloat)
                         .pow(2)
                         .mean();
        }
        scaler.scale(loss).backward();
        scaler.step_no_sync(opt);
        scaler.update();
        return loss;
      },
      {torch::randn({4, 32})}, {&opt}, &scaler);
  const std::vector<torch::Tensor> in = {torch::randn({4, 32})};
  // two warm-up calls and the checked call: real steps
  for (int k = 0; k < 3; ++k) step(in);
  // (untimed) every param has a grad and optimizer state
  for (const auto& p : params) {
    if (!p.grad().defined() ||
        opt.state().count(p.unsafeGetTensorImpl()) == 0) {
      std::fprintf(stderr, "check failed: a param without grad or state\n");
      std::exit(1);
    }
  }
  timing = true;
  for (int k = 0; k < args.calls; ++k) step(in);  // warm the caches
  std::vector<double> wall, cpu;
  for (int b = 0; b < args.blocks; ++b) {
    const double w0 = wall_seconds(), c0 = thread_seconds();
    for (int k = 0; k < args.calls; ++k) step(in);
    const double w1 = wall_seconds(), c1 = thread_seconds();
    wall.push_back(1e6 * (w1 - w0) / args.calls);
    cpu.push_back(1e6 * (c1 - c0) / args.calls);
  }
  if (step.calls() !=
      3 + static_cast<int64_t>(args.calls) * (1 + args.blocks)) {
    std::fprintf(stderr, "check failed: %lld calls counted\n",
                 static_cast<long long>(step.calls()));
    std::exit(1);
  }
  return {median(wall), median(cpu),
          *std::min_element(wall.begin(), wall.end())};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  at::set_num_threads(1);
  const auto info = mixprec::build_info();
  std::printf(
      "mixprec %s | torch %s | CapturedStep host cost per call (CPU, one "
      "thread), us: median of %d blocks of %d calls\n",
      info.version.c_str(), info.torch_version.c_str(), args.blocks,
      args.calls);
  std::printf("%8s %12s %12s %14s\n", "tensors", "wall", "thread CPU",
              "fastest block");
  for (int n : args.sizes) {
    const Figures f = time_size(n, args);
    std::printf("%8d %12.2f %12.2f %14.2f\n", n, f.wall_median, f.cpu_median,
                f.wall_fastest);
    std::fflush(stdout);
  }
  return 0;
}
