// The tensor moves of torchcond/_src/batching.py's vmap rule, one call per list: the
// batch's own tensors, batch dimension first, of values seen at a vmap level; and
// those tensors seen at the level again.
//
// And the rule's eager common case in one call (per_example_cond, below).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <vector>

#include "write_recorder.h"

namespace torchcond {
namespace {

// The batch's own tensor for `t` at vmap `level`, batch dimension first: an unbatched
// value is expanded to the batch without a copy.
// Sizes are SymInts: the rule also runs in traces with symbolic shapes.
at::Tensor batch_first(const at::Tensor& t, int64_t level, const c10::SymInt& size) {
  const auto* batched = at::functorch::maybeGetBatchedImpl(t);
  if (batched != nullptr && batched->level() == level) {
    const at::Tensor& physical = batched->value();
    return batched->bdim() == 0 ? physical : physical.movedim(batched->bdim(), 0);
  }
  std::vector<c10::SymInt> shape{size};
  const auto sizes = t.sym_sizes();
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  return t.expand_symint(shape);
}

// --- cond with every branch run, eagerly, in one call ---------------------------------
//
// per_example_cond(pred, true_fn, false_fn, operands) is cond under vmap with a
// predicate batched at the only torch.func level, and select_cond(...) is
// cond(..., strategy="select") outside any. Both are for eager code with no gradient,
// and for the common case only: what batching.per_example and
// strategies.run_all_and_select do through run_every_branch and a select. Both
// branches run on the operands while a write recorder observes them
// (write_recorder.cpp), and each branch's state-watch snapshot is compared after it
// (state.py). One select then picks the outputs, under vmap below the level.
//
// Each returns None, and the caller takes the general path, when the call is not that
// case; it checks that before a branch runs. A branch that has run never runs again.
// A branch that wrote to an operand, changed what the state watch sees or raised, and
// outputs that are not tensors that agree, stop the call with a Handoff, and the
// general path goes on from there (torchcond/_src/handoff.py).
//
// What they read and call of Python comes with each call, as a tuple in this order
// (state.ONE_CALL, with api._EAGER last). Its items are borrowed from it.
struct OneCall {
  PyObject* record = nullptr;         // state._watched(fn, label) -> its _Found
  PyObject* buffer_hooks = nullptr;   // torch's global buffer registration hooks (a dict)
  PyObject* missing = nullptr;        // state._MISSING
  PyObject* current_level = nullptr;  // torch._C._functorch.current_level
  EagerContext eager;                 // eager.cpp's context
};

bool one_call_of(PyObject* tuple, OneCall& out) {
  if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != 5) return false;
  PyObject* const* items = &PyTuple_GET_ITEM(tuple, 0);
  out = {items[0], items[1], items[2], items[3], {}};
  return PyDict_Check(out.buffer_hooks) && eager_context_of(items[4], out.eager);
}

// Whether `pred` is batched by the only torch.func level, a vmap. A level's id is one
// more than the number of levels below it, so the only level is 1, and
// torch._C._functorch.current_level() names the innermost one (functorch's header for
// it needs a library that torch does not ship). Returns -1 with a Python error set.
int batched_by_only_level(const OneCall& ctx, const at::Tensor& pred) {
  const auto* batched = at::functorch::maybeGetBatchedImpl(pred);
  if (batched == nullptr || batched->level() != 1) return 0;
  PyObject* level = PyObject_CallNoArgs(ctx.current_level);
  if (level == nullptr) {  // no level at all: a tensor of a vmap that has ended
    PyErr_Clear();
    return 0;
  }
  const long id = PyLong_AsLong(level);
  Py_DECREF(level);
  if (id == -1 && PyErr_Occurred()) return -1;
  return id == 1;
}

// A branch's output as its tensors: one tensor, or a tuple or list of tensors. Returns
// false for anything else.
bool output_tensors(PyObject* out, std::vector<PyObject*>& leaves) {
  if (THPVariable_CheckExact(out)) {
    leaves.push_back(out);
    return true;
  }
  const bool tuple = PyTuple_CheckExact(out);
  if (!tuple && !PyList_CheckExact(out)) return false;
  const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(out) : PyList_GET_SIZE(out);
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* leaf = tuple ? PyTuple_GET_ITEM(out, j) : PyList_GET_ITEM(out, j);
    if (!THPVariable_CheckExact(leaf)) return false;
    leaves.push_back(leaf);
  }
  return true;
}

// Whether two outputs can be selected: the same structure, and leaves that agree as
// merge.check_agreement's common case, shapes included. 1, 0, or -1 with a Python error.
int selectable(PyObject* a, PyObject* b, const std::vector<PyObject*>& as, const std::vector<PyObject*>& bs) {
  if (Py_TYPE(a) != Py_TYPE(b) || as.size() != bs.size()) return 0;
  pybind11::list outputs;
  for (const auto* leaves : {&as, &bs}) {
    pybind11::tuple tuple(leaves->size());
    for (size_t j = 0; j < leaves->size(); ++j) tuple[j] = pybind11::reinterpret_borrow<pybind11::object>((*leaves)[j]);
    outputs.append(tuple);
  }
  return outputs_agree(outputs.ptr(), true);
}

PyObject* none() { Py_RETURN_NONE; }

// The keys of torch.func's other wrappers (grad's and functionalize's).
const c10::DispatchKeySet kWrapped({c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize});

// Whether every operand is plain, or batched by vmap level `level` (0: none) over a
// plain tensor. Another torch.func wrapper (grad's, dead or alive) goes to the general
// path, which unwraps a dead one.
bool own_operands(const pybind11::tuple& operands, int64_t level) {
  for (const auto& operand : operands) {
    const at::Tensor& t = THPVariable_Unpack(operand.ptr());
    const auto* batched = at::functorch::maybeGetBatchedImpl(t);
    if (batched != nullptr ? batched->level() != level || at::functorch::isBatchedTensor(batched->value())
                           : t.key_set().has_any(kWrapped)) {
      return false;
    }
  }
  return true;
}

// What both entry points check of the call around the predicate: no gradient, no
// forward-AD level (torch.autograd.forward_ad opens level 0, one at a time), the
// recorder free, no buffer hooks, no mode, profiler or trace. 1, 0 (the general path),
// or -1 with a Python error set.
int plain_call(const OneCall& ctx, const at::Tensor& pred) {
  if (pred.scalar_type() != at::kBool || pred.dim() != 0 || at::GradMode::is_enabled() || !recorder_available() ||
      PyDict_Size(ctx.buffer_hooks) != 0 || torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr) {
    return 0;
  }
  return eager_context(ctx.eager, pred);
}

// Runs both branches and selects, where the callers have checked the call: with the
// predicate batched at vmap level `level`, or with `level` 0 for no level.
PyObject* run_both_and_select(const OneCall& ctx, PyObject* const* args, const at::Tensor& pred,
                              const pybind11::tuple& operands, int64_t level) {
  namespace py = pybind11;
  static PyObject* const labels[2] = {PyUnicode_InternFromString("true_fn"), PyUnicode_InternFromString("false_fn")};
  py::object records[2];
  for (int k = 0; k < 2; ++k) {
    PyObject* call[2] = {args[1 + k], labels[k]};
    records[k] = py::reinterpret_steal<py::object>(PyObject_Vectorcall(ctx.record, call, 2, nullptr));
    if (!records[k]) return nullptr;
  }
  py::tuple pair = py::make_tuple(py::handle(args[1]), py::handle(args[2]));
  py::tuple record_pair = py::make_tuple(records[0], records[1]);
  py::object recorder = new_recorder(operands.ptr());
  const Guard guard{recorder.ptr(), nullptr, record_pair.ptr(), ctx.buffer_hooks, ctx.missing};
  Handoff handoff = run_untaken(pair.ptr(), operands.ptr(), guard, 0);
  auto hand_on = [&]() { return as_python(std::move(handoff)); };
  if (handoff.stop >= 0) return hand_on();
  py::object outs[2] = {handoff.outputs[0], handoff.outputs[1]};
  std::vector<PyObject*> leaves[2];
  for (int k = 0; k < 2; ++k) {
    if (!output_tensors(outs[k].ptr(), leaves[k])) return hand_on();
  }
  const int agree = selectable(outs[0].ptr(), outs[1].ptr(), leaves[0], leaves[1]);
  if (agree <= 0) return agree < 0 ? nullptr : hand_on();
  // The select. Under vmap it runs below the level, on the batch's own tensors. They
  // are plain tensors, so leaving out functorch's keys is what setting the level aside
  // would do.
  c10::SymInt size;
  if (level != 0) {
    const auto* batched = at::functorch::maybeGetBatchedImpl(pred);
    size = batched->value().sym_size(batched->bdim());
  }
  auto own = [&](PyObject* value) {
    const at::Tensor& t = THPVariable_Unpack(value);
    return level != 0 ? batch_first(t, level, size) : t;
  };
  std::vector<at::Tensor> trues, falses;
  for (size_t j = 0; j < leaves[0].size(); ++j) {
    if (leaves[0][j] == leaves[1][j]) continue;
    trues.push_back(own(leaves[0][j]));
    falses.push_back(own(leaves[1][j]));
  }
  std::vector<at::Tensor> selected;
  if (!trues.empty()) {
    const at::Tensor mask = level != 0 ? batch_first(pred, level, size) : pred;
    static const auto select = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("torchcond::select", "")
                                   .typed<std::vector<at::Tensor>(const at::Tensor&, at::TensorList, at::TensorList)>();
    c10::impl::ExcludeDispatchKeyGuard no_level(
        c10::DispatchKeySet({c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                             c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::FuncTorchBatched}));
    at::AutoDispatchBelowAutograd below;
    try {
      selected = select.call(mask, trues, falses);
    } catch (const c10::Error&) {  // the general path explains it
      return hand_on();
    }
  }
  // The outputs, in the first branch's structure.
  const Py_ssize_t n = static_cast<Py_ssize_t>(leaves[0].size());
  auto leaf = [&, next = size_t{0}](Py_ssize_t j) mutable -> PyObject* {
    if (leaves[0][j] == leaves[1][j]) return Py_NewRef(leaves[0][j]);
    at::Tensor& value = selected[next++];
    return THPVariable_Wrap(level != 0 ? at::functorch::addBatchDim(value, 0, level) : value);
  };
  if (THPVariable_CheckExact(outs[0].ptr())) return leaf(0);
  py::object result =
      py::reinterpret_steal<py::object>(PyTuple_CheckExact(outs[0].ptr()) ? PyTuple_New(n) : PyList_New(n));
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* value = leaf(j);
    if (value == nullptr) return nullptr;
    if (PyTuple_Check(result.ptr())) {
      PyTuple_SET_ITEM(result.ptr(), j, value);
    } else {
      PyList_SET_ITEM(result.ptr(), j, value);
    }
  }
  return result.release().ptr();
}

// Whether the predicate is where an entry point wants it: batched by the only
// torch.func level (`level` 1), or outside any level (`level` 0, where functorch's front
// key is in this thread's set while a level is active). 1, 0, or -1 with an error set.
int at_level(const OneCall& ctx, const at::Tensor& pred, int64_t level) {
  if (level != 0) return batched_by_only_level(ctx, pred);
  return !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) &&
         !pred.key_set().has_any(kWrapped) && !at::functorch::isBatchedTensor(pred);
}

// Both entry points: check the call for `level` (see at_level), then run both branches
// and select. None for the general path, or a Handoff once a branch has run.
PyObject* one_call(PyObject* const* all, Py_ssize_t nargs, const char* signature, int64_t level) {
  OneCall ctx;
  if (nargs != 5 || !one_call_of(all[0], ctx)) {
    PyErr_SetString(PyExc_TypeError, signature);
    return nullptr;
  }
  PyObject* const* args = all + 1;
  if (!THPVariable_CheckExact(args[0]) || !PyFunction_Check(args[1]) || !PyFunction_Check(args[2]) ||
      !eager_operands(args[3])) {
    return none();
  }
  try {
    const at::Tensor& pred = THPVariable_Unpack(args[0]);
    int ok = at_level(ctx, pred, level);
    if (ok > 0) ok = plain_call(ctx, pred);
    if (ok <= 0) return ok < 0 ? nullptr : none();
    auto operands = pybind11::reinterpret_steal<pybind11::tuple>(PySequence_Tuple(args[3]));
    if (!operands) return nullptr;
    if (!own_operands(operands, level)) return none();
    return run_both_and_select(ctx, args, pred, operands, level);
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

PyObject* per_example_cond(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  return one_call(args, nargs, "per_example_cond(context, pred, true_fn, false_fn, operands)", 1);
}

PyObject* select_cond(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  return one_call(args, nargs, "select_cond(context, pred, true_fn, false_fn, operands)", 0);
}

PyMethodDef kMethods[] = {
    {"per_example_cond", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(per_example_cond)), METH_FASTCALL,
     "cond under vmap with a per-example predicate, eagerly, in one call; None or a Handoff for the general path."},
    {"select_cond", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(select_cond)), METH_FASTCALL,
     "cond(..., strategy='select'), eagerly with no gradient, in one call; None or a Handoff for the general path."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bind_batching(pybind11::module& m) {
  add_functions(m, kMethods);
  m.def(
      "batch_first",
      [](const std::vector<std::optional<at::Tensor>>& values, int64_t level, const c10::SymInt& size) {
        std::vector<std::optional<at::Tensor>> out;
        out.reserve(values.size());
        for (const auto& v : values) out.push_back(v ? std::optional<at::Tensor>(batch_first(*v, level, size)) : v);
        return out;
      },
      "Each value's batch tensor at vmap `level`, batch dimension first (None stays None).");
  m.def(
      "batched",
      [](const std::vector<at::Tensor>& values, int64_t level) {
        std::vector<at::Tensor> out;
        out.reserve(values.size());
        for (const auto& v : values) out.push_back(at::functorch::addBatchDim(v, 0, level));
        return out;
      },
      "Each tensor seen at vmap `level`, its first dimension the batch.");
}

}  // namespace torchcond
