// The torchcond operator library: schemas and their registration.
//
// The fused branch-select kernels register their implementations under this library
// (cpu/select_cpu.cpp: CPU; cuda/select.cu: CUDA). Their fake (meta) kernels,
// autograd and vmap rules are registered from Python, in torchcond/select_rules.py.
#include <Python.h>

#include <torch/library.h>

namespace torchcond {

// Bumped whenever a schema below changes; torchcond/_extension.py (ABI_VERSION) checks
// it at import, so a library left from another checkout is caught there.
constexpr int64_t kAbiVersion = 2;

int64_t abi_version() { return kAbiVersion; }

bool built_with_cuda() {
#ifdef TORCHCOND_WITH_CUDA
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY(torchcond, m) {
  // Python registrations (register_fake, register_autograd, register_vmap) for the
  // ops below live in this module; torch asks for it to be imported when needed.
  m.set_python_module("torchcond.select_rules");
  m.def("abi_version() -> int", &abi_version);
  m.def("built_with_cuda() -> bool", &built_with_cuda);
  // out[i] = pred ? true_values[i] : false_values[i], elementwise; pred is 0-d or its
  // shape is a prefix of every value's shape. Reads only the selected side.
  m.def("select(Tensor pred, Tensor[] true_values, Tensor[] false_values) -> Tensor[]");
  // out[i] = cases[k * n_out + i] with k = clamp(index, 0, num_branches - 1).
  m.def("select_n(Tensor index, Tensor[] cases, int num_branches) -> Tensor[]");
  // Tests only (cpu/select_cuda_emulation.cpp): the CUDA kernel and its launcher run
  // on the CPU. Returns the outputs, then the number of kernel launches (0-d int64).
  m.def("_select_cuda_emulated(Tensor selector, Tensor[] cases, int num_branches, bool is_bool) -> Tensor[]");
}

}  // namespace torchcond

// A Python module with no functions: importing it loads the library above.
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
