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

// Adds each function of `defs` (ended by an entry with no name) to `m`, where a
// function takes METH_FASTCALL arguments instead of pybind11's conversions.
inline void add_functions(pybind11::module& m, PyMethodDef* defs) {
  for (PyMethodDef* def = defs; def->ml_name != nullptr; ++def) {
    PyObject* fn = PyCFunction_NewEx(def, nullptr, m.ptr());
    if (fn == nullptr) throw pybind11::error_already_set();
    m.add_object(def->ml_name, pybind11::reinterpret_steal<pybind11::object>(fn));
  }
}

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

// The one runner for branches that run whether or not they are taken (write_recorder.cpp).
// It composes the guards around each branch, in this order: the buffer hook (with a
// state record), the autograd hold and the write recorder (with a recorder), the
// branch, then the snapshot's comparison (with a state record). Python settles what a
// branch left (torchcond/_src/untaken.py, state.py, write_guard.py).
//
// What guards the branches; a null member is a guard not wanted.
struct Guard {
  PyObject* recorder = nullptr;  // a WriteRecorder, reset for each branch, observing its ops
  PyObject* real = nullptr;      // bools: hold the autograd state of args[i] where real[i]; null: all
  PyObject* records = nullptr;   // per branch, its state record (state._Found), or None
  PyObject* hooks = nullptr;     // torch's buffer registration hooks (an OrderedDict), with records
  PyObject* missing = nullptr;   // what note_assigned records for a buffer that was not there
};

// What run_untaken found: the outputs of the branches that settled, in order, and the
// first branch that did not settle, if one ran (stop >= 0). That branch raised, wrote
// to an operand, changed an operand's autograd state, assigned a buffer or changed
// what its state record watches. Its writes are still in place. Hidden, as pybind11's
// types in it are (gcc warns otherwise); Python sees it as a named tuple (as_python).
struct __attribute__((visibility("hidden"))) Handoff {
  pybind11::list outputs;
  Py_ssize_t stop = -1;                          // the index of the branch that did not settle
  pybind11::object out = pybind11::none();       // its output, or None
  pybind11::object error = pybind11::none();     // what it raised, or None
  pybind11::object recorder = pybind11::none();  // the recorder, where it wrote (saved or refused)
  pybind11::list assigned;                       // (module, name, buffer before) per buffer it assigned
  pybind11::object record = pybind11::none();    // its state record, or None
};

// branches[start:] called on the tuple `args`, one after the other, each under
// `guard`, until one does not settle. Throws for the runner's own errors only.
Handoff run_untaken(PyObject* branches, PyObject* args, const Guard& guard, Py_ssize_t start);
// The Handoff as torchcond._C.Handoff (a named tuple); nullptr with a Python error set.
PyObject* as_python(Handoff&& h);
// A new WriteRecorder of the plain tensors in the tuple `args`, refusing no write.
pybind11::object new_recorder(PyObject* args);
// Whether the recorder's dispatch key is free for it in this process.
bool recorder_available();
// A new torchcond._C.AutogradHold of `tensor`, or nullptr with a Python error set.
PyObject* hold_autograd_state(PyObject* tensor);
// Whether the tensor of `hold` (an AutogradHold) has the state it held: 1, 0, or -1
// with a Python error set.
int autograd_state_same(PyObject* hold);

}  // namespace torchcond
