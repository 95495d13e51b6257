// CPU kernels of torchcond::select and torchcond::select_n.
//
// One at::parallel_for covers every output: the work is the concatenation of all
// outputs' bytes, split evenly among the threads (each thread's range is mapped back
// to element ranges of the outputs it touches). Within an output the range is walked
// line by line (a line is the innermost coalesced dimension, see select_plan.h):
//   * selector constant along the line (the batched-prefix and 0-d cases): read the
//     selector once, then copy the run from the chosen branch: memcpy when that
//     branch is contiguous along the line, else a strided copy;
//   * selector varying along the line (its shape reaches the innermost dimension):
//     branch numbers for a chunk of elements first, then one gather per element.
// Elements are copied as raw bytes of their itemsize (1, 2, 4, 8, 16), so every dtype
// is handled by five instantiations. Only the chosen branch's bytes are read.
//
// Large calls (>= kStreamBytes written) copy contiguous runs with non-temporal stores
// (x86 SSE2) and prefetch the next line's selected source while copying the current
// one: with a batched selector, consecutive lines jump between the branches' tensors
// and the hardware prefetcher loses the stream at every jump. Small calls (< one
// grain) run on the calling thread without a parallel region. All sizes, strides
// and offsets are int64.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#define TORCHCOND_HAVE_STREAM 1
#else
#define TORCHCOND_HAVE_STREAM 0
#endif

#include "../select_common.h"

namespace torchcond {
namespace {

using select_plan::read_branch;

struct CpuOutput {
  char* out;
  int64_t numel;
  int64_t itemsize;
  int ndim;
  const int64_t* sizes;  // coalesced layout (select_plan::LayoutRef), strides in elements
  const int64_t* sel_strides;
  const int64_t* branch_strides;  // branch b's strides at branch_strides + b * array_len
  int array_len;
  const char* const* ptrs;  // data pointer of each branch's value
  bool sel_const_per_line;
};

template <int64_t N>
inline void copy_strided(char* dst, const char* src, int64_t n, int64_t src_stride) {
  for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j * N, src + j * src_stride, N);
}

// memcpy with non-temporal (cache-bypassing) stores for the 16-byte-aligned body of
// dst. Used when a call writes more than fits in cache: the output is fresh, so
// regular stores would first read every destination line (read for ownership),
// which costs a third of the memory traffic of a copy.
inline void stream_copy(char* dst, const char* src, int64_t nbytes, const char* next, int64_t next_bytes) {
#if TORCHCOND_HAVE_STREAM
  const int64_t head = std::min<int64_t>(nbytes, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  nbytes -= head;
  const int64_t body = nbytes & ~int64_t(63);
  for (int64_t k = 0; k < body; k += 64) {
    // The next line's source (chosen per line, so it may be another tensor): the
    // hardware prefetcher does not follow such jumps; one line ahead hides them.
    if (k < next_bytes) _mm_prefetch(next + k, _MM_HINT_T0);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 48), d);
  }
  std::memcpy(dst + body, src + body, nbytes - body);
#else
  (void)next;
  (void)next_bytes;
  std::memcpy(dst, src, nbytes);
#endif
}

inline void stream_fence() {
#if TORCHCOND_HAVE_STREAM
  _mm_sfence();
#endif
}

// Copies a run of n elements; `next`/`next_bytes`: the following run's contiguous
// source to prefetch (streaming mode only; nullptr/0 when there is none).
inline void copy_run(char* dst, const char* src, int64_t n, int64_t src_stride, int64_t itemsize, bool stream,
                     const char* next = nullptr, int64_t next_bytes = 0) {
  if (src_stride == itemsize) {
    if (stream && n * itemsize >= 256) {
      stream_copy(dst, src, n * itemsize, next, next_bytes);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(n * itemsize));
    }
    return;
  }
  switch (itemsize) {
    case 1: copy_strided<1>(dst, src, n, src_stride); break;
    case 2: copy_strided<2>(dst, src, n, src_stride); break;
    case 4: copy_strided<4>(dst, src, n, src_stride); break;
    case 8: copy_strided<8>(dst, src, n, src_stride); break;
    default: copy_strided<16>(dst, src, n, src_stride); break;
  }
}

// Branch numbers of n selector elements (stride in bytes).
template <typename T>
inline void branches_of(int32_t* out, const char* sel, int64_t stride, int64_t n, int64_t num_branches, bool is_bool) {
  if (is_bool) {
    for (int64_t j = 0; j < n; ++j) out[j] = *reinterpret_cast<const uint8_t*>(sel + j * stride) != 0 ? 0 : 1;
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    T v;
    std::memcpy(&v, sel + j * stride, sizeof(T));
    if constexpr (std::is_signed_v<T>) {
      const int64_t value = static_cast<int64_t>(v);
      out[j] = static_cast<int32_t>(v < 0 ? 0 : (value >= num_branches ? num_branches - 1 : value));
    } else {
      const bool above = static_cast<uint64_t>(v) >= static_cast<uint64_t>(num_branches);
      out[j] = static_cast<int32_t>(above ? num_branches - 1 : static_cast<int64_t>(v));
    }
  }
}

inline void branches_of_kind(select_plan::SelKind kind, int32_t* out, const char* sel, int64_t stride, int64_t n,
                             int64_t num_branches) {
  using namespace select_plan;
  switch (kind) {
    case kSelBool: branches_of<uint8_t>(out, sel, stride, n, num_branches, true); break;
    case kSelU8: branches_of<uint8_t>(out, sel, stride, n, num_branches, false); break;
    case kSelI8: branches_of<int8_t>(out, sel, stride, n, num_branches, false); break;
    case kSelI16: branches_of<int16_t>(out, sel, stride, n, num_branches, false); break;
    case kSelU16: branches_of<uint16_t>(out, sel, stride, n, num_branches, false); break;
    case kSelI32: branches_of<int32_t>(out, sel, stride, n, num_branches, false); break;
    case kSelU32: branches_of<uint32_t>(out, sel, stride, n, num_branches, false); break;
    case kSelI64: branches_of<int64_t>(out, sel, stride, n, num_branches, false); break;
    default: branches_of<uint64_t>(out, sel, stride, n, num_branches, false); break;
  }
}

// dst[j] = branch b[j]'s element j, for n elements of one line.
template <int64_t N>
inline void gather(char* dst, const int32_t* b, const char* const* base, const int64_t* stride, int64_t n) {
  for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j * N, base[b[j]] + j * stride[b[j]], N);
}

constexpr int64_t kChunk = 512;  // elements per branch-number batch

// Writes elements [e0, e1) of one output (row-major order of the output).
void run_range(const CpuOutput& output, const char* sel, int64_t sel_itemsize, select_plan::SelKind kind,
               int64_t num_branches, int64_t e0, int64_t e1, bool stream) {
  const int nd = output.ndim;
  const int64_t line_len = output.sizes[nd - 1];
  const int64_t itemsize = output.itemsize;
  int64_t line = e0 / line_len;
  int64_t col = e0 % line_len;
  auto bstride = [&](int64_t b, int d) { return output.branch_strides[b * output.array_len + d] * itemsize; };  // bytes
  auto sstride = [&](int d) { return output.sel_strides[d] * sel_itemsize; };

  // Coordinates of the line over dims [0, nd-1), and every operand's byte offset there.
  c10::SmallVector<int64_t, 8> coord(std::max(nd - 1, 0), 0);
  c10::SmallVector<int64_t, 8> boff(num_branches, 0);
  c10::SmallVector<int64_t, 8> last_stride(num_branches);
  c10::SmallVector<const char*, 8> base(num_branches);
  int64_t soff = 0;
  for (int d = nd - 2; d >= 0; --d) {
    coord[d] = line % output.sizes[d];
    line /= output.sizes[d];
    soff += coord[d] * sstride(d);
    for (int64_t b = 0; b < num_branches; ++b) boff[b] += coord[d] * bstride(b, d);
  }
  const int64_t s_last = sstride(nd - 1);
  for (int64_t b = 0; b < num_branches; ++b) last_stride[b] = bstride(b, nd - 1);

  char* dst = output.out + e0 * itemsize;
  int64_t e = e0;
  // Next line: odometer over dims [0, nd-1).
  auto advance = [&]() {
    for (int d = nd - 2; d >= 0; --d) {
      soff += sstride(d);
      for (int64_t b = 0; b < num_branches; ++b) boff[b] += bstride(b, d);
      if (++coord[d] < output.sizes[d]) break;
      soff -= sstride(d) * output.sizes[d];
      for (int64_t b = 0; b < num_branches; ++b) boff[b] -= bstride(b, d) * output.sizes[d];
      coord[d] = 0;
    }
  };

  if (output.sel_const_per_line) {
    // One branch per line. The next line's branch is read one line ahead, so its
    // source can be prefetched while the current line is copied.
    int64_t b = read_branch(kind, sel + soff, num_branches);
    const char* src = output.ptrs[b] + boff[b] + col * last_stride[b];
    while (e < e1) {
      const int64_t n = std::min(line_len - col, e1 - e);
      const int64_t stride = last_stride[b];
      const int64_t n_next = std::min(line_len, e1 - e - n);
      int64_t b_next = b;
      const char* src_next = nullptr;
      if (n_next > 0) {
        advance();
        b_next = read_branch(kind, sel + soff, num_branches);
        src_next = output.ptrs[b_next] + boff[b_next];
      }
      const bool next_contig = src_next != nullptr && last_stride[b_next] == itemsize;
      copy_run(dst, src, n, stride, itemsize, stream, next_contig ? src_next : nullptr,
               next_contig ? n_next * itemsize : 0);
      e += n;
      dst += n * itemsize;
      b = b_next;
      src = src_next;
      col = 0;
    }
    return;
  }

  int32_t bidx[kChunk];
  while (e < e1) {
    const int64_t n = std::min(line_len - col, e1 - e);
    for (int64_t b = 0; b < num_branches; ++b) base[b] = output.ptrs[b] + boff[b] + col * last_stride[b];
    const char* s = sel + soff + col * s_last;
    for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
      const int64_t m = std::min(kChunk, n - j0);
      branches_of_kind(kind, bidx, s + j0 * s_last, s_last, m, num_branches);
      char* d = dst + j0 * itemsize;
      const char* const* bb = base.data();  // relative to this chunk
      switch (itemsize) {
        case 1: gather<1>(d, bidx, bb, last_stride.data(), m); break;
        case 2: gather<2>(d, bidx, bb, last_stride.data(), m); break;
        case 4: gather<4>(d, bidx, bb, last_stride.data(), m); break;
        case 8: gather<8>(d, bidx, bb, last_stride.data(), m); break;
        default: gather<16>(d, bidx, bb, last_stride.data(), m); break;
      }
      for (int64_t b = 0; b < num_branches; ++b) base[b] += m * last_stride[b];
    }
    e += n;
    dst += n * itemsize;
    col = 0;
    if (e < e1) advance();
  }
}

// Bytes per parallel task at least: below this one thread does everything.
constexpr int64_t kGrainBytes = 64 * 1024;
// Calls writing more than this use non-temporal stores for contiguous runs. Smaller
// outputs are left in cache for whatever reads them next. A fixed size, about one
// L3 slice of a current server CPU: the cache size the OS reports is unreliable in
// VMs (sysconf(_SC_LEVEL3_CACHE_SIZE) said 384 MiB on a 2-core VM with a 32 MiB L3).
constexpr int64_t kStreamBytes = 16 * 1024 * 1024;

std::vector<at::Tensor> run_cpu(SelectCall call) {
  const int64_t num_branches = call.num_branches;
  const char* sel = static_cast<const char*>(call.selector.const_data_ptr());
  const int64_t sel_itemsize = static_cast<int64_t>(call.selector.element_size());
  const size_t n_work = call.work.size();
  c10::SmallVector<CpuOutput, 16> outs(n_work);
  c10::SmallVector<const char*, 32> ptrs(n_work * num_branches);
  c10::SmallVector<int64_t, 17> prefix(n_work + 1, 0);  // byte offsets of the outputs in the concatenation
  for (size_t i = 0; i < n_work; ++i) {
    const SelectOutput& w = call.work[i];
    const select_plan::LayoutRef layout = call.layout(w);
    CpuOutput& output = outs[i];
    output.out = static_cast<char*>(w.out.data_ptr());
    output.numel = w.out.numel();
    output.itemsize = w.itemsize;
    output.ndim = layout.ndim;
    output.array_len = layout.array_len;
    output.sizes = layout.sizes();
    output.sel_strides = layout.sel_strides();
    output.branch_strides = layout.branch_strides(0);
    for (int64_t b = 0; b < num_branches; ++b) {
      ptrs[i * num_branches + b] = static_cast<const char*>(call.value(b, w).const_data_ptr());
    }
    output.ptrs = ptrs.data() + i * num_branches;
    output.sel_const_per_line = layout.selector_constant_per_line();
    prefix[i + 1] = prefix[i] + output.numel * output.itemsize;
  }
  const int64_t total = prefix[n_work];
  if (total > 0) {
    const select_plan::SelKind kind = call.sel_kind;
    const bool stream = total >= kStreamBytes;
    auto body = [&](int64_t b0, int64_t b1) {
      // First output whose byte range ends after b0.
      size_t i = std::upper_bound(prefix.begin(), prefix.end(), b0) - prefix.begin() - 1;
      for (; i < n_work && prefix[i] < b1; ++i) {
        const CpuOutput& output = outs[i];
        const int64_t lo = std::max(b0, prefix[i]) - prefix[i];
        const int64_t hi = std::min(b1, prefix[i + 1]) - prefix[i];
        // Thread boundaries may fall inside an element: round both ends up, which
        // partitions the elements among the threads.
        const int64_t e0 = (lo + output.itemsize - 1) / output.itemsize;
        const int64_t e1 = (hi + output.itemsize - 1) / output.itemsize;
        if (e0 < e1) run_range(output, sel, sel_itemsize, kind, num_branches, e0, e1, stream);
      }
      if (stream) stream_fence();  // order the streamed stores before the join
    };
    if (total < kGrainBytes) {
      body(0, total);  // small: no parallel region at all
    } else {
      at::parallel_for(0, total, kGrainBytes, body);
    }
  }
  return std::move(call.outputs);
}

std::vector<at::Tensor> select_cpu(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values) {
  return run_cpu(prepare_select_bool(pred, true_values, false_values));
}

std::vector<at::Tensor> select_n_cpu(const at::Tensor& index, at::TensorList cases, int64_t num_branches) {
  return run_cpu(prepare_select_n(index, cases, num_branches));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchcond, CPU, m) {
  m.impl("select", &select_cpu);
  m.impl("select_n", &select_n_cpu);
}

}  // namespace torchcond
