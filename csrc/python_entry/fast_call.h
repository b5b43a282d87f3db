// A direct Python entry to mixprec's ops for the eager hot path: the one
// part of mixprec that reads CPython and torch-binding internals (the Python
// tensor's struct, borrowed tuple items); tests/ops/test_fast_entry.py keeps
// every other C++ source free of them. MIXPREC_FAST_ENTRY=0 (read once by
// mixprec.ops._extension) leaves it unused: every op then goes through
// torch.ops.mixprec.*.
//
// torch.ops.mixprec.<op>(...) converts every argument to an IValue, and a
// tensor-list argument of N tensors costs N reference-count round trips, each
// of which may re-take the GIL when the list is released inside the op. For
// the multi-tensor ops (2,000 gradients per call is common) that conversion
// was the larger part of the call. FastCall<Name, Sig>::call(args) instead:
//
//   * takes the positional arguments as a tuple and converts each to the C++
//     type of the schema without boxing: a tensor list is *borrowed* (the
//     tensors are viewed in place, no reference counts touched) from a tuple
//     snapshot of the Python sequence, which keeps every element alive;
//   * releases the GIL and makes a typed dispatcher call, so dispatch keys,
//     TorchDispatchModes (FakeTensorMode, ...), the profiler and autograd
//     behave exactly as through torch.ops;
//   * returns NotImplemented -- the caller then uses torch.ops -- whenever an
//     argument is not of the plain form it handles: a Tensor subclass or any
//     object with __torch_function__, an active TorchFunctionMode, a keyword,
//     a wrong count. Errors raised by the op come back as torch.ops raises
//     them (torch's HANDLE_TH_ERRORS translation, warnings included).
#pragma once

#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mixprec {
namespace python {

// Tensors viewed without touching their reference counts. Valid while
// `owner_` (a tuple holding the Python tensors) is alive, which this object
// guarantees; the handles are released, not destroyed, at the end -- the
// borrow pattern of c10::MaybeOwned.
class BorrowedTensorList {
 public:
  BorrowedTensorList() = default;
  BorrowedTensorList(const BorrowedTensorList&) = delete;
  BorrowedTensorList& operator=(const BorrowedTensorList&) = delete;
  ~BorrowedTensorList() {
    for (at::Tensor& t : tensors_) {
      t.unsafeReleaseTensorImpl();
    }
    Py_XDECREF(owner_);
  }

  // False (nothing borrowed) unless `seq` is a list or tuple of plain tensors.
  bool borrow(PyObject* seq) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
      return false;
    }
    owner_ = PySequence_Tuple(seq);
    if (owner_ == nullptr) {
      throw python_error();
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(owner_);
    tensors_.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PyTuple_GET_ITEM(owner_, i);
      if (!THPVariable_CheckExact(item)) {
        return false;
      }
      c10::TensorImpl* impl = THPVariable_Unpack(item).unsafeGetTensorImpl();
      tensors_.emplace_back(
          c10::intrusive_ptr<c10::TensorImpl,
                             c10::UndefinedTensorImpl>::reclaim(impl));
    }
    return true;
  }

  at::TensorList get() const { return tensors_; }

 private:
  PyObject* owner_ = nullptr;
  std::vector<at::Tensor> tensors_;
};

// One Python argument converted to the C++ parameter type T of a schema.
// ok() is false when the argument is not of the handled plain form.
template <class T>
struct Arg;

template <>
struct Arg<at::TensorList> {
  BorrowedTensorList list;
  bool ok_ = false;
  explicit Arg(PyObject* o) { ok_ = list.borrow(o); }
  bool ok() const { return ok_; }
  at::TensorList get() const { return list.get(); }
};

template <>
struct Arg<const at::Tensor&> {
  const at::Tensor* t = nullptr;
  explicit Arg(PyObject* o) {
    if (THPVariable_CheckExact(o)) {
      t = &THPVariable_Unpack(o);  // alive: the args tuple holds it
    }
  }
  bool ok() const { return t != nullptr; }
  const at::Tensor& get() const { return *t; }
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> t;
  bool ok_ = false;
  explicit Arg(PyObject* o) {
    if (o == Py_None) {
      ok_ = true;
    } else if (THPVariable_CheckExact(o)) {
      t = THPVariable_Unpack(o);
      ok_ = true;
    }
  }
  bool ok() const { return ok_; }
  const std::optional<at::Tensor>& get() const { return t; }
};

template <>
struct Arg<double> {
  double v = 0.0;
  bool ok_ = false;
  explicit Arg(PyObject* o) {
    if (PyFloat_CheckExact(o) || PyLong_CheckExact(o)) {
      v = PyFloat_AsDouble(o);
      ok_ = !(v == -1.0 && PyErr_Occurred());
      PyErr_Clear();
    }
  }
  bool ok() const { return ok_; }
  double get() const { return v; }
};

template <>
struct Arg<std::optional<double>> {
  std::optional<double> v;
  bool ok_ = false;
  explicit Arg(PyObject* o) {
    if (o == Py_None) {
      ok_ = true;
    } else {
      Arg<double> d(o);
      ok_ = d.ok();
      v = d.get();
    }
  }
  bool ok() const { return ok_; }
  std::optional<double> get() const { return v; }
};

template <>
struct Arg<int64_t> {
  int64_t v = 0;
  bool ok_ = false;
  explicit Arg(PyObject* o) {
    if (PyLong_CheckExact(o)) {
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(o, &overflow);
      ok_ = overflow == 0 && !(v == -1 && PyErr_Occurred());
      PyErr_Clear();
    }
  }
  bool ok() const { return ok_; }
  int64_t get() const { return v; }
};

template <>
struct Arg<bool> {
  bool v = false;
  bool ok_ = false;
  explicit Arg(PyObject* o) {
    if (PyBool_Check(o)) {
      v = o == Py_True;
      ok_ = true;
    }
  }
  bool ok() const { return ok_; }
  bool get() const { return v; }
};

// sr_bases: only None takes the fast entry (a list, from a sharded step with
// stochastic rounding, goes through the dispatcher).
template <>
struct Arg<at::OptionalIntArrayRef> {
  bool ok_ = false;
  explicit Arg(PyObject* o) : ok_(o == Py_None) {}
  bool ok() const { return ok_; }
  at::OptionalIntArrayRef get() const { return std::nullopt; }
};

// Name: the schema name, e.g. "mixprec::unscale_and_check_" (a template
// argument, so that ops sharing a signature get their own handle).
template <const char* Name, class Sig>
struct FastCall;

template <const char* Name, class Ret, class... Args>
struct FastCall<Name, Ret(Args...)> {
  static PyObject* call(PyObject* args) {
    HANDLE_TH_ERRORS
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Name, "")
                               .template typed<Ret(Args...)>();
    if (!PyTuple_Check(args) ||
        PyTuple_GET_SIZE(args) != static_cast<Py_ssize_t>(sizeof...(Args)) ||
        at::impl::torch_function_mode_enabled()) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    return convert_and_call(op, args, std::index_sequence_for<Args...>{});
    END_HANDLE_TH_ERRORS
  }

 private:
  template <size_t... I>
  static PyObject* convert_and_call(
      const c10::TypedOperatorHandle<Ret(Args...)>& op, PyObject* args,
      std::index_sequence<I...> /*unused*/) {
    // Each Arg is built in place from its PyObject* (Args are not movable).
    std::tuple<Arg<Args>...> converted(PyTuple_GET_ITEM(args, I)...);
    if (!(std::get<I>(converted).ok() && ...)) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    if constexpr (std::is_void_v<Ret>) {
      {
        pybind11::gil_scoped_release no_gil;
        op.call(std::get<I>(converted).get()...);
      }
      Py_RETURN_NONE;
    } else {
      Ret out;
      {
        pybind11::gil_scoped_release no_gil;
        out = op.call(std::get<I>(converted).get()...);
      }
      return THPVariable_Wrap(std::move(out));
    }
  }
};

// fast_entry<Name, Sig>: FastCall<Name, Sig>::call as a METH_VARARGS function
// of a module's method table ("fast_<op>"; the op with positional arguments,
// or NotImplemented when the arguments need torch.ops).
template <const char* Name, class Sig>
PyObject* fast_entry(PyObject* /*self*/, PyObject* args) {
  return FastCall<Name, Sig>::call(args);
}

}  // namespace python
}  // namespace mixprec
