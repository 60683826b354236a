// Bandwidth-bound skinny GEMM for decode (gemv.h):
//   y[r, j] = round_out( sum_kk x[r, kk] * w[j, kk] ),   x [rows, k], w [n, k], y [rows, n],
// rows <= 8, fp32 accumulation, one RNE rounding into y's dtype (the CPU backend's rule).
//
// At rows <= 8 the product is a stream over the weight: n * k elements read once, a handful of
// FLOPs per byte, so the floor is bytes(w) / DRAM bandwidth and the kernel's job is to keep enough
// 16-byte loads in flight on every SM.
//   1. Tiling: a warp owns kCols consecutive output columns j0 .. j0 + kCols - 1 (and every row
//      r), so no inter-warp reduction is needed; a CTA is 1, 2 or 4 such warps. The launcher
//      picks kCols (4, 2, 1) as the largest that still gives kTargetWarpsPerSm warps per SM, and
//      the warps per CTA so that there are at least as many CTAs as SMs (n = 192 -> 192 one-warp
//      CTAs on 132 SMs). Columns past n are clamped to n - 1 for the loads and never stored.
//   2. Streaming: w row j is read as kVec-element vectors (16 bytes; scalars when a weight row or
//      an x row is not 16-byte aligned). A batch is, per lane l, the vectors v = base + u * 32 + l,
//      u < kUnroll, of all kCols w rows and all kRows x rows, kUnroll = kLoadBudget / (kRows +
//      kCols) (12 at one row and one column, 4 at one row and four columns: K = 576 bf16, 72
//      vectors a row, is one batch); loads past the row's num_vec = k / kVec vectors are
//      predicated off. Each batch is issued back to back before any of it is used, then consumed,
//      then the next batch refills the same registers. Weights use L1::no_allocate (each byte is
//      used once); x comes through the read-only cache (every warp of the SM re-reads it).
//   3. Update, per lane, in fp32:  acc[r][c] += sum_{i < kVec} x[r, v kVec + i] * w[j0 + c, v kVec
//      + i] (with fewer than kMinChains accumulators, the vector's partial first, so a batch's FMA
//      chains are independent); each w vector is converted once and reused for every row r.
//   4. Tail: the k % kVec elements after the last full vector go one per lane (scalar loads).
//   5. Reduction: acc[r][c] = sum over the 32 lanes (xor butterfly, warp shuffles); lane
//      (r * kCols + c) mod 32 stores y[r, j0 + c] rounded to the output dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv.h"
#include "splice/core/error.h"

namespace splice::cuda::gemv {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kVectorBytes = 16;      // one ld.global.v4.u32
constexpr int kMaxCols = 4;           // output columns per warp
constexpr int kMaxWarpsPerCta = 4;    // 128 threads
constexpr int kTargetWarpsPerSm = 4;  // fewer columns per warp until n / kCols reaches this
constexpr int kLoadBudget = 24;       // (w + x) vectors a lane loads per iteration, at most
constexpr int kMinChains = 4;         // fewer accumulators than this: per-vector partials (stage 3)
constexpr int kMaxThreads = kMaxWarpsPerCta * kWarpSize;

// Register type of one load of `kBytes`.
template <int kBytes>
struct RawOf;
template <>
struct RawOf<16> {
  using type = uint4;
};
template <>
struct RawOf<4> {
  using type = unsigned;
};
template <>
struct RawOf<2> {
  using type = unsigned short;
};

// Vectors per lane per row in one batch: as many as fit kUnroll * (kRows + kCols) <= kLoadBudget
// (K = 576 bf16 is 72 vectors a row: one batch whenever kUnroll >= 3).
constexpr int unroll_for(int rows, int cols) {
  return kLoadBudget / (rows + cols) > 1 ? kLoadBudget / (rows + cols) : 1;
}

// Predicated read-only loads, zero when `pred` is false (memory is not touched then, so the
// address may lie past the row). Inline PTX with the predicate inside keeps every load in one
// basic block, so the scheduler can issue all of an iteration's loads before the first use.
// Weights are streamed (L1::no_allocate: each byte is used once); activations go through the
// default read-only path (every warp of the CTA re-reads x from L1).
#define SPLICE_GEMV_LOADS(NAME, HINT)                                                    \
  __device__ __forceinline__ uint4 NAME(const uint4* ptr, bool pred) {                   \
    uint4 r;                                                                             \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"                                    \
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"           \
        " @p ld.global.nc" HINT ".v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"                   \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                     \
        : "l"(ptr), "r"(static_cast<int>(pred)));                                        \
    return r;                                                                            \
  }                                                                                      \
  __device__ __forceinline__ unsigned NAME(const unsigned* ptr, bool pred) {             \
    unsigned r;                                                                          \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b32 %0, 0;\n"                   \
        " @p ld.global.nc" HINT ".b32 %0, [%1];\n}\n"                                    \
        : "=r"(r)                                                                        \
        : "l"(ptr), "r"(static_cast<int>(pred)));                                        \
    return r;                                                                            \
  }                                                                                      \
  __device__ __forceinline__ unsigned short NAME(const unsigned short* ptr, bool pred) { \
    unsigned short r;                                                                    \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b16 %0, 0;\n"                   \
        " @p ld.global.nc" HINT ".b16 %0, [%1];\n}\n"                                    \
        : "=h"(r)                                                                        \
        : "l"(ptr), "r"(static_cast<int>(pred)));                                        \
    return r;                                                                            \
  }
SPLICE_GEMV_LOADS(load_weight, ".L1::no_allocate")
SPLICE_GEMV_LOADS(load_activation, "")
#undef SPLICE_GEMV_LOADS

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// The raw bits of one load as floats: f[i] = float(element i).
template <typename T, typename R, int kN>
__device__ __forceinline__ void unpack(const R& raw, float (&f)[kN]) {
  static_assert(sizeof(R) == kN * sizeof(T));
  T elems[kN];
  memcpy(elems, &raw, sizeof(R));
#pragma unroll
  for (int i = 0; i < kN; ++i) f[i] = to_float(elems[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ void store_out(void* y, std::int64_t index, float value, DType dtype) {
  switch (dtype) {
    case DType::f16:
      static_cast<__half*>(y)[index] = __float2half_rn(value);
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(y)[index] = __float2bfloat16_rn(value);
      break;
    default:
      static_cast<float*>(y)[index] = value;
      break;
  }
}

// One warp per kCols output columns; see the file header for the stages.
template <typename T, int kRows, int kCols, int kVec>
__global__ void __launch_bounds__(kMaxThreads) gemv_kernel(const Params p) {
  using Raw = typename RawOf<kVec* static_cast<int>(sizeof(T))>::type;
  using Scalar = typename RawOf<static_cast<int>(sizeof(T))>::type;
  constexpr int kUnroll = unroll_for(kRows, kCols);
  constexpr int kStep = kUnroll * kWarpSize;  // vectors of a row one iteration covers

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t warp =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const std::int64_t j0 = warp * kCols;
  if (j0 >= p.n) return;  // warp-uniform: the shuffles below see full warps

  // Stage 1: this warp's weight rows (clamped past n) and the x rows.
  const T* w_rows[kCols];  // each [k]
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    w_rows[c] = static_cast<const T*>(p.w) + std::min(j0 + c, p.n - 1) * p.w_row_stride;
  const T* x_rows[kRows];  // each [k]
#pragma unroll
  for (int r = 0; r < kRows; ++r) x_rows[r] = static_cast<const T*>(p.x[r]);  // r >= rows: x[0]

  float acc[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;

  // Stages 2-3: full vectors. A batch is kUnroll vectors of each of the kCols w rows and kRows x
  // rows per lane. Each batch is loaded in a block of its own (the prologue, then the refill at
  // the end of an iteration) whose loads have no consumer before the block ends, so all of them
  // are issued back to back (ptxas otherwise sinks each load next to its first use and keeps only
  // two or three in flight).
  const std::int64_t num_vec = p.k / kVec;
  Raw w_raw[kUnroll][kCols];  // [unroll, cols] vectors of w
  Raw x_raw[kUnroll][kRows];  // [unroll, rows] vectors of x
  const auto load_batch = [&](std::int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t v = base + u * kWarpSize + lane;
      const bool in_row = v < num_vec;
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        w_raw[u][c] = load_weight(reinterpret_cast<const Raw*>(w_rows[c] + v * kVec), in_row);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        x_raw[u][r] = load_activation(reinterpret_cast<const Raw*>(x_rows[r] + v * kVec), in_row);
    }
  };
  load_batch(0);
  for (std::int64_t base = 0; base < num_vec;) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[kCols][kVec];
#pragma unroll
      for (int c = 0; c < kCols; ++c) unpack<T>(w_raw[u][c], wf[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float xf[kVec];
        unpack<T>(x_raw[u][r], xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if constexpr (kRows * kCols < kMinChains) {
            // A partial per vector: kUnroll independent FMA chains instead of one long one.
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < kVec; ++i) part = fmaf(xf[i], wf[c][i], part);
            acc[r][c] += part;
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) acc[r][c] = fmaf(xf[i], wf[c][i], acc[r][c]);
          }
        }
      }
    }
    base += kStep;
    if (base < num_vec) load_batch(base);
  }

  // Stage 4: the k % kVec tail elements, one per lane (lane < kVec - 1 <= 7).
  if constexpr (kVec > 1) {
    const std::int64_t kk = num_vec * kVec + lane;
    const bool in_row = kk < p.k;
    float wt[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float f[1];
      unpack<T>(load_weight(reinterpret_cast<const Scalar*>(w_rows[c] + kk), in_row), f);
      wt[c] = f[0];
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float f[1];
      unpack<T>(load_activation(reinterpret_cast<const Scalar*>(x_rows[r] + kk), in_row), f);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(f[0], wt[c], acc[r][c]);
    }
  }

  // Stage 5: warp reduction and the store.
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float sum = warp_sum(acc[r][c]);
      if (lane == (r * kCols + c) % kWarpSize && r < p.rows && j0 + c < p.n)
        store_out(p.y[r], (j0 + c) * p.y_col_stride, sum, p.out_dtype);
    }
}

// ---- host ----------------------------------------------------------------------------------

int sm_count() {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices && counts[device] > 0) return counts[device];
  int count = 0;
  SPLICE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device < kMaxDevices) counts[device] = count;
  return count;
}

struct Grid {
  unsigned blocks = 0, threads = 0;
};

template <typename T, int kRows, int kCols, int kVec>
void launch_kernel(const Params& p, Grid g, cudaStream_t stream) {
  gemv_kernel<T, kRows, kCols, kVec><<<g.blocks, g.threads, 0, stream>>>(p);
  SPLICE_CUDA_CHECK_LAUNCH("gemv_kernel");
}

template <typename T, int kRows, int kCols>
void launch_vec(const Params& p, Grid g, bool vectorized, cudaStream_t stream) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  if (vectorized)
    launch_kernel<T, kRows, kCols, kVec>(p, g, stream);
  else
    launch_kernel<T, kRows, kCols, 1>(p, g, stream);
}

template <typename T, int kRows>
void launch_cols(const Params& p, int cols, Grid g, bool vectorized, cudaStream_t stream) {
  switch (cols) {
    case 1:
      return launch_vec<T, kRows, 1>(p, g, vectorized, stream);
    case 2:
      return launch_vec<T, kRows, 2>(p, g, vectorized, stream);
    default:
      return launch_vec<T, kRows, kMaxCols>(p, g, vectorized, stream);
  }
}

template <typename T>
void launch_rows(const Params& p, int cols, Grid g, bool vectorized, cudaStream_t stream) {
  if (p.rows <= 1) return launch_cols<T, 1>(p, cols, g, vectorized, stream);
  if (p.rows <= 2) return launch_cols<T, 2>(p, cols, g, vectorized, stream);
  if (p.rows <= 4) return launch_cols<T, 4>(p, cols, g, vectorized, stream);
  return launch_cols<T, kMaxRows>(p, cols, g, vectorized, stream);
}

bool aligned(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % kVectorBytes == 0; }

}  // namespace

void launch(const Params& params, cudaStream_t stream) {
  Params p = params;
  const auto is_float = [](DType d) {
    return d == DType::f32 || d == DType::f16 || d == DType::bf16;
  };
  SPLICE_INTERNAL_CHECK(
      p.rows >= 1 && p.rows <= kMaxRows && p.n >= 1 && p.k >= 1 && p.w_row_stride >= 0 &&
          is_float(p.in_dtype) && is_float(p.out_dtype) && p.w != nullptr,
      "gemv params: rows ", p.rows, ", n ", p.n, ", k ", p.k, ", w_row_stride ", p.w_row_stride);
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.in_dtype));
  // Rows past `rows` of the kernel's row bucket read row 0 (valid memory) and store nothing.
  for (int r = p.rows; r < kMaxRows; ++r) p.x[r] = p.x[0];

  // 16-byte vectors need every weight row and every x row to start on a 16-byte boundary.
  bool vectorized = aligned(p.w) && (p.n == 1 || (p.w_row_stride * elem) % kVectorBytes == 0);
  for (int r = 0; r < p.rows; ++r) {
    SPLICE_INTERNAL_CHECK(p.x[r] != nullptr && p.y[r] != nullptr, "gemv row ", r, " is null");
    vectorized = vectorized && aligned(p.x[r]);
  }

  // Stage 1's tiling: columns per warp, then warps per CTA.
  const std::int64_t sms = sm_count();
  int cols = kMaxCols;
  while (cols > 1 && (p.n + cols - 1) / cols < kTargetWarpsPerSm * sms) cols /= 2;
  const std::int64_t warps = (p.n + cols - 1) / cols;
  int warps_per_cta = kMaxWarpsPerCta;
  while (warps_per_cta > 1 && (warps + warps_per_cta - 1) / warps_per_cta < sms) warps_per_cta /= 2;
  const std::int64_t blocks = (warps + warps_per_cta - 1) / warps_per_cta;
  SPLICE_INTERNAL_CHECK(blocks <= 0x7fffffff, "gemv grid of ", blocks, " CTAs");
  const Grid g{static_cast<unsigned>(blocks), static_cast<unsigned>(warps_per_cta * kWarpSize)};

  switch (p.in_dtype) {
    case DType::f16:
      return launch_rows<__half>(p, cols, g, vectorized, stream);
    case DType::bf16:
      return launch_rows<__nv_bfloat16>(p, cols, g, vectorized, stream);
    default:
      return launch_rows<float>(p, cols, g, vectorized, stream);
  }
}

}  // namespace splice::cuda::gemv
