// The CUDA backend's launchers (csrc/cuda/*.h), run by HostExec on CPU
// tensors: the same argument checks, flattening, dtype grouping, slot wiring,
// launch plans and functor bodies as the CUDA kernels, over an emulated grid.
// Registered as the CPU kernels of the private namespace mixprec_cuda_emu,
// whose schemas tests/_cuda_emulation.py copies from mixprec's, so
// that tests call torch.ops.mixprec_cuda_emu.<op> exactly like the real op.
//
// Built into a test-only shared library on torch's stable ABI (loaded with
// torch.ops.load_library after the op library; never shipped), together with
// its own copy of the host-side checks (host_checks.cpp). A testing aid:
// nothing in mixprec calls these kernels, and the real ops' dispatch never
// reaches them.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>

#include <cstdint>

// The launchers, one header per op family (a new family adds its header).
#include "cuda/fused_adam.h"
#include "cuda/fused_sgd.h"
#include "cuda/unscale.h"
#include "cuda/update_scale.h"
#include "cuda_emulation/host_exec.h"
#include "op_table.h"

namespace mixprec {
namespace cuda_emulation {
namespace {

// The PlanOnlyExec counters as boxed kernels of schema "() -> int".
void planned_blocks(StableIValue* stack, uint64_t, uint64_t) {
  stack[0] = torch::stable::detail::from<int64_t>(PlanOnlyExec::blocks.load());
}
void planned_launches(StableIValue* stack, uint64_t, uint64_t) {
  stack[0] =
      torch::stable::detail::from<int64_t>(PlanOnlyExec::launches.load());
}
void planned_small_launches(StableIValue* stack, uint64_t, uint64_t) {
  stack[0] =
      torch::stable::detail::from<int64_t>(PlanOnlyExec::small_launches.load());
}

}  // namespace
}  // namespace cuda_emulation
}  // namespace mixprec

// Every op of the table (op_table.h), by name: <op> is its CUDA launcher
// <op>launch<Exec> (csrc/cuda/*.h) run by HostExec; plan_<op> is the same
// launcher's host work only (PlanOnlyExec: checks, grouping, plans; launches
// counted, not run). A new op needs no line here: a launcher missing or
// misnamed fails to compile.
STABLE_TORCH_LIBRARY_IMPL(mixprec_cuda_emu, CPU, m) {
  namespace cu = mixprec::cuda;
  using mixprec::cuda_emulation::HostExec;
  using mixprec::cuda_emulation::PlanOnlyExec;
#define MIXPREC_EMULATE(op)                       \
  MIXPREC_IMPL(m, op, &cu::op##launch<HostExec>); \
  m.impl(                                         \
      "plan_" #op,                                \
      &mixprec::boxed_kernel<mixprec::Op::op, &cu::op##launch<PlanOnlyExec>>);
  MIXPREC_FOR_EACH_OP(MIXPREC_EMULATE)
#undef MIXPREC_EMULATE
}

// The PlanOnlyExec counters (no tensor arguments, so no backend key routes
// them: registered for every backend).
STABLE_TORCH_LIBRARY_IMPL(mixprec_cuda_emu, CompositeExplicitAutograd, m) {
  m.impl("planned_blocks", &mixprec::cuda_emulation::planned_blocks);
  m.impl("planned_launches", &mixprec::cuda_emulation::planned_launches);
  m.impl("planned_small_launches",
         &mixprec::cuda_emulation::planned_small_launches);
}
