// mixprec::CapturedStep -- a whole training step in one CUDA graph, for
// LibTorch programs: the C++ form of Python's mixprec.capture_step
// (docs/capture.md). The step is written as for eager training and ends in
// scaler.update(); on CUDA it is captured once (at::cuda::CUDAGraph) and each
// later call copies its inputs into static buffers and replays the graph:
// one launch, no host sync, the loss returned as a device tensor.
//
//   mixprec::optim::AdamW opt(params, mixprec::optim::AdamWOptions(3e-4));
//   mixprec::GradScaler scaler(torch::kCUDA);
//   mixprec::CapturedStep step(
//       [&](const std::vector<at::Tensor>& in) {
//         opt.zero_grad(/*set_to_none=*/false);  // grads keep their storage
//         at::Tensor loss;
//         {
//           mixprec::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
//           loss = loss_fn(model->forward(in[0]), in[1]);
//         }
//         scaler.scale(loss).backward();
//         scaler.clip_grad_norm_(opt, 1.0);
//         scaler.step_no_sync(opt);  // step() would read the inf flag
//         scaler.update();
//         return loss;
//       },
//       {x0, y0}, {&opt}, &scaler);
//   for (...) {
//     at::Tensor loss = step({x, y});  // x, y: the shapes of x0, y0
//     opt.param_groups()[0].options().set_lr(next_lr);  // reaches the graph
//   }
//
// A call: the first `warmup` calls run the step eagerly (on a side stream on
// CUDA); the next runs it eagerly under the checks below (the checked call);
// the next captures it and replays the graph; later calls replay. Every call
// is a training step on its own inputs, so a captured run is, call for call,
// the eager loop. `example_inputs` fix the inputs' shapes, dtypes and
// devices; they are not trained on. Without CUDA tensors there is no graph:
// every call runs eagerly, with the same checks (graphed() stays false).
//
// Before every call, without a host sync, at a cost that does not grow with
// the number of params: each param group's lr is written into the device
// tensor the fused kernels read (FusedOptimizer::lr_tensor()), and a check
// compares what can change between calls: the optimizers' version() (moved
// by a load_state_dict or torch::load of a checkpoint, add_param_group), the
// scaler's settings_version(), the group and param counts, the baked
// options, each group's first param and its grad, the scale tensor. When it
// sees a change, every param, grad and state tensor is checked (rebind()):
// optimizer state replaced by a load is copied into the captured tensors,
// which are put back into the state, so training goes on bit for bit; a
// grad dropped between calls (LibTorch's zero_grad() sets grads to none) is
// put back.
//
// Not seen by that check: a later param of a group given new storage, its
// grad replaced alone, state tensors replaced through state() by hand. Call
// rebind() after such a change.
//
// c10::Error naming the cause, before anything changes:
//  * at construction: an optimizer that is not a mixprec::optim optimizer
//    (torch::optim's C++ optimizers count steps on the host), warmup < 0;
//  * at a call: an input whose shape, dtype or device differs from the
//    example's (another shape needs its own CapturedStep: one graph per
//    step; several steps can share a memory pool, options.pool()); a param
//    in new storage, or a grad or state tensor replaced by one of another
//    shape or dtype, since the checked call (where the check above sees it,
//    or at rebind(); the graph holds the old addresses: load params in place
//    with copy_); a change of what the graph bakes in: an option other than
//    lr, the scaler's settings, the param groups (csrc/capture_rules.h and
//    mixprec/optim.h list them); a call inside an autocast region with its
//    cast cache on;
//  * by the checked call, after running the step: an op that reads a device
//    value on the host (.item(), bool(), GradScaler::step()'s answer,
//    boolean-mask indexing, a copy to the CPU, an op returning a float or a
//    bool; on CUDA also any sync, under c10::cuda's sync debug mode), a
//    persistent tensor given new storage or an lr set inside the step, an
//    iteration not closed by scaler.update().
// Host code inside the step runs at capture only (on CUDA): a counter or an
// `if` on a host value is frozen.
#pragma once

#include "mixprec/export.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace mixprec {

class GradScaler;

struct MIXPREC_API CapturedStepOptions {
  // eager calls before the checked call (>= 0)
  TORCH_ARG(int64_t, warmup) = 2;
  // the CUDA graph memory pool (at::cuda::graph_pool_handle()) to share with
  // other captured steps, e.g. one per input shape; {0, 0}: a new one
  TORCH_ARG(c10::MempoolId_t, pool) = { 0, 0 };
};

class MIXPREC_API CapturedStep {
 public:
  // The step: takes the static input tensors, returns the loss.
  using StepFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

  // `optimizers`: every optimizer the step steps (mixprec::optim ones);
  // `scaler`: the step's GradScaler, or nullptr. Both must outlive this.
  CapturedStep(StepFn step, const std::vector<at::Tensor>& example_inputs,
               std::vector<torch::optim::Optimizer*> optimizers,
               GradScaler* scaler = nullptr, CapturedStepOptions options = {});
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // One training step on `inputs` (copied into the static buffers); returns
  // the loss, detached (on a replay a copy of the graph's output).
  at::Tensor operator()(const std::vector<at::Tensor>& inputs);

  // Checks every param, grad and state tensor against the checked call's
  // now, as a call does when its check sees a change: a state tensor or
  // grad replaced by one of the same shape, dtype and device is copied into
  // the captured one, which is put back; a dropped grad is put back; c10::
  // Error for anything else (before any write). Nothing before the checked
  // call.
  void rebind();

  // Calls made so far.
  int64_t calls() const;
  // Whether a CUDA graph was captured (later calls replay it).
  bool graphed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixprec
