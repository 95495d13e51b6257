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

// Largest power of two up to 16 dividing `bits` (the OR of addresses and byte counts).
inline int32_t common_alignment(uint64_t bits) {
  int32_t alignment = 16;
  while (alignment > 1 && (bits & static_cast<uint64_t>(alignment - 1)) != 0) alignment >>= 1;
  return alignment;
}

// The plan of one output (see select_kernel.cuh): the descriptor fields it sets, and
// its tile count.
struct Plan {
  int32_t mode = kElementMode;
  int32_t tile_size = static_cast<int32_t>(kElementTile);
  int64_t tiles_per_line = 0;
  int32_t access = 0;
  int32_t sel_vector = 0;
  int64_t tiles = 0;
};

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
    if (sel.device().is_cpu() && sel.dim() == 0) {
      // A 0-d CPU selector (with values on the GPU): read on the host, which costs
      // no device sync, and passed as a value. (In the emulation everything is on
      // the CPU: the selector stays a pointer unless it is 0-d.)
      params_.sel = nullptr;
      params_.sel_value = select_plan::read_branch(call.sel_kind, sel.const_data_ptr(), call.num_branches);
    } else {
      params_.sel = static_cast<const char*>(sel.const_data_ptr());
    }
    int64_t total_bytes = 0;
    for (const SelectOutput& w : call.work) total_bytes += w.out.numel() * w.itemsize;
    tile_bytes_ = tile_bytes_for(total_bytes, sm_count, blocks_per_sm);
    reset();
  }

  void add(const SelectCall& call, const SelectOutput& w) {
    const int64_t num_branches = call.num_branches;
    const select_plan::LayoutRef layout = call.layout(w);
    const int ndim = layout.ndim;
    TORCH_CHECK(pool_words(ndim, 1) <= kPoolWords, "torchcond::select (CUDA): output ", w.index, " has ", ndim,
                " dimensions after merging contiguous ones; at most ", (kPoolWords - 1) / 3, " are supported");
    OutputDesc d{};
    d.out = static_cast<char*>(w.out.data_ptr());
    d.numel = w.out.numel();
    d.ndim = ndim;
    d.itemsize = static_cast<int32_t>(w.itemsize);
    d.line_len = layout.line_len();
    d.unit = element_unit(w.itemsize, addresses(call, w));
    const Plan plan = plan_output(call, w, d);
    d.mode = plan.mode;
    d.tile_size = plan.tile_size;
    d.tiles_per_line = plan.tiles_per_line;
    d.access = plan.access;
    d.sel_vector = plan.sel_vector;
    // Branch windows: all branches at once unless this output's pool entry would not
    // fit; then each window writes only the elements that select one of its branches.
    const int64_t window = std::min<int64_t>(num_branches, (kPoolWords - 2 * ndim) / (1 + ndim));
    for (int64_t lo = 0; lo < num_branches; lo += window) {
      const int64_t hi = std::min(num_branches, lo + window);
      const int words = pool_words(ndim, static_cast<int>(hi - lo));
      if (params_.n_out == kMaxOutputs || pool_used_ + words > kPoolWords) flush();
      OutputDesc& slot = params_.outs[params_.n_out++];
      slot = d;
      slot.branch_lo = static_cast<int32_t>(lo);
      slot.branch_hi = static_cast<int32_t>(hi);
      slot.pool = pool_used_;
      slot.tile_begin = params_.total_tiles;
      params_.total_tiles += plan.tiles;
      int64_t* pool = params_.pool + pool_used_;
      for (int k = 0; k < ndim; ++k) pool[k] = layout.sizes()[k];
      for (int k = 0; k < ndim; ++k) pool[ndim + k] = layout.sel_strides()[k];
      int64_t* entry = pool + 2 * ndim;
      for (int64_t b = lo; b < hi; ++b) {
        *entry++ = static_cast<int64_t>(reinterpret_cast<uintptr_t>(call.value(b, w).const_data_ptr()));
        for (int k = 0; k < ndim; ++k) *entry++ = layout.branch_strides(b)[k];
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

  // The OR of the output's and every branch's base address.
  static uint64_t addresses(const SelectCall& call, const SelectOutput& w) {
    uint64_t bits = reinterpret_cast<uintptr_t>(w.out.const_data_ptr());
    for (int64_t b = 0; b < call.num_branches; ++b) {
      bits |= reinterpret_cast<uintptr_t>(call.value(b, w).const_data_ptr());
    }
    return bits;
  }

  Plan plan_output(const SelectCall& call, const SelectOutput& w, const OutputDesc& d) const {
    const select_plan::LayoutRef layout = call.layout(w);
    // With one branch every element takes it, whatever the selector: a copy.
    if (layout.selector_constant_per_line() || call.num_branches == 1) return plan_lines(call, w, d);
    const int32_t vector_bytes = vector_width(call, w, d);
    if (vector_bytes > 0) return plan_vectors(d, vector_bytes);
    return plan_elements(d);
  }

  // A selector constant along each line: rows when lines are contiguous and fit a
  // tile, the line plan for long lines (and strided ones of kLineModeMinBytes or more).
  Plan plan_lines(const SelectCall& call, const SelectOutput& w, const OutputDesc& d) const {
    const int64_t line_bytes = d.line_len * d.itemsize;
    const int64_t lines = d.numel / d.line_len;
    const int32_t access = rows_access(call, w, line_bytes);
    Plan plan;
    if (access > 0 && line_bytes <= tile_bytes_) {
      plan.mode = kRowsMode;
      plan.access = access;
      plan.tile_size = static_cast<int32_t>(tile_bytes_ / line_bytes);
      plan.tiles = (lines + plan.tile_size - 1) / plan.tile_size;
    } else if (access > 0 || line_bytes >= kLineModeMinBytes) {
      plan.mode = kLineMode;
      plan.tile_size = static_cast<int32_t>(tile_bytes_ / d.itemsize);
      plan.tiles_per_line = (d.line_len + plan.tile_size - 1) / plan.tile_size;
      plan.tiles = lines * plan.tiles_per_line;
    } else {
      return plan_elements(d);
    }
    return plan;
  }

  // Vectors of `vector_bytes`; the elements after the last whole vector go to the last
  // tile (so an output shorter than one vector still has one tile).
  Plan plan_vectors(const OutputDesc& d, int32_t vector_bytes) const {
    const int64_t count = vector_bytes / d.itemsize;
    const int64_t vectors = d.numel / count;
    const uintptr_t sel = reinterpret_cast<uintptr_t>(params_.sel);
    Plan plan;
    plan.mode = kVectorMode;
    plan.access = vector_bytes;
    plan.sel_vector = params_.sel_itemsize == 1 && sel % static_cast<uintptr_t>(count) == 0;
    plan.tile_size = static_cast<int32_t>(tile_bytes_ / vector_bytes);
    plan.tiles = std::max<int64_t>(1, (vectors + plan.tile_size - 1) / plan.tile_size);
    return plan;
  }

  Plan plan_elements(const OutputDesc& d) const {
    Plan plan;
    plan.tiles = (d.numel + plan.tile_size - 1) / plan.tile_size;
    return plan;
  }

  // Rows plan: the access size dividing the line's bytes, every base address and
  // every branch's outer strides in bytes, so that every line of every branch starts
  // aligned; 0 when some branch is not contiguous along the line.
  int32_t rows_access(const SelectCall& call, const SelectOutput& w, int64_t line_bytes) const {
    const select_plan::LayoutRef layout = call.layout(w);
    const int ndim = layout.ndim;
    uint64_t bits = addresses(call, w) | static_cast<uint64_t>(line_bytes);
    for (int64_t b = 0; b < call.num_branches; ++b) {
      const int64_t* strides = layout.branch_strides(b);
      if (strides[ndim - 1] != 1 && layout.sizes()[ndim - 1] != 1) return 0;
      for (int k = 0; k + 1 < ndim; ++k) bits |= static_cast<uint64_t>(strides[k] * w.itemsize);
    }
    return common_alignment(bits);
  }

  // Vector plan: bytes per vector (16, or the itemsize where the addresses allow no
  // more), or 0 when the output does not qualify: one coalesced dim, a selector with
  // one entry per element, two branches, every branch contiguous and aligned to its
  // itemsize. With three or more branches the element plan reads only the branch each
  // element picks, where loading every branch (as chained torch.where calls do) would
  // read all of them.
  int32_t vector_width(const SelectCall& call, const SelectOutput& w, const OutputDesc& d) const {
    const select_plan::LayoutRef layout = call.layout(w);
    if (layout.ndim != 1 || layout.sel_strides()[0] != 1 || call.num_branches != 2) return 0;
    for (int64_t b = 0; b < call.num_branches; ++b) {
      if (layout.branch_strides(b)[0] != 1) return 0;
    }
    if (d.unit != d.itemsize) return 0;
    return common_alignment(addresses(call, w)) == 16 ? 16 : d.itemsize;
  }

  LaunchParams params_;
  int pool_used_ = 0;
  int sm_count_;
  int blocks_per_sm_;
  int64_t tile_bytes_ = kTileBytes;
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
