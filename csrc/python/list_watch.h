// Snapshots and one-pass checks behind the reuse of tensor lists across steps
// (FusedOptimizer._reuse in python/mixprec/optim/_base.py, the flat-buffer
// mode's kept slices in optim/flat/detect.py) and the scaler's grad
// collection (amp/grads.py): whether a group's params, their grads and their
// state dicts are what they were when the lists were built. Plain CPython,
// one pass at C speed, no tensor reference counts touched except the grads
// handed back.
//
// Soundness: a snapshot holds strong references to every object whose
// identity it compares (tensors, grads, dict keys and values), so none of
// them can be freed and another object take its address: equal pointers mean
// the same objects.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>
#include <structmember.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <optional>

namespace mixprec {
// (hidden, as pybind11's own namespace: these hold pybind11 objects, and
// nothing here is exported from the module's shared object)
namespace [[gnu::visibility("hidden")]] python {

namespace py = pybind11;

// The items of a Python sequence (PySequence_Fast), released on scope exit.
class FastSeq {
 public:
  FastSeq(PyObject* o, const char* what)
      : seq_(py::reinterpret_steal<py::object>(PySequence_Fast(o, what))) {}
  bool ok() const { return static_cast<bool>(seq_); }
  Py_ssize_t size() const { return PySequence_Fast_GET_SIZE(seq_.ptr()); }
  PyObject* operator[](Py_ssize_t i) const {
    return PySequence_Fast_ITEMS(seq_.ptr())[i];
  }

 private:
  py::object seq_;
};

// A new reference handed to Python (None when `o` is empty: an error is set).
inline PyObject* give(py::object o) { return o.release().ptr(); }
inline PyObject* none() { return give(py::none()); }

// What a tensor's place in a list depends on besides its identity: data
// pointer, numel, dtype, device, whether it has a grad, and (snapshots taken
// with_grads) the grad itself (its TensorImpl: the snapshot holds the grad
// object, so no other tensor can take that address) and its data pointer,
// numel, dtype and device.
struct TensorRecord {
  const void* data;
  int64_t numel;
  int64_t kind;
  const void* grad_impl;
  const void* grad_data;
  int64_t grad_numel;
  int64_t grad_kind;
};

// A tensor's grad, read from its TensorImpl (Tensor::grad() would also look
// up whether the tensor is a leaf, for a warning that concerns non-leaves).
inline const at::Tensor& grad_of(PyObject* o) {
  return THPVariable_Unpack(o).unsafeGetTensorImpl()->grad();
}

// dtype, device type and index of a tensor, in one word
inline int64_t kind_of(c10::TensorImpl* impl) {
  const c10::Device d = impl->device();
  return static_cast<int64_t>(
             static_cast<uint8_t>(c10::typeMetaToScalarType(impl->dtype()))) |
         static_cast<int64_t>(static_cast<uint8_t>(d.type())) << 8 |
         static_cast<int64_t>(static_cast<uint8_t>(d.index() + 1)) << 16;
}

inline const void* data_of(c10::TensorImpl* impl) {
  const void* base = impl->unsafe_storage().data();
  return base == nullptr ? nullptr
                         : static_cast<const char*>(base) +
                               impl->storage_offset() * impl->itemsize();
}

// torch's DTensor class, once Python has seen it (set_dtensor_type, called by
// python/mixprec/_dtensor.py); nullptr before. The record of a DTensor (an
// FSDP2 param) is its local shard's, and the grad handed back for it is the
// local shard of its (DTensor) grad: the kernels run on the local shards.
inline PyObject*& dtensor_type() {
  static PyObject* type = nullptr;
  return type;
}

// A DTensor attribute the passes read (`_local_tensor`, `_spec`): its name
// and, when the DTensor class declares it as a slot (a T_OBJECT_EX member, as
// torch does), the byte offset where an object of exactly that class holds it
// (-1: looked up by name). Reading the slot directly saves the generic
// attribute lookup: a list pass costs a DTensor param 35 ns instead of 55,
// against 20 for a plain tensor (benchmarks/RESULTS.md, "FSDP2 host time").
struct DTensorSlot {
  PyObject* name;
  Py_ssize_t offset = -1;
};

inline DTensorSlot& local_tensor_slot() {
  static DTensorSlot slot{PyUnicode_InternFromString("_local_tensor")};
  return slot;
}

inline DTensorSlot& spec_slot() {
  static DTensorSlot slot{PyUnicode_InternFromString("_spec")};
  return slot;
}

inline void find_slot(PyTypeObject* type, DTensorSlot& slot) {
  slot.offset = -1;
  PyObject* descr = _PyType_Lookup(type, slot.name);  // borrowed
  if (descr != nullptr && Py_TYPE(descr) == &PyMemberDescr_Type) {
    const PyMemberDef* m =
        reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
    if (m->type == T_OBJECT_EX && m->offset > 0) {
      slot.offset = m->offset;
    }
  }
}

// set_dtensor_type(cls): remember the DTensor class (a strong reference) and
// where its objects keep `_local_tensor` and `_spec`.
inline PyObject* set_dtensor_type(PyObject* /*self*/, PyObject* cls) {
  if (!PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError, "set_dtensor_type: a class");
    return nullptr;
  }
  Py_INCREF(cls);
  Py_XDECREF(dtensor_type());
  dtensor_type() = cls;
  find_slot(reinterpret_cast<PyTypeObject*>(cls), local_tensor_slot());
  find_slot(reinterpret_cast<PyTypeObject*>(cls), spec_slot());
  Py_RETURN_NONE;
}

// Attribute `slot` of `o` as a new reference; empty (an error may be set) when
// it is missing.
inline py::object dtensor_attr(PyObject* o, const DTensorSlot& slot) {
  if (slot.offset > 0 &&
      reinterpret_cast<PyObject*>(Py_TYPE(o)) == dtensor_type()) {
    // null when the slot is unset
    return py::reinterpret_borrow<py::object>(*reinterpret_cast<PyObject**>(
        reinterpret_cast<char*>(o) + slot.offset));
  }
  return py::reinterpret_steal<py::object>(PyObject_GetAttr(o, slot.name));
}

// The `_local_tensor` of a DTensor as a new reference; empty, with no error
// set, when it is missing or not a plain tensor.
inline py::object local_of(PyObject* o) {
  py::object t = dtensor_attr(o, local_tensor_slot());
  if (!t || !THPVariable_CheckExact(t.ptr())) {
    PyErr_Clear();
    return py::object();
  }
  return t;
}

// A grad as a Python object (None when undefined); empty with the error set
// on failure.
inline py::object wrap_grad(const at::Tensor& g) {
  if (!g.defined()) {
    return py::none();
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(g));
}

// The grad tensor_record found, to hand back.
struct GradFound {
  const at::Tensor* grad = nullptr;  // a plain tensor's grad (maybe undefined)
  py::object local;  // a DTensor's: its grad's local shard, or None
  // The grad as a Python object (None when there is none); empty with the
  // error set on failure.
  py::object object() const {
    return grad != nullptr ? wrap_grad(*grad) : local;
  }
};

// False (and r untouched) for anything but a torch.Tensor / nn.Parameter or a
// DTensor over one (another subclass may answer .grad or data_ptr()
// differently), or a tensor without storage; never raises. `found`, when
// given, receives the grad (for a DTensor, the local shard of its grad).
inline bool tensor_record(PyObject* o, bool with_grad, TensorRecord& r,
                          GradFound* found = nullptr) {
  static const at::Tensor undefined;
  c10::TensorImpl* impl = nullptr;
  const at::Tensor* g = &undefined;
  py::object local;       // a DTensor's local shard
  py::object grad_local;  // a DTensor's grad's local shard
  if (THPVariable_CheckExact(o)) {
    impl = THPVariable_Unpack(o).unsafeGetTensorImpl();
    g = &impl->grad();
  } else if (dtensor_type() != nullptr &&
             Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(dtensor_type())) {
    local = local_of(o);
    if (!local) {
      return false;
    }
    impl = THPVariable_Unpack(local.ptr()).unsafeGetTensorImpl();
    const at::Tensor& dg = THPVariable_Unpack(o).unsafeGetTensorImpl()->grad();
    if (dg.defined()) {
      auto dgo = py::reinterpret_steal<py::object>(THPVariable_Wrap(dg));
      if (!dgo || Py_TYPE(dgo.ptr()) != Py_TYPE(o)) {
        PyErr_Clear();
        return false;  // not a DTensor grad: the caller's slow path says so
      }
      grad_local = local_of(dgo.ptr());
      if (!grad_local) {
        return false;
      }
      g = &THPVariable_Unpack(grad_local.ptr());
    }
  } else {
    return false;
  }
  if (!impl->has_storage() ||
      (with_grad && g->defined() && !g->unsafeGetTensorImpl()->has_storage())) {
    return false;
  }
  r.data = data_of(impl);
  r.numel = impl->numel();
  r.kind = kind_of(impl) | static_cast<int64_t>(g->defined()) << 24;
  if (with_grad && g->defined()) {
    c10::TensorImpl* gi = g->unsafeGetTensorImpl();
    r.grad_impl = gi;
    r.grad_data = data_of(gi);
    r.grad_numel = gi->numel();
    r.grad_kind = kind_of(gi);
  } else {
    r.grad_impl = nullptr;
    r.grad_data = nullptr;
    r.grad_numel = 0;
    r.grad_kind = 0;
  }
  if (found != nullptr) {
    if (local) {
      found->local = grad_local ? std::move(grad_local) : py::none();
    } else {
      found->grad = g;
    }
  }
  return true;
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
  const FastSeq seq(tensors, "watch_tensors: a sequence of tensors");
  if (!seq.ok()) {
    return nullptr;
  }
  const Py_ssize_t n = seq.size();
  auto objs =
      py::reinterpret_steal<py::object>(PyTuple_New(with_grads ? 2 * n : n));
  auto recs = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(n * sizeof(TensorRecord))));
  if (!objs || !recs) {
    return nullptr;
  }
  auto* out = reinterpret_cast<TensorRecord*>(PyBytes_AS_STRING(recs.ptr()));
  for (Py_ssize_t i = 0; i < n; ++i) {
    GradFound grad;
    if (!tensor_record(seq[i], with_grads != 0, out[i], &grad)) {
      return none();
    }
    Py_INCREF(seq[i]);
    PyTuple_SET_ITEM(objs.ptr(), i, seq[i]);
    if (with_grads) {
      py::object g = grad.object();
      if (!g) {
        return nullptr;
      }
      PyTuple_SET_ITEM(objs.ptr(), n + i, g.release().ptr());
    }
  }
  return give(py::make_tuple(objs, recs));
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
  const FastSeq seq(tensors, "tensors_grads: a sequence of tensors");
  if (!seq.ok()) {
    return nullptr;
  }
  const Py_ssize_t n = seq.size();
  const Py_ssize_t stored = PyTuple_GET_SIZE(objs);
  const bool with_grads = stored == 2 * n && n > 0;
  if ((stored != n && !with_grads) ||
      PyBytes_GET_SIZE(recs) !=
          static_cast<Py_ssize_t>(n * sizeof(TensorRecord))) {
    return none();
  }
  const auto* want =
      reinterpret_cast<const TensorRecord*>(PyBytes_AS_STRING(recs));
  // (filled in the same pass, while each tensor is in cache; dropped on a miss)
  py::object grads;
  if (want_grads) {
    grads = py::reinterpret_steal<py::object>(PyList_New(n));
    if (!grads) {
      return nullptr;
    }
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    TensorRecord r;
    GradFound grad;
    if (seq[i] != PyTuple_GET_ITEM(objs, i) ||
        !tensor_record(seq[i], with_grads, r, &grad) ||
        std::memcmp(&r, &want[i], sizeof r) != 0) {
      return none();
    }
    if (want_grads) {
      py::object g = grad.object();
      if (!g) {
        return nullptr;
      }
      PyList_SET_ITEM(grads.ptr(), i, g.release().ptr());
    }
  }
  if (!want_grads) {
    return give(py::bool_(true));
  }
  return give(std::move(grads));
}

// dense_grads(params, allow_fp16[, specs]) -> the grads of the params that
// have one, in order, when every param is a plain tensor (or, given a `specs`
// list, a DTensor over one) and every grad dense (strided), on the first
// grad's device, and not float16 unless allow_fp16; else None (the caller's
// per-param loop then handles the group, errors included). A DTensor param's
// grad is handed back as its local shard, and the grad's `_spec` appended to
// `specs` (what the inf verdict and norms are reduced over).
inline PyObject* dense_grads(PyObject* /*self*/, PyObject* args) {
  PyObject* params = nullptr;
  int allow_fp16 = 0;
  PyObject* specs = nullptr;
  if (!PyArg_ParseTuple(args, "Op|O!:dense_grads", &params, &allow_fp16,
                        &PyList_Type, &specs)) {
    return nullptr;
  }
  const FastSeq seq(params, "dense_grads: a sequence of tensors");
  if (!seq.ok()) {
    return nullptr;
  }
  auto out = py::reinterpret_steal<py::object>(PyList_New(0));
  if (!out) {
    return nullptr;
  }
  std::optional<c10::Device> device;
  for (Py_ssize_t i = 0; i < seq.size(); ++i) {
    PyObject* o = seq[i];
    py::object local;  // a DTensor's grad's local shard
    const at::Tensor* grad = nullptr;
    if (THPVariable_CheckExact(o)) {
      grad = &grad_of(o);
    } else if (specs != nullptr && dtensor_type() != nullptr &&
               Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(dtensor_type())) {
      const at::Tensor& dg = grad_of(o);
      if (!dg.defined()) {
        continue;
      }
      auto dgo = py::reinterpret_steal<py::object>(THPVariable_Wrap(dg));
      if (!dgo) {
        return nullptr;
      }
      if (Py_TYPE(dgo.ptr()) != Py_TYPE(o)) {
        return none();  // not a DTensor grad: the per-param loop says so
      }
      local = local_of(dgo.ptr());
      py::object spec = dtensor_attr(dgo.ptr(), spec_slot());
      if (!local || !spec) {
        PyErr_Clear();
        return none();
      }
      if (PyList_Append(specs, spec.ptr()) < 0) {
        return nullptr;
      }
      grad = &THPVariable_Unpack(local.ptr());
    } else {
      return none();
    }
    const at::Tensor& g = *grad;
    if (!g.defined()) {
      continue;
    }
    if (!device) {
      device = g.device();
    }
    if (g.layout() != c10::kStrided || g.device() != *device ||
        (!allow_fp16 && g.scalar_type() == at::kHalf)) {
      return none();
    }
    py::object go = local ? std::move(local) : wrap_grad(g);
    if (!go || PyList_Append(out.ptr(), go.ptr()) < 0) {
      return nullptr;
    }
  }
  return give(std::move(out));
}

// watch_items(dicts) -> (tuple of every dict's keys and values in order,
// bytes of the dicts' sizes), or None when an item is not a dict.
inline PyObject* watch_items(PyObject* /*self*/, PyObject* dicts) {
  const FastSeq seq(dicts, "watch_items: a sequence of dicts");
  if (!seq.ok()) {
    return nullptr;
  }
  const Py_ssize_t n = seq.size();
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyDict_Check(seq[i])) {
      return none();
    }
    total += 2 * PyDict_GET_SIZE(seq[i]);
  }
  auto objs = py::reinterpret_steal<py::object>(PyTuple_New(total));
  auto sizes = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(n * sizeof(Py_ssize_t))));
  if (!objs || !sizes) {
    return nullptr;
  }
  auto* size_out =
      reinterpret_cast<Py_ssize_t*>(PyBytes_AS_STRING(sizes.ptr()));
  Py_ssize_t j = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    size_out[i] = PyDict_GET_SIZE(seq[i]);
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    PyObject* v = nullptr;
    while (PyDict_Next(seq[i], &pos, &k, &v)) {
      Py_INCREF(k);
      Py_INCREF(v);
      PyTuple_SET_ITEM(objs.ptr(), j++, k);
      PyTuple_SET_ITEM(objs.ptr(), j++, v);
    }
  }
  return give(py::make_tuple(objs, sizes));
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
  const FastSeq seq(dicts, "items_unchanged: a sequence of dicts");
  if (!seq.ok()) {
    return nullptr;
  }
  const Py_ssize_t n = seq.size();
  bool same = PyBytes_GET_SIZE(sizes) ==
              static_cast<Py_ssize_t>(n * sizeof(Py_ssize_t));
  const auto* want =
      reinterpret_cast<const Py_ssize_t*>(PyBytes_AS_STRING(sizes));
  const Py_ssize_t total = PyTuple_GET_SIZE(objs);
  Py_ssize_t j = 0;
  for (Py_ssize_t i = 0; same && i < n; ++i) {
    if (!PyDict_Check(seq[i]) || PyDict_GET_SIZE(seq[i]) != want[i] ||
        j + 2 * want[i] > total) {
      same = false;
      break;
    }
    Py_ssize_t pos = 0;
    PyObject* k = nullptr;
    PyObject* v = nullptr;
    while (same && PyDict_Next(seq[i], &pos, &k, &v)) {
      same =
          k == PyTuple_GET_ITEM(objs, j) && v == PyTuple_GET_ITEM(objs, j + 1);
      j += 2;
    }
  }
  return PyBool_FromLong(same && j == total);
}

}  // namespace python
}  // namespace mixprec
