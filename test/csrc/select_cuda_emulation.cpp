// torchcond_testing::select_cuda_emulated: the CUDA select path (select_launch.h's
// packing and select_kernel.cuh's kernel) run on the CPU, for tests on machines without
// a GPU. A test extension, not part of torchcond: test/cuda_emulation.py compiles it
// with csrc/select_common.cpp (the argument checks and planning the kernels share) and
// loads it. The kernel runs one (block, thread) at a time on a small emulated GPU
// (sm_count multiprocessors, 1 block each), so the grid-stride loops take several turns.
#include "cuda_emulation.h"  // first: defines the CUDA keywords the kernel header uses

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "cuda/select_kernel.cuh"  // from csrc/, on the include path
#include "cuda/select_launch.h"
#include "select_common.h"

namespace torchcond {
namespace {

namespace tcs = cuda_select_emulation;

constexpr int kEmulatedBlocksPerSM = 1;
constexpr int64_t kPlanFields = 5;  // one row of the plans tensor, see below

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

// Returns the outputs, then a 0-d int64 tensor: the number of launches, then the plans:
// an int64 tensor with one row per descriptor, in launch order: mode, access,
// tile_size, sel_vector, grid (the blocks of its launch).
std::vector<at::Tensor> select_cuda_emulated(const at::Tensor& selector, at::TensorList cases, int64_t num_branches,
                                             bool is_bool, int64_t sm_count) {
  TORCH_CHECK(!is_bool || num_branches == 2, "select_cuda_emulated: is_bool needs num_branches == 2");
  TORCH_CHECK(sm_count >= 1, "select_cuda_emulated: sm_count must be at least 1");
  const size_t half = cases.size() / 2;
  SelectCall call = is_bool ? prepare_select_bool(selector, cases.slice(0, half), cases.slice(half))
                            : prepare_select_n(selector, cases, num_branches);
  std::vector<int64_t> plans;
  auto launch = [&plans](const tcs::LaunchParams& p, unsigned int grid) {
    for (int i = 0; i < p.n_out; ++i) {
      const tcs::OutputDesc& d = p.outs[i];
      plans.insert(plans.end(), {d.mode, d.access, d.tile_size, d.sel_vector, static_cast<int64_t>(grid)});
    }
    run_emulated_launch(p, grid);
  };
  const int64_t launches = tcs::launch_select(call, static_cast<int>(sm_count), kEmulatedBlocksPerSM, launch);
  std::vector<at::Tensor> result = std::move(call.outputs);
  result.push_back(at::scalar_tensor(launches, at::kLong));
  const int64_t rows = static_cast<int64_t>(plans.size()) / kPlanFields;
  result.push_back(at::tensor(plans, at::kLong).reshape({rows, kPlanFields}));
  return result;
}

}  // namespace

TORCH_LIBRARY(torchcond_testing, m) {
  // Returns the outputs, the number of kernel launches (0-d int64), then the plan of
  // every descriptor (int64, one row each: mode, access, tile_size, sel_vector, grid).
  m.def(
      "select_cuda_emulated(Tensor selector, Tensor[] cases, int num_branches, bool is_bool, int sm_count=2) "
      "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(torchcond_testing, CPU, m) { m.impl("select_cuda_emulated", &select_cuda_emulated); }

}  // namespace torchcond
