// The Python extension module mixprec._C. Loading it runs the static
// registrations of every op (TORCH_LIBRARY / TORCH_LIBRARY_IMPL); the module
// carries the build configuration as constants and the eager fast path of
// the ops (python/fast_call.h), which mixprec.ops uses outside torch.compile.
#include <Python.h>

#include "common/op_signatures.h"
#include "mixprec/build_info.h"
#include "python/fast_call.h"

namespace {

namespace sig = mixprec::sig;
using mixprec::python::FastCall;

// fast_<op>(*args): the op with positional arguments, or NotImplemented
// when the arguments need torch.ops (see fast_call.h).
template <const char* Name, class Sig>
PyObject* fast(PyObject* /*self*/, PyObject* args) {
  return FastCall<Name, Sig>::call(args);
}

// The host work of the CUDA launchers alone (csrc/cuda_emulation,
// mixprec._cuda_emulation), through the same fast entry as the real ops: for
// measuring the CUDA path's host cost without a GPU.
constexpr char kPlanUnscaleAndCheck[] = "mixprec_cuda_emu::plan_unscale_and_check_";
constexpr char kPlanFusedAdam[] = "mixprec_cuda_emu::plan_fused_adam_";
constexpr char kPlanFusedSgd[] = "mixprec_cuda_emu::plan_fused_sgd_";

PyObject* cpu_capability(PyObject* /*self*/, PyObject* /*args*/) {
  return PyUnicode_FromString(mixprec::cpu_capability().c_str());
}

PyMethodDef methods[] = {
    {"cpu_capability", cpu_capability, METH_NOARGS,
     "The CPU kernel set chosen for this machine (avx512, avx2 or default)."},
    {"fast_unscale_and_check_",
     fast<sig::kUnscaleAndCheck, sig::UnscaleAndCheck>, METH_VARARGS, nullptr},
    {"fast_check_finite_", fast<sig::kCheckFinite, sig::CheckFinite>,
     METH_VARARGS, nullptr},
    {"fast_unscale_and_norm_", fast<sig::kUnscaleAndNorm, sig::Norm>,
     METH_VARARGS, nullptr},
    {"fast_check_finite_and_norm_", fast<sig::kCheckFiniteAndNorm, sig::Norm>,
     METH_VARARGS, nullptr},
    {"fast_update_scale_", fast<sig::kUpdateScale, sig::UpdateScale>,
     METH_VARARGS, nullptr},
    {"fast_update_scale_ext_", fast<sig::kUpdateScaleExt, sig::UpdateScaleExt>,
     METH_VARARGS, nullptr},
    {"fast_fused_adam_", fast<sig::kFusedAdam, sig::FusedAdam>, METH_VARARGS,
     nullptr},
    {"fast_fused_sgd_", fast<sig::kFusedSgd, sig::FusedSgd>, METH_VARARGS,
     nullptr},
    {"emu_plan_unscale_and_check_",
     fast<kPlanUnscaleAndCheck, sig::UnscaleAndCheck>, METH_VARARGS, nullptr},
    {"emu_plan_fused_adam_", fast<kPlanFusedAdam, sig::FusedAdam>, METH_VARARGS,
     nullptr},
    {"emu_plan_fused_sgd_", fast<kPlanFusedSgd, sig::FusedSgd>, METH_VARARGS,
     nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "mixprec compiled kernels; ops are in torch.ops.mixprec.",
    -1,
    methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  const mixprec::BuildInfo info = mixprec::build_info();
  if (PyModule_AddStringConstant(m, "version", info.version.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "torch_version",
                                 info.torch_version.c_str()) < 0 ||
      PyModule_AddIntConstant(m, "cuda_kernels", info.cuda_kernels ? 1 : 0) <
          0 ||
      PyModule_AddStringConstant(m, "cuda_version",
                                 info.cuda_version.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "cuda_archs", info.cuda_archs.c_str()) <
          0 ||
      PyModule_AddStringConstant(m, "cxx_compiler",
                                 info.cxx_compiler.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "cxx_compiler_version",
                                 info.cxx_compiler_version.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "nvcc_version",
                                 info.nvcc_version.c_str()) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
