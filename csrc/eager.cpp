// The eager fast path of cond and switch (torchcond/_src/api.py): every check that says
// "a Python `if` gives what the conditional would" in one C call, and the branch to
// call, or None for api.py's slow path.
//
// The checks, in api.py's words: a plain tensor selector (exactly torch.Tensor), plain
// tensor operands in a tuple or list, callable branches, no dispatch or torch-function
// mode (tracing, a user's mode), a real selector dtype (bool or real for cond, an integer
// for switch), no CUDA graph capturing on a CUDA selector (reading it would break the
// capture), no profiler (the slow path adds its ranges), no torch.jit trace (the slow
// path reads the selector as Python does, with the tracer's warning). Then the selector
// is read, as Python's bool()/index() would: a selector that cannot be read (several
// elements, batched by vmap, meta) goes to the slow path, which explains or handles it.
//
// These checks mirror host.host_readable(selector, PLAIN) (torchcond/_src/host.py), the
// one rule for "can the host read the selector now". test/test_host_readable.py checks
// that the two agree.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include "write_recorder.h"

namespace torchcond {
namespace {

bool is_plain_tensor(PyObject* object) { return Py_TYPE(object) == reinterpret_cast<PyTypeObject*>(THPVariableClass); }

// A tuple or list whose items are all exactly torch.Tensor (or a Parameter, with
// `parameters`: a plain tensor to C++).
bool plain_operands(PyObject* operands, bool parameters = false) {
  const bool tuple = PyTuple_CheckExact(operands);
  if (!tuple && !PyList_CheckExact(operands)) return false;
  const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(operands) : PyList_GET_SIZE(operands);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* operand = tuple ? PyTuple_GET_ITEM(operands, i) : PyList_GET_ITEM(operands, i);
    if (!(parameters ? THPVariable_CheckExact(operand) : is_plain_tensor(operand))) return false;
  }
  return true;
}

// -1: a Python error is set; 0: the slow path decides; 1: a Python `if` may run.
int plain_context(const EagerContext& context, const at::Tensor& selector) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() != 0 || at::impl::PythonTorchFunctionTLS::stack_len() != 0) {
    return 0;
  }
  if (torch::jit::tracer::isTracing()) return 0;
  PyObject* profiling = PyObject_GetAttr(context.profiler_module, context.profiler_flag);
  if (profiling == nullptr) return -1;
  const int on = PyObject_IsTrue(profiling);
  Py_DECREF(profiling);
  if (on != 0) return on < 0 ? -1 : 0;
  if (selector.is_cuda()) {
    PyObject* capturing = PyObject_CallNoArgs(context.capturing);
    if (capturing == nullptr) return -1;
    const int yes = PyObject_IsTrue(capturing);
    Py_DECREF(capturing);
    if (yes != 0) return yes < 0 ? -1 : 0;
  }
  return 1;
}

PyObject* slow() { Py_RETURN_NONE; }

// read() of the selector `t` on the host; a CUDA read waits for the device, so it runs
// without the GIL.
template <typename Read>
auto host_read(const at::Tensor& t, Read read) {
  if (t.is_cuda()) {
    pybind11::gil_scoped_release no_gil;
    return read();
  }
  return read();
}

// taken_branch(context, pred, true_fn, false_fn, operands) -> the branch cond takes, or
// None. `context` is an EagerContext's tuple.
PyObject* taken_branch(PyObject* /*module*/, PyObject* const* all, Py_ssize_t nargs) {
  EagerContext context;
  if (nargs != 5 || !eager_context_of(all[0], context)) {
    PyErr_SetString(PyExc_TypeError, "taken_branch(context, pred, true_fn, false_fn, operands)");
    return nullptr;
  }
  PyObject* const* args = all + 1;
  PyObject* pred = args[0];
  if (!is_plain_tensor(pred) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2]) ||
      !plain_operands(args[3])) {
    return slow();
  }
  try {
    const at::Tensor& p = THPVariable_Unpack(pred);
    if (p.scalar_type() != at::kBool && p.is_complex()) return slow();
    // Cannot be read: the slow path explains or handles it (a read would raise, slowly).
    if (p.is_meta() || at::functorch::isBatchedTensor(p) || p.numel() != 1) return slow();
    const int plain = plain_context(context, p);
    if (plain <= 0) return plain < 0 ? nullptr : slow();
    bool taken;
    try {
      taken = host_read(p, [&] { return p.is_nonzero(); });
    } catch (...) {  // several elements, batched by vmap, meta: explained there
      return slow();
    }
    PyObject* fn = taken ? args[1] : args[2];
    Py_INCREF(fn);
    return fn;
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

// taken_case(context, index, branches, operands) -> branches[clamp(index, 0, n - 1)], or
// None. `context` is an EagerContext's tuple.
PyObject* taken_case(PyObject* /*module*/, PyObject* const* all, Py_ssize_t nargs) {
  EagerContext context;
  if (nargs != 4 || !eager_context_of(all[0], context)) {
    PyErr_SetString(PyExc_TypeError, "taken_case(context, index, branches, operands)");
    return nullptr;
  }
  PyObject* const* args = all + 1;
  PyObject* index = args[0];
  PyObject* branches = args[1];
  if (!is_plain_tensor(index) || !PyList_CheckExact(branches) || PyList_GET_SIZE(branches) == 0 ||
      !plain_operands(args[2])) {
    return slow();
  }
  const Py_ssize_t n = PyList_GET_SIZE(branches);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyCallable_Check(PyList_GET_ITEM(branches, i))) return slow();
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(index);
    // A uint64 index at or above 2**63 is read by the slow path, whose Python int holds it.
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false) || t.scalar_type() == at::kUInt64) {
      return slow();
    }
    const int plain = plain_context(context, t);
    if (plain <= 0) return plain < 0 ? nullptr : slow();
    int64_t i;
    if (t.is_meta() || at::functorch::isBatchedTensor(t) || t.numel() != 1) return slow();
    try {
      i = host_read(t, [&] { return t.item<int64_t>(); });
    } catch (...) {  // batched, meta: explained there
      return slow();
    }
    i = i < 0 ? 0 : (i >= n ? n - 1 : i);  // kinds.clamp_index, without calling Python
    PyObject* fn = PyList_GET_ITEM(branches, i);
    Py_INCREF(fn);
    return fn;
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

// plain_tensors(values, parameters) -> whether values is a tuple or list of tensors that
// are exactly torch.Tensor (or Parameter, when parameters is true).
PyObject* plain_tensors(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "plain_tensors(values, parameters)");
    return nullptr;
  }
  const int parameters = PyObject_IsTrue(args[1]);
  if (parameters < 0) return nullptr;
  return PyBool_FromLong(plain_operands(args[0], parameters != 0));
}

// plainly_agree(outputs, shapes) -> whether every branch's outputs (a list of tuples)
// are dense tensors agreeing position by position on dtype, device, layout and rank,
// and on shape too with `shapes`: merge.check_agreement's common case, decided without
// Python. False sends the caller to the full rules, which name what differs.
PyObject* plainly_agree(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "plainly_agree(outputs: list, shapes: bool)");
    return nullptr;
  }
  const int shapes = PyObject_IsTrue(args[1]);
  if (shapes < 0) return nullptr;
  PyObject* outputs = args[0];
  const Py_ssize_t num_branches = PyList_GET_SIZE(outputs);
  if (num_branches == 0) Py_RETURN_FALSE;
  PyObject* firsts = PyList_GET_ITEM(outputs, 0);
  if (!PyTuple_Check(firsts)) Py_RETURN_FALSE;
  const Py_ssize_t n = PyTuple_GET_SIZE(firsts);
  for (Py_ssize_t b = 1; b < num_branches; ++b) {
    PyObject* outs = PyList_GET_ITEM(outputs, b);
    if (!PyTuple_Check(outs) || PyTuple_GET_SIZE(outs) != n) Py_RETURN_FALSE;
  }
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* first = PyTuple_GET_ITEM(firsts, j);
    if (!THPVariable_Check(first)) Py_RETURN_FALSE;
    const at::Tensor& expected = THPVariable_Unpack(first);
    if (expected.layout() != at::kStrided || expected.is_quantized() ||
        expected.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      Py_RETURN_FALSE;
    }
    for (Py_ssize_t b = 1; b < num_branches; ++b) {
      PyObject* other = PyTuple_GET_ITEM(PyList_GET_ITEM(outputs, b), j);
      if (other == first) continue;
      if (!THPVariable_Check(other)) Py_RETURN_FALSE;
      const at::Tensor& tensor = THPVariable_Unpack(other);
      if (tensor.scalar_type() != expected.scalar_type() || tensor.device() != expected.device() ||
          tensor.layout() != at::kStrided || tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
          tensor.dim() != expected.dim() || (shapes && tensor.sizes() != expected.sizes())) {
        Py_RETURN_FALSE;
      }
    }
  }
  Py_RETURN_TRUE;
}

PyMethodDef kMethods[] = {
    {"taken_branch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(taken_branch)), METH_FASTCALL,
     "cond's eager fast path: the branch a Python `if` would take, or None (the slow path)."},
    {"taken_case", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(taken_case)), METH_FASTCALL,
     "switch's eager fast path: the branch a Python `if` would take, or None (the slow path)."},
    {"plain_tensors", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(plain_tensors)), METH_FASTCALL,
     "Whether a tuple or list holds only plain tensors (exactly torch.Tensor, or Parameter too)."},
    {"plainly_agree", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(plainly_agree)), METH_FASTCALL,
     "merge.check_agreement's common case: dense outputs that agree, decided in C."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool eager_operands(PyObject* operands) { return plain_operands(operands); }

int outputs_agree(PyObject* outputs, bool shapes) {
  PyObject* args[2] = {outputs, shapes ? Py_True : Py_False};
  return truth(plainly_agree(nullptr, args, 2));
}

bool eager_context_of(PyObject* tuple, EagerContext& out) {
  if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(tuple, 1))) {
    return false;
  }
  out = {PyTuple_GET_ITEM(tuple, 0), PyTuple_GET_ITEM(tuple, 1), PyTuple_GET_ITEM(tuple, 2)};
  return true;
}

int eager_context(const EagerContext& context, const at::Tensor& selector) { return plain_context(context, selector); }

void bind_eager(pybind11::module& m) {
  add_functions(m, kMethods);
}

}  // namespace torchcond
