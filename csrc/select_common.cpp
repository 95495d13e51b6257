#include "select_common.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace torchcond {
namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ",";
  os << ")";
  return os.str();
}

std::string dtype_str(c10::ScalarType t) {
  // torch.float32 style, as Python users write it.
  std::string name = c10::toString(t);
  std::string py;
  switch (t) {
    case at::kBool: py = "bool"; break;
    case at::kByte: py = "uint8"; break;
    case at::kChar: py = "int8"; break;
    case at::kShort: py = "int16"; break;
    case at::kInt: py = "int32"; break;
    case at::kLong: py = "int64"; break;
    case at::kHalf: py = "float16"; break;
    case at::kBFloat16: py = "bfloat16"; break;
    case at::kFloat: py = "float32"; break;
    case at::kDouble: py = "float64"; break;
    case at::kComplexFloat: py = "complex64"; break;
    case at::kComplexDouble: py = "complex128"; break;
    case at::kUInt16: py = "uint16"; break;
    case at::kUInt32: py = "uint32"; break;
    case at::kUInt64: py = "uint64"; break;
    default: return name;
  }
  return "torch." + py;
}

std::string describe(const at::Tensor& t) {
  return "shape " + shape_str(t.sizes()) + ", " + dtype_str(t.scalar_type()) + " on " +
      t.device().str();
}

int32_t selector_kind(c10::ScalarType t, bool is_bool_select, const char* op, const char* name) {
  using namespace select_plan;
  if (is_bool_select) {
    TORCH_CHECK_TYPE(
        t == at::kBool, op, ": ", name, ": expected dtype torch.bool, found ", dtype_str(t));
    return kSelBool;
  }
  switch (t) {
    case at::kByte: return kSelU8;
    case at::kChar: return kSelI8;
    case at::kShort: return kSelI16;
    case at::kUInt16: return kSelU16;
    case at::kInt: return kSelI32;
    case at::kUInt32: return kSelU32;
    case at::kLong: return kSelI64;
    case at::kUInt64: return kSelU64;
    default:
      TORCH_CHECK_TYPE(
          false, op, ": ", name, ": expected an integer dtype (int8/16/32/64, uint8/16/32/64), found ",
          dtype_str(t));
  }
  return 0;
}

}  // namespace

SelectCall prepare_select(
    const at::Tensor& selector,
    std::vector<at::TensorList> branches,
    bool is_bool_select) {
  const char* op = is_bool_select ? "torchcond::select" : "torchcond::select_n";
  const char* sel_name = is_bool_select ? "pred" : "index";
  const int64_t num_branches = static_cast<int64_t>(branches.size());
  const int64_t n_out = static_cast<int64_t>(branches[0].size());

  auto label = [&](int64_t k, int64_t i) {
    if (is_bool_select) return std::string(k == 0 ? "true_values[" : "false_values[") + std::to_string(i) + "]";
    return "cases[" + std::to_string(k * n_out + i) + "] (branch " + std::to_string(k) + ", output " +
        std::to_string(i) + ")";
  };

  SelectCall call;
  call.selector = selector;
  call.num_branches = num_branches;
  call.sel_kind = selector_kind(selector.scalar_type(), is_bool_select, op, sel_name);
  TORCH_CHECK_VALUE(
      selector.layout() == at::kStrided, op, ": ", sel_name, ": expected a strided (dense) tensor, found layout ",
      selector.layout());
  const int64_t sel_dim = selector.dim();
  const c10::IntArrayRef sel_sizes = selector.sizes();
  const c10::IntArrayRef sel_strides = selector.strides();
  call.outputs.reserve(n_out);
  call.work.reserve(n_out);
  call.arena.reserve(static_cast<size_t>(n_out * (2 + num_branches) * 4));

  for (int64_t i = 0; i < n_out; ++i) {
    const at::Tensor& ref = branches[0][i];
    const c10::IntArrayRef sizes = ref.sizes();
    const int64_t rank = static_cast<int64_t>(sizes.size());
    for (int64_t k = 0; k < num_branches; ++k) {
      const at::Tensor& v = branches[k][i];
      TORCH_CHECK_VALUE(
          v.layout() == at::kStrided, op, ": ", label(k, i), ": expected a strided (dense) tensor, found layout ",
          v.layout());
      if (k > 0) {
        TORCH_CHECK_VALUE(
            v.sizes() == sizes && v.scalar_type() == ref.scalar_type() && v.device() == ref.device(), op, ": ",
            label(k, i), ": expected ", describe(ref), " (as ", label(0, i), "), found ", describe(v));
      }
    }
    TORCH_CHECK_VALUE(
        ref.device() == branches[0][0].device(), op, ": ", label(0, i), ": expected a tensor on ",
        branches[0][0].device(), " (the device of ", label(0, 0), "; every value must be on one device), found one on ",
        ref.device());
    // A 0-d CPU selector goes with values on any device: it is read on the host,
    // which costs no device sync.
    TORCH_CHECK_VALUE(
        ref.device() == selector.device() || (sel_dim == 0 && selector.device().is_cpu()), op, ": ", sel_name,
        ": expected a tensor on ", ref.device(), " (the device of ", label(0, i),
        ") or a 0-d CPU tensor, found one of shape ", shape_str(sel_sizes), " on ", selector.device());
    bool prefix = sel_dim <= rank;
    for (int64_t d = 0; prefix && d < sel_dim; ++d) prefix = sel_sizes[d] == sizes[d];
    TORCH_CHECK_VALUE(
        prefix, op, ": ", sel_name, ": expected a 0-d tensor or one whose shape is a prefix of every value's shape; its shape ",
        shape_str(sel_sizes), " is not a prefix of the shape ", shape_str(sizes), " of ", label(0, i));

    at::Tensor out = at::empty(sizes, ref.options().memory_format(at::MemoryFormat::Contiguous));
    const int64_t numel = out.numel();
    call.outputs.push_back(out);
    if (numel == 0) continue;

    SelectOutput w;
    w.index = i;
    w.out = std::move(out);
    w.itemsize = static_cast<int64_t>(ref.element_size());
    w.layout = call.arena.size();
    w.R = rank > 0 ? static_cast<int>(rank) : 1;
    w.ndim = select_plan::coalesce_into(
        call.arena, static_cast<int>(rank), sizes.data(), static_cast<int>(sel_dim), sel_strides.data(),
        num_branches, [&](int64_t k) { return branches[k][i].strides().data(); });
    call.work.push_back(std::move(w));
  }
  call.branches = std::move(branches);
  return call;
}

SelectCall prepare_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches) {
  const char* op = "torchcond::select_n";
  TORCH_CHECK_VALUE(num_branches >= 1, op, ": num_branches: expected at least 1, found ", num_branches);
  TORCH_CHECK_VALUE(
      static_cast<int64_t>(cases.size()) % num_branches == 0, op, ": cases: expected a multiple of num_branches (",
      num_branches, ") tensors, branch-major (cases[k * n_out + i] is branch k's output i); found ", cases.size(),
      " tensors");
  const int64_t n_out = static_cast<int64_t>(cases.size()) / num_branches;
  std::vector<at::TensorList> branches;
  branches.reserve(num_branches);
  for (int64_t k = 0; k < num_branches; ++k) branches.push_back(cases.slice(k * n_out, n_out));
  return prepare_select(index, std::move(branches), /*is_bool_select=*/false);
}

SelectCall prepare_select_bool(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values) {
  TORCH_CHECK_VALUE(
      true_values.size() == false_values.size(), "torchcond::select: true_values has ", true_values.size(),
      " tensors, false_values has ", false_values.size(), "; they must pair up");
  return prepare_select(pred, {true_values, false_values}, /*is_bool_select=*/true);
}

}  // namespace torchcond
