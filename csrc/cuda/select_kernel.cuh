// The fused branch-select CUDA kernel. Needs only the CUDA runtime (no torch/ATen
// headers), so `make cuda-check` can compile it on a machine without a CUDA torch.
//
// One launch writes many outputs. The host (select.cu) describes each output in an
// OutputDesc and packs the descriptors, plus a pool of sizes/strides/pointers, into one
// LaunchParams struct that is passed BY VALUE as the kernel's only parameter.
//
// Why kernel parameters (and not a device buffer filled by cudaMemcpyAsync):
//   * CUDA-graph capture: parameters are copied into the graph node when the launch
//     is captured, so a replay needs nothing else to stay alive. A descriptor buffer
//     copied from host memory would be re-read from that host address at every
//     replay, and it would have to outlive the graph (no hook ties it to the graph).
//   * No allocation, no extra copy, no event bookkeeping per call; never a host sync.
//   * Limit: 4 KB of parameters on every CUDA version and GPU (CUDA 12.1+ allows
//     32 KB on Volta+ with a recent driver; we stay at 4 KB to run everywhere).
//     LaunchParams holds up to kMaxOutputs descriptors and kPoolWords pool words;
//     the host starts another launch (same stream, in order) when either would
//     overflow. Typical calls fit one launch: 2 branches, rank <= 2 after coalescing
//     -> 10 pool words per output -> 24 outputs per launch.
//   * An output whose own pool entry cannot fit (select_n with very many strided
//     branches) is split by branch: each launch covers a window [branch_lo, branch_hi)
//     and writes only the elements whose selector picks a branch in that window.
//
// Work: every output is cut into tiles; tiles are numbered across the launch's
// outputs (OutputDesc::tile_begin is the prefix sum) and blocks walk them with a
// grid-stride loop. Two tile kinds:
//   * line mode: the selector is constant along the innermost coalesced dim (a 0-d
//     selector, or a prefix selector with long rows). A tile is a segment of one line;
//     the whole block reads the selector once and copies the segment from the chosen
//     branch only: a 16-byte vectorized memcpy when the branch is contiguous there
//     (8/4/2/1-byte units when src and dst alignments differ), else a strided copy.
//   * element mode (short lines, or a selector that varies along the innermost dim):
//     one element per thread, coordinates decomposed from the linear index (32-bit
//     arithmetic when the output has fewer than 2^32 elements, else 64-bit).
// All offsets are int64: outputs with more than 2^31 elements are fine.
//
// Host emulation: with TORCHCOND_CUDA_EMULATION defined (test/csrc/cuda_emulation.h)
// this header compiles as plain C++ and the kernel runs on the CPU one (block, thread)
// at a time, which is exact because the kernel has no shared memory and no barriers.
// The tests use that to check this kernel and its launcher on machines without a GPU.
#pragma once

#ifndef TORCHCOND_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "../select_plan.h"

#ifndef TORCHCOND_CUDA_SELECT_NS
#define TORCHCOND_CUDA_SELECT_NS cuda_select
#endif

namespace torchcond {
namespace TORCHCOND_CUDA_SELECT_NS {

constexpr int kThreads = 256;
constexpr int kMaxOutputs = 24;
constexpr int kPoolWords = 256;
constexpr int64_t kTileBytes = 16384;        // line mode: bytes per tile
constexpr int64_t kElementTile = 4 * kThreads;  // element mode: elements per tile
constexpr int64_t kLineModeMinBytes = 512;   // shorter lines use element mode

enum Mode : int32_t { kLineMode = 0, kElementMode = 1 };

struct OutputDesc {
  char* out;               // contiguous output
  int64_t numel;
  int64_t tile_begin;      // first tile of this output in the launch's numbering
  int64_t tile_elems;      // elements per tile
  int64_t line_len;        // size of the innermost coalesced dim
  int64_t tiles_per_line;  // line mode only
  int32_t ndim;            // coalesced rank (>= 1)
  int32_t itemsize;        // 1, 2, 4, 8 or 16
  int32_t unit;            // access size for one element's bytes (divides itemsize,
                           // every base pointer and every byte stride)
  int32_t mode;            // Mode
  int32_t branch_lo;       // branches this launch writes: [branch_lo, branch_hi)
  int32_t branch_hi;
  int32_t pool;            // offset in LaunchParams::pool of: sizes[ndim],
                           // sel_strides[ndim] (selector elements), then for each
                           // branch in the window: data pointer, strides[ndim] (elements)
  int32_t reserved;
};

struct LaunchParams {
  const char* sel;         // device selector; nullptr: sel_value holds the branch
  int64_t sel_value;       // branch of a CPU 0-d selector, read on the host
  int64_t num_branches;
  int64_t total_tiles;
  select_plan::SelKind sel_kind;
  int32_t sel_itemsize;
  int32_t n_out;
  int32_t reserved;
  OutputDesc outs[kMaxOutputs];
  int64_t pool[kPoolWords];
};

static_assert(sizeof(LaunchParams) <= 4096, "kernel parameters must fit in 4 KB");

// Pool words one output needs for `window` branches at coalesced rank `ndim`.
__host__ __device__ constexpr int pool_words(int ndim, int window) {
  return 2 * ndim + window * (1 + ndim);
}

namespace detail {

template <typename T>
__device__ __forceinline__ void copy_units(char* dst, const char* src, int nunits) {
  for (int k = 0; k < nunits; ++k) {
    reinterpret_cast<T*>(dst)[k] = reinterpret_cast<const T*>(src)[k];
  }
}

// One element of `itemsize` bytes, in accesses of `unit` bytes (aligned by construction).
__device__ __forceinline__ void copy_element(char* dst, const char* src, int itemsize, int unit) {
  switch (unit) {
    case 16: copy_units<uint4>(dst, src, itemsize / 16); break;
    case 8: copy_units<uint2>(dst, src, itemsize / 8); break;
    case 4: copy_units<uint32_t>(dst, src, itemsize / 4); break;
    case 2: copy_units<uint16_t>(dst, src, itemsize / 2); break;
    default: copy_units<uint8_t>(dst, src, itemsize); break;
  }
}

// The block copies nbytes from src to dst in W-byte units (src and dst have equal
// alignment modulo W); bytes before the first aligned unit and after the last are
// copied one by one.
template <typename V, int W>
__device__ __forceinline__ void block_copy_aligned(char* dst, const char* src, int64_t nbytes) {
  const int64_t head = min(nbytes, static_cast<int64_t>((W - (reinterpret_cast<uintptr_t>(dst) & (W - 1))) & (W - 1)));
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
  const int64_t body = (nbytes - head) / W;
  V* d = reinterpret_cast<V*>(dst + head);
  const V* s = reinterpret_cast<const V*>(src + head);
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  // Four loads in flight per thread before the stores (the compiler cannot hoist
  // loads over stores itself: it does not know that src and dst do not overlap).
  for (; i + 3 * step < body; i += 4 * step) {
    const V a = s[i], b = s[i + step], c = s[i + 2 * step], e = s[i + 3 * step];
    d[i] = a;
    d[i + step] = b;
    d[i + 2 * step] = c;
    d[i + 3 * step] = e;
  }
  for (; i < body; i += step) d[i] = s[i];
  for (int64_t i = head + body * W + threadIdx.x; i < nbytes; i += blockDim.x) dst[i] = src[i];
}

__device__ __forceinline__ void block_copy(char* dst, const char* src, int64_t nbytes) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((mis & 15) == 0) {
    block_copy_aligned<uint4, 16>(dst, src, nbytes);
  } else if ((mis & 7) == 0) {
    block_copy_aligned<uint2, 8>(dst, src, nbytes);
  } else if ((mis & 3) == 0) {
    block_copy_aligned<uint32_t, 4>(dst, src, nbytes);
  } else if ((mis & 1) == 0) {
    block_copy_aligned<uint16_t, 2>(dst, src, nbytes);
  } else {
    block_copy_aligned<uint8_t, 1>(dst, src, nbytes);
  }
}

__device__ __forceinline__ int64_t branch_at(const LaunchParams& p, int64_t sel_off) {
  if (p.sel == nullptr) return p.sel_value;
  return select_plan::read_branch(p.sel_kind, p.sel + sel_off * p.sel_itemsize, p.num_branches);
}

// Offset (in elements) of coordinate-linear index `lin` over dims [0, nd) with the
// given strides; I is the index type for the div/mod (uint32_t when it fits).
template <typename I>
__device__ __forceinline__ int64_t offset_of(I lin, const int64_t* sizes, const int64_t* strides, int nd) {
  int64_t off = 0;
  for (int k = nd - 1; k >= 0; --k) {
    const I size = static_cast<I>(sizes[k]);
    const I q = lin / size;
    off += static_cast<int64_t>(lin - q * size) * strides[k];
    lin = q;
  }
  return off;
}

__device__ __forceinline__ int find_output(const LaunchParams& p, int64_t tile) {
  int lo = 0, hi = p.n_out - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.outs[mid].tile_begin <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ __forceinline__ void line_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  const int nd = d.ndim;
  const int64_t* sizes = p.pool + d.pool;
  const int64_t* sel_strides = sizes + nd;
  const int64_t line = local / d.tiles_per_line;
  const int64_t col0 = (local - line * d.tiles_per_line) * d.tile_elems;
  const int64_t n = min(d.tile_elems, d.line_len - col0);
  // The line's coordinates over dims [0, nd-1): the selector is constant along it.
  const bool small = d.numel <= 0xffffffffLL;
  const int64_t soff = small ? offset_of<uint32_t>(static_cast<uint32_t>(line), sizes, sel_strides, nd - 1)
                             : offset_of<uint64_t>(static_cast<uint64_t>(line), sizes, sel_strides, nd - 1);
  const int64_t b = branch_at(p, soff);
  if (b < d.branch_lo || b >= d.branch_hi) return;  // uniform over the block
  const int64_t* w = sel_strides + nd + (b - d.branch_lo) * (1 + nd);
  const char* base = reinterpret_cast<const char*>(w[0]);
  const int64_t* strides = w + 1;
  const int64_t boff = small ? offset_of<uint32_t>(static_cast<uint32_t>(line), sizes, strides, nd - 1)
                             : offset_of<uint64_t>(static_cast<uint64_t>(line), sizes, strides, nd - 1);
  const int64_t isz = d.itemsize;
  const int64_t last = strides[nd - 1];
  char* dst = d.out + (line * d.line_len + col0) * isz;
  const char* src = base + (boff + col0 * last) * isz;
  if (last == 1) {
    block_copy(dst, src, n * isz);
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      copy_element(dst + j * isz, src + j * last * isz, d.itemsize, d.unit);
    }
  }
}

template <typename I>
__device__ __forceinline__ void element_tile_impl(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  const int nd = d.ndim;
  const int64_t* sizes = p.pool + d.pool;
  const int64_t* sel_strides = sizes + nd;
  const int64_t e0 = local * d.tile_elems;
  const int64_t e1 = min(e0 + d.tile_elems, d.numel);
  const int64_t isz = d.itemsize;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int64_t b = branch_at(p, offset_of<I>(static_cast<I>(e), sizes, sel_strides, nd));
    if (b < d.branch_lo || b >= d.branch_hi) continue;
    const int64_t* w = sel_strides + nd + (b - d.branch_lo) * (1 + nd);
    const char* base = reinterpret_cast<const char*>(w[0]);
    const int64_t off = offset_of<I>(static_cast<I>(e), sizes, w + 1, nd);
    copy_element(d.out + e * isz, base + off * isz, d.itemsize, d.unit);
  }
}

}  // namespace detail

// Blocks of kThreads threads; at most 64 registers per thread, so that at least
// kMinBlocksPerSM blocks are resident (plain __launch_bounds__(kThreads) lets ptxas
// squeeze to 48 registers and spill).
constexpr int kMinBlocksPerSM = 4;

// By value on the GPU (the launch copies it into parameter memory); by reference in
// the host emulation, which calls the kernel once per emulated thread.
#ifdef TORCHCOND_CUDA_EMULATION
#define TORCHCOND_SELECT_PARAMS const LaunchParams&
#else
#define TORCHCOND_SELECT_PARAMS const LaunchParams
#endif

// The kernel: a grid-stride loop over every tile of every output in `p`.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM) select_kernel(TORCHCOND_SELECT_PARAMS p) {
  for (int64_t tile = blockIdx.x; tile < p.total_tiles; tile += gridDim.x) {
    const int oi = detail::find_output(p, tile);
    const OutputDesc& d = p.outs[oi];
    const int64_t local = tile - d.tile_begin;
    if (d.mode == kLineMode) {
      detail::line_tile(p, d, local);
    } else if (d.numel <= 0xffffffffLL) {
      detail::element_tile_impl<uint32_t>(p, d, local);
    } else {
      detail::element_tile_impl<uint64_t>(p, d, local);
    }
  }
}

// Host helper: blocks for a launch of `total_tiles` tiles on a GPU with `sm_count`
// multiprocessors of which each holds `blocks_per_sm` resident blocks (from
// cudaOccupancyMaxActiveBlocksPerMultiprocessor): one full wave; the grid-stride
// loop covers the remaining tiles.
inline unsigned int grid_size(int64_t total_tiles, int sm_count, int blocks_per_sm) {
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) *
      (blocks_per_sm > 0 ? blocks_per_sm : kMinBlocksPerSM);
  const int64_t n = total_tiles < cap ? total_tiles : cap;
  return static_cast<unsigned int>(n > 0 ? n : 1);
}

}  // namespace TORCHCOND_CUDA_SELECT_NS
}  // namespace torchcond
