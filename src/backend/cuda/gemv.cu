// Bandwidth-bound skinny GEMM for decode (gemv.h): the launchers. The kernels and the stages they
// run are in gemv_kernel.cuh, whose header states the algorithm. Here each product goes to one
// kernel and instance (launch(): row_kernel for one row in a one-batch shape whose column groups
// fit one resident wave, norm_rows_kernel at 2-8 rows where norm_rows_supported, gemv_kernel
// otherwise; launch_rope and launch_swiglu for the two epilogue kernels), its grid is sized from
// the SM count and the cached occupancy (stage 1), and the launches are counted (launch_stats).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/launch.cuh"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

namespace splice::cuda::gemv {
namespace {

constexpr int kMaxDevices = 64;  // per-device occupancy caches

int sm_count(int device) { return device_facts(device).sm_count; }

struct Grid {
  unsigned blocks = 0, threads = 0;
  // The prologue's shared rows (stage 0): [rows, k_pad] elements of T, `smem` bytes (0 without a
  // prologue), and whether its global reads may use 16-byte vectors.
  std::int64_t k_pad = 0;
  unsigned smem = 0;
  bool prologue_vectorized = false;
  bool norm_direct = false;        // rms_norm's weight read as T chunks (in_dtype, unit stride)
  bool register_prologue = false;  // stage 0 in registers (smem then 0)
  int slots = 0;  // > 0: the one-batch instance with kSlots = slots (one row, one batch covers k)
};

// CTAs of `kernel` with `threads` threads one SM holds at once (>= 1), cached per kernel
// instantiation (each has its own `cache`), device and block size (1, 2 or 4 warps). Prologue
// launches (smem > 0) depend on their shared-memory size too: cached per (device, threads, smem)
// in `by_smem` (a few distinct k per model).
constexpr int kBlockSizes = 3;
struct OccupancyCache {
  std::atomic<int> plain[kMaxDevices][kBlockSizes] = {};  // read without the mutex
  std::mutex mutex;
  std::map<std::tuple<int, unsigned, unsigned>, int> by_smem;
  bool smem_attribute_set[kMaxDevices] = {};
};
int resident_ctas_per_sm(const void* kernel, unsigned threads, unsigned smem, int device,
                         OccupancyCache& cache) {
  const int slot = threads <= kWarpSize ? 0 : threads <= 2 * kWarpSize ? 1 : 2;
  if (smem == 0 && device < kMaxDevices) {
    const int cached = cache.plain[device][slot].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  std::unique_lock<std::mutex> lock(cache.mutex, std::defer_lock);
  if (smem > 0) {
    lock.lock();
    const auto it = cache.by_smem.find({device, threads, smem});
    if (it != cache.by_smem.end()) return it->second;
  }
  int ctas = 0;
  SPLICE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &ctas, kernel, static_cast<int>(threads), static_cast<std::size_t>(smem)));
  ctas = std::max(ctas, 1);
  if (smem > 0)
    cache.by_smem[{device, threads, smem}] = ctas;
  else if (device < kMaxDevices)
    cache.plain[device][slot].store(ctas, std::memory_order_relaxed);
  return ctas;
}

std::atomic<std::uint64_t> g_launches{0}, g_pdl_launches{0}, g_prefetch_launches{0},
    g_prologue_launches{0}, g_row_launches{0}, g_register_prologue_launches{0};

// The kRows instance a product of `rows` rows runs (1, 2, 4 or kMaxRows).
constexpr int row_bucket(int rows) {
  return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : kMaxRows;
}

template <typename T, int kRows, int kCols, int kVec, Prologue kPro, int kSlots = 0>
void launch_instance(const Params& p, Grid g, int device, cudaStream_t stream) {
  const auto kernel = gemv_kernel<T, kRows, kCols, kVec, kPro, kSlots>;
  static OccupancyCache cache;
  if constexpr (kPro != Prologue::none) {
    // Dynamic shared memory beyond the default 48 KiB needs the per-function opt-in (once per
    // device, for the largest size a prologue may take).
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (device < kMaxDevices && !cache.smem_attribute_set[device]) {
      SPLICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kMaxPrologueBytes)));
      cache.smem_attribute_set[device] = true;
    }
  }
  // Stage 1: at most one resident wave; each warp loops over its groups.
  const std::int64_t wave =
      static_cast<std::int64_t>(sm_count(device)) *
      resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), g.threads, g.smem, device, cache);
  std::int64_t blocks = p.one_warp_per_group ? g.blocks : std::min<std::int64_t>(g.blocks, wave);
  if (p.max_ctas > 0) blocks = std::min<std::int64_t>(blocks, p.max_ctas);
  // Stage 6: launch.cuh's launcher (the PDL attribute unless disabled or the legacy stream).
  const bool single_wave = blocks <= wave;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (stream != nullptr && pdl_enabled()) g_pdl_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.w_constant) g_prefetch_launches.fetch_add(1, std::memory_order_relaxed);
  if (kPro != Prologue::none) g_prologue_launches.fetch_add(1, std::memory_order_relaxed);
  const detail::LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(g.threads), g.smem};
  detail::launch_kernel(kernel, shape, stream, p, single_wave, g.k_pad, g.prologue_vectorized,
                        g.norm_direct, g.register_prologue);
}

// The decode-row kernel (row_kernel) for launch()'s grid shape: kCols columns per warp, warps
// per CTA (4, 2, 1) so that there are at least as many CTAs as SMs. False (nothing launched)
// when the grid is more than one resident wave; the caller then takes gemv_kernel.
template <typename T, int kCols, int kSlots, Prologue kPro>
bool launch_row_instance(const Params& p, int device, cudaStream_t stream) {
  const auto kernel = row_kernel<T, kCols, kSlots, kPro>;
  static OccupancyCache cache;
  const std::int64_t sms = sm_count(device);
  const std::int64_t groups = (p.n + kCols - 1) / kCols;
  int warps_per_cta = kMaxWarpsPerCta;
  while (warps_per_cta > 1 && (groups + warps_per_cta - 1) / warps_per_cta < sms) warps_per_cta /= 2;
  const unsigned threads = static_cast<unsigned>(warps_per_cta * kWarpSize);
  const std::int64_t blocks = (groups + warps_per_cta - 1) / warps_per_cta;
  // silu_mul: h and b's staging area, [2, num_vec] vectors (6 KiB at K = 1536 bf16).
  const unsigned smem =
      kPro == Prologue::silu_mul ? static_cast<unsigned>(2 * (p.k * sizeof(T))) : 0u;
  const std::int64_t wave =
      sms * resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), threads, smem, device,
                                 cache);
  if (blocks > wave) return false;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  g_row_launches.fetch_add(1, std::memory_order_relaxed);
  if (stream != nullptr && pdl_enabled()) g_pdl_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.w_constant) g_prefetch_launches.fetch_add(1, std::memory_order_relaxed);
  if (kPro != Prologue::none) g_prologue_launches.fetch_add(1, std::memory_order_relaxed);
  const detail::LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(threads), smem};
  detail::launch_kernel(kernel, shape, stream, p);
  return true;
}

template <typename T, Prologue kPro>
bool launch_row(const Params& p, int cols, int slots, int device, cudaStream_t stream) {
  if (slots == kLargeSlots) {
    if (cols == 1) return launch_row_instance<T, 1, kLargeSlots, kPro>(p, device, stream);
    if (cols == 2) return launch_row_instance<T, 2, kLargeSlots, kPro>(p, device, stream);
    return false;  // 4 columns x 6 slots is over the load budget (launch() never asks)
  }
  if (cols == 1) return launch_row_instance<T, 1, kSmallSlots, kPro>(p, device, stream);
  if (cols == 2) return launch_row_instance<T, 2, kSmallSlots, kPro>(p, device, stream);
  return launch_row_instance<T, kMaxCols, kSmallSlots, kPro>(p, device, stream);
}

template <typename T>
bool launch_row_prologue(const Params& p, int cols, int slots, int device, cudaStream_t stream) {
  switch (p.prologue) {
    case Prologue::rms_norm:
      return launch_row<T, Prologue::rms_norm>(p, cols, slots, device, stream);
    case Prologue::silu_mul:
      return launch_row<T, Prologue::silu_mul>(p, cols, slots, device, stream);
    default:
      return launch_row<T, Prologue::none>(p, cols, slots, device, stream);
  }
}

template <typename T, int kRows, int kCols, Prologue kPro>
void launch_vec(const Params& p, Grid g, bool vectorized, int device, cudaStream_t stream) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  if (vectorized) {
    if constexpr (kRows == 1) {
      if (g.slots == kSmallSlots)
        return launch_instance<T, kRows, kCols, kVec, kPro, kSmallSlots>(p, g, device, stream);
      if constexpr (unroll_for(kRows, kCols) >= kLargeSlots) {
        if (g.slots == kLargeSlots)
          return launch_instance<T, kRows, kCols, kVec, kPro, kLargeSlots>(p, g, device, stream);
      }
    }
    launch_instance<T, kRows, kCols, kVec, kPro>(p, g, device, stream);
  } else {
    launch_instance<T, kRows, kCols, 1, kPro>(p, g, device, stream);
  }
}

template <typename T, int kRows, Prologue kPro>
void launch_cols(const Params& p, int cols, Grid g, bool vectorized, int device,
                 cudaStream_t stream) {
  switch (cols) {
    case 1:
      return launch_vec<T, kRows, 1, kPro>(p, g, vectorized, device, stream);
    case 2:
      return launch_vec<T, kRows, 2, kPro>(p, g, vectorized, device, stream);
    default:
      return launch_vec<T, kRows, kMaxCols, kPro>(p, g, vectorized, device, stream);
  }
}

template <typename T, Prologue kPro>
void launch_rows(const Params& p, int cols, Grid g, bool vectorized, int device,
                 cudaStream_t stream) {
  switch (row_bucket(p.rows)) {
    case 1:
      return launch_cols<T, 1, kPro>(p, cols, g, vectorized, device, stream);
    case 2:
      return launch_cols<T, 2, kPro>(p, cols, g, vectorized, device, stream);
    case 4:
      return launch_cols<T, 4, kPro>(p, cols, g, vectorized, device, stream);
    default:
      return launch_cols<T, kMaxRows, kPro>(p, cols, g, vectorized, device, stream);
  }
}

template <typename T>
void launch_prologue(const Params& p, int cols, Grid g, bool vectorized, int device,
                     cudaStream_t stream) {
  switch (p.prologue) {
    case Prologue::rms_norm:
      return launch_rows<T, Prologue::rms_norm>(p, cols, g, vectorized, device, stream);
    case Prologue::silu_mul:
      return launch_rows<T, Prologue::silu_mul>(p, cols, g, vectorized, device, stream);
    default:
      return launch_rows<T, Prologue::none>(p, cols, g, vectorized, device, stream);
  }
}

// Elements of one shared prologue row: k rounded up to whole 16-byte vectors.
std::int64_t padded_k(std::int64_t k, DType dtype) {
  const std::int64_t per_vector = kVectorBytes / static_cast<std::int64_t>(dtype_size(dtype));
  return (k + per_vector - 1) / per_vector * per_vector;
}

// Shared memory of a prologue: the rows, plus k_pad fp32 norm weights (counted for both
// prologues, so one limit serves both).
std::int64_t prologue_bytes(std::int64_t rows, std::int64_t k, DType dtype) {
  const std::int64_t k_pad = padded_k(k, dtype);
  return rows * k_pad * static_cast<std::int64_t>(dtype_size(dtype)) +
         k_pad * static_cast<std::int64_t>(sizeof(float));
}

bool aligned(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % kVectorBytes == 0; }

// Stage 1's columns per warp of a launch with n columns on `sms` SMs (the largest of 4, 2, 1
// that still gives kTargetWarpsPerSm column groups per SM).
int default_cols(std::int64_t n, std::int64_t sms) {
  int cols = kMaxCols;
  while (cols > 1 && (n + cols - 1) / cols < kTargetWarpsPerSm * sms) cols /= 2;
  return cols;
}

// The grid of the one-row pair kernels (rope_pairs, swiglu_pairs): one warp per pair, warps per
// CTA (4, 2, 1) so that there are at least as many CTAs as SMs (launch()'s rule for its column
// groups), and whether that grid is one resident wave (the kernels' `single_wave` argument).
struct PairGrid {
  std::int64_t blocks;
  unsigned threads;
  bool single_wave;
};
PairGrid pair_grid(const void* kernel, std::int64_t pairs, int device, OccupancyCache& cache) {
  const std::int64_t sms = sm_count(device);
  int warps_per_cta = kMaxWarpsPerCta;
  while (warps_per_cta > 1 && (pairs + warps_per_cta - 1) / warps_per_cta < sms) warps_per_cta /= 2;
  PairGrid g;
  g.threads = static_cast<unsigned>(warps_per_cta * kWarpSize);
  g.blocks = (pairs + warps_per_cta - 1) / warps_per_cta;
  g.single_wave = g.blocks <= sms * resident_ctas_per_sm(kernel, g.threads, 0, device, cache);
  return g;
}

std::atomic<std::uint64_t> g_rope_launches{0};

template <typename T, int kSlots, bool kPartials>
void launch_rope_instance(const RopeParams& p, int pairs, int device, cudaStream_t stream) {
  const auto kernel = rope_pairs_kernel<T, kSlots, kPartials>;
  static OccupancyCache cache;
  const PairGrid g = pair_grid(reinterpret_cast<const void*>(kernel), pairs, device, cache);
  g_rope_launches.fetch_add(1, std::memory_order_relaxed);
  detail::launch_kernel(kernel, dim3(static_cast<unsigned>(g.blocks)), dim3(g.threads), stream, p,
                        g.single_wave);
}

template <typename T, bool kPartials>
void launch_rope_slots(const RopeParams& p, int pairs, int device, cudaStream_t stream) {
  constexpr std::int64_t kVec = kVectorBytes / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t num_vec = p.product.k / kVec;
  if (num_vec <= static_cast<std::int64_t>(kSmallSlots) * kWarpSize)
    return launch_rope_instance<T, kSmallSlots, kPartials>(p, pairs, device, stream);
  if (num_vec <= static_cast<std::int64_t>(kLargeSlots) * kWarpSize)
    return launch_rope_instance<T, kLargeSlots, kPartials>(p, pairs, device, stream);
  launch_rope_instance<T, kRopeMaxSlots, kPartials>(p, pairs, device, stream);
}

std::atomic<std::uint64_t> g_swiglu_launches{0};

// Stage 2's one-batch slots launch() gives a one-row product of n columns of length k (of
// 16-byte vectors) at its columns per warp `cols`: the smaller of kSmallSlots, kLargeSlots that
// covers the row within unroll_for(1, cols); 0 when neither does (launch() then takes the
// general batch loop and the shared-memory prologue).
int one_batch_slots(std::int64_t k, DType dtype, int cols) {
  const std::int64_t row_vectors =
      k / (kVectorBytes / static_cast<std::int64_t>(dtype_size(dtype)));
  for (const int slots : {kSmallSlots, kLargeSlots})
    if (row_vectors <= static_cast<std::int64_t>(slots) * kWarpSize && slots <= unroll_for(1, cols))
      return slots;
  return 0;
}

template <typename T, int kSlots, bool kPartials>
void launch_swiglu_instance(const SwigluParams& p, int device, cudaStream_t stream) {
  const auto kernel = swiglu_pairs_kernel<T, kSlots, kPartials>;
  static OccupancyCache cache;
  // One warp per pair of output columns (launch()'s grid at 4 columns per warp).
  const PairGrid g =
      pair_grid(reinterpret_cast<const void*>(kernel), (p.inter + 1) / 2, device, cache);
  // launch()'s counters, as row_kernel counts itself, and this kernel's own.
  g_launches.fetch_add(1, std::memory_order_relaxed);
  g_row_launches.fetch_add(1, std::memory_order_relaxed);
  if (stream != nullptr && pdl_enabled()) g_pdl_launches.fetch_add(1, std::memory_order_relaxed);
  if (p.product.w_constant) g_prefetch_launches.fetch_add(1, std::memory_order_relaxed);
  g_prologue_launches.fetch_add(1, std::memory_order_relaxed);
  g_swiglu_launches.fetch_add(1, std::memory_order_relaxed);
  detail::launch_kernel(kernel, dim3(static_cast<unsigned>(g.blocks)), dim3(g.threads), stream, p,
                        g.single_wave);
}

template <typename T>
void launch_swiglu_typed(const SwigluParams& p, int slots, bool partials, int device,
                         cudaStream_t stream) {
  if (slots == kSmallSlots) {
    if (partials) return launch_swiglu_instance<T, kSmallSlots, true>(p, device, stream);
    return launch_swiglu_instance<T, kSmallSlots, false>(p, device, stream);
  }
  // kLargeSlots only within unroll_for(1, cols), i.e. at 1 or 2 columns per warp: partials.
  SPLICE_INTERNAL_CHECK(slots == kLargeSlots && partials, "gemv swiglu epilogue: slots ", slots,
                        " at ", partials ? "1-2" : "4", " columns per warp");
  launch_swiglu_instance<T, kLargeSlots, true>(p, device, stream);
}

std::atomic<std::uint64_t> g_norm_rows_launches{0}, g_plain_rows_launches{0};

// Rows past `rows` of a kernel's row bucket read row 0 (valid memory) and store nothing: their
// x, y and c point at row 0's.
void pad_rows(Params& p) {
  for (int r = p.rows; r < kMaxRows; ++r) {
    p.x[r] = p.x[0];
    p.y[r] = p.y[0];
    p.c[r] = p.c[0];
  }
}

// The most 16-byte vectors a row may have on norm_rows_kernel: kSmallSlots a lane (K <= 768 in
// 16-bit) at every row count.
std::int64_t norm_rows_max_vectors() { return static_cast<std::int64_t>(kSmallSlots) * kWarpSize; }

// Calls f.template operator()<T, kRows, kSlots>() for q's norm_rows_kernel instance: T from
// in_dtype (bf16 or f16), kRows the row bucket (2, 4, 8), kSlots 1 when one slot a lane covers
// the row, else kSmallSlots (norm_rows_max_vectors).
template <typename F>
decltype(auto) with_norm_rows_instance(const Params& q, F&& f) {
  const std::int64_t vec = kVectorBytes / static_cast<std::int64_t>(dtype_size(q.in_dtype));
  const bool one_slot = q.k / vec <= kWarpSize;
  const auto for_type = [&]<typename T>() -> decltype(auto) {
    if (q.rows > 4) {
      if (one_slot) return f.template operator()<T, 8, 1>();
      return f.template operator()<T, 8, kSmallSlots>();
    }
    if (q.rows > 2) {
      if (one_slot) return f.template operator()<T, 4, 1>();
      return f.template operator()<T, 4, kSmallSlots>();
    }
    if (one_slot) return f.template operator()<T, 2, 1>();
    return f.template operator()<T, 2, kSmallSlots>();
  };
  if (q.in_dtype == DType::bf16) return for_type.template operator()<__nv_bfloat16>();
  return for_type.template operator()<__half>();
}

// norm_rows_kernel's grid for p (one warp per four weight rows: a plain product's column group,
// or a SwiGLU pair; pair_grid's CTAs), and its launch when `launch`: counted as a prologue launch
// with its stage 0 in registers, and in its own counter (SwiGLU: swiglu_launches, else
// LaunchStats::norm_rows). p's rows past `rows` hold row 0's addresses (launch(), launch_swiglu).
template <typename P, typename T, int kRows, int kSlots, Prologue kPro>
PairGrid norm_rows_instance(const P& p, bool launch, int device, cudaStream_t stream) {
  constexpr bool kSwiglu = std::is_same_v<P, SwigluParams>;
  constexpr bool kRope = std::is_same_v<P, RopeParams>;
  const auto kernel = norm_rows_kernel<P, T, kRows, kSlots, kPro>;
  static OccupancyCache cache;
  const Params& q = product_of(p);
  std::int64_t groups;
  if constexpr (kSwiglu) {
    groups = (p.inter + 1) / 2;
  } else if constexpr (kRope) {
    groups = (q.n / 2 + 1) / 2;  // two RoPE pairs a warp
  } else {
    groups = (q.n + 3) / 4;
  }
  const PairGrid g = pair_grid(reinterpret_cast<const void*>(kernel), groups, device, cache);
  if (!launch) return g;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (stream != nullptr && pdl_enabled()) g_pdl_launches.fetch_add(1, std::memory_order_relaxed);
  if (q.w_constant) g_prefetch_launches.fetch_add(1, std::memory_order_relaxed);
  if constexpr (kPro == Prologue::rms_norm) {
    g_prologue_launches.fetch_add(1, std::memory_order_relaxed);
    g_register_prologue_launches.fetch_add(1, std::memory_order_relaxed);
    auto& counter = kSwiglu ? g_swiglu_launches : kRope ? g_rope_launches : g_norm_rows_launches;
    counter.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_plain_rows_launches.fetch_add(1, std::memory_order_relaxed);
  }
  detail::launch_kernel(kernel, dim3(static_cast<unsigned>(g.blocks)), dim3(g.threads), stream, p,
                        g.single_wave);
  return g;
}

// The most rows a product without a prologue takes on norm_rows_kernel: at 2-4 rows the default
// model's step gained 2-6% (perf.md run 348: B = 2 -5.6%, B = 4 -2.1%), at 5-8 it was level
// (run 350: +0.0 to +1.0%), so gemv_kernel keeps those and their instances are not built.
constexpr int kPlainRowsMaxRows = 4;

// The instance for p's prologue (a SwiGLU or RoPE product always has rms_norm's).
template <typename P, typename T, int kRows, int kSlots>
PairGrid norm_rows_for_prologue(const P& p, bool launch, int device, cudaStream_t stream) {
  if (product_of(p).prologue == Prologue::none) {
    if constexpr (std::is_same_v<P, Params> && kRows <= kPlainRowsMaxRows)
      return norm_rows_instance<P, T, kRows, kSlots, Prologue::none>(p, launch, device, stream);
  }
  return norm_rows_instance<P, T, kRows, kSlots, Prologue::rms_norm>(p, launch, device, stream);
}

template <typename P>
void launch_norm_rows(const P& p, int device, cudaStream_t stream) {
  with_norm_rows_instance(product_of(p), [&]<typename T, int kRows, int kSlots>() {
    norm_rows_for_prologue<P, T, kRows, kSlots>(p, /*launch=*/true, device, stream);
  });
}

// What norm_rows_kernel needs of a product's rows and weights (both epilogues): 16-bit x, w, norm
// weight and y of one dtype, unit strides, every x row, w row and the norm weight 16-byte
// aligned, k a whole number of vectors within norm_rows_max_vectors().
bool norm_rows_layout(const Params& q) {
  const bool sixteen_bit = q.in_dtype == DType::bf16 || q.in_dtype == DType::f16;
  const bool norm = q.prologue == Prologue::rms_norm;
  if (!sixteen_bit || q.out_dtype != q.in_dtype || q.rows < 2 || q.rows > kMaxRows || q.k < 1 ||
      q.n < 1 || q.n > 0x7fffffff || q.w == nullptr || q.w_row_stride < 0 ||
      (norm && (q.norm_weight == nullptr || q.norm_weight_dtype != q.in_dtype ||
                (q.norm_weight_stride != 1 && q.k > 1) || !aligned(q.norm_weight))))
    return false;
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(q.in_dtype));
  const std::int64_t vec = kVectorBytes / elem;
  if (q.k % vec != 0 || q.k / vec > norm_rows_max_vectors() || !aligned(q.w) ||
      (q.w_row_stride * elem) % kVectorBytes != 0)
    return false;
  for (int r = 0; r < q.rows; ++r)
    if (q.x[r] == nullptr || !aligned(q.x[r])) return false;
  return true;
}

}  // namespace

LaunchStats launch_stats() {
  LaunchStats s;
  s.launches = g_launches.load(std::memory_order_relaxed);
  s.pdl = g_pdl_launches.load(std::memory_order_relaxed);
  s.prefetch = g_prefetch_launches.load(std::memory_order_relaxed);
  s.prologue = g_prologue_launches.load(std::memory_order_relaxed);
  s.row = g_row_launches.load(std::memory_order_relaxed);
  s.register_prologue = g_register_prologue_launches.load(std::memory_order_relaxed);
  s.norm_rows = g_norm_rows_launches.load(std::memory_order_relaxed);
  s.plain_rows = g_plain_rows_launches.load(std::memory_order_relaxed);
  return s;
}

bool prologue_fits(std::int64_t rows, std::int64_t k, DType dtype) {
  if (rows < 1 || rows > kMaxRows || k < 1) return false;
  return prologue_bytes(rows, k, dtype) <= kMaxPrologueBytes;
}

void launch(const Params& params, cudaStream_t stream) {
  Params p = params;
  const auto is_float = [](DType d) {
    return d == DType::f32 || d == DType::f16 || d == DType::bf16;
  };
  SPLICE_INTERNAL_CHECK(
      p.rows >= 1 && p.rows <= kMaxRows && p.n >= 1 && p.k >= 1 && p.w_row_stride >= 0 &&
          p.max_ctas >= 0 && (p.cols == 0 || p.cols == 1 || p.cols == 2 || p.cols == kMaxCols) &&
          is_float(p.in_dtype) && is_float(p.out_dtype) && p.w != nullptr,
      "gemv params: rows ", p.rows, ", n ", p.n, ", k ", p.k, ", w_row_stride ", p.w_row_stride);
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.in_dtype));
  pad_rows(p);
  SPLICE_INTERNAL_CHECK(!p.has_c || (is_float(p.c_dtype) && p.c[0] != nullptr),
                        "gemv residual: c is null or not a float dtype");

  // 16-byte vectors need every weight row and every x row to start on a 16-byte boundary (a
  // prologue's rows are in shared memory, padded to whole vectors: always aligned).
  const bool has_prologue = p.prologue != Prologue::none;
  bool vectorized = aligned(p.w) && (p.n == 1 || (p.w_row_stride * elem) % kVectorBytes == 0);
  for (int r = 0; r < p.rows; ++r) {
    SPLICE_INTERNAL_CHECK(p.x[r] != nullptr && p.y[r] != nullptr, "gemv row ", r, " is null");
    if (!has_prologue) vectorized = vectorized && aligned(p.x[r]);
  }
  // Stage 0's shared rows and whether its global reads (x, and silu_mul's b) may be vectors.
  std::int64_t k_pad = 0;
  unsigned smem = 0;
  bool prologue_vectorized = false;
  if (has_prologue) {
    if (!prologue_fits(p.rows, p.k, p.in_dtype))
      fail<UnsupportedError>("gemv: a ", p.prologue == Prologue::rms_norm ? "rms_norm" : "silu_mul",
                             " prologue of ", p.rows, " rows of k = ", p.k, " ",
                             dtype_name(p.in_dtype), " needs more than the ", kMaxPrologueBytes,
                             " bytes of shared memory it may take (gemv::prologue_fits)");
    SPLICE_INTERNAL_CHECK(p.prologue == Prologue::silu_mul ||
                              (p.norm_weight != nullptr && is_float(p.norm_weight_dtype)),
                          "gemv rms_norm prologue: norm_weight is null or not a float dtype");
    k_pad = padded_k(p.k, p.in_dtype);
    smem = static_cast<unsigned>(prologue_bytes(p.rows, p.k, p.in_dtype));
    prologue_vectorized = p.k % (kVectorBytes / elem) == 0;
    for (int r = 0; r < p.rows; ++r) {
      prologue_vectorized = prologue_vectorized && aligned(p.x[r]);
      if (p.prologue == Prologue::silu_mul) {
        SPLICE_INTERNAL_CHECK(p.b[r] != nullptr, "gemv silu_mul prologue: b row ", r, " is null");
        prologue_vectorized = prologue_vectorized && aligned(p.b[r]);
      }
    }
  }

  // Stage 1's tiling: columns per warp, then warps per CTA (the grid is capped in launch_instance).
  const int device = current_device();
  const std::int64_t sms = sm_count(device);
  int cols = default_cols(p.n, sms);
  if (p.cols > 0) cols = p.cols;
  const std::int64_t warps = (p.n + cols - 1) / cols;
  int warps_per_cta = kMaxWarpsPerCta;
  while (warps_per_cta > 1 && (warps + warps_per_cta - 1) / warps_per_cta < sms) warps_per_cta /= 2;
  const std::int64_t blocks = (warps + warps_per_cta - 1) / warps_per_cta;
  Grid g;
  g.blocks = static_cast<unsigned>(std::min<std::int64_t>(blocks, 0x7fffffff));
  g.threads = static_cast<unsigned>(warps_per_cta * kWarpSize);
  g.k_pad = k_pad;
  g.smem = smem;
  g.prologue_vectorized = prologue_vectorized;
  g.norm_direct = p.prologue == Prologue::rms_norm && p.norm_weight_dtype == p.in_dtype &&
                  (p.norm_weight_stride == 1 || p.k == 1) &&
                  (!prologue_vectorized || aligned(p.norm_weight));
  // The one-batch instances (kSlots = kSmallSlots or kLargeSlots): one row of whole 16-byte
  // vectors that one batch of `slots` vectors per lane covers, within the load budget of `cols`
  // columns (K = 576 bf16: 3 slots; 1536: 6).
  const std::int64_t row_vectors = p.k / (kVectorBytes / elem);
  if (p.rows == 1 && vectorized && p.k % (kVectorBytes / elem) == 0) {
    for (const int slots : {kSmallSlots, kLargeSlots})
      if (row_vectors <= static_cast<std::int64_t>(slots) * kWarpSize &&
          slots <= unroll_for(1, cols)) {
        g.slots = slots;
        break;
      }
  }
  // rms_norm's stage 0 in registers (register_rms_norm_rows) when the rows are 16-byte vectors,
  // the norm weight is read directly and one batch covers k: a one-batch instance (one row), or
  // at 2-8 rows the general kernel whose unroll_for(row bucket, cols) vectors per lane cover the
  // row (K = 256 bf16 at every row count: the default model's batched norm products; K = 576 at
  // up to 4 rows). Every warp then normalizes the rows itself: no shared rows, no barrier.
  const std::int64_t batch_vectors =
      static_cast<std::int64_t>(unroll_for(row_bucket(p.rows), cols)) * kWarpSize;
  const bool one_batch_covers_k =
      g.slots > 0 || (p.rows > 1 && vectorized && row_vectors <= batch_vectors);
  g.register_prologue = p.prologue == Prologue::rms_norm && one_batch_covers_k &&
                        prologue_vectorized && g.norm_direct;
  if (g.register_prologue) {
    g_register_prologue_launches.fetch_add(1, std::memory_order_relaxed);
    g.smem = 0;
  }

  // The decode-row kernel: one row in a one-batch shape, a prologue it runs (rms_norm in
  // registers, silu_mul from 16-byte vectors) and the launcher's grid (no max_ctas), when the
  // column groups fit one resident wave.
  const bool row_prologue = p.prologue == Prologue::none ||
                            (p.prologue == Prologue::rms_norm && g.register_prologue) ||
                            (p.prologue == Prologue::silu_mul && prologue_vectorized);
  if (g.slots > 0 && row_prologue && p.max_ctas == 0 && p.n <= 0x7fffffff) {
    bool launched = false;
    switch (p.in_dtype) {
      case DType::f16:
        launched = launch_row_prologue<__half>(p, cols, g.slots, device, stream);
        break;
      case DType::bf16:
        launched = launch_row_prologue<__nv_bfloat16>(p, cols, g.slots, device, stream);
        break;
      default:
        launched = launch_row_prologue<float>(p, cols, g.slots, device, stream);
        break;
    }
    if (launched) return;
  }
  // The 2-8 row decode kernel (norm_rows_supported: rms_norm or no prologue).
  if (norm_rows_supported(p)) return launch_norm_rows(p, device, stream);

  switch (p.in_dtype) {
    case DType::f16:
      return launch_prologue<__half>(p, cols, g, vectorized, device, stream);
    case DType::bf16:
      return launch_prologue<__nv_bfloat16>(p, cols, g, vectorized, device, stream);
    default:
      return launch_prologue<float>(p, cols, g, vectorized, device, stream);
  }
}

bool rope_supported(const Params& q) {
  if (q.rows > 1) {
    // 2-8 rows: norm_rows_kernel's layout, its groups of two pairs in one resident wave.
    if (q.rows > kMaxRows || q.prologue != Prologue::rms_norm || q.n % 2 != 0 ||
        !norm_rows_layout(q))
      return false;
    RopeParams probe;  // the grid alone, no row is read
    probe.product = q;
    return with_norm_rows_instance(q, [&]<typename T, int kRows, int kSlots>() {
      return norm_rows_instance<RopeParams, T, kRows, kSlots, Prologue::rms_norm>(
                 probe, /*launch=*/false, current_device(), nullptr)
          .single_wave;
    });
  }
  const bool sixteen_bit = q.in_dtype == DType::bf16 || q.in_dtype == DType::f16;
  if (!sixteen_bit || q.rows != 1 || q.k < 1 || q.n < 1 || q.w == nullptr || q.x[0] == nullptr ||
      q.norm_weight == nullptr || q.norm_weight_dtype != q.in_dtype ||
      (q.norm_weight_stride != 1 && q.k > 1))
    return false;
  const std::int64_t vec = kVectorBytes / static_cast<std::int64_t>(dtype_size(q.in_dtype));
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(q.in_dtype));
  return q.k % vec == 0 && q.k / vec <= static_cast<std::int64_t>(kRopeMaxSlots) * kWarpSize &&
         aligned(q.w) && (q.w_row_stride * elem) % kVectorBytes == 0 && aligned(q.x[0]) &&
         aligned(q.norm_weight);
}

void launch_rope(const RopeParams& params, cudaStream_t stream) {
  const Params& q = params.product;
  SPLICE_INTERNAL_CHECK(rope_supported(q), "gemv rope epilogue: unsupported product (n ", q.n,
                        ", k ", q.k, ", ", dtype_name(q.in_dtype), ")");
  SPLICE_INTERNAL_CHECK(
      params.heads >= 1 && params.kv_heads >= 0 && params.dim >= 2 && params.dim % 2 == 0 &&
          q.n == static_cast<std::int64_t>(params.heads + 2 * params.kv_heads) * params.dim &&
          params.out != nullptr && params.position != nullptr && params.cos != nullptr &&
          params.sin != nullptr && (params.kv_heads == 0 || (params.k_cache && params.v_cache)),
      "gemv rope epilogue params: heads ", params.heads, ", kv_heads ", params.kv_heads, ", dim ",
      params.dim, ", n ", q.n);
  SPLICE_INTERNAL_CHECK(q.n / 2 <= 0x7fffffff && q.n * q.w_row_stride < (std::int64_t{1} << 62),
                        "gemv rope epilogue: n ", q.n, " is too large");
  const int pairs = static_cast<int>(q.n / 2);
  const int device = current_device();
  if (q.rows > 1) {
    RopeParams rows_params = params;
    pad_rows(rows_params.product);
    return launch_norm_rows(rows_params, device, stream);
  }
  // launch()'s per-lane accumulation for the columns per warp it would pick (stage 3): a
  // partial per vector below kMinChains accumulators.
  const bool partials = default_cols(q.n, sm_count(device)) < kMinChains;
  if (q.in_dtype == DType::bf16) {
    if (partials) return launch_rope_slots<__nv_bfloat16, true>(params, pairs, device, stream);
    return launch_rope_slots<__nv_bfloat16, false>(params, pairs, device, stream);
  }
  if (partials) return launch_rope_slots<__half, true>(params, pairs, device, stream);
  launch_rope_slots<__half, false>(params, pairs, device, stream);
}

std::uint64_t rope_launches() { return g_rope_launches.load(std::memory_order_relaxed); }

bool norm_rows_supported(const Params& params) {
  const auto is_float = [](DType d) {
    return d == DType::f32 || d == DType::f16 || d == DType::bf16;
  };
  if (params.prologue == Prologue::silu_mul || params.max_ctas != 0 || params.cols != 0 ||
      params.one_warp_per_group ||
      (params.prologue == Prologue::none && params.rows > kPlainRowsMaxRows) ||
      !norm_rows_layout(params))
    return false;
  if (params.has_c) {  // the residual epilogue (no prologue): c rows of a float dtype
    if (params.prologue != Prologue::none || !is_float(params.c_dtype)) return false;
    for (int r = 0; r < params.rows; ++r)
      if (params.c[r] == nullptr) return false;
  }
  // Its four-column groups in one resident wave (larger products keep gemv_kernel's persistent
  // loop); the grid alone, no row is read.
  return with_norm_rows_instance(params, [&]<typename T, int kRows, int kSlots>() {
    return norm_rows_for_prologue<Params, T, kRows, kSlots>(params, /*launch=*/false,
                                                            current_device(), nullptr)
        .single_wave;
  });
}

bool swiglu_supported(const Params& q) {
  const bool sixteen_bit = q.in_dtype == DType::bf16 || q.in_dtype == DType::f16;
  if (!sixteen_bit || q.out_dtype != q.in_dtype || q.rows < 1 || q.rows > kSwigluMaxRows ||
      q.k < 1 || q.n < 2 || q.n % 2 != 0 || q.n > 0x7fffffff || q.w == nullptr ||
      q.x[0] == nullptr || q.norm_weight == nullptr || q.norm_weight_dtype != q.in_dtype ||
      (q.norm_weight_stride != 1 && q.k > 1) || q.w_row_stride < 0)
    return false;
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(q.in_dtype));
  const std::int64_t vec = kVectorBytes / elem;
  if (q.k % vec != 0 || !aligned(q.w) || (q.w_row_stride * elem) % kVectorBytes != 0 ||
      !aligned(q.norm_weight))
    return false;
  for (int r = 0; r < q.rows; ++r)
    if (q.x[r] == nullptr || !aligned(q.x[r]) || (q.rows > 1 && q.y[r] == nullptr)) return false;
  // 2-8 rows: norm_rows_kernel's layout (its one batch covers k).
  if (q.rows > 1) return norm_rows_layout(q);
  // launch()'s one-batch register-prologue instance for this product (the bitwise reference).
  return one_batch_slots(q.k, q.in_dtype, default_cols(q.n, sm_count(current_device()))) > 0;
}

void launch_swiglu(const SwigluParams& params, cudaStream_t stream) {
  const Params& q = params.product;
  SPLICE_INTERNAL_CHECK(swiglu_supported(q), "gemv swiglu epilogue: unsupported product (n ", q.n,
                        ", k ", q.k, ", ", dtype_name(q.in_dtype), ")");
  SPLICE_INTERNAL_CHECK(params.out != nullptr && params.inter >= 1 && q.n == 2 * params.inter &&
                            q.n * q.w_row_stride < (std::int64_t{1} << 62),
                        "gemv swiglu epilogue params: inter ", params.inter, ", n ", q.n);
  const int device = current_device();
  if (q.rows > 1) {
    SwigluParams rows_params = params;
    pad_rows(rows_params.product);
    return launch_norm_rows(rows_params, device, stream);
  }
  // launch()'s columns per warp at n = 2I, hence its per-lane accumulation (stage 3: a partial
  // per vector below kMinChains accumulators) and its one-batch slots.
  const int cols = default_cols(q.n, sm_count(device));
  const bool partials = cols < kMinChains;
  const int slots = one_batch_slots(q.k, q.in_dtype, cols);
  if (q.in_dtype == DType::bf16)
    return launch_swiglu_typed<__nv_bfloat16>(params, slots, partials, device, stream);
  launch_swiglu_typed<__half>(params, slots, partials, device, stream);
}

std::uint64_t swiglu_launches() { return g_swiglu_launches.load(std::memory_order_relaxed); }

// The routing rule (primitives_gemm.cc's try_gemv asks it). Measured on the H200 (05:10 run,
// bf16, CUDA-graph replay over >= 256 MB of rotated weights; the previous kernel, one wave of
// short-lived warps), GEMV us vs cuBLASLt us:
//   M = 1: 576x576 2.32 vs 3.25, 192x576 2.16 vs 3.15, 1536x576 2.84 vs 3.60, 576x1536 2.59 vs
//          4.78, 3072x576 3.33 vs 3.73, 960x576 2.46 vs 3.64, 4096x4096 11.10 vs 12.59,
//          14336x4096 30.68 vs 30.84: the GEMV wins or ties everywhere but the lm_head
//          49152x576 (18.96 vs 16.56), the many-short-groups case the persistent loop (stage 1)
//          and the overlapped reduction (stages 2, 5) target: predicted ~14.5 us (56.6 MB at
//          ~4.2 TB/s plus ~1 us of ramp). So one row always takes the GEMV.
//   M = 4: wins at 576x576 2.59 vs 3.24, 192x576 2.39 vs 3.15, 576x1536 3.59 vs 4.65, 960x576
//          2.74 vs 3.61 (n <= 960, n k <= 884736); loses at 1536x576 3.80 vs 3.53, 3072x576
//          5.27 vs 3.74, 49152x576 37.8 vs 16.9, 4096x4096 15.5 vs 12.5, 14336x4096 43.4 vs 32.8.
//          (M = 2 and 8 unmeasured then.)
//   Session 43 (perf.md run 321, the current kernel), GEMV us vs cuBLASLt us:
//   M = 2: 1536x576 1.92 vs 3.52, 3072x576 2.82 vs 3.74, default model's KDA in 1026x256 1.50 vs
//          5.27; loses at 4096x4096 12.91 vs 12.40, 49152x576 17.42 vs 16.36.
//   M = 4: 1536x576 2.27 vs 3.36, 3072x576 3.10 vs 3.74, 1026x256 1.68 vs 5.26; loses at
//          4096x4096 13.17 vs 12.55, 49152x576 23.26 vs 16.50.
//   M = 8: 1536x576 3.23 vs 3.38, 960x576 3.16 vs 3.31, 1026x256 1.98 vs 3.89; loses at 3072x576
//          4.29 vs 3.75, 4096x4096 16.36 vs 12.46.
//   So the width alone no longer decides (the n <= 1024 bound sent 1026x256 to cuBLASLt at 3x the
//   time): 2 .. 4 rows take the GEMV for n k <= 2^21 (the largest win 1.77M, the smallest loss
//   16.8M), 5 .. 8 rows for n k <= 2^20 (the largest win 0.88M, the smallest loss 1.77M).
bool preferred(std::int64_t rows, std::int64_t n, std::int64_t k) {
  constexpr std::int64_t kAlwaysRows = 1;            // rows up to this: always the GEMV
  constexpr std::int64_t kFewRows = 4;               // 2 .. this many rows: kFewRowsWeight
  constexpr std::int64_t kFewRowsWeight = 1 << 21;   // at most this many n k
  constexpr std::int64_t kManyRowsWeight = 1 << 20;  // kFewRows + 1 .. kMaxRows rows
  if (rows < 1 || rows > kMaxRows) return false;
  if (rows <= kAlwaysRows) return true;
  return n * k <= (rows <= kFewRows ? kFewRowsWeight : kManyRowsWeight);
}

}  // namespace splice::cuda::gemv
