// The state watch's snapshot (torchcond/_src/state.py): what a branch can reach, read
// in one C call before the branch runs and compared in one after it (and before the
// next call, to reuse what was found).
//
// A probe is a tuple (kind, object) or (kind, object, key); its snapshot is the
// object's contents as identities, read without running Python code except where a
// set's membership test hashes or compares an item, or a tensor's hooks are copied:
//   kAttr (0, obj, name): getattr(obj, name), or a sentinel on AttributeError;
//   kItem (1, dict, key): dict.get(key), or the sentinel;
//   kCell (2, cell): its contents, or the sentinel for an empty cell;
//   kDict (3, dict or mappingproxy): its keys and values, in order;
//   kList (4, list): its items, in order;
//   kSet (5, set): its items (compared as `len(now) == len(before) and all(v in before
//     for v in now)`, as state._same_contents compares sets);
//   kType (6, obj): type(obj);
//   kTensor (7, tensor): its autograd state (requires_grad, .grad, hooks, what .data
//     is), held by a torchcond._C.AutogradHold (write_recorder.cpp).
// watch_same never says "the same" where anything differs by identity; it may say
// "changed" where a dict's keys were merely reordered (the caller then looks closer).
#include <torch/csrc/utils/pybind.h>

#include "write_recorder.h"

namespace torchcond {
namespace {

enum Kind : long { kAttr = 0, kItem = 1, kCell = 2, kDict = 3, kList = 4, kSet = 5, kType = 6, kTensor = 7 };

// What a probe read where there is nothing: a missing attribute, key or cell content.
PyObject* missing() {
  static PyObject* sentinel = PyBaseObject_Type.tp_alloc(&PyBaseObject_Type, 0);
  return sentinel;
}

// A new reference to the dict a kDict probe reads: the object itself, or a copy of
// what a mappingproxy (a class's __dict__) shows; nullptr (no error) for anything else.
PyObject* dict_of(PyObject* object) {
  if (PyDict_Check(object)) return Py_NewRef(object);
  if (Py_IS_TYPE(object, &PyDictProxy_Type)) return PyObject_CallMethod(object, "copy", nullptr);
  return nullptr;
}

// A new reference to what `probe` reads now, or nullptr with a Python error set.
PyObject* read(PyObject* probe) {
  if (!PyTuple_CheckExact(probe) || PyTuple_GET_SIZE(probe) < 2) {
    PyErr_SetString(PyExc_TypeError, "a watch probe is a tuple (kind, object[, key])");
    return nullptr;
  }
  const long kind = PyLong_AsLong(PyTuple_GET_ITEM(probe, 0));
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  PyObject* object = PyTuple_GET_ITEM(probe, 1);
  PyObject* key = PyTuple_GET_SIZE(probe) > 2 ? PyTuple_GET_ITEM(probe, 2) : nullptr;
  switch (kind) {
    case kAttr: {
      if (key == nullptr) break;
      PyObject* value = PyObject_GetAttr(object, key);
      if (value == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return Py_NewRef(missing());
      }
      return value;
    }
    case kItem: {
      if (key == nullptr || !PyDict_Check(object)) break;
      PyObject* value = PyDict_GetItemWithError(object, key);
      if (value == nullptr) return PyErr_Occurred() ? nullptr : Py_NewRef(missing());
      return Py_NewRef(value);
    }
    case kCell: {
      if (!PyCell_Check(object)) break;
      PyObject* value = PyCell_GET(object);
      return Py_NewRef(value == nullptr ? missing() : value);
    }
    case kDict: {
      PyObject* dict = dict_of(object);
      if (dict == nullptr) {
        if (PyErr_Occurred()) return nullptr;
        break;
      }
      PyObject* items = PyTuple_New(2 * PyDict_GET_SIZE(dict));
      if (items != nullptr) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(dict, &pos, &k, &v)) {
          PyTuple_SET_ITEM(items, i++, Py_NewRef(k));
          PyTuple_SET_ITEM(items, i++, Py_NewRef(v));
        }
      }
      Py_DECREF(dict);
      return items;
    }
    case kList:
      if (!PyList_Check(object)) break;
      return PyList_GetSlice(object, 0, PyList_GET_SIZE(object));
    case kSet:
      if (!PySet_Check(object)) break;
      return PyFrozenSet_New(object);
    case kType: return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(object)));
    case kTensor: return hold_autograd_state(object);
    default: break;
  }
  PyErr_Format(PyExc_TypeError, "a watch probe of kind %ld does not fit its object (%s)", kind,
               Py_TYPE(object)->tp_name);
  return nullptr;
}

// 1: `probe` reads now what `before` (its snapshot) holds; 0: it differs; -1: an error.
int same(PyObject* probe, PyObject* before) {
  const long kind = PyLong_AsLong(PyTuple_GET_ITEM(probe, 0));
  PyObject* object = PyTuple_GET_ITEM(probe, 1);
  switch (kind) {
    case kItem: {
      PyObject* value = PyDict_GetItemWithError(object, PyTuple_GET_ITEM(probe, 2));
      if (value == nullptr && PyErr_Occurred()) return -1;
      return (value == nullptr ? missing() : value) == before;
    }
    case kCell: {
      PyObject* value = PyCell_GET(object);
      return (value == nullptr ? missing() : value) == before;
    }
    case kDict: {
      PyObject* dict = dict_of(object);
      if (dict == nullptr) return -1;  // read() accepted it, so only an error gets here
      int result = 2 * PyDict_GET_SIZE(dict) == PyTuple_GET_SIZE(before);
      Py_ssize_t pos = 0, i = 0;
      PyObject *k, *v;
      while (result && PyDict_Next(dict, &pos, &k, &v)) {
        result = k == PyTuple_GET_ITEM(before, i) && v == PyTuple_GET_ITEM(before, i + 1);
        i += 2;
      }
      Py_DECREF(dict);
      return result;
    }
    case kList: {
      const Py_ssize_t n = PyList_GET_SIZE(object);
      if (n != PyList_GET_SIZE(before)) return 0;
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (PyList_GET_ITEM(object, i) != PyList_GET_ITEM(before, i)) return 0;
      }
      return 1;
    }
    case kSet: {
      if (PySet_GET_SIZE(object) != PySet_GET_SIZE(before)) return 0;
      PyObject* iterator = PyObject_GetIter(object);
      if (iterator == nullptr) return -1;
      int result = 1;
      while (PyObject* item = PyIter_Next(iterator)) {
        const int found = PySet_Contains(before, item);
        Py_DECREF(item);
        if (found != 1) {
          result = found;
          break;
        }
      }
      Py_DECREF(iterator);
      if (result == 1 && PyErr_Occurred()) return -1;
      return result;
    }
    case kType: return reinterpret_cast<PyObject*>(Py_TYPE(object)) == before;
    case kTensor: return autograd_state_same(before);
    default: {  // kAttr
      PyObject* value = read(probe);
      if (value == nullptr) return -1;
      const int result = value == before;
      Py_DECREF(value);
      return result;
    }
  }
}

bool is_list(PyObject* value, const char* what) {
  if (PyList_CheckExact(value)) return true;
  PyErr_Format(PyExc_TypeError, "watch: %s must be a list, not %s", what, Py_TYPE(value)->tp_name);
  return false;
}

// watch_snapshot(probes) -> list: what each probe reads now.
PyObject* watch_snapshot(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "watch_snapshot(probes) takes one argument");
    return nullptr;
  }
  PyObject* probes = args[0];
  if (!is_list(probes, "probes")) return nullptr;
  const Py_ssize_t n = PyList_GET_SIZE(probes);
  PyObject* snapshot = PyList_New(n);
  if (snapshot == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* value = read(PyList_GET_ITEM(probes, i));
    if (value == nullptr) {
      Py_DECREF(snapshot);
      return nullptr;
    }
    PyList_SET_ITEM(snapshot, i, value);
  }
  return snapshot;
}

// watch_same(probes, snapshot) -> bool: whether every probe reads what it read when
// `snapshot` was taken (watch_snapshot(probes)).
PyObject* watch_same(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "watch_same(probes, snapshot) takes two arguments");
    return nullptr;
  }
  PyObject* probes = args[0];
  PyObject* snapshot = args[1];
  if (!is_list(probes, "probes") || !is_list(snapshot, "snapshot")) return nullptr;
  const Py_ssize_t n = PyList_GET_SIZE(probes);
  if (PyList_GET_SIZE(snapshot) != n) {
    PyErr_SetString(PyExc_ValueError, "watch_same: the snapshot is not of these probes");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    // A probe list is only made by state.py, and only read here after watch_snapshot
    // checked every probe's shape.
    const int result = same(PyList_GET_ITEM(probes, i), PyList_GET_ITEM(snapshot, i));
    if (result < 0) return nullptr;
    if (result == 0) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyMethodDef kMethods[] = {
    {"watch_snapshot", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(watch_snapshot)), METH_FASTCALL,
     "The state watch's snapshot: what each probe (kind, object[, key]) reads now."},
    {"watch_same", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(watch_same)), METH_FASTCALL,
     "Whether every probe reads what it read when the snapshot was taken."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int snapshot_same(PyObject* probes, PyObject* snapshot) {
  PyObject* args[2] = {probes, snapshot};
  return truth(watch_same(nullptr, args, 2));
}

void bind_watch(pybind11::module& m) {
  pybind11::dict kinds;  // state.py's probe kinds, by name
  const std::pair<const char*, Kind> named[] = {{"attr", kAttr}, {"item", kItem}, {"cell", kCell},
                                                {"dict", kDict}, {"list", kList}, {"set", kSet},
                                                {"type", kType}, {"tensor", kTensor}};
  for (const auto& [name, kind] : named) kinds[name] = static_cast<long>(kind);
  m.attr("WATCH_PROBES") = kinds;
  add_functions(m, kMethods);
}

}  // namespace torchcond
