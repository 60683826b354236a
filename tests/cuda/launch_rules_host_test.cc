// The CUDA launchers' host-side rules: pure functions of shapes and the SM count, so they run
// without a GPU, in CI too (tests/CMakeLists.txt labels *_host_test `cuda_host`, not `gpu`),
// wherever the CUDA layer builds.
//
//   1. Flash decode's plan (plan_flash_decode, flash_decode.h): width, split count, clusters, the
//      tail and late splits, and the device's live split count (flash_decode_live_splits).
//   2. The GEMV route (gemv::preferred): which matmuls the GEMV takes on the measured shapes.
//   3. The fused KDA kernel's variant table (choose_kda_variant) at the measured points.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "../../src/backend/cuda/gemv.h"  // internal: the routing rule
#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/kda_decode.h"
#include "splice/core/dtype.h"
#include "splice/core/error.h"

namespace splice {
namespace {

// Flash decode's plan at the capacity bound on the H200's 132 SMs.
TEST(FlashDecodeCuda, PlanIsBoundedByLengthAndFillsOneWave) {
  // 4-warp CTAs (forced; the rule picks them for grids of more than sm_count / 4 units).
  const auto small = cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 16384, 132, 4);
  EXPECT_EQ(small.row_blocks, 1);
  EXPECT_EQ(small.warps, 4);
  EXPECT_EQ(small.ctas_per_sm, 2);
  EXPECT_EQ(small.num_splits, 132 * small.ctas_per_sm / 8);
  const auto few = cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 300, 132);
  EXPECT_EQ(few.num_splits, 5);  // ceil(300 / 64)
  // A bound of at most 128 KiB of K+V per (b, kv head) plans one split.
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 16384, 16384, 132).single_split_keys, 512);
  EXPECT_EQ(small.single_split_keys, 256);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 256, 16384, 16384, 132).single_split_keys, 128);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 256, 132).num_splits, 1);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 257, 132).num_splits, 5);
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 512, 512, 132).num_splits, 1);
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 2048, 2048, 132).num_splits, 16);  // clusters
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 2048, 2048, 132, 0, 0).num_splits, 32);
  // The device rule for the live split count (33 grid splits at (32, 8), head_dim 128), with
  // contiguous splits (no speculation)
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 1, false), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 256, false), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 257, false), 5);  // 64-key chunks
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 1024, false), 16);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 16000, false), 33);  // 496-key chunks
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 16384, false), 32);  // 512-key chunks
  // and under the head plan (4 warps: 64-key heads, 33 of them = 2112 keys)
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 256, true), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 257, true), 5);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 2112, true), 33);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 2049, true), 33);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 2048, true), 32);
  EXPECT_EQ(cuda::flash_decode_live_splits(small, 16384, true), 33);
  // 1024 units: 4-warp CTAs, 3 full waves of 264 slots; the tail split streams the other 232
  // units in 4 splits (the global merge), the first 792 in one.
  const auto big = cuda::plan_flash_decode(128, 32, 8, 1, 128, 16384, 16384, 132);
  EXPECT_EQ(big.warps, 4);
  EXPECT_EQ(big.num_splits, cuda::kFlashDecodeTailSplits);
  EXPECT_EQ(big.split_from_bh, 792);
  EXPECT_EQ(big.cluster, 1);
  EXPECT_EQ(big.workspace_bytes, 232u * 4 * 16 * 129 * sizeof(float));
  EXPECT_EQ(cuda::flash_decode_live_splits(big, 16384, false, 791), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(big, 16384, false, 792), 4);
  EXPECT_EQ(cuda::flash_decode_live_splits(big, 16384, false), 4);
  EXPECT_EQ(cuda::flash_decode_live_splits(big, 256, false, 792), 1);
  // No tail split: a whole number of waves (528 units), one wave or less, units under 2 MiB of
  // K+V (4095 keys at head_dim 128, 8191 at 64), the rule's knobs forced (a width, clusters).
  EXPECT_EQ(cuda::plan_flash_decode(66, 32, 8, 1, 128, 4096, 4096, 132).num_splits, 1);
  EXPECT_EQ(cuda::plan_flash_decode(33, 32, 8, 1, 128, 4096, 4096, 132).split_from_bh, 0);
  EXPECT_EQ(cuda::plan_flash_decode(128, 32, 8, 1, 128, 4095, 4095, 132).num_splits, 1);
  EXPECT_EQ(cuda::plan_flash_decode(128, 32, 8, 1, 128, 1024, 1024, 132).split_from_bh, 0);
  EXPECT_EQ(cuda::plan_flash_decode(128, 32, 8, 1, 64, 8191, 8191, 132).num_splits, 1);
  EXPECT_GT(cuda::plan_flash_decode(128, 32, 8, 1, 64, 8192, 8192, 132).split_from_bh, 0);
  EXPECT_EQ(cuda::plan_flash_decode(128, 32, 8, 1, 128, 4096, 4096, 132, 4).num_splits, 1);
  EXPECT_EQ(cuda::plan_flash_decode(128, 32, 8, 1, 128, 4096, 4096, 132, 0, 0).num_splits, 1);
  // The late splits: a one-split 4-warp grid of at most one wave with >= 1/16 of its 264 slots
  // idle (<= 248 units), 8 MiB of K+V a unit, streams each unit's last 4+ pieces of n / 16 keys
  // in CTAs dispatched after every unit's first split; not below 8 MiB, with fewer idle slots
  // (but below), over a wave (the tail split) or with a knob forced.
  const auto one_wave = cuda::plan_flash_decode(31, 32, 8, 1, 128, 16384, 16384, 132);
  EXPECT_EQ(one_wave.num_splits, 1);
  EXPECT_EQ(one_wave.split_from_bh, 0);
  EXPECT_EQ(one_wave.late_splits, cuda::kFlashDecodeLateSplits);
  EXPECT_EQ(one_wave.late_shift, cuda::kFlashDecodeLateShift);
  EXPECT_EQ(one_wave.workspace_bytes, 248u * 5 * 16 * 129 * sizeof(float));
  EXPECT_EQ(cuda::flash_decode_live_splits(one_wave, 16384, false), 5);  // 1024-key pieces
  EXPECT_EQ(cuda::flash_decode_live_splits(one_wave, 257, false), 5);    // 32-key pieces
  EXPECT_EQ(cuda::flash_decode_live_splits(one_wave, 256, false), 1);    // single-split limit
  // The piece count: 16 - floor(16 units / 264), 4 .. 15 (split 0 keeps at most units / slots).
  EXPECT_EQ(cuda::plan_flash_decode(30, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 4);
  EXPECT_EQ(cuda::plan_flash_decode(24, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 5);
  EXPECT_EQ(cuda::plan_flash_decode(20, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 7);
  EXPECT_EQ(cuda::plan_flash_decode(17, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 8);
  EXPECT_EQ(cuda::plan_flash_decode(31, 32, 8, 1, 128, 16383, 16383, 132).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(34, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 0);
  EXPECT_FALSE(one_wave.late_halving);
  // Fewer than 264 / 16 slots idle: five late pieces halving from n / 16 for units of 32 MiB (64K
  // keys at head_dim 128), none below it, with every slot busy, or where the plan splits a unit
  // (the 2-split 128 units below).
  const auto few_idle = cuda::plan_flash_decode(32, 32, 8, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(few_idle.num_splits, 1);
  EXPECT_EQ(few_idle.late_splits, cuda::kFlashDecodeLateFewIdlePieces);
  EXPECT_EQ(few_idle.late_shift, cuda::kFlashDecodeLateShift);
  EXPECT_TRUE(few_idle.late_halving);
  EXPECT_EQ(few_idle.workspace_bytes, 256u * 6 * 16 * 129 * sizeof(float));
  EXPECT_EQ(cuda::flash_decode_live_splits(few_idle, 65536, false), 6);
  EXPECT_EQ(cuda::flash_decode_live_splits(few_idle, 32, false), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(few_idle, 751, false), 1);
  EXPECT_EQ(cuda::flash_decode_live_splits(few_idle, 752, false), 6);  // 496 late keys + 256
  // The pieces' geometry: 5 halving from n / 16 at 64K keys are 4096, 2048, 1024, 512 and 256
  // keys (7936 in all, the first a multiple of 16 * 2^4); equal pieces are L copies of n / 16.
  const auto halving = cuda::flash_decode_late_pieces(65536, 5, 4, true);
  EXPECT_EQ(halving.chunk, 4096);
  EXPECT_EQ(halving.late_keys, 4096 + 2048 + 1024 + 512 + 256);
  EXPECT_EQ(cuda::flash_decode_late_pieces(1000, 5, 4, true).chunk, 256);  // 63 -> 256
  EXPECT_EQ(cuda::flash_decode_late_pieces(65536, 4, 4, false).late_keys, 4 * 4096);
  EXPECT_EQ(cuda::flash_decode_late_pieces(1000, 4, 4, false).chunk, 64);  // 63 -> 64
  EXPECT_EQ(cuda::plan_flash_decode(8, 32, 32, 1, 128, 65536, 65536, 132).late_splits, 5);
  EXPECT_EQ(cuda::plan_flash_decode(263, 8, 1, 1, 128, 65536, 65536, 132).late_splits, 5);
  EXPECT_EQ(cuda::plan_flash_decode(33, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(32, 32, 8, 1, 128, 65535, 65535, 132).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(32, 32, 8, 1, 128, 16384, 16384, 132).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(31, 32, 8, 1, 128, 16384, 16384, 132, 4).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 0);
  // A one-wave plan of 2 or 3 splits a unit with >= 1/16 of the slots idle runs one split and
  // late pieces by the same rule from slots / 4 units on: 96 units
  // (2 splits: 192 CTAs), 72 (3: 216), 160 at head_dim 64 (396 slots, 2 splits: 320); 128 units
  // (2 splits: 256 CTAs) and the 8-warp 64 keep their splits.
  const auto two_splits = cuda::plan_flash_decode(12, 32, 8, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(two_splits.num_splits, 1);
  EXPECT_EQ(two_splits.cluster, 1);
  EXPECT_EQ(two_splits.late_splits, 11);
  EXPECT_EQ(two_splits.late_shift, cuda::kFlashDecodeLateShift);
  EXPECT_EQ(cuda::flash_decode_live_splits(two_splits, 65536, false), 12);  // 4096-key pieces
  EXPECT_EQ(cuda::flash_decode_live_splits(two_splits, 384, false), 12);    // 12 pieces of 32 keys
  EXPECT_EQ(cuda::flash_decode_live_splits(two_splits, 383, false), 1);
  EXPECT_EQ(cuda::plan_flash_decode(9, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 12);
  EXPECT_EQ(cuda::plan_flash_decode(20, 32, 8, 1, 64, 65536, 65536, 132).late_splits, 10);
  const auto near_full = cuda::plan_flash_decode(16, 32, 8, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(near_full.num_splits, 2);
  EXPECT_EQ(near_full.late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(8, 32, 8, 1, 128, 65536, 65536, 132).late_splits, 0);
  EXPECT_EQ(cuda::plan_flash_decode(12, 32, 8, 1, 128, 16383, 16383, 132).num_splits, 2);
  // Row blocks: split_from_bh counts (b, kv head) units of row_blocks CTAs each.
  const auto rows = cuda::plan_flash_decode(40, 64, 8, 4, 128, 4096, 4096, 132);
  EXPECT_EQ(rows.row_blocks, 2);       // 8 heads x 4 queries = 32 rows
  EXPECT_EQ(rows.split_from_bh, 264);  // 640 units, 528 in two full waves
  // The wide rule: 8-warp CTAs (one per SM) at head_dim <= 128 when the grid has at most
  // sm_count / 4 (b, kv head, row block) units and the bound splits into wide splits of >= 256
  // keys; 4-warp CTAs otherwise (short ranges, one split, larger grids, head_dim 256).
  const auto wide = cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 16384, 132, 0, 0);
  EXPECT_EQ(wide.warps, 8);
  EXPECT_EQ(wide.ctas_per_sm, 1);
  EXPECT_EQ(wide.num_splits, 16);                                     // 132 / 8 units
  EXPECT_EQ(cuda::flash_decode_live_splits(wide, 16384, false), 16);  // 1024-key chunks
  EXPECT_EQ(cuda::flash_decode_live_splits(wide, 16384, true), 16);   // 128-key heads + 896
  EXPECT_EQ(cuda::flash_decode_live_splits(wide, 300, true), 3);      // 128-key heads only
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 4096, 4096, 132).warps, 8);  // 256 a split
  const auto short_range = cuda::plan_flash_decode(1, 32, 8, 1, 128, 1024, 1024, 132, 0, 0);
  EXPECT_EQ(short_range.warps, 4);  // 16 wide splits of 64 keys: too few keys per CTA
  EXPECT_EQ(short_range.num_splits, 16);
  EXPECT_EQ(short_range.cluster, 1);  // cluster_merge 0: never
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 256, 256, 132).warps, 4);  // the model's
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 2048, 2048, 132).warps, 4);
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 16384, 16384, 132).warps, 8);
  EXPECT_EQ(cuda::plan_flash_decode(33, 8, 1, 1, 64, 65536, 65536, 132).warps, 8);
  EXPECT_EQ(cuda::plan_flash_decode(34, 8, 1, 1, 64, 65536, 65536, 132).warps, 4);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 256, 16384, 16384, 132).warps, 4);
  EXPECT_THROW(cuda::plan_flash_decode(1, 32, 8, 1, 256, 1024, 1024, 132, 8), ValueError);
  EXPECT_THROW(cuda::plan_flash_decode(1, 32, 8, 1, 128, 1024, 1024, 132, 6), ValueError);
  const auto spec = cuda::plan_flash_decode(2, 64, 8, 8, 128, 1024, 1024, 132);
  EXPECT_EQ(spec.row_blocks, 4);  // 8 heads x 8 queries = 64 rows
  constexpr auto kEarly = cuda::FlashDecodeTrigger::after_wait;
  constexpr auto kLate = cuda::FlashDecodeTrigger::merge_inputs_landed;
  // The cluster rule: a 4-warp plan of <= sm_count / 4 units caps its splits at
  // min(16, sm_count / 2 / units), and the unit's splits form one cluster when split 0's ring
  // holds their partials.
  const auto b1 = cuda::plan_flash_decode(1, 32, 8, 1, 128, 1024, 1024, 132);
  EXPECT_EQ(b1.warps, 4);
  EXPECT_EQ(b1.num_splits, 8);  // 66 / 8 units
  EXPECT_EQ(b1.cluster, 8);
  const auto smol = cuda::plan_flash_decode(1, 9, 3, 1, 64, 1024, 1024, 132);
  EXPECT_EQ(smol.num_splits, 16);  // min(16, 66 / 3)
  EXPECT_EQ(smol.cluster, 16);
  // sm_count / 4 < units <= sm_count / 2: one 8-warp CTA per SM, sm_count / units splits.
  const auto mid = cuda::plan_flash_decode(8, 32, 8, 1, 128, 4096, 4096, 132);
  EXPECT_EQ(mid.warps, 8);
  EXPECT_EQ(mid.num_splits, 2);
  EXPECT_EQ(mid.cluster, 2);
  EXPECT_EQ(cuda::plan_flash_decode(8, 32, 8, 1, 128, 4096, 4096, 132, 0, 0).warps, 4);
  // The wide rule's ranges of >= 4K keys: 8 splits in one cluster at <= sm_count / 16 units;
  // more units keep their splits (a cluster where split 0 holds the partials; the launcher merges
  // globally where the GPU cannot hold every cluster at once).
  const auto wide_cluster = cuda::plan_flash_decode(1, 32, 8, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(wide_cluster.warps, 8);
  EXPECT_EQ(wide_cluster.num_splits, 8);
  EXPECT_EQ(wide_cluster.cluster, 8);
  EXPECT_EQ(wide.cluster, 1);  // cluster_merge 0
  const auto wide_16k = cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 16384, 132);
  EXPECT_EQ(wide_16k.warps, 8);
  EXPECT_EQ(wide_16k.num_splits, 8);
  EXPECT_EQ(wide_16k.cluster, 8);
  EXPECT_EQ(wide_16k.trigger, kLate);  // the next kernel launches once the partials landed
  EXPECT_EQ(wide_cluster.trigger, cuda::FlashDecodeTrigger::at_exit);  // above 16K keys
  // 4K and 8K bounds: the same plan, triggering once the partials landed at head_dim 128 and
  // right after the wait at head_dim 64 (taken there up to an 8K-key bound).
  for (const std::int64_t head_dim : {128, 64})
    for (const std::int64_t bound : {4096, 8192}) {
      const auto plan = cuda::plan_flash_decode(1, 32, 8, 1, head_dim, bound, bound, 132);
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", bound " + std::to_string(bound));
      EXPECT_EQ(plan.warps, 8);
      EXPECT_EQ(plan.num_splits, 8);
      EXPECT_EQ(plan.cluster, 8);
      EXPECT_EQ(plan.trigger, head_dim == 128 ? kLate : kEarly);
    }
  // Below 4K keys the 4-warp cluster plan, whose CTAs trigger right after the wait.
  const auto short_3k = cuda::plan_flash_decode(1, 32, 8, 1, 128, 3072, 3072, 132);
  EXPECT_EQ(short_3k.warps, 4);
  EXPECT_EQ(short_3k.trigger, kEarly);  // every other plan: right after the wait
  // Fewer than 3 sm_count / 64 units (7 on 132 SMs), or head_dim 64: the wide rule's global-merge
  // splits over the whole GPU instead (an 8-split unit streams at most ~0.45 TB/s).
  const auto two_units = cuda::plan_flash_decode(1, 16, 2, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(two_units.num_splits, 66);
  EXPECT_EQ(two_units.cluster, 1);
  EXPECT_EQ(two_units.trigger, kEarly);
  EXPECT_EQ(cuda::plan_flash_decode(1, 48, 6, 1, 128, 16384, 16384, 132).num_splits, 22);
  EXPECT_EQ(cuda::plan_flash_decode(1, 56, 7, 1, 128, 16384, 16384, 132).num_splits, 8);
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 16384, 16384, 132).num_splits, 44);
  EXPECT_NE(cuda::plan_flash_decode(1, 32, 8, 1, 64, 16384, 16384, 132).num_splits, 8);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 1024, 1024, 132).trigger, kEarly);
  EXPECT_EQ(cuda::plan_flash_decode(1, 9, 3, 1, 64, 2048, 2048, 132).trigger, kEarly);
  const auto wide_b2 = cuda::plan_flash_decode(2, 32, 8, 1, 128, 65536, 65536, 132);
  EXPECT_EQ(wide_b2.warps, 8);
  EXPECT_EQ(wide_b2.num_splits, 8);  // 132 / 16 units
  EXPECT_EQ(wide_b2.cluster, 8);
  // No cluster where split 0's ring cannot hold the partials: 16 rows x 16 splits at head_dim 64.
  const auto rows16 = cuda::plan_flash_decode(1, 8, 2, 8, 64, 1024, 1024, 132, 0, 1);
  EXPECT_EQ(rows16.num_splits, 16);
  EXPECT_EQ(rows16.cluster, 1);
  // The knob's caps.
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 16384, 132, 0, 4).num_splits, 4);
  EXPECT_EQ(cuda::plan_flash_decode(1, 32, 8, 1, 128, 16384, 16384, 132, 0, 4).cluster, 4);
}

// The GEMV route on the measured shapes (one, four and eight rows; perf.md run 321).
TEST(CudaGemv, RoutingRuleOnMeasuredShapes) {
  using Shape = std::pair<std::int64_t, std::int64_t>;  // (n, k)
  // One row: always the GEMV (wins or ties everywhere measured; the lm_head is the predicted one).
  const Shape one_row[] = {{192, 576}, {49152, 576}, {4096, 4096}, {14336, 4096}};
  for (const auto& [n, k] : one_row) EXPECT_TRUE(cuda::gemv::preferred(1, n, k)) << n << "x" << k;
  // Two and four rows: the GEMV on the weights it won at (the default model's KDA projections
  // 1026 and 1032 wide among them), cuBLASLt on those it lost at.
  const Shape few_rows_gemv[] = {{576, 576},  {192, 576},  {576, 1536}, {960, 576},
                                 {1536, 576}, {3072, 576}, {1026, 256}, {1032, 256}};
  const Shape few_rows_lt[] = {{49152, 576}, {4096, 4096}, {14336, 4096}};
  for (const std::int64_t m : {2, 4}) {
    for (const auto& [n, k] : few_rows_gemv)
      EXPECT_TRUE(cuda::gemv::preferred(m, n, k)) << m << " rows, " << n << "x" << k;
    for (const auto& [n, k] : few_rows_lt)
      EXPECT_FALSE(cuda::gemv::preferred(m, n, k)) << m << " rows, " << n << "x" << k;
  }
  // Eight rows: the GEMV up to 1536x576; 3072x576 already loses.
  const Shape eight_rows_gemv[] = {{576, 576}, {192, 576}, {1536, 576}, {960, 576}, {1026, 256}};
  const Shape eight_rows_lt[] = {{3072, 576}, {49152, 576}, {4096, 4096}, {14336, 4096}};
  for (const auto& [n, k] : eight_rows_gemv)
    EXPECT_TRUE(cuda::gemv::preferred(8, n, k)) << n << "x" << k;
  for (const auto& [n, k] : eight_rows_lt)
    EXPECT_FALSE(cuda::gemv::preferred(8, n, k)) << n << "x" << k;
  EXPECT_FALSE(cuda::gemv::preferred(cuda::gemv::kMaxRows + 1, 192, 576));
}

// The rule's table (kda_decode.cu) at the measured points (H = 32 on the H200's 132 SMs), and at
// the band edges.
TEST(KdaCuda, RuleTable) {
  using V = cuda::KdaVariant;
  constexpr int kSms = 132;
  constexpr std::int64_t kH = 32;
  struct Row {
    std::int64_t n, t;
    DType dtype;
    V want;
  };
  const Row rows[] = {
      {512, 1, DType::f32, V::stream}, {512, 1, DType::bf16, V::stream},
      {32, 4, DType::bf16, V::stream}, {32, 8, DType::f32, V::stream},
      {32, 8, DType::bf16, V::stream}, {512, 8, DType::bf16, V::stream},
      {32, 9, DType::bf16, V::wide},   {512, 16, DType::bf16, V::wide},
      {8, 1, DType::f32, V::rows},     {8, 1, DType::bf16, V::rows},
      {8, 2, DType::f32, V::wide},     {8, 2, DType::bf16, V::wide},
      {8, 4, DType::f32, V::wide512},  {8, 4, DType::bf16, V::wide},
      {8, 8, DType::f32, V::wide512},  {8, 8, DType::bf16, V::wide},
      {7, 4, DType::f32, V::wide},     {6, 8, DType::f32, V::wide},
      {1, 1, DType::f32, V::split4},   {1, 1, DType::bf16, V::split4},
      {1, 2, DType::f32, V::split4},   {1, 2, DType::bf16, V::split4},
      {1, 4, DType::f32, V::split4},   {1, 4, DType::bf16, V::split4},
      {1, 8, DType::f32, V::split4},   {1, 8, DType::bf16, V::split4},
      {4, 1, DType::f32, V::wide512},  {4, 1, DType::bf16, V::rows},
      {2, 1, DType::f32, V::rows},     {2, 1, DType::bf16, V::rows},
      {2, 2, DType::f32, V::wide512},  {2, 2, DType::bf16, V::wide},
      {16, 1, DType::f32, V::stream},  {16, 1, DType::bf16, V::rows},
      {12, 1, DType::f32, V::stream},  {12, 1, DType::bf16, V::rows},
      {24, 1, DType::f32, V::stream},  {24, 1, DType::bf16, V::rows},
      {32, 1, DType::bf16, V::rows},   {40, 1, DType::bf16, V::stream},
      {4, 8, DType::f32, V::wide512},  {4, 8, DType::bf16, V::wide512},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(cuda::choose_kda_variant(r.n, kH, r.t, r.dtype, kSms), r.want)
        << "N=" << r.n << " T=" << r.t << " " << dtype_name(r.dtype) << ": got "
        << cuda::kda_variant_name(cuda::choose_kda_variant(r.n, kH, r.t, r.dtype, kSms));
  }
  // Band edges in items: 2 SMs (stream; wide below it at T > 1, wide512 for f32 at T >= 4 from
  // 7/4 SMs), SMs (wide512 below), SMs / 2
  // (wide512), one below
  // (split4 at and below SMs / 4, wide / wide512 above it); at T = 1: rows above SMs / 4 and
  // below 8 SMs (bf16) or 2 SMs (f32, but its wide512 band).
  EXPECT_EQ(cuda::choose_kda_variant(8 * kSms, 1, 1, DType::bf16, kSms), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(8 * kSms - 1, 1, 1, DType::bf16, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms, 1, 1, DType::bf16, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms, 1, 1, DType::f32, kSms), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms - 1, 1, 1, DType::f32, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms - 1, 1, 1, DType::bf16, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms - 1, 1, 2, DType::bf16, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(kSms, 1, 1, DType::f32, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(kSms - 1, 1, 1, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 2, 1, 1, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 2 - 1, 1, 1, DType::f32, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 4 + 1, 1, 1, DType::bf16, kSms), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 4, 1, 1, DType::bf16, kSms), V::split4);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms, 1, 2, DType::f32, kSms), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms - 1, 1, 2, DType::f32, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(kSms, 1, 2, DType::f32, kSms), V::wide);
  // f32 at T >= 4 from 7/4 SMs (231 items at 132 SMs) to 2 SMs: wide512.
  EXPECT_EQ(cuda::choose_kda_variant(231, 1, 4, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms - 1, 1, 9, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(230, 1, 4, DType::f32, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(231, 1, 3, DType::f32, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(231, 1, 4, DType::bf16, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(2 * kSms, 1, 4, DType::f32, kSms), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(kSms - 1, 1, 2, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 2, 1, 2, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 2 - 1, 1, 2, DType::f32, kSms), V::wide512);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 2 - 1, 1, 2, DType::bf16, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 4 + 1, 1, 2, DType::bf16, kSms), V::wide);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 4, 1, 2, DType::bf16, kSms), V::split4);
  EXPECT_EQ(cuda::choose_kda_variant(kSms / 4, 1, 2, DType::f32, kSms), V::split4);
  // Cards of fewer DRAM bytes a second per SM (the H100, 3.35 TB/s over 132 SMs): bf16 T = 1
  // runs rows past 8 SMs of items too; the H200 (4.92 TB/s) and an unknown card keep stream.
  constexpr double kH100 = 3.35e12, kH200 = 4.92e12;
  EXPECT_EQ(cuda::choose_kda_variant(128, kH, 1, DType::bf16, kSms, kH100), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(512, kH, 1, DType::bf16, kSms, kH100), V::rows);
  EXPECT_EQ(cuda::choose_kda_variant(128, kH, 1, DType::bf16, kSms, kH200), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(128, kH, 1, DType::bf16, kSms, 0), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(128, kH, 2, DType::bf16, kSms, kH100), V::stream);
  EXPECT_EQ(cuda::choose_kda_variant(128, kH, 1, DType::f32, kSms, kH100), V::stream);
}

}  // namespace
}  // namespace splice
