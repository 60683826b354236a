// The fused KDA decode stream kernels (kda_decode_stream_kernel and the precompute-group
// kda_decode_stream_ws_kernel): persistent CTAs that walk many items through a ring of
// shared-memory stages filled by the copy engine. Device code only; the stages of one item they
// share with the per-head kernel (metadata, inputs, precompute, sweep, norm, conv write-back) and
// the overview of all three kernels are in kda_decode.cuh.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kda_decode.cuh"

namespace splice::cuda::kda {

// The persistent, pipelined variant (a head of 128 rows per item, 16-byte aligned state): one
// CTA of 8 warps per SM, every warp a consumer; the producer's work is folded into the item's
// existing barriers, so the CTA keeps up to kStages items in flight with no producer warp.
// A CTA walks items w = blockIdx.x + k * gridDim.x, k = 0, 1, ... (its k-th item), item k uses
// stage k % kStages and phase k / kStages of full[k % kStages].
//   Why no producer warp here: a sub-partition holds 16K registers and a CTA's warps are spread
//   over the SM's 4 sub-partitions round-robin, so 9 warps put 3 on one sub-partition: at most
//   170 (168 allocated) registers per thread, where this kernel's warps, which hold the state
//   while they precompute, want ~200-230. 8 warps (2 per sub-partition) admit 255. (The
//   precompute-group kernel below separates the two roles and fits 12 warps.)
//   Metadata: one warp (kResolveWarp) resolves 32 items at a time, one per lane (their dependent
//     loads overlap), into ahead[batch & 1]; batch B + 1 is resolved during item 32 B - kStages
//     (item 0 for batch 1), a batch before it is needed, at the start of the item where that
//     warp has no precompute work at T = 1.
//   Per item k (n = k + kStages, the item that reuses stage k % kStages):
//     wait full[k % kStages] -> read the item -> barrier (every thread is past the wait) ->
//     thread 0 announces n: the single arrival of its phase with the bytes it expects ->
//     run the item: precompute from the stage, state into registers -> barrier (the stage is
//     no longer read) -> stage n (stage_item): warp 0 writes n's scalars, the item's bulk
//     copies (state, inputs) are spread over all 8 warps, at most 8 per warp -> sweep ...
//     The announcement precedes every copy of its phase by a barrier, so the phase's tx-count
//     never runs ahead of its expectation; the scalars are read by item n after the barriers of
//     item k that follow their stores.
//   The schedule per (state dtype, T) (kLookaheadStages: 3 stages, bf16, keep ~2 items of
//   lookahead when a refill is issued late; 2 stages, f32, only ~1):
//     bf16 T <= kOverlapMaxT (8): kda_decode_stream_ws_kernel (below) instead, whose own
//       precompute warps run item k + 1's precompute beside item k's sweep (until session 16
//       this kernel's overlap loop shared that out over its 8 warps: perf.md runs 123-127).
//       Also fp32 T = 1 (its one-token form: a 3-stage ring) and fp32 T <= 8 with >= 16 items a
//       CTA (the launcher's rule, run 133; T = 5-8 since session 22).
//     f32 T = 1 (under kTuneNoOverlap): the item loop; item k's RMSNorm deferred to warp 4
//       during item k + 1 (token slots alternate); the refill issued by all 8 warps between the
//       precompute and the sweep; staggered prefill (item 0's stage first, the rest once it has
//       landed) only when the CTA has no item past the ring.
//     bf16 T > kOverlapMaxT: the item loop, norm on warp 0 at the item's end, refill by all 8
//       warps, staggered prefill always. f32 T > 1: the same, stagger only with no item past the
//       ring.
//   kTuneNoOverlap (dev knob, the A/B reference): bf16 T <= 8 runs this kernel's item loop
//   (T = 1: deferred norm, refill at the top of item k + 1 by warps 5-7 (late copies), stagger).
//   History: v7 -> v8 (deferred norm, late copies, stagger) -> the 8-warp overlap for bf16 T = 1
//   (f32 lost 1.5-6% with it): docs/perf.md runs 17 and 19 -> for bf16 T <= 4 (session 14) ->
//   the precompute-group kernel (session 16).
//   Code size: every kernel runs with a cold instruction cache (~0.06 us per KB executed), so
//   each loop runs its precompute, sweep and deferred norm from one inlined code site
//   (docs/perf-decode-step.md §6, session 7).
// So the loads of up to kStages items (~85 KB each for fp32) are in flight while one item
// computes, and an item's path holds no dependent global load: Little's law asks ~33 KB in
// flight per SM at the copy bandwidth.

// 8 warps, all consumers: 2 warps per sub-partition, so up to 255 registers per thread.
constexpr int kStreamThreads = 256;
constexpr int kStreamBlock = kStreamThreads;  // threads per CTA (no producer warp)
constexpr int kStreamWarps = kStreamBlock / kWarp;
constexpr int kResolveWarp = kStreamWarps - 1;      // no precompute work at T = 1
constexpr int kPrefetchWarp = kResolveWarp - 1;     // the ring's L2 prefetch before the wait
constexpr int kDeferNormWarp = kKindsPerToken;      // deferred norm: no precompute work at T = 1
constexpr int kDeferSlots = 2;                      // deferred norm: token slots o / og alternate
constexpr int kLateCopyWarp0 = kDeferNormWarp + 1;  // late copies: warps 5 .. 7
constexpr int kLateCopyWarps = kStreamWarps - kLateCopyWarp0;  // issue the late copies
// Late copies, the overlap and a staggered prefill each leave a refill one item less to land.
// With kLookaheadStages stages that still leaves ~2 items (bf16 T = 1, N >= 32: late copies 4-6%,
// the overlap 5-18% faster); with 2 (f32) ~1, and the runs lost 2-4% at N >= 128 (late copies),
// 1.5-6% at N = 8 .. 512 (overlap) and 2% at N = 32 (stagger).
constexpr int kLookaheadStages = 3;
// Items whose token slots the overlap holds: k (swept) and k + 1 (precomputed); item k's norms
// run before item k + 2's precompute takes its slots.
constexpr int kOverlapItems = 2;
// The overlap runs sequences of up to kOverlapMaxT tokens (the first chunk: every input staged);
// longer ones run the item loop.
constexpr int kOverlapMaxT = kChunk;

// Stages that fit one CTA's shared memory (227 KB) beside Shared (~31 KB with kChunk token
// slots, ~61 KB with the overlap's 16): 8-warp kernel fp32 2 x ~83 KB, bf16 3 x ~51 KB; the
// precompute-group kernel's stages hold no taps (~6.5 KB less each), so its fp32 ring of 2
// stages fits beside the overlap's 16 slots (~224 KB in all), and its one-token form (T = 1: one
// staged token a stage, ~68 KB, and 2 slots) holds fp32's ring of 3 (~222 KB; StreamSmem).
template <typename StateT>
constexpr int stream_stages() {
  return sizeof(StateT) == 4 ? 2 : 3;
}
// Token slots of a stream kernel's Shared: the overlap's two items of up to kOverlapMaxT tokens
// where it runs (the precompute-group kernel; the 8-warp kernel's 3-stage bf16 ring, which runs
// it under kTuneNoOverlap's A/B), else one chunk.
template <typename StateT, bool kWs>
constexpr int stream_slots() {
  return kWs || stream_stages<StateT>() >= kLookaheadStages ? kOverlapItems * kOverlapMaxT : kChunk;
}

// One ring stage of a stream kernel: an item's source state and staged inputs, and (kTaps: the
// 8-warp kernel) its head's taps.
template <typename StateT, bool kTaps, int kTokens = kChunk>
struct alignas(16) Stage {
  StateT state[kD * kD];  // [D, D] the item's source state
  StagedInT<kTokens> in;
  StagedTaps taps;
};
template <typename StateT, int kTokens>
struct alignas(16) Stage<StateT, false, kTokens> {
  StateT state[kD * kD];  // [D, D] the item's source state
  StagedInT<kTokens> in;
};

// This thread's rows (geo) of a stage's source state into registers (fp32), as the stream
// kernels' sweep warps hold them (Layout<kStreamThreads, 1>).
template <typename StateT, bool kTaps, int kTokens>
__device__ __forceinline__ void load_stage_state(
    const Stage<StateT, kTaps, kTokens>& st, const Geometry<kStreamThreads, 1, StateT>& geo,
    float (&sv)[Layout<kStreamThreads, 1>::kRowsPerThread][Layout<kStreamThreads, 1>::kCols]) {
  using G = Geometry<kStreamThreads, 1, StateT>;
#pragma unroll
  for (int i = 0; i < Layout<kStreamThreads, 1>::kRowsPerThread; ++i)
#pragma unroll
    for (int c = 0; c < G::kVecs; ++c)
      unpack<StateT>(*reinterpret_cast<const uint4*>(st.state + geo.row(i) * kD + geo.col(c)),
                     &sv[i][c * G::kVecElems]);
}

// One resolved item, as the resolving warp's lanes leave it.
struct Ahead {
  Item it;
  float a_log;
  std::int32_t dst[kChunk];
  std::uint16_t beta[kChunk];
};

// Whether a stream kernel claims items dynamically (Params::item_counter): the precompute-group
// kernel with fp32 state (bf16 lost 5-18% at T = 1-2 with them and gained <= 1% at T = 4-8,
// perf.md run 177).
template <typename StateT, bool kWs>
constexpr bool dynamic_items_kernel() {
  return kWs && std::is_same_v<StateT, float>;
}
// The shared memory of dynamic items (StreamItems::Claims), none without them.
template <bool kDynamic>
struct ClaimArea {
  int end[2][kWarp];         // per Ahead entry: no item there (the CTA's items end before it)
  int w;                     // the claim whose Stage A loads are in flight
  std::uint32_t raw[kWarp];  // their values
};
template <>
struct ClaimArea<false> {};

// A stream kernel's shared memory: the 8-warp kernel's (kWs false) or the precompute-group
// kernel's (kWs: no staged taps, the overlap's token slots).
// kTokens (the one-token precompute-group kernel: 1): the first-chunk tokens a stage holds; its
// stages and slots are small enough for an fp32 ring of 3 stages.
template <typename StateT, bool kWs, int kTokens = kChunk>
struct StreamSmem {
  static_assert(kTokens == kChunk || (kWs && kTokens == 1), "one-token stages: precompute group");
  static constexpr int kStages = kTokens == 1 ? kLookaheadStages : stream_stages<StateT>();
  static constexpr bool kTaps = !kWs;  // whether the stages hold the head's taps
  using In = StagedInT<kTokens>;
  Stage<StateT, kTaps, kTokens> stage[kStages];
  Shared<kD, kTokens == 1 ? kOverlapItems : stream_slots<StateT, kWs>()> sm;
  Ahead ahead[2][kWarp];  // resolved items of the current and the next batch
  std::uint64_t full[kStages];
  // The precompute-group kernel's hand-offs (item k on [k & 1], phase k >> 1): item precomputed
  // (every precompute thread arrives), item swept (every sweep thread).
  std::uint64_t precomputed[2], swept[2];
  // Item k's norms are done (phase k; every precompute thread arrives, then waits): they precede
  // item k + 2's precompute into their slots.
  std::uint64_t normed;
  ClaimArea<dynamic_items_kernel<StateT, kWs>()> claim;  // last: the other offsets stay put
};

// The bulk copies of one item: the state, then (staged inputs) the history vectors, the tap rows,
// dt_bias and, per first-chunk token, x's q/k/v vectors, the raw gate and the output gate.
constexpr int kHistCopies = kHist * kProj;
constexpr int kTapCopies = kProj * kConvWidth;
constexpr int kTokenCopies = kProj + 2;
constexpr std::uint32_t kVecBytes = kD * sizeof(std::uint16_t);  // a head's bf16 channels
constexpr std::uint32_t kTapBytes = kD * sizeof(float);          // a head's fp32 channels
// Copy c of an item (stage_item) in this order: 0 the state, then kHistCopies history vectors,
// kTapCopies tap rows, dt_bias, and per first-chunk token t kTokenCopies vectors (x q, k, v, raw
// gate, output gate). Copy c is issued by warp c % kStreamWarps, lane c / kStreamWarps, so every
// warp issues at most ceil(copies / 8) of them: a warp's per-lane bulk copies are issued one lane
// at a time (SASS: an ELECT / R2UR / UBLKCP loop), and the v5.1 roles (warp 2: 13 copies, warp
// 1: 9, the others one) held the slowest warp, and with it the barrier after the sweep, for
// ~13 loop turns per item.
constexpr int kFirstHistCopy = 1;
constexpr int kFirstTapCopy = kFirstHistCopy + kHistCopies;
constexpr int kDtBiasCopy = kFirstTapCopy + kTapCopies;
constexpr int kFirstTokenCopy = kDtBiasCopy + 1;
constexpr int kMaxCopies = kFirstTokenCopy + kChunk * kTokenCopies;
static_assert(kMaxCopies <= kStreamWarps * kWarp, "one copy per thread");

__device__ __forceinline__ std::uint32_t staged_bytes(int nt0, bool taps) {
  return kHistCopies * kVecBytes + (taps ? kTapCopies * kTapBytes + kTapBytes : 0u) +
         static_cast<std::uint32_t>(nt0) * kTokenCopies * kVecBytes;
}

// First-chunk tokens of a resolved item (0 when it is not live: nothing is staged), at most the
// kTokens a stage holds (the one-token kernel runs max_t == 1 launches only).
template <int kTokens = kChunk>
__device__ __forceinline__ int first_tokens(const Item& it) {
  return it.live ? min(kTokens, it.len) : 0;
}

// Thread 0: the single arrival of the phase that brings item `a` into the stage of `bar`, with
// the bytes its copies will deliver (a null item: a plain arrival, the phase completes).
template <typename StateT, bool kStage, bool kTaps, int kTokens = kChunk>
__device__ __forceinline__ void announce_item(const Ahead& a, std::uint64_t* bar) {
  if (!a.it.live) {
    mbar_arrive(bar);
    return;
  }
  const std::uint32_t bytes = static_cast<std::uint32_t>(kD * kD * sizeof(StateT)) +
                              (kStage ? staged_bytes(first_tokens<kTokens>(a.it), kTaps) : 0u);
  mbar_arrive_expect(bar, bytes);
}

// Item `it`'s source state: [D, D] of head it.h in slot it.ss.
template <typename StateT>
__device__ __forceinline__ const StateT* source_state(const Params& p, const Item& it) {
  return static_cast<const StateT*>(p.state) + it.ss * p.state_slot +
         static_cast<std::int64_t>(it.h) * kD * kD;
}

// Which of an item's bulk copies a stage_item call issues: all of them, or (the stable-state
// prologue) the source state alone before the PDL wait and the rest after it.
enum class StageCopies : std::uint8_t { all, state, inputs, none };

// Every thread of warps kWarp0 .. kWarp0 + kWarps - 1 (default: all 8): writes item `a`'s
// scalars into stage `st` (warp kWarp0; not with `scalars` false: the prologue wrote them) and
// issues this thread's bulk copy of it, if any (copy order above, copy c on warp
// kWarp0 + c % kWarps; only the copies `which` names); other warps return. The stage is no longer
// read (a barrier since its last read) and `a` is announced on `bar` before that barrier or, by a
// thread past it, beside these copies (a copy may complete before the announcement's expect_tx; the
// phase still waits for its arrival).
template <typename StateT, bool kStage, int kWarp0 = 0, int kWarps = kStreamWarps, bool kTaps,
          int kTokens>  // (deduced from the stage)
__device__ __forceinline__ void stage_item(const Params& p, const Ahead& a,
                                           Stage<StateT, kTaps, kTokens>& st, std::uint64_t* bar,
                                           StageCopies which = StageCopies::all,
                                           bool scalars = true) {
  static_assert(kMaxCopies <= kWarps * kWarp, "one copy per thread");
  const int warp = threadIdx.x / kWarp - kWarp0;
  const int lane = threadIdx.x % kWarp;
  if (warp < 0 || warp >= kWarps) return;
  const Item& it = a.it;
  if (warp == 0 && scalars) {
    if (lane == 0) {
      st.in.item = it;
      st.in.a_log = a.a_log;
    }
    if (lane < kChunk) {
      st.in.dst[lane] = a.dst[lane];
      st.in.beta[lane] = a.beta[lane];
    }
  }
  if (!it.live || which == StageCopies::none) return;
  const std::int64_t hd = static_cast<std::int64_t>(it.h) * kD;
  const std::int64_t chans = p.channels;
  const void* src = nullptr;
  void* dst = nullptr;
  std::uint32_t bytes = 0;
  // Without taps the copies skip the tap rows and dt_bias (indices kFirstTapCopy ..
  // kDtBiasCopy), which the precompute-group kernel holds in registers (HeadTaps).
  constexpr int kSkipped = kTaps ? 0 : kTapCopies + 1;
  const int copies =
      kStage ? kFirstTokenCopy - kSkipped + first_tokens<kTokens>(it) * kTokenCopies : 1;  // issued
  const int ci = lane * kWarps + warp;  // this thread's copy (order above)
  const int c = kTaps || ci < kFirstTapCopy ? ci : ci + kSkipped;
  if (which == (c == 0 ? StageCopies::inputs : StageCopies::state)) return;
  if (c == 0) {  // source_state(p, it), written with hd (calling it compiles to other code)
    src = static_cast<const StateT*>(p.state) + it.ss * p.state_slot + hd * kD;
    dst = st.state;
    bytes = static_cast<std::uint32_t>(sizeof(st.state));
  } else if (ci < copies) {
    if (c < kFirstTapCopy) {
      const int i = c - kFirstHistCopy, pos = i / kProj, pr = i % kProj;
      src = p.conv + it.cs * p.conv_slot + (it.a + pos) * kProj * chans + pr * chans + hd;
      dst = st.in.hist[pos][pr];
      bytes = kVecBytes;
    } else if (c <= kDtBiasCopy) {
      if constexpr (kTaps) {  // (without taps c skips these copies)
        if (c < kDtBiasCopy) {
          const int i = c - kFirstTapCopy, pr = i / kConvWidth, tap = i % kConvWidth;
          src = p.weight + (pr * kConvWidth + tap) * chans + hd;
          dst = st.taps.weight[pr][tap];
        } else {
          src = p.dt_bias + hd;
          dst = st.taps.dt_bias;
        }
        bytes = kTapBytes;
      }
    } else {
      const int i = c - kFirstTokenCopy, t = i / kTokenCopies, kind = i % kTokenCopies;
      const std::int64_t row = it.b + t;
      bytes = kVecBytes;
      if (kind < kProj) {
        src = p.x + row * p.x_row + kind * chans + hd;
        dst = st.in.x[t][kind];
      } else if (kind == kProj) {
        src = p.gate + row * p.gate_row + it.h * p.gate_head;
        dst = st.in.gate[t];
      } else {
        src = p.out_gate + row * p.og_row + it.h * p.og_head;
        dst = st.in.og[t];
      }
    }
  }
  // No proxy fence before the copies: the stage's earlier readers (generic proxy) completed
  // their reads before the barrier that precedes this call (a barrier waits for its
  // participants' prior accesses to be performed), and no generic-proxy write of these bytes is
  // read by the copy engine (the scalars above are other fields). A fence.proxy.async here was
  // MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS: the issuing warp waited for its outstanding
  // checkpoint stores, ~300 cycles a copy (perf.md runs 123-124).
  if (c == 0 && p.l2_hints != 0)
    bulk_copy_hinted(dst, src, bytes, bar, l2_evict_policy<true>());
  else if (bytes != 0)
    bulk_copy(dst, src, bytes, bar);
}

// This CTA's items of a stream kernel, w = blockIdx.x + k * gridDim.x for k < count, and their
// metadata, resolved a batch of kWarp items at a time into S.ahead[batch & 1] (two batches held).
// With dynamic items (the fp32 precompute-group kernel, Params::item_counter) items k >= count are
// claimed one at a time from the pool after the static ones, each into its own Ahead entry.
template <typename StateT, bool kWs, int kTokens = kChunk>
struct StreamItems {
  using Smem = StreamSmem<StateT, kWs, kTokens>;
  const Params& p;
  Smem& S;
  static constexpr bool kDynamic = dynamic_items_kernel<StateT, kWs>();
  int count;     // the statically mapped items (all of them unless `dynamic`)
  bool dynamic;  // p.item_counter: items count .. are claimed (Claims)
  __device__ StreamItems(const Params& params, Smem& smem) : p(params), S(smem) {
    const int total = p.num_units * p.num_heads, stride = static_cast<int>(gridDim.x);
    dynamic = kDynamic && p.item_counter != nullptr;
    count = dynamic ? p.static_items : (total - static_cast<int>(blockIdx.x) + stride - 1) / stride;
  }
  __device__ const Ahead& ahead_of(int k) const { return S.ahead[(k / kWarp) & 1][k % kWarp]; }
  // The copies a prologue item staged after the wait issues (its state came before the wait
  // under the stable-state promise).
  __device__ StageCopies copies_after_wait() const {
    return p.stable_state != 0 ? StageCopies::inputs : StageCopies::all;
  }

  // On one warp: lane l resolves item kWarp * batch + l (metadata, first-chunk beta bits and
  // destinations, A_log); its loads stall this warp only. With `scalars` false the beta bits and
  // destinations are left zero (they wait for the item's rows and slot row: a second round trip)
  // and resolve_scalars fills them in later.
  __device__ void resolve_batch(int batch, bool scalars) const {
    const int lane = threadIdx.x % kWarp;
    const int k = batch * kWarp + lane;
    if (k < count)
      resolve_into(S.ahead[batch & 1][lane],
                   static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x), scalars);
  }
  // Item w's metadata (and with `scalars` its first-chunk beta bits and destinations) into `a`.
  __device__ void resolve_into(Ahead& a_out, int w, bool scalars) const {
    Ahead a;
    a.it = resolve_item(p, w / p.num_heads, w % p.num_heads);
    a.a_log = __ldg(p.a_log + a.it.h);
    const GlobalInputs g(p, a.it);
    const int nt0 = scalars ? first_tokens(a.it) : 0;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      a.dst[t] = t < nt0 ? g.dst_at(t) : 0;
      a.beta[t] = t < nt0 ? g.beta_bits(t) : 0;
    }
    a_out = a;
  }
  // Whether this CTA has an item k; past the static items from item k's `end` flag, which the
  // caller reads after the hand-off that publishes it (the kernel's header) and never past the
  // CTA's first missing item, whose later entries nobody writes (the kernel's `has`).
  __device__ bool exists(int k) const {
    if constexpr (kDynamic)
      return k < count || (dynamic && S.claim.end[(k / kWarp) & 1][k % kWarp] == 0);
    else
      return k < count;
  }
  // Dynamic items: the resolving warp carries each claimed item j over four loop turns, its
  // loads issued at one turn and read at the next (the precompute warps have ~0.3-0.8 us of
  // slack a turn at bf16 T = 1, perf.md run 142, less than one memory round trip under load):
  //   turn j - kClaimLead - 1: lane 0's atomic on the pool (claim_next, or the previous item's
  //     Stage A turn);
  //   turn j - kClaimLead (Stage A): the claim's item w; the pool empty: the entry says `end`,
  //     the CTA claims no more, and its count of CTAs done claiming goes up (its last claim has
  //     returned; the last CTA done resets both counters for the next launch, when no claim is
  //     in flight anywhere). Else each lane issues one of item w's metadata loads (kLoad*)
  //     and lane 0 the next claim's atomic;
  //   turn j - kClaimLead + 1: the metadata from the lanes into S.claim.raw, the entry's item,
  //     A_log, destinations and `end` = 0 (claim_item, resolve_item's arithmetic); lanes
  //     t < first tokens issue token t's beta load (Stage B);
  //   turn j - kClaimLead + 2: the beta bits into the entry: complete.
  // Each lane holds one value a stage across the turn (a_val, b_val): two registers.
  static constexpr int kClaimLead = Smem::kStages + 4;  // Stage A at item j - kClaimLead
  // Lane roles of a Stage A (kLoad*): the unit's first row and the next one's (per-row mode:
  // the row's slot), num_accepted_tokens, A_log's bits, the slot row's entries t.
  static constexpr int kLoadQ0 = 0, kLoadQ1 = 1, kLoadNat = 2, kLoadALog = 3, kLoadRow = 8;
  struct Claims {
    unsigned ticket = 0;                 // lane 0: the claim Stage A reads
    std::uint32_t a_val = 0, b_val = 0;  // this lane's Stage A / Stage B load
    int a_item = -1, b_item = -1;        // the items whose Stage A / B loads are in flight
    bool active = false;                 // claims continue
  };
  __device__ Ahead& entry(int k) const { return S.ahead[(k / kWarp) & 1][k % kWarp]; }
  __device__ int& end_of(int k) const { return S.claim.end[(k / kWarp) & 1][k % kWarp]; }
  __device__ void claim_next(Claims& c) const {
    if (threadIdx.x % kWarp == 0) c.ticket = atomicAdd(p.item_counter, 1u);
    c.active = true;
  }
  // Item (u, h) from the raw metadata of a Stage A: resolve_item's arithmetic on raw[kLoad*]
  // (resolve_item keeps its own loads, ordered for the per-head kernels' latency; the two agree
  // bit for bit in DynamicItemsChainAndGraphReplay, TuneSwitchesBitIdenticalF32 and the per-row
  // modes' test, which compare claimed items with static ones).
  __device__ Item claim_item(int u, int h, const std::uint32_t* raw) const {
    Item it;
    it.u = u;
    it.h = h;
    if (p.row_slots == nullptr) {
      const int q0 = static_cast<int>(raw[kLoadQ0]), q1 = static_cast<int>(raw[kLoadQ1]);
      const int T = p.max_t;
      it.dst_row = p.state_indices + static_cast<std::int64_t>(u) * T;
      it.a = T > 1 ? min(max(static_cast<int>(raw[kLoadNat]) - 1, 0), T - 1) : 0;
      it.cs = static_cast<int>(raw[kLoadRow]);
      it.ss = static_cast<int>(raw[kLoadRow + it.a]);
      it.b = max(q0, 0);
      it.len = min(min(q1, p.num_rows) - q0, T);
    } else {
      it.b = u;
      it.len = 1;
      it.cs = it.ss = static_cast<int>(raw[kLoadQ0]);
    }
    it.live = it.len > 0 && it.cs > 0 && it.ss > 0 && it.cs < p.num_slots && it.ss < p.num_slots;
    return it;
  }
  // The resolving warp's turn at item k (every lane): Stage B of c.b_item, Stage A + 1 of
  // c.a_item, and Stage A of item j = k + kClaimLead.
  __device__ void claim_turn(Claims& c, int j) const {
    const int lane = threadIdx.x % kWarp;
    if (c.b_item >= 0 && lane < kChunk)
      entry(c.b_item).beta[lane] = static_cast<std::uint16_t>(c.b_val);
    c.b_item = -1;
    if (c.a_item >= 0) {
      S.claim.raw[lane] = c.a_val;
      __syncwarp();
      const int w = S.claim.w;
      if (lane == 0) {
        Ahead& e = entry(c.a_item);
        const Item it = claim_item(w / p.num_heads, w % p.num_heads, S.claim.raw);
        const int nt = first_tokens(it);
        e.it = it;
        e.a_log = __uint_as_float(S.claim.raw[kLoadALog]);
#pragma unroll
        for (int t = 0; t < kChunk; ++t)
          e.dst[t] =
              t < nt ? (it.dst_row != nullptr ? static_cast<int>(S.claim.raw[kLoadRow + t]) : it.ss)
                     : 0;
        end_of(c.a_item) = 0;
      }
      __syncwarp();
      const Item it = entry(c.a_item).it;
      c.b_val = lane < first_tokens(it) ? GlobalInputs(p, it).beta_bits(lane) : 0u;
      c.b_item = c.a_item;
      c.a_item = -1;
    }
    if (!c.active) return;
    const long long w =
        static_cast<long long>(count) * gridDim.x + __shfl_sync(0xffffffffu, c.ticket, 0);
    if (w < static_cast<long long>(p.num_units) * p.num_heads) {
      const int wi = static_cast<int>(w), u = wi / p.num_heads, h = wi % p.num_heads;
      const int T = p.max_t;
      std::uint32_t v = 0;
      if (p.row_slots != nullptr) {
        if (lane == kLoadQ0) v = static_cast<std::uint32_t>(p.row_slots[u]);
      } else if (lane == kLoadQ0 || lane == kLoadQ1) {
        v = static_cast<std::uint32_t>(p.qsl[u + lane - kLoadQ0]);
      } else if (lane == kLoadNat) {
        v = T > 1 ? static_cast<std::uint32_t>(p.nat[u]) : 0u;
      } else if (lane >= kLoadRow && lane < kLoadRow + T) {
        v = static_cast<std::uint32_t>(
            p.state_indices[static_cast<std::int64_t>(u) * T + lane - kLoadRow]);
      }
      if (lane == kLoadALog) v = __float_as_uint(__ldg(p.a_log + h));
      c.a_val = v;
      c.a_item = j;
      if (lane == 0) {
        S.claim.w = wi;
        c.ticket = atomicAdd(p.item_counter, 1u);
      }
    } else {
      c.active = false;
      if (lane == 0) {
        end_of(j) = 1;
        if (atomicAdd(p.item_counter + 1, 1u) == gridDim.x - 1) {
          atomicExch(p.item_counter, 0u);
          atomicExch(p.item_counter + 1, 0u);
        }
      }
    }
  }
  // On one warp: the beta bits and destinations of batch 0, into its Ahead entries and, for the
  // prologue's items (k < staged), into their stages too.
  __device__ void resolve_scalars(int staged) const {
    const int k = threadIdx.x % kWarp;
    if (k < count) {
      Ahead& a = S.ahead[0][k];
      // The item in registers: through the reference every token's loads re-read it from shared
      // memory after the previous token's stores (~3 KB of SASS, executed in the prologue).
      const Item it = a.it;
      const GlobalInputs g(p, it);
      const int nt0 = first_tokens(it);
      std::int32_t dst[kChunk];
      std::uint16_t beta[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        dst[t] = t < nt0 ? g.dst_at(t) : 0;
        beta[t] = t < nt0 ? g.beta_bits(t) : 0;
      }
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        a.dst[t] = dst[t];
        a.beta[t] = beta[t];
        if (k < staged) {
          S.stage[k].in.dst[t] = dst[t];
          S.stage[k].in.beta[t] = beta[t];
        }
      }
    }
  }
  // The batch a loop resolves at its item k (0: none): batch nb a batch ahead of its first
  // staging (item kWarp nb - lead_items, with `lead_items` the loop's staging lead).
  __device__ int batch_due(int k, int lead_items) const {
    const int lead = k + lead_items;
    const int nb = k == 0 ? 1 : (lead % kWarp == 0 ? lead / kWarp + 1 : 0);
    return nb > 0 && nb * kWarp < count ? nb : 0;
  }

  // Every thread of the CTA: the stream kernels' prologue. Barriers, batch 0's metadata (warp
  // kResolveWarp), items 0 .. prefill-1 announced, their scalars in their stages and 0 .. early-1
  // staged (by warps 0-7; a staggered prefill copies early .. prefill-1 later (stage_rest), with
  // `scalars` false: a precompute warp reads a stage's scalars once its barrier's phase completes,
  // which orders nothing written beside the copies), then batch 0's beta bits and destinations
  // (their round trip overlaps the copies in flight: the first item's path holds two round trips,
  // metadata and copies, not three). With the stable-state promise (p.stable_state: nothing in
  // flight writes the metadata or a source state slot) the metadata and the source states of items
  // 0 .. prefill-1 are read before the PDL wait, while the predecessor finishes (a back-to-back
  // stream grid: its CTAs with one item fewer exit an item early), and only the inputs' copies
  // follow the wait; items early .. prefill-1 then stage their inputs alone (copies_after_wait()).
  // Without the promise warp kPrefetchWarp prefetches those source states into L2 before the
  // wait (prefetch_ring_before_wait): perf.md runs 265-269, bf16 N = 32 / 128 T <= 4 -1 to -3%,
  // N = 512 to -0.6%, fp32 to -2.4%; under the promise level, but bf16 N = 128 T = 1 +0.7-1.2%.
  template <bool kStage>
  __device__ void prologue(int prefill, int early) const {
    const int tid = threadIdx.x, warp = tid / kWarp;
    const bool stable = p.stable_state != 0;
    if (tid == 0) {
      for (int s = 0; s < Smem::kStages; ++s) mbar_init(&S.full[s]);
    }
    if (!stable) {
      // PDL (launch.cuh's rule): global reads follow the wait, but for the ring's source states'
      // L2 prefetch (prefetch_ring_before_wait) on a warp whose round trip there ends before
      // the resolving warp's after the wait.
      if (warp == kPrefetchWarp) prefetch_ring_before_wait(prefill);
      detail::pdl_prologue();
    }
    if (warp == kResolveWarp) resolve_batch(0, false);
    __syncthreads();
    if (tid == 0) {
      for (int k = 0; k < prefill; ++k)
        announce_item<StateT, kStage, Smem::kTaps, kTokens>(ahead_of(k), &S.full[k]);
    }
    __syncthreads();
    if (stable) {
      for (int k = 0; k < prefill; ++k)
        stage_item<StateT, kStage>(p, ahead_of(k), S.stage[k], &S.full[k], StageCopies::state);
      detail::pdl_prologue();  // the inputs (the predecessor's outputs) and every store follow it
    }
    for (int k = 0; k < prefill; ++k)
      stage_item<StateT, kStage>(p, ahead_of(k), S.stage[k], &S.full[k],
                                 k < early ? copies_after_wait() : StageCopies::none);
    __syncthreads();  // stage_item's (zero) scalars precede resolve_scalars' stores to the stages
    if (warp == kResolveWarp) resolve_scalars(prefill);
    __syncthreads();  // the prologue's scalars (later items': the barriers of the item staging
                      // them)
  }
  // Warps 0-7, once item 0's stage has landed: a staggered prefill's other copies, of items
  // early .. prefill-1 (announced by the prologue, which also wrote their scalars).
  template <bool kStage>
  __device__ void stage_rest(int prefill, int early) const {
    for (int k = early; k < prefill; ++k)
      stage_item<StateT, kStage>(p, ahead_of(k), S.stage[k], &S.full[k], copies_after_wait(),
                                 false);
  }
  // Lane k < prefill of one warp, before the PDL wait without the stable-state promise: an L2
  // prefetch of ring item k's source state, from metadata read there
  // (prefetch_sources_before_wait), so that its copy after the wait reads L2 (its conv history
  // too measured level, perf.md run 270).
  __device__ void prefetch_ring_before_wait(int prefill) const {
    const int k = static_cast<int>(threadIdx.x % kWarp);
    if (k >= prefill || k >= count) return;
    const int w = static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x);
    prefetch_sources_before_wait<StateT>(p, w / p.num_heads, w % p.num_heads, 0, kD, true, false);
  }
  // Lane l < n of one warp: an L2 prefetch (cp.async.bulk.prefetch.L2) of item first + l's source
  // state, for items of batch 0 (resolved by the prologue) only. Nothing waits for it; a later
  // copy of that state then reads L2.
  __device__ void prefetch_states_l2(int first, int n) const {
    const int k = first + static_cast<int>(threadIdx.x % kWarp);
    if (static_cast<int>(threadIdx.x % kWarp) >= n || k >= count || k >= kWarp) return;
    const Item& it = ahead_of(k).it;
    if (it.live) bulk_prefetch_l2(source_state<StateT>(p, it), kD * kD * sizeof(StateT));
  }
};

template <typename StateT, bool kStage>
__global__ void __launch_bounds__(kStreamBlock, 1) kda_decode_stream_kernel(const Params p) {
  using L = Layout<kStreamThreads, 1>;
  using G = Geometry<kStreamThreads, 1, StateT>;
  using Smem = StreamSmem<StateT, false>;
  constexpr int kStages = Smem::kStages;
  static_assert(kStages < kWarp, "a batch outlasts the ring");
  extern __shared__ uint4 smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const StreamItems<StateT, false> items(p, S);
  const int count = items.count;
  auto ahead_of = [&](int k) -> const Ahead& { return items.ahead_of(k); };

  const int prefill = min(kStages, count);
  // Staggered prefill: only item 0's stage now; items 1 .. prefill-1 (announced now) are staged
  // at the top of item 0, once its stage has landed: item 0 waits for 1 / kStages of the ramp
  // (chip wide 132 x 51-85 KB). With 3 stages in the item loop (bf16: 0.5-3% faster up to
  // N = 32, neutral beyond); with 2 (f32) only when the CTA has no item past the ring (N = 8:
  // 1.5-3% faster; N = 32 lost 1-2%: its item 1 then lands a whole item later). Not with an
  // overlap (run 19: the whole ring in the prologue 0.4-5.4% faster at N = 512 .. 32).
  const bool stagger = kStages >= kLookaheadStages || count <= kStages;
  const int early = stagger ? min(1, prefill) : prefill;
  items.template prologue<kStage>(prefill, early);
  const int qn = owned_rows(p);

  // Deferred norm (T = 1: every item has one token): item k's o and output gate go to token
  // slot k % kDeferSlots, and its RMSNorm runs on kDeferNormWarp after item k + 1's first
  // barrier (or after the loop), beside item k + 1's precompute, which writes the other slot.
  // Item k + 2 rewrites slot k % kDeferSlots only after its own first barrier, which that warp
  // reaches after the norm; item k + 1's sweep writes o of its own slot. Measured: f32 0.2-1.8%,
  // bf16 1-3.5% faster at N = 8 .. 512 (v7: warp 0 ran it while 7 warps waited).
  const bool defer_norm = p.max_t == 1;
  // Late copies (T = 1, 3 stages: only under kTuneNoOverlap, the overlap's A/B reference): item
  // k's refill of its stage (the copies of item k + kStages) is issued at the top of item k + 1
  // by warps kLateCopyWarp0.. (no precompute work at T = 1) instead of by all 8 warps between
  // item k's precompute and its sweep: off the item's path, at the cost of half an item of
  // lookahead. Measured with the deferred norm: bf16 -4 to -6% at N >= 32; f32 (2 stages) +2 to
  // +4% at N >= 128, so not there.
  const bool late_copies = p.max_t == 1 && kStages >= kLookaheadStages;
  int late_next = -1;      // the item whose copies wait for the top of the next item
  int pending_slot = -1;   // the deferred norm's first token slot (-1: none)
  int pending_tokens = 0;  // its tokens (slots pending_slot ..; rows pending_row ..)
  std::int64_t pending_row = 0;
  int pending_h = 0;
  // Token t of the pending item on warp kDeferNormWarp + t (T = 1: warp kDeferNormWarp alone).
  auto run_pending_norm = [&] {
    const int t = warp - kDeferNormWarp;
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if ((p.tune & kTuneDevDropNorms) != 0) pending_slot = -1;
#endif
    if (pending_slot >= 0 && t >= 0 && t < pending_tokens) {
      float norm_w[kChannelsPerLane];
#pragma unroll
      for (int e = 0; e < kChannelsPerLane; ++e)
        norm_w[e] = __ldg(p.norm_weight + lane * kChannelsPerLane + e);
      norm_head_token(p, S.sm, pending_slot + t, pending_row + t, pending_h, norm_w);
    }
    pending_slot = -1;
  };

  const G geo;
  // Iteration k = count only runs the last item's deferred norm: one code site for it.
#pragma unroll 1
  for (int k = 0; k <= count; ++k) {
    const bool item_k = k < count;
    const int s = k % kStages;
    Stage<StateT, Smem::kTaps>& st = S.stage[s];
    const int next = k + kStages;  // the item that reuses stage s
    const bool has_next = next < count;
    Item it{};
    if (item_k) {
      mbar_wait_warp(&S.full[s], static_cast<std::uint32_t>(k / kStages) & 1u);
      it = st.in.item;
      // Every thread has `it` and is past the wait; the previous item's write-back has read
      // S.sm.x.
      cta_sync<kStreamThreads>();
      if (tid == 0 && has_next)
        announce_item<StateT, kStage, Smem::kTaps>(ahead_of(next), &S.full[s]);
      if (k == 0) items.template stage_rest<kStage>(prefill, early);  // staggered prefill
      if (late_next >= 0) {  // late copies: item k - 1's refill, on warps 5 .. 7
        const int ls = late_next % kStages;
        stage_item<StateT, kStage, kLateCopyWarp0, kLateCopyWarps>(p, ahead_of(late_next),
                                                                   S.stage[ls], &S.full[ls]);
        late_next = -1;
      }
      // Batch nb is resolved a batch ahead of its first staging (item 32 nb - kStages; one item
      // later with late copies, whose last staging of batch nb - 2 reads its Ahead entries at
      // the top of item 32 (nb - 1) - kStages).
      if (warp == kResolveWarp) {
        const int nb = items.batch_due(k, kStages - (late_copies ? 1 : 0));
        if (nb > 0) items.resolve_batch(nb, true);
      }
    }
    run_pending_norm();
    if (!item_k) break;
    zero_unowned<kStreamThreads, kD>(p, it, 0, qn);
    if (!it.live) {
      cta_sync<kStreamThreads>();  // the announcement precedes the copies
      if (has_next) stage_item<StateT, kStage>(p, ahead_of(next), st, &S.full[s]);
      continue;
    }
    auto load_state = [&](float(&sv)[L::kRowsPerThread][L::kCols]) {
      load_stage_state(st, geo, sv);
    };
    // After run_item's first barrier no thread reads the stage: refill it (late copies: at
    // the top of item k + 1, by warps with no precompute work at T = 1).
    auto release = [&] {
      if (!has_next) return;
      if (late_copies)
        late_next = next;
      else
        stage_item<StateT, kStage>(p, ahead_of(next), st, &S.full[s]);
    };
    const int defer_slot = defer_norm ? k % kDeferSlots : -1;
    if constexpr (kStage) {
      run_item<kStreamThreads, 1, StateT, true, SweepPasses::kTwo>(
          p, S.sm, it, 0, StagedInputs<>{&st.in, &st.taps}, load_state, release, defer_slot);
    } else {
      run_item<kStreamThreads, 1, StateT, true, SweepPasses::kTwo>(
          p, S.sm, it, 0, GlobalInputs(p, it), load_state, release, defer_slot);
    }
    if (defer_norm) {
      pending_slot = defer_slot;
      pending_tokens = 1;
      pending_row = it.b;
      pending_h = it.h;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// `stream` with a precompute warp group (bf16 state, T <= kOverlapMaxT = 8; fp32 T = 1 in the
// one-token form's 3 stages, and T <= 8 with >= 16 items a CTA in 2 stages; the launcher's pick
// there unless kTuneNoOverlap): the ring, items and arithmetic of kda_decode_stream_kernel on 12
// warps in two roles, so that an item's precompute and the previous item's RMSNorms run beside a
// sweep instead of before it (perf.md runs 123-128).
//   Sweep warps 0-7 (the state in registers, Layout<256, 1>), per item k: state and old
//     history from stage k % kStages into registers once it has landed, and the wait until
//     item k is precomputed (mbarrier S.precomputed[k & 1]; the precompute warps also read the
//     stage; T = 1 waits first, T > 1 loads first) -> barrier X over the sweep warps (the stage
//     is no longer read)
//     -> thread 0 announces item k + kStages on the stage's mbarrier, the refill's bulk copies
//     over the 8 warps -> write-back and the sweep of item k's tokens (o into its token slots,
//     checkpoints) -> arrive at S.swept[k & 1].
//   Precompute warps 8-11 (kind = warp - 8: q, k, gate, v), per item k: item k + 1's precompute
//     of its kind for every token, from its stage into its token slots -> arrive at
//     S.precomputed[(k + 1) & 1] -> a metadata batch when due (kind kWsResolveKind) ->
//     wait at S.swept[k & 1] -> item k's RMSNorms (token t on kind t % 4; T = 1 on the gate
//     kind, the shortest precompute) -> arrive at S.normed, wait there (phase k).
//   The stages hold no conv taps or dt_bias: each precompute warp loads its kind's share of
//   them into registers (HeadTaps) two items ahead, from device memory, where every item of a
//   head finds them in L2. That is 13 fewer bulk copies an item, and a bulk copy's issue holds
//   its warp ~300 cycles whatever its size (stamps, perf.md runs 123-127). Read at each use
//   instead, the loads made the precompute late (T = 4 849 us, run 127).
//   The refill stays on the sweep warps: on the precompute warps (behind a release barrier) it
//   made the precompute late (T = 1 370.8 against 319.6 us, run 124).
//   Token slots rotate over 2 items (item k's from base(k) = (k % 2) T): item k + 1's
//   precompute writes the slots of item k - 1, whose sweep precedes it (S.swept of k - 1) and
//   whose norms precede it (S.normed of k - 1, which every precompute warp passes first).
//   Each hand-off alternates between two mbarriers (k & 1; item k is phase k >> 1 of its
//   barrier), so that no barrier runs a phase ahead of its waiters: the precompute warps arrive
//   for item k + 2 only after passing S.swept of k, which the sweep warps arrive at after passing
//   S.precomputed of k. Every thread's arrival is a release and the wait an acquire, so the
//   arriving threads' earlier memory accesses precede the waiting threads' later ones; each warp
//   converges (__syncwarp) after a wait, because its lanes may leave the try_wait loop at
//   different turns and the aligned barrier X and full-warp shuffles after it need the whole
//   warp. The only named barrier left is X, over the sweep warps alone. racecheck models these
//   hand-offs (0 hazards on one CTA walking 24 items, fp32 and bf16, T = 1 and 2: perf.md run
//   160); it does not model named-barrier hand-offs between warp groups, which this kernel used
//   before (dev/racecheck_handoff modes 3 and 6, runs 150-151).
//   Metadata batch nb (resolved at item k with k + kStages = kWarp (nb - 1)) overwrites batch
//   nb - 2, whose last reader staged item k - 1 + kStages during the sweep warps' item k - 1,
//   before their S.swept of k - 1, which the resolving warp has passed.
//   Dynamic items (fp32 only, Params::item_counter; the launcher's rule: >= kStages + 6 items
//   a CTA): the CTAs' item rates differ (fp32 N = 128 T = 1: item periods 3.1-4.4 us, perf.md
//   run 174), so each CTA walks only the first quarter of its share statically (items k < count)
//   and claims the rest from the pool w >= count * gridDim.x, one item per loop turn
//   (StreamItems::Claims). At its item k, after its S.precomputed of k + 1, the resolving warp
//   takes the claim of item j = k + kStages + 4 (`end` in its entry when the pool is empty,
//   after which it claims no more), writes item j - 1's item and `end` = 0 and item j - 2's beta
//   bits: entry j is whole at turn j - kStages - 2, and that turn's next S.precomputed
//   (j - kStages) publishes it to the sweep warps, which stage item j at their item j - kStages
//   and test its existence there and at item j; the precompute warps test it at items >= j - 2,
//   past S.normed of the turn that wrote `end`. Past the first missing item no entry is read
//   (`has`). The entry's slot is rewritten only by item j + 64's claim, 60-odd items later.
//   Batches cover only the static items, so they never write a claimed entry.
//   Why 12 warps fit (the 8-warp kernel's header says why it has no producer warp): the sweep
//   warps hold no precompute values beside the state, so each role's registers are its own
//   path's: ~130-146 registers without spills, under the 168 that three warps a sub-partition
//   leave.
constexpr int kWsPrecomputeWarps = kKindsPerToken;                     // warps 8 .. 11
constexpr int kWsBlock = kStreamThreads + kWsPrecomputeWarps * kWarp;  // 384 threads
constexpr int kWsT1NormKind = 2;   // T = 1: the norm on the gate warp
constexpr int kWsResolveKind = 1;  // metadata batches on the k warp

// The hand-offs (S.precomputed, S.swept, S.normed): every thread arrives (release, CTA scope); a
// wait (acquire) ends with the warp converged.
__device__ __forceinline__ void handoff_arrive(std::uint64_t* bar) { mbar_arrive(bar); }
__device__ __forceinline__ void handoff_wait(std::uint64_t* bar, int k) {
  mbar_wait_warp(bar, static_cast<std::uint32_t>(k >> 1) & 1u);
}

// kTokens == 1: the one-token form (launches with max_t == 1 only): stages of one staged token
// and two token slots, small enough for fp32's ring of kLookaheadStages stages.
template <typename StateT, bool kStage, int kTokens = kChunk>
__global__ void __launch_bounds__(kWsBlock, 1) kda_decode_stream_ws_kernel(const Params p) {
  using L = Layout<kStreamThreads, 1>;
  using G = Geometry<kStreamThreads, 1, StateT>;
  using Smem = StreamSmem<StateT, true, kTokens>;
  using In = typename Smem::In;
  constexpr int kStages = Smem::kStages;
  static_assert(kStages >= 2 && kStages < kWarp, "the ring of the overlap");
  extern __shared__ uint4 smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  using Items = StreamItems<StateT, true, kTokens>;
  const Items items(p, S);
  const int count = items.count;
  if (tid == 0) {
    mbar_init<2>(S.precomputed, kWsPrecomputeWarps * kWarp);
    mbar_init<2>(S.swept, kStreamThreads);
    mbar_init(&S.normed, kWsPrecomputeWarps * kWarp);
  }
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  long long* tl = nullptr;
  if (tid == 0) {
    const long long now = global_ns();
    tl = timeline_row(0);
    if (tl != nullptr) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      tl[kTlEntry] = now;
      tl[kTlSm] = sm;
    }
  }
#endif
  // Staggered prefill (all but bf16 T = 1): the prologue copies item 0 alone and the sweep warps
  // copy items 1 .. prefill-1 once item 0's stage has landed, so item 0 lands after its own
  // copies instead of the whole ring's. perf.md runs 180-182: fp32 T = 1 -1.2 / -0.7% at N = 32
  // / 128, bf16 T = 2 -4.3 / -1.4%, T = 8 -3.4 / -1.2%, fp32 T > 1 -0.5% at N = 128, level at
  // N = 512; bf16 T = 1 level to +2.8%: there item 0 lands ~4 us sooner but its precompute
  // waits beside the ring's other copies and its state reaches registers no sooner (run 184).
  const int prefill = min(kStages, count);
  const bool stagger = std::is_same_v<StateT, float> || p.max_t > 1;
  const int early = stagger ? min(1, prefill) : prefill;
  items.template prologue<kStage>(prefill, early);
  // fp32 under the stable-state promise: the states of the two items after the ring (128 KB a
  // CTA, 17 MB chip wide) prefetched into L2 by the first precompute warp. The promised prologue
  // copied the ring's states before the PDL wait, so after it the memory system carries only the
  // inputs' copies; the prefetch fills that gap and the items' later copies read L2. perf.md run
  // 186: fp32 under the promise -0.8% at N = 128 T = 1 (-0.2 to -1.2% at N = 32 .. 512, T <= 2);
  // without the promise (item 0's copies then compete with it) +0.1 to +4.7%, and at bf16 +0.6
  // to +3.9% either way, so only here (bf16 T = 1 prefetches one item later: after item 0's
  // precompute, below).
  if constexpr (std::is_same_v<StateT, float>) {
    constexpr int kRampPrefetchItems = (128 << 10) / (kD * kD * sizeof(StateT));
    if (p.stable_state != 0 && warp == kStreamWarps)
      items.prefetch_states_l2(prefill, kRampPrefetchItems);
  }
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  if (tl != nullptr) tl[kTlPrologue] = global_ns();
#endif

  // kOne (T = 1, a compile-time constant there): one token an item (runtime token loops cost
  // bf16 T = 1 ~7% in the 8-warp overlap, perf.md run 103).
  static_assert(kOverlapMaxT <= kChunk && kOverlapItems == 2, "token slots");
  const auto run = [&](auto one_token) {
    constexpr bool kOne = decltype(one_token)::value;
    const auto tokens = [&](const Item& it) { return kOne ? 1 : it.len; };
    const auto base = [&](int k) {
      return kOne ? k % kOverlapItems : (k % kOverlapItems) * p.max_t;
    };
    // Whether this CTA has item x (StreamItems::exists). Every thread asks in increasing order
    // of x within each of its sequences, and no sequence skips an item, so the first missing
    // item is met before any later one, whose entry nobody writes.
    [[maybe_unused]] int first_missing = INT_MAX;
    const auto has = [&](int x) {
      if constexpr (!Items::kDynamic) {
        return x < count;
      } else {
        if (x >= first_missing) return false;
        if (items.exists(x)) return true;
        first_missing = x;
        return false;
      }
    };
    if (warp < kStreamWarps) {  // sweep warps
      const int qn = owned_rows(p);
      const G geo;
#pragma unroll 1
      for (int k = 0; has(k); ++k) {
        const int s = k % kStages;
        Stage<StateT, Smem::kTaps, kTokens>& st = S.stage[s];
        SPLICE_KDA_STAMP(k, 0);
        if (k == 0 && early < prefill) {  // staggered prefill, once item 0's stage has landed
          mbar_wait_warp(&S.full[0], 0u);
          items.template stage_rest<kStage>(prefill, early);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
          if (tl != nullptr) tl[kTlRingIssued] = global_ns();
#endif
        }
        // T > 1: the state into registers as soon as the stage has landed, while the precompute
        // warps may still work on item k (item 0 of a launch always), then the wait for them
        // (perf.md runs 254-255: bf16 T = 2 / 4 -0.3 to -0.9%). T = 1 waits for the precompute
        // first: there the precompute paces the loop, and the state's shared-memory reads beside
        // it cost fp32 5-6% and bf16 N = 512 1.3%.
        const auto wait_precomputed = [&] { handoff_wait(&S.precomputed[k & 1], k); };
        if constexpr (kOne) wait_precomputed();
        mbar_wait_warp(&S.full[s], static_cast<std::uint32_t>(k / kStages) & 1u);
        SPLICE_KDA_STAMP(k, 1);
        const Item it = st.in.item;
        float sv[L::kRowsPerThread][L::kCols];
        if (it.live) load_stage_state(st, geo, sv);
        const ConvWriteback<kStreamThreads, 1> wb = [&] {
          if constexpr (kStage)
            return ConvWriteback<kStreamThreads, 1>(p, it, 0, StagedInputs<In>{&st.in}, it.live);
          else
            return ConvWriteback<kStreamThreads, 1>(p, it, 0, GlobalInputs(p, it), it.live);
        }();
        const int next = k + kStages;  // the item that reuses stage s
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
        if (tl != nullptr && k < kTimelineItems) tl[kTlReady + k] = global_ns();
#endif
        if constexpr (!kOne) wait_precomputed();
        SPLICE_KDA_STAMP(k, 2);
        // X: stage s is no longer read, and every sweep thread is past its wait for item k on
        // S.full[s]. Only then is item k + kStages announced there: a null item's announcement
        // completes its phase at once, and a warp still to test item k's parity would then see
        // the phase after it and wait forever (perf.md run 159: the hand-off above releases the
        // sweep warps one by one, so one can be that late). The copies other warps issue right
        // after X may land before the announcement's expect_tx: the tx-count is signed, and the
        // phase waits for the announcement's arrival.
        cta_sync<kStreamThreads>();
        const bool has_next = has(next);
        if (tid == 0 && has_next)
          announce_item<StateT, kStage, Smem::kTaps, kTokens>(items.ahead_of(next), &S.full[s]);
        SPLICE_KDA_STAMP(k, 3);
        if (has_next) stage_item<StateT, kStage>(p, items.ahead_of(next), st, &S.full[s]);
        SPLICE_KDA_STAMP(k, 4);
        zero_unowned<kStreamThreads, kD>(p, it, 0, qn);
        if (it.live) {
          const int len = tokens(it), slot = base(k);
          wb.store(p, S.sm, 0, 0, len, slot);
#pragma unroll 1
          for (int t = 0; t < len; ++t)
            sweep_token<kStreamThreads, 1, StateT, true, SweepPasses::kTwo>(p, S.sm, sv, slot + t,
                                                                            0, it.h);
        }
        SPLICE_KDA_STAMP(k, 5);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
        if (tl != nullptr && k < kTimelineItems) tl[kTlSwept + k] = global_ns();
#endif
        handoff_arrive(&S.swept[k & 1]);
        SPLICE_KDA_STAMP(k, 6);
      }
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
      if (tl != nullptr) {
        tl[kTlSweepExit] = global_ns();
        int n = 0;
        while (has(n)) ++n;
        tl[kTlCount] = n;
      }
#endif
      return;
    }
    // Precompute warps.
    const int kind = warp - kStreamWarps;
    const int lane = tid % kWarp;
    // Item k's precompute of this warp's kind; `taps`: its head's (kStage).
    const auto precompute_of = [&](int k, const HeadTaps& taps) {
      const int sk = k % kStages;
      mbar_wait_warp(&S.full[sk], static_cast<std::uint32_t>(k / kStages) & 1u);
      const Item itk = S.stage[sk].in.item;
      if (itk.live) {
        if constexpr (kStage) {
          precompute_tokens(p, S.sm, 0, 0, tokens(itk),
                            StagedInputsRegisterTaps<In>{{&S.stage[sk].in}, taps}, base(k), kind,
                            kKindsPerToken);
        } else {
          precompute_tokens(p, S.sm, 0, 0, tokens(itk), GlobalInputs(p, itk), base(k), kind,
                            kKindsPerToken);
        }
      }
      return itk;
    };
    float norm_w[kChannelsPerLane];
#pragma unroll
    for (int e = 0; e < kChannelsPerLane; ++e)
      norm_w[e] = __ldg(p.norm_weight + lane * kChannelsPerLane + e);
    const int norm_token = kind - (kOne ? kWsT1NormKind : 0);  // this warp's token of a norm
    // The taps of item k's head, loaded during item k - 2 (their latency beside the wait for a
    // sweep). Item k's scalars are in its stage from the sweep warps' item k - kStages on,
    // before their S.swept of k - kStages, which these warps have passed.
    HeadTaps taps;
    const auto load_taps = [&](int k) {
      if constexpr (kStage) {
        const Item& itk = S.stage[k % kStages].in.item;
        if (itk.live) taps.load(p, itk.h, kind);
      }
    };
    load_taps(0);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    long long* tl_norm = lane == 0 && kind == kWsT1NormKind ? timeline_row(1) : nullptr;
    mbar_wait_warp(&S.full[0], 0u);  // (precompute_of's own wait then passes at once)
    if (tl_norm != nullptr) tl_norm[kTlLanded0] = global_ns();
#endif
    Item cur = precompute_of(0, taps);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if (tl_norm != nullptr) tl_norm[kTlPrecomputed0] = global_ns();
#endif
    handoff_arrive(&S.precomputed[0]);
    // bf16 T = 1: the unstaggered ring has landed with item 0, and until item 0's sweep issues
    // the refill of its stage the memory system carries only checkpoints (perf.md run 256: ~1.2
    // us); that refill's state (the item after the ring) is prefetched into L2 meanwhile. Runs
    // 261-263: -1% at N = 32, -0.4 to -0.9% at N = 64, level to -0.5% at N = 128 / 512; two items
    // were no better.
    if (!std::is_same_v<StateT, float> && kOne && kind == 0) items.prefetch_states_l2(prefill, 1);
    if (has(1)) load_taps(1);
    // Dynamic items: the resolving warp's claim turn at its item k, after the hand-off of item
    // k + 1 (StreamItems::Claims).
    [[maybe_unused]] const bool claims = Items::kDynamic && items.dynamic && kind == kWsResolveKind;
    [[maybe_unused]] typename Items::Claims claim;
#pragma unroll 1
    for (int k = 0; has(k); ++k) {
      SPLICE_KDA_STAMP(k, 0);
      Item nxt{};
      if (has(k + 1)) {
        nxt = precompute_of(k + 1, taps);
        handoff_arrive(&S.precomputed[(k + 1) & 1]);
      }
      // (3 stages: item k + 2 was staged during the sweep warps' item k - 1.)
      if (kStages >= 3 && has(k + 2)) load_taps(k + 2);
      SPLICE_KDA_STAMP(k, 1);
      SPLICE_KDA_STAMP(k, 2);
      if (kind == kWsResolveKind) {  // batch nb a batch ahead of its first staging
        const int nb = items.batch_due(k, kStages);
        if (nb > 0) items.resolve_batch(nb, true);
      }
      if constexpr (Items::kDynamic) {
        if (claims) {
          const int j = k + items.kClaimLead;  // this turn's Stage A
          if (j >= count)
            items.claim_turn(claim, j);
          else if (j + 1 == count)
            items.claim_next(claim);  // the first claim, a turn before its Stage A
        }
      }
      SPLICE_KDA_STAMP(k, 3);
      handoff_wait(&S.swept[k & 1], k);
      // (2 stages: item k + 2 is staged during the sweep warps' item k, before its S.swept.)
      if (kStages < 3 && has(k + 2)) load_taps(k + 2);
      SPLICE_KDA_STAMP(k, 4);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
      if ((p.tune & kTuneDevDropNorms) != 0) cur.live = 0;
#endif
      if (cur.live && norm_token >= 0) {
        for (int t = norm_token; t < tokens(cur); t += kWsPrecomputeWarps)
          norm_head_token(p, S.sm, base(k) + t, cur.b + t, cur.h, norm_w);
      }
      // Item k's norms precede item k + 2's precompute into their slots.
      handoff_arrive(&S.normed);
      mbar_wait_warp(&S.normed, static_cast<std::uint32_t>(k) & 1u);
      SPLICE_KDA_STAMP(k, 5);
      SPLICE_KDA_STAMP(k, 6);
      cur = nxt;
    }
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if (tl_norm != nullptr) tl_norm[kTlNormExit] = global_ns();
#endif
  };
  if constexpr (kTokens == 1)
    run(std::true_type{});
  else if (p.max_t == 1)
    run(std::true_type{});
  else
    run(std::false_type{});
}

}  // namespace splice::cuda::kda
