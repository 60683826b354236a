// Launcher of the CUDA flash-decode kernel (device code in flash_decode_kernel.cuh).
//
//   1. Check every argument (devices, dtypes, ranks, shapes, strides and alignment), naming it.
//   2. Plan the grid at the capacity bound (plan_flash_decode), so the launch is graph-safe; the
//      kernel re-plans the live split count from k_len on the device (one split while the live
//      range is at most plan.single_split_keys).
//   3. Make sure the module-owned fp32 split workspace and the zeroed merge counters are large
//      enough (growth is refused during stream capture), fill the POD params (split 0 loads its
//      first K/V tile per warp before k_len arrives, in one-wave grids with no left window) and
//      launch the instantiation for (dtype, head_dim, width, score modifiers, merge) with
//      cudaLaunchKernelEx, with programmatic dependent launch on a created stream (the kernel
//      waits for the previous kernel's writes before its first access, so only the launch itself
//      overlaps). The merge: in thread-block clusters of the unit's splits (kernel stage 6')
//      when the plan says so, the grid has the plan's split count and every cluster of the grid
//      is resident at once (cudaOccupancyMaxActiveClusters, asked once per instance and size);
//      else through global memory (stage 6). The dev knobs (FlashDecodeDevKnobs) force widths,
//      merges and split limits for A/B runs, or leave stages out for benchmark attribution.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/flash_decode_kernel.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/flash_decode_checks.h"
#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/runtime.h"

// The planner's constants (public header) and the kernel's must agree.
static_assert(splice::cuda::kFlashDecodeMaxSplits == splice::cuda::detail::kMaxSplits);
static_assert(splice::cuda::kFlashDecodeRowsPerCta == splice::cuda::detail::kRows);
static_assert(splice::cuda::kFlashDecodeTileKeys == splice::cuda::detail::kTileKeys);
static_assert(splice::cuda::kFlashDecodeWarps == splice::cuda::detail::kNarrowWarps);
static_assert(splice::cuda::kFlashDecodeWideWarps == splice::cuda::detail::kWideWarps);

namespace splice::cuda {
namespace {

using detail::FlashDecodeConfig;
using detail::FlashDecodeParams;

constexpr std::int64_t kMaxLength = std::int64_t{1} << 30;  // int32 position arithmetic headroom
constexpr std::int64_t kMaxGridYZ = 65535;
constexpr int kMaxCtasPerSm = 4;

std::atomic<std::uint64_t> g_launches{0}, g_stable_prefix_launches{0}, g_cluster_launches{0};
constexpr std::size_t kSmemPerSm = 228 * 1024;  // Hopper: shared memory per SM
constexpr std::size_t kSmemReservedPerCta = 1024;
constexpr std::int64_t kVecElems = 8;      // 16 bytes of 16-bit elements
constexpr std::int64_t kHalfVecElems = 4;  // 8 bytes of 16-bit elements

// Whether split 0's ring holds the cluster merge's receive area (`splits` partials of `rows` rows).
bool cluster_merge_fits(std::int64_t head_dim, int warps, int splits, int rows) {
  const bool wide = warps == detail::kWideWarps;
  switch (head_dim) {
    case 64:
      return wide ? FlashDecodeConfig<64, detail::kWideWarps>::cluster_merge_fits(splits, rows)
                  : FlashDecodeConfig<64, detail::kNarrowWarps>::cluster_merge_fits(splits, rows);
    case 128:
      return wide ? FlashDecodeConfig<128, detail::kWideWarps>::cluster_merge_fits(splits, rows)
                  : FlashDecodeConfig<128, detail::kNarrowWarps>::cluster_merge_fits(splits, rows);
    default:
      return FlashDecodeConfig<256, detail::kNarrowWarps>::cluster_merge_fits(splits, rows);
  }
}

int smem_bytes(std::int64_t head_dim, int warps) {
  const bool wide = warps == detail::kWideWarps;
  switch (head_dim) {
    case 64:
      return wide ? FlashDecodeConfig<64, detail::kWideWarps>::kSmemBytes
                  : FlashDecodeConfig<64, detail::kNarrowWarps>::kSmemBytes;
    case 128:
      return wide ? FlashDecodeConfig<128, detail::kWideWarps>::kSmemBytes
                  : FlashDecodeConfig<128, detail::kNarrowWarps>::kSmemBytes;
    default:
      return FlashDecodeConfig<256, detail::kNarrowWarps>::kSmemBytes;
  }
}

// Resident CTAs per SM for a CTA of `smem` dynamic shared-memory bytes.
int ctas_per_sm(int smem) {
  const std::size_t per_cta = static_cast<std::size_t>(smem) + kSmemReservedPerCta;
  return std::clamp(static_cast<int>(kSmemPerSm / per_cta), 1, kMaxCtasPerSm);
}

// Module-owned workspace: merge counters (zero between launches) and fp32 partials.
struct Workspace {
  std::mutex mutex;
  unsigned* counters = nullptr;
  std::size_t counter_count = 0;
  float* partials = nullptr;
  std::size_t partial_bytes = 0;
  FlashDecodeDevKnobs knobs = knobs_from_environment();

  static FlashDecodeDevKnobs knobs_from_environment() {
    FlashDecodeDevKnobs knobs;
    if (const char* warps = std::getenv("SPLICE_FLASH_DECODE_WARPS"); warps && *warps)
      knobs.warps = std::atoi(warps);
    if (const char* cluster = std::getenv("SPLICE_FLASH_DECODE_CLUSTER"); cluster && *cluster)
      knobs.cluster_merge = std::atoi(cluster);
    if (const char* bytes = std::getenv("SPLICE_FLASH_DECODE_SINGLE_SPLIT_BYTES"); bytes && *bytes)
      knobs.single_split_bytes = std::atoll(bytes);
    if (const char* spread = std::getenv("SPLICE_FLASH_DECODE_CLUSTER_SPREAD"); spread && *spread)
      knobs.cluster_spread = std::atoi(spread) != 0;
    if (const char* trigger = std::getenv("SPLICE_FLASH_DECODE_TRIGGER"); trigger && *trigger)
      knobs.trigger = std::atoi(trigger);
    if (const char* late = std::getenv("SPLICE_FLASH_DECODE_LATE"); late && *late)
      knobs.late_splits = std::atoi(late);
    if (const char* shift = std::getenv("SPLICE_FLASH_DECODE_LATE_SHIFT"); shift && *shift)
      knobs.late_shift = std::atoi(shift);
    if (const char* halving = std::getenv("SPLICE_FLASH_DECODE_LATE_HALVING"); halving && *halving)
      knobs.late_halving = std::atoi(halving);
    return knobs;
  }
};

Workspace& workspace() {
  static auto* instance = new Workspace();  // lives for the process (kernels may still run)
  return *instance;
}

bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SPLICE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void ensure_workspace(std::size_t counters, std::size_t partial_bytes, Stream stream) {
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  if (ws.counter_count >= counters && ws.partial_bytes >= partial_bytes) return;
  if (capturing(stream))
    fail<UnsupportedError>("flash_decode: the split workspace must grow to ", partial_bytes,
                           " bytes during stream capture; run the same shapes once before "
                           "capturing");
  if (ws.counter_count < counters) {
    if (ws.counters) SPLICE_CUDA_CHECK(cudaFree(ws.counters));  // synchronizes the device
    ws.counters = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&ws.counters, counters * sizeof(unsigned)));
    SPLICE_CUDA_CHECK(cudaMemset(ws.counters, 0, counters * sizeof(unsigned)));
    ws.counter_count = counters;
  }
  if (ws.partial_bytes < partial_bytes) {
    if (ws.partials) SPLICE_CUDA_CHECK(cudaFree(ws.partials));
    ws.partials = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&ws.partials, partial_bytes));
    ws.partial_bytes = partial_bytes;
  }
}

void check_cuda_tensor(const Tensor& t, const char* name) {
  check_defined(t, name);
  if (!t.device().is_cuda())
    fail<DeviceError>("flash_decode: `", name, "` must be on a CUDA device, got ",
                      t.device().str());
}

bool aligned(const Tensor& t, std::int64_t elems) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.raw_data());
  if (address % (elems * 2) != 0) return false;
  for (std::int64_t axis = 0; axis + 1 < t.dim(); ++axis)
    if (t.stride(axis) % elems != 0) return false;
  return true;
}

// One-time setup of an instantiation: its dynamic shared-memory limit, clusters of up to 16 CTAs,
// and a check that its registers let as many CTAs reside per SM as the plan assumes from shared
// memory alone (the one-wave rule of speculation relies on it; 254 registers at head_dim 128 is the
// most that still fits 2).
template <typename T, int kHeadDim, int kWarps, bool kScoreMods, bool kClusterMerge>
void prepare() {
  static std::once_flag once;
  std::call_once(once, [] {
    using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
    constexpr int smem = Cfg::kSmemBytes;
    const auto kernel = detail::flash_decode_kernel<T, kHeadDim, kWarps, kScoreMods, kClusterMerge>;
    SPLICE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (kClusterMerge)
      SPLICE_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    int resident = 0;
    SPLICE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, Cfg::kThreads, smem));
    SPLICE_INTERNAL_CHECK(resident >= ctas_per_sm(smem), "flash_decode_kernel<head_dim ", kHeadDim,
                          ", ", kWarps, " warps>: ", resident,
                          " resident CTAs per SM, the plan assumes ", ctas_per_sm(smem),
                          " (registers?)");
  });
}

// Whether the device can hold all `clusters` clusters of (1, splits, 1) CTAs of the cluster-merge
// instance at once (cudaOccupancyMaxActiveClusters, asked once per thread, device, instance and
// size): a cluster's CTAs must share a GPC, so the answer depends on the GPU's GPC layout (H200 at
// one CTA per SM: 7 clusters of 16, not 8; dev/cluster_occupancy).
template <typename T, int kHeadDim, int kWarps, bool kScoreMods>
bool clusters_resident(int splits, std::int64_t clusters, Stream stream) {
  thread_local std::map<std::pair<int, int>, int> resident;  // (device, splits) -> clusters
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  auto [it, fresh] = resident.try_emplace({device, splits}, 0);
  if (fresh) {
    prepare<T, kHeadDim, kWarps, kScoreMods, true>();
    using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1, static_cast<unsigned>(splits), 1);
    config.blockDim = dim3(Cfg::kThreads, 1, 1);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = static_cast<unsigned>(splits);
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    SPLICE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(
        &it->second, detail::flash_decode_kernel<T, kHeadDim, kWarps, kScoreMods, true>, &config));
  }
  return clusters <= it->second;
}

// Launches the instance for (T, head_dim, warps, score modifiers), the cluster-merge one when
// `cluster_merge` and every cluster of the grid is resident at once (else the global merge: a
// multi-wave grid of clusters would wait for whole free GPC slices).
template <typename T, int kHeadDim, int kWarps, bool kScoreMods>
void launch(const FlashDecodeParams& params, const dim3& grid, bool cluster_merge, bool spread,
            Stream stream) {
  using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
  cluster_merge = cluster_merge &&
                  clusters_resident<T, kHeadDim, kWarps, kScoreMods>(
                      static_cast<int>(grid.y), static_cast<std::int64_t>(grid.x) * grid.z, stream);
  g_cluster_launches.fetch_add(cluster_merge ? 1 : 0, std::memory_order_relaxed);
  // launch.cuh's launcher (the PDL attribute unless disabled or the legacy stream); the kernel
  // obeys its safety rule (stage 0 waits before any global access or early return).
  if (cluster_merge) {
    prepare<T, kHeadDim, kWarps, kScoreMods, true>();
    const detail::LaunchShape shape{grid, dim3(Cfg::kThreads, 1, 1), Cfg::kSmemBytes,
                                    dim3(1, grid.y, 1), spread};
    detail::launch_kernel(detail::flash_decode_kernel<T, kHeadDim, kWarps, kScoreMods, true>, shape,
                          stream, params);
  } else {
    prepare<T, kHeadDim, kWarps, kScoreMods, false>();
    const detail::LaunchShape shape{grid, dim3(Cfg::kThreads, 1, 1), Cfg::kSmemBytes};
    detail::launch_kernel(detail::flash_decode_kernel<T, kHeadDim, kWarps, kScoreMods, false>,
                          shape, stream, params);
  }
}

// The instantiation for (head_dim, warps, score modifiers); wide CTAs exist at head_dim <= 128
// (the plan's rule).
template <typename T, bool kScoreMods>
void launch_instance(std::int64_t head_dim, int warps, const FlashDecodeParams& params,
                     const dim3& grid, bool cluster_merge, bool spread, Stream stream) {
  const bool wide = warps == detail::kWideWarps;
  switch (head_dim) {
    case 64:
      return wide ? launch<T, 64, detail::kWideWarps, kScoreMods>(params, grid, cluster_merge,
                                                                  spread, stream)
                  : launch<T, 64, detail::kNarrowWarps, kScoreMods>(params, grid, cluster_merge,
                                                                    spread, stream);
    case 128:
      return wide ? launch<T, 128, detail::kWideWarps, kScoreMods>(params, grid, cluster_merge,
                                                                   spread, stream)
                  : launch<T, 128, detail::kNarrowWarps, kScoreMods>(params, grid, cluster_merge,
                                                                     spread, stream);
    default:
      return launch<T, 256, detail::kNarrowWarps, kScoreMods>(params, grid, cluster_merge, spread,
                                                              stream);
  }
}
template <typename T>
void launch_instance(std::int64_t head_dim, int warps, const FlashDecodeParams& params,
                     const dim3& grid, bool cluster_merge, bool spread, Stream stream) {
  if (params.softcap > 0.0f || params.alibi != nullptr)
    launch_instance<T, true>(head_dim, warps, params, grid, cluster_merge, spread, stream);
  else
    launch_instance<T, false>(head_dim, warps, params, grid, cluster_merge, spread, stream);
}

}  // namespace

FlashDecodePlan plan_flash_decode(std::int64_t batch, std::int64_t num_qo_heads,
                                  std::int64_t num_kv_heads, std::int64_t q_len,
                                  std::int64_t head_dim, std::int64_t capacity,
                                  std::int64_t max_live_k_len, int sm_count, int warps,
                                  int cluster_merge, std::int64_t single_split_bytes) {
  SPLICE_INTERNAL_CHECK(batch > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0 &&
                            q_len > 0 && sm_count > 0,
                        "plan_flash_decode needs validated shapes");
  if (warps != 0 && warps != kFlashDecodeWarps &&
      !(warps == kFlashDecodeWideWarps && head_dim <= 128))
    fail<ValueError>("flash_decode: warps per CTA must be 0 (the plan's rule), ", kFlashDecodeWarps,
                     " or ", kFlashDecodeWideWarps, " (head_dim <= 128), got ", warps,
                     " at head_dim ", head_dim);
  FlashDecodePlan plan;
  const std::int64_t rows = (num_qo_heads / num_kv_heads) * q_len;
  plan.row_blocks = static_cast<int>((rows + kFlashDecodeRowsPerCta - 1) / kFlashDecodeRowsPerCta);
  const std::int64_t units = batch * num_kv_heads * plan.row_blocks;
  const std::int64_t bound =
      std::clamp<std::int64_t>(max_live_k_len, 1, std::max<std::int64_t>(capacity, 1));
  plan.single_split_keys = static_cast<int>(std::max<std::int64_t>(single_split_bytes, 0) /
                                            (2 * head_dim * kFlashDecodeElementBytes));
  const std::int64_t max_useful = (bound + plan.min_chunk - 1) / plan.min_chunk;
  // Splits that fill one wave of CTAs of `width` warps.
  const auto splits_for = [&](int width) {
    if (bound <= plan.single_split_keys) return 1;
    const std::int64_t slots =
        static_cast<std::int64_t>(sm_count) * ctas_per_sm(smem_bytes(head_dim, width));
    const std::int64_t fill = std::max<std::int64_t>(1, slots / units);
    return static_cast<int>(std::clamp<std::int64_t>(
        fill, 1, std::min<std::int64_t>(max_useful, kFlashDecodeMaxSplits)));
  };
  const int wide_splits = splits_for(kFlashDecodeWideWarps);
  const bool wide_rule = head_dim <= 128 && units <= sm_count / 4 && wide_splits > 1 &&
                         bound >= kFlashDecodeWideMinKeys * wide_splits;
  plan.warps = warps != 0 ? warps : (wide_rule ? kFlashDecodeWideWarps : kFlashDecodeWarps);
  plan.ctas_per_sm = ctas_per_sm(smem_bytes(head_dim, plan.warps));
  plan.num_splits = splits_for(plan.warps);
  if (cluster_merge == -1 && warps == 0 && plan.num_splits > 1) {
    // The cluster rule (docs/perf.md runs 59-67): grids that can merge in clusters take a shape in
    // which a cluster's CTAs do not share SMs (the scheduler packs a cluster into one GPC, two
    // 4-warp CTAs to an SM when it can, and a CTA sharing its SM streams at half speed).
    if (plan.warps == kFlashDecodeWarps && units <= sm_count / 4) {
      // Short ranges of few units: at most half the SMs' worth of 4-warp CTAs.
      plan.num_splits = static_cast<int>(std::min<std::int64_t>(
          {plan.num_splits, kFlashDecodeMaxClusterSplits, sm_count / 2 / units}));
    } else if (plan.warps == kFlashDecodeWideWarps &&
               (head_dim == 128 ||
                (head_dim == 64 && bound <= kFlashDecodeWideClusterMaxKeysD64)) &&
               bound >= kFlashDecodeWideClusterMinKeys &&
               units * kFlashDecodeWideClusterSplits <= sm_count / 2 &&
               8 * units * kFlashDecodeWideClusterSplits >= 3 * sm_count) {
      // Long ranges of 3 sm_count / 64 to sm_count / 16 units (7 or 8 on the H200), head_dim 128:
      // 8 eight-warp splits, clusters the H200 holds 15 of (16-CTA ones only 7). At 8 units,
      // against 16 global-merge splits (docs/perf.md run 92): 7.71 / 11.46 / 15.51 / 19.15 us at
      // 4K / 8K / 12K / 16K against 8.47 / 12.40 / 16.79 / 20.54, 65.0 at 64K against 66.1; at
      // 3K and below the 4-warp plans win. 64 such CTAs stream ~4.4 TB/s (dev/sm_ingress), but
      // one 8-warp CTA's tile loop runs at ~66 GB/s, so a unit's 8 splits cap it near 0.5 TB/s:
      // with fewer units the grid's many global-merge splits win by far (2 units at 64K: 24.3
      // against 63.4 us), and so do they at head_dim 64 from 16K (docs/perf.md runs 79, 95:
      // (1,32,8,16K,D64) 12.11 global against 12.84; 64K 35.1 against 43.4).
      plan.num_splits = std::min(plan.num_splits, kFlashDecodeWideClusterSplits);
      // Back to back, this grid (one CTA per SM, a cluster per GPC) leaves room for all but one
      // of the next one's clusters: that one waited for this grid to finish (a straggler,
      // 20.8-24.3 us at 16K in runs 75-77, 9.0 against 7.7 at 4K in run 92). Triggering at exit
      // kept 19.2 (run 77); triggering in split 0 once every peer's partial has landed (the
      // peers have exited: only split 0's fold and store are left) hides most of the next
      // launch too, up to 16K: over five processes 4K 7.72-7.74 -> 7.37-7.39, 8K 11.39-11.52 ->
      // 11.16-11.23, 12K about equal, 16K (32, 8) 19.16-19.28 -> 19.06-19.39, (64, 8)
      // 19.60-19.73 -> 19.31-19.36; at 64K it straggled in four of them (65.0-65.6 -> 70.9-71.2,
      // run 100), so longer bounds keep the exit trigger. Earlier triggers that all CTAs pass
      // (after the CTA's K/V loop, or once a warp has issued its last tile) straggle: 19.5-23.3
      // at 16K, 71.5-71.9 at 64K (run 91). At head_dim 64 the early trigger is the faster (4K
      // 5.33 against 5.75 at exit, run 95).
      plan.trigger = head_dim != 128 ? FlashDecodeTrigger::after_wait
                     : bound <= kFlashDecodeMergeTriggerMaxKeys
                         ? FlashDecodeTrigger::merge_inputs_landed
                         : FlashDecodeTrigger::at_exit;
    } else if (head_dim <= 128 && units > sm_count / 4 && units <= sm_count / 2 &&
               8 * units * (sm_count / units) >= 7 * sm_count) {
      // A mid-size grid: one 8-warp CTA per SM, sm_count / units splits (2 or 3), where that
      // fills at least 7/8 of the SMs.
      plan.warps = kFlashDecodeWideWarps;
      plan.ctas_per_sm = ctas_per_sm(smem_bytes(head_dim, plan.warps));
      plan.num_splits = splits_for(plan.warps);
    }
  } else if (cluster_merge >= 1) {  // 1: up to the largest cluster; 2..16: up to that many splits
    plan.num_splits =
        std::min(plan.num_splits, cluster_merge == 1
                                      ? kFlashDecodeMaxClusterSplits
                                      : std::min(cluster_merge, kFlashDecodeMaxClusterSplits));
  }
  if (cluster_merge == -1 && warps == 0 && plan.warps == kFlashDecodeWarps) {
    // The tail split (header): the units past the last full wave in quarter-size pieces; the
    // late splits (header): a one-wave grid's last pieces of each unit to whichever SM is free.
    const std::int64_t slots = static_cast<std::int64_t>(sm_count) * plan.ctas_per_sm;
    const std::int64_t full_units = units / slots * slots;
    const std::int64_t unit_bytes = bound * 2 * head_dim * kFlashDecodeElementBytes;
    // The late splits: a one-wave grid with idle slots; below slots / 16 idle slots only
    // one-split plans of long units (one piece, header).
    const std::int64_t ctas = units * plan.num_splits;
    const bool few_idle = ctas > slots - slots / 16;
    const bool late =
        ctas < slots && 4 * units >= slots &&
        (few_idle ? plan.num_splits == 1 && unit_bytes >= kFlashDecodeLateFewIdleMinUnitBytes
                  : unit_bytes >= kFlashDecodeLateMinUnitBytes);
    if (plan.num_splits == 1 && unit_bytes >= kFlashDecodeTailMinUnitBytes && full_units > 0 &&
        full_units < units) {
      plan.num_splits = kFlashDecodeTailSplits;
      plan.split_from_bh = full_units / plan.row_blocks;
    } else if (late) {
      // Split 0 streams the largest whole number of pieces of n / 2^kFlashDecodeLateShift not
      // above units / slots of its unit, so it ends no later than an evenly shared grid would;
      // the rest of the unit runs in late pieces (header). With fewer than slots / 16 slots idle
      // (only long units) the pieces halve in size from n / 2^kFlashDecodeLateShift instead.
      const std::int64_t pieces = std::int64_t{1} << kFlashDecodeLateShift;
      plan.late_shift = kFlashDecodeLateShift;
      plan.late_splits =
          few_idle ? kFlashDecodeLateFewIdlePieces
                   : static_cast<int>(std::clamp<std::int64_t>(pieces - pieces * units / slots,
                                                               kFlashDecodeLateSplits, pieces - 1));
      plan.late_halving = few_idle;
      plan.num_splits = 1;
    }
  }
  const int block_rows = static_cast<int>(std::min<std::int64_t>(rows, kFlashDecodeRowsPerCta));
  if (cluster_merge != 0 && plan.split_from_bh == 0 && plan.num_splits > 1 &&
      plan.num_splits <= kFlashDecodeMaxClusterSplits &&
      cluster_merge_fits(head_dim, plan.warps, plan.num_splits, block_rows))
    plan.cluster = plan.num_splits;
  plan.grid_x = plan.row_blocks;
  plan.grid_y = plan.num_splits;
  plan.grid_z = batch * num_kv_heads;
  // Partials of the units that split (the tail split's only), every split of the late ones.
  const std::int64_t split_units = (plan.grid_z - plan.split_from_bh) * plan.grid_x;
  const std::int64_t unit_splits = plan.num_splits + plan.late_splits;
  plan.workspace_bytes = unit_splits > 1
                             ? static_cast<std::size_t>(split_units * unit_splits *
                                                        kFlashDecodeRowsPerCta * (head_dim + 1)) *
                                   sizeof(float)
                             : 0;
  return plan;
}

void set_flash_decode_dev_knobs(const FlashDecodeDevKnobs& knobs) {
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  ws.knobs = knobs;
}

FlashDecodeDevKnobs flash_decode_dev_knobs() {
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  return ws.knobs;
}

void flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                  const Tensor* alibi, const DecodeAttentionOptions& options, Tensor& out,
                  Tensor* lse, Stream stream, bool stable_prefix) {
  // Stage 1: argument checks. Devices, then the call against the CUDA contract row (the public
  // op's checks, flash_decode_checks::check_call), then this kernel's own limits.
  check_cuda_tensor(q, "q");
  check_cuda_tensor(k, "k");
  check_cuda_tensor(v, "v");
  check_cuda_tensor(k_len, "k_len");
  check_cuda_tensor(out, "out");
  if (alibi) check_cuda_tensor(*alibi, "alibi");
  if (lse) check_cuda_tensor(*lse, "lse");
  flash_decode_checks::check_call(cuda_flash_decode_contract(), q, k, v, k_len, alibi, options, out,
                                  lse);
  const std::int64_t batch = q.size(0);
  const std::int64_t num_qo_heads = q.size(1);
  const std::int64_t q_len = q.size(2);
  const std::int64_t head_dim = q.size(3);
  const std::int64_t num_kv_heads = k.size(1);
  const std::int64_t capacity = k.size(2);
  if (capacity >= kMaxLength)
    fail<ShapeError>("flash_decode: `k` capacity must be below 2^30, got ", capacity);
  if (batch * num_kv_heads > kMaxGridYZ)
    fail<ShapeError>("flash_decode: batch * num_kv_heads must be at most ", kMaxGridYZ, ", got ",
                     batch * num_kv_heads);
  if (!aligned(k, kVecElems) || !aligned(v, kVecElems))
    fail<LayoutError>(
        "flash_decode: `k` and `v` need 16-byte aligned rows (base address and "
        "strides multiples of 8 elements), got k strides ",
        dims_str(k.strides()), " and v strides ", dims_str(v.strides()));

  // Stage 2: the plan at the capacity bound.
  const FlashDecodeDevKnobs knobs = flash_decode_dev_knobs();
  const int knob_warps = head_dim <= 128 ? knobs.warps : 0;  // no wide CTAs at head_dim 256
  const FlashDecodePlan plan = plan_flash_decode(
      batch, num_qo_heads, num_kv_heads, q_len, head_dim, capacity, capacity,
      current_device_facts().sm_count, knob_warps, knobs.cluster_merge,
      knobs.single_split_bytes > 0 ? knobs.single_split_bytes : kFlashDecodeSingleSplitBytes);
  const std::int64_t max_splits =
      std::max<std::int64_t>(1, (capacity + kFlashDecodeTileKeys - 1) / kFlashDecodeTileKeys);
  const std::int64_t forced =
      std::min<std::int64_t>({options.num_splits, max_splits, kFlashDecodeMaxSplits});
  const std::int64_t units = plan.grid_x * plan.grid_z;
  // The tail split's one-split units and the late splits (a forced split count splits every
  // unit evenly instead); the knobs may set the late splits where the plan could take them.
  std::int64_t split_from_bh = forced > 0 ? 0 : plan.split_from_bh;
  std::int64_t base_splits = std::max<std::int64_t>(plan.grid_y, forced);
  const FlashDecodeLateLaunch late = flash_decode_late_launch(plan, forced, knobs);
  const int late_splits = late.splits;
  if (late.from_knob) {
    // A tail-split plan gives its tail split up for the late splits (one split a unit).
    split_from_bh = 0;
    base_splits = 1;
  }
  // Splits per unit: the grid's y dimension, or its z dimension under the late splits.
  const std::int64_t grid_y = base_splits + late_splits;
  const std::int64_t split_units = units - split_from_bh * plan.grid_x;

  // Stage 3: workspace (partials and counters of the units that split), params, launch.
  const std::size_t partial_rows =
      static_cast<std::size_t>(split_units * grid_y * kFlashDecodeRowsPerCta);
  const std::size_t partial_bytes =
      grid_y > 1 ? partial_rows * static_cast<std::size_t>(head_dim + 1) * sizeof(float) : 0;
  ensure_workspace(static_cast<std::size_t>(split_units), partial_bytes, stream);
  Workspace& ws = workspace();

  FlashDecodeParams p{};
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.out = out.raw_data();
  p.lse = lse ? lse->data<float>() : nullptr;
  p.k_len = k_len.data<std::int32_t>();
  p.alibi = alibi ? alibi->data<float>() : nullptr;
  p.counters = ws.counters;
  p.partial_lse = ws.partials;
  p.partial_o = ws.partials ? ws.partials + partial_rows : nullptr;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.q_stride_s = q.stride(2);
  p.k_stride_b = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.k_stride_s = k.stride(2);
  p.v_stride_b = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.v_stride_s = v.stride(2);
  p.o_stride_b = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.o_stride_s = out.stride(2);
  if (lse) {
    p.lse_stride_b = lse->stride(0);
    p.lse_stride_h = lse->stride(1);
    p.lse_stride_s = lse->stride(2);
  }
  p.k_len_stride = k_len.size(0) == 1 ? 0 : static_cast<int>(k_len.stride(0));
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.group = static_cast<int>(num_qo_heads / num_kv_heads);
  p.q_len = static_cast<int>(q_len);
  p.rows = static_cast<int>(p.group * q_len);
  p.q_len_shift = std::bit_width(static_cast<std::uint64_t>(q_len - 1));  // ceil(log2 q_len)
  p.q_len_mul = static_cast<unsigned>(((std::uint64_t{1} << (31 + p.q_len_shift)) + q_len - 1) /
                                      static_cast<std::uint64_t>(q_len));
  p.capacity = static_cast<int>(capacity);
  p.forced_splits = static_cast<int>(forced);
  p.min_chunk = plan.min_chunk;
  p.single_split_keys = plan.single_split_keys;
  p.split_from_bh = static_cast<int>(split_from_bh);
  p.late_splits = late_splits;
  p.late_shift = late.shift;
  p.late_halving = late.halving ? 1 : 0;
  // The head plan (kernel stages 1-2): without a left window every split's warp w streams keys
  // [16 (W split + w), + 16) first whatever k_len is, so without the stable prefix they are
  // issued before k_len lands. Wasted copies (a k_len short of the head region) read at most
  // 16 W keys per CTA and call: free in a one-wave grid, which is latency-bound, but bandwidth in
  // a multi-wave one, so only one-wave grids take it; a forced split count (split-invariance
  // tests) keeps contiguous splits. Under the late splits the split 0s are the one wave: only
  // they speculate (their first tiles are those keys), and the late pieces plan as before.
  const std::int64_t slots =
      static_cast<std::int64_t>(current_device_facts().sm_count) * plan.ctas_per_sm;
  const std::int64_t first_wave = late_splits > 0 ? units : units * grid_y;
  p.head_plan = !options.window_left && forced == 0 && first_wave <= slots ? 1 : 0;
  p.dev_drop = knobs.drop_stages & (detail::kDropMerge | detail::kDropKv);
  static_assert(static_cast<int>(FlashDecodeTrigger::after_wait) == detail::kTriggerAfterWait &&
                static_cast<int>(FlashDecodeTrigger::at_exit) == detail::kTriggerAtExit &&
                static_cast<int>(FlashDecodeTrigger::merge_inputs_landed) ==
                    detail::kTriggerMergeInputsLanded);
  p.trigger = knobs.trigger >= 0 ? knobs.trigger : static_cast<int>(plan.trigger);
  if (p.dev_drop & detail::kDropKv) p.head_plan = 0;
  // The cluster merge needs the plan's split count in the grid (a forced count may raise it) and
  // the merge itself (the attribution knob may drop it).
  const bool cluster_merge =
      plan.cluster > 1 && grid_y == plan.grid_y && !(p.dev_drop & detail::kDropMerge);
  // Only the 4-warp global-merge instances compile the tail and late splits (kernel stage 2).
  SPLICE_INTERNAL_CHECK((p.split_from_bh == 0 && p.late_splits == 0) ||
                            (plan.warps == kFlashDecodeWarps && !cluster_merge),
                        "flash_decode: a tail or late split needs the 4-warp global-merge kernel");
  // The promise supersedes speculation (kernel stage 0'). The 8-warp cluster grids (the long
  // ranges at small batch) do not use it: back to back they were 0.9-1.3 us slower with it at
  // 4K-64K keys (perf.md run 132: (1,32,8,4K) 8.36 against 7.36 us), while the 4-warp grids
  // gained 0.5-0.65 us (1K, the SmolLM2 shape).
  p.stable_prefix =
      stable_prefix && !(cluster_merge && plan.warps == kFlashDecodeWideWarps) ? 1 : 0;
  const auto clamp_window = [&](const std::optional<std::int64_t>& w) {
    return w ? static_cast<int>(std::min<std::int64_t>(*w, kMaxLength)) : -1;
  };
  p.window_left = clamp_window(options.window_left);
  p.window_right = clamp_window(options.window_right);
  p.causal = options.causal ? 1 : 0;
  p.q_vec16 = aligned(q, kVecElems) ? 1 : 0;
  p.o_vec8 = aligned(out, kHalfVecElems) ? 1 : 0;
  p.softmax_scale = options.softmax_scale != 0.0f
                        ? options.softmax_scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.scale_log2 = p.softmax_scale * detail::kLog2e;
  p.softcap = options.softcap ? *options.softcap : 0.0f;

  // Late splits: (row block, unit, split), so that every unit's split 0 dispatches first.
  const dim3 grid = late_splits > 0
                        ? dim3(static_cast<unsigned>(plan.grid_x),
                               static_cast<unsigned>(plan.grid_z), static_cast<unsigned>(grid_y))
                        : dim3(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(grid_y),
                               static_cast<unsigned>(plan.grid_z));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (stable_prefix) g_stable_prefix_launches.fetch_add(1, std::memory_order_relaxed);
  if (q.dtype() == DType::bf16)
    launch_instance<__nv_bfloat16>(head_dim, plan.warps, p, grid, cluster_merge,
                                   knobs.cluster_spread, stream);
  else
    launch_instance<__half>(head_dim, plan.warps, p, grid, cluster_merge, knobs.cluster_spread,
                            stream);
}

FlashDecodeLaunches flash_decode_launches() {
  return {g_launches.load(std::memory_order_relaxed),
          g_stable_prefix_launches.load(std::memory_order_relaxed),
          g_cluster_launches.load(std::memory_order_relaxed)};
}

}  // namespace splice::cuda
