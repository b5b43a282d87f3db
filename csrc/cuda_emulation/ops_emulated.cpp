// The CUDA backend's launchers (csrc/cuda/*.h), run by HostExec on CPU
// tensors: the same argument checks, flattening, dtype grouping, slot wiring,
// launch plans and functor bodies as the CUDA kernels, over an emulated grid.
// Registered as the CPU kernels of the private namespace mixprec_cuda_emu,
// whose schemas python/mixprec/ops/_cuda_emulation.py copies from mixprec's, so
// that tests call torch.ops.mixprec_cuda_emu.<op> exactly like the real op.
//
// A testing aid: nothing in mixprec calls these kernels, and the real ops'
// dispatch never reaches them.
#include <torch/library.h>

#include <vector>

#include "cuda/fused_adam.h"
#include "cuda/fused_sgd.h"
#include "cuda/unscale.h"
#include "cuda/update_scale.h"
#include "cuda_emulation/host_exec.h"

namespace mixprec {
namespace cuda_emulation {
namespace {

int64_t planned_blocks() { return PlanOnlyExec::blocks.load(); }
int64_t planned_launches() { return PlanOnlyExec::launches.load(); }
int64_t planned_small_launches() { return PlanOnlyExec::small_launches.load(); }

// Plan reuse (cuda::PlanReuse, launch_plan.h): the counters of every CUDA
// launcher in this process (emulated, plan-only and, in a CUDA build, the
// real ones), the switch, and clearing every thread's stored plans.
std::vector<int64_t> plan_cache_stats() {
  using cuda::PlanReuse;
  return {PlanReuse::builds.load(), PlanReuse::reuses.load(),
          PlanReuse::uncacheable.load()};
}
bool set_plan_reuse(bool enabled) {
  return cuda::PlanReuse::enabled.exchange(enabled);
}
void clear_plan_cache() { cuda::PlanReuse::clear(); }

}  // namespace
}  // namespace cuda_emulation
}  // namespace mixprec

// <op>: the CUDA launcher run by HostExec. plan_<op> (multi-tensor ops): its
// host work only (PlanOnlyExec).
TORCH_LIBRARY_IMPL(mixprec_cuda_emu, CPU, m) {
  namespace emu = mixprec::cuda_emulation;
  namespace cu = mixprec::cuda;
  using emu::HostExec;
  using emu::PlanOnlyExec;
  MIXPREC_IMPL(m, unscale_and_check_, &cu::unscale_and_check_op<HostExec>);
  MIXPREC_IMPL(m, check_finite_, &cu::check_finite_op<HostExec>);
  MIXPREC_IMPL(m, unscale_and_norm_, &cu::unscale_and_norm_op<HostExec>);
  MIXPREC_IMPL(m, check_finite_and_norm_,
               &cu::check_finite_and_norm_op<HostExec>);
  MIXPREC_IMPL(m, update_scale_, &cu::update_scale_launch<HostExec>);
  MIXPREC_IMPL(m, update_scale_ext_, &cu::update_scale_ext_launch<HostExec>);
  MIXPREC_IMPL(m, fused_adam_, &cu::fused_adam_launch<HostExec>);
  MIXPREC_IMPL(m, fused_sgd_, &cu::fused_sgd_launch<HostExec>);
  MIXPREC_IMPL(m, fused_adam8_, &cu::fused_adam8_launch<HostExec>);
  MIXPREC_IMPL(m, fused_sgd8_, &cu::fused_sgd8_launch<HostExec>);
  using mixprec::kernel;
  m.impl("plan_unscale_and_check_",
         kernel<&mixprec::unscale_and_check_,
                &cu::unscale_and_check_op<PlanOnlyExec>>);
  m.impl("plan_check_finite_",
         kernel<&mixprec::check_finite_, &cu::check_finite_op<PlanOnlyExec>>);
  m.impl("plan_unscale_and_norm_",
         kernel<&mixprec::unscale_and_norm_,
                &cu::unscale_and_norm_op<PlanOnlyExec>>);
  m.impl("plan_check_finite_and_norm_",
         kernel<&mixprec::check_finite_and_norm_,
                &cu::check_finite_and_norm_op<PlanOnlyExec>>);
  m.impl("plan_fused_adam_",
         kernel<&mixprec::fused_adam_, &cu::fused_adam_launch<PlanOnlyExec>>);
  m.impl("plan_fused_sgd_",
         kernel<&mixprec::fused_sgd_, &cu::fused_sgd_launch<PlanOnlyExec>>);
  m.impl("plan_fused_adam8_",
         kernel<&mixprec::fused_adam8_, &cu::fused_adam8_launch<PlanOnlyExec>>);
  m.impl("plan_fused_sgd8_",
         kernel<&mixprec::fused_sgd8_, &cu::fused_sgd8_launch<PlanOnlyExec>>);
}

// Counters of PlanOnlyExec and of plan reuse (no tensor arguments: a
// CatchAll kernel).
TORCH_LIBRARY_IMPL(mixprec_cuda_emu, CompositeExplicitAutograd, m) {
  m.impl("planned_blocks", &mixprec::cuda_emulation::planned_blocks);
  m.impl("planned_launches", &mixprec::cuda_emulation::planned_launches);
  m.impl("planned_small_launches",
         &mixprec::cuda_emulation::planned_small_launches);
  m.impl("plan_cache_stats", &mixprec::cuda_emulation::plan_cache_stats);
  m.impl("set_plan_reuse", &mixprec::cuda_emulation::set_plan_reuse);
  m.impl("clear_plan_cache", &mixprec::cuda_emulation::clear_plan_cache);
}
