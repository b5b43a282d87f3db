// The test-only extension module mixprec._cuda_emulation_C (built with
// MIXPREC_BUILD_TEST_EXT=1, which `make test` sets; never shipped): loading
// it registers the emulated CUDA launchers (ops_emulated.cpp) as the CPU
// kernels of mixprec_cuda_emu, whose schemas
// tests/_cuda_emulation.py defines (mixprec._C must be loaded
// first). The module carries the plan-only launchers' eager fast entries
// (emu_plan_<op>, through python_entry/fast_call.h like mixprec._C's), for
// measuring the CUDA path's host cost without a GPU
// (benchmarks/bench_host_cost.py --emulated).
#include <Python.h>

#include "op_table.h"
#include "python_entry/fast_call.h"

namespace {

using mixprec::OpSig;
using mixprec::python::fast_entry;

constexpr char kPlanUnscaleAndCheck[] =
    "mixprec_cuda_emu::plan_unscale_and_check_";
constexpr char kPlanFusedAdam[] = "mixprec_cuda_emu::plan_fused_adam_";
constexpr char kPlanFusedSgd[] = "mixprec_cuda_emu::plan_fused_sgd_";

PyMethodDef methods[] = {
    {"emu_plan_unscale_and_check_",
     fast_entry<kPlanUnscaleAndCheck, OpSig<&mixprec::unscale_and_check_>>,
     METH_VARARGS, nullptr},
    {"emu_plan_fused_adam_",
     fast_entry<kPlanFusedAdam, OpSig<&mixprec::fused_adam_>>, METH_VARARGS,
     nullptr},
    {"emu_plan_fused_sgd_",
     fast_entry<kPlanFusedSgd, OpSig<&mixprec::fused_sgd_>>, METH_VARARGS,
     nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_cuda_emulation_C",
    "mixprec's CUDA launchers run on the CPU (tests only); ops in "
    "torch.ops.mixprec_cuda_emu.",
    -1,
    methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__cuda_emulation_C(void) {
  return PyModule_Create(&module_def);
}
