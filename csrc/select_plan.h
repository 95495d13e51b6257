// Layout planning for the fused branch-select kernels. No torch headers: the CPU
// kernel and the CUDA host code both use it, and so can a test harness.
//
// One output of select/select_n has a shape S, a selector (0-d, or shaped like a
// prefix of S), and one input per branch with S's shape and arbitrary strides.
// Outputs are fresh contiguous tensors, so they are written in row-major order.
//
// `coalesce_into` merges adjacent dimensions that every operand (each branch and the
// selector, whose strides are 0 over the trailing non-prefix dimensions) walks
// linearly, and drops size-1 dimensions. After it:
//   * contiguous values + 0-d selector            -> 1 dim  (numel),        sel stride 0
//   * contiguous values + contiguous prefix sel   -> 2 dims (outer, inner), sel strides (1, 0)
//   * selector shaped like the values             -> 1 dim  (numel),        sel stride 1
// A "line" is the innermost coalesced dimension. When the selector's stride there
// is 0, the selector is constant over the whole line and a line is one contiguous
// run of the chosen branch (a memcpy when that branch's stride there is 1).
//
// Everything is int64: sizes, strides, element and byte offsets.
#pragma once

#include <cstdint>
#include <vector>

namespace torchcond {
namespace select_plan {

// How a selector's element turns into a branch number.
enum SelKind : int32_t {
  kSelBool = 0,  // select: true -> branch 0 (true_values), false -> branch 1
  kSelU8 = 1,
  kSelI8 = 2,
  kSelI16 = 3,
  kSelU16 = 4,
  kSelI32 = 5,
  kSelU32 = 6,
  kSelI64 = 7,
  kSelU64 = 8,
};

// Read a selector element and clamp it into [0, num_branches): switch's index rule
// (torchcond/_src/kinds.py, clamp_index), per element.
#if defined(__CUDACC__)
#define TORCHCOND_HD __host__ __device__ __forceinline__
#else
#define TORCHCOND_HD inline
#endif

TORCHCOND_HD int64_t clamp_branch(int64_t v, int64_t num_branches) {
  return v < 0 ? 0 : (v >= num_branches ? num_branches - 1 : v);
}

TORCHCOND_HD int64_t clamp_branch_unsigned(uint64_t v, int64_t num_branches) {
  return v >= static_cast<uint64_t>(num_branches) ? num_branches - 1 : static_cast<int64_t>(v);
}

TORCHCOND_HD int64_t read_branch(SelKind kind, const void* p, int64_t num_branches) {
  switch (kind) {
    case kSelBool: return *static_cast<const uint8_t*>(p) != 0 ? 0 : 1;
    case kSelU8: return clamp_branch_unsigned(*static_cast<const uint8_t*>(p), num_branches);
    case kSelI8: return clamp_branch(*static_cast<const int8_t*>(p), num_branches);
    case kSelI16: return clamp_branch(*static_cast<const int16_t*>(p), num_branches);
    case kSelU16: return clamp_branch_unsigned(*static_cast<const uint16_t*>(p), num_branches);
    case kSelI32: return clamp_branch(*static_cast<const int32_t*>(p), num_branches);
    case kSelU32: return clamp_branch_unsigned(*static_cast<const uint32_t*>(p), num_branches);
    case kSelI64: return clamp_branch(*static_cast<const int64_t*>(p), num_branches);
    default:  // kSelU64
      return clamp_branch_unsigned(*static_cast<const uint64_t*>(p), num_branches);
  }
}

#ifndef __CUDACC_RTC__
// Coalesced layout of one output, stored in a per-call arena of int64 words:
//   [sizes][selector strides][branch 0 strides] ... [branch num_branches-1 strides]
// each array array_len = max(rank, 1) words long; the first ndim entries of each are
// used (ndim <= array_len). Strides are in elements of the operand's own dtype.
struct LayoutRef {
  const int64_t* base;
  int ndim;
  int array_len;
  const int64_t* sizes() const { return base; }
  const int64_t* sel_strides() const { return base + array_len; }
  const int64_t* branch_strides(int64_t branch) const { return base + (2 + branch) * array_len; }
  int64_t line_len() const { return base[ndim - 1]; }
  // The selector is constant along a line: each line is one run of one branch.
  bool selector_constant_per_line() const { return base[array_len + ndim - 1] == 0; }
};

// Appends one output's coalesced layout to `arena` and returns its ndim. `sizes`:
// the output shape (rank dims, none of size 0: callers skip empty outputs).
// `sel_strides`: the selector's sel_dim strides (the selector is broadcast over the
// trailing dims with stride 0). `branch_strides(b)`: branch b's rank strides.
template <typename BranchStrides>
int coalesce_into(std::vector<int64_t>& arena, int rank, const int64_t* sizes, int sel_dim, const int64_t* sel_strides,
                  int64_t num_branches, BranchStrides branch_strides) {
  const int array_len = rank > 0 ? rank : 1;
  const size_t at = arena.size();
  arena.resize(at + static_cast<size_t>((2 + num_branches) * array_len), 0);
  int64_t* layout = arena.data() + at;
  int64_t* out_sizes = layout;
  int64_t* out_sel = layout + array_len;
  auto out_branch = [&](int64_t branch) { return layout + (2 + branch) * array_len; };
  auto sel_at = [&](int d) { return d < sel_dim ? sel_strides[d] : int64_t(0); };
  // Groups are built innermost first (reversed), then flipped.
  int groups = 0;
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;  // size-1 dims carry no offset
    if (groups > 0) {
      const int64_t group_size = out_sizes[groups - 1];
      bool merge = sel_at(d) == out_sel[groups - 1] * group_size;
      for (int64_t b = 0; merge && b < num_branches; ++b) {
        merge = branch_strides(b)[d] == out_branch(b)[groups - 1] * group_size;
      }
      if (merge) {
        out_sizes[groups - 1] = group_size * sizes[d];
        continue;
      }
    }
    out_sizes[groups] = sizes[d];
    out_sel[groups] = sel_at(d);
    for (int64_t b = 0; b < num_branches; ++b) out_branch(b)[groups] = branch_strides(b)[d];
    ++groups;
  }
  if (groups == 0) {  // a single element (rank 0, or all sizes 1)
    out_sizes[0] = 1;
    out_sel[0] = 0;
    for (int64_t b = 0; b < num_branches; ++b) out_branch(b)[0] = 0;
    groups = 1;
  }
  auto flip = [groups](int64_t* array) {
    for (int i = 0, j = groups - 1; i < j; ++i, --j) {
      const int64_t held = array[i];
      array[i] = array[j];
      array[j] = held;
    }
  };
  flip(out_sizes);
  flip(out_sel);
  for (int64_t b = 0; b < num_branches; ++b) flip(out_branch(b));
  return groups;
}
#endif  // __CUDACC_RTC__

}  // namespace select_plan
}  // namespace torchcond
