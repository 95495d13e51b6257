// Python bindings of torchcond._C beyond the operators' argument checks (ops.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchcond {

// torchcond._C.WriteRecorder (write_recorder.cpp).
void bind_write_recorder(pybind11::module& m);
// torchcond._C.batch_first and batched (batching.cpp).
void bind_batching(pybind11::module& m);
// torchcond._C.taken_branch, taken_case, plain_tensors and eager_init (eager.cpp).
void bind_eager(pybind11::module& m);
// torchcond._C.watch_snapshot and watch_same (watch.cpp).
void bind_watch(pybind11::module& m);

}  // namespace torchcond
