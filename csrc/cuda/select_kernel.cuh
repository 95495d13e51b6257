// The fused branch-select CUDA kernel. Needs only the CUDA runtime (no torch/ATen
// headers), so `make cuda-check` can compile it on a machine without a CUDA torch.
//
// One launch writes many outputs. The host (select_launch.h) describes each output in
// an OutputDesc and packs the descriptors, plus a pool of sizes/strides/pointers, into
// one LaunchParams struct that is passed BY VALUE as the kernel's only parameter.
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
// grid-stride loop. Each output gets one of four plans (the host picks it):
//   * rows: the selector is constant along each line (a prefix selector, or 0-d) and
//     every branch is contiguous along it, and a line fits in a tile. A tile is
//     several whole lines; each thread copies kInFlight accesses of up to 16 bytes
//     per round, from several lines at once, reading only the chosen branch.
//   * line: the same selector, with lines longer than a tile (or strided lines of at
//     least kLineModeMinBytes). A tile is a segment of one line; the block reads the
//     selector once and copies the segment from the chosen branch only.
//   * vector: the selector has one entry per element, and the output, the selector
//     and both branches (select, or select_n over two cases) are one contiguous run.
//     Each thread loads two 16-byte vectors of both branches and their selector
//     bytes at once (no load waits for the selector), blends words with byte masks
//     and stores whole vectors: every DRAM sector of both branches is read anyway
//     when the selector changes from element to element, as torch.where reads them.
//   * element: everything else (strided or broadcast values with a per-element
//     selector, select_n over three or more branches, items at unaligned addresses).
//     Each thread reads the selector of kInFlight elements, then loads each from the
//     branch it picks (only that branch is read).
// Every plan issues all of a thread's loads of a round before its first store: the
// compiler cannot move a load above a store itself (it does not know that the
// branches and the output do not overlap), so the code loads, then stores.
// Tiles are 16 KB of output, 8 KB in calls too small for two waves of blocks.
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
#include <cstring>
#include <type_traits>

#include "../select_plan.h"

#ifndef TORCHCOND_CUDA_SELECT_NS
#define TORCHCOND_CUDA_SELECT_NS cuda_select
#endif

// Loop unrolling for nvcc: a round's kInFlight loads unrolled (so they are issued
// together), the loops over rounds and over a block's stride kept rolled (unrolled,
// they hold the loads of several rounds in registers and spill). The emulation's
// compiler needs neither.
#ifdef TORCHCOND_CUDA_EMULATION
#define TORCHCOND_UNROLL
#define TORCHCOND_ROLLED
#else
#define TORCHCOND_UNROLL _Pragma("unroll")
#define TORCHCOND_ROLLED _Pragma("unroll 1")
#endif

namespace torchcond {
namespace TORCHCOND_CUDA_SELECT_NS {

constexpr int kThreads = 256;  // every launch uses blocks of kThreads
constexpr int kMaxOutputs = 24;
constexpr int kPoolWords = 256;
constexpr int kInFlight = 4;                            // independent loads per thread per round
constexpr int kVectorsInFlight = 2;                     // vector plan: 16-byte vectors of each branch per round
constexpr int64_t kTileBytes = 16384;                   // output bytes per tile (rows, line, vector)
constexpr int64_t kMinTileBytes = 8192;                 // small calls: tiles shrink down to this
constexpr int64_t kLineModeMinBytes = 512;              // shorter strided lines use the element plan
constexpr int64_t kElementTile = kInFlight * kThreads;  // element plan: one round per tile

enum Mode : int32_t { kLineMode = 0, kElementMode = 1, kRowsMode = 2, kVectorMode = 3 };

struct OutputDesc {
  char* out;  // contiguous output
  int64_t numel;
  int64_t tile_begin;      // first tile of this output in the launch's numbering
  int64_t line_len;        // size of the innermost coalesced dim
  int64_t tiles_per_line;  // line plan only
  int32_t tile_size;       // line: elements; rows: lines; vector: vectors; element: elements
  int32_t ndim;            // coalesced rank (>= 1)
  int32_t itemsize;        // 1, 2, 4, 8 or 16
  int32_t unit;            // access size for one element's bytes (divides itemsize,
                           // every base pointer and every byte stride)
  int32_t mode;            // Mode
  int32_t branch_lo;       // branches this launch writes: [branch_lo, branch_hi)
  int32_t branch_hi;
  int32_t pool;        // offset in LaunchParams::pool of: sizes[ndim],
                       // sel_strides[ndim] (selector elements), then for each
                       // branch in the window: data pointer, strides[ndim] (elements)
  int32_t access;      // rows: bytes per access; vector: bytes per vector (16 or itemsize)
  int32_t sel_vector;  // vector: 1 when a vector's selector bytes are one aligned load
};

struct LaunchParams {
  const char* sel;    // device selector; nullptr: sel_value holds the branch
  int64_t sel_value;  // branch of a CPU 0-d selector, read on the host
  int64_t num_branches;
  int64_t total_tiles;
  select_plan::SelKind sel_kind;
  int32_t sel_itemsize;
  int32_t n_out;
  int32_t reserved;
  OutputDesc outs[kMaxOutputs];
  int64_t pool[kPoolWords];
};

static_assert(sizeof(OutputDesc) == 80, "24 descriptors and the pool must fit in 4 KB");
static_assert(sizeof(LaunchParams) <= 4096, "kernel parameters must fit in 4 KB");

// Pool words one output needs for `window` branches at coalesced rank `ndim`.
__host__ __device__ constexpr int pool_words(int ndim, int window) { return 2 * ndim + window * (1 + ndim); }

namespace detail {

// Loads and stores through a pointer of the access's own type, which nvcc turns into
// one vector instruction (the host planned the alignment). The emulation copies bytes
// instead: plain C++ forbids reading a tensor's bytes through another type.
template <typename T>
__device__ __forceinline__ T load(const char* address) {
#ifdef TORCHCOND_CUDA_EMULATION
  T value;
  std::memcpy(&value, address, sizeof(T));
  return value;
#else
  return *reinterpret_cast<const T*>(address);
#endif
}

template <typename T>
__device__ __forceinline__ void store(char* address, const T& value) {
#ifdef TORCHCOND_CUDA_EMULATION
  std::memcpy(address, &value, sizeof(T));
#else
  *reinterpret_cast<T*>(address) = value;
#endif
}

// The unsigned type of one element of `kBytes` bytes.
template <int kBytes>
struct ItemOf;
template <>
struct ItemOf<1> {
  using type = uint8_t;
};
template <>
struct ItemOf<2> {
  using type = uint16_t;
};
template <>
struct ItemOf<4> {
  using type = uint32_t;
};
template <>
struct ItemOf<8> {
  using type = uint2;
};
template <>
struct ItemOf<16> {
  using type = uint4;
};

template <typename T>
__device__ __forceinline__ void copy_units(char* dst, const char* src, int nunits) {
  TORCHCOND_ROLLED
  for (int k = 0; k < nunits; ++k) {
    store<T>(dst + k * sizeof(T), load<T>(src + k * sizeof(T)));
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

// The block copies nbytes (at most a tile, so indices are 32-bit) from src to dst in
// W-byte units (src and dst have equal alignment modulo W); the bytes before the
// first aligned unit and after the last, fewer than W each, are copied one per
// thread. Each thread has up to kInFlight units in flight per round: a 16 KB tile is
// one round of 16-byte units, and a shorter one still overlaps its thread's loads.
template <typename V, int W>
__device__ __forceinline__ void block_copy_aligned(char* dst, const char* src, int32_t nbytes) {
  const int32_t misaligned = static_cast<int32_t>(reinterpret_cast<uintptr_t>(dst) & (W - 1));
  const int32_t head = min(nbytes, (W - misaligned) & (W - 1));
  if (static_cast<int32_t>(threadIdx.x) < head) dst[threadIdx.x] = src[threadIdx.x];
  const int32_t body = (nbytes - head) / W;
  char* body_dst = dst + head;
  const char* body_src = src + head;
  TORCHCOND_ROLLED
  for (int32_t first = threadIdx.x; first < body; first += kInFlight * kThreads) {
    V held[kInFlight] = {};  // zeros where nothing is loaded: no value lives across rounds
    TORCHCOND_UNROLL
    for (int k = 0; k < kInFlight; ++k) {
      const int32_t unit = first + k * kThreads;
      if (unit < body) held[k] = load<V>(body_src + unit * W);
    }
    TORCHCOND_UNROLL
    for (int k = 0; k < kInFlight; ++k) {
      const int32_t unit = first + k * kThreads;
      if (unit < body) store<V>(body_dst + unit * W, held[k]);
    }
  }
  const int32_t tail = head + body * W + threadIdx.x;
  if (tail < nbytes) dst[tail] = src[tail];
}

__device__ __forceinline__ void block_copy(char* dst, const char* src, int32_t nbytes) {
  const uintptr_t mismatch = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((mismatch & 15) == 0) {
    block_copy_aligned<uint4, 16>(dst, src, nbytes);
  } else if ((mismatch & 7) == 0) {
    block_copy_aligned<uint2, 8>(dst, src, nbytes);
  } else if ((mismatch & 3) == 0) {
    block_copy_aligned<uint32_t, 4>(dst, src, nbytes);
  } else if ((mismatch & 1) == 0) {
    block_copy_aligned<uint16_t, 2>(dst, src, nbytes);
  } else {
    block_copy_aligned<uint8_t, 1>(dst, src, nbytes);
  }
}

// The raw bits of the selector element at `offset` (in selector elements), zero
// extended; 0 without a device selector. Reading and decoding are separate steps so
// that a thread issues all of its round's selector loads before it waits for one.
__device__ __forceinline__ uint64_t selector_bits(const LaunchParams& p, int64_t offset) {
  if (p.sel == nullptr) return 0;
  const char* address = p.sel + offset * p.sel_itemsize;
  switch (p.sel_itemsize) {
    case 1: return load<uint8_t>(address);
    case 2: return load<uint16_t>(address);
    case 4: return load<uint32_t>(address);
    default: return load<uint64_t>(address);
  }
}

// The branch that selector bits of `kind` pick, clamped into [0, num_branches), as
// select_plan::read_branch does from memory.
__device__ __forceinline__ int64_t branch_from_bits(select_plan::SelKind kind, uint64_t bits, int64_t num_branches) {
  using namespace select_plan;
  switch (kind) {
    case kSelBool: return bits != 0 ? 0 : 1;
    case kSelI8: return clamp_branch(static_cast<int8_t>(bits), num_branches);
    case kSelI16: return clamp_branch(static_cast<int16_t>(bits), num_branches);
    case kSelI32: return clamp_branch(static_cast<int32_t>(bits), num_branches);
    case kSelI64: return clamp_branch(static_cast<int64_t>(bits), num_branches);
    default: return clamp_branch_unsigned(bits, num_branches);  // the unsigned kinds
  }
}

__device__ __forceinline__ int64_t branch_of(const LaunchParams& p, uint64_t bits) {
  if (p.sel == nullptr) return p.sel_value;
  return branch_from_bits(p.sel_kind, bits, p.num_branches);
}

__device__ __forceinline__ int64_t branch_at(const LaunchParams& p, int64_t sel_offset) {
  return branch_of(p, selector_bits(p, sel_offset));
}

// Offset (in elements) of coordinate-linear index `linear` over dims [0, ndim) with the
// given strides; I is the index type for the div/mod (uint32_t when it fits). The
// outermost dim needs no modulo: the index is in range.
template <typename I>
__device__ __forceinline__ int64_t offset_of(I linear, const int64_t* sizes, const int64_t* strides, int ndim) {
  if (ndim <= 0) return 0;
  int64_t offset = 0;
  for (int k = ndim - 1; k > 0; --k) {
    const I size = static_cast<I>(sizes[k]);
    const I quotient = linear / size;
    offset += static_cast<int64_t>(linear - quotient * size) * strides[k];
    linear = quotient;
  }
  return offset + static_cast<int64_t>(linear) * strides[0];
}

// Offset of the first element of line `line` over the outer dims [0, ndim - 1).
__device__ __forceinline__ int64_t line_offset(const OutputDesc& d, int64_t line, const int64_t* sizes,
                                               const int64_t* strides) {
  if (d.numel <= 0xffffffffLL) return offset_of<uint32_t>(static_cast<uint32_t>(line), sizes, strides, d.ndim - 1);
  return offset_of<uint64_t>(static_cast<uint64_t>(line), sizes, strides, d.ndim - 1);
}

__device__ __forceinline__ const int64_t* output_sizes(const LaunchParams& p, const OutputDesc& d) {
  return p.pool + d.pool;
}

// Branch `branch`'s pool entry: its data pointer, then its strides.
__device__ __forceinline__ const int64_t* branch_entry(const LaunchParams& p, const OutputDesc& d, int64_t branch) {
  return p.pool + d.pool + 2 * d.ndim + (branch - d.branch_lo) * (1 + d.ndim);
}

__device__ __forceinline__ const char* entry_base(const int64_t* entry) {
  return reinterpret_cast<const char*>(static_cast<uintptr_t>(entry[0]));
}

__device__ __forceinline__ bool in_window(const OutputDesc& d, int64_t branch) {
  return branch >= d.branch_lo && branch < d.branch_hi;
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

// Line plan: one segment of one long line, copied from the branch its selector picks.
__device__ __forceinline__ void line_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  const int64_t* sizes = output_sizes(p, d);
  const int64_t* sel_strides = sizes + d.ndim;
  const int64_t line = local / d.tiles_per_line;
  const int64_t col = (local - line * d.tiles_per_line) * d.tile_size;
  const int64_t count = min(static_cast<int64_t>(d.tile_size), d.line_len - col);
  const int64_t branch = branch_at(p, line_offset(d, line, sizes, sel_strides));
  if (!in_window(d, branch)) return;  // uniform over the block
  const int64_t* entry = branch_entry(p, d, branch);
  const int64_t* strides = entry + 1;
  const int64_t itemsize = d.itemsize;
  const int64_t inner_stride = strides[d.ndim - 1];
  char* dst = d.out + (line * d.line_len + col) * itemsize;
  const char* src = entry_base(entry) + (line_offset(d, line, sizes, strides) + col * inner_stride) * itemsize;
  if (inner_stride == 1) {
    block_copy(dst, src, static_cast<int32_t>(count * itemsize));
  } else {
    TORCHCOND_ROLLED
    for (int64_t j = threadIdx.x; j < count; j += kThreads) {
      copy_element(dst + j * itemsize, src + j * inner_stride * itemsize, d.itemsize, d.unit);
    }
  }
}

// Rows plan: tile_size whole lines, each contiguous in every branch, in accesses of
// V (the host made V divide the line's bytes, every base address and every outer
// stride). The tile's output is one contiguous range, so consecutive threads write
// consecutive accesses even when a line is shorter than a warp's span; a thread's
// kInFlight accesses lie kThreads apart, usually in different lines, and their
// selector reads (cache hits after the first thread of a line) and data loads are
// each issued together before any is waited for.
template <typename V>
__device__ __forceinline__ void rows_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  const int64_t* sizes = output_sizes(p, d);
  const int64_t* sel_strides = sizes + d.ndim;
  const int64_t first_line = local * d.tile_size;
  const int64_t lines_left = d.numel / d.line_len - first_line;
  const int32_t lines = static_cast<int32_t>(min(static_cast<int64_t>(d.tile_size), lines_left));
  const int32_t line_bytes = static_cast<int32_t>(d.line_len * d.itemsize);
  const int32_t per_line = line_bytes / static_cast<int32_t>(sizeof(V));
  const int32_t accesses = lines * per_line;  // at most kTileBytes / sizeof(V)
  char* tile_out = d.out + first_line * line_bytes;
  TORCHCOND_ROLLED
  for (int32_t first = threadIdx.x; first < accesses; first += kInFlight * kThreads) {
    uint64_t bits[kInFlight] = {};
    TORCHCOND_UNROLL
    for (int k = 0; k < kInFlight; ++k) {
      const int32_t access = first + k * kThreads;
      if (access < accesses) {
        const int64_t line = first_line + access / per_line;
        bits[k] = selector_bits(p, line_offset(d, line, sizes, sel_strides));
      }
    }
    V held[kInFlight] = {};
    uint32_t loaded = 0;  // bit k: access k was loaded (in range, its branch in the window)
    TORCHCOND_UNROLL
    for (int k = 0; k < kInFlight; ++k) {
      const int32_t access = first + k * kThreads;
      if (access >= accesses) continue;
      const int32_t row = access / per_line;
      const int64_t branch = branch_of(p, bits[k]);
      if (!in_window(d, branch)) continue;
      const int64_t* entry = branch_entry(p, d, branch);
      const int64_t start = line_offset(d, first_line + row, sizes, entry + 1) * d.itemsize;
      held[k] = load<V>(entry_base(entry) + start + static_cast<int64_t>(access - row * per_line) * sizeof(V));
      loaded |= 1u << k;
    }
    TORCHCOND_UNROLL
    for (int k = 0; k < kInFlight; ++k) {
      if ((loaded >> k) & 1) store<V>(tile_out + static_cast<int64_t>(first + k * kThreads) * sizeof(V), held[k]);
    }
  }
}

// Vector plan, the selector of one vector. With two branches, branch 0 is taken where
// a bool is true, an unsigned index is 0, a signed one is 0 or less. The choice is
// kept as byte masks: one byte per element (0xff: branch 0), four to a 32-bit word,
// which blend whole words of values without a register per element.
template <int kCount>
struct SelectorMasks {
  static constexpr int kWords = (kCount + 3) / 4;
  uint32_t words[kWords];
};

// Bit 7 of each byte of `word` that is not zero (no carry crosses a byte).
__device__ __forceinline__ uint32_t nonzero_bytes(uint32_t word) {
  return (((word & 0x7f7f7f7fu) + 0x7f7f7f7fu) | word) & 0x80808080u;
}

// Byte masks of four one-byte selector elements.
__device__ __forceinline__ uint32_t first_bytes(select_plan::SelKind kind, uint32_t word) {
  const uint32_t nonzero = nonzero_bytes(word);
  uint32_t first;
  switch (kind) {
    case select_plan::kSelBool: first = nonzero; break;
    case select_plan::kSelU8: first = ~nonzero & 0x80808080u; break;
    default: first = ~(nonzero & ~word) & 0x80808080u; break;  // kSelI8: not positive
  }
  return (first >> 7) * 0xffu;
}

// From one aligned load of the vector's kCount selector bytes.
template <int kCount>
__device__ __forceinline__ SelectorMasks<kCount> masks_of_bytes(const char* sel) {
  SelectorMasks<kCount> masks;
  if constexpr (kCount == 16) {
    const uint4 bytes = load<uint4>(sel);
    masks.words[0] = bytes.x;
    masks.words[1] = bytes.y;
    masks.words[2] = bytes.z;
    masks.words[3] = bytes.w;
  } else if constexpr (kCount == 8) {
    const uint2 bytes = load<uint2>(sel);
    masks.words[0] = bytes.x;
    masks.words[1] = bytes.y;
  } else if constexpr (kCount == 4) {
    masks.words[0] = load<uint32_t>(sel);
  } else if constexpr (kCount == 2) {
    masks.words[0] = load<uint16_t>(sel);
  } else {
    masks.words[0] = load<uint8_t>(sel);
  }
  return masks;
}

template <int kCount>
__device__ __forceinline__ void decode_bytes(const LaunchParams& p, SelectorMasks<kCount>& masks) {
  TORCHCOND_UNROLL
  for (int w = 0; w < SelectorMasks<kCount>::kWords; ++w) masks.words[w] = first_bytes(p.sel_kind, masks.words[w]);
}

// Whether a selector value of any kind takes branch 0 (two branches).
template <typename T>
__device__ __forceinline__ bool takes_first(select_plan::SelKind kind, T value) {
  using namespace select_plan;
  switch (kind) {
    case kSelBool: return value != 0;
    case kSelI8:
    case kSelI16:
    case kSelI32:
    case kSelI64: return static_cast<typename std::make_signed<T>::type>(value) <= 0;
    default: return value == 0;  // the unsigned kinds
  }
}

// From kCount reads of T (selectors of 2, 4 or 8 bytes, or bytes not aligned like
// the vector), issued kSelectorReads at a time, then decoded.
constexpr int kSelectorReads = 4;

template <typename T, int kCount>
__device__ __forceinline__ SelectorMasks<kCount> masks_of_reads(const LaunchParams& p, int64_t element) {
  const char* sel = p.sel + element * static_cast<int64_t>(sizeof(T));
  SelectorMasks<kCount> masks;
  TORCHCOND_UNROLL
  for (int group = 0; group < kCount; group += kSelectorReads) {
    T values[kSelectorReads] = {};
    TORCHCOND_UNROLL
    for (int j = 0; j < kSelectorReads && group + j < kCount; ++j) values[j] = load<T>(sel + (group + j) * sizeof(T));
    uint32_t word = 0;
    TORCHCOND_UNROLL
    for (int j = 0; j < kSelectorReads && group + j < kCount; ++j) {
      word |= (takes_first(p.sel_kind, values[j]) ? 0xffu : 0u) << (8 * j);
    }
    masks.words[group / 4] = word;
  }
  return masks;
}

template <int kCount>
__device__ __forceinline__ SelectorMasks<kCount> masks_of_elements(const LaunchParams& p, int64_t element) {
  switch (p.sel_itemsize) {
    case 1: return masks_of_reads<uint8_t, kCount>(p, element);
    case 2: return masks_of_reads<uint16_t, kCount>(p, element);
    case 4: return masks_of_reads<uint32_t, kCount>(p, element);
    default: return masks_of_reads<uint64_t, kCount>(p, element);
  }
}

// The bits of value word `word` (of a 16-byte vector of kItemBytes items) that come
// from branch 0.
template <int kItemBytes, int kCount>
__device__ __forceinline__ uint32_t value_mask(const SelectorMasks<kCount>& masks, int word) {
  if constexpr (kItemBytes == 1) {
    return masks.words[word];
  } else if constexpr (kItemBytes == 2) {
    const uint32_t pair = masks.words[word / 2] >> (16 * (word % 2));  // elements 2 word and 2 word + 1
    return (pair & 0xffu) * 0x0101u | (pair & 0xff00u) * 0x010100u;
  } else {
    const int element = word * 4 / kItemBytes;
    return ((masks.words[0] >> (8 * element)) & 0xffu) * 0x01010101u;
  }
}

__device__ __forceinline__ uint32_t blend_word(uint32_t taken, uint32_t other, uint32_t mask) {
  return (taken & mask) | (other & ~mask);
}

// One vector: `taken` keeps branch 0's items where the masks say so, else branch 1's.
template <int kItemBytes, int kCount, typename Vector>
__device__ __forceinline__ void blend(Vector& taken, const Vector& other, const SelectorMasks<kCount>& masks) {
  if constexpr (kCount == 1) {
    if ((masks.words[0] & 0xffu) == 0) taken = other;
  } else {
    taken.x = blend_word(taken.x, other.x, value_mask<kItemBytes>(masks, 0));
    taken.y = blend_word(taken.y, other.y, value_mask<kItemBytes>(masks, 1));
    taken.z = blend_word(taken.z, other.z, value_mask<kItemBytes>(masks, 2));
    taken.w = blend_word(taken.w, other.w, value_mask<kItemBytes>(masks, 3));
  }
}

// Vector plan: kCount items of Item per vector (16 bytes, or one item), two branches,
// all contiguous. A thread loads kLoads vectors of each branch (and their
// selector bytes, in one load each where aligned) before it waits for any, then
// blends and stores. The elements after the last whole vector are done one per
// thread by the last tile. kSelVector: the selector bytes of a vector are one load
// (a one-byte selector aligned like the vectors); else kCount reads.
template <typename Item, int kCount, bool kSelVector>
__device__ __forceinline__ void vector_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  using Vector = typename ItemOf<static_cast<int>(sizeof(Item)) * kCount>::type;  // uint4, or Item
  constexpr int64_t kVectorBytes = sizeof(Vector);
  constexpr int kItemBytes = sizeof(Item);
  // Vectors of one item below 16 bytes (values not aligned to 16): as many loads in
  // flight as the other plans, rather than as many bytes.
  constexpr int kLoads = kVectorBytes < 16 ? kInFlight : kVectorsInFlight;
  const char* first_branch = entry_base(branch_entry(p, d, 0));
  const char* second_branch = entry_base(branch_entry(p, d, 1));
  const int64_t vectors = d.numel / kCount;
  const int64_t begin = local * d.tile_size;
  const int64_t end = min(begin + d.tile_size, vectors);
  TORCHCOND_ROLLED
  for (int64_t first = begin + threadIdx.x; first < end; first += kLoads * kThreads) {
    SelectorMasks<kCount> masks[kLoads] = {};
    Vector taken[kLoads] = {}, other[kLoads] = {};
    TORCHCOND_UNROLL
    for (int k = 0; k < kLoads; ++k) {
      const int64_t vector = first + k * kThreads;
      if (vector >= end) continue;
      if (kSelVector) masks[k] = masks_of_bytes<kCount>(p.sel + vector * kCount);
      taken[k] = load<Vector>(first_branch + vector * kVectorBytes);
      other[k] = load<Vector>(second_branch + vector * kVectorBytes);
    }
    TORCHCOND_UNROLL
    for (int k = 0; k < kLoads; ++k) {
      const int64_t vector = first + k * kThreads;
      if (vector >= end) continue;
      if (kSelVector) {
        decode_bytes<kCount>(p, masks[k]);
      } else {
        masks[k] = masks_of_elements<kCount>(p, vector * kCount);
      }
      blend<kItemBytes>(taken[k], other[k], masks[k]);
      store<Vector>(d.out + vector * kVectorBytes, taken[k]);
    }
  }
  const int64_t tail = d.numel - vectors * kCount;
  if (end == vectors && threadIdx.x < tail) {
    const int64_t element = vectors * kCount + threadIdx.x;
    const char* base = branch_at(p, element) == 0 ? first_branch : second_branch;
    store<Item>(d.out + element * kItemBytes, load<Item>(base + element * kItemBytes));
  }
}

// Element plan: one element per access, any strides. Each thread reads the selector
// of kInFlight elements, then loads each element from the branch it picks, then
// stores: two dependent steps per round, each with kInFlight loads in flight.
// Only the chosen branch is read, so select_n over many branches reads no more than
// the elements it returns. Outputs of 2^32 elements or more (64-bit index arithmetic,
// which takes twice the registers) keep two loads in flight, to stay within 64
// registers without spilling.
template <typename I, typename Item>
__device__ __forceinline__ void element_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  constexpr int kLoads = sizeof(I) == 8 ? 2 : kInFlight;
  const int ndim = d.ndim;
  const int64_t* sizes = output_sizes(p, d);
  const int64_t* sel_strides = sizes + ndim;
  const int64_t begin = local * d.tile_size;
  const int64_t end = min(begin + d.tile_size, d.numel);
  TORCHCOND_ROLLED
  for (int64_t first = begin + threadIdx.x; first < end; first += kLoads * kThreads) {
    uint64_t bits[kLoads] = {};
    TORCHCOND_UNROLL
    for (int k = 0; k < kLoads; ++k) {
      const int64_t element = first + k * kThreads;
      if (element < end) bits[k] = selector_bits(p, offset_of<I>(static_cast<I>(element), sizes, sel_strides, ndim));
    }
    Item held[kLoads] = {};
    uint32_t loaded = 0;  // bit k: element k was loaded (in range, its branch in the window)
    TORCHCOND_UNROLL
    for (int k = 0; k < kLoads; ++k) {
      const int64_t element = first + k * kThreads;
      if (element >= end) continue;
      const int64_t branch = branch_of(p, bits[k]);
      if (!in_window(d, branch)) continue;
      const int64_t* entry = branch_entry(p, d, branch);
      const int64_t offset = offset_of<I>(static_cast<I>(element), sizes, entry + 1, ndim);
      held[k] = load<Item>(entry_base(entry) + offset * static_cast<int64_t>(sizeof(Item)));
      loaded |= 1u << k;
    }
    TORCHCOND_UNROLL
    for (int k = 0; k < kLoads; ++k) {
      const int64_t element = first + k * kThreads;
      if ((loaded >> k) & 1) store<Item>(d.out + element * static_cast<int64_t>(sizeof(Item)), held[k]);
    }
  }
}

// Element plan for values whose addresses are not multiples of their itemsize (views
// made at odd byte offsets): one element per thread, in accesses of d.unit bytes.
template <typename I>
__device__ __forceinline__ void unaligned_element_tile(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  const int ndim = d.ndim;
  const int64_t* sizes = output_sizes(p, d);
  const int64_t* sel_strides = sizes + ndim;
  const int64_t begin = local * d.tile_size;
  const int64_t end = min(begin + d.tile_size, d.numel);
  const int64_t itemsize = d.itemsize;
  TORCHCOND_ROLLED
  for (int64_t element = begin + threadIdx.x; element < end; element += kThreads) {
    const int64_t branch = branch_at(p, offset_of<I>(static_cast<I>(element), sizes, sel_strides, ndim));
    if (!in_window(d, branch)) continue;
    const int64_t* entry = branch_entry(p, d, branch);
    const int64_t offset = offset_of<I>(static_cast<I>(element), sizes, entry + 1, ndim);
    copy_element(d.out + element * itemsize, entry_base(entry) + offset * itemsize, d.itemsize, d.unit);
  }
}

__device__ __forceinline__ void rows_plan(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  switch (d.access) {
    case 16: rows_tile<uint4>(p, d, local); break;
    case 8: rows_tile<uint2>(p, d, local); break;
    case 4: rows_tile<uint32_t>(p, d, local); break;
    case 2: rows_tile<uint16_t>(p, d, local); break;
    default: rows_tile<uint8_t>(p, d, local); break;
  }
}

// 16-byte vectors where the addresses allow them, else one item per vector.
template <int kItemBytes, int kCount>
__device__ __forceinline__ void vector_plan_with(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  using Item = typename ItemOf<kItemBytes>::type;
  if (d.sel_vector != 0) {
    vector_tile<Item, kCount, true>(p, d, local);
  } else {
    vector_tile<Item, kCount, false>(p, d, local);
  }
}

template <int kItemBytes>
__device__ __forceinline__ void vector_plan_of(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  if (d.access == 16) {
    vector_plan_with<kItemBytes, 16 / kItemBytes>(p, d, local);
  } else {
    vector_plan_with<kItemBytes, 1>(p, d, local);
  }
}

__device__ __forceinline__ void vector_plan(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  switch (d.itemsize) {
    case 1: vector_plan_of<1>(p, d, local); break;
    case 2: vector_plan_of<2>(p, d, local); break;
    case 4: vector_plan_of<4>(p, d, local); break;
    case 8: vector_plan_of<8>(p, d, local); break;
    default: vector_plan_of<16>(p, d, local); break;
  }
}

template <typename I>
__device__ __forceinline__ void element_plan_of(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  if (d.unit != d.itemsize) {
    unaligned_element_tile<I>(p, d, local);
    return;
  }
  switch (d.itemsize) {
    case 1: element_tile<I, uint8_t>(p, d, local); break;
    case 2: element_tile<I, uint16_t>(p, d, local); break;
    case 4: element_tile<I, uint32_t>(p, d, local); break;
    case 8: element_tile<I, uint2>(p, d, local); break;
    default: element_tile<I, uint4>(p, d, local); break;
  }
}

// 32-bit index arithmetic when the output has fewer than 2^32 elements.
__device__ __forceinline__ void element_plan(const LaunchParams& p, const OutputDesc& d, int64_t local) {
  if (d.numel <= 0xffffffffLL) {
    element_plan_of<uint32_t>(p, d, local);
  } else {
    element_plan_of<uint64_t>(p, d, local);
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
    const OutputDesc& d = p.outs[detail::find_output(p, tile)];
    const int64_t local = tile - d.tile_begin;
    switch (d.mode) {
      case kRowsMode: detail::rows_plan(p, d, local); break;
      case kLineMode: detail::line_tile(p, d, local); break;
      case kVectorMode: detail::vector_plan(p, d, local); break;
      default: detail::element_plan(p, d, local); break;
    }
  }
}

// Blocks resident at once on a GPU with `sm_count` multiprocessors of which each holds
// `blocks_per_sm` blocks (from cudaOccupancyMaxActiveBlocksPerMultiprocessor).
inline int64_t resident_blocks(int sm_count, int blocks_per_sm) {
  return static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * (blocks_per_sm > 0 ? blocks_per_sm : kMinBlocksPerSM);
}

// Grid waves at most; the grid-stride loop covers the remaining tiles.
constexpr int64_t kGridWaves = 4;

// Host helper: blocks for a launch of `total_tiles` tiles. One block per tile up to
// kGridWaves full waves: a block that finishes is replaced by a fresh one, so every
// multiprocessor stays busy until the last tiles, and blocks do not all read, then
// all write, in step, as one wave of persistent blocks does on a small output. Past
// that, blocks take several tiles each (fewer block starts on large launches).
inline unsigned int grid_size(int64_t total_tiles, int sm_count, int blocks_per_sm) {
  const int64_t cap = resident_blocks(sm_count, blocks_per_sm) * kGridWaves;
  const int64_t n = total_tiles < cap ? total_tiles : cap;
  return static_cast<unsigned int>(n > 0 ? n : 1);
}

// Fewer than this many waves of tiles: tiles shrink (down to kMinTileBytes).
constexpr int64_t kMinWaves = 2;

// Host helper: output bytes per tile for a call writing `total_bytes`. 16 KB tiles
// give each thread four 16-byte loads in flight. A small call (a single output of a
// few MB) would have fewer tiles than twice the resident blocks, so some SMs would
// idle while others finish; halving the tile doubles the tiles, and 8 KB still gives
// each thread two loads in flight, which with the resident threads of an SM keeps more
// bytes in flight than DRAM latency times its share of the bandwidth.
inline int64_t tile_bytes_for(int64_t total_bytes, int sm_count, int blocks_per_sm) {
  const int64_t resident = resident_blocks(sm_count, blocks_per_sm);
  int64_t tile = kTileBytes;
  while (tile > kMinTileBytes && total_bytes < kMinWaves * resident * tile) tile /= 2;
  return tile;
}

}  // namespace TORCHCOND_CUDA_SELECT_NS
}  // namespace torchcond
