// The Python extension module mixprec._C. Loading it runs the static
// registrations of every op (TORCH_LIBRARY / TORCH_LIBRARY_IMPL); the module
// carries the build configuration, the op list and the capture rules as
// constants. The ops themselves are called through torch.ops.mixprec.*.
#include <Python.h>

#include "capture_rules.h"
#include "op_table.h"
#include "mixprec/build_info.h"
#include "mixprec/optim.h"

#include <iterator>

namespace {

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

// The rules of capture_rules.h and the live optimizer options (the rows of
// mixprec/optim.h flagged kLive), as module constants for mixprec.capture:
// capture_sync_ops {op name: rule}, capture_scaler_settings ((name,
// accessor), ...), capture_live_options (name, ...). 0, or -1 with the
// Python error set.
static int add_capture_rules(PyObject* m) {
  PyObject* ops = PyDict_New();
  if (ops == nullptr) return -1;
  bool ok = true;
#define MIXPREC_SYNC_OP_ENTRY_(name, rule)                        \
  if (ok) {                                                       \
    PyObject* r = PyUnicode_FromString(#rule);                    \
    ok = r != nullptr && PyDict_SetItemString(ops, name, r) == 0; \
    Py_XDECREF(r);                                                \
  }
  MIXPREC_FOR_EACH_SYNC_OP(MIXPREC_SYNC_OP_ENTRY_)
#undef MIXPREC_SYNC_OP_ENTRY_
  if (!ok || PyModule_AddObject(m, "capture_sync_ops", ops) < 0) {
    Py_DECREF(ops);
    return -1;
  }
#define MIXPREC_SCALER_SETTING_ENTRY_(name, accessor) {#name, #accessor},
  static const char* const scaler_settings[][2] = {
      MIXPREC_FOR_EACH_SCALER_SETTING(MIXPREC_SCALER_SETTING_ENTRY_)};
#undef MIXPREC_SCALER_SETTING_ENTRY_
  const Py_ssize_t n = static_cast<Py_ssize_t>(std::size(scaler_settings));
  PyObject* settings = PyTuple_New(n);
  for (Py_ssize_t i = 0; settings != nullptr && i < n; ++i) {
    PyObject* row =
        Py_BuildValue("(ss)", scaler_settings[i][0], scaler_settings[i][1]);
    if (row == nullptr) {
      Py_CLEAR(settings);
      break;
    }
    PyTuple_SET_ITEM(settings, i, row);
  }
  if (settings == nullptr ||
      PyModule_AddObject(m, "capture_scaler_settings", settings) < 0) {
    Py_XDECREF(settings);
    return -1;
  }
  PyObject* live = PySet_New(nullptr);
  if (live == nullptr) return -1;
#define MIXPREC_LIVE_OPTION_(type, name, default_value, check, flags) \
  if (ok && ((flags) & mixprec::optim::options_flag::kLive)) {        \
    PyObject* n = PyUnicode_FromString(#name);                        \
    ok = n != nullptr && PySet_Add(live, n) == 0;                     \
    Py_XDECREF(n);                                                    \
  }
  {
    using namespace mixprec::optim::options_flag;  // the rows' flags
    MIXPREC_ADAM_OPTIONS(MIXPREC_LIVE_OPTION_)
    MIXPREC_ADAMW_OPTIONS(MIXPREC_LIVE_OPTION_)
    MIXPREC_SGD_OPTIONS(MIXPREC_LIVE_OPTION_)
  }
#undef MIXPREC_LIVE_OPTION_
  PyObject* frozen = ok ? PyFrozenSet_New(live) : nullptr;
  Py_DECREF(live);
  if (frozen == nullptr ||
      PyModule_AddObject(m, "capture_live_options", frozen) < 0) {
    Py_XDECREF(frozen);
    return -1;
  }
  return 0;
}

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
  if (add_capture_rules(m) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
