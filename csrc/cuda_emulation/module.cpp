// The test-only extension module mixprec._cuda_emulation_C (built with
// MIXPREC_BUILD_TEST_EXT=1, which `make test` sets; never shipped): loading
// it registers the emulated CUDA launchers (ops_emulated.cpp) as the CPU
// kernels of mixprec_cuda_emu, whose schemas
// tests/_cuda_emulation.py defines (mixprec._C must be loaded
// first). The module itself has no functions: the ops, the plan-only ones
// that benchmarks/bench_host_cost.py --emulated times included, are called
// through torch.ops.mixprec_cuda_emu.*.
#include <Python.h>

namespace {

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_cuda_emulation_C",
    "mixprec's CUDA launchers run on the CPU (tests only); ops in "
    "torch.ops.mixprec_cuda_emu.",
    -1,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__cuda_emulation_C(void) {
  return PyModule_Create(&module_def);
}
