// Device code of the flash-decode attention kernel (spec decode_attention.md §5). POD params in,
// nothing from ir/plan/exec; the launcher (flash_decode.cu) plans the grid and checks arguments.
//
// One CTA = (row block rb, split s, batch b x kv head h); W warps (4, or 8 in the plan's wide
// CTAs), each streaming its own keys; 16 query rows (one m16 tile: row = g * q_len + i for group
// member g and query i, padded with empty rows). The launcher may launch with programmatic
// dependent launch (PDL).
// Wide CTAs (flash_decode.h's plan rule: a small grid whose long ranges are split into >= 256-key
// splits) stream a split with twice the warps, so the grid needs half the splits for the same
// bytes in flight and the merge reads half the partials (docs/perf.md run 42).
//   0. PDL: wait until the previous kernel has finished and its writes are visible, then let the
//      next kernel in the stream start launching (no-ops without PDL; a cluster grid planned with
//      FlashDecodeTrigger::merge_inputs_landed lets it launch only once split 0 holds every
//      partial, stage 6', and at_exit at exit; flash_decode.h). Without the stable-prefix
//      promise nothing is read or written before the wait, so the split workspace and every
//      input are safe.
//   0'. With the promise (p.stable_prefix: nothing in flight writes k_len or the cache rows below
//      k_len - q_len; in a decode step only this step's appends write the caches, at rows
//      k_len - q_len ..): k_len, the plan (stage 2) and the ring prologue (stage 3) come before
//      the wait, the prologue tiles copying only their stable keys (< k_len - q_len). After the
//      wait the keys [k_len - q_len, hi) of those tiles are copied with q, in q's cp.async group
//      (the youngest then), by the whole CTA (one pass of 16-byte copies for a decode step). The
//      K/V loads overlap the producer's tail instead of following it.
//   1. Issue at once, independent of each other: the k_len load, the ALiBi slopes, the 16 query
//      rows (cp.async group 0, zeros for padding rows) and, speculatively, tile 0 of each warp's
//      K/V stream (group 1: its head tile, keys [16 (W s + w), + 16) for warp w of split s),
//      where the launcher sets p.head_plan (no left window, a one-wave grid, no forced split
//      count) and there is no stable-prefix promise: stage 2's head plan makes those keys every
//      split's first whatever k_len is, so every split streams from the wait on instead of after
//      k_len's round trip (docs/perf.md run 201: (1, 32, 8) 4K 7.37 -> 7.01 us). Under the late
//      splits (a one-wave grid of split 0s, then the pieces) split 0 alone speculates: its
//      tile 0 of warp w is keys [16 w, + 16) at every k_len. The stable
//      prefix plans the same way (its loads need k_len, which it has before the wait), so both
//      compute the same sums in the same order, bit for bit. The tile is read up to the capacity
//      (keys < capacity stay in bounds); what lies at or beyond the live end is masked in stage 4.
//      Only one ring stage is speculated: in a cache much longer than k_len (the model's: 256 keys,
//      k_len 17-256) the rest of the ring would be bytes read and waited for in vain.
//   2. Live range and plan. k_len is clamped to [0, capacity]; query i sits at
//      p_i = k_len - q_len + i; the keys any row may see are [lo, hi) with
//      lo = max(0, p_0 - left), hi = min(k_len, p_last + right + 1), n = hi - lo. Split size:
//        forced:  chunk = round_up(ceil(n / forced), 16);
//        n <= single_split_keys (the keys one CTA streams in less time than a merge costs), or
//        a unit below p.split_from_bh (the launcher's tail split of a multi-wave 4-warp grid,
//        whose units past the last full wave split; the others' splits >= 1 exit at entry):
//                 chunk = n, one split, no partials, no counter;
//        late splits (p.late_splits = L > 0, the launcher's one-wave one-split grids of 4-warp
//                 CTAs, launched as (row block, unit, split) so that every unit's split 0
//                 dispatches before any other): with c = round_up(ceil(n / 2^late_shift), 16),
//                 split 0 streams [lo, lo + n - L c) and split s >= 1 [lo + n - L c + (s - 1) c,
//                 + c); live = 1 + L, or 1 while n < (L + 1) c or n <= single_split_keys. The SMs
//                 that finish their unit first stream the other units' late pieces. Halving
//                 pieces (p.late_halving): c rounded up to 16 * 2^(L - 1) keys, the late region
//                 K = 2 c - c / 2^(L - 1) keys, piece s >= 1 [lo + n - K + 2 c - 2 (c >> (s - 1)),
//                 + (c >> (s - 1))), one split while n < K + c: the last slots to free take the
//                 smallest;
//        head plan (p.head_plan, n > single_split_keys; lo = 0): with S = gridDim.y and the
//                 head region R = 16 W S, split s streams its head [16 W s, 16 W (s + 1)) (tile
//                 0 of each warp) and then [c0, c1) = [R + s chunk, min(hi, R + (s + 1) chunk))
//                 with chunk = round_up(ceil((hi - R) / S), 16); live = S when hi > R, else
//                 ceil(n / (16 W));
//        else:    chunk = max(min_chunk, round_up(ceil(n / S), 16)) with S = gridDim.y;
//      live = ceil(n / chunk); CTAs with s >= live exit. Split s owns keys
//      [c0, c1) = [lo + s * chunk, min(hi, lo + (s + 1) * chunk)).
//   3. Loads. Each warp streams its own 16-key tiles t = warp, warp + W, ... of [c0, c1) (after
//      its head tile under the head plan) through a private cp.async ring (16-byte loads with an
//      L2 evict_first policy: K and V are read once a launch; kStages - 1 tiles in flight ahead
//      of the one in use, rows swizzled by chunk ^ (row & 7) so ldmatrix is conflict-free). Tiles 0
//      .. kStages - 2 (tile 0 already, if speculative) are issued after the plan, tiles < c1 only;
//      keys >= c1 are zero-filled; only the speculative tile, read up to the capacity, has its V
//      rows >= hi zeroed in shared memory before use (they may hold NaN, and 0 * NaN would leak).
//      Step `it` issues tile it + kStages - 1 and waits for exactly tile `it` (cp.async groups:
//      one per tile, in tile order). The CTA's warps take their steps together (a named barrier,
//      not the CTA barrier, at the top of each step every warp has: the first floor(tiles / W)
//      of [c0, c1), after the head step under the head plan when every warp's head tile is
//      live), so the CTA's copies in flight stay one run of keys rather than W runs drifting
//      apart; the DRAM reads such a stream at a higher rate (docs/perf.md runs 406-407: the 64K
//      one-wave grids' plateau 96.4 -> 96.55% of peak, cuDNN's 96.6%; 0.2% faster; runs 410-412,
//      the head plan: B = 1 16K 1.2-3% faster, 64K 1%, 4K level).
//   4. Scores (tensor cores, mma.sync m16n8k16, fp32 accumulate): S = Q K^T for 16 rows x 16 keys,
//      in log2 units t = log2(e) * s with s = scale * (q . k_j), then s = cap * tanh(s / cap)
//      (softcap), s += -slope_h * (p_i - j) (ALiBi), and t = -inf outside
//      max(c0, p_i - left) <= j < min(c1, p_i + 1 [causal], p_i + right + 1).
//      Online softmax per row. Wide CTAs rescale lazily: when some row of the warp has
//      max_j t_j > m + kRescaleSlack (8), every row takes m' = max(m, max_j t_j) and
//      l, O *= alpha = 2^(m - m'); otherwise m stays. Then l' = l + sum_j 2^(t_j - m'),
//      O' = O + P V with P = 2^(t - m') <= 2^8 rounded to the input dtype (mma.sync again).
//      Narrow CTAs rescale every tile: m' = max(m, max_j t_j), l' = alpha l + sum_j 2^(t_j - m'),
//      O' = alpha O + P V with P = 2^(t - m').
//   5. Warps merge in shared memory: M = max_w m_w, w_w = 2^(m_w - M), L = sum w_w l_w,
//      O = sum w_w O_w / L, lse2 = M + log2 L (-inf and O = 0 when L = 0: no visible key).
//   6. One live split: write o and lse = lse2 * ln 2. Otherwise write the fp32 partial
//      (O_s, lse2_s), CTA barrier, one release fence, bump the (b, h, rb) counter; the CTA that
//      brings it to `live` merges every split in split order (deterministic whichever CTA
//      merges), kMergeBatch splits per batch, each batch's lse2_s and O_s loaded at once (one L2
//      round trip per batch):
//        M' = max(M, max_s lse2_s), r = 2^(M - M'), D' = r D + sum_s 2^(lse2_s - M'),
//        A' = r A + sum_s 2^(lse2_s - M') O_s;  o = A / D, lse2 = M + log2 D,
//      and resets the counter to 0 for the next launch (graph replay safe).
//   6'. Cluster merge (the kClusterMerge instances, launched in clusters of (1, gridDim.y, 1): a
//      unit's <= 16 splits; the launcher checks that split 0's ring holds the receive area and
//      that every cluster of the grid is resident at once): no global round trip. At entry every
//      CTA initializes two mbarriers and arrives (relaxed) on the cluster barrier, and waits on it
//      once its ring prologue is in flight (stage 3), not after its loop. After its loop, split 0
//      expects (live - 1) partials' bytes on its barrier 0 and signals each live peer's barrier 1
//      (relaxed: its ring is free); each peer waits for that signal and st.async-stores its (O_s,
//      lse2_s) into entry s of split 0's receive area (after the warp-merge scratch), completing
//      the bytes on split 0's barrier 0; split 0 writes its own entry 0, waits on barrier 0
//      (acquire, cluster scope) and folds the entries in split order with stage 6's batch code,
//      one batch of 8 entries up to 8 splits and of 16 above (bitwise the global merge's result:
//      padding entries change no bit). No fence and no cluster barrier on the path (cluster.cuh's
//      header). Docs/perf.md runs 429-430: (1, 32, 8) 1K / 4K 2.9 / 2.5% faster than with the wait
//      after the loop, an acquire in the peers' wait and 16-entry batches.
//
// Dependent global round trips on one CTA's critical path at B = 1 (launch gap not counted):
//   one split:    [k_len || q || split 0's tile 0] -> further K/V tiles (streaming) -> o store.
//   stable prefix: before the wait k_len -> the prologue tiles' stable keys; after it
//                 [q || the new keys] -> further K/V tiles (streaming) -> o store (one split).
//   S > 1 splits: [k_len || q || every split's head tiles (the head plan)] -> the rest of each
//                 split's K/V (addresses need the plan) -> partial store + fence (waits for the
//                 acks) -> counter atomic -> counter reset + fence (waits for its ack) -> the
//                 merging CTA's (lse2_s, O_s) loads (one per 16 splits) -> o store.
//   cluster merge: ... the rest of each split's K/V -> split 0's signal (SM to SM) -> the peers'
//                 st.async (SM to SM) -> o store.
// Code size: in a decode step every kernel starts cold on its SMs (the step runs ~250 KB of
// distinct code per layer), and code an SM has not run recently costs ~0.06-0.1 us per KB
// executed (docs/perf.md run 26). So the ring-prologue loops and load_tile's passes, whose work
// is asynchronous copies, are rolled (a pass: precomputed per-lane addresses plus one 64-bit add,
// predicated copies, no branch); the softcap and ALiBi are blocks of their own, compiled only
// into the instances launched with one of them (kScoreMods), instead of code per score; rows
// split into (g, i) by a multiplier, not a division; lse2 and the merge unit are computed only
// where stored (docs/perf-decode-step.md §6, session 7).
// Latency: a tile runs one warp per scheduler, so every dependent step is paid in full
// (dev/tile_cycles measures the stages in SM cycles): the softmax weights use ex2.approx.ftz and
// the final 1 / L rcp.approx (no denormal guards, no division slow path), the loop tests nothing
// a launch fixes (the speculative tile's V zeroing runs once before it), and the warp merge reads
// only the block's real rows (decisions.md, session 9).
// History (issue 5, docs/perf.md runs 16 and 18): a flag merge, a lean merge (one acq_rel atomic,
// every partial in one batch), an L2 prefetch before the PDL wait, every split speculating from
// the last call's k_len and whole-ring speculation were measured on the H200 and removed; one
// speculative ring stage won 0.3-0.5 us at the single-split and 1K rows and became this rule.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/launch.cuh"

namespace splice::cuda::detail {

inline constexpr int kRows = 16;      // query rows per CTA (one m16 tile)
inline constexpr int kTileKeys = 16;  // keys per warp step
// Warps per CTA, each its own key stream: 4, or 8 where the plan asks for wide CTAs (a grid of
// few CTAs, head_dim <= 128: flash_decode.h's plan rule).
inline constexpr int kNarrowWarps = 4;
inline constexpr int kWideWarps = 8;
inline constexpr int kMaxSplits = 256;
// Splits whose (lse2_s, O_s) the merging CTA loads at once: one L2 round trip per batch (16
// float4 + 16 floats in registers per output slot). Registers bound it: the plan assumes the
// CTAs per SM that shared memory allows (3 at head_dim 64, 2 at 128), which needs <= 168 and
// <= 255 registers a thread; with 16 the kernel has 142 / 207 (nvcc 13.0, sm_90a), 32 gave
// 204 at head_dim 64, one CTA per SM fewer than planned.
inline constexpr int kMergeBatch = 16;
// Stages a benchmark may leave out to time the rest (FlashDecodeDevKnobs::drop_stages): the
// split merge (partials are stored, nothing merged) and the K/V stream (no tiles loaded).
inline constexpr int kDropMerge = 1;
// FlashDecodeParams::trigger values (FlashDecodeTrigger of flash_decode.h, checked there).
inline constexpr int kTriggerAfterWait = 0, kTriggerAtExit = 1, kTriggerMergeInputsLanded = 2;
inline constexpr int kDropKv = 2;
// Stages a kernel-stamps build records (kernel_stamps.h marks 2..), in time order: the plan,
// once k_len has landed (14), q and the new keys in shared memory (2), warp 0's first tile done
// (6), warp 0's tile loop done (3), every warp's loop done (5), the warp-merge scratch written
// (7), the output (or the split's partial) stored (4); and warp 0's second tile, each once its
// values exist: its K/V waited for (8), its scores S (9), its probabilities P (10), its P V (11);
// in a cluster merge's split 0 the peers' partials landed (12) and the merged output stored (13).
inline constexpr unsigned kMarkQReady = 2, kMarkLoopDone = 3, kMarkStored = 4;
inline constexpr unsigned kMarkWarpsDone = 5, kMarkFirstTile = 6, kMarkScratch = 7;
inline constexpr unsigned kMarkTile2Waited = 8, kMarkTile2Scores = 9, kMarkTile2Probs = 10,
                          kMarkTile2Done = 11;
inline constexpr unsigned kMarkMergeLanded = 12, kMarkMerged = 13, kMarkPlanned = 14;
// Lazy rescaling (stage 4): the running maxima move only when a tile's maximum exceeds them by
// more than this (log2 units: probabilities stay <= 2^8).
inline constexpr float kRescaleSlack = 8.0f;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct FlashDecodeParams {
  const void* q;              // [batch, num_qo_heads, q_len, head_dim]
  const void* k;              // [batch, num_kv_heads, capacity, head_dim]
  const void* v;              // [batch, num_kv_heads, capacity, head_dim]
  void* out;                  // [batch, num_qo_heads, q_len, head_dim]
  float* lse;                 // [batch, num_qo_heads, q_len] or null
  const std::int32_t* k_len;  // [batch] or [1]
  const float* alibi;         // [num_qo_heads] or null
  // The split units' (batch * num_kv_heads - split_from_bh of them) merge workspace:
  float* partial_o;    // [split units, row_blocks, grid splits, 16, head_dim]
  float* partial_lse;  // [split units, row_blocks, 16, grid splits]
  unsigned* counters;  // [split units, row_blocks], zero between launches
  std::int64_t q_stride_b, q_stride_h, q_stride_s;
  std::int64_t k_stride_b, k_stride_h, k_stride_s;
  std::int64_t v_stride_b, v_stride_h, v_stride_s;
  std::int64_t o_stride_b, o_stride_h, o_stride_s;
  std::int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  int k_len_stride;  // 0 for one shared k_len, 1 for one per sequence
  int num_kv_heads, group, q_len, rows, capacity;
  int forced_splits;      // > 0: split into this many (split-invariance tests); 0: plan
  int min_chunk;          // fewest keys per split when splitting
  int single_split_keys;  // n <= this: one split (stage 2)
  // 1: the head plan (stage 2; no left window, no forced split count, a one-wave grid), and
  // without the stable prefix every warp's head tile issued before k_len (stage 1)
  int head_plan;
  // 1: the caller's promise that no kernel in flight writes k_len or the cache rows below
  // k_len - q_len (stage 1 then plans and issues the ring prologue before the PDL wait).
  int stable_prefix;
  int dev_drop;  // benchmark attribution only (kDropMerge | kDropKv); outputs are then wrong
  // kClusterMerge instances: where the next kernel may launch (a FlashDecodeTrigger value):
  // 0 right after the wait as every other instance, 1 at exit, 2 (split 0) once every peer's
  // partial has landed (the peers at exit).
  int trigger;
  int window_left, window_right;  // -1 = unbounded
  int causal;
  int q_vec16, o_vec8;  // q rows allow 16-byte loads / out rows 8-byte stores
  float scale_log2;     // softmax_scale * log2(e)
  float softmax_scale;
  float softcap;  // 0 = none
  // Row gr = g * q_len + i splits as g = umulhi(2 gr, q_len_mul) >> q_len_shift (exact for
  // 0 <= gr < 2^31): q_len_shift = ceil(log2 q_len), q_len_mul = ceil(2^(31 + shift) / q_len).
  unsigned q_len_mul;
  int q_len_shift;
  // The launcher's tail split (stage 2; 4-warp instances without the cluster merge): units
  // (b, h) = blockIdx.z below this stream in one split. 0: every unit splits as planned.
  int split_from_bh;
  // The launcher's late splits (stage 2; the same instances): > 0, a grid of (row block, unit =
  // blockIdx.y, split = blockIdx.z) in which split 0 streams a unit's first n - late_splits c
  // keys and splits 1 .. late_splits c keys each, c = round_up(ceil(n / 2^late_shift), 16).
  int late_splits, late_shift;
  // 1: the late pieces halve in size, c, c / 2, .. (stage 2; FlashDecodePlan::late_halving).
  int late_halving;
};

template <int kHeadDim, int kWarps>
struct FlashDecodeConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kStages = kHeadDim == 256 ? 2 : (kHeadDim == 64 ? 4 : 3);
  static constexpr int kTileBytes = kTileKeys * kHeadDim * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K tile then V tile
  static constexpr int kQBytes = kRows * kHeadDim * 2;
  static constexpr int kPipeBytes = kWarps * kStages * kStageBytes;
  static constexpr int kRedStride = kHeadDim + 4;  // floats per row of the warp-merge scratch
  // Warp-merge scratch (o, m, l per warp and row), reusing the ring.
  static constexpr int kMergeBytes = kWarps * kRows * (kRedStride + 2) * 4;
  static constexpr int kSmemBytes = kQBytes + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
  static constexpr bool kQInRegs = kHeadDim <= 128;
  // The cluster merge's receive area in split 0 (stage 6'): after the warp-merge scratch, in the
  // ring, [splits][rows][head_dim] fp32 partials then [splits][rows] lse2 (the block's real rows).
  static constexpr int kRecvOffset = kQBytes + kMergeBytes;
  static constexpr int recv_bytes(int splits, int rows) { return splits * rows * (kHeadDim + 1) * 4; }
  static constexpr bool cluster_merge_fits(int splits, int rows) {
    return kRecvOffset + recv_bytes(splits, rows) <= kSmemBytes;
  }
};

// 2^x on the MUFU unit with denormals flushed (one instruction; exp2f adds a compare and two
// predicated multiplies per call to produce denormal results). Every exponent here is a difference
// t - m <= 0 of log2-unit scores: a result below 2^-126 is a weight no fp32 sum or bf16/f16
// product in this kernel can see next to the row's largest weight, 1. ex2(-inf) = +0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// `x` with its exponent's top bit cleared: never NaN, still computed from x (a stamps-build value
// that a mark waits for).
__device__ __forceinline__ float not_nan(float x) {
  return __uint_as_float(__float_as_uint(x) & 0xbfffffffu);
}

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// One 16-byte copy if `issue` (a predicated instruction, no branch): global bytes at address
// `src` when `copy`, zeros otherwise (nothing is read then); the lines it reads carry L2 cache
// policy `policy` (l2_evict_policy).
__device__ __forceinline__ void cp_async_16_if(bool issue, std::uint32_t dst, std::uint64_t src,
                                               bool copy, std::uint64_t policy) {
  asm volatile(
      "{\n.reg .pred i;\nsetp.ne.b32 i, %0, 0;\n"
      "@i cp.async.cg.shared.global.L2::cache_hint [%1], [%2], 16, %3, %4;\n}\n" ::"r"(
          static_cast<int>(issue)),
      "r"(dst), "l"(src), "r"(copy ? 16 : 0), "l"(policy));
}
// `x`, with its value hidden from the optimizer (which then cannot re-derive it).
__device__ __forceinline__ std::int64_t opaque(std::int64_t x) {
  asm("mov.b64 %0, %0;" : "+l"(x));
  return x;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The dtype-specific pieces: the mma instruction and the fp32 <-> 16-bit conversions.
template <typename T>
struct Num;

template <>
struct Num<__nv_bfloat16> {
  __device__ __forceinline__ static void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

template <>
struct Num<__half> {
  __device__ __forceinline__ static void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half from_float(float x) { return __float2half_rn(x); }
};

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Group member g = gr / q_len and query i = gr % q_len of row gr (0 <= gr < 2^31), by the
// launcher's multiplier instead of an integer division (~20 instructions each).
struct QueryRow {
  int g, i;
};
__device__ __forceinline__ QueryRow query_row(const FlashDecodeParams& p, int gr) {
  const int g = static_cast<int>(__umulhi(static_cast<unsigned>(gr) * 2u, p.q_len_mul) >>
                                 p.q_len_shift);
  return {g, gr - g * p.q_len};
}

// Release (and acquire) at GPU scope: orders this thread's earlier memory accesses, and those
// ordered before them by a CTA barrier, before its later ones as seen by every other CTA.
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows, head_dim] 16-bit tile.
template <int kHeadDim>
__device__ __forceinline__ std::uint32_t swizzle(int row, int chunk) {
  return static_cast<std::uint32_t>(row * kHeadDim * 2 + ((chunk ^ (row & 7)) << 4));
}

// Writes four consecutive outputs of one row (and nothing for rows past `rows`).
template <typename T>
__device__ __forceinline__ void store_out4(const FlashDecodeParams& p, T* dst,
                                           const float (&o)[4]) {
  if (p.o_vec8) {
    union {
      T h[4];
      uint2 u;
    } pack;
#pragma unroll
    for (int e = 0; e < 4; ++e) pack.h[e] = Num<T>::from_float(o[e]);
    *reinterpret_cast<uint2*>(dst) = pack.u;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = Num<T>::from_float(o[e]);
  }
}

// 1 / x on the MUFU unit (rcp.approx: within 1 ulp of the rounded quotient; x is a softmax
// denominator in [1, 2^31), far from rcp.approx's 2^126 limit). The IEEE division 1.0f / x adds a
// range check and a slow-path branch to the end of every output's critical path.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Where output slot (row gr, outputs d .. d + 3) goes: `dst` in out, and `lse` (only for d == 0
// where lse is asked for; nullptr otherwise). Computed apart from the values, so the address math
// can overlap the loads of the merge instead of following them.
template <typename T>
struct ResultSlot {
  T* dst;
  float* lse;
};
template <typename T>
__device__ __forceinline__ ResultSlot<T> result_slot(const FlashDecodeParams& p, int b, int kv_head,
                                                     int gr, int d) {
  const auto [g, i] = query_row(p, gr);
  const int qo_head = kv_head * p.group + g;
  ResultSlot<T> r;
  r.dst = static_cast<T*>(p.out) + b * p.o_stride_b + qo_head * p.o_stride_h + i * p.o_stride_s + d;
  r.lse = p.lse && d == 0
              ? p.lse + b * p.lse_stride_b + qo_head * p.lse_stride_h + i * p.lse_stride_s
              : nullptr;
  return r;
}

// Writes the final (o, lse) of one output slot: four consecutive outputs of a row from `acc`, and
// (only where lse is asked for) lse = lse2 ln 2, lse2 = big + log2 denom (-inf for denom = 0).
template <typename T>
__device__ __forceinline__ void store_result(const FlashDecodeParams& p, const ResultSlot<T>& slot,
                                             const float (&acc)[4], float big, float denom) {
  store_out4<T>(p, slot.dst, acc);
  if (slot.lse) {
    const float lse2 = !(denom > 0.0f) ? -INFINITY : big + log2f(denom);
    *slot.lse = lse2 * kLn2;
  }
}

// The split merge's running state for one output slot (stage 6): M = the largest lse2 so far,
// D = sum_s 2^(lse2_s - M), A = sum_s 2^(lse2_s - M) O_s.
struct SplitMerge {
  float big = -INFINITY;  // M
  float denom = 0.0f;     // D
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
};
// Folds one batch of kBatch splits' (lse2_s, O_s) into `m`, in batch order; a padding entry
// has lse2 = -inf and O = 0 (its weight is then 0, and adding 0 * 0 changes no bit, so a batch's
// padding is free to be left out). Both merges (global and cluster) fold through this, so they
// agree bit for bit.
template <int kBatch>
__device__ __forceinline__ void merge_batch(SplitMerge& m, const float (&ls)[kBatch],
                                            const float4 (&os)[kBatch]) {
  float batch_big = m.big;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) batch_big = fmaxf(batch_big, ls[i]);
  if (batch_big == -INFINITY) return;           // no visible key so far
  const float r = exp2_ftz(m.big - batch_big);  // 0 while M = -inf (D and A are 0 then)
  m.denom *= r;
#pragma unroll
  for (int e = 0; e < 4; ++e) m.acc[e] *= r;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const float ws = exp2_ftz(ls[i] - batch_big);  // 0 for an empty split or a padding entry
    m.denom += ws;
    m.acc[0] += ws * os[i].x;
    m.acc[1] += ws * os[i].y;
    m.acc[2] += ws * os[i].z;
    m.acc[3] += ws * os[i].w;
  }
  m.big = batch_big;
}
// The cluster merge's fold (stage 6') of one output slot (row, d): the receive area's
// live <= kBatch entries ([live][valid_rows][D] partials, [live][valid_rows] lse2) as one batch,
// in split order.
template <int kBatch, int kHeadDim>
__device__ __forceinline__ SplitMerge fold_received(const float* recv_o, const float* recv_lse,
                                                    int live, int valid_rows, int row, int d) {
  float ls[kBatch];
  float4 os[kBatch];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const bool ok = i < live;
    ls[i] = ok ? recv_lse[i * valid_rows + row] : -INFINITY;
    os[i] = ok ? *reinterpret_cast<const float4*>(recv_o + (i * valid_rows + row) * kHeadDim + d)
               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  SplitMerge merge;
  merge_batch(merge, ls, os);
  return merge;
}
// The merged slot's output: o = A / D (0 where no split saw a key), and lse from (M, D).
template <typename T>
__device__ __forceinline__ void store_merged(const FlashDecodeParams& p, const ResultSlot<T>& slot,
                                             SplitMerge& m) {
  const bool empty = !(m.denom > 0.0f);
  const float scale = empty ? 0.0f : rcp_approx(m.denom);
#pragma unroll
  for (int e = 0; e < 4; ++e) m.acc[e] *= scale;
  store_result<T>(p, slot, m.acc, m.big, m.denom);
}

// Stage 2's plan for one k_len: the visible range [lo, hi), the split size and the live count,
// and split `split`'s keys [c0, c1).
struct SplitPlan {
  int k_len, lo, hi, chunk, live, c0, c1;
  int head;  // 1: each warp's tile 0 is its head tile, [c0, c1) the rest (stage 2's head plan)
};
// `head_tiles`: the launch's head plan (p.head_plan; stage 2); `late`: the launch's late splits
// (whose grid holds the units in y: the other plans, which read the split count there, never
// run under them).
__device__ __forceinline__ SplitPlan plan_splits(const FlashDecodeParams& p, int k_len_raw,
                                                 int split, int warps, bool head_tiles,
                                                 bool one_split_unit, bool late) {
  SplitPlan r;
  r.k_len = min(max(k_len_raw, 0), p.capacity);
  const int pos_first = r.k_len - p.q_len;
  const int pos_last = r.k_len - 1;
  r.lo = 0;
  r.hi = r.k_len;
  if (p.window_left >= 0) r.lo = max(r.lo, pos_first - p.window_left);
  if (p.window_right >= 0) r.hi = min(r.hi, pos_last + p.window_right + 1);
  const int n = max(r.hi - r.lo, 0);
  r.head = 0;
  if (late) {
    // Late splits: split 0 streams [lo, lo + n - L c), split s >= 1 the s-th of L pieces of c
    // keys after it; one split while n < (L + 1) c (or n <= single_split_keys).
    // Halving pieces (p.late_halving): c, c / 2, .. c / 2^(L - 1), c a multiple of 16 * 2^(L - 1)
    // (flash_decode.h, flash_decode_late_pieces: the host's copy of this arithmetic).
    const int unit = p.late_halving ? kTileKeys << (p.late_splits - 1) : kTileKeys;
    const int late_chunk = max(ceil_div(ceil_div(n, 1 << p.late_shift), unit) * unit, unit);
    const int late_keys = p.late_halving ? 2 * late_chunk - (late_chunk >> (p.late_splits - 1))
                                         : p.late_splits * late_chunk;
    const bool pieces = n > p.single_split_keys && n >= late_keys + late_chunk;
    const int first = pieces ? n - late_keys : n;
    const int index = max(split - 1, 0);  // the late piece's, from 0 (split 0: unused)
    const int piece_at = p.late_halving ? 2 * late_chunk - 2 * (late_chunk >> index)
                                        : index * late_chunk;  // into the late region
    const int piece_keys = p.late_halving ? late_chunk >> index : late_chunk;
    r.chunk = late_chunk;
    r.live = pieces ? 1 + p.late_splits : 1;
    r.c0 = split == 0 ? r.lo : r.lo + first + piece_at;
    r.c1 = split == 0 ? r.lo + first : min(r.hi, r.c0 + piece_keys);
    return r;
  }
  if (head_tiles && n > p.single_split_keys) {
    // Head plan (lo = 0): split s's warp w streams its head tile, keys [16 (W s + w), + 16), then
    // its share of the keys past the head region [0, R), R = 16 W gridDim.y, in contiguous
    // chunks; the head tiles are known before k_len (stage 1).
    const int head_keys = kTileKeys * warps;  // per split
    const int region = head_keys * static_cast<int>(gridDim.y);
    const int rest = max(r.hi - region, 0);
    r.head = 1;
    r.chunk = max(ceil_div(ceil_div(rest, static_cast<int>(gridDim.y)), kTileKeys) * kTileKeys,
                  kTileKeys);
    r.live = rest > 0 ? static_cast<int>(gridDim.y) : ceil_div(n, head_keys);
    r.c0 = region + split * r.chunk;
    r.c1 = min(r.hi, r.c0 + r.chunk);
    return r;
  }
  int chunk;
  if (p.forced_splits > 0)
    chunk = ceil_div(ceil_div(n, p.forced_splits), kTileKeys) * kTileKeys;
  else if (n <= p.single_split_keys || one_split_unit)
    chunk = n;
  else
    chunk =
        max(p.min_chunk, ceil_div(ceil_div(n, static_cast<int>(gridDim.y)), kTileKeys) * kTileKeys);
  r.chunk = max(chunk, kTileKeys);
  r.live = max(1, ceil_div(n, r.chunk));
  r.c0 = r.lo + split * r.chunk;
  r.c1 = min(r.hi, r.c0 + r.chunk);
  return r;
}

// kScoreMods: the launch has a softcap or ALiBi slopes. Without them (kScoreMods = false, every
// model splice runs so far) the instance carries neither block nor the per-tile branches that skip
// them. kClusterMerge: the launch is in clusters of a unit's splits (stage 6'); without it the
// instance has none of that stage's code (the model's single-split launches).
template <typename T, int kHeadDim, int kWarps, bool kScoreMods, bool kClusterMerge>
__global__ void __launch_bounds__(kWarps * 32, 1)
    flash_decode_kernel(const __grid_constant__ FlashDecodeParams p) {
  using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kChunks = Cfg::kChunks;
  constexpr int kStages = Cfg::kStages;
  constexpr int kSlotsPerRow = kHeadDim / 4;  // float4 slots per output row
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  // The tail and late splits (stage 2) compile into the 4-warp instances without the cluster
  // merge only, the launcher's only instances launched with them (flash_decode.cu).
  constexpr bool kTailSplit = kWarps == kNarrowWarps && !kClusterMerge;
  const bool late = kTailSplit && p.late_splits > 0;  // grid (row block, unit, split)
  const int rb = blockIdx.x;
  const int split = late ? blockIdx.z : blockIdx.y;
  const int bh = late ? blockIdx.y : blockIdx.z;
  // Splits per unit (read where used, as gridDim.y was before the late splits).
  const auto grid_splits = [&] { return late ? gridDim.z : gridDim.y; };
  const int b = bh / p.num_kv_heads;
  const int kv_head = bh % p.num_kv_heads;
  const int row_base = rb * kRows;

  const StageStamps stages;  // kernel-stamps builds only (launch.cuh); empty otherwise
  // Cluster merge (stage 6', kClusterMerge: launched in clusters): [0] completes when the peers'
  // partials have landed in split 0's receive area, [1] (in the peers) when split 0's ring is
  // free to receive them. Initialized and published to the cluster before anything else (every
  // CTA arrives before it may exit).
  __shared__ std::uint64_t merge_bars[2];
  if constexpr (kClusterMerge) {
    if (tid == 0) mbar_init<2>(merge_bars);
    cluster_arrive_relaxed();
  }
  // The tail split's one-split units (stage 2): their splits >= 1 have no keys whatever k_len.
  const bool one_split_unit = kTailSplit && bh < p.split_from_bh;
  if (one_split_unit && split > 0) return;
  const T* k_base = static_cast<const T*>(p.k) + b * p.k_stride_b + kv_head * p.k_stride_h;
  const T* v_base = static_cast<const T*>(p.v) + b * p.v_stride_b + kv_head * p.v_stride_h;
  const std::uint32_t pipe_u32 = smem_addr(smem + Cfg::kQBytes + warp * kStages * Cfg::kStageBytes);
  // A tile's 16-byte copies, lane-major: pass u of the warp copies rows [u R, u R + R) with
  // R = 32 / kChunks (4 at head_dim 64, 2 at 128, 1 at 256), lane = (row - u R) * kChunks + chunk.
  // So a lane's chunk, its first row and its row's global offset are fixed: computed once here,
  // a pass only adds constants. Swizzle: R divides 8 and lane_row < R, so (row & 7) of pass u is
  // lane_row + (u R & 7) without carries, and chunk ^ (row & 7) = lane_x ^ (u R & 7).
  constexpr int kPassRows = 32 / kChunks;               // R
  constexpr int kPasses = kTileKeys * kChunks / 32;     // copies per lane per tile
  const int lane_row = lane / kChunks;                  // row of pass 0, < R
  const int lane_x = (lane % kChunks) ^ lane_row;       // swizzled chunk of pass 0
  const std::uint32_t lane_dst = static_cast<std::uint32_t>(lane_row * kHeadDim * 2);
  // Global byte addresses: key 0's chunk of this lane, and the bytes between a lane's rows of
  // consecutive passes (opaque to the compiler, so that a pass adds them instead of multiplying
  // its key by the row stride again).
  const std::uint64_t k_lane = reinterpret_cast<std::uint64_t>(k_base + (lane % kChunks) * 8);
  const std::uint64_t v_lane = reinterpret_cast<std::uint64_t>(v_base + (lane % kChunks) * 8);
  const std::int64_t k_pass = opaque(p.k_stride_s * 2 * kPassRows);
  const std::int64_t v_pass = opaque(p.v_stride_s * 2 * kPassRows);
  // K and V are read once a launch: their lines are the first the L2 evicts (evict_first).
  // docs/perf.md runs 243-244: 1.2-1.4% faster than plain copies at the 1024-unit 4K grids on
  // two machines, level to 1.4% at B = 1, level elsewhere; evict_last 0.1-0.5% slower than plain
  // (what the L2 keeps instead was not measured).
  const std::uint64_t kv_policy = l2_evict_policy<false>();
  // Keys [from, to) of the tile of keys [first, first + 16) into ring stage `stage`; keys
  // >= zero_from are zero-filled (nothing is read for them; the address is key 0's); every other
  // key is left alone.
  auto load_tile = [&](int first, int stage, int from, int to, int zero_from) {
    const int key0 = first + lane_row;  // this lane's pass-0 key
    const std::uint32_t k_dst = pipe_u32 + stage * Cfg::kStageBytes + lane_dst;
    const std::uint32_t v_dst = k_dst + Cfg::kTileBytes;
    std::uint64_t k_src = k_lane + key0 * p.k_stride_s * 2;
    std::uint64_t v_src = v_lane + key0 * p.v_stride_s * 2;
    // Rolled (the header's "Code size"): a pass is a few integer instructions and two copies.
#pragma unroll 1
    for (int u = 0; u < kPasses; ++u) {
      const int key = key0 + u * kPassRows;
      const bool copy = key >= from && key < to;
      const std::uint32_t so =
          u * kPassRows * kHeadDim * 2 + ((lane_x ^ (u * kPassRows & 7)) << 4);
      const bool issue = copy || key >= zero_from;
      cp_async_16_if(issue, k_dst + so, copy ? k_src : k_lane, copy, kv_policy);
      cp_async_16_if(issue, v_dst + so, copy ? v_src : v_lane, copy, kv_policy);
      k_src += k_pass;
      v_src += v_pass;
    }
  };
  // Tile `it` of this warp's stream (stage 3): under the head plan tile 0 is the head tile and
  // tile it > 0 the (it - 1)-th of [c0, c1); otherwise tile it of [c0, c1).
  const int head_key = (warp + kWarps * split) * kTileKeys;
  auto tile_key = [&](const SplitPlan& sp, int it) {
    return it < sp.head ? head_key : sp.c0 + (warp + (it - sp.head) * kWarps) * kTileKeys;
  };
  auto tiles_of_warp = [&](int c0, int c1) {
    const int num_tiles = c1 > c0 ? ceil_div(c1 - c0, kTileKeys) : 0;
    return num_tiles > warp && !(p.dev_drop & kDropKv) ? ceil_div(num_tiles - warp, kWarps) : 0;
  };
  // This warp's tiles under plan `sp` (its head tile, if the head plan gives it live keys, then
  // its tiles of [c0, c1)), and where keys of tile `it` are zero-filled (keys >= hi in the head
  // tile, >= c1 in the others).
  auto tiles_of = [&](const SplitPlan& sp) {
    return sp.head ? (head_key < sp.hi ? 1 + tiles_of_warp(sp.c0, sp.c1) : 0)
                   : tiles_of_warp(sp.c0, sp.c1);
  };
  auto zero_from = [&](const SplitPlan& sp, int it) { return it < sp.head ? sp.hi : sp.c1; };

  // Stage 1 with the stable-prefix promise (p.stable_prefix): k_len, the plan and the ring
  // prologue's stable keys (< k_len - q_len) before the wait; the keys [k_len - q_len, c1) of the
  // prologue tiles are skipped here and copied after it.
  const bool stable_prefix = p.stable_prefix != 0;
  SplitPlan plan{};
  int my_tiles = 0;
  if (stable_prefix) {
    plan = plan_splits(p, p.k_len[b * p.k_len_stride], split, kWarps, p.head_plan != 0,
                       one_split_unit, late);
    if (split < plan.live) {
      my_tiles = tiles_of(plan);
      const int stable_end = min(plan.k_len - p.q_len, plan.c1);
#pragma unroll 1  // one copy of load_tile's code (the header's "Code size")
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < my_tiles) load_tile(tile_key(plan, s), s, 0, stable_end, zero_from(plan, s));
        cp_async_commit();  // one group per prologue tile, empty past the warp's last
      }
    }
  }

  // Stage 0: PDL (wait for the previous kernel's writes; then the next kernel may launch).
  wait_for_producers();  // launch.cuh: no-ops for a launch without the PDL attribute
  if (!kClusterMerge || p.trigger == kTriggerAfterWait) allow_dependents();

  // Stage 1: k_len, q and (split 0, speculative) the first K/V tiles, all in flight together.
  const int k_len_raw = stable_prefix ? 0 : p.k_len[b * p.k_len_stride];
  // (b, h, rb) among the units that split: the index of this CTA's merge counter and partial
  // rows (split runs only).
  auto unit_index = [&] {
    return static_cast<std::int64_t>(bh - (kTailSplit ? p.split_from_bh : 0)) * gridDim.x + rb;
  };
  // ALiBi slopes (log2 units) of this thread's two mma C-fragment rows, lane/4 and lane/4 + 8.
  float slope_log2[2] = {0.0f, 0.0f};
  if (kScoreMods && p.alibi) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int gr = row_base + lane / 4 + 8 * rr;
      if (gr < p.rows) slope_log2[rr] = p.alibi[kv_head * p.group + query_row(p, gr).g] * kLog2e;
    }
  }
  unsigned char* q_smem = smem;
  constexpr int kQCopies = kRows * kChunks;  // 16-byte chunks of the CTA's q rows
#pragma unroll
  for (int n = 0; n < (kQCopies + kThreads - 1) / kThreads; ++n) {  // 4 warps: 1, 2, 4 chunks
    if (kQCopies % kThreads != 0 && tid + n * kThreads >= kQCopies) break;
    const int row = tid / kChunks + n * (kThreads / kChunks);
    const int ch = tid % kChunks;
    const int gr = row_base + row;
    unsigned char* dst = q_smem + swizzle<kHeadDim>(row, ch);
    if (gr >= p.rows) {  // padding row
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else {
      const auto [g, i] = query_row(p, gr);
      const T* src = static_cast<const T*>(p.q) + b * p.q_stride_b +
                     (kv_head * p.group + g) * p.q_stride_h + i * p.q_stride_s + ch * 8;
      if (p.q_vec16) {
        cp_async_16(smem_addr(dst), src, 16);
      } else {  // misaligned rows: element loads
        union {
          T h[8];
          uint4 u;
        } tmp;
#pragma unroll
        for (int e = 0; e < 8; ++e) tmp.h[e] = src[e];
        *reinterpret_cast<uint4*>(dst) = tmp.u;
      }
    }
  }
  if (stable_prefix && split < plan.live && !(p.dev_drop & kDropKv)) {
    // The keys this step's producers wrote, [k_len - q_len, hi), of this split's prologue tiles:
    // the whole CTA copies them, kThreads / kChunks keys a pass (one pass for q_len <= 16 at
    // head_dim 64), each chunk to where its tile's warp keeps it: a key of the split's head
    // [16 W s, 16 W (s + 1)) is warp (key - 16 W s) / 16's tile 0; tile t = (key - c0) / 16 of
    // [c0, c1) is warp t % W's tile head + t / W, in the ring stage of that index (a prologue
    // tile when it is < kStages - 1). The wait for every group and the CTA barrier below publish
    // them to that warp.
    const int ch = tid % kChunks;
    const int split_head = kWarps * split * kTileKeys;  // the split's head under the head plan
#pragma unroll 1
    for (int key = max(plan.k_len - p.q_len, 0) + tid / kChunks; key < plan.hi;
         key += kThreads / kChunks) {
      int owner, index, first;  // the key's warp, that warp's tile index, the tile's first key
      if (plan.head && key >= split_head && key < split_head + kWarps * kTileKeys) {
        owner = (key - split_head) / kTileKeys;
        index = 0;
        first = split_head + owner * kTileKeys;
      } else if (key >= plan.c0 && key < plan.c1) {
        const int t = (key - plan.c0) / kTileKeys;
        owner = t % kWarps;
        index = plan.head + t / kWarps;
        first = plan.c0 + t * kTileKeys;
      } else {
        continue;  // another split's key
      }
      if (index >= kStages - 1) continue;  // later tiles: the main loop copies them whole
      const std::uint32_t dst = smem_addr(smem + Cfg::kQBytes) +
                                (owner * kStages + index) * Cfg::kStageBytes +
                                swizzle<kHeadDim>(key - first, ch);
      cp_async_16(dst, k_base + key * p.k_stride_s + ch * 8, 16);
      cp_async_16(dst + Cfg::kTileBytes, v_base + key * p.v_stride_s + ch * 8, 16);
    }
  }
  cp_async_commit();  // q (group 0; with the stable prefix the youngest, with the pending keys)

  // Speculative tile 0 (stage 1): with p.head_plan (no left window, so lo = 0) each warp's tile 0
  // is its head tile, keys [16 (W split + w), + 16), at every k_len (stage 2: under the head plan
  // by definition, and under the one-split plan split 0's tile 0 is the same keys); it is read
  // up to the capacity (what lies at or past hi is masked in stage 4).
  // Under the late splits only split 0 (lo = 0: its tile 0 of warp w is keys [16 w, + 16)).
  const bool speculative = !stable_prefix && p.head_plan != 0 && (!late || split == 0);
  if (speculative) {
    load_tile(head_key, 0, 0, p.capacity, p.capacity);
    cp_async_commit();  // group 1: tile 0
  }

  // Stage 2: live range and the device-side split plan.
  if (!stable_prefix)
    plan = plan_splits(p, k_len_raw, split, kWarps, speculative, one_split_unit, late);
  stages.mark_after(static_cast<float>(plan.c1), kMarkPlanned);
  const int pos_first = plan.k_len - p.q_len;
  const int live_splits = plan.live;
  if (split >= live_splits) {  // never split 0
    cp_async_wait<0>();
    return;
  }
  const int c0 = plan.c0;
  const int c1 = plan.c1;

  if (stable_prefix) {
    // Every group has been issued: the prologue tiles before the wait, q and the pending keys
    // after it (the youngest group). Waiting for all of them costs q's round trip, which the
    // prologue tiles, issued earlier, have already had.
    cp_async_wait<0>();
  } else {
    // Stage 3: the rest of this warp's ring prologue.
    my_tiles = tiles_of(plan);
    // Tiles 0 .. kStages - 2 are issued before the main loop, one cp.async group each in tile
    // order (tile 0 already, if speculative), tiles < c1 only (an empty group otherwise).
#pragma unroll 1
    for (int s = 0; s < kStages - 1; ++s) {
      if (s > 0 || !speculative) {
        if (s < my_tiles) load_tile(tile_key(plan, s), s, 0, c1, c1);
        cp_async_commit();
      }
    }
    // q (group 0) has landed for this thread (only the ring's kStages - 1 groups may still be in
    // flight).
    cp_async_wait<kStages - 1>();
  }
  __syncthreads();  // every thread's q rows (and pending keys) are visible
  // Stage 6' needs every CTA of the cluster running with its barriers published before split 0
  // signals a peer: waited for here, while the ring's first tiles are in flight (every CTA
  // arrived at entry, so the wait costs the loads' latency nothing), not after the loop.
  if (kClusterMerge && live_splits > 1) cluster_wait();
  stages.mark(kMarkQReady);

  std::uint32_t q_frag[Cfg::kQInRegs ? kHeadDim / 16 : 1][4];
  const int frag_row = (lane / 8 % 2) * 8 + lane % 8;  // ldmatrix row this lane addresses
  const int frag_hi = lane / 16;                       // second 8-column half for Q / V
  const std::uint32_t q_u32 = smem_addr(q_smem);
  if constexpr (Cfg::kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks)
      ldmatrix_x4(q_frag[ks], q_u32 + swizzle<kHeadDim>(frag_row, 2 * ks + frag_hi));
  }

  // Per-thread row data: rows lane/4 and lane/4 + 8 of the block (mma C-fragment rows).
  int vis_lo[2], vis_hi[2];
  float pos[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int gr = row_base + lane / 4 + 8 * rr;
    vis_lo[rr] = 0;
    vis_hi[rr] = 0;
    pos[rr] = 0.0f;
    if (gr < p.rows) {
      const int pi = pos_first + query_row(p, gr).i;
      int l = plan.head ? plan.lo : c0;  // the head plan's tiles lie in [lo, hi), not [c0, c1)
      int h = plan.head ? plan.hi : c1;
      if (p.causal) h = min(h, pi + 1);
      if (p.window_left >= 0) l = max(l, pi - p.window_left);
      if (p.window_right >= 0) h = min(h, pi + p.window_right + 1);
      vis_lo[rr] = l;
      vis_hi[rr] = h;
      pos[rr] = static_cast<float>(pi);
    }
  }

  // Stage 4: the warp's main loop.
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int dn = 0; dn < kHeadDim / 8; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
  const int frag_key = (lane / 16) * 8 + lane % 8;  // K ldmatrix row: keys 0-7 or 8-15
  const int frag_kc = lane / 8 % 2;                 // K ldmatrix chunk half

  if (speculative && my_tiles > 0 && head_key + kTileKeys > plan.hi) {
    // The speculative tile 0 was read up to the capacity: zero its V rows >= hi (P is 0 there,
    // but they may hold NaN, and 0 * NaN would leak into O). Every other tile's keys >= c1 were
    // zero-filled by its copies. Done here, once, rather than tested in every tile: tile 0 is
    // the oldest ring group, so all but the kStages - 2 younger ones is tile 0 landed.
    cp_async_wait<kStages - 2>();
    __syncwarp();
#pragma unroll 1
    for (int u = 0; u < kPasses; ++u)
      if (head_key + lane_row + u * kPassRows >= plan.hi)
        *reinterpret_cast<uint4*>(smem + Cfg::kQBytes + warp * kStages * Cfg::kStageBytes +
                                  Cfg::kTileBytes + lane_dst + u * kPassRows * kHeadDim * 2 +
                                  ((lane_x ^ (u * kPassRows & 7)) << 4)) = make_uint4(0, 0, 0, 0);
    __syncwarp();
  }

  // Lockstep (stage 3): every warp has floor(tiles / W) or more steps of [c0, c1) (after its head
  // step under the head plan, which every warp has when heads_live), and c0, c1 and the plan are
  // the CTA's, so every warp reaches each barrier.
  const int body_steps = c1 > c0 ? ceil_div(c1 - c0, kTileKeys) / kWarps : 0;
  // Every warp's head tile holds live keys (the last one wholly: a simpler, stricter test).
  const bool heads_live = kTileKeys * kWarps * (split + 1) <= plan.hi;
  const int lockstep_steps = (p.dev_drop & kDropKv) ? 0
                             : plan.head             ? (heads_live ? 1 + body_steps : 0)
                                                     : body_steps;
  for (int it = 0; it < my_tiles; ++it) {
    if (it < lockstep_steps) asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads));
    // One group per step (empty past the warp's last tile), so tile `it` always has exactly
    // kStages - 1 younger groups: waiting for all but those covers it.
    const int pre = it + kStages - 1;
    if (pre < my_tiles) load_tile(tile_key(plan, pre), pre % kStages, 0, c1, c1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const std::uint32_t k_tile = pipe_u32 + (it % kStages) * Cfg::kStageBytes;
    const std::uint32_t v_tile = k_tile + Cfg::kTileBytes;
    const int key0 = tile_key(plan, it);
    if (it == 1) stages.mark(kMarkTile2Waited);
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      std::uint32_t a[4];
      if constexpr (Cfg::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = q_frag[ks][e];
      } else {
        ldmatrix_x4(a, q_u32 + swizzle<kHeadDim>(frag_row, 2 * ks + frag_hi));
      }
      std::uint32_t kb[4];
      ldmatrix_x4(kb, k_tile + swizzle<kHeadDim>(frag_key, 2 * ks + frag_kc));
      Num<T>::mma(s[0], a, kb[0], kb[1]);
      Num<T>::mma(s[1], a, kb[2], kb[3]);
    }
    if (it == 1) stages.mark_after(not_nan(s[0][0] + s[1][3]), kMarkTile2Scores);

    // Scores in log2 units, masked (a NaN score of a key >= c1 becomes -inf here). The softcap
    // is a block of its own, skipped by one branch, so the common path's code stays short.
    float to_log2 = p.scale_log2;
    if (kScoreMods && p.softcap > 0.0f) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[nt][e] = p.softcap * tanhf(s[nt][e] * p.softmax_scale / p.softcap) * kLog2e;
      to_log2 = 1.0f;
    }
    // ALiBi, t += -slope (p_i - j), is a block of its own too. (Without it t = s * to_log2 where
    // the inline form computed fma(to_log2, s, 0 * (j - p_i)): the same but for the sign of a
    // zero t, which no output sees: t and the maxima m reach the outputs only through exp2 of
    // differences, where a zero's sign is lost, and lse2 = M + log2 L, where a zero M's sign is
    // lost too unless log2 L is a zero, which is +0, and -0 + +0 = +0.)
    if (kScoreMods && p.alibi) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = e / 2;
          const int j = key0 + nt * 8 + 2 * (lane % 4) + e % 2;
          // One rounding of s * to_log2 + the bias, as nvcc contracted the inline form before.
          s[nt][e] = fmaf(to_log2, s[nt][e], slope_log2[rr] * (static_cast<float>(j) - pos[rr]));
        }
      to_log2 = 1.0f;
    }
    // The wide CTAs (long ranges, many tiles a warp) mask only edge tiles and rescale lazily;
    // the narrow ones (short ranges, the model's calls: a few tiles a warp, each on the critical
    // path) mask every tile and rescale eagerly, which was 0.1-0.2 us faster there (docs/perf.md
    // run 208: SmolLM2's call 3.01 -> 2.89 us under the promise).
    // Row rr's scores become P = 2^(t - m_use) in place; returns their sum.
    auto probabilities = [&](int rr, float m_use) {
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2_ftz(s[nt][2 * rr + e] - m_use);
          s[nt][2 * rr + e] = pe;
          sum += pe;
        }
      }
      return sum;
    };
    bool whole_tile = false;  // every real row of the warp sees every key of the tile
    if constexpr (kWarps == kWideWarps) {
      // The mask is needed only where some real row of the warp does not see the whole tile (the
      // range's edges, causal rows, windows); padding rows are never stored (docs/perf.md run 204).
      const bool row0_sees_tile =
          row_base + lane / 4 >= p.rows || (key0 >= vis_lo[0] && key0 + kTileKeys <= vis_hi[0]);
      const bool row1_sees_tile =
          row_base + lane / 4 + 8 >= p.rows || (key0 >= vis_lo[1] && key0 + kTileKeys <= vis_hi[1]);
      whole_tile = __all_sync(0xffffffffu, row0_sees_tile && row1_sees_tile);
    }
    if (whole_tile) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= to_log2;
    } else {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = e / 2;
          const int j = key0 + nt * 8 + 2 * (lane % 4) + e % 2;
          const float t = s[nt][e] * to_log2;
          s[nt][e] = (j >= vis_lo[rr] && j < vis_hi[rr]) ? t : -INFINITY;
        }
      }
    }
    if constexpr (kWarps == kWideWarps) {
      // Lazy rescaling: the running maxima m (and so l and O) move only when some row of the warp
      // sees a tile maximum more than kRescaleSlack above its m; otherwise P = 2^(t - m) <= 2^8
      // against the stale m (exact in fp32; bf16 / f16 keep their relative precision, and 2^8 is
      // far below their range), and the 2 x kHeadDim / 4 rescaling multiplies and the two exp2 of
      // alpha are skipped (docs/perf.md run 203: (1, 32, 8) 16K 18.9 -> 18.4 us).
      float mx[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        mx[rr] =
            fmaxf(fmaxf(s[0][2 * rr], s[0][2 * rr + 1]), fmaxf(s[1][2 * rr], s[1][2 * rr + 1]));
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
      }
      if (__any_sync(0xffffffffu, mx[0] > m[0] + kRescaleSlack || mx[1] > m[1] + kRescaleSlack)) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const float m_new = fmaxf(m[rr], mx[rr]);
          const float alpha = m_new == -INFINITY ? 1.0f : exp2_ftz(m[rr] - m_new);
          m[rr] = m_new;
          l[rr] *= alpha;
#pragma unroll
          for (int dn = 0; dn < kHeadDim / 8; ++dn) {
            o[dn][2 * rr] *= alpha;
            o[dn][2 * rr + 1] *= alpha;
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float m_use = m[rr] == -INFINITY ? 0.0f : m[rr];
        const float sum = probabilities(rr, m_use);
        l[rr] += sum;
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx =
            fmaxf(fmaxf(s[0][2 * rr], s[0][2 * rr + 1]), fmaxf(s[1][2 * rr], s[1][2 * rr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[rr], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2_ftz(m[rr] - m_use);
        m[rr] = m_new;
        const float sum = probabilities(rr, m_use);
        l[rr] = l[rr] * alpha + sum;
#pragma unroll
        for (int dn = 0; dn < kHeadDim / 8; ++dn) {
          o[dn][2 * rr] *= alpha;
          o[dn][2 * rr + 1] *= alpha;
        }
      }
    }

    // O += P V: P's C-fragments are exactly the A-fragment of a 16 x 16 (rows x keys) tile.
    const std::uint32_t pa[4] = {Num<T>::pack(s[0][0], s[0][1]), Num<T>::pack(s[0][2], s[0][3]),
                                 Num<T>::pack(s[1][0], s[1][1]), Num<T>::pack(s[1][2], s[1][3])};
    if (it == 1) stages.mark_after(not_nan(__uint_as_float(pa[0] & pa[3])), kMarkTile2Probs);
#pragma unroll
    for (int dp = 0; dp < kHeadDim / 16; ++dp) {
      std::uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_tile + swizzle<kHeadDim>(frag_row, 2 * dp + frag_hi));
      Num<T>::mma(o[2 * dp], pa, vb[0], vb[1]);
      Num<T>::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
    }
    if (it == 1) stages.mark_after(not_nan(o[0][0] + o[kHeadDim / 8 - 1][3]), kMarkTile2Done);
    __syncwarp();
    if (it == 0) stages.mark(kMarkFirstTile);
  }
  cp_async_wait<0>();
  stages.mark(kMarkLoopDone);

  // Stage 5: merge the warps' states in shared memory.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
  __syncthreads();  // every warp is done with its ring: reuse it as scratch
  stages.mark(kMarkWarpsDone);
  float* red_o = reinterpret_cast<float*>(smem + Cfg::kQBytes);  // [warps][16][kRedStride]
  float* red_m = red_o + kWarps * kRows * Cfg::kRedStride;       // [warps][16]
  float* red_l = red_m + kWarps * kRows;                         // [warps][16]
  // Only the block's real rows (3 of 16 for a GQA group of 3 and one query) are written and read.
  const int valid_rows = min(kRows, p.rows - row_base);
  // Stage 6' receive area (split 0 of a cluster merge), after the scratch:
  float* recv_o = reinterpret_cast<float*>(smem + Cfg::kRecvOffset);  // [live][valid_rows][D]
  float* recv_lse = recv_o + live_splits * valid_rows * kHeadDim;       // [live][valid_rows]
  const bool cluster_split = kClusterMerge && live_splits > 1;
  if (cluster_split) {
    if (split == 0) {
      // The ring is free: expect every peer's partial, then let the peers send (thread s
      // signals split s). Relaxed: the ring's last reads (ldmatrix) returned before the barrier
      // above, as the MMAs that consumed them were issued before it.
      if (tid == 0)
        mbar_arrive_expect(&merge_bars[0], static_cast<std::uint32_t>(Cfg::recv_bytes(
                                               live_splits - 1, valid_rows)));
      else if (tid < live_splits)
        mbar_arrive_remote_relaxed(&merge_bars[1], tid);
    }
  }
#pragma unroll
  for (int dn = 0; dn < kHeadDim / 8; ++dn) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = lane / 4 + 8 * rr;
      float* dst = red_o + (warp * kRows + row) * Cfg::kRedStride + dn * 8 + 2 * (lane % 4);
      if (row < valid_rows)
        *reinterpret_cast<float2*>(dst) = make_float2(o[dn][2 * rr], o[dn][2 * rr + 1]);
    }
  }
  if (lane % 4 == 0) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      red_m[warp * kRows + lane / 4 + 8 * rr] = m[rr];
      red_l[warp * kRows + lane / 4 + 8 * rr] = l[rr];
    }
  }
  __syncthreads();
  stages.mark(kMarkScratch);

  for (int slot = tid; slot < valid_rows * kSlotsPerRow; slot += kThreads) {
    const int row = slot / kSlotsPerRow;
    const int d = (slot % kSlotsPerRow) * 4;
    // Every warp's (m, l, O) loads first, in one shared-memory round trip; then the math, and
    // the output's address only where this CTA stores the output (one live split: the split
    // CTAs skip its 64-bit arithmetic). A row no warp saw a key of has m = -inf in every warp:
    // every weight is 0 then, so denom and acc stay 0 (its warps' l and O are 0).
    float mw[kWarps], lw[kWarps];
    float4 ow[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      mw[w] = red_m[w * kRows + row];
      lw[w] = red_l[w * kRows + row];
      ow[w] = *reinterpret_cast<const float4*>(red_o + (w * kRows + row) * Cfg::kRedStride + d);
    }
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, mw[w]);
    float denom = 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float ww = mw[w] == -INFINITY ? 0.0f : exp2_ftz(mw[w] - big);
      denom += ww * lw[w];
      acc[0] += ww * ow[w].x;
      acc[1] += ww * ow[w].y;
      acc[2] += ww * ow[w].z;
      acc[3] += ww * ow[w].w;
    }
    const bool empty = !(denom > 0.0f);
    const float inv = empty ? 0.0f : rcp_approx(denom);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= inv;
    const auto lse2 = [&] { return empty ? -INFINITY : big + log2f(denom); };  // partials only
    if (live_splits == 1) {
      store_result<T>(p, result_slot<T>(p, b, kv_head, row_base + row, d), acc, big, denom);
    } else if (cluster_split) {
      // Split s's partial into entry s of split 0's receive area: split 0's own by plain stores,
      // a peer's by st.async (completing its bytes on split 0's barrier) once split 0's ring is
      // free (the wait returns at once from the second slot on).
      float4* o_dst = reinterpret_cast<float4*>(recv_o + (split * valid_rows + row) * kHeadDim + d);
      float* lse_dst = recv_lse + split * valid_rows + row;
      const float4 o_val = make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (split == 0) {
        *o_dst = o_val;
        if (d == 0) *lse_dst = lse2();
      } else {
        mbar_wait(&merge_bars[1], 0);  // a relaxed signal (above): nothing to acquire
        st_async_cluster(o_dst, o_val, &merge_bars[0], 0);
        if (d == 0) st_async_cluster(lse_dst, lse2(), &merge_bars[0], 0);
      }
    } else {
      const std::int64_t unit = unit_index();
      const std::int64_t part_row0 = (unit * grid_splits() + split) * kRows;  // partial row base
      *reinterpret_cast<float4*>(p.partial_o + (part_row0 + row) * kHeadDim + d) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (d == 0) p.partial_lse[(unit * kRows + row) * grid_splits() + split] = lse2();
    }
  }
  stages.mark(kMarkStored);
  if (live_splits == 1 || (p.dev_drop & kDropMerge)) return;

  // Stage 6' (cluster merge): split 0 waits for the peers' partials (acquire at cluster scope)
  // and merges every split's entry in split order, as stage 6 does (the same batch fold, so the
  // two merges agree bit for bit). No global round trip: the partials travel SM to SM.
  if (cluster_split) {
    if (split != 0) return;
    __syncthreads();  // split 0's own entry, written by every thread, is visible
    mbar_wait<true>(&merge_bars[0], 0);
    stages.mark(kMarkMergeLanded);
    // The peers have exited, only this CTA's fold and store are left: the next grid may launch
    // (FlashDecodeTrigger::merge_inputs_landed).
    if (p.trigger == kTriggerMergeInputsLanded) allow_dependents();
    for (int slot = tid; slot < valid_rows * kSlotsPerRow; slot += kThreads) {
      const int row = slot / kSlotsPerRow;
      const int d = (slot % kSlotsPerRow) * 4;
      // live <= kMergeBatch (a cluster's splits): one batch, half as wide up to 8 splits (the
      // 8-split plans), where the wide batch's second half would be padding.
      SplitMerge merge =
          live_splits <= kMergeBatch / 2
              ? fold_received<kMergeBatch / 2, kHeadDim>(recv_o, recv_lse, live_splits,
                                                         valid_rows, row, d)
              : fold_received<kMergeBatch, kHeadDim>(recv_o, recv_lse, live_splits, valid_rows,
                                                     row, d);
      store_merged<T>(p, result_slot<T>(p, b, kv_head, row_base + row, d), merge);
    }
    stages.mark(kMarkMerged);
    return;
  }

  // Stage 6: the last split to finish merges every split's partial, in split order. Arrival is
  // the cooperative-groups grid-barrier pattern: the CTA barrier orders every thread's partial
  // stores before thread 0's release fence (fences are cumulative), the counter atomic publishes
  // them; in the merging CTA thread 0's acquire fence and the CTA barrier order every thread's
  // partial loads after all arrivals. One fence per CTA, acq_rel rather than sc.
  __shared__ int is_last;
  const std::int64_t unit = unit_index();
  __syncthreads();
  if (tid == 0) {
    fence_acq_rel_gpu();
    const unsigned done = atomicAdd(p.counters + unit, 1u);
    is_last = done == static_cast<unsigned>(live_splits - 1);
    if (is_last) {
      p.counters[unit] = 0u;  // every live split has arrived: ready for the next launch
      fence_acq_rel_gpu();
    }
  }
  __syncthreads();
  if (!is_last) return;
  const std::int64_t first_row = unit * grid_splits() * kRows;  // split 0's row 0
  for (int slot = tid; slot < valid_rows * kSlotsPerRow; slot += kThreads) {
    const int row = slot / kSlotsPerRow;
    const int d = (slot % kSlotsPerRow) * 4;
    const float* lse_row = p.partial_lse + (unit * kRows + row) * grid_splits();
    const float* o_base = p.partial_o + (first_row + row) * kHeadDim + d;
    SplitMerge merge;
    for (int s0 = 0; s0 < live_splits; s0 += kMergeBatch) {
      float ls[kMergeBatch];
      float4 os[kMergeBatch];
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {  // independent loads: one round trip per batch
        const bool ok = s0 + i < live_splits;
        ls[i] = ok ? __ldcg(lse_row + s0 + i) : -INFINITY;
        os[i] = ok ? __ldcg(reinterpret_cast<const float4*>(o_base + (s0 + i) * kRows * kHeadDim))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      merge_batch(merge, ls, os);
    }
    store_merged<T>(p, result_slot<T>(p, b, kv_head, row_base + row, d), merge);
  }
}

}  // namespace splice::cuda::detail
