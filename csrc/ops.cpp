// The torchcond operator library: schemas and their registration, and the Python
// module torchcond._C.
//
// The fused branch-select kernels register their implementations under this library
// (cpu/select_cpu.cpp: CPU; cuda/select.cu: CUDA). Their fake (meta) kernels,
// autograd and vmap rules are registered from Python, in torchcond/_src/select_ops.py; the
// fake kernels check their arguments with the kernels' own checks (select_common.h),
// which this module exposes to Python as _check_select and _check_select_n.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "select_common.h"
#include "write_recorder.h"

namespace torchcond {

// Bumped whenever a schema below or a function of torchcond._C changes.
// torchcond/_extension.py compares it with its ABI_VERSION when torchcond is imported,
// so a library left from another checkout fails the import with what to rebuild.
constexpr int64_t kAbiVersion = 6;

int64_t abi_version() { return kAbiVersion; }

bool built_with_cuda() {
#ifdef TORCHCOND_WITH_CUDA
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY(torchcond, m) {
  // Python registrations (fake, Autograd and vmap kernels) for the
  // ops below live in this module; torch asks for it to be imported when needed.
  m.set_python_module("torchcond._src.select_ops");
  m.def("abi_version() -> int", &abi_version);
  m.def("built_with_cuda() -> bool", &built_with_cuda);
  // out[i] = pred ? true_values[i] : false_values[i], elementwise; pred is 0-d or its
  // shape is a prefix of every value's shape. Reads only the selected side.
  m.def("select(Tensor pred, Tensor[] true_values, Tensor[] false_values) -> Tensor[]");
  // out[i] = cases[k * n_out + i] with k = clamp(index, 0, num_branches - 1). Errors
  // name a value cases[k][i], as torchcond.select_n's nested argument does.
  m.def("select_n(Tensor index, Tensor[] cases, int num_branches) -> Tensor[]");
}

// Whether the operators' Autograd kernel must differentiate: grad mode is on and a
// value requires grad, or a value has a forward-mode tangent. The tangent is read as
// torch's own autograd kernels read it (level 0, the only one torch allows at a time);
// Python has no such query that costs no view, and forward_ad's level counter misses
// levels a compiled or exported graph enters.
bool needs_derivative(const std::vector<at::Tensor>& values) {
  const bool grad = at::GradMode::is_enabled();
  for (const at::Tensor& v : values) {
    if ((grad && v.requires_grad()) || v._fw_grad(/*level=*/0).defined()) return true;
  }
  return false;
}

}  // namespace torchcond

// The argument checks of torch.ops.torchcond.select/select_n, for their fake kernels:
// the same arguments, the same errors (ValueError, TypeError), no outputs. The tensors
// may be fake (their devices and symbolic shapes are read as the kernels would see
// them) or meta.
PYBIND11_MODULE(_C, m) {
  m.def(
      "_check_select",
      [](const at::Tensor& pred, const std::vector<at::Tensor>& true_values,
         const std::vector<at::Tensor>& false_values) { torchcond::check_select(pred, true_values, false_values); },
      pybind11::arg("pred"), pybind11::arg("true_values"), pybind11::arg("false_values"));
  m.def(
      "_check_select_n",
      [](const at::Tensor& index, const std::vector<at::Tensor>& cases, int64_t num_branches) {
        torchcond::check_select_n(index, cases, num_branches);
      },
      pybind11::arg("index"), pybind11::arg("cases"), pybind11::arg("num_branches"));
  m.def("_needs_derivative", &torchcond::needs_derivative, pybind11::arg("values"));
  // The operators called below the Autograd key, for an eager call whose values need no
  // gradient: what `with torch._C._AutoDispatchBelowAutograd(): op(...)` does, without
  // the Python around it (torchcond/_src/select_ops.py).
  m.def("select_below_autograd", [](const at::Tensor& pred, const std::vector<at::Tensor>& true_values,
                                    const std::vector<at::Tensor>& false_values) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("torchcond::select", "")
                               .typed<std::vector<at::Tensor>(const at::Tensor&, at::TensorList, at::TensorList)>();
    at::AutoDispatchBelowAutograd below;
    return op.call(pred, true_values, false_values);
  });
  m.def("select_n_below_autograd",
        [](const at::Tensor& index, const std::vector<at::Tensor>& cases, int64_t num_branches) {
          static const auto op = c10::Dispatcher::singleton()
                                     .findSchemaOrThrow("torchcond::select_n", "")
                                     .typed<std::vector<at::Tensor>(const at::Tensor&, at::TensorList, int64_t)>();
          at::AutoDispatchBelowAutograd below;
          return op.call(index, cases, num_branches);
        });
  torchcond::bind_write_recorder(m);
  torchcond::bind_eager(m);
  torchcond::bind_batching(m);
  torchcond::bind_watch(m);
}
