// Descriptor packing for select_kernel.cuh: turns a planned SelectCall into one or
// more LaunchParams and hands each to `launch(params, grid)`. Shared by the real CUDA
// path (cuda/select.cu, which launches on the current stream) and the host emulation
// (test/csrc/select_cuda_emulation.cpp, which runs the kernel on the CPU for the tests).
//
// Include select_kernel.cuh first (with the namespace and emulation macros the
// includer wants); this header uses the namespace it was given.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "../select_common.h"

namespace torchcond {
namespace TORCHCOND_CUDA_SELECT_NS {

// Largest access size (16, 8, 4, 2, 1) dividing the itemsize and every base address.
inline int32_t element_unit(int64_t itemsize, uintptr_t addresses_or) {
  int32_t unit = 16;
  while (unit > 1 && ((itemsize % unit) != 0 || (addresses_or & static_cast<uintptr_t>(unit - 1)) != 0)) unit >>= 1;
  return unit;
}

template <typename LaunchFn>
class Launcher {
 public:
  Launcher(const SelectCall& call, int sm_count, int blocks_per_sm, LaunchFn launch)
      : sm_count_(sm_count), blocks_per_sm_(blocks_per_sm), launch_(launch) {
    params_ = LaunchParams{};
    const at::Tensor& sel = call.selector;
    params_.num_branches = call.num_branches;
    params_.sel_kind = call.sel_kind;
    params_.sel_itemsize = static_cast<int32_t>(sel.element_size());
    if (sel.device().is_cpu()) {
      // A 0-d CPU selector (with values on the GPU): read on the host, which costs
      // no device sync, and passed as a value. (In the emulation everything is on
      // the CPU: the selector stays a pointer unless it is 0-d.)
      if (sel.dim() == 0) {
        params_.sel = nullptr;
        params_.sel_value = select_plan::read_branch(call.sel_kind, sel.const_data_ptr(), call.num_branches);
      } else {
        params_.sel = static_cast<const char*>(sel.const_data_ptr());
      }
    } else {
      params_.sel = static_cast<const char*>(sel.const_data_ptr());
    }
    reset();
  }

  void add(const SelectCall& call, const SelectOutput& w) {
    const int64_t num_branches = call.num_branches;
    const select_plan::LayoutRef layout = call.layout(w);
    const int nd = layout.ndim;
    TORCH_CHECK(
        pool_words(nd, 1) <= kPoolWords, "torchcond::select (CUDA): output ", w.index, " has ", nd,
        " dimensions after merging contiguous ones; at most ", (kPoolWords - 1) / 3, " are supported");
    const int64_t numel = w.out.numel();
    const int64_t isz = w.itemsize;
    OutputDesc d{};
    d.out = static_cast<char*>(w.out.data_ptr());
    d.numel = numel;
    d.ndim = nd;
    d.itemsize = static_cast<int32_t>(isz);
    d.line_len = layout.line_len();
    uintptr_t addresses = reinterpret_cast<uintptr_t>(d.out);
    for (int64_t b = 0; b < num_branches; ++b) {
      addresses |= reinterpret_cast<uintptr_t>(call.value(b, w).const_data_ptr());
    }
    d.unit = element_unit(isz, addresses);
    int64_t n_tiles;
    if (layout.selector_constant_per_line() && d.line_len * isz >= kLineModeMinBytes) {
      d.mode = kLineMode;
      d.tile_elems = kTileBytes / isz;
      d.tiles_per_line = (d.line_len + d.tile_elems - 1) / d.tile_elems;
      n_tiles = (numel / d.line_len) * d.tiles_per_line;
    } else {
      d.mode = kElementMode;
      d.tile_elems = kElementTile;
      d.tiles_per_line = 0;
      n_tiles = (numel + d.tile_elems - 1) / d.tile_elems;
    }
    // Branch windows: all branches at once unless this output's pool entry would not
    // fit; then each window writes only the elements that select one of its branches.
    const int64_t window = std::min<int64_t>(num_branches, (kPoolWords - 2 * nd) / (1 + nd));
    for (int64_t lo = 0; lo < num_branches; lo += window) {
      const int64_t hi = std::min(num_branches, lo + window);
      const int words = pool_words(nd, static_cast<int>(hi - lo));
      if (params_.n_out == kMaxOutputs || pool_used_ + words > kPoolWords) flush();
      OutputDesc& slot = params_.outs[params_.n_out++];
      slot = d;
      slot.branch_lo = static_cast<int32_t>(lo);
      slot.branch_hi = static_cast<int32_t>(hi);
      slot.pool = pool_used_;
      slot.tile_begin = params_.total_tiles;
      params_.total_tiles += n_tiles;
      int64_t* pool = params_.pool + pool_used_;
      for (int k = 0; k < nd; ++k) pool[k] = layout.sizes()[k];
      for (int k = 0; k < nd; ++k) pool[nd + k] = layout.sel_strides()[k];
      int64_t* q = pool + 2 * nd;
      for (int64_t b = lo; b < hi; ++b) {
        *q++ = static_cast<int64_t>(reinterpret_cast<uintptr_t>(call.value(b, w).const_data_ptr()));
        for (int k = 0; k < nd; ++k) *q++ = layout.branch_strides(b)[k];
      }
      pool_used_ += words;
    }
  }

  void flush() {
    if (params_.n_out == 0) return;
    launch_(params_, grid_size(params_.total_tiles, sm_count_, blocks_per_sm_));
    ++launches_;
    reset();
  }

  int64_t launches() const { return launches_; }

 private:
  void reset() {
    params_.n_out = 0;
    params_.total_tiles = 0;
    pool_used_ = 0;
  }

  LaunchParams params_;
  int pool_used_ = 0;
  int sm_count_;
  int blocks_per_sm_;
  LaunchFn launch_;
  int64_t launches_ = 0;
};

// Packs every non-empty output of `call` and launches; returns the launch count.
template <typename LaunchFn>
int64_t launch_select(const SelectCall& call, int sm_count, int blocks_per_sm, LaunchFn launch) {
  Launcher<LaunchFn> launcher(call, sm_count, blocks_per_sm, launch);
  for (const SelectOutput& w : call.work) launcher.add(call, w);
  launcher.flush();
  return launcher.launches();
}

}  // namespace TORCHCOND_CUDA_SELECT_NS
}  // namespace torchcond
