// Python bindings of torchcond._C beyond the operators' argument checks (ops.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchcond {

// torchcond._C.WriteRecorder (write_recorder.cpp).
void bind_write_recorder(pybind11::module& m);
// torchcond._C.batch_first and batched (batching.cpp).
void bind_batching(pybind11::module& m);
// torchcond._C.taken_branch, taken_case and plain_tensors (eager.cpp).
void bind_eager(pybind11::module& m);
// torchcond._C.watch_snapshot and watch_same (watch.cpp).
void bind_watch(pybind11::module& m);

// What the vmap rule's C++ (batching.cpp) shares with the files above.

// 1 for True, 0 for anything else, -1 for nullptr (a Python error set). Takes the
// reference to `result`, a bool function's return value.
inline int truth(PyObject* result) {
  if (result == nullptr) return -1;
  const int yes = result == Py_True;
  Py_DECREF(result);
  return yes;
}

// watch_same(probes, snapshot): 1, 0, or -1 with a Python error set (watch.cpp).
int snapshot_same(PyObject* probes, PyObject* snapshot);
// A tuple or list of tensors that are exactly torch.Tensor (eager.cpp).
bool eager_operands(PyObject* operands);
// plainly_agree(outputs, shapes), merge.check_agreement's common case in C: 1, 0, or
// -1 with a Python error set (eager.cpp).
int outputs_agree(PyObject* outputs, bool shapes);
// What the eager fast paths read of Python, passed with each call as a tuple
// (api._EAGER): the module and attribute name of the profiler's flag, and
// torch.cuda.is_current_stream_capturing. Borrowed from the caller's tuple.
struct EagerContext {
  PyObject* profiler_module = nullptr;
  PyObject* profiler_flag = nullptr;
  PyObject* capturing = nullptr;
};
// Reads an EagerContext's tuple; false for anything else (eager.cpp).
bool eager_context_of(PyObject* tuple, EagerContext& out);
// 1 where no mode, profiler or torch.jit trace is active (nor a CUDA graph capture on
// the selector's device); 0 otherwise; -1 with a Python error set (eager.cpp).
int eager_context(const EagerContext& context, const at::Tensor& selector);

// One branch run on `args` (a tuple of the operands) while a recorder of its own
// observes. A run that wrote to an operand, or raised, is left as it is: its
// torchcond._C.WriteRecorder comes with it, holding what it saved and refused, for the
// caller to undo or finish (write_guard.py). A change of an operand's autograd state is
// put back and raised as run_recorded raises it.
struct ObservedRun {
  PyObject* out;       // a new reference, or nullptr with the Python error set
  PyObject* recorder;  // a new reference, or nullptr for a run that wrote nothing and raised nothing
};
ObservedRun run_observed(PyObject* branch, PyObject* args);
// Whether the recorder's dispatch key is free for it in this process.
bool recorder_available();
// A new torchcond._C.AutogradHold of `tensor`, or nullptr with a Python error set.
PyObject* hold_autograd_state(PyObject* tensor);
// Whether the tensor of `hold` (an AutogradHold) has the state it held: 1, 0, or -1
// with a Python error set.
int autograd_state_same(PyObject* hold);

}  // namespace torchcond
