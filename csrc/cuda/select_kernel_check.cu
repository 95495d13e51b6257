// Compile check for select_kernel.cuh without a CUDA build of torch (CI has none):
// `make cuda-check` compiles this file with nvcc for a few architectures. It includes
// only the CUDA runtime and the kernel header, instantiates the kernel and a launch of
// it, and is never linked into torchcond._C (setup.py skips *_check.cu).
#include "select_kernel.cuh"

namespace tcs = torchcond::cuda_select;

// A launch with an empty descriptor set: forces host-side stub generation and the
// device code for every path of the kernel.
cudaError_t torchcond_select_kernel_check_launch(cudaStream_t stream, int sm_count) {
  tcs::LaunchParams p{};
  p.n_out = 0;
  p.total_tiles = 0;
  const unsigned int grid = tcs::grid_size(1, sm_count, tcs::kMinBlocksPerSM);
  tcs::select_kernel<<<grid, tcs::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

static_assert(tcs::pool_words(2, 2) == 10, "2 branches at rank 2 take 10 pool words");
static_assert(tcs::kMaxOutputs * tcs::pool_words(2, 2) <= tcs::kPoolWords,
              "a full launch of rank-2 selects fits the pool");
static_assert(tcs::pool_words(64, 1) <= tcs::kPoolWords, "one branch at the maximum rank fits");
