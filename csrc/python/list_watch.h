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
#include <optional>

namespace mixprec {
namespace python {

// What a tensor's place in a list depends on besides its identity: data
// pointer, numel, dtype, device, whether it has a grad, and (snapshots taken
// with_grads) the grad's data pointer.
struct TensorRecord {
  const void* data;
  int64_t numel;
  int64_t kind;
  const void* grad_data;
};

inline const void* data_of(c10::TensorImpl* impl) {
  const void* base = impl->unsafe_storage().data();
  return base == nullptr
             ? nullptr
             : static_cast<const char*>(base) +
                   impl->storage_offset() * impl->itemsize();
}

// False (and r untouched) for anything but a torch.Tensor / nn.Parameter (a
// subclass may answer .grad or data_ptr() differently) or a tensor without
// storage; never raises.
inline bool tensor_record(PyObject* o, bool with_grad, TensorRecord& r) {
  if (!THPVariable_CheckExact(o)) {
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(o);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const at::Tensor& g = t.grad();
  if (!impl->has_storage() ||
      (with_grad && g.defined() && !g.unsafeGetTensorImpl()->has_storage())) {
    return false;
  }
  const c10::Device d = impl->device();
  r.data = data_of(impl);
  r.numel = impl->numel();
  r.kind = static_cast<int64_t>(static_cast<uint8_t>(
               c10::typeMetaToScalarType(impl->dtype()))) |
           static_cast<int64_t>(static_cast<uint8_t>(d.type())) << 8 |
           static_cast<int64_t>(static_cast<uint8_t>(d.index() + 1)) << 16 |
           static_cast<int64_t>(g.defined()) << 24;
  r.grad_data = with_grad && g.defined() ? data_of(g.unsafeGetTensorImpl()) : nullptr;
  return true;
}

// The grad of a tensor as a Python object (None when it has none); a new
// reference, or null with the error set.
inline PyObject* grad_object(PyObject* o) {
  const at::Tensor& g = THPVariable_Unpack(o).grad();
  if (!g.defined()) {
    Py_RETURN_NONE;
  }
  return THPVariable_Wrap(g);
}

// Whether tensor o's grad is the Python object `stored` (None: no grad). The
// grad's existing Python object, if any, is found without creating one.
inline bool same_grad(PyObject* o, PyObject* stored) {
  const at::Tensor& g = THPVariable_Unpack(o).grad();
  if (!g.defined()) {
    return stored == Py_None;
  }
  return stored != Py_None && THPVariable_Check(stored) &&
         THPVariable_Unpack(stored).unsafeGetTensorImpl() ==
             g.unsafeGetTensorImpl();
}

// watch_tensors(tensors, with_grads) -> snapshot: (tuple of the tensors, then,
// with_grads, of their grads; bytes of their records), or None when an item
// is not a plain tensor (no snapshot: the caller builds its lists every step).
inline PyObject* watch_tensors(PyObject* /*self*/, PyObject* args) {
  PyObject* tensors = nullptr;
  int with_grads = 0;
  if (!PyArg_ParseTuple(args, "Op:watch_tensors", &tensors, &with_grads)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(tensors, "watch_tensors: a sequence of tensors");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* objs = PyTuple_New(with_grads ? 2 * n : n);
  PyObject* recs = PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(n * sizeof(TensorRecord)));
  auto give_up = [&](PyObject* result) {
    Py_XDECREF(objs);
    Py_XDECREF(recs);
    Py_DECREF(seq);
    return result;
  };
  if (objs == nullptr || recs == nullptr) {
    return give_up(nullptr);
  }
  auto* out = reinterpret_cast<TensorRecord*>(PyBytes_AS_STRING(recs));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!tensor_record(items[i], with_grads != 0, out[i])) {
      Py_INCREF(Py_None);
      return give_up(Py_None);
    }
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(objs, i, items[i]);
    if (with_grads) {
      PyObject* g = grad_object(items[i]);
      if (g == nullptr) {
        return give_up(nullptr);
      }
      PyTuple_SET_ITEM(objs, n + i, g);
    }
  }
  Py_DECREF(seq);
  return Py_BuildValue("(NN)", objs, recs);
}

// tensors_grads(tensors, snapshot, want_grads) -> when every tensor is the
// snapshot's object with the same record (and, for a snapshot taken
// with_grads, has the very same grad object): the list of the tensors' grads
// (None where a tensor has none) if want_grads, else True; otherwise None.
inline PyObject* tensors_grads(PyObject* /*self*/, PyObject* args) {
  PyObject* tensors = nullptr;
  PyObject* objs = nullptr;
  PyObject* recs = nullptr;
  int want_grads = 1;
  if (!PyArg_ParseTuple(args, "O(O!O!)p:tensors_grads", &tensors, &PyTuple_Type,
                        &objs, &PyBytes_Type, &recs, &want_grads)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(tensors, "tensors_grads: a sequence of tensors");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  const Py_ssize_t stored = PyTuple_GET_SIZE(objs);
  const bool with_grads = stored == 2 * n && n > 0;
  if ((stored != n && !with_grads) ||
      PyBytes_GET_SIZE(recs) != static_cast<Py_ssize_t>(n * sizeof(TensorRecord))) {
    Py_DECREF(seq);
    Py_RETURN_NONE;
  }
  PyObject** items = PySequence_Fast_ITEMS(seq);
  const auto* want = reinterpret_cast<const TensorRecord*>(PyBytes_AS_STRING(recs));
  for (Py_ssize_t i = 0; i < n; ++i) {
    TensorRecord r;
    if (items[i] != PyTuple_GET_ITEM(objs, i) ||
        !tensor_record(items[i], with_grads, r) ||
        std::memcmp(&r, &want[i], sizeof r) != 0 ||
        (with_grads && !same_grad(items[i], PyTuple_GET_ITEM(objs, n + i)))) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  }
  if (!want_grads) {
    Py_DECREF(seq);
    Py_RETURN_TRUE;
  }
  PyObject* grads = PyList_New(n);
  for (Py_ssize_t i = 0; grads != nullptr && i < n; ++i) {
    PyObject* g = grad_object(items[i]);
    if (g == nullptr) {
      Py_CLEAR(grads);
      break;
    }
    PyList_SET_ITEM(grads, i, g);
  }
  Py_DECREF(seq);
  return grads;
}

// dense_grads(params, allow_fp16) -> the grads of the params that have one,
// in order, when every param is a plain tensor and every grad dense (strided),
// on the first grad's device, and not float16 unless allow_fp16; else None
// (the caller's per-param loop then handles the group, errors included).
inline PyObject* dense_grads(PyObject* /*self*/, PyObject* args) {
  PyObject* params = nullptr;
  int allow_fp16 = 0;
  if (!PyArg_ParseTuple(args, "Op:dense_grads", &params, &allow_fp16)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(params, "dense_grads: a sequence of tensors");
  if (seq == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* out = PyList_New(0);
  std::optional<c10::Device> device;
  for (Py_ssize_t i = 0; out != nullptr && i < n; ++i) {
    if (!THPVariable_CheckExact(items[i])) {
      Py_CLEAR(out);
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
    const at::Tensor& g = THPVariable_Unpack(items[i]).grad();
    if (!g.defined()) {
      continue;
    }
    if (!device) {
      device = g.device();
    }
    if (g.layout() != c10::kStrided || g.device() != *device ||
        (!allow_fp16 && g.scalar_type() == at::kHalf)) {
      Py_CLEAR(out);
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
    PyObject* o = THPVariable_Wrap(g);
    if (o == nullptr || PyList_Append(out, o) < 0) {
      Py_XDECREF(o);
      Py_CLEAR(out);
      break;
    }
    Py_DECREF(o);
  }
  Py_DECREF(seq);
  return out;
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
