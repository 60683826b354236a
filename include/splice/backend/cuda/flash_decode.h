// splice/backend/cuda/flash_decode.h: the CUDA flash-decode attention kernel (spec
// decode_attention.md §5), its split plan and its launcher.
//
// Called by splice::decode_attention after argument validation. All tensors are device tensors:
//   q      [batch, num_qo_heads, q_len, head_dim]       bf16 / f16 (row strides multiples of 8)
//   k, v   [batch, num_kv_heads, capacity, head_dim]    q's dtype, 16-byte aligned rows
//   k_len  [batch] or [1] int32 in device memory: the live prefix per sequence (or for all)
//   alibi  optional [num_qo_heads] f32 slopes (device)
//   out    [batch, num_qo_heads, q_len, head_dim]       q's dtype
//   lse    optional [batch, num_qo_heads, q_len] f32 (natural log; -inf for rows with no key)
//
// Work decomposition (the plan): one CTA per (row block, KV split, batch x kv head). A row block
// packs 16 query rows of one GQA group (row = g * q_len + i for group member g, query i), so a
// CTA reads its K/V rows once for all of them. The grid's split dimension is sized by the host at
// a length bound (the capacity when a CUDA graph is captured); the kernel reads k_len from device
// memory, re-plans the live split count on the device with the same rule, and CTAs past the live
// split count exit at once. Nothing on the launch path reads device memory back to the host, so a
// captured launch replays correctly for any k_len <= the bound. In a one-wave grid with no left
// window, split 0 (whose first key is 0 at every k_len) issues one ring stage, the first 16-key
// tile of each warp, before k_len arrives; everything else waits for the plan. The launcher
// launches with PDL when cuda::pdl_enabled() (and a created stream).
#pragma once

#include <algorithm>
#include <cstdint>

#include "splice/core/tensor.h"
#include "splice/ops/decode_attention.h"

struct CUstream_st;

namespace splice::cuda {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr is the legacy default stream

// Keys per warp tile and per-CTA layout constants shared by the planner and the kernel.
inline constexpr int kFlashDecodeRowsPerCta = 16;    // one m16 tensor-core tile of query rows
inline constexpr int kFlashDecodeTileKeys = 16;      // keys a warp consumes per step
inline constexpr int kFlashDecodeWarps = 4;          // warps per CTA, each its own key stream
inline constexpr int kFlashDecodeWideWarps = 8;      // warps per CTA of the plan's wide CTAs
inline constexpr int kFlashDecodeWideMinKeys = 256;  // fewest keys per split the wide rule takes
inline constexpr int kFlashDecodeMinChunk = 64;      // fewest keys per split (one tile per warp)
inline constexpr int kFlashDecodeMaxSplits = 256;    // most splits (forced ones included)
// Most splits of a cluster merge (a unit's splits in one thread-block cluster; 16 is the largest
// cluster Hopper allows, with the non-portable size attribute).
inline constexpr int kFlashDecodeMaxClusterSplits = 16;
// Splits of the cluster rule's 8-warp plans for long ranges (a cluster of 8 one-per-SM CTAs),
// taken from this length bound on (docs/perf.md runs 66-79 and 92: from 4K on once the grid
// lets the next kernel launch only at exit).
inline constexpr int kFlashDecodeWideClusterSplits = 8;
inline constexpr std::int64_t kFlashDecodeWideClusterMinKeys = 4096;
// At head_dim 64 the same plan (triggering right after the wait) wins only up to this bound
// (docs/perf.md run 95: 4K 6.15 -> 5.33 us, 8K 8.21 -> 7.75; 16K 12.11 -> 12.84 lost).
inline constexpr std::int64_t kFlashDecodeWideClusterMaxKeysD64 = 8192;
// Its head_dim 128 grids trigger once split 0 holds every partial up to this bound, at exit
// beyond it (FlashDecodeTrigger; docs/perf.md run 100: at 64K the earlier trigger straggled in
// four processes of five, +6 us).
inline constexpr std::int64_t kFlashDecodeMergeTriggerMaxKeys = 16384;
inline constexpr int kFlashDecodeElementBytes = 2;  // bf16 / f16
// A live range of at most this many K+V bytes runs as one split: one CTA streams it (about one
// DRAM latency plus ~1.3 us at ~100 GB/s per SM) in less time than a split merge costs (partial
// store + fence, counter atomic, partial loads: three dependent L2 round trips, plus the
// k_len round trip that splits >= 1 cannot hide), so a merge would only add latency.
// 512 keys at head_dim 64, 256 at 128, 128 at 256.
inline constexpr std::int64_t kFlashDecodeSingleSplitBytes = std::int64_t{128} << 10;
// The tail split of a multi-wave one-split grid (plan_flash_decode): the units past its last
// full wave stream in this many splits (global merge), so the last wave ends in quarter-size
// pieces instead of whole units started ~one unit's time apart (docs/perf.md runs 210-212).
inline constexpr int kFlashDecodeTailSplits = 4;
// ... for units of at least this many K+V bytes (a 4K-key bound at head_dim 128; at 1K keys, 1 MiB
// a unit, it was level or up to 1% slower, docs/perf.md run 212).
inline constexpr std::int64_t kFlashDecodeTailMinUnitBytes = std::int64_t{2} << 20;
// The late splits of a one-wave grid that leaves at least 1/16 of its CTA slots idle
// (plan_flash_decode): every unit's last L pieces of ceil(n / 2^kFlashDecodeLateShift) keys
// (rounded up to whole tiles) run as CTAs dispatched after every unit's first split, so the idle
// slots and the SMs that finish their unit early stream them, for units of at least
// kFlashDecodeLateMinUnitBytes of K+V at the bound. Split 0 keeps the largest whole number of
// pieces not above units / slots of its unit (it ends no later than an evenly shared grid would):
// L = 2^kFlashDecodeLateShift - that number, at least kFlashDecodeLateSplits. docs/perf.md runs
// 217-226: 7-18% faster than one split or the 2- and 3-split plans at 72-192 units of (B, 32, 8)
// at 16K-64K keys; run 228: a split 0 of about units / slots (the rule before, in 32nds)
// straggles, and the floor of it in 16ths is 0.5-1.5% faster at 144-192 units (192 units at
// 32K: 733.7 -> 722.7 us), level at 72-120 and 216-240.
inline constexpr int kFlashDecodeLateSplits = 4;
inline constexpr int kFlashDecodeLateShift = 4;
inline constexpr std::int64_t kFlashDecodeLateMinUnitBytes = std::int64_t{8} << 20;
// A one-split grid that leaves 1 to slots / 16 - 1 slots idle, of units of at least this many K+V
// bytes: each unit's last kFlashDecodeLateFewIdlePieces pieces halve in size, n / 16, n / 32, ..
// (FlashDecodePlan::late_halving; 12% of the unit), dispatched largest first, so the idle slots
// and the SMs that finish first take the large ones and the slots that free last the smallest.
// docs/perf.md run 233, 256 units in 264 slots: one piece of n / 16 was 0.2-0.55% faster than
// none at 64K keys (32 MiB units) on an H200, 16K (8 MiB) 1-1.5% slower; runs 398-401 (H100s):
// 24 SMs stream ~30% faster than the rest, take every n / 16 piece by ~85% of the call and idle
// after, and where the last pieces land on slow SMs one piece costs 1.1-1.3% against none while
// five halving pieces are level with none or 0.3% faster (run 401).
inline constexpr std::int64_t kFlashDecodeLateFewIdleMinUnitBytes = std::int64_t{32} << 20;
inline constexpr int kFlashDecodeLateFewIdlePieces = 5;
// Halving pieces: c, c / 2, .. c / 2^(L - 1) with c a multiple of 16 * 2^(L - 1) keys; at most
// this many (the smallest piece a whole tile, c within an int).
inline constexpr int kFlashDecodeLateHalvingMaxPieces = 12;

// Where a flash-decode CTA lets the next kernel in the stream launch (PDL's trigger).
enum class FlashDecodeTrigger : std::uint8_t {
  after_wait = 0,           // right after its PDL wait (every plan but the ones below)
  at_exit = 1,              // cluster-merge instances: at exit
  merge_inputs_landed = 2,  // cluster-merge instances: a peer at exit, right after it sends
                            // its partial; split 0 once every partial has landed, before its
                            // fold and output store (docs/perf.md run 98)
};

struct FlashDecodePlan {
  int row_blocks = 1;             // ceil(group * q_len / 16)
  int num_splits = 1;             // the grid's split dimension (an upper bound on live splits)
  int ctas_per_sm = 2;            // resident CTAs per SM the split rule assumes
  int warps = kFlashDecodeWarps;  // warps per CTA: kFlashDecodeWarps or kFlashDecodeWideWarps
  int min_chunk = kFlashDecodeMinChunk;
  int single_split_keys = 0;        // live ranges of at most this many keys run as one split
  std::int64_t grid_x = 1;          // row_blocks
  std::int64_t grid_y = 1;          // num_splits
  std::int64_t grid_z = 1;          // batch * num_kv_heads
  std::size_t workspace_bytes = 0;  // fp32 partials + per-row lse + merge counters
  // CTAs per thread-block cluster along the split axis: num_splits when a unit's splits merge
  // through distributed shared memory into split 0 (no global round trip), else 1 (the global
  // merge: partial stores, a fence, a counter atomic, partial loads). The launcher keeps the
  // global merge where the device cannot hold every cluster of the grid at once.
  int cluster = 1;
  // When the grid lets the next kernel in the stream launch (FlashDecodeTrigger). The 8-split
  // head_dim 128 cluster plans use merge_inputs_landed up to kFlashDecodeMergeTriggerMaxKeys,
  // at_exit beyond: launched right after the wait, the next grid's clusters took the GPC slices
  // this grid left free and one of them waited for a whole free slice (a straggler cluster,
  // +2-5 us per call back to back, docs/perf.md run 77).
  FlashDecodeTrigger trigger = FlashDecodeTrigger::after_wait;
  // The tail split: units (b, h) = grid z below this stream in one split whatever num_splits
  // says (their other splits' CTAs exit at once); the rest split as planned. 0: every unit.
  std::int64_t split_from_bh = 0;
  // The late splits (num_splits 1): each unit's keys [0, n - late_splits c) in its split 0 and
  // late_splits more splits of c = round_up(ceil(n / 2^late_shift), 16) keys each, launched as
  // grid (row_blocks, batch * num_kv_heads, 1 + late_splits) so that every unit's split 0
  // dispatches first. 0: none.
  int late_splits = 0;
  int late_shift = 0;
  // The late pieces halve in size instead (flash_decode_late_pieces): c, c / 2, .. c / 2^(L - 1)
  // with c = ceil(n / 2^late_shift) rounded up to a multiple of 16 * 2^(L - 1) keys, each after
  // the one before, the largest dispatched first. late_splits <= kFlashDecodeLateHalvingMaxPieces.
  bool late_halving = false;
};

// The late pieces of a unit of n visible keys under `late_splits` pieces of n / 2^late_shift,
// equal or halving: the first (largest) piece's keys c and all pieces' keys. Piece i (from 0)
// starts i c (equal) or 2 c - 2 (c >> i) (halving) keys into the late region, the unit's last
// late_keys keys, and holds c or c >> i keys. The kernel's stage 2 computes the same on the device
// (flash_decode_kernel.cuh); flash_decode_live_splits counts with it.
struct FlashDecodeLatePieces {
  std::int64_t chunk;      // the first (largest) piece's keys
  std::int64_t late_keys;  // every piece's keys
};
inline FlashDecodeLatePieces flash_decode_late_pieces(std::int64_t n, int late_splits,
                                                      int late_shift, bool halving) {
  const std::int64_t unit = std::int64_t{kFlashDecodeTileKeys} << (halving ? late_splits - 1 : 0);
  const std::int64_t piece = (n + (std::int64_t{1} << late_shift) - 1) >> late_shift;
  const std::int64_t chunk = std::max<std::int64_t>((piece + unit - 1) / unit * unit, unit);
  return {chunk, halving ? 2 * chunk - (chunk >> (late_splits - 1)) : late_splits * chunk};
}

// Plans the grid for a length bound `max_live_k_len` (<= capacity; pass the capacity when
// capturing a graph that must serve every k_len). Width: wide CTAs (kFlashDecodeWideWarps warps,
// one per SM) when head_dim <= 128, units = batch * num_kv_heads * row_blocks <= sm_count / 4
// and the bound splits into wide splits of >= kFlashDecodeWideMinKeys keys (the long-context
// small-batch grids: half the splits for the same bytes in flight, half the partials to merge;
// 0.82-0.95 of the 4-warp time from 4K keys at B = 1, docs/perf.md run 42), else
// kFlashDecodeWarps (wide CTAs lost 0.3-0.4 us where a CTA holds few tiles, and in the model's
// single-split step); `warps` = 4 or 8 forces the width (8 only at head_dim <= 128). ctas_per_sm
// is what that CTA's shared memory allows. With
//   single_split_keys = kFlashDecodeSingleSplitBytes / (2 * head_dim * 2),
// one split when max_live_k_len <= single_split_keys, else fill one wave of resident CTAs,
//   num_splits = clamp(floor(sm_count * ctas_per_sm / (batch * num_kv_heads * row_blocks)),
//                      1, min(ceil(max_live_k_len / min_chunk), 256)),
// and on the device, for the live visible range of n keys: one split when
// n <= single_split_keys, else (one-wave grids without a left window or forced count: the head
// plan, flash_decode_kernel.cuh stage 2) every split first streams a head of 16 * warps keys,
// [16 W s, 16 W (s + 1)), which it can issue before k_len lands, and the keys past the
// num_splits heads in contiguous chunks; otherwise
//   chunk = max(min_chunk, round_up(ceil(n / num_splits), 16)), live splits = ceil(n / chunk).
// The cluster rule (`cluster_merge` -1, widths not forced, a split plan; docs/perf.md runs 59-79):
//   - 4-warp plans of at most sm_count / 4 units cap the splits at min(16, sm_count / 2 / units)
//     (half the SMs' worth of CTAs: a cluster's CTAs never share an SM);
//   - 8-warp plans (the wide rule's long ranges) of 3 sm_count / 64 <= units <= sm_count / 16
//     and a bound >= kFlashDecodeWideClusterMinKeys cap them at kFlashDecodeWideClusterSplits
//     at head_dim 128, whose CTAs then let the next kernel launch only once split 0 holds every
//     partial (FlashDecodeTrigger::merge_inputs_landed; at exit above a bound of
//     kFlashDecodeMergeTriggerMaxKeys), and at head_dim 64 up to a bound of
//     kFlashDecodeWideClusterMaxKeysD64 (triggering right after the wait); fewer units and
//     longer head_dim 64 ranges keep their many global-merge splits;
//   - grids of sm_count / 4 < units <= sm_count / 2 take 8-warp CTAs, one per SM, sm_count / units
//     splits, where those fill >= 7/8 of the SMs.
// The tail split (same conditions: `warps` and `cluster_merge` the rule's): a one-split 4-warp
// plan of more units than slots = sm_count * ctas_per_sm, not a multiple of them, whose units
// hold >= kFlashDecodeTailMinUnitBytes of K+V at the bound, streams the units past its full
// waves, from split_from_bh = floor(units / slots) * slots / row_blocks on, in
// kFlashDecodeTailSplits splits (the global merge), the others in one split. The last wave then
// ends in quarter-size pieces: in a grid of whole units the last wave's CTAs start as the wave
// before ends, spread over one unit's time, and the call's last ~30 us stream with too few CTAs
// in flight (docs/perf.md runs 210-212: 1024 units of (128, 32, 8) at 4K / 16K / 64K
// 479.9 / 1885 / 7608 -> 474.0 / 1852 / 7414 us, alternating in one process pair).
// The late splits (same conditions): a 4-warp plan of 1, 2 or 3 splits a unit whose CTAs
// (units * num_splits) leave at least slots / 16 slots idle, of units >= slots / 4 that hold
// >= kFlashDecodeLateMinUnitBytes at the bound, runs one split a unit and streams each unit's
// last late_splits = clamp(P - floor(P units / slots), kFlashDecodeLateSplits, P - 1) pieces of
// n / P keys, P = 2^kFlashDecodeLateShift (split 0 streams at most units / slots of its unit);
// a one-split plan leaving 1 to slots / 16 - 1 slots idle, of units that hold
// >= kFlashDecodeLateFewIdleMinUnitBytes, streams kFlashDecodeLateFewIdlePieces halving pieces
// a unit from n / P (late_halving),
// in CTAs dispatched after every unit's first split (the global merge): the idle slots stream
// pieces from the start, and so do the SMs whose CTAs finish first (a one-wave grid's CTAs
// stream at unequal rates, at 64K keys some ~30% faster than the rest, docs/perf.md run 216; 2
// or 3 splits a unit share SMs unevenly, session 30).
// `cluster_merge` 0: no cluster merge and no rule; 1: the splits capped at
// kFlashDecodeMaxClusterSplits; 2-16: capped at that many. Then cluster = num_splits when
// 2 <= num_splits <= kFlashDecodeMaxClusterSplits and split 0's ring holds every split's fp32
// partial of the block's rows beside the warp-merge scratch.
FlashDecodePlan plan_flash_decode(std::int64_t batch, std::int64_t num_qo_heads,
                                  std::int64_t num_kv_heads, std::int64_t q_len,
                                  std::int64_t head_dim, std::int64_t capacity,
                                  std::int64_t max_live_k_len, int sm_count, int warps = 0,
                                  int cluster_merge = -1,
                                  std::int64_t single_split_bytes = kFlashDecodeSingleSplitBytes);

// The split count the kernel runs for a live visible range of n keys with no forced count (its
// stage-2 rule, which the kernel evaluates on the device): 1 while n <= single_split_keys, else
//   head_tiles (the launch's head plan: a one-wave grid, no left window, no forced count):
//   every split streams a head of H = 16 * warps keys, [H s, H (s + 1)),
//   then its share of the keys past the num_splits heads: num_splits splits when
//   n > H * num_splits, else ceil(n / H);
//   otherwise ceil(n / chunk) with chunk = max(min_chunk, round_up(ceil(n / num_splits), 16)).
// A unit below the tail split's split_from_bh (`bh`, its batch * num_kv_heads index) runs one
// split; bh = -1: a unit that splits as planned. Late splits: 1 + late_splits once n holds the
// late splits' keys and one (largest) piece more (split 0 keeps at least a piece), else 1.
inline int flash_decode_live_splits(const FlashDecodePlan& plan, std::int64_t n, bool head_tiles,
                                    std::int64_t bh = -1) {
  if (n <= plan.single_split_keys || (bh >= 0 && bh < plan.split_from_bh)) return 1;
  if (plan.late_splits > 0) {
    const FlashDecodeLatePieces late =
        flash_decode_late_pieces(n, plan.late_splits, plan.late_shift, plan.late_halving);
    return n >= late.late_keys + late.chunk ? 1 + plan.late_splits : 1;
  }
  if (head_tiles) {
    const std::int64_t head_keys = static_cast<std::int64_t>(kFlashDecodeTileKeys) * plan.warps;
    return n > head_keys * plan.num_splits ? plan.num_splits
                                           : static_cast<int>((n + head_keys - 1) / head_keys);
  }
  const std::int64_t per_split = (n + plan.num_splits - 1) / plan.num_splits;
  const std::int64_t rounded =
      (per_split + kFlashDecodeTileKeys - 1) / kFlashDecodeTileKeys * kFlashDecodeTileKeys;
  const std::int64_t chunk = rounded > plan.min_chunk ? rounded : plan.min_chunk;
  return static_cast<int>((n + chunk - 1) / chunk);
}

// Whether a launch under `plan` runs the `late_splits` (>= 0) the dev knobs ask for
// (FlashDecodeDevKnobs::late_splits) instead of the plan's: a one-split 4-warp global-merge plan,
// or a tail-split one for a positive count (which then replaces its tail split: every unit's
// split 0, then the late pieces), no forced split count, and at most 65535 (b, kv head) units
// (under late splits they lie in the grid's y).
inline bool flash_decode_late_knob_applies(const FlashDecodePlan& plan, std::int64_t forced_splits,
                                           int late_splits) {
  return late_splits >= 0 && forced_splits == 0 && plan.warps == kFlashDecodeWarps &&
         plan.cluster == 1 && plan.grid_z <= 65535 &&
         (plan.split_from_bh > 0 ? late_splits > 0 : plan.num_splits == 1);
}

// Dev-only benchmark attribution (issue 5, dev/flash_b1/): not part of the plan, off by
// default; the benchmark's --ab mode sets it. Process-wide, not thread-safe: set it before
// launching, never while another thread launches.
struct FlashDecodeDevKnobs {
  // Attribution only (the outputs are then wrong): bit 0 leaves the split merge out (partials
  // stored, nothing merged or written), bit 1 the K/V stream (no tile loaded).
  int drop_stages = 0;
  // Warps per CTA for every launch (0: the plan's rule; 4 or 8, 8 only at head_dim <= 128). Its
  // default comes from the environment variable SPLICE_FLASH_DECODE_WARPS (read once), so a
  // whole process (a model bench) can be A/B-tested.
  int warps = 0;
  // The plan's cluster_merge argument for every launch (-1: the rule; 0: never; 1: cap the splits
  // at 16 so that it applies; 2-16: cap them at that); default from SPLICE_FLASH_DECODE_CLUSTER.
  int cluster_merge = -1;
  // The plan's single_split_bytes for every launch (0: kFlashDecodeSingleSplitBytes); default from
  // SPLICE_FLASH_DECODE_SINGLE_SPLIT_BYTES.
  std::int64_t single_split_bytes = 0;
  // Cluster launches ask for the spread scheduling policy (a cluster's CTAs on distinct SMs where
  // the GPC has room); default from SPLICE_FLASH_DECODE_CLUSTER_SPREAD.
  bool cluster_spread = false;
  // The cluster grids' trigger (-1: the plan's; else a FlashDecodeTrigger value: 0 after the
  // wait, 1 at exit, 2 once split 0 holds every partial); default from
  // SPLICE_FLASH_DECODE_TRIGGER.
  int trigger = -1;
  // The late splits for every launch whose plan may take them (flash_decode_late_knob_applies):
  // -1 the plan's rule, 0 none, n > 0 that many (replacing a tail split); late_shift -1 the
  // plan's piece size (n / 2^kFlashDecodeLateShift), else pieces of n / 2^late_shift keys.
  // Defaults from SPLICE_FLASH_DECODE_LATE and SPLICE_FLASH_DECODE_LATE_SHIFT.
  int late_splits = -1;
  int late_shift = -1;
  // Halving late pieces (FlashDecodePlan::late_halving) where late splits run: -1 the plan's (none
  // where late_splits above overrides the plan), 0 equal pieces, 1 halving (at most
  // kFlashDecodeLateHalvingMaxPieces pieces, else equal). Default from
  // SPLICE_FLASH_DECODE_LATE_HALVING.
  int late_halving = -1;
};
void set_flash_decode_dev_knobs(const FlashDecodeDevKnobs& knobs);
FlashDecodeDevKnobs flash_decode_dev_knobs();

// The late splits a launch under `plan` runs (none with a forced split count), after the knobs:
// `from_knob` when the late_splits knob replaced the plan's (its pieces are then equal unless the
// late_halving knob asks otherwise); halving only for 1 .. kFlashDecodeLateHalvingMaxPieces.
struct FlashDecodeLateLaunch {
  int splits = 0;
  int shift = 0;
  bool halving = false;
  bool from_knob = false;
};
inline FlashDecodeLateLaunch flash_decode_late_launch(const FlashDecodePlan& plan,
                                                      std::int64_t forced_splits,
                                                      const FlashDecodeDevKnobs& knobs) {
  FlashDecodeLateLaunch late;
  late.splits = forced_splits > 0 ? 0 : plan.late_splits;
  late.shift = plan.late_shift;
  late.halving = plan.late_halving;
  if (flash_decode_late_knob_applies(plan, forced_splits, knobs.late_splits)) {
    late.from_knob = true;
    late.splits = std::min(knobs.late_splits, kFlashDecodeMaxSplits - 1);
    late.shift = knobs.late_shift >= 0 ? std::min(knobs.late_shift, 16) : kFlashDecodeLateShift;
    late.halving = false;
  }
  if (knobs.late_halving >= 0) late.halving = knobs.late_halving != 0;
  late.halving = late.halving && late.splits > 0 && late.splits <= kFlashDecodeLateHalvingMaxPieces;
  return late;
}

// Computes attention into `out` (and `*lse` when non-null) on `stream`. The grid is planned at
// the capacity bound so the launch can be captured in a graph and replayed with new k_len values;
// `options.num_splits > 0` forces that many splits (tests use it to check split invariance).
// The fp32 split workspace is owned by this module and grows on demand: the first call for a
// shape must happen outside stream capture (a growth during capture raises UnsupportedError).
// Its merge counters are shared, so launches must not run concurrently on different streams.
// `stable_prefix`: the caller's promise that no kernel in flight on `stream` writes k_len or the
// cache rows below k_len - q_len (a session's step scalar, and caches whose only writers in the
// step append at k_len - q_len: NodeHints::stable_kv_prefix). The kernel then plans and loads
// those rows before its programmatic-dependent-launch wait; the result is bitwise the same. The
// 8-warp cluster grids (long ranges at small batch) ignore it: measured slower there.
// Throws DTypeError / ShapeError / LayoutError / DeviceError naming the argument on bad input.
void flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                  const Tensor* alibi, const DecodeAttentionOptions& options, Tensor& out,
                  Tensor* lse, Stream stream = nullptr, bool stable_prefix = false);

// Launch counters (process-wide, relaxed atomics) for tests: launches issued, those made under
// the stable-prefix promise, and those that merged their splits in clusters.
struct FlashDecodeLaunches {
  std::uint64_t launches = 0, stable_prefix = 0, cluster_merge = 0;
};
FlashDecodeLaunches flash_decode_launches();

}  // namespace splice::cuda
