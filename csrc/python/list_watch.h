// Snapshots and one-pass checks behind the optimizers' list reuse
// (FusedOptimizer._reuse, python/mixprec/optim/_base.py): whether a param
// group's params, their grads and their state dicts are what they were when
// the op's tensor lists were built. Plain CPython, one pass at C speed, no
// tensor reference counts touched except the grads handed back.
//
// Soundness: a snapshot holds strong references to every object whose
// identity it compares (params, dict keys and values), so none of them can be
// freed and another object take its address: equal pointers mean the same
// objects.
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>

namespace mixprec {
namespace python {

// What a param's lists depend on besides its identity: data pointer, numel,
// dtype, device, and whether it has a grad.
struct ParamRecord {
  const void* data;
  int64_t numel;
  int64_t kind;
};

// False (and r untouched) for anything but a torch.Tensor / nn.Parameter (a
// subclass may answer .grad or data_ptr() differently) or a tensor without
// storage; never raises.
inline bool param_record(PyObject* o, ParamRecord& r) {
  if (!THPVariable_CheckExact(o)) {
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(o);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage()) {
    return false;
  }
  const c10::Device d = impl->device();
  r.data = impl->unsafe_storage().data() == nullptr
               ? nullptr
               : static_cast<const char*>(impl->unsafe_storage().data()) +
                     impl->storage_offset() * impl->itemsize();
  r.numel = impl->numel();
  r.kind = static_cast<int64_t>(static_cast<uint8_t>(c10::typeMetaToScalarType(impl->dtype()))) |
           static_cast<int64_t>(static_cast<uint8_t>(d.type())) << 8 |
           static_cast<int64_t>(static_cast<uint8_t>(d.index() + 1)) << 16 |
           static_cast<int64_t>(t.grad().defined()) << 24;
  return true;
}

// watch_params(params) -> (tuple of the params, bytes of their records), or
// None when a param is not a plain tensor (no snapshot: the lists are then
// rebuilt every step).
inline PyObject* watch_params(PyObject* /*self*/, PyObject* params) {
  PyObject* seq = PySequence_Fast(params, "watch_params: params must be a sequence");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* objs = PyTuple_New(n);
  PyObject* recs = PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(n * sizeof(ParamRecord)));
  if (objs == nullptr || recs == nullptr) {
    Py_XDECREF(objs);
    Py_XDECREF(recs);
    Py_DECREF(seq);
    return nullptr;
  }
  auto* out = reinterpret_cast<ParamRecord*>(PyBytes_AS_STRING(recs));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!param_record(items[i], out[i])) {
      Py_DECREF(objs);
      Py_DECREF(recs);
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(objs, i, items[i]);
  }
  Py_DECREF(seq);
  return Py_BuildValue("(NN)", objs, recs);
}

// params_grads(params, snapshot) -> the list of the params' grads (None where
// a param has none) when every param is the snapshot's object with the same
// record; else None.
inline PyObject* params_grads(PyObject* /*self*/, PyObject* args) {
  PyObject* params = nullptr;
  PyObject* objs = nullptr;
  PyObject* recs = nullptr;
  if (!PyArg_ParseTuple(args, "O(O!O!):params_grads", &params, &PyTuple_Type,
                        &objs, &PyBytes_Type, &recs)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(params, "params_grads: params must be a sequence");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n != PyTuple_GET_SIZE(objs) ||
      PyBytes_GET_SIZE(recs) != static_cast<Py_ssize_t>(n * sizeof(ParamRecord))) {
    Py_DECREF(seq);
    Py_RETURN_NONE;
  }
  PyObject** items = PySequence_Fast_ITEMS(seq);
  const auto* want = reinterpret_cast<const ParamRecord*>(PyBytes_AS_STRING(recs));
  for (Py_ssize_t i = 0; i < n; ++i) {
    ParamRecord r;
    if (items[i] != PyTuple_GET_ITEM(objs, i) || !param_record(items[i], r) ||
        std::memcmp(&r, &want[i], sizeof r) != 0) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  }
  PyObject* grads = PyList_New(n);
  for (Py_ssize_t i = 0; grads != nullptr && i < n; ++i) {
    const at::Tensor& g = THPVariable_Unpack(items[i]).grad();
    PyObject* o = nullptr;
    if (g.defined()) {
      o = THPVariable_Wrap(g);
    } else {
      o = Py_None;
      Py_INCREF(o);
    }
    if (o == nullptr) {
      Py_CLEAR(grads);
      break;
    }
    PyList_SET_ITEM(grads, i, o);
  }
  Py_DECREF(seq);
  return grads;
}

// watch_items(dicts) -> (tuple of every dict's keys and values in order,
// bytes of the dicts' sizes), or None when an item is not a dict.
inline PyObject* watch_items(PyObject* /*self*/, PyObject* dicts) {
  PyObject* seq = PySequence_Fast(dicts, "watch_items: dicts must be a sequence");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyDict_Check(items[i])) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
    total += 2 * PyDict_GET_SIZE(items[i]);
  }
  PyObject* objs = PyTuple_New(total);
  PyObject* sizes = PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(n * sizeof(Py_ssize_t)));
  if (objs == nullptr || sizes == nullptr) {
    Py_XDECREF(objs);
    Py_XDECREF(sizes);
    Py_DECREF(seq);
    return nullptr;
  }
  auto* size_out = reinterpret_cast<Py_ssize_t*>(PyBytes_AS_STRING(sizes));
  Py_ssize_t j = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    size_out[i] = PyDict_GET_SIZE(items[i]);
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    PyObject* v = nullptr;
    while (PyDict_Next(items[i], &pos, &k, &v)) {
      Py_INCREF(k);
      Py_INCREF(v);
      PyTuple_SET_ITEM(objs, j++, k);
      PyTuple_SET_ITEM(objs, j++, v);
    }
  }
  Py_DECREF(seq);
  return Py_BuildValue("(NN)", objs, sizes);
}

// items_unchanged(dicts, snapshot) -> whether every dict holds exactly the
// snapshot's keys and values (the same objects, in the same order).
inline PyObject* items_unchanged(PyObject* /*self*/, PyObject* args) {
  PyObject* dicts = nullptr;
  PyObject* objs = nullptr;
  PyObject* sizes = nullptr;
  if (!PyArg_ParseTuple(args, "O(O!O!):items_unchanged", &dicts, &PyTuple_Type,
                        &objs, &PyBytes_Type, &sizes)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(dicts, "items_unchanged: dicts must be a sequence");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  bool same = PyBytes_GET_SIZE(sizes) ==
              static_cast<Py_ssize_t>(n * sizeof(Py_ssize_t));
  const auto* want = reinterpret_cast<const Py_ssize_t*>(PyBytes_AS_STRING(sizes));
  const Py_ssize_t total = PyTuple_GET_SIZE(objs);
  Py_ssize_t j = 0;
  for (Py_ssize_t i = 0; same && i < n; ++i) {
    if (!PyDict_Check(items[i]) || PyDict_GET_SIZE(items[i]) != want[i] ||
        j + 2 * want[i] > total) {
      same = false;
      break;
    }
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    PyObject* v = nullptr;
    while (same && PyDict_Next(items[i], &pos, &k, &v)) {
      same = k == PyTuple_GET_ITEM(objs, j) && v == PyTuple_GET_ITEM(objs, j + 1);
      j += 2;
    }
  }
  Py_DECREF(seq);
  return PyBool_FromLong(same && j == total);
}

}  // namespace python
}  // namespace mixprec
