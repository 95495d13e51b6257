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

// Read a selector element and clamp it into [0, num_branches).
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

TORCHCOND_HD int64_t read_branch(int32_t kind, const void* p, int64_t num_branches) {
  switch (kind) {
    case kSelBool:
      return *static_cast<const uint8_t*>(p) != 0 ? 0 : 1;
    case kSelU8:
      return clamp_branch_unsigned(*static_cast<const uint8_t*>(p), num_branches);
    case kSelI8:
      return clamp_branch(*static_cast<const int8_t*>(p), num_branches);
    case kSelI16:
      return clamp_branch(*static_cast<const int16_t*>(p), num_branches);
    case kSelU16:
      return clamp_branch_unsigned(*static_cast<const uint16_t*>(p), num_branches);
    case kSelI32:
      return clamp_branch(*static_cast<const int32_t*>(p), num_branches);
    case kSelU32:
      return clamp_branch_unsigned(*static_cast<const uint32_t*>(p), num_branches);
    case kSelI64:
      return clamp_branch(*static_cast<const int64_t*>(p), num_branches);
    default:  // kSelU64
      return clamp_branch_unsigned(*static_cast<const uint64_t*>(p), num_branches);
  }
}

#ifndef __CUDACC_RTC__
// Coalesced layout of one output, stored in a per-call arena of int64 words:
//   [sizes: R][selector strides: R][branch 0 strides: R] ... [branch nb-1 strides: R]
// with R = max(rank, 1); the first ndim entries of each array are used (ndim <= R).
// Strides are in elements of the operand's own dtype.
struct LayoutRef {
  const int64_t* base;
  int ndim;
  int R;
  const int64_t* sizes() const { return base; }
  const int64_t* sel_strides() const { return base + R; }
  const int64_t* branch_strides(int64_t b) const { return base + (2 + b) * R; }
  int64_t line_len() const { return base[ndim - 1]; }
  // The selector is constant along a line: each line is one run of one branch.
  bool selector_constant_per_line() const { return base[R + ndim - 1] == 0; }
};

// Appends one output's coalesced layout to `arena` and returns its ndim. `sizes`:
// the output shape (rank dims, none of size 0: callers skip empty outputs).
// `sel_strides`: the selector's sel_dim strides (the selector is broadcast over the
// trailing dims with stride 0). `branch_strides(b)`: branch b's rank strides.
template <typename BranchStrides>
int coalesce_into(std::vector<int64_t>& arena, int rank, const int64_t* sizes, int sel_dim,
                  const int64_t* sel_strides, int64_t nb, BranchStrides branch_strides) {
  const int R = rank > 0 ? rank : 1;
  const size_t at = arena.size();
  arena.resize(at + static_cast<size_t>((2 + nb) * R), 0);
  int64_t* out = arena.data() + at;
  int64_t* o_size = out;
  int64_t* o_sel = out + R;
  auto o_br = [&](int64_t b) { return out + (2 + b) * R; };
  auto sel_at = [&](int d) { return d < sel_dim ? sel_strides[d] : int64_t(0); };
  // Groups are built innermost first (reversed), then flipped.
  int n = 0;
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;  // size-1 dims carry no offset
    if (n > 0) {
      const int64_t gsize = o_size[n - 1];
      bool merge = sel_at(d) == o_sel[n - 1] * gsize;
      for (int64_t b = 0; merge && b < nb; ++b) merge = branch_strides(b)[d] == o_br(b)[n - 1] * gsize;
      if (merge) {
        o_size[n - 1] = gsize * sizes[d];
        continue;
      }
    }
    o_size[n] = sizes[d];
    o_sel[n] = sel_at(d);
    for (int64_t b = 0; b < nb; ++b) o_br(b)[n] = branch_strides(b)[d];
    ++n;
  }
  if (n == 0) {  // a single element (rank 0, or all sizes 1)
    o_size[0] = 1;
    o_sel[0] = 0;
    for (int64_t b = 0; b < nb; ++b) o_br(b)[0] = 0;
    n = 1;
  }
  auto flip = [n](int64_t* a) {
    for (int i = 0, j = n - 1; i < j; ++i, --j) {
      const int64_t t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
  };
  flip(o_size);
  flip(o_sel);
  for (int64_t b = 0; b < nb; ++b) flip(o_br(b));
  return n;
}
#endif  // __CUDACC_RTC__

}  // namespace select_plan
}  // namespace torchcond
