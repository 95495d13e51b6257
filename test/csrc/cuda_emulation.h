// Just enough of CUDA to compile cuda/select_kernel.cuh as plain C++ and run its
// kernel on the CPU (see select_cuda_emulation.cpp beside it). A kernel launch becomes a loop
// over (block, thread) that calls the kernel function once per thread. That is exact
// for kernels without shared memory or barriers, which is the case for the select
// kernel, and the whole point: the kernel's indexing, tiling and packing get tested
// on machines without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>

#define TORCHCOND_CUDA_EMULATION 1
#define TORCHCOND_CUDA_SELECT_NS cuda_select_emulation

#define __global__ inline
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace torchcond {
namespace cuda_emulation {

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};

// The running (emulated) thread's coordinates; one emulated launch at a time per
// OS thread.
inline thread_local Dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) Vec4 {
  uint32_t x, y, z, w;
};
struct alignas(8) Vec2 {
  uint32_t x, y;
};

}  // namespace cuda_emulation
}  // namespace torchcond

using torchcond::cuda_emulation::blockDim;
using torchcond::cuda_emulation::blockIdx;
using torchcond::cuda_emulation::gridDim;
using torchcond::cuda_emulation::threadIdx;
using uint4 = torchcond::cuda_emulation::Vec4;
using uint2 = torchcond::cuda_emulation::Vec2;
using std::min;
