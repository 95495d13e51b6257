// CUDA implementations of torchcond::select and torchcond::select_n: argument checks
// and layout planning (select_common), descriptor packing, and the launch of
// select_kernel.cuh's kernel on the current stream. See select_kernel.cuh for why the
// descriptors travel as kernel parameters.
//
// Never syncs the host: no .item(), no device-to-host copy, no allocation besides the
// outputs (the caching allocator, stream-ordered). A CPU 0-d selector is read on the
// host, which is plain host memory. Capture-safe: every launch's parameters are
// copied into the graph node when captured.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "../select_common.h"
#include "select_kernel.cuh"
#include "select_launch.h"

namespace torchcond {
namespace {

namespace tcs = cuda_select;

struct DeviceFacts {
  int sm_count = 0;
  int blocks_per_sm = 0;  // resident blocks of select_kernel per multiprocessor
};

// Queried once per device (host-side attribute queries: no sync).
DeviceFacts device_facts(int device) {
  static std::mutex mutex;
  static std::vector<DeviceFacts> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1);
  DeviceFacts& f = cache[device];
  if (f.sm_count == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device));
    int n = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, tcs::select_kernel, tcs::kThreads, 0));
    f.blocks_per_sm = n > 0 ? n : tcs::kMinBlocksPerSM;
  }
  return f;
}

std::vector<at::Tensor> run_cuda(SelectCall call) {
  if (call.work.empty()) return std::move(call.outputs);
  const c10::Device device = call.work.front().out.device();
  TORCH_CHECK_VALUE(device.is_cuda(), "torchcond::select (CUDA): expected CUDA values, found values on ", device);
  c10::cuda::CUDAGuard guard(device);
  const DeviceFacts facts = device_facts(device.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  tcs::launch_select(call, facts.sm_count, facts.blocks_per_sm,
                     [stream](const tcs::LaunchParams& p, unsigned int grid) {
                       tcs::select_kernel<<<grid, tcs::kThreads, 0, stream>>>(p);
                       C10_CUDA_KERNEL_LAUNCH_CHECK();
                     });
  return std::move(call.outputs);
}

std::vector<at::Tensor> select_cuda(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values) {
  return run_cuda(prepare_select_bool(pred, true_values, false_values));
}

std::vector<at::Tensor> select_n_cuda(const at::Tensor& index, at::TensorList cases, int64_t num_branches) {
  return run_cuda(prepare_select_n(index, cases, num_branches));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchcond, CUDA, m) {
  m.impl("select", &select_cuda);
  m.impl("select_n", &select_n_cuda);
}

}  // namespace torchcond
