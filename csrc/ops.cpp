// The torchcond operator library: schemas and their registration.
//
// The fused branch-select kernels (cpu/, cuda/) register under this library; until
// they land it carries the build facts the Python side checks at import.
#include <Python.h>

#include <torch/library.h>

namespace torchcond {

// Bumped whenever a schema below changes, so a stale build is caught at import.
constexpr int64_t kAbiVersion = 1;

int64_t abi_version() { return kAbiVersion; }

bool built_with_cuda() {
#ifdef TORCHCOND_WITH_CUDA
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY(torchcond, m) {
  m.def("abi_version() -> int", &abi_version);
  m.def("built_with_cuda() -> bool", &built_with_cuda);
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
