// The fused KDA decode kernels (spec kda_decode.md §2-§3): device code only. Host logic (variant
// choice, launch, alignment checks) lives in kda_decode.cu.
//
// Work item = (work unit u, head h); a unit is a sequence (packed) or a row (plain / t1). Three
// kernels share the per-item stages below (precompute_tokens, sweep_token, norm_head_token,
// ConvWriteback); the per-head kernel is at the end of this file, the two stream kernels with
// their ring, item schedule and claims in kda_decode_stream.cuh:
//   kda_decode_kernel: one CTA per (item, value slice s); a cluster of kSlices CTAs covers one
//     head's 128 value rows (`wide` 256 threads and `wide512` 512 threads one CTA a head,
//     `split2` / `split4` 2 / 4 CTAs of 128). The state loads are issued before the precompute
//     (one CTA a head: after it, from L2, where they were prefetched before the PDL wait).
//   kda_decode_rows_kernel (kda_decode_rows.cuh, T = 1): one CTA of 512 threads per item, two
//     CTAs an SM, 8 rows x 4 columns of state a thread, conv and gates on threads of their own.
//   kda_decode_stream_kernel: one persistent CTA of 8 warps per SM walks items with a grid
//     stride, keeping a ring of 2 (fp32) or 3 (bf16) shared-memory stages filled by the copy
//     engine (cp.async.bulk + mbarrier) with each coming item's source state and first-chunk
//     inputs; the copies of item k + stages are issued by the warps themselves right after item
//     k's state is in registers (no producer warp: 9 warps cannot hold ~200 registers each).
//   kda_decode_stream_ws_kernel (bf16 T <= 8; fp32 T = 1, and T <= 8 with >= 16 items a CTA):
//     the same ring on 12 warps in two roles, 8 sweep warps and 4 precompute warps that run
//     item k + 1's precompute beside item k's sweep.
// Notation: D = 128, C = H*D, rows b .. b+L-1 of unit u, accepted offset a, conv slot cs, source
// slot ss, checkpoint destinations dst[t].
//
// Stages of one item:
//   1. Metadata (resolve_item): packed mode reads qsl[u], qsl[u+1], nat[u] (T > 1 only) and the
//      slot row state_indices[u, :]; per-row mode has b = u, L = 1, a = 0 and
//      cs = ss = dst[0] = row_slots[u]. Packed rows >= qsl[N] are zeroed, strided over the units
//      (zero_unowned). A null item (cs <= 0 or ss <= 0) zeroes its rows and stops; L == 0 stops.
//   2. This CTA's rows of S = state[ss, h] (kRows x D, 16-byte vectors) reach registers (fp32)
//      after the first precompute; the old conv history this CTA writes back is loaded now.
//      The first chunk's inputs come from device memory or from the stream kernel's stage
//      (GlobalInputs / StagedInputs; the 4-slice kernel's LeanInputs are device memory through
//      latency-trimmed precompute code); later chunks always from device memory.
//   3. For each chunk of up to kChunk tokens:
//      a. Precompute (one warp per (token, kind)), into shared memory; each warp item issues all
//         of its loads before their first use (one memory round trip, not one per conv tap or
//         gate channel as before):
//           q, k (128 channels): mixed = bf16(pre * sigmoid(pre)),
//             pre = e[t] w0 + e[t+1] w1 + e[t+2] w2 + e[t+3] w3, e = [hist0..2, x[b], x[b+1], ..]
//             q^ = q * (1/sqrt(sum q^2 + 1e-6)) * D^-0.5,  k^ = k * (1/sqrt(sum k^2 + 1e-6))
//           gate: z = raw_gate + dt_bias, g = lb sigmoid(e^A z) or -e^A softplus(z), decay = e^g;
//                 beta = sigmoid(raw_beta); dst[t]
//           v (this slice's rows): bf16 conv + SiLU as above; og = sigmoid(output_gate);
//           the raw bits of x[b + t] for the write-back.
//      b. State sweep, no barriers: each thread owns kRowsPerThread rows x kCols columns. Per token
//           S[v,k] *= decay[k];  pred[v] = sum_k S[v,k] k^[k]      (per-thread partials, then a
//           delta[v] = beta (v[v] - pred[v])                        transposing butterfly over
//           S[v,k] += delta[v] k^[k];  o[v] = sum_k S[v,k] q^[k]    the kLanes lanes of a row)
//         (the per-head kernels sum o over the decayed state in the first pass instead:
//         o[v] = sum_k S'[v,k] q^[k] + delta[v] (k^ . q^); SweepPasses)
//         then o_b[t][v] = bf16(o[v]) into shared memory and S into slot dst[t] when dst[t] > 0
//         (rounded to the state dtype at the store; the carried S stays fp32).
//      c. Gated RMSNorm (one warp per token): inv = 1/sqrt(sum_v o_b^2 / D + eps), summed over
//         the cluster's slices through distributed shared memory in rank order;
//         out[r,h,v] = bf16(o_b[v] * inv * norm_weight[v] * og[v]).
//      d. Conv write-back of this chunk into slot cs, for this slice's rows of each projection:
//         positions 0, 1 <- old a+1, a+2 (first chunk), 2 + t <- x[b + t] (bit copies). Only the
//         first chunk reads the history, and every slice's precompute of it precedes the barrier
//         before the first write: with one CTA per head that is the precompute's own barrier (the
//         write-back then runs before the sweep, off the tail); with a cluster, the partials'
//         barrier wait of c.
//
// Critical path at N = 1 (the launch-bound size; `split4` at T <= 2, H heads -> 4H CTAs), in
// dependent global round trips (a round trip = a load whose result a later load's address or a
// branch before it needs; stores are not waited on until the grid completes):
//   0. PDL wait (detail::pdl_prologue): the launch and CTA start overlap the predecessor's tail.
//   1. metadata: qsl[N], qsl[u], qsl[u+1], state_indices[u, 0] (T > 1: nat[u] and the whole slot
//      row state_indices[u, 0..T-1] for T <= 8, the source slot selected from it), in parallel.
//   2. everything else, in parallel: this CTA's state rows (16-byte loads), the old history for
//      the write-back, norm_weight, and the precompute's inputs (x, conv history, taps, dt_bias,
//      raw gate, beta, destinations, output gate, A_log: each warp item issues all of its loads
//      before the first use).
//   With the stable-state promise (Params::stable_state, a decode step's launches) 1 and this
//   CTA's state rows of 2 are issued before the PDL wait, beside the predecessor's tail: after
//   the wait only the inputs' round trip is left (N = 1 T = 1: f32 4.88 -> 3.84 us, perf.md
//   run 93). Without it, the last warp prefetches this CTA's state rows and the head's conv
//   history into L2 before the wait, from metadata read there (prefetch_sources_before_wait), so
//   2's loads of them read L2: N = 1 T = 1 bf16 4.29 -> 3.70, f32 4.61 -> 3.95 us (perf.md runs
//   265 and 270: the state rows f32 -6%, T = 2 / 4 -10 / -7%, bf16 T = 2 / 4 -2.6 / -1.7%; the
//   history then -14% at T = 1, level at T = 2); the stream kernels prefetch their ring's states
//   the same way (the history there measured level, run 270).
//   then compute only: precompute -> barrier -> sweep + checkpoint stores -> barrier -> the
//   RMSNorm partials' exchange (st.async into every slice's shared memory, an mbarrier wait; no
//   cluster barrier, whose release fence would wait for the checkpoint stores' acks) -> output
//   stores -> conv write-back (stores).
//   T > 8: each further chunk's precompute is one more round trip (device memory).
// Before this version the path held ~8: qsl[N] after the slots (its own round trip before the
// state loads), exp(A_log) before the precompute's loads, one stall per conv tap (4) and per gate
// channel (4), the output gate after the conv, and nat[u] before the source slot (T > 1).
// The `stream` kernel (forced at N = 1; the rule picks it from 2 SMs of items) has two before its
// first item computes: the resolving warp's metadata, then the bulk copies of the state and
// first-chunk inputs (batch 0's beta bits and destinations are read while those copies fly; they
// were a third round trip).
// Per-head kernels at T > 1 prefetch the first chunk's inputs into L1 beside the state loads, so
// the later warp items of a warp (one kind, token after token) hit L1.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/launch.cuh"

namespace splice::cuda::kda {

// cluster.cuh's DSMEM and mbarrier primitives: the split kernels' RMSNorm partials exchange (stage
// 3c: each slice st.async-stores its partial into every slice's shared memory and waits on its own
// mbarrier, no cluster barrier after the sweep) and the stream kernel's bulk-copy ring.
using detail::bulk_copy;
using detail::bulk_copy_hinted;
using detail::bulk_prefetch_l2;
using detail::cluster_arrive_relaxed;
using detail::cluster_wait;
using detail::l2_evict_policy;
using detail::mbar_arrive;
using detail::mbar_arrive_expect;
using detail::mbar_init;
using detail::mbar_test;
using detail::mbar_wait_warp;
using detail::smem_addr;
using detail::st_async_cluster;

constexpr int kD = 128;                    // head dim (K = V)
constexpr int kConvWidth = 4;              // conv taps
constexpr int kHist = kConvWidth - 1;      // history entries per channel
constexpr int kProj = 3;                   // q, k, v blocks of x
constexpr int kHeadChannels = kProj * kD;  // 384 conv channels per head
constexpr int kChunk = 8;                  // tokens precomputed per chunk
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kKindsPerToken = 4;  // precompute work items per token: q, k, gate, v
constexpr float kL2Eps = 1e-6f;
constexpr float kSoftplusThreshold = 20.0f;
constexpr int kChannelsPerLane = kD / kWarp;  // 4

// Kernel arguments: raw pointers, element strides, scalars (no splice types).
struct Params {
  const std::uint16_t* x;  // [R, 3C] bf16, row stride x_row
  std::int64_t x_row;
  const float* weight;  // [3, 4, C] f32 contiguous
  std::uint16_t* conv;  // [slots, 3C, T+2] bf16, strides [conv_slot, 1, 3C]
  std::int64_t conv_slot;
  const std::uint16_t* gate;  // [R, H, D] bf16
  std::int64_t gate_row, gate_head;
  const std::uint16_t* beta;  // [R, H] bf16
  std::int64_t beta_row, beta_head;
  const float* a_log;        // [H]
  const float* dt_bias;      // [C]
  const float* norm_weight;  // [D]
  void* state;               // [slots, H, D, D] f32 | bf16, slot stride state_slot (elems)
  std::int64_t state_slot;
  const std::uint16_t* out_gate;  // [R, H, D] bf16
  std::int64_t og_row, og_head;
  std::uint16_t* out;                 // [R, H, D] bf16 contiguous
  const std::int32_t* state_indices;  // packed: [N, T]
  const std::int32_t* row_slots;      // plain / t1: [R] (null in packed mode)
  const std::int32_t* qsl;            // packed: [N + 1]
  const std::int32_t* nat;            // packed: [N]
  int num_units;                      // N (packed) or R (per-row)
  int num_heads;                      // H
  int num_rows;                       // R
  int max_t;                          // T
  int num_slots;
  int channels;       // C
  float lower_bound;  // used when use_lower_bound
  int use_lower_bound;
  float norm_eps;
  unsigned tune;  // KdaTuneBits (kda_decode.h): the dev-only schedule knob of `stream`
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  int dev_scratch_vec;  // (attribution) the scratch's offset in the dynamic shared memory, uint4s
  int dev_stamps;       // (attribution) this launch writes the clock64 stamps (dev_stamp)
#endif
  // KdaDecodeArgs::stable_state (the kernels read the metadata and the source state before
  // their PDL wait: the per-head kernels their CTA's item, the stream kernels their first
  // kStages items).
  int stable_state;
  // (stream kernels; the launcher's rule) the source-state bulk copies carry an L2 evict_last
  // policy and the checkpoint stores evict_first (l2_evict_policy).
  int l2_hints;
  // (fp32 precompute-group stream kernel; the launcher's rule) dynamic items: with item_counter
  // non-null each CTA walks its first static_items items statically (w = blockIdx.x + k *
  // gridDim.x) and then claims items from the pool w >= static_items * gridDim.x one at a time
  // (item_counter[0]: claims; [1]: CTAs done claiming; zero between launches, the last CTA done
  // resets both). Null: every item static.
  unsigned* item_counter;
  int static_items;
};

// KdaTuneBits of kda_decode.h, as the kernels test them.
constexpr unsigned kTuneNoOverlap = 1u, kTuneNoL2Hints = 256u, kTuneStaticItems = 512u;
// Attribution only (dev/kda_attribution; honoured in a SPLICE_KDA_DEV_ATTRIBUTION build): the
// sweep stores no checkpoint / skips its arithmetic.
constexpr unsigned kTuneDevDropCheckpoints = 2u, kTuneDevDropSweepMath = 4u;
// (`stream` only) checkpoints packed into a per-warp shared scratch past StreamSmem (its dynamic
// shared memory has kDevScratchBytes more in an attribution build) / packed by truncation.
constexpr unsigned kTuneDevCheckpointsToShared = 8u, kTuneDevTruncatePack = 16u;
// The precompute skips its q, k and v warp items (gates, beta and destinations stay) / `stream`
// skips its deferred RMSNorms / the sweep skips its three shuffle butterflies.
constexpr unsigned kTuneDevDropPrecompute = 32u, kTuneDevDropNorms = 64u,
                   kTuneDevDropButterflies = 128u;
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// (attribution) clock64 stamps of the precompute-group `stream` kernel: CTAs 0 and
// kStampSecondCta, items k < kStampItems, lane 0 of each warp, kStampPoints points per item (its
// loops' phases; kda_dev_stamps() in kda_decode.cu copies them out after a launch). Only the
// launch after kda_dev_stamps_reset() stamps (Params::dev_stamps): the stamps' barrier and stores
// slow their two CTAs by 3-7% (perf.md run 197), which skewed the whole-launch timeline's tail.
constexpr int kStampCtas = 2, kStampSecondCta = 66, kStampItems = 64, kStampWarps = 12,
              kStampPoints = 7;
__device__ long long g_kda_dev_stamps[kStampCtas][kStampItems][kStampWarps][kStampPoints];
__device__ __forceinline__ void dev_stamp(const Params& p, int k, int point) {
  if (p.dev_stamps == 0) return;
  const int cta = blockIdx.x == 0 ? 0 : (blockIdx.x == kStampSecondCta ? 1 : -1);
  if (cta >= 0 && k < kStampItems) {
    __syncwarp();  // the warp's view, not one lane's (a lane may run ahead of a diverged warp)
    const long long now = clock64();
    if (threadIdx.x % kWarp == 0 && threadIdx.x / kWarp < kStampWarps)
      g_kda_dev_stamps[cta][k][threadIdx.x / kWarp][point] = now;
  }
}
#define SPLICE_KDA_STAMP(k, point) dev_stamp(p, k, point)
// (attribution) the whole-launch timeline of the precompute-group `stream` kernel: %globaltimer
// (ns) of every CTA b < kTimelineCtas in kTimelineSlots consecutive launches (slot = the CTA's
// ticket, so launches back to back keep theirs). Fields (kda_decode.h, KdaDevTimeline): entry
// and the end of the prologue (thread 0), each item's state in registers and its sweep's end
// (sweep warp 0), the sweep warps' and the norm warp's exits, the SM id, item 0's stage landed
// and its precompute done (the norm warp), the staggered prefill's other copies issued (thread 0).
constexpr int kTimelineSlots = 4, kTimelineCtas = 264, kTimelineItems = 128,
              kTimelineFields = 9 + 2 * kTimelineItems;
constexpr int kTlEntry = 0, kTlPrologue = 1, kTlSweepExit = 2, kTlNormExit = 3, kTlSm = 4,
              kTlCount = 5, kTlLanded0 = 6, kTlPrecomputed0 = 7, kTlRingIssued = 8, kTlReady = 9,
              kTlSwept = 9 + kTimelineItems;
__device__ long long g_kda_dev_timeline[kTimelineSlots][kTimelineCtas][kTimelineFields];
__device__ unsigned g_kda_dev_timeline_ticket[2][kTimelineCtas];
__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// This launch's timeline row of this CTA (role 0: thread 0; role 1: the norm warp's lane 0).
__device__ __forceinline__ long long* timeline_row(int role) {
  if (blockIdx.x >= kTimelineCtas) return nullptr;
  const unsigned slot = atomicAdd(&g_kda_dev_timeline_ticket[role][blockIdx.x], 1u);
  return g_kda_dev_timeline[slot % kTimelineSlots][blockIdx.x];
}
#else
#define SPLICE_KDA_STAMP(k, point) ((void)0)
#endif
// (attribution, bit 8) the checkpoint scratch past StreamSmem: 512 B a warp (was 2 KB before the
// bf16 ring's 16 token slots left only ~7.7 KB of the 227 KB).
constexpr int kDevScratchBytes = 4096;

__device__ __forceinline__ float bf16_to_f32(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}
__device__ __forceinline__ std::uint16_t f32_to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
// exp in fp32 (expf, a few ulp from the correctly rounded value). v3 used fp64 exp to track the
// CPU oracle's std::exp(float) bit for bit: no visible accuracy gain, ~20% slower `stream`
// (its precompute is on the critical path) (docs/perf-gpu-kda.md). These run O(D) times per
// token, next to O(D^2) state work.
__device__ __forceinline__ float exp_f32(float z) { return expf(z); }
__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + exp_f32(-z)); }
// The 4-slice kernel's first-chunk precompute (LeanInputs, the N = 1 path) computes the IEEE
// reciprocal and square root as nvcc's own fast paths do, without its per-call test and branch
// to the slow path: a group of values is tested once and redone with the IEEE operators when any
// is out of range, so every result is bit for bit what `1.0f / x` and `sqrtf` give
// (dev/kda-n1-sass.md, P5: the groups' chains interleave instead of each waiting on a branch).
__device__ __forceinline__ bool rcp_in_range(float x) {
  return ((__float_as_uint(x) + 0x1800000u) & 0x7f800000u) > 0x1ffffffu;
}
__device__ __forceinline__ float rcp_fast(float x) {
  float r;
  asm("{\n .reg .f32 e;\n rcp.approx.ftz.f32 %0, %1;\n fma.rn.f32 e, %1, %0, 0fBF800000;\n"
      " neg.ftz.f32 e, e;\n fma.rn.f32 %0, %0, e, %0;\n}"
      : "=f"(r)
      : "f"(x));
  return r;
}
__device__ __forceinline__ bool sqrt_in_range(float x) {
  return __float_as_uint(x) - 0x0d000000u <= 0x727fffffu;
}
__device__ __forceinline__ float sqrt_fast(float x) {
  float r;
  asm("{\n .reg .f32 y, s, h, e, ns;\n rsqrt.approx.ftz.f32 y, %1;\n mul.ftz.f32 s, %1, y;\n"
      " mul.ftz.f32 h, y, 0f3F000000;\n neg.f32 ns, s;\n fma.rn.f32 e, ns, s, %1;\n"
      " fma.rn.f32 %0, e, h, s;\n}"
      : "=f"(r)
      : "f"(x));
  return r;
}
// 1.0f / sqrtf(x), one range test for both operations.
__device__ __forceinline__ float inv_sqrt_rn(float x) {
  const float root = sqrt_fast(x);
  float inv = rcp_fast(root);
  if (!(sqrt_in_range(x) && rcp_in_range(root))) inv = 1.0f / sqrtf(x);
  return inv;
}
// sigmoid() of kN values, one range test for the group.
template <int kN>
__device__ __forceinline__ void sigmoid_n(const float (&z)[kN], float (&out)[kN]) {
  float den[kN];
  bool in_range = true;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    den[i] = 1.0f + exp_f32(-z[i]);
    out[i] = rcp_fast(den[i]);
    in_range = in_range && rcp_in_range(den[i]);
  }
  if (!in_range) {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = 1.0f / den[i];
  }
}
__device__ __forceinline__ float softplus(float z) {
  return z > kSoftplusThreshold ? z : log1pf(exp_f32(z));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = kWarp / 2; m >= 1; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}
constexpr int log2_int(int v) { return v <= 1 ? 0 : 1 + log2_int(v / 2); }

// Sums kRt per-row partials over the kLanes lanes of one row group (lanes j = 0..kLanes-1) with a
// transposing butterfly: kRt - 1 + log2(kLanes / kRt) shuffles instead of kRt * log2(kLanes).
// Lane j returns the total of row (j >> log2(kLanes / kRt)).
template <int kRt, int kLanes>
__device__ __forceinline__ float reduce_rows(float (&v)[kRt], int j) {
  constexpr int kStages = log2_int(kRt);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int half = kRt >> (s + 1);
    const int mask = kLanes >> (s + 1);
    const bool upper = (j & mask) != 0;
#pragma unroll
    for (int i = 0; i < kRt / 2; ++i) {
      if (i < half) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, mask);
      }
    }
  }
  float total = v[0];
#pragma unroll
  for (int mask = kLanes / (2 * kRt); mask >= 1; mask /= 2)
    total += __shfl_xor_sync(kFullMask, total, mask);
  return total;
}

// The inverse: lane j holds the value of row (j >> log2(kLanes / kRt)); every lane of the group
// gets all kRt rows' values in `out`, in row order.
template <int kRt, int kLanes>
__device__ __forceinline__ void gather_rows(float mine, float (&out)[kRt], int j) {
  constexpr int kStages = log2_int(kRt);
  out[0] = mine;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int cnt = 1 << s;
    const int mask = (kLanes / kRt) << s;
    const bool upper = (j & mask) != 0;
#pragma unroll
    for (int i = 0; i < kRt / 2; ++i) {
      if (i < cnt) {
        const float other = __shfl_xor_sync(kFullMask, out[i], mask);
        const float lo = upper ? other : out[i];
        const float hi = upper ? out[i] : other;
        out[i] = lo;
        out[i + cnt] = hi;
      }
    }
  }
}

// 16-byte state vectors: 4 fp32 or 8 bf16 elements. kVec = false reads element by element (a
// slot stride or base that is not 16-byte aligned).
template <typename StateT>
struct StateVec;
template <>
struct StateVec<float> {
  static constexpr int kElems = 4;
};
template <>
struct StateVec<__nv_bfloat16> {
  static constexpr int kElems = 8;
};

template <typename StateT, bool kVec>
__device__ __forceinline__ uint4 load_state_vec(const StateT* p) {
  if constexpr (kVec) {
    return *reinterpret_cast<const uint4*>(p);
  } else if constexpr (sizeof(StateT) == 4) {
    const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(p);
    return make_uint4(q[0], q[1], q[2], q[3]);
  } else {
    const std::uint16_t* q = reinterpret_cast<const std::uint16_t*>(p);
    uint4 r;
    r.x = q[0] | (static_cast<std::uint32_t>(q[1]) << 16);
    r.y = q[2] | (static_cast<std::uint32_t>(q[3]) << 16);
    r.z = q[4] | (static_cast<std::uint32_t>(q[5]) << 16);
    r.w = q[6] | (static_cast<std::uint32_t>(q[7]) << 16);
    return r;
  }
}

// The stream kernels' L2 eviction policies (l2_evict_policy, cluster.cuh). They stream more state
// than the L2 holds (Params::l2_hints): their source-state copies carry evict_last and their
// checkpoint stores evict_first, which moved 2-4% more bytes a second than plain accesses at
// N >= 128 (perf.md runs 146-149; measured, mechanism not known: the L2's choice among clean
// read lines and dirty checkpoint lines when it evicts). A source slot is overwritten by a
// checkpoint of the same launch wherever a decode step writes one there (T = 1 in place; the
// accepted token's slot of a speculative row), so its lines leave evict_first.

// One 16-byte checkpoint store with L2 policy `policy` (16-byte aligned state only).
__device__ __forceinline__ void store_state_vec_hinted(void* p, uint4 r, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(
                   __cvta_generic_to_global(p)),
               "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w), "l"(policy));
}

template <typename StateT, bool kVec>
__device__ __forceinline__ void store_state_vec(StateT* p, uint4 r) {
  if constexpr (kVec) {
    // One 16-byte store (a plain uint4 assignment was split into four 4-byte stores for some
    // vectors).
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)),
                 "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w));
  } else if constexpr (sizeof(StateT) == 4) {
    std::uint32_t* q = reinterpret_cast<std::uint32_t*>(p);
    q[0] = r.x;
    q[1] = r.y;
    q[2] = r.z;
    q[3] = r.w;
  } else {
    std::uint16_t* q = reinterpret_cast<std::uint16_t*>(p);
    const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[2 * i] = static_cast<std::uint16_t>(w[i] & 0xffffu);
      q[2 * i + 1] = static_cast<std::uint16_t>(w[i] >> 16);
    }
  }
}

// Widens one 16-byte vector to fp32.
template <typename StateT>
__device__ __forceinline__ void unpack(uint4 r, float* out) {
  const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
  if constexpr (sizeof(StateT) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

// Rounds fp32 values to the state dtype (RNE) and packs one 16-byte vector.
template <typename StateT>
__device__ __forceinline__ uint4 pack(const float* in) {
  std::uint32_t w[4];
  if constexpr (sizeof(StateT) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(in[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// Attribution only: pack() with the bf16 rounding replaced by truncation (one PRMT a pair).
template <typename StateT>
__device__ __forceinline__ uint4 pack_truncate(const float* in) {
  if constexpr (sizeof(StateT) == 4) {
    return pack<StateT>(in);
  } else {
    std::uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = __byte_perm(__float_as_uint(in[2 * i]), __float_as_uint(in[2 * i + 1]), 0x7632);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}
#endif

// Per-chunk shared memory of one CTA with kRows value rows and kSlots token slots (a chunk's
// kChunk tokens; the stream kernel's overlap holds two items' tokens, stream_slots(); the
// one-token precompute-group kernel two slots).
template <int kRows, int kSlots = kChunk>
struct Shared {
  static_assert(kSlots >= 2, "two items' tokens at least");
  float q[kSlots][kD];      // q^
  float k[kSlots][kD];      // k^
  float decay[kSlots][kD];  // exp(g)
  float v[kSlots][kRows];   // bf16-exact v of this slice's rows
  float og[kSlots][kRows];  // sigmoid(output_gate)
  float o[kSlots][kRows];   // bf16(o_raw)
  // [chunk parity, slice, token]: each slice's sum of o_b^2, pushed into every slice of the
  // cluster (distributed shared memory); the parity keeps a fast slice's next chunk from
  // overwriting partials a slow slice still reads.
  float part[2][kD / kRows][kChunk];
  std::uint16_t x[kSlots][kProj][kD];  // raw x bits of this head's channels (conv write-back)
  float beta[kSlots];
  int dst[kSlots];
  // [chunk parity] mbarriers: part[parity] is complete once every slice's partials have landed
  // (st.async with complete_tx, stage 3c).
  std::uint64_t part_bar[2];
};

template <int kThreads, int kSlices>
struct Layout {
  static constexpr int kRows = kD / kSlices;  // value rows per CTA
  static constexpr int kWarps = kThreads / kWarp;
  static constexpr int kLanes = 8;                // lanes sharing one state row
  static constexpr int kGroups = kWarp / kLanes;  // rows per warp per instruction
  static constexpr int kRowsPerThread = kRows / (kWarps * kGroups);
  static constexpr int kCols = kD / kLanes;  // columns per thread
  static constexpr int kMinBlocks = (kThreads >= 512 ? 1 : kThreads >= 256 ? 2 : 4);
  static constexpr int kWriteback = (kProj * kRows + kThreads - 1) / kThreads;
  static_assert(kRowsPerThread >= 1 && kRowsPerThread <= kLanes, "bad row split");
  static_assert((kRowsPerThread & (kRowsPerThread - 1)) == 0, "rows per thread: power of 2");
  static_assert(kRows % kWarp == 0, "rows per CTA must be a multiple of 32");
};

// One work item: head h of work unit u, as the metadata resolves it (stage 1).
struct Item {
  std::int64_t b = 0;  // first row
  int u = 0, h = 0;
  int len = 0;                            // L (0: nothing to do)
  int a = 0;                              // accepted offset
  int cs = 0, ss = 0;                     // conv slot, source slot
  int live = 0;                           // L > 0 and both slots valid
  const std::int32_t* dst_row = nullptr;  // packed: state_indices[u, :]
};

// Stage 1 for item (u, h). Packed T = 1 reads no num_accepted_tokens (a = 0). For 1 < T <=
// kSpeculativeSlots the whole slot row is read beside nat[u] and the source slot selected from
// it, so the state address waits for one memory round trip instead of two (nat, then the slot).
// kOneToken: a kernel that runs only T = 1 (`rows`) compiles out the T > 1 paths and their
// registers.
constexpr int kSpeculativeSlots = 8;
template <bool kOneToken = false>
__device__ __forceinline__ Item resolve_item(const Params& p, int u, int h) {
  Item it;
  it.u = u;
  it.h = h;
  if (p.row_slots == nullptr) {
    const int q0 = p.qsl[u], q1 = p.qsl[u + 1];
    const int T = kOneToken ? 1 : p.max_t;
    it.dst_row = p.state_indices + static_cast<std::int64_t>(u) * T;
    if (T > 1 && T <= kSpeculativeSlots) {
      int row[kSpeculativeSlots];
#pragma unroll
      for (int t = 0; t < kSpeculativeSlots; ++t) row[t] = t < T ? it.dst_row[t] : 0;
      it.a = min(max(p.nat[u] - 1, 0), T - 1);
      it.cs = row[0];
      it.ss = row[0];
#pragma unroll
      for (int t = 1; t < kSpeculativeSlots; ++t) it.ss = t == it.a ? row[t] : it.ss;
    } else {
      it.a = T > 1 ? min(max(p.nat[u] - 1, 0), T - 1) : 0;
      it.cs = it.dst_row[0];
      it.ss = it.dst_row[it.a];
    }
    it.b = max(q0, 0);
    it.len = min(min(q1, p.num_rows) - q0, T);  // value contract: L <= T, rows < R (guarded)
  } else {
    it.b = u;
    it.len = 1;
    it.cs = it.ss = p.row_slots[u];
  }
  it.live = it.len > 0 && it.cs > 0 && it.ss > 0 && it.cs < p.num_slots && it.ss < p.num_slots;
  return it;
}

// L2 prefetches of the conv history of head h in conv slot cs from accepted offset a (positions
// a .. a + kHist - 1 of the 3 projections: 9 vectors of 128 channels, the first and last line of
// each), spread over `lanes` lanes from lane `first`.
__device__ __forceinline__ void prefetch_history_l2(const Params& p, int cs, int a, int h,
                                                    int first, int lanes) {
  const std::uint16_t* hist =
      p.conv + cs * p.conv_slot + static_cast<std::int64_t>(a) * kProj * p.channels + h * kD;
  for (int i = first; i < kHist * kProj * 2; i += lanes) {
    const std::uint16_t* v = hist + (i / 2) * p.channels + (i % 2) * (kD - 1);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(v)));
  }
}

// Before the PDL wait: L2 prefetches of item (u, h)'s source state rows [row0, row0 + rows) (with
// `state`; 16-byte aligned states only: a bulk prefetch) and conv history (with `history`: its
// 3 x 3 vectors of 128 channels), found from metadata read there (no stable-state promise: a
// predecessor may still write the metadata, so these reads are not resolve_item's). The loads
// are L2-only (__ldcg: no L1 line is left for a load after the wait to hit), independent of each
// other (one round trip; two at T > 8: nat[u], then the slot), and their values only choose L2
// prefetches, bounded to the state and conv tensors; a prefetch changes nothing any load reads
// (L2 is the point of coherence), so a stale value costs bandwidth, never a result.
template <typename StateT, bool kOneToken = false>
__device__ __forceinline__ void prefetch_sources_before_wait(const Params& p, int u, int h,
                                                             int row0, int rows, bool state,
                                                             bool history) {
  int ss, cs, a = 0;
  if (p.row_slots != nullptr) {
    ss = cs = __ldcg(p.row_slots + u);
  } else {
    const int T = kOneToken ? 1 : p.max_t;
    const std::int32_t* slots = p.state_indices + static_cast<std::int64_t>(u) * T;
    int row[kSpeculativeSlots];
#pragma unroll
    for (int t = 0; t < kSpeculativeSlots; ++t) row[t] = t < T ? __ldcg(slots + t) : 0;
    a = T > 1 ? min(max(__ldcg(p.nat + u) - 1, 0), T - 1) : 0;
    cs = row[0];
    ss = a < kSpeculativeSlots ? row[0] : __ldcg(slots + a);
#pragma unroll
    for (int t = 1; t < kSpeculativeSlots; ++t) ss = t == a ? row[t] : ss;
  }
  if (history && cs > 0 && cs < p.num_slots) prefetch_history_l2(p, cs, a, h, 0, 1);
  if (!state || ss <= 0 || ss >= p.num_slots) return;
  const StateT* src = static_cast<const StateT*>(p.state) + ss * p.state_slot +
                      (static_cast<std::int64_t>(h) * kD + row0) * kD;
  bulk_prefetch_l2(src, static_cast<std::uint32_t>(rows * kD * sizeof(StateT)));
}

// The first row past the packed sequences, min(qsl[N], R) (R in per-row mode: nothing trails).
__device__ __forceinline__ int owned_rows(const Params& p) {
  return p.row_slots == nullptr ? min(max(p.qsl[p.num_units], 0), p.num_rows) : p.num_rows;
}

// Zeroes the outputs that item `it` owns but does not compute: its rows when null, and (packed)
// the trailing rows [qn, R), qn = owned_rows(p), strided over the units. Rows row0 .. row0+kRows-1
// of head h.
template <int kThreads, int kRows>
__device__ __forceinline__ void zero_unowned(const Params& p, const Item& it, int row0, int qn) {
  const int tid = threadIdx.x;
  for (int r = qn + it.u; r < p.num_rows; r += p.num_units)
    for (int i = tid; i < kRows; i += kThreads)
      p.out[(static_cast<std::int64_t>(r) * p.num_heads + it.h) * kD + row0 + i] = 0;
  if (!it.live && it.len > 0) {
    for (int i = tid; i < it.len * kRows; i += kThreads) {
      const int t = i / kRows, v = i % kRows;
      p.out[((it.b + t) * p.num_heads + it.h) * kD + row0 + v] = 0;
    }
  }
}

// Where the precompute reads an item's inputs. Token t counts from the item's first row b,
// history position pos from the accepted offset a, channel d within head h's 128 channels of
// projection proj (0 q, 1 k, 2 v). Two sources with one interface:
//   GlobalInputs: device memory (read-only inputs through the non-coherent path; the conv history,
//     which this kernel rewrites, and x with plain loads);
//   StagedInputs: a shared-memory copy of the first chunk's inputs that the stream kernel's
//     warps staged ahead of time (StagedIn), so no global load is on the item's path.
struct GlobalInputs {
  // The history and x bases stay in registers; every other address is formed on use from the
  // kernel parameters (constant memory) and the item.
  const Params& p;
  const Item& it;
  const std::uint16_t* hist;  // &conv_state[cs, a, h * D]
  const std::uint16_t* x;     // &x[b, h * D]
  __device__ GlobalInputs(const Params& params, const Item& item)
      : p(params),
        it(item),
        hist(params.conv + item.cs * params.conv_slot +
             item.a * (static_cast<std::int64_t>(kProj) * params.channels) +
             static_cast<std::int64_t>(item.h) * kD),
        x(params.x + item.b * params.x_row + static_cast<std::int64_t>(item.h) * kD) {}
  __device__ std::int64_t head() const { return static_cast<std::int64_t>(it.h) * kD; }
  __device__ const std::uint16_t* hist_at(int pos, int pr) const {
    return hist + (pos * kProj + pr) * static_cast<std::int64_t>(p.channels);
  }
  __device__ const std::uint16_t* x_at(int t, int pr) const {
    return x + t * p.x_row + static_cast<std::int64_t>(pr) * p.channels;
  }
  __device__ const float* w_at(int pr, int tap) const {  // &weight[pr, tap, h * D]
    return p.weight + static_cast<std::int64_t>(pr * kConvWidth + tap) * p.channels + head();
  }
  __device__ std::uint16_t act(const std::uint16_t* q) const { return *q; }
  // Tap `tap` of channel d of projection pr (the i-th of this lane's channels).
  __device__ float weight(int pr, int tap, int /*i*/, int d) const {
    return __ldg(w_at(pr, tap) + d);
  }
  __device__ std::uint16_t gate_bits(int t, int d) const {
    return __ldg(p.gate + (it.b + t) * p.gate_row + it.h * p.gate_head + d);
  }
  __device__ std::uint16_t og_bits(int t, int d) const {
    return __ldg(p.out_gate + (it.b + t) * p.og_row + it.h * p.og_head + d);
  }
  __device__ std::uint16_t beta_bits(int t) const {
    return __ldg(p.beta + (it.b + t) * p.beta_row + it.h * p.beta_head);
  }
  __device__ float dt_bias(int /*e*/, int d) const { return __ldg(p.dt_bias + head() + d); }
  __device__ float a_log() const { return __ldg(p.a_log + it.h); }
  // Packed: state_indices[u, t]; per-row: the row's slot.
  __device__ int dst_at(int t) const { return it.dst_row != nullptr ? it.dst_row[t] : it.ss; }
};

// The 4-slice kernel's first chunk (the N = 1 path, latency-bound; every call with T <= kChunk):
// device memory as GlobalInputs, through the precompute's latency-trimmed code (grouped IEEE
// reciprocals, a token-0 conv window; dev/kda-n1-sass.md P5 / P7, bit-identical). The stream
// kernel, measured slower with it (docs/perf.md run 51), and the 1- and 2-slice kernels, which it
// made spill more, keep the plain code.
struct LeanInputs : GlobalInputs {
  using GlobalInputs::GlobalInputs;
};

// The stream kernel's staged copy of one item's first-chunk inputs (filled by the copy engine:
// every array is a whole number of 16-byte vectors at a 16-byte offset) and its scalars (written
// by the warp that stages the item).
// kTokens: the first-chunk tokens a stage holds (kChunk; 1 in the one-token kernel).
template <int kTokens>
struct alignas(16) StagedInT {
  std::uint16_t hist[kHist][kProj][kD];  // conv history positions a .. a+2
  std::uint16_t x[kTokens][kProj][kD];   // x rows b .. b+nt0-1, head h's channels
  std::uint16_t gate[kTokens][kD];
  std::uint16_t og[kTokens][kD];
  Item item;
  float a_log;
  std::int32_t dst[kChunk];
  std::uint16_t beta[kChunk];
};
using StagedIn = StagedInT<kChunk>;

// The item's head parameters, staged beside StagedIn by the 8-warp stream kernel (the
// precompute-group kernel holds them in registers instead: HeadTaps).
struct alignas(16) StagedTaps {
  float weight[kProj][kConvWidth][kD];
  float dt_bias[kD];
};

template <typename In = StagedIn>
struct StagedInputs {
  const In* s;
  const StagedTaps* taps = nullptr;  // (only where the kernel staged them)
  __device__ const std::uint16_t* hist_at(int pos, int pr) const { return s->hist[pos][pr]; }
  __device__ const std::uint16_t* x_at(int t, int pr) const { return s->x[t][pr]; }
  __device__ std::uint16_t act(const std::uint16_t* q) const { return *q; }
  __device__ float weight(int pr, int tap, int /*i*/, int d) const {
    return taps->weight[pr][tap][d];
  }
  __device__ std::uint16_t gate_bits(int t, int d) const { return s->gate[t][d]; }
  __device__ std::uint16_t og_bits(int t, int d) const { return s->og[t][d]; }
  __device__ std::uint16_t beta_bits(int t) const { return s->beta[t]; }
  __device__ float dt_bias(int /*e*/, int d) const { return taps->dt_bias[d]; }
  __device__ float a_log() const { return s->a_log; }
  __device__ int dst_at(int t) const { return s->dst[t]; }
};

// One precompute warp's share of a head's parameters, in registers: the conv taps of its
// kind's projection (q 0, k 1, v 2) for this lane's channels lane + 32 i, or (the gate kind)
// dt_bias of those channels in w[0]. The precompute-group kernel loads them from device memory
// (every item of the head finds them in L2) instead of staging them: 13 fewer bulk copies an
// item, whose issue holds the issuing warp ~300 cycles each (perf.md runs 123-127).
struct HeadTaps {
  float w[kConvWidth][kChannelsPerLane];
  __device__ void load(const Params& p, int h, int kind) {
    const int lane = threadIdx.x % kWarp;
    const std::int64_t head = static_cast<std::int64_t>(h) * kD;
    if (kind == 2) {
#pragma unroll
      for (int i = 0; i < kChannelsPerLane; ++i)
        w[0][i] = __ldg(p.dt_bias + head + lane + i * kWarp);
      return;
    }
    const int pr = kind == 3 ? 2 : kind;
#pragma unroll
    for (int tap = 0; tap < kConvWidth; ++tap)
#pragma unroll
      for (int i = 0; i < kChannelsPerLane; ++i)
        w[tap][i] = __ldg(p.weight + static_cast<std::int64_t>(pr * kConvWidth + tap) * p.channels +
                          head + lane + i * kWarp);
  }
};
// The staged inputs with the taps and dt_bias from a warp's HeadTaps (its own projection's).
template <typename In = StagedIn>
struct StagedInputsRegisterTaps : StagedInputs<In> {
  const HeadTaps& head_taps;
  __device__ float weight(int /*pr*/, int tap, int i, int /*d*/) const {
    return head_taps.w[tap][i];
  }
  __device__ float dt_bias(int e, int /*d*/) const { return head_taps.w[0][e]; }
};

// The conv + SiLU outputs of channels d0 + 32 i (i < kPer) of projection `pr` for token `tt`,
// where the extended window is e = [hist0, hist1, hist2, x[b], x[b+1], ..]. A warp's lanes take
// consecutive channels, so each tap is one coalesced load per i. Every tap's loads are issued
// before the first use (the window entry's source is selected, not branched on), so the conv
// costs one memory round trip, not one per tap (SASS before: a branch and a stall per tap).
template <int kPer, bool kFirstToken, typename In>
__device__ __forceinline__ void conv_silu_impl(const In& in, int pr, int tt_in, int d0,
                                               float (&out)[kPer], std::uint16_t (&x_bits)[kPer]) {
  const int tt = kFirstToken ? 0 : tt_in;  // token 0: the window is hist0..2, x[b]
  std::uint16_t act[kConvWidth][kPer];
  float w[kConvWidth][kPer];
#pragma unroll
  for (int tap = 0; tap < kConvWidth; ++tap) {
    const int e = tt + tap;
    const std::uint16_t* hist = in.hist_at(min(e, kHist - 1), pr);
    const std::uint16_t* xrow = in.x_at(max(e - kHist, 0), pr);
    const std::uint16_t* src = e < kHist ? hist : xrow;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      act[tap][i] = in.act(src + d0 + i * kWarp);
      w[tap][i] = in.weight(pr, tap, i, d0 + i * kWarp);
    }
  }
  float pre[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) pre[i] = 0.0f;
#pragma unroll
  for (int tap = 0; tap < kConvWidth; ++tap) {
    // Separate multiply and add, in tap order, as the spec writes it (no contraction).
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      pre[i] = __fadd_rn(pre[i], __fmul_rn(bf16_to_f32(act[tap][i]), w[tap][i]));
  }
  if constexpr (std::is_same_v<In, LeanInputs>) {
    float sig[kPer];
    sigmoid_n<kPer>(pre, sig);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      x_bits[i] = act[kConvWidth - 1][i];  // e = tt + 3 >= 3: always x[b + tt]
      out[i] = round_bf16(pre[i] * sig[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      x_bits[i] = act[kConvWidth - 1][i];
      out[i] = round_bf16(pre[i] * sigmoid(pre[i]));
    }
  }
}
// LeanInputs run token 0 (every T = 1 call) through a copy specialized for it (its window's
// sources are constants: no min / max / select; dev/kda-n1-sass.md, P7).
template <int kPer, typename In>
__device__ __forceinline__ void conv_silu(const In& in, int pr, int tt, int d0, float (&out)[kPer],
                                          std::uint16_t (&x_bits)[kPer]) {
  if constexpr (std::is_same_v<In, LeanInputs>) {
    if (tt == 0) return conv_silu_impl<kPer, true>(in, pr, tt, d0, out, x_bits);
  }
  conv_silu_impl<kPer, false>(in, pr, tt, d0, out, x_bits);
}

// Thread geometry of the state sweep: this thread's i-th row and c-th 16-byte column vector.
template <int kThreads, int kSlices, typename StateT>
struct Geometry {
  using L = Layout<kThreads, kSlices>;
  static constexpr int kVecElems = StateVec<StateT>::kElems;
  static constexpr int kVecs = L::kCols / kVecElems;  // 16-byte vectors per row per thread
  static_assert(L::kCols % kVecElems == 0, "columns per thread must be whole vectors");
  int warp, g, j;
  __device__ Geometry() {
    const int lane = threadIdx.x % kWarp;
    warp = threadIdx.x / kWarp;
    g = lane / L::kLanes;  // row group within the warp
    j = lane % L::kLanes;  // lane within the row group
  }
  // Warps own contiguous blocks of kRt * kGroups rows; groups interleave inside them.
  __device__ int row(int i) const {
    return warp * (L::kRowsPerThread * L::kGroups) + i * L::kGroups + g;
  }
  // Vectors j, j + kLanes, ...: a row group reads 128 contiguous bytes per instruction.
  __device__ int col(int c) const { return (j + c * L::kLanes) * kVecElems; }
};

// Barrier over the kThreads threads that run items (named barrier 1: every thread of the per-head
// and 8-warp stream kernels, the 8 sweep warps of the precompute-group kernel). Orders
// shared-memory accesses like __syncthreads.
template <int kThreads>
__device__ __forceinline__ void cta_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
}

// Stage 3c for one token of a head held by one CTA (kSlices == 1), on one warp: o and the
// output gate are in token slot `slot` of sm; row = the token's packed row.
//   inv = 1/sqrt(sum_v o_b[v]^2 / D + eps);  out[row, h, v] = bf16(o_b[v] inv norm_w[v] og[v])
// The inline norm and the deferred one (stream, T = 1) both run this code: the same bits.
template <int kSlots>
__device__ __forceinline__ void norm_head_token(const Params& p, const Shared<kD, kSlots>& sm,
                                                int slot, std::int64_t row, int h,
                                                const float (&norm_w)[kChannelsPerLane]) {
  const int lane = threadIdx.x % kWarp;
  float ssq = 0.0f;
#pragma unroll
  for (int e = 0; e < kChannelsPerLane; ++e) {
    const float v = sm.o[slot][lane * kChannelsPerLane + e];
    ssq += v * v;
  }
  const float total = warp_sum(ssq);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(kD) + p.norm_eps);
  std::uint16_t* out = p.out + (row * p.num_heads + h) * kD;
#pragma unroll
  for (int e = 0; e < kChannelsPerLane; ++e) {
    const int rr = lane * kChannelsPerLane + e;
    out[rr] = f32_to_bf16(sm.o[slot][rr] * inv * norm_w[e] * sm.og[slot][rr]);
  }
}

// Stage 3a for the warp items first, first + stride, ... of tokens c0 .. c0+nt-1 (warp item =
// (token t, kind), kind 0 q, 1 k, 2 gate, 3 v), from `in`, into token slot ts + t of sm. Each kind
// issues all of its loads before their first use (one memory round trip per warp item when `in`
// is device memory). Rows row0 .. row0+kRows-1 of v and the output gate.
template <int kRows, int kSlots, typename In>
__device__ __forceinline__ void precompute_tokens(const Params& p, Shared<kRows, kSlots>& sm,
                                                  int row0, int c0, int nt, const In& in, int ts,
                                                  int first, int stride) {
  const int lane = threadIdx.x % kWarp;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(kD));
  // LeanInputs: grouped reciprocals (P5, bit-identical).
  constexpr bool kGrouped = std::is_same_v<In, LeanInputs>;
#pragma unroll 1
  for (int item = first; item < nt * kKindsPerToken; item += stride) {
    const int t = item / kKindsPerToken, kind = item % kKindsPerToken;
    const int tt = c0 + t;
    const int slot = ts + t;
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if ((p.tune & kTuneDevDropPrecompute) != 0 && kind != 2) continue;
#endif
    if (kind < 2) {  // q (kind 0) or k (kind 1): conv, SiLU, L2 norm
      float m[kChannelsPerLane];
      std::uint16_t xb[kChannelsPerLane];
      conv_silu<kChannelsPerLane>(in, kind, tt, lane, m, xb);
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e) sm.x[slot][kind][lane + e * kWarp] = xb[e];
      float ssq = 0.0f;
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e) ssq += m[e] * m[e];
      const float inv =
          kGrouped ? inv_sqrt_rn(warp_sum(ssq) + kL2Eps) : 1.0f / sqrtf(warp_sum(ssq) + kL2Eps);
      float* dst = kind == 0 ? sm.q[slot] : sm.k[slot];
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e)
        dst[lane + e * kWarp] = kind == 0 ? m[e] * inv * q_scale : m[e] * inv;
    } else if (kind == 2) {  // gate, beta, destination
      std::uint16_t gate_bits[kChannelsPerLane];
      float bias[kChannelsPerLane];
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e) {
        gate_bits[e] = in.gate_bits(tt, lane + e * kWarp);
        bias[e] = in.dt_bias(e, lane + e * kWarp);
      }
      const float a_log = in.a_log();
      const std::uint16_t beta_bits = in.beta_bits(tt);  // one address: a broadcast load
      const int dst = in.dst_at(tt);
      const float a_h = exp_f32(a_log);
      float z[kChannelsPerLane];
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e) z[e] = bf16_to_f32(gate_bits[e]) + bias[e];
      if (p.use_lower_bound && kGrouped) {
        float az[kChannelsPerLane], sig[kChannelsPerLane];
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e) az[e] = a_h * z[e];
        sigmoid_n<kChannelsPerLane>(az, sig);
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e)
          sm.decay[slot][lane + e * kWarp] = exp_f32(p.lower_bound * sig[e]);
      } else if (p.use_lower_bound) {
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e)
          sm.decay[slot][lane + e * kWarp] = exp_f32(p.lower_bound * sigmoid(a_h * z[e]));
      } else {
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e)
          sm.decay[slot][lane + e * kWarp] = exp_f32(-a_h * softplus(z[e]));
      }
      if (lane == 0) {
        sm.beta[slot] = sigmoid(bf16_to_f32(beta_bits));
        sm.dst[slot] = dst < p.num_slots ? dst : 0;
      }
    } else {  // v of this slice's rows, and the output gate
      constexpr int kPer = kRows / kWarp;
      std::uint16_t og_bits[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) og_bits[e] = in.og_bits(tt, row0 + lane + e * kWarp);
      float vv[kPer];
      std::uint16_t xb[kPer];
      conv_silu<kPer>(in, 2, tt, row0 + lane, vv, xb);
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int rr = lane + e * kWarp;
        sm.x[slot][2][row0 + rr] = xb[e];
        sm.v[slot][rr] = vv[e];
        if constexpr (!kGrouped) sm.og[slot][rr] = sigmoid(bf16_to_f32(og_bits[e]));
      }
      if constexpr (kGrouped) {
        float oz[kPer], og[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) oz[e] = bf16_to_f32(og_bits[e]);
        sigmoid_n<kPer>(oz, og);
#pragma unroll
        for (int e = 0; e < kPer; ++e) sm.og[slot][lane + e * kWarp] = og[e];
      }
    }
  }
}

// Stage 3d, the conv write-back into slot cs of this slice's rows of each projection: the old
// history positions a+1, a+2 (loaded by load() from the first chunk's inputs, before the barrier
// after which they may be overwritten) and the raw x bits the precompute saved in sm.x.
template <int kThreads, int kSlices>
struct ConvWriteback {
  using L = Layout<kThreads, kSlices>;
  std::uint16_t* base;  // &conv_state[cs, 0, 0]
  std::uint16_t old1[L::kWriteback], old2[L::kWriteback];
  int channel[L::kWriteback];  // pr * C + h * D + d, or -1

  // live false: an item with nothing to write back (nothing is read, store() stores nothing).
  template <typename In>
  __device__ __forceinline__ ConvWriteback(const Params& p, const Item& it, int row0,
                                           const In& first, bool live = true)
      : base(p.conv + static_cast<std::int64_t>(it.cs) * p.conv_slot) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < L::kWriteback; ++k) {
      // This slice writes back its rows' channels of each projection: (proj, row0 + d).
      const int lc = tid + k * kThreads;
      const bool mine = live && lc < kProj * L::kRows;
      const int pr = lc / L::kRows, d = row0 + lc % L::kRows;
      channel[k] = mine ? pr * p.channels + it.h * kD + d : -1;
      if (mine) {
        old1[k] = first.act(first.hist_at(1, pr) + d);
        old2[k] = first.act(first.hist_at(2, pr) + d);
      }
    }
  }
  // Chunk c0's tokens (token t in slot ts + t of sm.x): positions 0, 1 <- old a+1, a+2 (first
  // chunk), positions 2 + c0 + t <- x[b + c0 + t].
  template <int kSlots>
  __device__ __forceinline__ void store(const Params& p, const Shared<L::kRows, kSlots>& sm,
                                        int row0, int c0, int nt, int ts) const {
    const std::int64_t width = static_cast<std::int64_t>(kProj) * p.channels;
    const int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < L::kWriteback; ++k) {
      if (channel[k] < 0) continue;
      const int cgl = channel[k];
      const int lc = tid + k * kThreads;
      const int proj = lc / L::kRows, d = row0 + lc % L::kRows;
      if (c0 == 0) {
        base[cgl] = old1[k];
        base[width + cgl] = old2[k];
      }
#pragma unroll 1
      for (int t = 0; t < nt; ++t) base[(kHist - 1 + c0 + t) * width + cgl] = sm.x[ts + t][proj][d];
    }
  }
};

// The order of stage 3b's row sums. kTwo: pred = S' k^ over the decayed state S' = S diag(decay),
// the update, then o = S q^ over the updated state (two passes, three butterflies). kOne: both
// sums over S' in one pass, pred = S' k^ and S' q^, and o = S' q^ + delta (k^ . q^) (= the
// updated S times q^), so the output waits for no butterfly after the update; k^ . q^ is reduced
// beside them. The per-head kernels take kOne (perf.md run 289: wide bf16 -3% at N = 8, fp32
// -17 to -26%: the third butterfly's registers were spilled; split4 -0.5 to -2.4%); the stream
// kernels keep kTwo (run 192: bf16 +0.5-3.8% slower at T > 1 with kOne, run 289: level at T = 1).
enum class SweepPasses { kTwo, kOne };

// Stage 3b for one token (slot `slot` of sm) on this thread's rows s of the state: the decay, the
// delta rule, o_b into sm.o[slot] and the checkpoint into slot dst (when dst > 0).
template <int kThreads, int kSlices, typename StateT, bool kVec, SweepPasses kPasses, int kSlots>
__device__ __forceinline__ void sweep_token(
    const Params& p, Shared<Layout<kThreads, kSlices>::kRows, kSlots>& sm,
    float (&s)[Layout<kThreads, kSlices>::kRowsPerThread][Layout<kThreads, kSlices>::kCols],
    int slot, int row0, int h) {
  using L = Layout<kThreads, kSlices>;
  using G = Geometry<kThreads, kSlices, StateT>;
  constexpr int kRt = L::kRowsPerThread;
  constexpr int kLanes = L::kLanes;
  constexpr int kVecElems = G::kVecElems;
  constexpr int kVecs = G::kVecs;
  const G geo;
  const int my_row = geo.j >> log2_int(kLanes / kRt);         // row reduced into lane j
  const bool row_leader = (geo.j & (kLanes / kRt - 1)) == 0;  // one writer per reduced row
  constexpr bool kOnePass = kPasses == SweepPasses::kOne;
  float part[kRt];   // pred's partials: S' k^
  float opart[kRt];  // kOne: o's partials over S': S' q^
#pragma unroll
  for (int i = 0; i < kRt; ++i) part[i] = opart[i] = 0.0f;
  float kq = 0.0f;  // kOne: this thread's columns of k^ . q^
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  const bool drop_math = (p.tune & kTuneDevDropSweepMath) != 0;
  const bool drop_stores = (p.tune & kTuneDevDropCheckpoints) != 0;
#else
  constexpr bool drop_math = false, drop_stores = false;
#endif
  float kk[L::kCols];  // this thread's k^ columns, read once for both passes
  if (!drop_math) {
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
#pragma unroll
      for (int e = 0; e < kVecElems; e += 4) {
        const float4 dv = *reinterpret_cast<const float4*>(&sm.decay[slot][geo.col(c) + e]);
        const float4 kv = *reinterpret_cast<const float4*>(&sm.k[slot][geo.col(c) + e]);
        float4 qv{};
        if constexpr (kOnePass) qv = *reinterpret_cast<const float4*>(&sm.q[slot][geo.col(c) + e]);
        const float dd[4] = {dv.x, dv.y, dv.z, dv.w};
        const float kc[4] = {kv.x, kv.y, kv.z, kv.w};
        const float qc[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int col = c * kVecElems + e + x;
          kk[col] = kc[x];
          if constexpr (kOnePass) kq = fmaf(kc[x], qc[x], kq);
#pragma unroll
          for (int i = 0; i < kRt; ++i) {
            s[i][col] *= dd[x];
            part[i] = fmaf(s[i][col], kc[x], part[i]);
            if constexpr (kOnePass) opart[i] = fmaf(s[i][col], qc[x], opart[i]);
          }
        }
      }
    }
  }
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  const bool drop_shuffles = (p.tune & kTuneDevDropButterflies) != 0;
#else
  constexpr bool drop_shuffles = false;
#endif
  const float pred = drop_shuffles ? part[0] : reduce_rows<kRt, kLanes>(part, geo.j);
  float o_decayed = 0.0f;  // kOne: (S' q^)[my_row]
  if constexpr (kOnePass) {
    o_decayed = drop_shuffles ? opart[0] : reduce_rows<kRt, kLanes>(opart, geo.j);
    if (!drop_shuffles) {
#pragma unroll
      for (int m = kLanes / 2; m >= 1; m /= 2) kq += __shfl_xor_sync(kFullMask, kq, m);
    }
  }
  const float delta_mine = sm.beta[slot] * (sm.v[slot][geo.row(my_row)] - pred);
  float delta[kRt];
  if (drop_shuffles) {
#pragma unroll
    for (int i = 0; i < kRt; ++i) delta[i] = delta_mine;
  } else {
    gather_rows<kRt, kLanes>(delta_mine, delta, geo.j);
  }

  float o[kRt];  // kTwo: o's partials over the updated S
#pragma unroll
  for (int i = 0; i < kRt; ++i) o[i] = 0.0f;
  if (!drop_math && kOnePass) {
#pragma unroll
    for (int col = 0; col < L::kCols; ++col)
#pragma unroll
      for (int i = 0; i < kRt; ++i) s[i][col] = fmaf(delta[i], kk[col], s[i][col]);
  } else if (!drop_math) {
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
#pragma unroll
      for (int e = 0; e < kVecElems; e += 4) {
        const float4 qv = *reinterpret_cast<const float4*>(&sm.q[slot][geo.col(c) + e]);
        const float qq[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int col = c * kVecElems + e + x;
#pragma unroll
          for (int i = 0; i < kRt; ++i) {
            s[i][col] = fmaf(delta[i], kk[col], s[i][col]);
            o[i] = fmaf(s[i][col], qq[x], o[i]);
          }
        }
      }
    }
  }
  const float o_total = kOnePass        ? fmaf(delta_mine, kq, o_decayed)
                        : drop_shuffles ? o[0]
                                        : reduce_rows<kRt, kLanes>(o, geo.j);
  if (row_leader) sm.o[slot][geo.row(my_row)] = round_bf16(o_total);

  const int dst = sm.dst[slot];
  // The checkpoint's 16-byte vectors (attribution build: optionally packed by truncation).
  auto packed = [&](int i, int c) {
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if ((p.tune & kTuneDevTruncatePack) != 0) return pack_truncate<StateT>(&s[i][c * kVecElems]);
#endif
    return pack<StateT>(&s[i][c * kVecElems]);
  };
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  if (dst > 0 && (p.tune & kTuneDevCheckpointsToShared) != 0) {
    extern __shared__ uint4 smem_raw[];
    uint4* scratch =
        smem_raw + p.dev_scratch_vec + (threadIdx.x / kWarp) * (kDevScratchBytes / 16 / 8);
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int i = 0; i < kRt; ++i)
#pragma unroll
      for (int c = 0; c < kVecs; ++c)
        scratch[((i * kVecs + c) * kWarp + lane) & (kDevScratchBytes / 16 / 8 - 1)] = packed(i, c);
    return;
  }
#endif
  if (dst > 0 && !drop_stores) {
    // One address for this thread's first vector; the others sit at compile-time offsets (rows
    // i kGroups rows apart, vectors c kLanes vectors apart), so each store is one STG with an
    // immediate offset instead of its own 64-bit address arithmetic (~45 instructions a token).
    StateT* const first = static_cast<StateT*>(p.state) +
                          static_cast<std::int64_t>(dst) * p.state_slot +
                          (static_cast<std::int64_t>(h) * kD + row0 + geo.row(0)) * kD + geo.col(0);
    const auto store_checkpoint = [&](auto store) {
#pragma unroll
      for (int i = 0; i < kRt; ++i)
#pragma unroll
        for (int c = 0; c < kVecs; ++c)
          store(first + i * L::kGroups * kD + c * kLanes * kVecElems, packed(i, c));
    };
    if (kVec && p.l2_hints != 0) {
      const std::uint64_t policy = l2_evict_policy<false>();
      store_checkpoint([policy](StateT* at, uint4 r) { store_state_vec_hinted(at, r, policy); });
    } else {
      store_checkpoint([](StateT* at, uint4 r) { store_state_vec<StateT, kVec>(at, r); });
    }
  }
}

// Stages 2-4 for one live item. `first` is where the first chunk's inputs (and the old history
// for the write-back) are read; later chunks read device memory. `load_state(s)` fills this
// thread's rows of the source state (fp32) after this thread's part of the first chunk's
// precompute; then one barrier, after which `first` is no longer read and `release()` runs.
// `defer_slot` (stream, T = 1 only; else -1): the item's one token uses token slot defer_slot
// of sm, and its RMSNorm is left to the caller (norm_head_token, during the next item).
template <int kThreads, int kSlices, typename StateT, bool kVec, SweepPasses kPasses, int kSlots,
          typename FirstInputs, typename LoadState, typename Release>
__device__ __forceinline__ void run_item(const Params& p,
                                         Shared<Layout<kThreads, kSlices>::kRows, kSlots>& sm,
                                         const Item& it, int slice, const FirstInputs& first,
                                         LoadState&& load_state, Release&& release,
                                         int defer_slot = -1) {
  using L = Layout<kThreads, kSlices>;
  constexpr int kRows = L::kRows;
  constexpr int kRt = L::kRowsPerThread;
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int h = it.h;
  const int row0 = slice * kRows;
  const std::int64_t b = it.b;
  const int len = it.len;
  const int ts = defer_slot < 0 ? 0 : defer_slot;  // token slot offset (T = 1 deferral)

  // Old history for the write-back (stage 3d), loaded now.
  const ConvWriteback<kThreads, kSlices> wb(p, it, row0, first);

  // RMSNorm weights of the output channels this lane writes in stage 3c, loaded now so that no
  // global load sits on the item's tail.
  constexpr int kPerLane = kRows / kWarp;
  float norm_w[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) norm_w[e] = __ldg(p.norm_weight + row0 + lane * kPerLane + e);

  float s[kRt][L::kCols];  // this thread's rows of S, fp32, carried across tokens
  precompute_tokens(p, sm, row0, 0, min(kChunk, len), first, ts, warp, L::kWarps);
  load_state(s);
  cta_sync<kThreads>();
  release();

#pragma unroll 1
  for (int c0 = 0; c0 < len; c0 += kChunk) {
    const int nt = min(kChunk, len - c0);
    if (c0 > 0) {
      cta_sync<kThreads>();  // the previous chunk's write-back has read sm.x
      precompute_tokens(p, sm, row0, c0, nt, GlobalInputs(p, it), ts, warp, L::kWarps);
      cta_sync<kThreads>();
    }
    // One CTA holds the head: every history read (first chunk's precompute, old1/old2) and this
    // chunk's sm.x precede the barrier above, so the write-back runs now, off the item's tail.
    if constexpr (kSlices == 1) {
      wb.store(p, sm, row0, c0, nt, ts);
    }

    // Stage 3b: the state sweep.
#pragma unroll 1
    for (int t = 0; t < nt; ++t)
      sweep_token<kThreads, kSlices, StateT, kVec, kPasses>(p, sm, s, ts + t, row0, h);
    cta_sync<kThreads>();

    // Stage 3c: gated RMSNorm, one warp per token. In a cluster each slice stores its partial
    // sum into every slice's sm.part (st.async, completing on that slice's part_bar), then each
    // slice waits on its own barrier and adds the kSlices partials in rank order from its own
    // shared memory. Chunk k uses parity k & 1, the (k >> 1)-th phase of that barrier; a slice
    // sends chunk k + 2's partials only after every slice's chunk k + 1 partials have reached it,
    // so no partial lands in a later phase than its own.
    const int parity = (c0 / kChunk) & 1;
    if constexpr (kSlices > 1) {
      // Every CTA of the cluster has started and initialized its barriers (the arrival at kernel
      // entry) before the first store into another CTA's shared memory.
      if (c0 == 0) cluster_wait();
      if (tid == 0) mbar_arrive_expect(&sm.part_bar[parity], kSlices * nt * sizeof(float));
#pragma unroll 1
      for (int t = warp; t < nt; t += L::kWarps) {
        float ssq = 0.0f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const float v = sm.o[t][lane * kPerLane + e];
          ssq += v * v;
        }
        ssq = warp_sum(ssq);
        if (lane < kSlices)
          st_async_cluster(&sm.part[parity][slice][t], ssq, &sm.part_bar[parity], lane);
      }
      // Every thread waits: for the partials (the norm), and so that every slice's history reads
      // precede stage 3d's write-back (a slice sends its partials after its precompute, whose
      // results they depend on).
      mbar_wait_warp<true>(&sm.part_bar[parity], (c0 / kChunk >> 1) & 1);
    }
    if constexpr (kSlices > 1) {
#pragma unroll 1
      for (int t = warp; t < nt; t += L::kWarps) {
        float total = 0.0f;
#pragma unroll
        for (int r = 0; r < kSlices; ++r) total += sm.part[parity][r][t];
        const float inv = 1.0f / sqrtf(total / static_cast<float>(kD) + p.norm_eps);
        std::uint16_t* out = p.out + ((b + c0 + t) * p.num_heads + h) * kD + row0;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const int rr = lane * kPerLane + e;
          out[rr] = f32_to_bf16(sm.o[t][rr] * inv * norm_w[e] * sm.og[t][rr]);
        }
      }
    } else if (defer_slot < 0) {
#pragma unroll 1
      for (int t = warp; t < nt; t += L::kWarps) norm_head_token(p, sm, t, b + c0 + t, h, norm_w);
    }
    if constexpr (kSlices > 1) {
      wb.store(p, sm, row0, c0, nt, 0);
    }
  }
}

// L1 prefetch of every input vector the first chunk's precompute reads (history, taps, dt_bias,
// and per token x q/k/v, raw gate, output gate), one vector per thread, issued right after the
// state loads. A warp item's loads are one round trip, but a warp runs several items in turn
// when T > 1 (split4: one kind per warp, T items each) and reloads the taps for every token;
// with the lines prefetched, only the first of them waits for device memory (T > 1 only).
__device__ __forceinline__ void prefetch_span(const void* ptr, std::uint32_t bytes) {
  constexpr std::uint32_t kLine = 128;
  const char* c = static_cast<const char*>(ptr);
  for (std::uint32_t o = 0; o < bytes; o += kLine)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(c + o)));
  asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(c + bytes - 1)));
}
__device__ __forceinline__ void prefetch_first_chunk(const Params& p, const Item& it) {
  constexpr int kHistVecs = kHist * kProj;
  constexpr int kTapVecs = kProj * kConvWidth;
  constexpr int kFixed = kHistVecs + kTapVecs + 1;  // + dt_bias
  constexpr int kPerToken = kProj + 2;              // x q/k/v, raw gate, output gate
  constexpr std::uint32_t kBf16Vec = kD * sizeof(std::uint16_t);
  constexpr std::uint32_t kF32Vec = kD * sizeof(float);
  const int i = threadIdx.x;
  const int tokens = min(it.len, kChunk);
  // One token: each warp item runs once and issues its own loads at once; nothing to gain.
  if (tokens < 2 || i >= kFixed + tokens * kPerToken) return;
  const GlobalInputs in(p, it);
  if (i < kHistVecs) {
    prefetch_span(in.hist_at(i / kProj, i % kProj), kBf16Vec);
  } else if (i < kHistVecs + kTapVecs) {
    const int k = i - kHistVecs;
    prefetch_span(in.w_at(k / kConvWidth, k % kConvWidth), kF32Vec);
  } else if (i == kFixed - 1) {
    prefetch_span(p.dt_bias + in.head(), kF32Vec);
  } else {
    const int k = i - kFixed, t = k / kPerToken, kind = k % kPerToken;
    const std::int64_t row = it.b + t;
    if (kind < kProj)
      prefetch_span(in.x_at(t, kind), kBf16Vec);
    else if (kind == kProj)
      prefetch_span(p.gate + row * p.gate_row + it.h * p.gate_head, kBf16Vec);
    else
      prefetch_span(p.out_gate + row * p.og_row + it.h * p.og_head, kBf16Vec);
  }
}

// One CTA (or cluster of kSlices CTAs) per item: the state is loaded into registers at the start,
// so its load overlaps the first precompute.
template <int kThreads, int kSlices, typename StateT, bool kVec>
__global__ void __launch_bounds__(kThreads, Layout<kThreads, kSlices>::kMinBlocks)
    __cluster_dims__(kSlices, 1, 1) kda_decode_kernel(const Params p) {
  using L = Layout<kThreads, kSlices>;
  using G = Geometry<kThreads, kSlices, StateT>;
  __shared__ Shared<L::kRows> sm;
  // PDL (launch.cuh's rule): no global access before the wait, so the launch overlaps the
  // predecessor's tail; with the stable-state promise (p.stable_state: no kernel in flight
  // writes the metadata or a source state slot) the metadata and this CTA's state rows are
  // read before the wait too, and only the inputs' round trip follows it.
  const bool stable_state = p.stable_state != 0;
  const int slice = static_cast<int>(blockIdx.x % kSlices);
  const int h = static_cast<int>(blockIdx.y);
  const int u = static_cast<int>(blockIdx.x / kSlices);
  const int row0 = slice * L::kRows;
  // One CTA a head (wide), 16-byte aligned states: the state rows are loaded after the
  // precompute, from L2, where the last warp prefetches them before the wait (with or without
  // the promise). Loaded before it, 64 (bf16 32) registers a thread beside the precompute's
  // spilled, and each spill store waited for its load: the state's round trip landed before the
  // precompute instead of beside it (ncu, perf.md run 285). Runs 286-287: bf16 N = 8 T = 1 / 2 /
  // 4 -13 / -15 / -11%, T = 9 / 16 -6 to -8% at N = 8-128; f32 wide, which the rule picks only
  // for unaligned states (they keep the old order), -9 to +3% where forced.
  constexpr bool kStateAfterPrecompute = kSlices == 1 && kVec;
  if (!stable_state || kStateAfterPrecompute) {
    // Without the promise the conv history and this CTA's state rows (16-byte aligned states: a
    // bulk prefetch) are only prefetched into L2 before the wait, by one warp (the last: where
    // the wait returns within that round trip, its own metadata loads after it start that much
    // later); wide's state rows are prefetched so under the promise too.
    if (threadIdx.x == kThreads - kWarp)
      prefetch_sources_before_wait<StateT>(p, u, h, row0, L::kRows, kVec, !stable_state);
    if (!stable_state) detail::pdl_prologue();
  }
  // qsl[N] is read first, beside the item's metadata: issued after resolve_item it waited for the
  // slots (its selection) and pushed the state loads to a third round trip.
  const int qn = owned_rows(p);
  const Item it = resolve_item(p, u, h);
  const G geo;
  const StateT* src = static_cast<const StateT*>(p.state) +
                      static_cast<std::int64_t>(it.ss) * p.state_slot +
                      static_cast<std::int64_t>(h) * kD * kD;
  uint4 raw[L::kRowsPerThread][G::kVecs];
  if (it.live && !kStateAfterPrecompute) {
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
      for (int c = 0; c < G::kVecs; ++c)
        raw[i][c] = load_state_vec<StateT, kVec>(src + (row0 + geo.row(i)) * kD + geo.col(c));
  }
  // Under the promise the conv history's lines (read after the wait, with the inputs) are
  // prefetched into L2 before it too, by the last warp, from the item it resolved there.
  if (stable_state && it.live && threadIdx.x / kWarp == kThreads / kWarp - 1)
    prefetch_history_l2(p, it.cs, it.a, h, threadIdx.x % kWarp, kWarp);
  if (stable_state) detail::pdl_prologue();  // every store, and every input load, after it
  zero_unowned<kThreads, L::kRows>(p, it, row0, qn);
  if (!it.live) return;  // uniform over the cluster: every slice resolves the same item
  if constexpr (kSlices > 1) {
    // Both parities' barriers, before the entry arrive that publishes them.
    if (threadIdx.x == 0) mbar_init<2>(sm.part_bar);
    cluster_arrive_relaxed();  // waited on in run_item (stage 3c)
  }
  prefetch_first_chunk(p, it);
  using FirstInputs = std::conditional_t<kSlices == 4, LeanInputs, GlobalInputs>;
  run_item<kThreads, kSlices, StateT, kVec, SweepPasses::kOne>(
      p, sm, it, slice, FirstInputs(p, it),
      [&](float(&s)[L::kRowsPerThread][L::kCols]) {
        if constexpr (kStateAfterPrecompute) {
#pragma unroll
          for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
            for (int c = 0; c < G::kVecs; ++c)
              raw[i][c] = load_state_vec<StateT, kVec>(src + (row0 + geo.row(i)) * kD + geo.col(c));
        }
#pragma unroll
        for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
          for (int c = 0; c < G::kVecs; ++c) unpack<StateT>(raw[i][c], &s[i][c * G::kVecElems]);
      },
      [] {});
}

}  // namespace splice::cuda::kda
