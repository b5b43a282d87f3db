// The Python extension module mixprec._C. Loading it runs the static
// registrations of every op (TORCH_LIBRARY / TORCH_LIBRARY_IMPL); the module
// itself only carries the build configuration as constants.
#include <Python.h>

#include "mixprec/build_info.h"

namespace {

PyObject* cpu_capability(PyObject* /*self*/, PyObject* /*args*/) {
  return PyUnicode_FromString(mixprec::cpu_capability().c_str());
}

PyMethodDef methods[] = {
    {"cpu_capability", cpu_capability, METH_NOARGS,
     "The CPU kernel set chosen for this machine (avx512, avx2 or default)."},
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
          0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
