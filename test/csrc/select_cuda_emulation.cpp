// torchcond_testing::select_cuda_emulated: the CUDA select path (select_launch.h's
// packing and select_kernel.cuh's kernel) run on the CPU, for tests on machines without
// a GPU. A test extension, not part of torchcond: test/cuda_emulation.py compiles it
// with csrc/select_common.cpp (the argument checks and planning the kernels share) and
// loads it. The kernel runs one (block, thread) at a time with a small emulated GPU
// (2 multiprocessors, 1 block each), so the grid-stride loops take several turns.
#include "cuda_emulation.h"  // first: defines the CUDA keywords the kernel header uses

#include <ATen/ATen.h>
#include <torch/library.h>

#include "cuda/select_kernel.cuh"  // from csrc/, on the include path
#include "cuda/select_launch.h"
#include "select_common.h"

namespace torchcond {
namespace {

namespace tcs = cuda_select_emulation;

constexpr int kEmulatedSMs = 2;
constexpr int kEmulatedBlocksPerSM = 1;

void run_emulated_launch(const tcs::LaunchParams& p, unsigned int grid) {
  using namespace cuda_emulation;
  gridDim = Dim3{grid, 1, 1};
  blockDim = Dim3{static_cast<unsigned int>(tcs::kThreads), 1, 1};
  for (unsigned int b = 0; b < grid; ++b) {
    for (unsigned int t = 0; t < static_cast<unsigned int>(tcs::kThreads); ++t) {
      blockIdx = Dim3{b, 0, 0};
      threadIdx = Dim3{t, 0, 0};
      tcs::select_kernel(p);
    }
  }
}

// Returns the outputs followed by a 0-d int64 tensor: the number of launches.
std::vector<at::Tensor> select_cuda_emulated(
    const at::Tensor& selector, at::TensorList cases, int64_t num_branches, bool is_bool) {
  TORCH_CHECK(!is_bool || num_branches == 2, "select_cuda_emulated: is_bool needs num_branches == 2");
  SelectCall call = is_bool ? prepare_select_bool(selector, cases.slice(0, cases.size() / 2), cases.slice(cases.size() / 2))
                            : prepare_select_n(selector, cases, num_branches);
  const int64_t launches = tcs::launch_select(call, kEmulatedSMs, kEmulatedBlocksPerSM, &run_emulated_launch);
  std::vector<at::Tensor> result = std::move(call.outputs);
  result.push_back(at::scalar_tensor(launches, at::kLong));
  return result;
}

}  // namespace

TORCH_LIBRARY(torchcond_testing, m) {
  // Returns the outputs, then the number of kernel launches (0-d int64).
  m.def("select_cuda_emulated(Tensor selector, Tensor[] cases, int num_branches, bool is_bool) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(torchcond_testing, CPU, m) {
  m.impl("select_cuda_emulated", &select_cuda_emulated);
}

}  // namespace torchcond
