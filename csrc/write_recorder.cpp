// Writes of a branch that runs whether or not it is taken (strategy="select", vmap with
// a per-example selector): torchcond._C.WriteRecorder, the rules of
// torchcond/_src/write_guard.py (its docstring says what happens to a write).
//
// A recorder knows the branch's operands (each one's tensor under any functorch
// wrapper). Before a write lands it classifies the written tensor by its storage:
//   * made by the branch (a fresh output of an op it ran): nothing to do;
//   * exactly one operand's, within that operand's elements: the operand's old value
//     is saved, once (write_guard.py selects the new one and puts the old one back);
//   * anything else is refused, before it lands: a tensor from outside the branch, an
//     operand that shares memory with another one or needs a gradient, memory of an
//     operand's storage outside its elements, and an operand's shape, strides or
//     storage changed in place (an op tagged inplace_view, such as unsqueeze_ or
//     resize_, set_data), since only values can be selected per branch.
// A branch may also change an operand's autograd state through attributes, which no op
// shows: requires_grad, .grad and its Python hooks. The recorder holds that state for
// each operand the branch receives (hold()), puts it back after the branch and refuses
// a change (put_back()).
//
// It hears of ops through observe(): a boxed fallback on a dispatch key the recorder
// puts in this thread's included set while the branch runs, torch's mechanism for a
// mode written in C++ (see kKey). It sees the branch's own calls, above autograd,
// functorch and any dispatch mode: the op a user called, before torch decomposes it;
// the ops an op runs inside are hidden (the key is excluded while it runs), so a
// kernel's work costs nothing. A call on a grad transform's wrapper, which has no
// storage to classify, is seen again on what it wraps, one level down.
#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "write_recorder.h"

namespace torchcond {
namespace {

// The key the recorder's fallback is registered on. PyTorch has no dispatch key for
// extensions' modes; DeferredInit is the one it keeps for an out-of-tree mode (torchdistx's
// deferred module initialization, unmaintained and not importable with torch 2), and sits
// where such a mode belongs: below functorch's front layer and torch's Python TLS snapshot,
// above autograd. The fallback is registered on first use, only while nothing else is
// registered on the key (available()); otherwise write_guard.py refuses to run a branch
// untaken.
constexpr c10::DispatchKey kKey = c10::DispatchKey::DeferredInit;

using StorageId = const c10::StorageImpl*;

// The tensor under vmap's and functionalize's wrappers, as torchcond._compat.
// functorch_base unwraps it in Python. A grad or jvp level's wrapper has no storage and
// stays: the call it forwards is seen again on what it wraps.
const at::Tensor& functorch_base(const at::Tensor& t) {
  if (auto* batched = at::functorch::maybeGetBatchedImpl(t)) return functorch_base(batched->value());
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    return functorch_base(at::functionalization::impl::unsafeGetFunctionalWrapper(t)->value());
  }
  return t;
}

StorageId storage_of(const at::Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  const c10::Storage& s = functorch_base(tensor).unsafeGetTensorImpl()->unsafe_storage();
  return s ? s.unsafeGetStorageImpl() : nullptr;
}

template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) f(t);
  } else if (v.isList()) {  // Tensor?[]
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

std::string op_name(const c10::FunctionSchema& schema) {  // aten.add_.Tensor, as Python prints it
  std::string name = schema.name();
  const auto sep = name.find("::");
  if (sep != std::string::npos) name.replace(sep, 2, ".");
  return name + "." + (schema.overload_name().empty() ? "default" : schema.overload_name());
}

// Why a write is refused. Python reads these by name (torchcond._C.WRITE_REFUSALS) and
// keeps one message per name (write_guard._WHY).
enum Why : int64_t {
  kOutside = 0,
  kShared = 1,
  kNeedsGrad = 2,
  kOutsideElements = 3,
  kMetadata = 4,
  kAutogradState = 5
};

struct Refusal {
  int64_t operand;  // -1: not an operand
  std::string op;
  std::vector<int64_t> shape;
  int64_t why;
};

bool concrete(const at::Tensor& t) { return !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

// Whether every element of `inner` is an element of `outer`, two views of one storage
// with concrete layouts. Byte offsets, so a view of another dtype is compared as memory.
bool within_elements(const at::Tensor& inner, const at::Tensor& outer) {
  if (inner.numel() == 0) return true;
  if (outer.numel() == 0) return false;
  const int64_t outer_itemsize = static_cast<int64_t>(outer.element_size());
  const int64_t inner_itemsize = static_cast<int64_t>(inner.element_size());
  auto extent = [](const at::Tensor& t, int64_t itemsize) {  // [first byte, last byte + 1)
    int64_t begin = t.storage_offset() * itemsize, end = begin;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t span = (t.size(d) - 1) * t.stride(d) * itemsize;
      (span < 0 ? begin : end) += span;
    }
    return std::make_pair(begin, end + itemsize);
  };
  const auto [outer_begin, outer_end] = extent(outer, outer_itemsize);
  const auto [inner_begin, inner_end] = extent(inner, inner_itemsize);
  if (inner_begin < outer_begin || inner_end > outer_end) return false;
  if (outer.is_non_overlapping_and_dense()) return true;  // its extent is its elements
  if (outer_itemsize == inner_itemsize && inner.storage_offset() == outer.storage_offset() &&
      inner.sizes().equals(outer.sizes()) && inner.strides().equals(outer.strides())) {
    return true;
  }
  // Byte by byte: a write into part of a strided operand, checked once per op.
  std::vector<uint8_t> mine(static_cast<size_t>(outer_end - outer_begin), 0);
  auto each_element = [](const at::Tensor& t, int64_t itemsize, int64_t origin, auto&& f) {
    std::vector<int64_t> index(t.dim(), 0);
    for (int64_t k = 0; k < t.numel(); ++k) {
      int64_t offset = t.storage_offset() * itemsize - origin;
      for (int64_t d = 0; d < t.dim(); ++d) offset += index[d] * t.stride(d) * itemsize;
      if (!f(offset)) return false;
      for (int64_t d = t.dim() - 1; d >= 0; --d) {
        if (++index[d] < t.size(d)) break;
        index[d] = 0;
      }
    }
    return true;
  };
  each_element(outer, outer_itemsize, outer_begin, [&](int64_t offset) {
    std::fill(mine.begin() + offset, mine.begin() + offset + outer_itemsize, 1);
    return true;
  });
  return each_element(inner, inner_itemsize, outer_begin, [&](int64_t offset) {
    return std::all_of(mine.begin() + offset, mine.begin() + offset + inner_itemsize, [](uint8_t b) { return b != 0; });
  });
}

constexpr const char* kHookDicts[2] = {"_backward_hooks", "_post_accumulate_grad_hooks"};
constexpr const char* kHookMethods[2] = {"register_hook", "register_post_accumulate_grad_hook"};

// The tensor's hook dict: tensor._backward_hooks (k = 0) or
// tensor._post_accumulate_grad_hooks (k = 1), read from the Python object's fields
// (the same on torch 2.11-2.15). nullptr or None when it has none.
PyObject* hook_dict(PyObject* tensor, int k) {
  auto* v = reinterpret_cast<THPVariable*>(tensor);
  return k == 0 ? v->backward_hooks : v->post_accumulate_grad_hooks;
}

bool has_hooks(PyObject* dict) { return dict != nullptr && PyDict_Check(dict) && PyDict_Size(dict) > 0; }

// A copy of a hook dict (an OrderedDict) with hooks in it, or None. Its own methods
// copy, compare and refill it: the PyDict functions would bypass its order.
pybind11::object copy_hooks(PyObject* dict) {
  if (!has_hooks(dict)) return pybind11::none();
  return pybind11::reinterpret_borrow<pybind11::object>(dict).attr("copy")();
}

// Whether `now` holds the hooks of `before` (a copy, or None for none).
bool same_hooks(const pybind11::object& before, PyObject* now) {
  if (before.is_none()) return !has_hooks(now);
  if (now == nullptr) return false;
  const int same = PyObject_RichCompareBool(before.ptr(), now, Py_EQ);
  if (same < 0) throw pybind11::error_already_set();
  return same == 1;
}

// Gives the tensor's hook dict k the hooks in `before` (a copy, or None for none). The
// dict is refilled in place: the tensor's autograd hook reads it, and the handles of
// hooks registered before stay valid.
void put_back_hooks(const pybind11::handle& tensor, int k, const pybind11::object& before) {
  PyObject* now = hook_dict(tensor.ptr(), k);
  if (now == nullptr || !PyDict_Check(now)) {
    pybind11::setattr(tensor, kHookDicts[k], before);
    return;
  }
  pybind11::object dict = pybind11::reinterpret_borrow<pybind11::object>(now);
  dict.attr("clear")();
  if (!before.is_none()) dict.attr("update")(before);
}

// A tensor's autograd state, which attributes set and no op shows: requires_grad,
// .grad, its hook dicts and what .data is (`x.data = y`). Held before a branch runs,
// compared and put back after it.
class AutogradHold {
 public:
  explicit AutogradHold(pybind11::object tensor) : tensor_(std::move(tensor)) {
    const at::Tensor& t = THPVariable_Unpack(tensor_.ptr());
    requires_grad_ = t.requires_grad();
    grad_ = t.unsafeGetTensorImpl()->grad();
    for (int k = 0; k < 2; ++k) hooks_[k] = copy_hooks(hook_dict(tensor_.ptr(), k));
    if (!has_data(t)) return;
    data_held_ = true;
    storage_ = t.unsafeGetTensorImpl()->unsafe_storage();
    offset_ = t.storage_offset();
    sizes_.assign(t.sizes().begin(), t.sizes().end());
    strides_.assign(t.strides().begin(), t.strides().end());
    dtype_ = t.scalar_type();
  }

  const pybind11::object& tensor() const { return tensor_; }

  // What the branch changed, as the attribute or method that changes it, or nullptr.
  const char* changed() const {
    const at::Tensor& t = THPVariable_Unpack(tensor_.ptr());
    if (t.requires_grad() != requires_grad_) return "requires_grad_";
    if (!same_data(t)) return ".data =";
    if (!t.unsafeGetTensorImpl()->grad().is_same(grad_)) return ".grad =";
    for (int k = 0; k < 2; ++k) {
      if (!same_hooks(hooks_[k], hook_dict(tensor_.ptr(), k))) return kHookMethods[k];
    }
    return nullptr;
  }

  // Puts back what changed. Returns what changed last, as changed() names it, or nullptr.
  const char* put_back() const {
    const at::Tensor& t = THPVariable_Unpack(tensor_.ptr());
    const char* what = nullptr;
    for (int k = 1; k >= 0; --k) {
      if (same_hooks(hooks_[k], hook_dict(tensor_.ptr(), k))) continue;
      what = kHookMethods[k];
      put_back_hooks(tensor_, k, hooks_[k]);
    }
    if (!t.unsafeGetTensorImpl()->grad().is_same(grad_)) {
      what = ".grad =";
      t.mutable_grad() = grad_;
    }
    if (!same_data(t)) {
      what = ".data =";
      // No op of the branch, nor of a trace's mode: the tensor is put back as it was.
      c10::impl::ExcludeDispatchKeyGuard not_mine(
          c10::DispatchKeySet({kKey, c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      at::NoGradGuard no_grad;
      at::Tensor data = at::empty({0}, t.options().dtype(dtype_));
      data.set_(storage_, offset_, sizes_, strides_);
      t.set_data(data);
    }
    if (t.requires_grad() != requires_grad_) {
      what = "requires_grad_";
      t.set_requires_grad(requires_grad_);
    }
    return what;
  }

 private:
  // Whether .data is held for `t`: a strided tensor with storage (no functorch
  // wrapper) and concrete sizes.
  static bool has_data(const at::Tensor& t) {
    return t.layout() == at::kStrided && concrete(t) && t.unsafeGetTensorImpl()->has_storage();
  }

  bool same_data(const at::Tensor& t) const {
    return !data_held_ ||
           (has_data(t) && t.scalar_type() == dtype_ &&
            t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() == storage_.unsafeGetStorageImpl() &&
            t.storage_offset() == offset_ && t.sizes().equals(sizes_) && t.strides().equals(strides_));
  }

  pybind11::object tensor_;
  bool requires_grad_;
  at::Tensor grad_;
  pybind11::object hooks_[2];  // copies of the tensor's hook dicts with any hooks, or None
  bool data_held_ = false;
  c10::Storage storage_;
  int64_t offset_ = 0;
  c10::SmallVector<int64_t, 5> sizes_, strides_;
  at::ScalarType dtype_ = at::kFloat;
};

class Recorder {
 public:
  Recorder(std::vector<std::optional<at::Tensor>> bases, std::vector<bool> refuse_grad)
      : refuse_grad_(std::move(refuse_grad)) {
    rebase(std::move(bases));
  }

  // The operands of the next branch (each branch may read its own stand-ins of them).
  void rebase(std::vector<std::optional<at::Tensor>> bases) {
    TORCH_CHECK(bases.size() == refuse_grad_.size(), "WriteRecorder: one flag per operand");
    bases_ = std::move(bases);
    storages_.clear();
    for (const auto& b : bases_) storages_.push_back(b ? storage_of(*b) : nullptr);
  }

  // Holds the autograd state of args[i] where `real[i]`: the operands themselves, not
  // stand-ins a branch was given in their place.
  void hold(const pybind11::sequence& args, const std::vector<bool>& real) {
    held_.clear();
    for (size_t i = 0; i < real.size() && i < args.size(); ++i) {
      if (!real[i]) continue;
      pybind11::object t = args[i];
      if (THPVariable_Check(t.ptr())) held_.emplace_back(static_cast<int64_t>(i), AutogradHold(t));
    }
  }

  // Puts back the held state that the branch changed. Returns false, with the refusal
  // recorded, if it changed any.
  bool put_back() {
    std::optional<Refusal> changed;
    for (const auto& [operand, hold] : held_) {
      const char* what = hold.put_back();
      if (what != nullptr && !changed) {
        const at::Tensor& tensor = THPVariable_Unpack(hold.tensor().ptr());
        changed =
            Refusal{operand, what, concrete(tensor) ? tensor.sizes().vec() : std::vector<int64_t>{}, kAutogradState};
      }
    }
    held_.clear();
    if (!changed) return true;
    if (!refusal_) refusal_ = changed;
    return false;
  }

  // Forget the previous branch: what it made, saved and was refused.
  void reset() {
    made_.clear();
    outside_.clear();
    saved_.clear();
    refusal_.reset();
    copies_.clear();
    copies_written_.clear();
  }

  // A write to `written` by `op` is about to land. Returns why it is refused, if it is;
  // saves the operand's old value first if it is a write to select.
  // `view` says that the op changes the written tensor's metadata (inplace_view).
  std::optional<Refusal> before_write(const std::string& op, const at::Tensor& written, bool view) {
    if (!written.defined()) return std::nullopt;
    const at::Tensor& t = functorch_base(written);
    const StorageId s = storage_of(t);
    if (s == nullptr) return std::nullopt;  // a wrapper: seen again on what it wraps
    for (const auto& [copy, i] : copies_) {
      if (copy != s) continue;
      if (view) return refuse(i, op, t, kMetadata);
      copies_written_.insert(i);
      return std::nullopt;
    }
    if (made_.count(s) && !outside_.count(s)) return std::nullopt;
    int64_t first = -1, matches = 0;
    for (size_t i = 0; i < storages_.size(); ++i) {
      if (storages_[i] == s) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++matches;
      }
    }
    std::optional<int64_t> why;
    if (matches == 0) {
      why = kOutside;
    } else if (matches > 1) {
      why = kShared;
    } else if (view) {
      why = kMetadata;
    } else if (const at::Tensor& base = functorch_base(*bases_[first]);
               concrete(t) && concrete(base) && !within_elements(t, base)) {
      why = kOutsideElements;
    } else if (refuse_grad_[first]) {  // after the check above: write_guard.py may ask for a copy
      why = kNeedsGrad;
    }
    if (!why) {
      save(first);
      return std::nullopt;
    }
    return refuse(first, op, t, *why);
  }

  // An output of an op whose schema returns fresh tensors: made by the branch, unless
  // it shares memory with one of the op's inputs (a kernel may return an input).
  void made(StorageId s, const c10::SmallVector<StorageId, 8>& inputs) {
    if (s == nullptr) return;
    for (StorageId i : inputs) {
      if (i == s) return;
    }
    for (StorageId stored : storages_) {
      if (stored == s) return;
    }
    made_.insert(s);
  }

  // `t` is the branch's own copy of operand `i` (write_guard.py's run_owning): its
  // values are the branch's to write, but not its shape, strides or storage.
  void copy_of(int64_t i, const at::Tensor& t) {
    if (StorageId s = storage_of(functorch_base(t))) copies_.emplace_back(s, i);
  }

  void mark_outside(const at::Tensor& t) {
    if (StorageId s = storage_of(t)) outside_.insert(s);
  }

  // Every saved operand gets its old value back.
  void undo() {
    at::NoGradGuard no_grad;
    for (auto& [i, old] : saved_) functorch_base(*bases_[i]).copy_(old);
  }

  std::vector<std::pair<int64_t, at::Tensor>> saved() const { return saved_; }
  std::vector<int64_t> copies_written() const { return {copies_written_.begin(), copies_written_.end()}; }
  std::optional<Refusal> refusal() const { return refusal_; }
  bool wrote() const { return !saved_.empty() || refusal_.has_value(); }

  // Whether calls at fallback depth `d` are the branch's own: the depth observing began
  // at, and the depth inside one of those calls made on a grad transform's wrappers.
  bool owns(int64_t d) const {
    const int64_t k = d - depth;
    return k >= 0 && k < static_cast<int64_t>(open_.size()) && open_[k];
  }
  void open_below(int64_t d, bool open) {
    const int64_t k = d + 1 - depth;
    if (k <= 0) return;
    if (static_cast<int64_t>(open_.size()) <= k) open_.resize(k + 1, false);
    open_[k] = open;
  }
  void begin(int64_t d) {
    depth = d;
    open_.assign(1, true);
  }

  int64_t depth = 0;
  bool was_included = false, was_excluded = false;  // the key's state before observe()

 private:
  void save(int64_t i) {
    for (const auto& entry : saved_) {
      if (entry.first == i) return;
    }
    c10::impl::ExcludeDispatchKeyGuard not_mine(kKey);  // the copy is no op of the branch
    at::NoGradGuard no_grad;
    saved_.emplace_back(i, functorch_base(*bases_[i]).clone());
  }

  std::vector<std::optional<at::Tensor>> bases_;
  std::vector<bool> refuse_grad_;
  std::vector<StorageId> storages_;
  std::optional<Refusal> refuse(int64_t operand, const std::string& op, const at::Tensor& t, int64_t why) {
    Refusal r{operand, op, {}, why};
    if (concrete(t)) r.shape = t.sizes().vec();
    if (!refusal_) refusal_ = r;
    return r;
  }

  std::unordered_set<StorageId> made_, outside_;
  std::vector<std::pair<StorageId, int64_t>> copies_;
  std::set<int64_t> copies_written_;  // the operands whose copy the branch wrote
  std::vector<std::pair<int64_t, at::Tensor>> saved_;
  std::optional<Refusal> refusal_;
  std::vector<std::pair<int64_t, AutogradHold>> held_;
  std::vector<bool> open_ = {true};  // by depth - depth: the branch's own calls
};

// --- the dispatch-key source --------------------------------------------------------

thread_local std::vector<Recorder*> tl_observing;
thread_local int64_t tl_depth = 0;  // fallback calls in progress on this thread

struct Depth {
  Depth() { ++tl_depth; }
  ~Depth() { --tl_depth; }
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const int64_t depth = tl_depth;
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  bool mine = false;
  for (Recorder* r : tl_observing) mine = mine || r->owns(depth);
  bool wrapped = false;  // a tensor without storage: its call is seen again, one level down
  c10::SmallVector<StorageId, 8> inputs;
  bool fresh = false;
  if (mine) {
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = (*stack)[first + i];
      if (v.isStorage()) {
        inputs.push_back(v.toStorage().unsafeGetStorageImpl());
        continue;
      }
      for_each_tensor(v, [&](const at::Tensor& t) {
        const StorageId s = storage_of(t);
        wrapped = wrapped || (t.defined() && s == nullptr);
        inputs.push_back(s);
      });
    }
    std::string name;
    // set_data (x.data = y) gives the tensor another storage, as an inplace_view op may.
    const bool metadata = op.hasTag(at::Tag::inplace_view) || schema.name() == "aten::set_data";
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].alias_info() || !args[i].alias_info()->isWrite()) continue;
      if (name.empty()) name = op_name(schema);
      for_each_tensor((*stack)[first + i], [&](const at::Tensor& t) {
        for (Recorder* r : tl_observing) {
          if (!r->owns(depth)) continue;
          if (auto refusal = r->before_write(name, t, metadata)) {
            // write_guard.py raises the recorder's refusal; this error stops the write.
            TORCH_CHECK(false, "torchcond: ", refusal->op, " refused in a branch that runs untaken");
          }
        }
      });
    }
    fresh = !schema.returns().empty();
    for (const auto& r : schema.returns()) fresh = fresh && !r.alias_info();
    for (Recorder* r : tl_observing) {
      if (r->owns(depth)) r->open_below(depth, wrapped);
    }
  }
  {
    Depth nested;
    std::optional<c10::impl::ExcludeDispatchKeyGuard> hidden;
    if (!wrapped) hidden.emplace(kKey);  // what the op runs inside is its own business
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
  }
  // lift_fresh: a tensor just made from data (torch.tensor), which torch makes with this
  // key excluded; it and its output are the branch's own.
  const bool lifted = mine && (schema.name() == "aten::lift_fresh" || schema.name() == "aten::lift");
  if (!fresh && !lifted) return;
  if (lifted) inputs.clear();
  const size_t n_out = schema.returns().size();
  for (size_t j = stack->size() - n_out; j < stack->size(); ++j) {
    for_each_tensor((*stack)[j], [&](const at::Tensor& t) {
      const StorageId s = storage_of(t);
      for (Recorder* r : tl_observing) {
        if (r->owns(depth)) r->made(s, inputs);
      }
    });
  }
}

// Registered on first use, if the key is free: no other fallback and no kernel on it.
bool key_available() {
  static const bool available = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    if (dispatcher.hasBackendFallbackForDispatchKey(kKey) || !dispatcher.getRegistrationsForDispatchKey(kKey).empty()) {
      return false;
    }
    static auto* library = new torch::Library(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    return true;
  }();
  return available;
}

void observe(Recorder& r) {
  r.reset();
  r.was_included = c10::impl::tls_is_dispatch_key_included(kKey);
  r.was_excluded = c10::impl::tls_is_dispatch_key_excluded(kKey);
  r.begin(tl_depth);
  tl_observing.push_back(&r);
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  c10::impl::tls_set_dispatch_key_excluded(kKey, false);  // a branch run inside an observed op
}

void stop_observing(Recorder& r) {
  auto it = std::find(tl_observing.begin(), tl_observing.end(), &r);
  if (it == tl_observing.end()) return;
  tl_observing.erase(it);
  c10::impl::tls_set_dispatch_key_included(kKey, r.was_included);
  c10::impl::tls_set_dispatch_key_excluded(kKey, r.was_excluded);
}

// The error a changed autograd state of an operand is raised as; write_guard.py raises
// the recorder's refusal from it.
constexpr const char* kStateRefused = "torchcond: a change of an operand's autograd state refused";

pybind11::object as_tuple(const std::optional<Refusal>& r) {
  if (!r) return pybind11::none();
  return pybind11::make_tuple(r->operand, r->op, r->shape, r->why);
}

// A buffer registration hook (torch calls it before the buffer is set): records
// (module, name, the buffer before) in the list of the (list, missing) pair it is bound
// to, with `missing` for a buffer that was not there.
PyObject* note_assigned(PyObject* bound, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2) Py_RETURN_NONE;
  PyObject* buffers = PyObject_GetAttrString(args[0], "_buffers");
  if (buffers == nullptr) return nullptr;
  PyObject* old = PyDict_Check(buffers) ? PyDict_GetItemWithError(buffers, args[1]) : nullptr;
  PyObject* entry = nullptr;
  if (old != nullptr || !PyErr_Occurred()) {
    entry = PyTuple_Pack(3, args[0], args[1], old != nullptr ? old : PyTuple_GET_ITEM(bound, 1));
  }
  Py_DECREF(buffers);
  const int appended = entry != nullptr ? PyList_Append(PyTuple_GET_ITEM(bound, 0), entry) : -1;
  Py_XDECREF(entry);
  if (appended < 0) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef kNoteAssigned = {"note_assigned", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(note_assigned)),
                             METH_FASTCALL, "Records a buffer before a branch assigns it."};

// While a branch runs, note_assigned is torch's only buffer registration hook: non-strict
// export's hook would map a branch's buffer to a node of the program. Other hooks are
// put back after, with any the branch registered. `hooks` is torch's OrderedDict of
// them, changed only through its own methods.
class OnlyHook {
 public:
  OnlyHook(PyObject* hooks, PyObject* missing, PyObject* assigned)
      : hooks_(pybind11::reinterpret_borrow<pybind11::object>(hooks)), key_(pybind11::int_(-1)) {
    pybind11::tuple bound = pybind11::make_tuple(pybind11::handle(assigned), pybind11::handle(missing));
    pybind11::object hook = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&kNoteAssigned, bound.ptr()));
    if (!hook) throw pybind11::error_already_set();
    if (PyObject_Size(hooks) > 0) {
      saved_ = hooks_.attr("copy")();
      hooks_.attr("clear")();
    }
    if (PyObject_SetItem(hooks, key_.ptr(), hook.ptr()) < 0) {
      pybind11::error_already_set failed;
      put_back();  // torch's hooks are never left out
      throw failed;
    }
  }
  ~OnlyHook() {
    pybind11::error_scope branch_error;  // what the branch raised, if it did
    put_back();
  }

 private:
  // Removes note_assigned, and gives back torch's hooks first, then any the branch added.
  void put_back() {
    if (PyObject_DelItem(hooks_.ptr(), key_.ptr()) < 0) PyErr_Clear();
    if (!saved_) return;
    try {
      pybind11::object added = hooks_.attr("copy")();
      hooks_.attr("clear")();
      hooks_.attr("update")(saved_);
      hooks_.attr("update")(added);
    } catch (pybind11::error_already_set&) {
    }
  }

  pybind11::object hooks_, key_, saved_;
};

// torchcond._C.Handoff: a Handoff as Python sees it, a named tuple. A tuple, so that the
// cycle collector sees what it holds (an error's traceback may hold the Handoff).
PyStructSequence_Field kHandoffFields[] = {
    {"outputs", nullptr}, {"stop", nullptr},     {"out", nullptr},    {"error", nullptr},
    {"recorder", nullptr}, {"assigned", nullptr}, {"record", nullptr}, {nullptr, nullptr}};
PyStructSequence_Desc kHandoffDesc = {"torchcond._C.Handoff", "What run_untaken found (write_recorder.h).",
                                      kHandoffFields, 7};
PyTypeObject* handoff_type = nullptr;  // made once, when the module loads

// Reads a Guard's tuple (see run_untaken_py); false for anything else.
bool guard_of(PyObject* tuple, Guard& g) {
  if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != 5) return false;
  PyObject* const* items = &PyTuple_GET_ITEM(tuple, 0);
  auto given = [](PyObject* item) { return item == Py_None ? nullptr : item; };
  g = {given(items[0]), given(items[1]), given(items[2]), given(items[3]), given(items[4])};
  return g.records == nullptr || (g.hooks != nullptr && g.missing != nullptr);
}

// run_untaken(branches, args, guard, start) -> Handoff. `guard` is a tuple (recorder,
// real, records, hooks, missing) as Guard says, None for a part not wanted.
PyObject* run_untaken_py(PyObject* /*module*/, PyObject* const* a, Py_ssize_t n) {
  Guard guard;
  if (n != 4 || !PyTuple_Check(a[1]) || !guard_of(a[2], guard)) {
    PyErr_SetString(PyExc_TypeError, "run_untaken(branches, args: tuple, guard: tuple of 5, start: int)");
    return nullptr;
  }
  const Py_ssize_t start = PyLong_AsSsize_t(a[3]);
  if (start == -1 && PyErr_Occurred()) return nullptr;
  try {
    return as_python(run_untaken(a[0], a[1], guard, start));
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

PyMethodDef kRecorderMethods[] = {
    {"run_untaken", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(run_untaken_py)), METH_FASTCALL,
     "Branches run one after the other, each as if untaken, until one does not settle."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool recorder_available() { return key_available(); }

PyObject* hold_autograd_state(PyObject* tensor) {
  if (!THPVariable_Check(tensor)) {
    PyErr_Format(PyExc_TypeError, "AutogradHold holds a tensor, not %s", Py_TYPE(tensor)->tp_name);
    return nullptr;
  }
  try {
    return pybind11::cast(AutogradHold(pybind11::reinterpret_borrow<pybind11::object>(tensor))).release().ptr();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

int autograd_state_same(PyObject* hold) {
  try {
    return pybind11::cast<const AutogradHold&>(pybind11::handle(hold)).changed() == nullptr;
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return -1;
  }
}

PyObject* as_python(Handoff&& h) {
  PyObject* t = PyStructSequence_New(handoff_type);
  if (t == nullptr) return nullptr;
  PyObject* items[7] = {h.outputs.release().ptr(),  PyLong_FromSsize_t(h.stop), h.out.release().ptr(),
                        h.error.release().ptr(),    h.recorder.release().ptr(), h.assigned.release().ptr(),
                        h.record.release().ptr()};
  for (int i = 0; i < 7; ++i) PyStructSequence_SetItem(t, i, items[i]);
  if (items[1] == nullptr) Py_CLEAR(t);
  // Python 3.11 makes a named tuple made in C untracked by the cycle collector.
  if (t != nullptr && !PyObject_GC_IsTracked(t)) PyObject_GC_Track(t);
  return t;
}

pybind11::object new_recorder(PyObject* args) {
  std::vector<std::optional<at::Tensor>> bases;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    bases.emplace_back(THPVariable_Unpack(PyTuple_GET_ITEM(args, i)));
  }
  std::vector<bool> refuse(bases.size(), false);
  return pybind11::cast(new Recorder(std::move(bases), std::move(refuse)), pybind11::return_value_policy::take_ownership);
}

Handoff run_untaken(PyObject* branches, PyObject* args, const Guard& guard, Py_ssize_t start) {
  namespace py = pybind11;
  Recorder* recorder = guard.recorder != nullptr ? &py::cast<Recorder&>(guard.recorder) : nullptr;
  std::vector<bool> real;
  if (guard.real != nullptr) {
    real = py::cast<std::vector<bool>>(guard.real);
  } else {
    real.assign(PyTuple_GET_SIZE(args), true);
  }
  const Py_ssize_t n = PySequence_Size(branches);
  if (n < 0) throw py::error_already_set();
  Handoff h;
  for (Py_ssize_t k = start; k < n; ++k) {
    auto fn = py::reinterpret_steal<py::object>(PySequence_GetItem(branches, k));
    py::object record = py::none();
    if (guard.records != nullptr) record = py::reinterpret_steal<py::object>(PySequence_GetItem(guard.records, k));
    if (!fn || !record) throw py::error_already_set();
    py::list assigned;
    PyObject* out;
    bool kept = true;
    {
      std::optional<OnlyHook> hooked;
      if (!record.is_none()) hooked.emplace(guard.hooks, guard.missing, assigned.ptr());
      if (recorder != nullptr) {
        recorder->reset();
        recorder->hold(py::reinterpret_borrow<py::tuple>(args), real);
        observe(*recorder);
      }
      out = PyObject_Call(fn.ptr(), args, nullptr);
      if (recorder != nullptr) {
        stop_observing(*recorder);
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);  // put_back may run Python code
        kept = recorder->put_back();
        PyErr_Restore(type, value, traceback);
      }
    }
    if (out != nullptr && !kept) {  // the refusal is recorded; this is its error
      Py_CLEAR(out);
      PyErr_SetString(PyExc_RuntimeError, kStateRefused);
    }
    if (out == nullptr) h.error = py::error_already_set().value();  // KeyboardInterrupt too
    bool settled = out != nullptr && !(recorder != nullptr && recorder->wrote()) && py::len(assigned) == 0;
    if (settled && !record.is_none()) {
      py::object probes = record.attr("probes"), snapshot = record.attr("snapshot");
      const int same = snapshot_same(probes.ptr(), snapshot.ptr());
      if (same < 0) {
        Py_DECREF(out);
        throw py::error_already_set();
      }
      settled = same == 1;
    }
    if (settled) {
      h.outputs.append(py::reinterpret_steal<py::object>(out));
      continue;
    }
    h.stop = k;
    if (out != nullptr) h.out = py::reinterpret_steal<py::object>(out);
    if (recorder != nullptr && recorder->wrote()) h.recorder = py::reinterpret_borrow<py::object>(guard.recorder);
    h.assigned = assigned;
    h.record = record;
    return h;
  }
  return h;
}

void bind_write_recorder(pybind11::module& m) {
  namespace py = pybind11;
  auto named = [](const char* what) { return what == nullptr ? std::nullopt : std::optional<std::string>(what); };
  py::class_<AutogradHold>(m, "AutogradHold")
      .def(py::init([](py::object t) {
             TORCH_CHECK_TYPE(THPVariable_Check(t.ptr()), "AutogradHold holds a tensor, not ",
                              Py_TYPE(t.ptr())->tp_name);
             return AutogradHold(std::move(t));
           }),
           py::arg("tensor"))
      .def(
          "changed", [named](const AutogradHold& h) { return named(h.changed()); },
          "What changed since the hold, as the attribute or method that changes it, or None.")
      .def(
          "put_back", [named](const AutogradHold& h) { return named(h.put_back()); },
          "Put back what changed; returns what changed(), as it was before.");
  handoff_type = PyStructSequence_NewType(&kHandoffDesc);
  if (handoff_type == nullptr) throw py::error_already_set();
  m.add_object("Handoff", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(handoff_type)));
  py::class_<Recorder>(m, "WriteRecorder")
      .def(py::init<std::vector<std::optional<at::Tensor>>, std::vector<bool>>(), py::arg("bases"),
           py::arg("refuse_grad"))
      .def_static("available", &key_available, "Whether observe() can be used in this process.")
      .def_property_readonly_static(
          "key", [](const py::object&) { return static_cast<int>(kKey); },
          "The dispatch key the recorder observes ops on, as a number (Python binds no name for it).")
      .def("rebase", &Recorder::rebase, "The operands of the next branch.")
      .def("copy_of", &Recorder::copy_of, "Operand i's copy, whose shape the branch may not change.")
      .def_property_readonly("copies_written", &Recorder::copies_written, "The operands whose copy the branch wrote.")
      .def("mark_outside", &Recorder::mark_outside)
      .def("undo", &Recorder::undo)
      .def_property_readonly("wrote", &Recorder::wrote)
      .def_property_readonly("saved", &Recorder::saved)
      .def_property_readonly("refusal", [](const Recorder& r) { return as_tuple(r.refusal()); });
  py::dict why;
  why["outside"] = static_cast<int64_t>(kOutside);
  why["shared"] = static_cast<int64_t>(kShared);
  why["needs_grad"] = static_cast<int64_t>(kNeedsGrad);
  why["outside_elements"] = static_cast<int64_t>(kOutsideElements);
  why["metadata"] = static_cast<int64_t>(kMetadata);
  why["autograd_state"] = static_cast<int64_t>(kAutogradState);
  m.attr("WRITE_REFUSALS") = why;
  add_functions(m, kRecorderMethods);
}

}  // namespace torchcond
