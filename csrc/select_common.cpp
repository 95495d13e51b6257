#include "select_common.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace torchcond {
namespace {

template <typename Sizes>
std::string shape_str(Sizes s) {
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

std::string layout_str(c10::Layout layout) {
  // torch.sparse_coo style, as Python users write it.
  switch (layout) {
    case at::kStrided: return "torch.strided";
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    case at::kMkldnn: return "torch._mkldnn";
    case at::kJagged: return "torch.jagged";
    default: {
      std::ostringstream os;
      os << layout;
      return os.str();
    }
  }
}

std::string describe(const at::Tensor& t) {
  return "shape " + shape_str(t.sym_sizes()) + ", " + dtype_str(t.scalar_type()) + " on " + t.device().str();
}

select_plan::SelKind selector_kind(c10::ScalarType t, bool is_bool_select, const char* op, const char* name) {
  using namespace select_plan;
  if (is_bool_select) {
    TORCH_CHECK_TYPE(t == at::kBool, op, ": ", name, ": expected dtype torch.bool, found ", dtype_str(t));
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
      TORCH_CHECK_TYPE(false, op, ": ", name, ": expected an integer dtype, found ", dtype_str(t),
                       " (int8/16/32/64 and uint8/16/32/64 are accepted)");
  }
  return kSelBool;
}

void check_strided(const at::Tensor& t, const char* op, const std::string& label) {
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, op, ": ", label,
                   ": expected a dense (torch.strided) tensor, found layout ", layout_str(t.layout()),
                   "; convert it with .to_dense() first");
}

// Checks select/select_n's arguments (see select_common.h) and returns the selector's
// kind. `branches[k][i]` is branch k's value for output i; `is_bool_select`: select
// (bool pred; branch 0 is true_values, branch 1 false_values) rather than select_n
// (integer index).
select_plan::SelKind check_branches(const at::Tensor& selector, const std::vector<at::TensorList>& branches,
                                    bool is_bool_select) {
  const char* op = is_bool_select ? "torchcond::select" : "torchcond::select_n";
  const char* sel_name = is_bool_select ? "pred" : "index";
  const int64_t num_branches = static_cast<int64_t>(branches.size());
  const int64_t n_out = static_cast<int64_t>(branches[0].size());
  auto label = [&](int64_t k, int64_t i) {
    if (is_bool_select) return std::string(k == 0 ? "true_values[" : "false_values[") + std::to_string(i) + "]";
    return "cases[" + std::to_string(k) + "][" + std::to_string(i) + "]";
  };
  const char* first = is_bool_select ? "true_values" : "cases[0]";

  const select_plan::SelKind kind = selector_kind(selector.scalar_type(), is_bool_select, op, sel_name);
  check_strided(selector, op, sel_name);
  const int64_t sel_dim = selector.dim();
  const c10::SymIntArrayRef sel_sizes = selector.sym_sizes();
  const c10::Device sel_device = selector.device();
  const c10::Device device = n_out > 0 ? branches[0][0].device() : sel_device;

  for (int64_t i = 0; i < n_out; ++i) {
    const at::Tensor& ref = branches[0][i];
    const c10::SymIntArrayRef sizes = ref.sym_sizes();
    const c10::Device ref_device = ref.device();
    check_strided(ref, op, label(0, i));
    for (int64_t k = 1; k < num_branches; ++k) {
      const at::Tensor& v = branches[k][i];
      check_strided(v, op, label(k, i));
      TORCH_CHECK_VALUE(v.sym_sizes() == sizes && v.scalar_type() == ref.scalar_type() && v.device() == ref_device, op,
                        ": ", label(k, i), ": expected ", describe(ref), " (as ", label(0, i), "), found ",
                        describe(v));
    }
    TORCH_CHECK_VALUE(ref_device == device, op, ": ", label(0, i), ": expected a tensor on ", device,
                      " (the device of ", label(0, 0), "; every value must be on one device), found one on ",
                      ref_device);
    bool prefix = sel_dim <= static_cast<int64_t>(sizes.size());
    for (int64_t d = 0; prefix && d < sel_dim; ++d) prefix = sel_sizes[d] == sizes[d];
    TORCH_CHECK_VALUE(prefix, op, ": ", sel_name, ": expected a 0-d tensor or one whose shape is a prefix of every ",
                      "value's shape; its shape ", shape_str(sel_sizes), " is not a prefix of ", first, "[", i,
                      "]'s shape ", shape_str(sizes));
    // A 0-d CPU selector goes with values on any device: it is read on the host,
    // which costs no device sync.
    TORCH_CHECK_VALUE(ref_device == sel_device || (sel_dim == 0 && sel_device.is_cpu()), op, ": ", sel_name,
                      ": expected a tensor on ", ref_device, " (the device of ", label(0, i),
                      ") or a 0-d CPU tensor, found shape ", shape_str(sel_sizes), " on ", sel_device);
  }
  return kind;
}

std::vector<at::TensorList> split_cases(at::TensorList cases, int64_t num_branches) {
  const int64_t n_out = static_cast<int64_t>(cases.size()) / num_branches;
  std::vector<at::TensorList> branches;
  branches.reserve(num_branches);
  for (int64_t k = 0; k < num_branches; ++k) branches.push_back(cases.slice(k * n_out, n_out));
  return branches;
}

void check_num_branches(at::TensorList cases, int64_t num_branches) {
  const char* op = "torchcond::select_n";
  TORCH_CHECK_VALUE(num_branches >= 1, op, ": num_branches: expected at least 1, found ", num_branches);
  TORCH_CHECK_VALUE(static_cast<int64_t>(cases.size()) % num_branches == 0, op,
                    ": cases: expected a multiple of num_branches (", num_branches,
                    ") tensors, branch-major (cases[k * n_out + i] is branch k's output i); found ", cases.size(),
                    " tensors");
}

void check_pairs(at::TensorList true_values, at::TensorList false_values) {
  TORCH_CHECK_VALUE(true_values.size() == false_values.size(), "torchcond::select: true_values has ",
                    true_values.size(), " tensors, false_values has ", false_values.size(),
                    "; they must pair up (one true and one false value per output)");
}

// Allocates the outputs and plans each non-empty one; the arguments are checked.
SelectCall plan_select(const at::Tensor& selector, std::vector<at::TensorList> branches,
                       select_plan::SelKind sel_kind) {
  const int64_t num_branches = static_cast<int64_t>(branches.size());
  const int64_t n_out = static_cast<int64_t>(branches[0].size());
  SelectCall call;
  call.selector = selector;
  call.num_branches = num_branches;
  call.sel_kind = sel_kind;
  const int64_t sel_dim = selector.dim();
  const c10::IntArrayRef sel_strides = selector.strides();
  call.outputs.reserve(n_out);
  call.work.reserve(n_out);
  call.arena.reserve(static_cast<size_t>(n_out * (2 + num_branches) * 4));

  for (int64_t i = 0; i < n_out; ++i) {
    const at::Tensor& ref = branches[0][i];
    const c10::IntArrayRef sizes = ref.sizes();
    const int64_t rank = static_cast<int64_t>(sizes.size());
    at::Tensor out = at::empty(sizes, ref.options().memory_format(at::MemoryFormat::Contiguous));
    const int64_t numel = out.numel();
    call.outputs.push_back(out);
    if (numel == 0) continue;

    SelectOutput w;
    w.index = i;
    w.out = std::move(out);
    w.itemsize = static_cast<int64_t>(ref.element_size());
    w.layout = call.arena.size();
    w.array_len = rank > 0 ? static_cast<int>(rank) : 1;
    w.ndim = select_plan::coalesce_into(call.arena, static_cast<int>(rank), sizes.data(), static_cast<int>(sel_dim),
                                        sel_strides.data(), num_branches,
                                        [&](int64_t k) { return branches[k][i].strides().data(); });
    call.work.push_back(std::move(w));
  }
  call.branches = std::move(branches);
  return call;
}

}  // namespace

void check_select(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values) {
  check_pairs(true_values, false_values);
  check_branches(pred, {true_values, false_values}, /*is_bool_select=*/true);
}

void check_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches) {
  check_num_branches(cases, num_branches);
  check_branches(index, split_cases(cases, num_branches), /*is_bool_select=*/false);
}

SelectCall prepare_select_bool(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values) {
  check_pairs(true_values, false_values);
  std::vector<at::TensorList> branches{true_values, false_values};
  const select_plan::SelKind kind = check_branches(pred, branches, /*is_bool_select=*/true);
  return plan_select(pred, std::move(branches), kind);
}

SelectCall prepare_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches) {
  check_num_branches(cases, num_branches);
  std::vector<at::TensorList> branches = split_cases(cases, num_branches);
  const select_plan::SelKind kind = check_branches(index, branches, /*is_bool_select=*/false);
  return plan_select(index, std::move(branches), kind);
}

}  // namespace torchcond
