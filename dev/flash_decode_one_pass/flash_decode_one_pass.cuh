// NOT IN MAINLINE (session 11): measured and set aside, see README.md here; the integration into
// flash_decode.cu, the dev knobs and the GPU tests are commit f128144. Kept as the reference for
// the register-fragment layout and the load-ordering dependency.
//
// Device code of flash decode's one-pass kernel (spec decode_attention.md §5): the short-range
// path of the launcher (flash_decode.cu), for grids planned with one split whose length bound fits
// in one CTA's registers (plan_flash_decode's `one_pass`: <= 256 keys at head_dim 64, <= 128 at
// 128; one row block; no softcap, ALiBi or window).
//
// Why a second kernel: at the model's short ranges the general kernel (flash_decode_kernel.cuh)
// is a latency chain, not a stream. A warp there walks its 16-key tiles one after the other
// through a shared-memory ring (~0.5 us a tile: the S chain, the max / exp chain, P V), so a
// 4-warp CTA over 256 keys pays four tiles in series (docs/perf-decode-step.md §8-9). Here every
// key of the range is in flight at once and the chains run side by side: each warp owns a fixed
// slice of kTiles x 16 keys, loads it straight into mma fragments (no ring, no ldmatrix, no CTA
// barrier before the scores) and the warps meet once, in the merge.
//
// One CTA = one (batch b, kv head h): kWarps warps, 16 query rows (row gr = g * q_len + i for
// group member g and query i, padding rows zero), warp w owning keys
// [w * kTiles * 16, (w + 1) * kTiles * 16).
//   1. Loads into registers, 16-byte global loads through L2 (ld.global.cg: the caches and q are
//      written by other kernels), keys at or past the live end never read (zeros instead):
//        - K: lane (g = lane / 4, c = lane % 4) holds keys 16 t + 8 j + g (tile t, half j) of its
//          warp, dims [c D/4, (c + 1) D/4);
//        - V: keys 16 t + {2c, 2c + 1, 2c + 8, 2c + 9}, dims [g D/8, (g + 1) D/8);
//        - q: rows g and g + 8 of the block, dims [c D/4, (c + 1) D/4).
//      The mma's k axis is the head dim in a permuted order (step s of the S = Q K^T chain reads
//      dims c D/4 + 4 s + {0, 1} as k = 2c, 2c + 1 and + {2, 3} as 2c + 8, 2c + 9): q and K use
//      the same order, so every dot product is unchanged, and each lane's operands are one
//      contiguous run of a row. The P V mma's n axis is the head dim in the order
//      n8 tile n, column g -> dim g D/8 + n, so a lane's V words are contiguous too; a byte
//      permute pairs two keys' values into one b register. O's fragment is unpermuted when it
//      is written to shared memory.
//      With the stable-prefix promise (p.stable_prefix: nothing in flight writes k_len or the cache
//      rows below k_len - q_len) k_len and those rows are loaded before the PDL wait, while the
//      producer runs; after it only q and this step's rows [k_len - q_len, k_len). (Prefetching
//      the stable rows into L2 instead and loading all rows after the wait took 1.0 us from the
//      wait to the last row in the SmolLM2 step, perf.md run 71: 64 KB through one SM's L2 port.)
//   2. Scores in log2 units, t = scale log2(e) (q . k), masked to -inf at keys >= k_len (and,
//      causal, > p_i = k_len - q_len + i); the warp's row maxima m (-inf: no visible key, the
//      weights are then 0), P = 2^(t - m) rounded to the input dtype for the P V mma, l = sum of
//      the fp32 weights, O = P V (fp32 accumulate).
//   3. Warps merge in shared memory, in warp order (deterministic): M = max_w m_w,
//      w_w = 2^(m_w - M), L = sum_w w_w l_w, o = sum_w w_w O_w / L, lse = (M + log2 L) ln 2
//      (o = 0 and lse = -inf where no key is visible). One CTA barrier in all.
// Dependent global round trips on the critical path after the wait: [q || k_len || every row below
// the capacity] -> o store; with the stable prefix [q || this step's rows] -> o store.
#pragma once

#include "backend/cuda/flash_decode_kernel.cuh"

namespace splice::cuda::detail {

template <int kHeadDim>
struct OnePassConfig {
  static constexpr int kWarps = 8;
  // 16-key tiles a warp holds at once: two at head_dim 64 (two independent S chains per warp),
  // one at 128, where the registers of a second tile would not fit beside O.
  static constexpr int kTiles = kHeadDim == 64 ? 2 : 1;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMaxKeys = kWarps * kTiles * kTileKeys;
  static constexpr int kQkWords = kHeadDim / 8;   // 32-bit words of a q / K row a lane holds
  static constexpr int kVWords = kHeadDim / 16;   // 32-bit words of a V row a lane holds
  static constexpr int kRedStride = kHeadDim + 4;  // floats per row of the merge scratch
  // Merge scratch for `rows` real rows: O [warps][rows][kRedStride], then (m, l) [warps][rows].
  static constexpr int smem_bytes(int rows) { return kWarps * rows * (kRedStride + 2) * 4; }
};

// `kWords` 32-bit words (a multiple of 4) at `src` into `dst` when `load`, 16-byte loads through
// L2 only (ld.global.cg: the caches and q are written by other kernels); `dst` keeps its values
// otherwise. Predicated volatile asm, so the loads are neither branched around nor moved below the
// kernel's mma (also volatile asm): every load of a CTA is in flight before its first use.
template <int kWords>
__device__ __forceinline__ void load_words_if(bool load, std::uint32_t (&dst)[kWords],
                                              const void* src) {
  static_assert(kWords % 4 == 0);
#pragma unroll
  for (int u = 0; u < kWords / 4; ++u)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
        "@p ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%5];\n}\n"
        : "+r"(dst[4 * u]), "+r"(dst[4 * u + 1]), "+r"(dst[4 * u + 2]), "+r"(dst[4 * u + 3])
        : "r"(static_cast<int>(load)), "l"(static_cast<const uint4*>(src) + u));
}

// The 16-bit element `e` (0 or 1) of `lo` and of `hi`, packed as (lo's, hi's) into one word.
__device__ __forceinline__ std::uint32_t pair_halves(std::uint32_t lo, std::uint32_t hi, int e) {
  return __byte_perm(lo, hi, e == 0 ? 0x5410 : 0x7632);
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(OnePassConfig<kHeadDim>::kThreads, 1)
    flash_decode_one_pass_kernel(const __grid_constant__ FlashDecodeParams p) {
  using Cfg = OnePassConfig<kHeadDim>;
  constexpr int kWarps = Cfg::kWarps;
  constexpr int kTiles = Cfg::kTiles;
  constexpr int kQk = Cfg::kQkWords;
  constexpr int kV = Cfg::kVWords;
  constexpr int kSteps = kHeadDim / 16;  // k16 steps of S = Q K^T
  constexpr int kOutTiles = kHeadDim / 8;  // n8 tiles of O
  extern __shared__ __align__(16) float scratch[];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // mma group: fragment row, K key, V dim block
  const int c = lane % 4;  // thread in group: fragment column pair, q / K dim block, V keys
  const int bh = blockIdx.z;
  const int b = bh / p.num_kv_heads;
  const int kv_head = bh % p.num_kv_heads;
  const int key0 = warp * kTiles * kTileKeys;  // the warp's first key
  const StageStamps stages;  // kernel-stamps builds only (launch.cuh); empty otherwise

  const T* k_base = static_cast<const T*>(p.k) + b * p.k_stride_b + kv_head * p.k_stride_h;
  const T* v_base = static_cast<const T*>(p.v) + b * p.v_stride_b + kv_head * p.v_stride_h;
  std::uint32_t k_words[kTiles][2][kQk] = {};  // [tile][half j] key 16 t + 8 j + g
  std::uint32_t v_words[kTiles][4][kV] = {};   // [tile][r] key 16 t + 2c + (r & 1) + 8 (r >> 1)
  // Loads this lane's K and V rows whose keys are in [from, to); the others keep their values.
  auto load_keys = [&](int from, int to) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = key0 + t * kTileKeys + 8 * j + g;
        load_words_if(key >= from && key < to, k_words[t][j],
                      k_base + key * p.k_stride_s + c * (kHeadDim / 4));
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + t * kTileKeys + 2 * c + (r & 1) + 8 * (r >> 1);
        load_words_if(key >= from && key < to, v_words[t][r],
                      v_base + key * p.v_stride_s + g * (kHeadDim / 8));
      }
    }
  };
  const auto live_length = [&] { return min(max(p.k_len[b * p.k_len_stride], 0), p.capacity); };

  // Stage 1: loads (k_len and the stable rows before the PDL wait when the caller promises them).
  const bool stable_prefix = p.stable_prefix != 0;
  int k_len = 0;
  if (stable_prefix) {
    k_len = live_length();
    load_keys(0, k_len - p.q_len);
  }
  if (p.trigger_first) allow_dependents();  // dev knob (FlashDecodeDevKnobs::trigger_first)
  wait_for_producers();  // launch.cuh: no-op for a launch without the PDL attribute
  if (!p.trigger_first) allow_dependents();
  std::uint32_t q_words[2][kQk] = {};  // rows g and g + 8 (q does not wait for k_len)
  int query[2];                        // the row's query i (-1: a padding row)
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int gr = g + 8 * rr;
    const bool real = gr < p.rows;
    const auto [gi, i] = query_row(p, real ? gr : 0);
    load_words_if(real, q_words[rr],
                  static_cast<const T*>(p.q) + b * p.q_stride_b +
                      (kv_head * p.group + gi) * p.q_stride_h + i * p.q_stride_s +
                      c * (kHeadDim / 4));
    query[rr] = real ? i : -1;
  }
  // Without the promise every row below the capacity is loaded beside k_len: a one-pass grid is one
  // wave (its plan rule), so it is latency-bound and the rows past k_len cost nothing on the path.
  // V rows at or past k_len are zeroed once k_len is known (their P is 0, but they may hold NaN
  // and 0 * NaN would leak into O; K's are masked by the scores' select).
  load_keys(stable_prefix ? max(k_len - p.q_len, 0) : 0, stable_prefix ? k_len : p.capacity);
  if (!stable_prefix) {
    k_len = live_length();
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const bool live = key0 + t * kTileKeys + 2 * c + (r & 1) + 8 * (r >> 1) < k_len;
#pragma unroll
        for (int u = 0; u < kV; ++u) v_words[t][r][u] = live ? v_words[t][r][u] : 0u;
      }
  }
  // Every load in flight before the first mma. ptxas sinks loads below S mma that wait for q (so
  // they would start only after q's round trip), and neither a warp nor a CTA barrier holds it
  // back; for this step's rows it also orders the loads after the S chain, since they write
  // registers that loads before the wait wrote. A data dependency holds them: the score
  // accumulators start at a zero computed from one word of every K and V load,
  // (xor of the words) & p.dev_drop, and dev_drop is 0 in every one-pass launch (the launcher's
  // condition). The loads after the wait were issued together with q's, so waiting for them
  // here costs about what waiting for q costs anyway.
  std::uint32_t loaded = 0;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int u = 0; u < kQk; u += 4) loaded ^= k_words[t][j][u];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int u = 0; u < kV; u += 4) loaded ^= v_words[t][r][u];
  }
  const float score_zero = __uint_as_float(loaded & static_cast<std::uint32_t>(p.dev_drop));
  stages.mark_after(score_zero, kMarkQReady);  // every K and V row has landed
  int vis_hi[2];  // keys [0, vis_hi) are visible to the row (none for a padding row)
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int pos = k_len - p.q_len + query[rr];
    vis_hi[rr] = query[rr] < 0 ? 0 : p.causal ? min(k_len, pos + 1) : k_len;
  }

  // Stage 2: scores, row maxima, weights and O = P V for the warp's keys.
  float s[kTiles][2][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][j][e] = score_zero;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const std::uint32_t a[4] = {q_words[0][2 * ks], q_words[1][2 * ks], q_words[0][2 * ks + 1],
                                    q_words[1][2 * ks + 1]};
        Num<T>::mma(s[t][j], a, k_words[t][j][2 * ks], k_words[t][j][2 * ks + 1]);
      }
    }
  stages.mark_after(s[0][0][0], kMarkFirstTile);
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + t * kTileKeys + 8 * j + 2 * c + (e & 1);
        const int rr = e >> 1;
        s[t][j][e] = key < vis_hi[rr] ? s[t][j][e] * p.scale_log2 : -INFINITY;
        row_max[rr] = fmaxf(row_max[rr], s[t][j][e]);
      }
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    row_max[rr] = fmaxf(row_max[rr], __shfl_xor_sync(0xffffffffu, row_max[rr], 1));
    row_max[rr] = fmaxf(row_max[rr], __shfl_xor_sync(0xffffffffu, row_max[rr], 2));
  }
  // -inf (no visible key): subtract 0 instead, so every weight is 2^-inf = 0, not NaN.
  const float shift[2] = {row_max[0] == -INFINITY ? 0.0f : row_max[0],
                          row_max[1] == -INFINITY ? 0.0f : row_max[1]};
  std::uint32_t p_frag[kTiles][4];  // P as the A operand of P V: keys 2c, 2c + 1, 2c + 8, 2c + 9
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    float w[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        w[j][e] = exp2_ftz(s[t][j][e] - shift[e >> 1]);
        row_sum[e >> 1] += w[j][e];
      }
    p_frag[t][0] = Num<T>::pack(w[0][0], w[0][1]);
    p_frag[t][1] = Num<T>::pack(w[0][2], w[0][3]);
    p_frag[t][2] = Num<T>::pack(w[1][0], w[1][1]);
    p_frag[t][3] = Num<T>::pack(w[1][2], w[1][3]);
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    row_sum[rr] += __shfl_xor_sync(0xffffffffu, row_sum[rr], 1);
    row_sum[rr] += __shfl_xor_sync(0xffffffffu, row_sum[rr], 2);
  }
  float o[kOutTiles][4];  // n8 tile n, column pair 2c + {0, 1} -> dims (2c + {0, 1}) D/8 + n
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const std::uint32_t b0 = pair_halves(v_words[t][0][n / 2], v_words[t][1][n / 2], n % 2);
      const std::uint32_t b1 = pair_halves(v_words[t][2][n / 2], v_words[t][3][n / 2], n % 2);
      Num<T>::mma(o[n], p_frag[t], b0, b1);
    }
  }
  stages.mark_after(o[0][0], kMarkLoopDone);

  // Stage 3: the warps' (O, m, l) into shared memory, unpermuted; then the merge.
  const int rows = min(p.rows, kRows);
  float* ml = scratch + kWarps * rows * Cfg::kRedStride;  // (m, l) pairs
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int gr = g + 8 * rr;
    if (gr >= rows) continue;
    float* row = scratch + (warp * rows + gr) * Cfg::kRedStride;
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int n = 0; n < kOutTiles; n += 4)
        *reinterpret_cast<float4*>(row + (2 * c + e) * (kHeadDim / 8) + n) =
            make_float4(o[n][2 * rr + e], o[n + 1][2 * rr + e], o[n + 2][2 * rr + e],
                        o[n + 3][2 * rr + e]);
    if (c == 0)
      *reinterpret_cast<float2*>(ml + 2 * (warp * rows + gr)) =
          make_float2(row_max[rr], row_sum[rr]);
  }
  __syncthreads();
  stages.mark(kMarkScratch);
  constexpr int kSlotsPerRow = kHeadDim / 4;
  for (int slot = threadIdx.x; slot < rows * kSlotsPerRow; slot += Cfg::kThreads) {
    const int gr = slot / kSlotsPerRow;
    const int d = slot % kSlotsPerRow * 4;
    const ResultSlot<T> result = result_slot<T>(p, b, kv_head, gr, d);
    float2 warp_ml[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      warp_ml[w] = *reinterpret_cast<const float2*>(ml + 2 * (w * rows + gr));
    SplitMerge merged;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) merged.big = fmaxf(merged.big, warp_ml[w].x);
    const float big = merged.big == -INFINITY ? 0.0f : merged.big;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2_ftz(warp_ml[w].x - big);  // 0 for a warp that saw no key
      const float4 ow =
          *reinterpret_cast<const float4*>(scratch + (w * rows + gr) * Cfg::kRedStride + d);
      merged.denom += weight * warp_ml[w].y;
      merged.acc[0] += weight * ow.x;
      merged.acc[1] += weight * ow.y;
      merged.acc[2] += weight * ow.z;
      merged.acc[3] += weight * ow.w;
    }
    store_merged<T>(p, result, merged);
  }
  stages.mark(kMarkStored);
}

}  // namespace splice::cuda::detail
