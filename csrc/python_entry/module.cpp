// The Python extension module mixprec._C. Loading it runs the static
// registrations of every op (TORCH_LIBRARY / TORCH_LIBRARY_IMPL); the module
// carries the build configuration as constants, the eager fast path of
// the ops (python_entry/fast_call.h), which mixprec.ops uses outside
// torch.compile.
#include <Python.h>

#include "op_table.h"
#include "mixprec/build_info.h"
#include "python_entry/fast_call.h"

#include <iterator>

namespace {

using mixprec::OpInfo;
using mixprec::OpSig;
using mixprec::python::fast_entry;

PyObject* cpu_capability(PyObject* /*self*/, PyObject* /*args*/) {
  return PyUnicode_FromString(mixprec::cpu_capability().c_str());
}

PyObject* cpu_kernel_threads(PyObject* /*self*/, PyObject* /*args*/) {
  return PyLong_FromLong(mixprec::cpu_kernel_threads());
}

PyMethodDef methods[] = {
    {"cpu_capability", cpu_capability, METH_NOARGS,
     "The CPU kernel set chosen for this machine (avx512, avx2 or default)."},
    {"cpu_kernel_threads", cpu_kernel_threads, METH_NOARGS,
     "How many threads the CPU kernels' loops run on now (1 when built without "
     "torch's parallel backend)."},
#define MIXPREC_FAST_ENTRY_(op)                                               \
  {"fast_" #op, fast_entry<OpInfo<&mixprec::op>::kName, OpSig<&mixprec::op>>, \
   METH_VARARGS, nullptr},
    MIXPREC_FOR_EACH_OP(MIXPREC_FAST_ENTRY_)
#undef MIXPREC_FAST_ENTRY_
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
      PyModule_AddStringConstant(m, "cuda_version", info.cuda_version.c_str()) <
          0 ||
      PyModule_AddStringConstant(m, "cuda_archs", info.cuda_archs.c_str()) <
          0 ||
      PyModule_AddStringConstant(m, "cxx_compiler", info.cxx_compiler.c_str()) <
          0 ||
      PyModule_AddStringConstant(m, "cxx_compiler_version",
                                 info.cxx_compiler_version.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "nvcc_version", info.nvcc_version.c_str()) <
          0) {
    Py_DECREF(m);
    return nullptr;
  }
  // op_names: every op of MIXPREC_FOR_EACH_OP, in table order (the tests
  // take their list of the ops from it).
#define MIXPREC_OP_NAME_(op) #op,
  static const char* const op_names[] = {MIXPREC_FOR_EACH_OP(MIXPREC_OP_NAME_)};
#undef MIXPREC_OP_NAME_
  const Py_ssize_t n = static_cast<Py_ssize_t>(std::size(op_names));
  PyObject* names = PyTuple_New(n);
  for (Py_ssize_t i = 0; names != nullptr && i < n; ++i) {
    PyObject* name = PyUnicode_FromString(op_names[i]);
    if (name == nullptr) {
      Py_CLEAR(names);
      break;
    }
    PyTuple_SET_ITEM(names, i, name);
  }
  if (names == nullptr || PyModule_AddObject(m, "op_names", names) < 0) {
    Py_XDECREF(names);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
