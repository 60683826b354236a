// Device code of the bandwidth-bound skinny GEMM for decode (gemv.h; gemv.cu launches it):
//   y[r, j] = round_out( sum_kk x[r, kk] * w[j, kk] ),   x [rows, k], w [n, k], y [rows, n],
// rows <= 8, fp32 accumulation, one RNE rounding into y's dtype (the CPU backend's rule).
//
// With a prologue (Params::prologue, gemv.h: the RmsNormMatMul and SiluMulMatMulAdd layer ops) x
// is not read as it is: stage 0 below first computes each row's GEMV input into shared memory.
//
// With the RoPE epilogue (launch_rope, gemv.h's RopeParams: the RmsNormMatMulRopeKvAppend layer
// op) a second kernel, rope_pairs_kernel, runs one row with stage 0 in registers, stages 2-5 for
// the two weight rows of a RoPE pair per warp, and instead of storing y rotates the pair and
// writes it into out or the KV caches at the step's position (its own numbered stages, below
// gemv_kernel).
//
// With the SwiGLU epilogue (launch_swiglu, gemv.h's SwigluParams: the RmsNormMatMulSwiglu layer
// op) a third kernel, swiglu_pairs_kernel, runs one row with stage 0 in registers, stages 2-5 for
// four weight rows per warp (gate j, j + 1 and up j, j + 1 of the stacked gate|up weight), and
// instead of storing y writes silu(gate) * up for its two outputs (its own numbered stages,
// after rope_pairs_kernel); at 2-8 rows norm_rows_kernel does the same for every row.
//
// Kernels: gemv_kernel (the general product, any rows <= 8, persistent column-group loop),
// row_kernel (launch()'s one-row, one-wave decode products), rope_pairs_kernel and
// swiglu_pairs_kernel (the two epilogue siblings of row_kernel), norm_rows_kernel (launch()'s
// 2-8 row rms_norm products of K <= 768, and the SwiGLU epilogue at 2-8 rows). The decode
// kernels are small on purpose: a decode step runs each with its code cold.
//
// At rows <= 8 the product is a stream over the weight: n * k elements read once, a handful of
// FLOPs per byte, so the floor is bytes(w) / DRAM bandwidth and the kernel's job is to keep enough
// 16-byte loads in flight on every SM, from the first cycle to the last.
//   0. Prologue (optional; after the wait of stage 6, before the weight stream): the CTA's
//      threads write xs[r, kk] (shared memory, [rows, k rounded up to 16 bytes] of T) as
//        rms_norm: xs = round_T((x * inv_r) * norm_w),
//                  inv_r = 1 / sqrt(sum_kk x[r, kk]^2 / k + eps)
//        silu_mul: xs = round_T(round_T(a / (1 + e^-a)) * b)
//      (the cuda rms_norm / silu_mul kernels' exact operations; the sum of squares per thread,
//      warp butterfly, then across the CTA's warps in warp order, so every CTA computes the same
//      rows), then __syncthreads(); every warp of the CTA takes part, a warp without a column
//      group exits after it. The stream below reads x from xs (ld.shared, always 16-byte
//      aligned). Its limit: (rows * k_pad * sizeof(T) + k_pad * 4 bytes of norm weights) <=
//      kMaxPrologueBytes (192 KiB; k_pad = k rounded up to 16 bytes).
//   1. Tiling: a column group is kCols consecutive output columns j0 .. j0 + kCols - 1 (and every
//      row r); one warp reduces a whole group, so no inter-warp reduction is needed. The launcher
//      picks kCols (4, 2, 1) as the largest that still gives kTargetWarpsPerSm groups per SM and
//      the warps per CTA (1, 2, 4) so that there are at least as many CTAs as SMs; the grid is
//      capped at one resident wave (SMs x the kernel's occupancy) and warp w takes groups w,
//      w + W, w + 2W, ... (W warps in the grid): at lm_head sizes (n = 49152, k = 576: 12288
//      groups) a warp streams several groups back to back instead of starting, waiting one
//      latency and exiting. Columns past n are clamped to n - 1 for the loads and never stored.
//   2. Streaming: w row j is read as kVec-element vectors (16 bytes; scalars when a weight row or
//      an x row is not 16-byte aligned). A batch is, per lane l, the vectors v = base + u * 32 + l,
//      u < kUnroll, of all kCols w rows and all kRows x rows, kUnroll = kLoadBudget / (kRows +
//      kCols) (12 at one row and one column, 4 at one row and four columns: K = 576 bf16, 72
//      vectors a row, is one batch); loads past the row's num_vec = k / kVec vectors are
//      predicated off, and slots wholly past the row are skipped when consumed. One row of whole
//      vectors that kSmallSlots (3) or kLargeSlots (6) vectors per lane cover (K = 576 / 1536
//      bf16, the decode products) runs a one-batch instance instead: kUnroll = that many slots,
//      32-bit indices, no tail, no next-batch step (gemv_kernel's kSlots). A warp's batches form
//      one stream over (group, base): each batch is issued back to back before any of it is used,
//      and the next batch (the next base of this group, or base 0 of the warp's next group) is
//      issued as soon as the current one is consumed, before the current group's reduction and
//      store, so those overlap the next group's loads. Weights use L1::no_allocate (each byte is
//      used once); x comes through the read-only cache (every warp of the SM re-reads it).
//   3. Update, per lane, in fp32:  acc[r][c] += sum_{i < kVec} x[r, v kVec + i] * w[j0 + c, v kVec
//      + i] (with fewer than kMinChains accumulators, the vector's partial first, so a batch's FMA
//      chains are independent); each w vector is converted once and reused for every row r, each
//      x vector once and reused for every column c.
//   4. Tail: the k % kVec elements after the last full vector go one per lane (scalar loads issued
//      with the group's first batch, added after its last).
//   5. Reduction of the V = kRows * kCols accumulators over the 32 lanes, transposed: at xor
//      offset o = 16, 8, ... while V > 1, a lane keeps the half of its values selected by bit o of
//      its lane id and adds the partner's copy of that half (V / 2 shuffles), so V values cost
//      V - 1 + (5 - log2 V) shuffles instead of 5 V (16 instead of 80 at 4 rows x 4 columns); then
//      lane l holds the full sum of value (l / (32 / V)) and the first lane of each such run
//      stores y[r, j0 + c], value index r * kCols + c, rounded to the output dtype; with the
//      residual epilogue (Params::has_c) it first adds c[r, j0 + c] in fp32 (one rounding), an
//      element loaded with the group's first batch (its L2 round trip overlaps the stream's).
//   6. Programmatic dependent launch (launch.cuh's safety rule): every thread calls
//      wait_for_producers() before its first read of x or write of y and before the early exit of
//      a warp with no column group; with Params::w_constant the first batch's weight vectors and
//      weight tail are issued before that wait (the weights are never written by a kernel in
//      flight, so they need no producer), everything else after it; the addresses of what is
//      loaded after it (x, the residual element) are computed before it. When the launcher's grid
//      is one resident wave (every CTA resident at once) each CTA triggers its dependents first
//      thing, so the next kernel is resident and waiting when this one ends.
//
// Included by gemv.cu alone: the kernels and their stages stay in its anonymous namespace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/float_convert.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/launch.cuh"

namespace splice::cuda::gemv {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kVectorBytes = 16;      // one ld.global.v4.u32
constexpr int kMaxCols = 4;           // output columns per warp
constexpr int kMaxWarpsPerCta = 4;    // 128 threads
constexpr int kTargetWarpsPerSm = 4;  // fewer columns per warp until n / kCols reaches this
constexpr int kLoadBudget = 24;       // (w + x) vectors a lane loads per batch, at most
constexpr int kMinChains = 4;         // fewer accumulators than this: per-vector partials (stage 3)
constexpr int kMaxThreads = kMaxWarpsPerCta * kWarpSize;
// Vectors per lane of the one-batch instances (gemv_kernel's kSlots): 3 covers K = 576 bf16
// (72 vectors), 6 covers K = 1536 bf16 (192 vectors); the SmolLM2 decode products.
constexpr int kSmallSlots = 3;
constexpr int kLargeSlots = 6;

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

// Predicated loads, zero when `pred` is false (memory is not touched then, so the address may lie
// past the row). Inline PTX with the predicate inside keeps every load in one basic block, so the
// scheduler can issue all of a batch's loads before the first use. One macro makes each family's
// 16-, 4- and 2-byte overloads: LOAD is the PTX instruction, and ADDRESS the operand constraint and
// the expression of `ptr` it loads from.
#define SPLICE_GEMV_LOADS(NAME, LOAD, ADDRESS)                                           \
  __device__ __forceinline__ uint4 NAME(const uint4* ptr, bool pred) {                   \
    uint4 r;                                                                             \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"                                    \
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"           \
        " @p " LOAD ".v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"                               \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                     \
        : ADDRESS, "r"(static_cast<int>(pred)));                                         \
    return r;                                                                            \
  }                                                                                      \
  __device__ __forceinline__ unsigned NAME(const unsigned* ptr, bool pred) {             \
    unsigned r;                                                                          \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b32 %0, 0;\n"                   \
        " @p " LOAD ".b32 %0, [%1];\n}\n"                                                \
        : "=r"(r)                                                                        \
        : ADDRESS, "r"(static_cast<int>(pred)));                                         \
    return r;                                                                            \
  }                                                                                      \
  __device__ __forceinline__ unsigned short NAME(const unsigned short* ptr, bool pred) { \
    unsigned short r;                                                                    \
    asm volatile(                                                                        \
        "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b16 %0, 0;\n"                   \
        " @p " LOAD ".b16 %0, [%1];\n}\n"                                                \
        : "=h"(r)                                                                        \
        : ADDRESS, "r"(static_cast<int>(pred)));                                         \
    return r;                                                                            \
  }

// Generic pointer into this CTA's shared window -> its shared-state-space address.
__device__ __forceinline__ unsigned shared_address(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// Weights are streamed (L1::no_allocate: each byte is used once); activations go through the
// default read-only path (every warp of the CTA re-reads x from L1); load_shared reads the
// prologue's rows from shared memory.
SPLICE_GEMV_LOADS(load_weight, "ld.global.nc.L1::no_allocate", "l"(ptr))
SPLICE_GEMV_LOADS(load_activation, "ld.global.nc", "l"(ptr))
SPLICE_GEMV_LOADS(load_shared, "ld.shared", "r"(shared_address(ptr)))
#undef SPLICE_GEMV_LOADS

using detail::from_float;  // float_convert.cuh
using detail::load_any;    // float_convert.cuh
using detail::to_float;

// The raw bits of one load as floats: f[i] = float(element i). A bf16 is the top half of its
// float, so a 32-bit word of two bf16 unpacks in one instruction per element (a shift for the low
// element, a mask for the high one) instead of an extract and a shift each.
template <typename T, typename R, int kN>
__device__ __forceinline__ void unpack(const R& raw, float (&f)[kN]) {
  static_assert(sizeof(R) == kN * sizeof(T));
  if constexpr (std::is_same_v<T, __nv_bfloat16> && sizeof(R) % 4 == 0) {
    unsigned words[kN / 2];
    memcpy(words, &raw, sizeof(R));
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else {
    T elems[kN];
    memcpy(elems, &raw, sizeof(R));
#pragma unroll
    for (int i = 0; i < kN; ++i) f[i] = to_float(elems[i]);
  }
}

// Stage 5: sums each of v[0 .. kV) over the warp's 32 lanes (v is clobbered) and returns, in lane
// l, the sum of v[l / (32 / kV)] (kV a power of two <= 32).
//   Step with h = kHalf at offset o = 32 h / kV:  v[i] <- v[i + h b] + shfl_xor(v[i + h (1 - b)],
//   o), i < h, b = bit o of the lane id; the kept index gains h b, so after the log2 kV steps
//   (h = kV / 2 .. 1) lane l holds value sum_h h b(l) = l / (32 / kV), summed over the lanes that
//   differ in those bits; the remaining offsets 16 / kV .. 1 sum it over the others (a plain
//   butterfly). Templated on h so every index is a compile-time constant (no local memory).
template <int kHalf, int kV>
__device__ __forceinline__ void halve(float (&v)[kV], int lane) {
  if constexpr (kHalf >= 1) {
    constexpr int kOffset = kWarpSize * kHalf / kV;
    const bool upper = (lane & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? v[i] : v[i + kHalf];
      const float keep = upper ? v[i + kHalf] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, kOffset);
    }
    halve<kHalf / 2>(v, lane);
  }
}

template <int kV>
__device__ __forceinline__ float transposed_warp_sum(float (&v)[kV], int lane) {
  static_assert(kV >= 1 && kV <= kWarpSize && (kV & (kV - 1)) == 0);
  halve<kV / 2>(v, lane);
  float sum = v[0];
#pragma unroll
  for (int offset = kWarpSize / kV / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  return sum;
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

// Stage 5's residual element c[r, j] in three steps: at() computes its address (before the wait:
// parameters only), issue() loads its 2 or 4 bytes (after the wait: no address math between the
// wait and the load), value() converts them to fp32 (after the reduction). A dead element (no
// residual, a lane that stores nothing, j >= n) has no address and loads nothing. Three registers.
struct ResidualLoad {
  const void* ptr = nullptr;  // null: nothing to load
  unsigned bits = 0;          // the element's bits (2-byte dtypes in the low half)

  static __device__ __forceinline__ ResidualLoad at(const void* row, std::int64_t index,
                                                    DType dtype, bool live) {
    ResidualLoad r;
    const std::int64_t size = dtype == DType::f32 ? 4 : 2;
    r.ptr = live ? static_cast<const char*>(row) + index * size : nullptr;
    return r;
  }
  __device__ __forceinline__ void issue(DType dtype) {
    if (ptr == nullptr) return;
    bits = dtype == DType::f32 ? *static_cast<const unsigned*>(ptr)
                               : *static_cast<const unsigned short*>(ptr);
  }
  __device__ __forceinline__ float value(DType dtype) const {
    switch (dtype) {
      case DType::f16:
        return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
      case DType::bf16:
        return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits)));
      default:
        return __uint_as_float(bits);
    }
  }
};

// Stage 0 (the prologue, after the wait): the CTA's threads write xs[r, kk] for r < p.rows,
// kk < k (xs: [p.rows, k_pad] in shared memory, T = in_dtype; see gemv.h's Prologue). Thread t
// takes the chunks (16-byte vectors, or single elements when a row is misaligned) t, t + blockDim,
// ...; each batch of kBatch chunks of every row (and of rms_norm's weight) is loaded with the
// predicated read-only loads of stage 2 back to back before any is used, so a row costs about
// one memory latency per batch, not one per chunk.
//   rms_norm: pass 1 copies x[r] into xs[r], the norm weight (as fp32) into ws [k_pad] after the
//             rows, and sums s_r = sum x^2 per thread, then over the warp (xor butterfly) and,
//             after one barrier, every thread across the CTA's warps in warp order (every thread
//             and CTA gets the same inv_r: same block size, same order); pass 2 (shared memory
//             only, 16-byte chunks) rewrites
//             xs[r, kk] = round_T((xs * inv_r) * ws[kk])
//             with inv_r = 1 / sqrt(s_r / k + eps) (IEEE division and sqrt; no contraction: the
//             cuda rms_norm kernel's exact operations).
//   silu_mul: xs[r, kk] = round_T(round_T(a / (1 + e^-a)) * b) (the cuda silu_mul kernel's
//             exact operations).
// Ends with __syncthreads(): every warp of the CTA takes part (a warp without a column group
// exits only after it).
template <typename T, int kRows, int kW, Prologue kPro>
__device__ __forceinline__ void run_prologue_chunks(const Params& p, T* xs, std::int64_t k_pad,
                                                    bool norm_direct) {
  using Raw = typename RawOf<kW* static_cast<int>(sizeof(T))>::type;
  // Chunks in flight per thread and row: more for fewer rows (registers: kBatch * kRows).
  constexpr int kBatch = kRows <= 2 ? 4 : kRows <= 4 ? 2 : 1;
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const std::int64_t k = p.k, chunks = k / kW;                      // kW > 1 only when kW divides k
  float* const ws = reinterpret_cast<float*>(xs + p.rows * k_pad);  // [k_pad] rms_norm weight
  float ss[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) ss[r] = 0.0f;
  // Chunks one batch of the CTA covers.
  const std::int64_t batch_stride = static_cast<std::int64_t>(threads) * kBatch;
  for (std::int64_t base = tid; base < chunks; base += batch_stride) {
    Raw xr[kBatch][kRows];  // x (silu_mul: a) chunks
    Raw br[kBatch][kRows];  // silu_mul's b chunks
    Raw wr[kBatch];         // rms_norm's weight chunks (norm_direct)
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const std::int64_t c = base + static_cast<std::int64_t>(u) * threads;
      const bool in = c < chunks;
      if constexpr (kPro == Prologue::rms_norm)
        wr[u] = load_activation(
            reinterpret_cast<const Raw*>(static_cast<const T*>(p.norm_weight) + c * kW),
            in && norm_direct);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const bool row_in = in && r < p.rows;
        xr[u][r] = load_activation(
            reinterpret_cast<const Raw*>(static_cast<const T*>(p.x[r]) + c * kW), row_in);
        if constexpr (kPro == Prologue::silu_mul)
          br[u][r] = load_activation(
              reinterpret_cast<const Raw*>(static_cast<const T*>(p.b[r]) + c * kW), row_in);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const std::int64_t c = base + static_cast<std::int64_t>(u) * threads;
      if (c >= chunks) break;
      if constexpr (kPro == Prologue::rms_norm) {
        float w[kW];
        if (norm_direct) {
          unpack<T>(wr[u], w);
        } else {
#pragma unroll
          for (int i = 0; i < kW; ++i)
            w[i] =
                load_any(p.norm_weight, p.norm_weight_dtype, (c * kW + i) * p.norm_weight_stride);
        }
#pragma unroll
        for (int i = 0; i < kW; ++i) ws[c * kW + i] = w[i];
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= p.rows) break;
        Raw* dst = reinterpret_cast<Raw*>(xs + r * k_pad + c * kW);
        if constexpr (kPro == Prologue::rms_norm) {
          *dst = xr[u][r];
          float f[kW];
          unpack<T>(xr[u][r], f);
#pragma unroll
          for (int i = 0; i < kW; ++i) ss[r] += f[i] * f[i];
        } else {
          float fa[kW], fb[kW];
          unpack<T>(xr[u][r], fa);
          unpack<T>(br[u][r], fb);
          T out[kW];
#pragma unroll
          for (int i = 0; i < kW; ++i) {
            const float s = to_float(from_float<T>(fa[i] / (1.0f + expf(-fa[i]))));
            out[i] = from_float<T>(__fmul_rn(s, fb[i]));
          }
          Raw raw;
          memcpy(&raw, out, sizeof(raw));
          *dst = raw;
        }
      }
    }
  }
  if constexpr (kPro == Prologue::rms_norm) {
    __shared__ float partial[kMaxWarpsPerCta][kRows];
    const int warp = tid / kWarpSize, lane = tid % kWarpSize;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        ss[r] += __shfl_xor_sync(kFullMask, ss[r], offset);
      if (lane == 0) partial[warp][r] = ss[r];
    }
    __syncthreads();  // also publishes xs and ws
    // Every thread sums the warps' partials itself, in warp order (the same inv_r in every thread
    // and CTA: no second barrier behind one thread's sum), then rewrites its 16-byte chunks of
    // the rows (single elements for the k % kV tail).
    constexpr int kV = kVectorBytes / static_cast<int>(sizeof(T));
    using Chunk = typename RawOf<kVectorBytes>::type;
    const std::int64_t whole = k / kV;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= p.rows) break;
      float total = 0.0f;
      for (int w = 0; w < threads / kWarpSize; ++w) total += partial[w][r];
      const float inv = 1.0f / sqrtf(total / static_cast<float>(k) + p.eps);
      T* row = xs + r * k_pad;
      for (std::int64_t c = tid; c < whole; c += threads) {
        float f[kV];
        unpack<T>(*reinterpret_cast<const Chunk*>(row + c * kV), f);
        // The chunk's kV fp32 weights; ws is 16-byte aligned (it follows p.rows rows of k_pad
        // elements, whole vectors).
        float4 norm4[kV / 4];
#pragma unroll
        for (int q = 0; q < kV / 4; ++q) norm4[q] = reinterpret_cast<const float4*>(ws + c * kV)[q];
        const float* norm = reinterpret_cast<const float*>(norm4);
        T out[kV];
#pragma unroll
        for (int i = 0; i < kV; ++i)
          out[i] = from_float<T>(__fmul_rn(__fmul_rn(f[i], inv), norm[i]));
        Chunk raw;
        memcpy(&raw, out, sizeof(raw));
        *reinterpret_cast<Chunk*>(row + c * kV) = raw;
      }
      for (std::int64_t j = whole * kV + tid; j < k; j += threads)
        row[j] = from_float<T>(__fmul_rn(__fmul_rn(to_float(row[j]), inv), ws[j]));
    }
  }
  __syncthreads();
}

// Stage 0's entry: 16-byte chunks when `vectorized` (every row 16-byte aligned and kVec divides
// k), single elements otherwise.
template <typename T, int kRows, Prologue kPro>
__device__ __forceinline__ void run_prologue(const Params& p, T* xs, std::int64_t k_pad,
                                             bool vectorized, bool norm_direct) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  if (vectorized)
    run_prologue_chunks<T, kRows, kVec, kPro>(p, xs, k_pad, norm_direct);
  else
    run_prologue_chunks<T, kRows, 1, kPro>(p, xs, k_pad, norm_direct);
}

// Stage 0 in registers for rms_norm (the launcher's register_prologue, and row_kernel's: when the
// rows are 16-byte vectors, one batch covers k (num_vec <= kUnroll * 32) and the norm weight is
// read directly; one row, or 2-8 rows in gemv_kernel, where every row's vectors of that batch
// stay in x_raw across the warp's column groups): each warp computes its own lanes' vectors
// v = u * 32 + lane of the normalized rows straight into the stream's x_raw [kUnroll, kRows],
// right after the wait:
//   s_r = sum over the warp of the lane's sum of x[r]^2: every warp reduces the whole row itself,
//   so there is no shared memory and no barrier. One row: an xor butterfly. Several rows: the
//   transposed reduction (transposed_warp_sum: row r's total lands in lanes r * 32 / kRows ..,
//   kRows - 1 + log2(32 / kRows) shuffles instead of 5 kRows), one division and square root a
//   lane for its own row, then inv_r from row r's first lane (a shuffle); then
//   x_raw = round_T((x * inv_r) * norm_w), inv_r = 1 / sqrt(s_r / k + eps)
// The shared-memory stage 0's exact operations; only the order of the fp32 sum of squares
// differs. The post-wait critical path drops three barriers, the cross-warp sum and two
// shared-memory round trips (-0.2 to -0.3 us per call on the H200, docs/perf.md run 19; -30 us per
// SmolLM2-shaped token, run 21). The transposed form at 2-8 rows: 4 rows of K = 256 3.17 -> 2.73
// us, with the SwiGLU epilogue 2.45 -> 1.95 (runs 337-338).
// This lane's vectors v = u * 32 + lane (u < kUnroll) of x's rows r < kRows into x_raw (zeros
// past the row and for rows r >= p.rows): the register stage 0's loads, and the whole stage 0
// of a product without a prologue in norm_rows_kernel.
template <typename T, int kRows, int kUnroll, typename Raw, typename Index>
__device__ __forceinline__ void load_x_rows(const Params& p, Raw (&x_raw)[kUnroll][kRows], int lane,
                                            Index num_vec) {
  constexpr int kW = static_cast<int>(sizeof(Raw) / sizeof(T));
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const Index v = static_cast<Index>(u) * kWarpSize + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      x_raw[u][r] =
          load_activation(reinterpret_cast<const Raw*>(static_cast<const T*>(p.x[r]) + v * kW),
                          v < num_vec && r < p.rows);
  }
}

template <typename T, int kRows, int kUnroll, typename Raw, typename Index>
__device__ __forceinline__ void register_rms_norm_rows(const Params& p,
                                                       Raw (&x_raw)[kUnroll][kRows], int lane,
                                                       Index num_vec) {
  constexpr int kW = static_cast<int>(sizeof(Raw) / sizeof(T));
  Raw n_raw[kUnroll];  // the norm weight's vectors
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const Index v = static_cast<Index>(u) * kWarpSize + lane;
    const bool in = v < num_vec;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      x_raw[u][r] = load_activation(
          reinterpret_cast<const Raw*>(static_cast<const T*>(p.x[r]) + v * kW), in && r < p.rows);
    n_raw[u] = load_activation(
        reinterpret_cast<const Raw*>(static_cast<const T*>(p.norm_weight) + v * kW), in);
  }
  float ss[kRows];  // this lane's sum of x[r]^2
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    ss[r] = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (static_cast<Index>(u) * kWarpSize >= num_vec) break;  // zeros past the row
      float f[kW];
      unpack<T>(x_raw[u][r], f);
#pragma unroll
      for (int i = 0; i < kW; ++i) ss[r] += f[i] * f[i];
    }
  }
  float inv[kRows];
  if constexpr (kRows == 1) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      ss[0] += __shfl_xor_sync(kFullMask, ss[0], offset);
    inv[0] = 1.0f / sqrtf(ss[0] / static_cast<float>(p.k) + p.eps);
  } else {
    // Several rows: the transposed reduction (row r's sum in lanes r * 32 / kRows ..), one
    // division and square root a lane for its row, then each row's inv_r from its first lane.
    const float total = transposed_warp_sum(ss, lane);
    const float mine = 1.0f / sqrtf(total / static_cast<float>(p.k) + p.eps);
#pragma unroll
    for (int r = 0; r < kRows; ++r) inv[r] = __shfl_sync(kFullMask, mine, r * (kWarpSize / kRows));
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (static_cast<Index>(u) * kWarpSize >= num_vec) break;  // x_raw stays zero
    float w[kW];
    unpack<T>(n_raw[u], w);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float f[kW];
      unpack<T>(x_raw[u][r], f);
      T out[kW];
#pragma unroll
      for (int i = 0; i < kW; ++i) out[i] = from_float<T>(__fmul_rn(__fmul_rn(f[i], inv[r]), w[i]));
      memcpy(&x_raw[u][r], out, sizeof(Raw));
    }
  }
}

// Each warp streams the column groups w, w + W, ... (W warps in the grid); see the file header.
// `single_wave`: the launcher's grid is resident at once (stage 6's early trigger). With a
// prologue (kPro), x is first computed into dynamic shared memory (stage 0) or, for rms_norm
// with the launcher's register_prologue, into each warp's registers.
// kSlots > 0 (one row of 16-byte vectors, k a whole number of vectors, one batch of kSlots
// vectors per lane covering the row: the launcher's `slots`): kUnroll = kSlots, 32-bit indices,
// no tail and no next-batch step, so the code after the wait is the minimal GEMV's (load x and
// the residual, FMAs, shuffles, store). kSlots = 0: the general batch loop.
template <typename T, int kRows, int kCols, int kVec, Prologue kPro, int kSlots>
__global__ void __launch_bounds__(kMaxThreads)
    gemv_kernel(const Params p, bool single_wave, std::int64_t k_pad, bool prologue_vectorized,
                bool norm_direct, bool register_prologue) {
  static_assert(kSlots == 0 || (kRows == 1 && kVec > 1), "one-batch instances: one row, vectors");
  // [p.rows, k_pad] of T, then (rms_norm) [k_pad] fp32 norm weights
  extern __shared__ __align__(16) unsigned char prologue_rows[];
  using Raw = typename RawOf<kVec* static_cast<int>(sizeof(T))>::type;
  using Scalar = typename RawOf<static_cast<int>(sizeof(T))>::type;
  // Vector indices along k: 32-bit in the one-batch instances (num_vec <= kSlots * 32).
  using Index = std::conditional_t<(kSlots > 0), int, std::int64_t>;
  constexpr bool kOneBatch = kSlots > 0;
  constexpr bool kHasTail = kVec > 1 && !kOneBatch;
  constexpr int kUnroll = kOneBatch ? kSlots : unroll_for(kRows, kCols);
  constexpr int kStep = kUnroll * kWarpSize;  // vectors of a row one batch covers
  constexpr int kValues = kRows * kCols;      // accumulators per lane
  constexpr int kLanesPerValue = kWarpSize / kValues;

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t warps_per_cta = blockDim.x / kWarpSize;
  const std::int64_t grid_warps = static_cast<std::int64_t>(gridDim.x) * warps_per_cta;
  const std::int64_t num_groups = (p.n + kCols - 1) / kCols;
  std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * warps_per_cta +
                       static_cast<std::int64_t>(threadIdx.x / kWarpSize);
  // Warp-uniform: a warp without a group exits after the wait (stage 6), and the shuffles below
  // see full warps.
  const bool has_group = group < num_groups;
  // Stage 0 in registers (the launcher's register_prologue: one batch covers k, so the prologue
  // rows live in x_raw for the whole kernel; no shared memory, no barrier).
  const bool in_registers = kPro == Prologue::rms_norm && kVec > 1 && register_prologue;

  // Stage 1: the x rows, and the weight rows of the current group (clamped past n).
  const T* x_rows[kRows];  // each [k]
  T* const xs = reinterpret_cast<T*>(prologue_rows);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kPro == Prologue::none)
      x_rows[r] = static_cast<const T*>(p.x[r]);  // r >= rows: x[0]
    else
      x_rows[r] = xs + (r < p.rows ? r : 0) * k_pad;
  }
  // Each [k]: the kCols w rows of the current group.
  const T* w_rows[kCols];
  const auto point_rows = [&](std::int64_t g) {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      w_rows[c] = static_cast<const T*>(p.w) + std::min(g * kCols + c, p.n - 1) * p.w_row_stride;
  };

  // This lane's value after the reduction (stage 5): index r * kCols + c, the y row it goes to.
  const int value = lane / kLanesPerValue;
  const int out_row = value / kCols, out_col = value % kCols;
  void* y_row = p.y[0];
  const void* c_row = p.c[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (out_row == r) {
      y_row = p.y[r];
      c_row = p.c[r];
    }
  const bool stores = lane % kLanesPerValue == 0 && out_row < p.rows;

  // Stages 2 and 4: a batch of kUnroll vectors of each of the kCols w rows and kRows x rows per
  // lane, and with a group's first batch its tail scalars. Each batch is loaded in a block of its
  // own whose loads have no consumer before the block ends, so all of them are issued back to
  // back (ptxas otherwise sinks each load next to its first use and keeps only two or three in
  // flight).
  const Index num_vec = static_cast<Index>(p.k / kVec);
  const std::int64_t tail_k = static_cast<std::int64_t>(num_vec) * kVec + lane;  // lane < kVec - 1
  const bool in_tail = kHasTail && tail_k < p.k;
  Raw w_raw[kUnroll][kCols];  // [unroll, cols] vectors of w
  Raw x_raw[kUnroll][kRows];  // [unroll, rows] vectors of x
  Scalar w_tail[kCols];       // [cols] tail elements of w
  Scalar x_tail[kRows];       // [rows] tail elements of x
  const auto load_weights = [&](Index base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = base + u * kWarpSize + lane;
      const bool in_row = v < num_vec;
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        w_raw[u][c] = load_weight(reinterpret_cast<const Raw*>(w_rows[c] + v * kVec), in_row);
    }
  };
  const auto load_activations = [&](Index base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = base + u * kWarpSize + lane;
      const bool in_row = v < num_vec;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Raw* ptr = reinterpret_cast<const Raw*>(x_rows[r] + v * kVec);
        if constexpr (kPro == Prologue::none)
          x_raw[u][r] = load_activation(ptr, in_row);
        else
          x_raw[u][r] = load_shared(ptr, in_row);
      }
    }
  };
  const auto load_batch = [&](Index base) {
    load_weights(base);
    load_activations(base);
  };
  const auto load_first_weights = [&] {
    load_weights(0);
    if constexpr (kHasTail) {
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        w_tail[c] = load_weight(reinterpret_cast<const Scalar*>(w_rows[c] + tail_k), in_tail);
    }
  };
  const auto load_first_activations = [&] {
    load_activations(0);
    if constexpr (kHasTail) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Scalar* ptr = reinterpret_cast<const Scalar*>(x_rows[r] + tail_k);
        if constexpr (kPro == Prologue::none)
          x_tail[r] = load_activation(ptr, in_tail);
        else
          x_tail[r] = load_shared(ptr, in_tail);
      }
    }
  };
  const auto load_first_batch = [&] {
    load_first_weights();
    load_first_activations();
  };

  float acc[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;

  // Stage 5's residual element (Params::has_c) of each group, loaded with the group's first batch
  // (right after the wait for the first group), so its L2 round trip overlaps the stream instead
  // of following the reduction's shuffles. Its address is computed before the wait. With c = y
  // the next group's element is read before this group's store: another column, so still
  // read-then-written by one thread.
  ResidualLoad residual_now, residual_next;
  const auto residual_at = [&](std::int64_t g) {
    const std::int64_t j = g * kCols + out_col;
    return ResidualLoad::at(c_row, j * p.c_col_stride, p.c_dtype, p.has_c && stores && j < p.n);
  };

  // Stage 6: the only global accesses before the wait are the constant weights' first batch.
  point_rows(has_group ? group : 0);
  residual_now = residual_at(group);
  if (p.w_constant && has_group) load_first_weights();
  detail::wait_for_producers();
  if (single_wave) detail::allow_dependents();  // after the wait (launch.cuh)
  // The first group's residual element goes out first (a warp without a group has none), so its
  // round trip overlaps the prologue's too (silu_mul_matmul_add).
  residual_now.issue(p.c_dtype);
  if constexpr (kPro != Prologue::none) {
    if (!in_registers) run_prologue<T, kRows, kPro>(p, xs, k_pad, prologue_vectorized, norm_direct);
  }
  if (!has_group) return;
  if (!p.w_constant) load_first_weights();
  if constexpr (kPro == Prologue::rms_norm && kVec > 1) {
    if (in_registers) {
      register_rms_norm_rows<T, kRows, kUnroll>(p, x_raw, lane, num_vec);
      if constexpr (kHasTail) {  // k is whole vectors here: the tail is predicated off, zeros
#pragma unroll
        for (int r = 0; r < kRows; ++r) x_tail[r] = 0;
      }
    } else {
      load_first_activations();
    }
  } else {
    load_first_activations();
  }
  Index base = 0;
  for (;;) {
    // Stage 3: consume the batch in registers; slots past the row (their loads were predicated
    // off: zeros) are skipped, a warp-uniform branch (K = 576 bf16 is 72 vectors, 3 of the 12
    // slots of a general 1 x 1 batch: converting and multiplying the other 9 after the wait cost
    // ~0.3 us per call on the H200). Bit-identical: adding zero products changes no accumulator.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kWarpSize >= num_vec) break;
      float wf[kCols][kVec];
#pragma unroll
      for (int c = 0; c < kCols; ++c) unpack<T>(w_raw[u][c], wf[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float xf[kVec];
        unpack<T>(x_raw[u][r], xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if constexpr (kValues < kMinChains) {
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
    if constexpr (!kOneBatch) {
      base += kStep;
      if (base < num_vec) {  // the group's next batch
        load_batch(base);
        continue;
      }
    }

    // The group is done: its tail (stage 4), then the next group's first batch goes out before
    // this group's reduction and store (stage 5).
    if constexpr (kHasTail) {
      float wt[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float f[1];
        unpack<T>(w_tail[c], f);
        wt[c] = f[0];
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float f[1];
        unpack<T>(x_tail[r], f);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(f[0], wt[c], acc[r][c]);
      }
    }
    const std::int64_t j0 = group * kCols;
    group += grid_warps;
    const bool more = group < num_groups;  // warp-uniform
    if (more) {
      point_rows(group);
      residual_next = residual_at(group);
      residual_next.issue(p.c_dtype);
      if (in_registers)
        load_first_weights();  // the prologue's rows stay in x_raw (one batch covers k)
      else
        load_first_batch();
      base = 0;
    }

    float values[kValues];  // [rows * cols]
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        values[r * kCols + c] = acc[r][c];
        acc[r][c] = 0.0f;
      }
    const float sum = transposed_warp_sum(values, lane);
    if (stores && j0 + out_col < p.n) {
      float out = sum;
      if (p.has_c) out += residual_now.value(p.c_dtype);
      store_out(y_row, (j0 + out_col) * p.y_col_stride, out, p.out_dtype);
    }
    residual_now = residual_next;
    if (!more) break;
  }
}

// Stage 3 for one row, the per-lane order of gemv_kernel's stage 3: acc[c] = sum over the slots u
// in the row (slots past it skipped: a warp-uniform branch) of x_u . w_{u, c}, each vector's 8
// (16-bit) or 4 (f32) products as one partial per vector (kPartials: launch()'s mode below
// kMinChains columns, independent chains) or straight into one FMA chain per column. Shared by
// the one-row kernels (row_kernel, rope_pairs_kernel, swiglu_pairs_kernel), so their products are
// bitwise gemv_kernel's.
template <typename T, int kSlots, int kCols, bool kPartials>
__device__ __forceinline__ void accumulate_row(const uint4 (&x_raw)[kSlots][1],
                                               const uint4 (&w_raw)[kSlots][kCols], int num_vec,
                                               float (&acc)[kCols]) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
#pragma unroll
  for (int u = 0; u < kSlots; ++u) {
    if (u * kWarpSize >= num_vec) break;
    float xf[kVec];
    unpack<T>(x_raw[u][0], xf);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float wf[kVec];
      unpack<T>(w_raw[u][c], wf);
      if constexpr (kPartials) {
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) part = fmaf(xf[i], wf[i], part);
        acc[c] += part;
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[c] = fmaf(xf[i], wf[i], acc[c]);
      }
    }
  }
}

// Stages 1-2 of the one-row kernels (row_kernel, swiglu_pairs_kernel): this lane's 16-byte
// vectors of kCols weight rows, slot u of row c being the row's vector u * 32 + lane (one pointer
// per row, u * 512 bytes further per slot: the load's immediate offset), zeros past the row.
// Rows past n are clamped to n - 1 (loaded, never stored).
template <typename T, int kSlots, int kCols>
struct LaneWeights {
  static constexpr int kSlotElems = kWarpSize * (kVectorBytes / static_cast<int>(sizeof(T)));
  const T* lane_row[kCols];  // each: this lane's vector of slot 0 of row c
  uint4 raw[kSlots][kCols];  // [slots, cols] vectors of w

  __device__ __forceinline__ LaneWeights(const Params& p, const std::int64_t (&rows)[kCols],
                                         int lane) {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      lane_row[c] = static_cast<const T*>(p.w) + std::min(rows[c], p.n - 1) * p.w_row_stride +
                    lane * (kVectorBytes / static_cast<int>(sizeof(T)));
  }
  // lane_vectors = the row's vectors less the lane index: slot u is in the row when u * 32 <
  // lane_vectors.
  __device__ __forceinline__ void load(int lane_vectors) {
#pragma unroll
    for (int u = 0; u < kSlots; ++u)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        raw[u][c] = load_weight(reinterpret_cast<const uint4*>(lane_row[c] + u * kSlotElems),
                                u * kWarpSize < lane_vectors);
  }
};

// ---- the decode-row kernel (launch()'s one-row, one-wave products) ---------------------------
//
// launch() routes here a product of one x row whose weight and x rows are 16-byte vectors, that
// one batch of kSlots vectors per lane covers (K = 576 bf16: 3 slots; 1536: 6) and whose column
// groups fit one resident wave: the batch-1 products of a decode step (q|k|v, o_proj, gate|up,
// down). It runs gemv_kernel's stages for that case in the least code: in a decode step every
// kernel starts with a cold instruction cache, and each KB a call executes costs ~0.06 us
// (docs/perf.md runs 26-27), more than the kernel's arithmetic.
//   1. Warp g takes the columns g kCols .. g kCols + kCols - 1 (clamped to n - 1 for the loads,
//      never stored past n) and nothing else: no group loop, no next-group prefetch.
//   2. Lane l reads vectors v = u 32 + l, u < kSlots, of each weight row: one pointer per row,
//      u * 512 bytes further per slot (the load's immediate offset), predicated off (zeros) past
//      the row.
//   0. The prologue, after the wait: rms_norm in registers (register_rms_norm_rows: every warp
//      normalizes the whole row itself); silu_mul once per CTA into shared memory: each thread
//      copies its 16-byte chunks c = tid, tid + blockDim, ... of a and b with cp.async (all in
//      flight at once), waits for them, rewrites each chunk of a as
//      round_T(round_T(a / (1 + e^-a)) * b) in a rolled loop (the cuda silu_mul kernel's exact
//      operations), then one barrier; warps read their x vectors from there.
//   3, 5. gemv_kernel's per-lane FMA order and reduction tree for one row, so the product is
//      bitwise gemv_kernel's one-batch instance (and rope_pairs_kernel's q|k|v).
//   6. PDL: with Params::w_constant the weights are loaded before the wait, everything else
//      after it. The grid is one wave, so every CTA triggers its dependents as its first
//      instruction: the next kernel is resident, its own constant weights in flight, while this
//      one still waits and works (-11 us per SmolLM2-shaped step_greedy, -20 us per token in the
//      decode loop against triggering after the wait: docs/perf.md run 35).
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared_dst)),
               "l"(global_src));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n"); }

// Stage 0 for silu_mul: h [num_vec] 16-byte vectors of the row h = silu_mul(a, b) in shared
// memory, with b_stage [num_vec] as the staging area of b. Every thread of the CTA calls it.
template <typename T>
__device__ __forceinline__ void silu_mul_row_to_shared(const Params& p, uint4* h, uint4* b_stage,
                                                       int num_vec) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const uint4* const a = static_cast<const uint4*>(p.x[0]);  // [num_vec]
  const uint4* const b = static_cast<const uint4*>(p.b[0]);  // [num_vec]
#pragma unroll 1
  for (int c = tid; c < num_vec; c += threads) {
    cp_async_16(h + c, a + c);
    cp_async_16(b_stage + c, b + c);
  }
  cp_async_wait_all();  // this thread's copies; it alone rewrites its chunks
#pragma unroll 1
  for (int c = tid; c < num_vec; c += threads) {
    float fa[kVec], fb[kVec];
    unpack<T>(h[c], fa);
    unpack<T>(b_stage[c], fb);
    T out[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float s = to_float(from_float<T>(fa[i] / (1.0f + expf(-fa[i]))));
      out[i] = from_float<T>(__fmul_rn(s, fb[i]));
    }
    memcpy(&h[c], out, sizeof(uint4));
  }
  __syncthreads();
}

// Stage stamps of thread 0 of CTA 0 (kernel-stamps builds: dev/step_stamps) in the one-row
// kernels (row, rope_pairs, swiglu_pairs): the prologue's end (silu_mul: its barrier; rms_norm:
// the normalized row in registers), the FMAs' end (the weights have landed), the store.
inline constexpr unsigned kMarkPrologueDone = 2, kMarkProductDone = 3, kMarkRowStored = 4;

template <typename T, int kCols, int kSlots, Prologue kPro>
__global__ void __launch_bounds__(kMaxThreads) row_kernel(const Params p) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kLanesPerValue = kWarpSize / kCols;
  // silu_mul: [2, num_vec] 16-byte vectors, h (rewritten over a) then b's staging area
  extern __shared__ __align__(16) unsigned char silu_rows[];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x / kWarpSize) +
                    static_cast<int>(threadIdx.x) / kWarpSize;
  const int num_vec = static_cast<int>(p.k / kVec);
  const bool has_group = group < static_cast<int>((p.n + kCols - 1) / kCols);  // warp-uniform
  const int lane_vectors = num_vec - lane;  // slot u is in the row when u * 32 < lane_vectors

  // Stages 1-2: the group's weight rows.
  const std::int64_t j0 = static_cast<std::int64_t>(has_group ? group : 0) * kCols;
  std::int64_t rows[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) rows[c] = j0 + c;
  LaneWeights<T, kSlots, kCols> w(p, rows, lane);

  // Stage 5's target: lane l holds column l / kLanesPerValue after the reduction.
  const int out_col = lane / kLanesPerValue;
  const std::int64_t j = j0 + out_col;
  const bool stores = has_group && lane % kLanesPerValue == 0 && j < p.n;
  ResidualLoad residual =
      ResidualLoad::at(p.c[0], j * p.c_col_stride, p.c_dtype, p.has_c && stores);

  // Stage 6.
  const detail::StageStamps stages;  // kernel-stamps builds only (launch.cuh); empty otherwise
  detail::allow_dependents();        // first thing: one wave (launch.cuh)
  if (p.w_constant && has_group) w.load(lane_vectors);
  detail::wait_for_producers();
  residual.issue(p.c_dtype);
  uint4* const h = reinterpret_cast<uint4*>(silu_rows);  // [num_vec]
  if constexpr (kPro == Prologue::silu_mul) silu_mul_row_to_shared<T>(p, h, h + num_vec, num_vec);
  stages.mark(kMarkPrologueDone);
  if (!has_group) return;
  if (!p.w_constant) w.load(lane_vectors);
  uint4 x_raw[kSlots][1];  // [slots, 1] vectors of x
  if constexpr (kPro == Prologue::rms_norm) {
    register_rms_norm_rows<T, 1, kSlots>(p, x_raw, lane, num_vec);
  } else {
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      const bool in_row = u * kWarpSize < lane_vectors;
      if constexpr (kPro == Prologue::silu_mul)
        x_raw[u][0] = load_shared(h + u * kWarpSize + lane, in_row);
      else
        x_raw[u][0] = load_activation(
            reinterpret_cast<const uint4*>(static_cast<const T*>(p.x[0]) + lane * kVec) +
                u * kWarpSize,
            in_row);
    }
  }

  // Stage 3.
  float acc[kCols];
  accumulate_row<T, kSlots, kCols, (kCols < kMinChains)>(x_raw, w.raw, num_vec, acc);
  stages.mark(kMarkProductDone);
  // Stage 5.
  const float sum = transposed_warp_sum(acc, lane);
  if (stores) {
    float out = sum;
    if (p.has_c) out += residual.value(p.c_dtype);
    store_out(p.y[0], j * p.y_col_stride, out, p.out_dtype);
  }
  stages.mark(kMarkRowStored);
}

// ---- the RoPE epilogue (launch_rope, gemv.h's RopeParams)
// ----------------------------------------
//
// rms_norm_matmul_rope_kv_append in one launch (the two-kernel chain is launch() with the
// register rms_norm prologue, then rope_kv_append.cu):
//   1. Mapping ("rope pairs"): warp g < (Hq + 2 Hkv) D/2 takes head h = g / (D/2), i = g % (D/2)
//      and the weight rows j0 = h D + i, j1 = j0 + D/2 (no weight permutation).
//   2. Before the wait: with w_constant the two rows' kSlots vectors per lane (stage 2's loads);
//      with position_stable p = position[0] and this lane's table entries at row p.
//   3. After it: register_rms_norm_rows (stage 0 in registers: every warp normalizes the whole
//      row itself), the weights when not constant, p and the tables when not stable.
//   4. Per lane, acc_c = sum over its vectors v = u * 32 + lane of x_v . w_{j_c, v} in launch()'s
//      order for the columns per warp launch() takes at this n (kPartials: a partial per vector
//      when that is 1 or 2 columns, one FMA chain at 4); then transposed_warp_sum over the two
//      values: lanes 0 .. 15 hold y0 = y[j0], lanes 16 .. 31 y1 = y[j1] (the same butterfly tree,
//      offsets 16, 8, 4, 2, 1, as launch()'s reduction at any column count), and one xor-16
//      shuffle gives each lane the other half.
//   5. Epilogue, lane 0 storing element i and lane 16 element i + D/2: x1 = float(round_T(y0)),
//      x2 = float(round_T(y1)) (launch()'s store, read back as rope_kv_append reads it);
//        q, k heads: y_i = x1 c_i + (-x2) s_i,  y_{i+D/2} = x2 c_{i+D/2} + x1 s_{i+D/2}
//      each product rounded to fp32 before the sum (rope_kv_append.cu's exact operations), into
//      out[h] (q) or k_cache[h - Hq, p]; v heads: round_T(y) into v_cache[h - Hq - Hkv, p]. A p
//      outside [0, min(table_rows, capacity)) writes zeros to out and leaves the caches.
//   6. PDL as stage 6: every thread waits before its first read of x or write of a target and
//      before the early exit of a warp without a pair; a single-wave grid triggers after it, or,
//      with the trigger_first hint (rope_kv_append's trigger_dependents_first), first thing.
// The RoPE epilogue's target of one lane (rope_pairs_kernel, and norm_rows_kernel at 2-8 rows):
// element e of head h of row r (q heads: out's element; k, v heads: the cache's element at cache
// row 0, the caller adds p * row_stride), and the cos / sin column e.
struct RopeTarget {
  char* base = nullptr;         // bytes: element (r, h, e) at cache row 0, or out's element
  std::int64_t row_stride = 0;  // elements between cache rows (0 for q heads)
  int e = 0;                    // the element's index in the head (the cos / sin column)
  bool is_q = false, is_v = false;
};
template <typename T>
__device__ __forceinline__ RopeTarget rope_target(const RopeParams& p, int row, int head, int e) {
  RopeTarget t;
  t.e = e;
  t.is_q = head < p.heads;
  t.is_v = head >= p.heads + p.kv_heads;
  T* at;
  if (t.is_q) {
    at = static_cast<T*>(p.out) + row * p.out_row_stride + head * p.out_head_stride;
  } else if (!t.is_v) {
    at = static_cast<T*>(p.k_cache) + row * p.k_batch_stride + (head - p.heads) * p.k_head_stride;
    t.row_stride = p.k_row_stride;
  } else {
    at = static_cast<T*>(p.v_cache) + row * p.v_batch_stride +
         (head - p.heads - p.kv_heads) * p.v_head_stride;
    t.row_stride = p.v_row_stride;
  }
  t.base = reinterpret_cast<char*>(at + t.e);
  return t;
}

// The RoPE epilogue's store of one element at cache row `row` (0 for q heads): this lane's sum
// and its pair partner's `other` (upper: this lane holds element i + D/2), each rounded to T as
// launch() stores it and read back as rope_kv_append reads it; q, k heads rotated with (c, s),
// each product rounded to fp32 before the sum (rope_kv_append.cu's exact operations), v heads
// copied; a position outside the caches (!valid) zeroes a q element and writes no cache.
template <typename T>
__device__ __forceinline__ void store_rope_element(const RopeTarget& t, std::int64_t row,
                                                   bool valid, bool upper, float sum, float other,
                                                   float c, float s) {
  const T mine = from_float<T>(sum);
  const float x_mine = to_float(mine), x_other = to_float(from_float<T>(other));
  const float x1 = upper ? x_other : x_mine, x2 = upper ? x_mine : x_other;  // i, i + D/2
  T* const y = reinterpret_cast<T*>(t.base) + row * t.row_stride;
  if (t.is_v) {
    if (valid) *y = mine;  // an exact copy of the rounded element
  } else if (valid) {
    *y = upper ? from_float<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)))
               : from_float<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(-x2, s)));
  } else if (t.is_q) {
    *y = from_float<T>(0.0f);
  }
}

template <typename T, int kSlots, bool kPartials>
__global__ void __launch_bounds__(kMaxThreads)
    rope_pairs_kernel(const RopeParams p, bool single_wave) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  using Raw = typename RawOf<kVectorBytes>::type;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int half = p.dim / 2;
  const int pairs = (p.heads + 2 * p.kv_heads) * half;
  const int pair = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x / kWarpSize) +
                   static_cast<int>(threadIdx.x) / kWarpSize;
  const bool has_pair = pair < pairs;  // warp-uniform
  const int head = has_pair ? pair / half : 0, i = has_pair ? pair % half : 0;
  const int num_vec = static_cast<int>(p.product.k / kVec);
  // Stage 1: the pair's weight rows, each [k].
  const T* const w0 = static_cast<const T*>(p.product.w) +
                      static_cast<std::int64_t>(head * p.dim + i) * p.product.w_row_stride;
  const T* const w1 = w0 + static_cast<std::int64_t>(half) * p.product.w_row_stride;
  Raw w_raw[kSlots][2];  // [slots, 2] vectors of w rows j0, j1
  const auto load_weights = [&] {
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      const int v = u * kWarpSize + lane;
      const bool in_row = v < num_vec;
      w_raw[u][0] = load_weight(reinterpret_cast<const Raw*>(w0 + v * kVec), in_row);
      w_raw[u][1] = load_weight(reinterpret_cast<const Raw*>(w1 + v * kVec), in_row);
    }
  };
  // Stage 5's target of this lane (lanes 0 and 16 store): element e of head h at cache row 0.
  const bool upper = lane >= kWarpSize / 2;
  const bool stores = has_pair && lane % (kWarpSize / 2) == 0;
  const RopeTarget target = rope_target<T>(p, 0, head, i + (upper ? half : 0));
  bool valid = false;
  std::int64_t row = 0;
  float c = 0.0f, s = 0.0f;  // cos, sin at (p, e)
  const auto read_position = [&] {
    const std::int64_t pos = detail::load_in_order(p.position);
    valid = pos >= 0 && pos < p.table_rows && pos < p.capacity;
    row = valid ? pos : 0;
  };
  const auto read_tables = [&] {
    if (!stores || !valid || target.is_v) return;
    const std::int64_t at = row * p.table_stride0 + target.e * p.table_stride1;
    c = load_any(p.cos, p.table_dtype, at);
    s = load_any(p.sin, p.table_dtype, at);
  };

  // Stage 2: only the promised-constant reads go before the wait.
  const detail::StageStamps stages;  // kernel-stamps builds only (launch.cuh); empty otherwise
  if (p.trigger_first && single_wave) detail::allow_dependents();  // the next kernel may launch
  if (p.product.w_constant && has_pair) load_weights();
  if (p.position_stable && stores) {
    read_position();
    read_tables();
  }
  detail::wait_for_producers();
  if (single_wave && !p.trigger_first) detail::allow_dependents();  // after the wait (launch.cuh)
  if (!has_pair) return;
  // Stage 3.
  if (!p.product.w_constant) load_weights();
  Raw x_raw[kSlots][1];  // [slots, 1] vectors of the normalized row
  register_rms_norm_rows<T, 1, kSlots>(p.product, x_raw, lane, num_vec);
  stages.mark(kMarkPrologueDone);
  if (!p.position_stable && stores) {
    read_position();
    read_tables();
  }
  // Stage 4: gemv_kernel's stage 3 for one row and the two columns.
  float acc[2];
  accumulate_row<T, kSlots, 2, kPartials>(x_raw, w_raw, num_vec, acc);
  stages.mark(kMarkProductDone);
  const float sum = transposed_warp_sum(acc, lane);  // y0 in lanes 0 .. 15, y1 in 16 .. 31
  const float other = __shfl_xor_sync(kFullMask, sum, kWarpSize / 2);
  if (!stores) return;
  // Stage 5.
  store_rope_element<T>(target, row, valid, upper, sum, other, c, s);
  stages.mark(kMarkRowStored);
}

// ---- the SwiGLU epilogue (launch_swiglu, gemv.h's SwigluParams) -----------------------------
//
// rms_norm_matmul_swiglu in one launch (the two-kernel chain is launch() with the register
// rms_norm prologue over the stacked [2I, k] gate|up weight, then layer_ops.cu's silu_mul over
// the two halves of its output):
//   1. Mapping ("swiglu pairs"): warp g < ceil(I / 2) takes j = 2 g and the four weight rows
//      j, j + 1 (gate) and I + j, I + j + 1 (up), clamped to 2I - 1 for the loads (an odd I's
//      last warp loads a row it never stores); no weight permutation.
//   2. Before the wait: with w_constant the four rows' kSlots vectors per lane (stage 2's loads).
//   3. After it: register_rms_norm_rows (stage 0 in registers: every warp normalizes the whole
//      row itself), and the weights when not constant. (A single-wave grid triggers its
//      dependents as its first instruction, as row_kernel does.)
//   4. Per lane, acc_c = sum over its vectors v = u * 32 + lane of x_v . w_{col_c, v} in
//      launch()'s order for the columns per warp launch() takes at n = 2I (kPartials: a partial
//      per vector when that is 1 or 2 columns, one FMA chain per column at 4: each column's chain
//      is the same whichever columns share its warp); then transposed_warp_sum over the four
//      values: lane l holds value l / 8 (gate j in lanes 0 .. 7, gate j + 1 in 8 .. 15, up j in
//      16 .. 23, up j + 1 in 24 .. 31), each summed by the butterfly tree of offsets 16, 8, 4, 2,
//      1 that launch()'s reduction applies at any column count; one xor-16 shuffle hands lanes
//      0 .. 15 the matching up sum.
//   5. Epilogue, lane 0 storing out[j] and lane 8 out[j + 1] (when < I): g = float(round_T(gate
//      sum)), u = float(round_T(up sum)) (launch()'s store, read back as silu_mul reads it), then
//      silu_mul's exact operations: s = round_T(g / (1 + e^-g)), out = round_T(s * u) (IEEE
//      division, __fmul_rn).
//   6. PDL as stage 6: every thread waits before its first read of x or write of out and before
//      the early exit of a warp without a pair; the weights are the only reads before it, and only
//      under w_constant.
// So out is bit for bit the two kernels' wherever launch() runs the product in a one-batch
// instance with the register prologue, which swiglu_supported requires.
// Stage 5 of the SwiGLU kernels: the gate and up sums as the chain stores and reads them back
// (g = float(round_T(gate)), u = float(round_T(up))), then silu_mul's exact operations:
// s = round_T(g / (1 + e^-g)), out = round_T(s * u) (IEEE division, __fmul_rn).
template <typename T>
__device__ __forceinline__ T swiglu_of_sums(float gate_sum, float up_sum) {
  const float g = to_float(from_float<T>(gate_sum)), u = to_float(from_float<T>(up_sum));
  const float s = to_float(from_float<T>(g / (1.0f + expf(-g))));
  return from_float<T>(__fmul_rn(s, u));
}

template <typename T, int kSlots, bool kPartials>
__global__ void __launch_bounds__(kMaxThreads)
    swiglu_pairs_kernel(const SwigluParams p, bool single_wave) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kCols = 4;  // gate j, gate j + 1, up j, up j + 1
  constexpr int kLanesPerValue = kWarpSize / kCols;
  const Params& q = p.product;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int pair = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x / kWarpSize) +
                   static_cast<int>(threadIdx.x) / kWarpSize;
  const std::int64_t inter = p.inter;
  const bool has_pair = pair < static_cast<int>((inter + 1) / 2);  // warp-uniform
  const int num_vec = static_cast<int>(q.k / kVec);
  const int lane_vectors = num_vec - lane;  // slot u is in the row when u * 32 < lane_vectors
  // Stage 1: the four weight rows.
  const std::int64_t j = 2 * static_cast<std::int64_t>(has_pair ? pair : 0);
  const std::int64_t rows[kCols] = {j, j + 1, inter + j, inter + j + 1};
  LaneWeights<T, kSlots, kCols> w(q, rows, lane);
  // Stage 5's target: lane 0 stores out[j], lane 8 out[j + 1].
  const std::int64_t e = j + lane / kLanesPerValue;
  const bool stores =
      has_pair && lane < 2 * kLanesPerValue && lane % kLanesPerValue == 0 && e < inter;
  T* const target = static_cast<T*>(p.out) + e;

  // The trigger (first thing in a one-wave grid, as row_kernel), stage 2 (only the
  // promised-constant weights), the wait.
  const detail::StageStamps stages;  // kernel-stamps builds only (launch.cuh); empty otherwise
  if (single_wave) detail::allow_dependents();  // launch.cuh
  if (q.w_constant && has_pair) w.load(lane_vectors);
  detail::wait_for_producers();
  if (!has_pair) return;
  // Stage 3.
  if (!q.w_constant) w.load(lane_vectors);
  uint4 x_raw[kSlots][1];  // [slots, 1] vectors of the normalized row
  register_rms_norm_rows<T, 1, kSlots>(q, x_raw, lane, num_vec);
  stages.mark(kMarkPrologueDone);
  // Stage 4: gemv_kernel's stage 3 for one row and the four columns.
  float acc[kCols];
  accumulate_row<T, kSlots, kCols, kPartials>(x_raw, w.raw, num_vec, acc);
  stages.mark(kMarkProductDone);
  const float sum = transposed_warp_sum(acc, lane);  // gate in lanes 0 .. 15, up in 16 .. 31
  const float up = __shfl_xor_sync(kFullMask, sum, kWarpSize / 2);
  if (!stores) return;
  // Stage 5.
  *target = swiglu_of_sums<T>(sum, up);
  stages.mark(kMarkRowStored);
}

// ---- the 2-8 row rms_norm kernel (launch()'s rms_norm products, launch_swiglu and launch_rope
// at 2-8 rows) --
//
// norm_rows_kernel: kRows (2, 4 or 8) rows x [rows, k] of a 16-bit product that one batch of
// kSlots vectors per lane covers (K <= 256: one slot; K <= 768: three, 96 x registers a lane at 8
// rows, 237-255 in all, no spills: two 4-warp CTAs an SM), stage
// 0 in registers, four weight rows a warp, in the least code. A decode step runs every kernel with
// a cold instruction cache (row_kernel's note): gemv_kernel's 4-row rms_norm instance is ~72-105 KB
// of SASS and took 5.47 us cold at 4 rows of 1032 x 256, more than rms_norm then the plain GEMV
// (4.76), where the SwiGLU form of this kernel (~30 KB) took 3.02 (docs/perf.md run 343).
//   1. Mapping. Plain (P = Params, launch()): warp g takes columns j = 4 g .. 4 g + 3 (clamped
//      to n - 1 for the loads, never stored past n). SwiGLU (P = SwigluParams, launch_swiglu):
//      swiglu_pairs_kernel's pairs, j = 2 g and the rows j, j + 1 (gate), I + j, I + j + 1 (up).
//      RoPE (P = RopeParams, launch_rope): rope_pairs_kernel's pairs, two a warp: pair q_c = 2 g
//      + c / 2 (clamped to the last pair for the loads, never stored past it) of head h = q_c /
//      (D/2), i = q_c % (D/2), column c the row h D + i (c even) or h D + i + D/2 (c odd).
//      Each weight vector a lane loads is used for every row.
//   2. Before the wait: with w_constant the four rows' kSlots vectors per lane; after it
//      register_rms_norm_rows over the kRows rows (rows r >= rows read row 0's address with
//      their loads predicated off: zeros), and the weights when not constant.
//   3. gemv_kernel's stage 3 for kRows rows and four columns (kValues = 4 kRows >= kMinChains:
//      one FMA chain per value), then transposed_warp_sum: value v = r * 4 + c lands in lanes
//      v * kLanesPerValue ...
//   4. Store, lane v * kLanesPerValue for r < rows. Plain: y[r, j + c] = round_T(sum) (launch()'s
//      store for out_dtype = T). SwiGLU: gate (r, c < 2) and up (r, c + 2) are 2 kLanesPerValue
//      lanes apart, so one shuffle down hands each gate lane its up sum, and out[r, j + c] is
//      swiglu_pairs_kernel's stage 5. RoPE: the two halves of a pair (r, c) and (r, c ^ 1) are
//      kLanesPerValue lanes apart, so one xor shuffle hands each lane the other half, and row r's
//      element goes out as rope_pairs_kernel's stage 5 (q heads rotated into out row r, k heads
//      into k_cache[r, h, p], v heads copied into v_cache[r, h, p]; one p = position[0] for every
//      row, read with this lane's cos / sin entries before the wait under position_stable).
//   5. PDL as stage 6 of gemv_kernel (a one-wave grid triggers its dependents first thing).
// Not bitwise gemv_kernel: launch() picks its own columns per warp (1 at n = 1024-1032), whose
// per-lane partials order the fp32 sums differently; the CPU contract's tolerance covers it
// (tests/cuda/gemv_test.cc, prologue_ops_test.cc, swiglu_test.cc).
template <typename P>
__host__ __device__ __forceinline__ const Params& product_of(const P& p) {
  if constexpr (std::is_same_v<P, SwigluParams> || std::is_same_v<P, RopeParams>) {
    return p.product;
  } else {
    return p;
  }
}

template <typename P, typename T, int kRows, int kSlots, Prologue kPro>
__global__ void __launch_bounds__(kMaxThreads) norm_rows_kernel(const P p, bool single_wave) {
  static_assert(kRows == 2 || kRows == 4 || kRows == 8, "norm_rows_kernel: 2, 4 or 8 rows");
  constexpr bool kSwiglu = std::is_same_v<P, SwigluParams>;
  constexpr bool kRope = std::is_same_v<P, RopeParams>;
  static_assert(kPro == Prologue::rms_norm || (kPro == Prologue::none && !kSwiglu && !kRope),
                "norm_rows_kernel: rms_norm, or no prologue for a plain product");
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  // plain: j .. j + 3; SwiGLU: gate j, gate j + 1, up j, up j + 1; RoPE: both halves of pairs
  // j, j + 1
  constexpr int kCols = 4;
  constexpr int kValues = kRows * kCols;
  constexpr int kLanesPerValue = kWarpSize / kValues;
  const Params& q = product_of(p);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) +
                             static_cast<std::int64_t>(threadIdx.x / kWarpSize);
  // Stage 1: the output width (n, I, or the RoPE pairs), this warp's four weight rows.
  std::int64_t width, groups;
  if constexpr (kSwiglu) {
    width = p.inter, groups = (width + 1) / 2;
  } else if constexpr (kRope) {
    width = q.n / 2, groups = (width + 1) / 2;
  } else {
    width = q.n, groups = (width + kCols - 1) / kCols;
  }
  const bool has_group = group < groups;  // warp-uniform
  const int num_vec = static_cast<int>(q.k / kVec);
  const int lane_vectors = num_vec - lane;
  std::int64_t j, rows[kCols];
  if constexpr (kSwiglu) {
    j = 2 * (has_group ? group : 0);
    rows[0] = j, rows[1] = j + 1, rows[2] = width + j, rows[3] = width + j + 1;
  } else if constexpr (kRope) {
    j = 2 * (has_group ? group : 0);  // the first pair
    const std::int64_t half = p.dim / 2;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const std::int64_t pair = std::min(j + c / 2, width - 1);
      rows[c] = (pair / half) * p.dim + pair % half + (c % 2 == 1 ? half : 0);
    }
  } else {
    j = kCols * (has_group ? group : 0);
#pragma unroll
    for (int c = 0; c < kCols; ++c) rows[c] = j + c;
  }
  LaneWeights<T, kSlots, kCols> w(q, rows, lane);
  // Stage 4's target: this lane's value (r, c) after the reduction.
  const int value = lane / kLanesPerValue;
  const int out_row = value / kCols, out_col = value % kCols;
  void* y_row = q.y[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (out_row == r) y_row = q.y[r];
  // e: the output column (plain, SwiGLU) or the RoPE pair of this lane's value.
  const std::int64_t e = kRope ? j + out_col / 2 : j + out_col;
  const bool stores = has_group && lane % kLanesPerValue == 0 && (!kSwiglu || out_col < 2) &&
                      out_row < q.rows && e < width;
  // The residual element c[r, j + c] of a product without a prologue (launch()'s: y =
  // round_T(sum + c)); the rms_norm instances carry no residual code (norm_rows_supported).
  constexpr bool kResidual = kPro == Prologue::none;
  const void* c_row = q.c[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (out_row == r) c_row = q.c[r];
  ResidualLoad residual =
      ResidualLoad::at(c_row, e * q.c_col_stride, q.c_dtype, kResidual && q.has_c && stores);

  // The RoPE epilogue's target, position and table entries (read before the wait only under
  // position_stable, after it otherwise).
  [[maybe_unused]] RopeTarget rope;
  [[maybe_unused]] bool rope_valid = false;
  [[maybe_unused]] std::int64_t rope_row = 0;
  [[maybe_unused]] float rope_c = 0.0f, rope_s = 0.0f;  // cos, sin at (p, e)
  [[maybe_unused]] const auto read_position = [&] {
    if constexpr (kRope) {
      if (!stores) return;
      const std::int64_t pos = detail::load_in_order(p.position);
      rope_valid = pos >= 0 && pos < p.table_rows && pos < p.capacity;
      rope_row = rope_valid ? pos : 0;
      if (!rope_valid || rope.is_v) return;
      const std::int64_t at = rope_row * p.table_stride0 + rope.e * p.table_stride1;
      rope_c = load_any(p.cos, p.table_dtype, at);
      rope_s = load_any(p.sin, p.table_dtype, at);
    }
  };
  if constexpr (kRope) {
    const int pair = static_cast<int>(e), half = p.dim / 2;
    if (stores) rope = rope_target<T>(p, out_row, pair / half, pair % half + (out_col % 2) * half);
  }

  // Stage 2, then the wait (stage 5).
  if (single_wave) detail::allow_dependents();  // launch.cuh
  if (q.w_constant && has_group) w.load(lane_vectors);
  if constexpr (kRope) {
    if (p.position_stable) read_position();
  }
  detail::wait_for_producers();
  if (!has_group) return;
  residual.issue(q.c_dtype);
  if (!q.w_constant) w.load(lane_vectors);
  uint4 x_raw[kSlots][kRows];  // [slots, rows] vectors of the (normalized) rows
  if constexpr (kPro == Prologue::rms_norm) {
    register_rms_norm_rows<T, kRows, kSlots>(q, x_raw, lane, num_vec);
  } else {
    load_x_rows<T, kRows, kSlots>(q, x_raw, lane, num_vec);
  }
  if constexpr (kRope) {
    if (!p.position_stable) read_position();  // after the rows, as rope_pairs_kernel
  }
  // Stage 3.
  float acc[kValues];  // [rows * cols]
#pragma unroll
  for (int v = 0; v < kValues; ++v) acc[v] = 0.0f;
#pragma unroll
  for (int u = 0; u < kSlots; ++u) {
    if (u * kWarpSize >= num_vec) break;  // zeros past the row (warp-uniform)
    float wf[kCols][kVec];
#pragma unroll
    for (int c = 0; c < kCols; ++c) unpack<T>(w.raw[u][c], wf[c]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float xf[kVec];
      unpack<T>(x_raw[u][r], xf);
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          acc[r * kCols + c] = fmaf(xf[i], wf[c][i], acc[r * kCols + c]);
    }
  }
  const float sum = transposed_warp_sum(acc, lane);
  // Stage 4.
  T* const target = static_cast<T*>(y_row) + e * q.y_col_stride;
  if constexpr (kSwiglu) {
    const float up = __shfl_down_sync(kFullMask, sum, 2 * kLanesPerValue);  // (r, c + 2)'s sum
    if (stores) *target = swiglu_of_sums<T>(sum, up);
  } else if constexpr (kRope) {
    const float other = __shfl_xor_sync(kFullMask, sum, kLanesPerValue);  // (r, c ^ 1)'s sum
    if (stores)
      store_rope_element<T>(rope, rope_row, rope_valid, out_col % 2 == 1, sum, other, rope_c,
                            rope_s);
  } else {
    const bool add_c = kResidual && q.has_c;
    if (stores) *target = from_float<T>(add_c ? sum + residual.value(q.c_dtype) : sum);
  }
}

}  // namespace
}  // namespace splice::cuda::gemv
