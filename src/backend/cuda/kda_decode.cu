// The CUDA fused KDA decode launcher (splice/backend/cuda/kda_decode.h): variant choice, kernel
// parameters and launch. The kernels are in kda_decode.cuh (the per-head kernel and the stages
// every kernel shares) and kda_decode_stream.cuh (the stream kernels).
//
//  1. Checks the layout guarantees of KdaDecodeArgs it relies on (internal errors: the op layer
//     validated them) and that every tensor is on the current CUDA device.
//  2. Chooses the variant (choose_kda_variant) unless one is forced, and whether the state can be
//     moved in 16-byte vectors (base pointer and slot stride 16-byte aligned) or element-wise
//     (then `stream`, whose copy engine needs alignment, falls back to `wide`); `stream` also
//     stages the precompute's inputs through the copy engine when every input vector is 16-byte
//     aligned (else it reads them from device memory, as `stream_plain` always does). `stream`
//     also falls back to `wide` when its compiled kernel cannot be placed on an SM (registers x
//     threads per sub-partition, shared memory; checked once, reason under SPLICE_DEBUG).
//  3. Fills the POD Params (pointers, element strides, scalars) and launches: one grid of
//     slices * H * units CTAs for the per-head variants (split variants as thread-block clusters
//     of `slices` CTAs), or min(items, SMs) persistent CTAs for `stream` (bf16 T <= 8: the
//     kernel with the precompute warp group, 384 threads; else the 8-warp kernel), all through
//     cudaLaunchKernelEx with the PDL attribute when launch.cuh's pdl_enabled() and the stream is
//     not the legacy default stream (every kda kernel waits before its first global access).
//     Nothing is read back from the device. `stream` launches whose source states exceed twice
//     the L2 mark the state's bytes with L2 priorities (wants_l2_hints). Params.tune carries
//     the dev-only KdaTuneBits (kda_tune(): SPLICE_KDA_TUNE or set_kda_tune()), `stream`'s
//     schedule knobs for A/B runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/kda_decode_rows.cuh"
#include "backend/cuda/kda_decode_stream.cuh"
#include "backend/cuda/launch.cuh"
#include "splice/backend/cuda/kda_decode.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/debug.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

constexpr std::size_t kVecAlign = 16;  // bytes of one state vector
constexpr int kWideThreads = 256;
constexpr int kWide512Threads = 512;  // Layout<512, 1>::kMinBlocks = 1: up to 128 registers
constexpr int kSplitThreads = 128;
constexpr std::int64_t kWideBf16MinT = 9;  // the rule: bf16 state from this T runs `wide`
constexpr std::int64_t kWide512F32MinT = 4;  // the rule: f32 near 2 SMs of items from this T
// The rule: bf16 T = 1 runs rows at every item count past its band on cards of fewer DRAM bytes
// a second per SM (the H100's 25 GB/s: rows 3.7-10.5% ahead of stream at every N of 48-512 in
// perf.md run 363's probe, 4.9 / 3.3% at N = 128 / 512 in run 361; the H200's 37: stream ahead
// by ~4.6% at N = 128, run 321).
constexpr double kRowsMaxDramBytesPerSm = 30e9;

// The stream kernels' L2 priorities (Params::l2_hints, kda_decode.cuh's l2_evict_policy): on
// when the launch's source states exceed twice the L2 (states that fit it ran slower with them),
// and not under kTuneNoL2Hints. H200, H = 32 (perf.md runs 146-149): at
// N = 512 2.7-4.1% faster at T = 1 / 2, 1.6-2.9% at T = 4 / 8; at N = 128 1.3-3.9% (bf16 T = 1
// within 0.4%); at N = 32 (bf16 33 MB, fp32 67 MB of state against 50 MB of L2) 0.1-3%
// slower, hence the bound.
template <typename StateT>
bool wants_l2_hints(const kda::Params& params) {
  const std::int64_t state_bytes = static_cast<std::int64_t>(params.num_units) * params.num_heads *
                                   kda::kD * kda::kD * sizeof(StateT);
  return (params.tune & kda::kTuneNoL2Hints) == 0 &&
         state_bytes > 2 * current_device_facts().l2_bytes;
}

// One launch of a kda kernel through launch.cuh's launcher: thread-block clusters of `cluster`
// CTAs when > 1, and the PDL attribute so the launch overlaps the predecessor's tail; every kda
// kernel waits (detail::pdl_prologue) before its first global access.
void launch_kernel_ex(void (*kernel)(kda::Params), std::int64_t blocks, int threads,
                      std::size_t smem, int cluster, const kda::Params& params,
                      cudaStream_t stream) {
  SPLICE_INTERNAL_CHECK(blocks > 0 && blocks <= 0x7fffffff, "kda grid of ", blocks, " CTAs");
  const detail::LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(threads), smem,
                                  static_cast<unsigned>(cluster)};
  detail::launch_kernel(kernel, shape, stream, params);
}

template <int kThreads, int kSlices, typename StateT, bool kVec>
void launch(const kda::Params& params, std::int64_t units, std::int64_t heads,
            cudaStream_t stream) {
  // Grid (units * kSlices, heads): a CTA reads its head from blockIdx.y and its item and slice
  // from blockIdx.x without a division by the head count. The cluster shape is the kernel's
  // compile-time __cluster_dims__ (kSlices along x), so the launch has no cluster attribute.
  SPLICE_INTERNAL_CHECK(units * kSlices <= 0x7fffffff && heads <= 65535, "kda grid of ", units,
                        " x ", kSlices, " x ", heads, " CTAs");
  const detail::LaunchShape shape{
      dim3(static_cast<unsigned>(units * kSlices), static_cast<unsigned>(heads)), dim3(kThreads), 0,
      1u};
  detail::launch_kernel(&kda::kda_decode_kernel<kThreads, kSlices, StateT, kVec>, shape, stream,
                        params);
}

// `rows`: one CTA per (head, unit), heads fastest along x.
template <typename StateT>
void launch_rows(const kda::Params& params, std::int64_t units, std::int64_t heads,
                 cudaStream_t stream) {
  SPLICE_INTERNAL_CHECK(units * heads <= 0x7fffffff, "kda rows grid of ", units, " x ", heads,
                        " CTAs");
  detail::LaunchShape shape{dim3(static_cast<unsigned>(units * heads)), dim3(kda::kRowsThreads),
                            0, 1u};
  // bf16 state: 8% shared memory (16 KB; two CTAs need ~11 KB), the rest L1, which rows' inputs
  // and conv weights read through: -3 to -4% under the promise at N = 4-16, -7 to -12% forced at
  // multi-wave N; f32 state keeps the rule's (it loses 2.5-3% with L1): perf.md runs 312, 315.
  // Inside the default model's batched step (B = 32-128) no cost beside its neighbours: run 320.
  if constexpr (std::is_same_v<StateT, __nv_bfloat16>) shape.carveout = 8;
  detail::launch_kernel(&kda::kda_decode_rows_kernel<StateT>, shape, stream, params);
}

// Whether the compiled `stream` kernel can be placed, checked once per instantiation (and its
// shared-memory opt-in set): its dynamic shared memory within the device's opt-in limit per CTA,
// and its registers within the SM's: warps are spread round-robin over kSubPartitions
// sub-partitions of regs_per_sm / kSubPartitions registers each, a warp holding
// round_up(regs, kRegAllocUnit) * 32 of them, so ceil(warps / 4) warps of one sub-partition must
// fit (the driver's maxThreadsPerBlock says the same). A kernel that does not fit falls back to
// `wide` (reason printed under SPLICE_DEBUG) instead of failing its launch.
constexpr int kSubPartitions = 4;  // warp schedulers (register file slices) per SM
constexpr int kRegAllocUnit = 8;   // registers per thread are allocated in multiples of 8

// The stream kernel of (StateT, kStage): with the precompute warp group (kWs) or not.
template <typename StateT, bool kStage, bool kWs, int kTokens = kda::kChunk>
constexpr auto stream_kernel() {
  if constexpr (kWs)
    return &kda::kda_decode_stream_ws_kernel<StateT, kStage, kTokens>;
  else
    return &kda::kda_decode_stream_kernel<StateT, kStage>;
}

template <typename StateT, bool kStage, bool kWs, int kTokens = kda::kChunk>
KdaKernelInfo probe_stream_kernel() {
  KdaKernelInfo info;
  const auto kernel = stream_kernel<StateT, kStage, kWs, kTokens>();
  info.block = kWs ? kda::kWsBlock : kda::kStreamBlock;
  info.smem_bytes = static_cast<int>(sizeof(kda::StreamSmem<StateT, kWs, kTokens>));
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  info.smem_bytes += kda::kDevScratchBytes;
#endif
  const DeviceFacts& facts = current_device_facts();
  info.smem_optin = facts.smem_optin_bytes;
  const int regs_per_sm = facts.registers_per_sm;
  cudaFuncAttributes attr{};
  SPLICE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  info.max_threads_per_block = attr.maxThreadsPerBlock;
  info.num_regs = attr.numRegs;
  info.local_bytes = static_cast<int>(attr.localSizeBytes);
  const int warps = (info.block + kda::kWarp - 1) / kda::kWarp;
  const int warps_per_sub = (warps + kSubPartitions - 1) / kSubPartitions;
  const int regs = (info.num_regs + kRegAllocUnit - 1) / kRegAllocUnit * kRegAllocUnit;
  const int sub_regs = regs_per_sm / kSubPartitions;
  if (info.smem_bytes > info.smem_optin) {
    info.reason = "needs " + std::to_string(info.smem_bytes) + " B of shared memory per CTA, " +
                  "the device admits " + std::to_string(info.smem_optin);
  } else if (info.max_threads_per_block < info.block ||
             regs * kda::kWarp * warps_per_sub > sub_regs) {
    info.reason = std::to_string(info.num_regs) + " registers x " + std::to_string(info.block) +
                  " threads: " + std::to_string(warps_per_sub) + " warps of " +
                  std::to_string(regs * kda::kWarp) + " registers on one sub-partition of " +
                  std::to_string(sub_regs) + " (kernel admits " +
                  std::to_string(info.max_threads_per_block) + " threads per CTA)";
  } else {
    SPLICE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, info.smem_bytes));
    info.launchable = true;
  }
  if (!info.launchable && debug_level() > 0) {
    std::fprintf(stderr, "splice: kda `stream`%s (%s state%s) falls back: %s\n",
                 kWs ? " with the precompute group" : "", sizeof(StateT) == 4 ? "f32" : "bf16",
                 kStage ? ", staged inputs" : "", info.reason.c_str());
  }
  return info;
}

template <typename StateT, bool kStage, bool kWs = false, int kTokens = kda::kChunk>
const KdaKernelInfo& stream_info() {
  static const KdaKernelInfo info = probe_stream_kernel<StateT, kStage, kWs, kTokens>();
  return info;
}

// stream_info of the kernel with (staged) or without staged inputs.
template <typename StateT, bool kWs, int kTokens = kda::kChunk>
const KdaKernelInfo& stream_info_of(bool staged) {
  return staged ? stream_info<StateT, true, kWs, kTokens>()
                : stream_info<StateT, false, kWs, kTokens>();
}

// The test hook's cap on the stream kernels' grid (kda_decode.h, set_kda_stream_grid_cap; 0:
// none).
std::atomic<int> g_stream_grid_cap{0};
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// (attribution) the next stream launch writes the clock64 stamps (kda_dev_stamps_reset).
std::atomic<bool> g_dev_stamps_next{false};
#endif

// A stream kernel's grid for `items` items: one persistent CTA per SM (its shared memory admits
// no second one), never more than items, nor than the test hook's cap.
std::int64_t stream_grid(std::int64_t items) {
  const int sms = current_device_facts().sm_count;
  const int cap = g_stream_grid_cap.load(std::memory_order_relaxed);
  return std::min<std::int64_t>(items, cap > 0 ? std::min(cap, sms) : sms);
}

// The fp32 precompute-group kernel's dynamic-item counters (kda_decode_stream.cuh, StreamItems): a
// pair (claims, CTAs done) per output buffer, zero between launches (a launch's last CTA resets its
// pair). Keyed by the output pointer: launches that may overlap (on different streams) write
// different outputs, or already race on the one they share, and a captured graph keeps its
// pair. One slab per device, allocated at the first need outside stream capture; without one
// (that first need during a capture, or kCounterPairs outputs seen) launches keep static items;
// a later call outside capture allocates it.
constexpr std::size_t kCounterPairs = 4096;
struct ItemCounters {
  unsigned* slab = nullptr;  // [kCounterPairs][2]
  std::unordered_map<const void*, std::size_t> pair_of;
};
std::mutex g_item_counters_mutex;
std::atomic<std::uint64_t> g_dynamic_item_launches{0};
std::map<int, ItemCounters> g_item_counters;  // by device

unsigned* item_counter_for(const void* output, cudaStream_t stream) {
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_item_counters_mutex);
  ItemCounters& c = g_item_counters[device];
  if (const auto it = c.pair_of.find(output); it != c.pair_of.end()) return c.slab + 2 * it->second;
  if (c.pair_of.size() >= kCounterPairs) return nullptr;
  if (c.slab == nullptr) {
    if (is_capturing(stream)) return nullptr;
    void* slab = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&slab, kCounterPairs * 2 * sizeof(unsigned)));
    SPLICE_CUDA_CHECK(cudaMemset(slab, 0, kCounterPairs * 2 * sizeof(unsigned)));
    c.slab = static_cast<unsigned*>(slab);
  }
  const std::size_t pair = c.pair_of.size();
  c.pair_of.emplace(output, pair);
  return c.slab + 2 * pair;
}

// Dynamic items (the fp32 precompute-group kernel): each CTA walks a quarter of its share
// statically and claims the rest, so CTAs whose items run faster take more of them. Before them
// (perf.md run 174's timeline) the CTAs' item periods at fp32 N = 128 T = 1 ranged over 3.1-4.4
// us and their last sweeps ended 144-184 us into the launch; with half static fp32 is 0.9-4.0%
// faster at N >= 128 (run 178), with a quarter another 0.6-0.8% at N = 512 and at T = 2 (run
// 181; T = 1 N = 128 level). Only with a pool of at least one item a CTA past the claims' lead
// (kStages + 5 items).
template <int kStages>
void set_dynamic_items(kda::Params& params, std::int64_t items, std::int64_t grid,
                       cudaStream_t stream) {
  params.item_counter = nullptr;
  params.static_items = 0;
  const std::int64_t share = items / grid;
  if ((params.tune & kda::kTuneStaticItems) != 0 || share < kStages + 6) return;
  params.item_counter = item_counter_for(params.out, stream);
  if (params.item_counter == nullptr) return;
  params.static_items = static_cast<int>(std::max<std::int64_t>(kStages + 5, share / 4));
  g_dynamic_item_launches.fetch_add(1, std::memory_order_relaxed);
}

template <typename StateT, bool kStage, bool kWs = false, int kTokens = kda::kChunk>
void launch_stream(const kda::Params& base_params, std::int64_t units, std::int64_t heads,
                   cudaStream_t stream) {
  constexpr int kSmem = sizeof(kda::StreamSmem<StateT, kWs, kTokens>);
  constexpr int kBlock = kWs ? kda::kWsBlock : kda::kStreamBlock;
  const std::int64_t grid = stream_grid(units * heads);
  kda::Params params = base_params;
  if constexpr (kda::dynamic_items_kernel<StateT, kWs>())
    set_dynamic_items<kda::StreamSmem<StateT, kWs, kTokens>::kStages>(params, units * heads, grid,
                                                                      stream);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
  static_assert(kSmem % 16 == 0);
  params.dev_scratch_vec = kSmem / 16;
  params.dev_stamps = g_dev_stamps_next.exchange(false) ? 1 : 0;
  launch_kernel_ex(stream_kernel<StateT, kStage, kWs, kTokens>(), grid, kBlock,
                   kSmem + kda::kDevScratchBytes, 1, params, stream);
#else
  launch_kernel_ex(stream_kernel<StateT, kStage, kWs, kTokens>(), grid, kBlock, kSmem, 1, params,
                   stream);
#endif
}

// Launches the stream kernel (kWs, kTokens; staged inputs or not) if it fits one SM.
template <typename StateT, bool kWs, int kTokens = kda::kChunk>
bool launch_stream_if_fits(bool staged, const kda::Params& params, std::int64_t units,
                           std::int64_t heads, cudaStream_t stream) {
  if (!stream_info_of<StateT, kWs, kTokens>(staged).launchable) return false;
  if (staged)
    launch_stream<StateT, true, kWs, kTokens>(params, units, heads, stream);
  else
    launch_stream<StateT, false, kWs, kTokens>(params, units, heads, stream);
  return true;
}

// The stream kernel with the precompute warp group (kda_decode_stream.cuh) for T <= kOverlapMaxT
// (8), unless kTuneNoOverlap asks for the 8-warp kernel's item loop (the A/B reference). fp32 at T
// > 1 only with >= 16 items a CTA: its 2-stage ring ramps longer, and with 8 items a CTA (N = 32)
// it lost 6% at T = 2 and 4, while from N = 128 it won 0.7-1.3% (perf.md run 133; T = 1 won at
// every N). fp32 T = 5-8 since session 22 (its stages dropped the staged taps, so the overlap's 16
// token slots fit beside them: perf.md run 166).
template <typename StateT>
bool wants_precompute_group(const kda::Params& params) {
  if (params.max_t > kda::kOverlapMaxT || (params.tune & kda::kTuneNoOverlap) != 0) return false;
  constexpr std::int64_t kMinItemsPerCta = 16;
  const std::int64_t items = static_cast<std::int64_t>(params.num_units) * params.num_heads;
  return std::is_same_v<StateT, __nv_bfloat16> || params.max_t == 1 ||
         items >= kMinItemsPerCta * stream_grid(items);
}

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % kVecAlign == 0; }
bool aligned16(std::int64_t elems, std::size_t elem_bytes) {
  return (static_cast<std::size_t>(elems) * elem_bytes) % kVecAlign == 0;
}

// Whether the copy engine can stage the precompute's inputs: every vector it copies (a head's
// 128 channels of x, conv history, gates, taps, dt_bias) starts 16-byte aligned.
bool inputs_stageable(const kda::Params& p) {
  constexpr std::size_t kBf16 = 2;
  return aligned16(p.x) && aligned16(p.x_row, kBf16) && aligned16(p.conv) &&
         aligned16(p.conv_slot, kBf16) && aligned16(p.gate) && aligned16(p.gate_row, kBf16) &&
         aligned16(p.gate_head, kBf16) && aligned16(p.out_gate) && aligned16(p.og_row, kBf16) &&
         aligned16(p.og_head, kBf16) && aligned16(p.weight) && aligned16(p.dt_bias);
}

template <typename StateT, bool kVec>
void launch_variant(KdaVariant variant, const kda::Params& base_params, std::int64_t units,
                    std::int64_t heads, cudaStream_t stream) {
  switch (variant) {
    case KdaVariant::stream:
    case KdaVariant::stream_plain:
      // The copy engine needs 16-byte aligned state (else the per-head kernel runs); the
      // precompute's inputs are staged when they are aligned too (`stream` only).
      if constexpr (kVec) {
        kda::Params params = base_params;
        params.l2_hints = wants_l2_hints<StateT>(params) ? 1 : 0;
        const bool staged = variant == KdaVariant::stream && inputs_stageable(params);
        if (wants_precompute_group<StateT>(params)) {
          // fp32 T = 1: the one-token form, whose small stages hold a ring of 3 (perf.md run
          // 170: N = 32 / 128 / 512 -3.2 / -0.3 / -0.7% against the 2-stage ring).
          if constexpr (std::is_same_v<StateT, float>) {
            if (params.max_t == 1 &&
                launch_stream_if_fits<StateT, true, 1>(staged, params, units, heads, stream))
              return;
          }
          if (launch_stream_if_fits<StateT, true>(staged, params, units, heads, stream)) return;
        }
        // The 8-warp kernel; with unstaged inputs where its staged form does not fit.
        if (launch_stream_if_fits<StateT, false>(staged, params, units, heads, stream)) return;
        if (staged && launch_stream_if_fits<StateT, false>(false, params, units, heads, stream))
          return;
      }
      [[fallthrough]];
    case KdaVariant::rows:
      // T = 1 with 16-byte aligned state, inputs and output (its vector loads and stores).
      if constexpr (kVec) {
        if (variant == KdaVariant::rows && base_params.max_t == 1 &&
            inputs_stageable(base_params) && aligned16(base_params.out)) {
          launch_rows<StateT>(base_params, units, heads, stream);
          return;
        }
      }
      [[fallthrough]];
    case KdaVariant::wide:
      launch<kWideThreads, 1, StateT, kVec>(base_params, units, heads, stream);
      return;
    case KdaVariant::wide512:
      launch<kWide512Threads, 1, StateT, kVec>(base_params, units, heads, stream);
      return;
    case KdaVariant::split2:
      launch<kSplitThreads, 2, StateT, kVec>(base_params, units, heads, stream);
      return;
    case KdaVariant::split4:
      launch<kSplitThreads, 4, StateT, kVec>(base_params, units, heads, stream);
      return;
    case KdaVariant::automatic:
      break;
  }
  SPLICE_INTERNAL_CHECK(false, "kda variant not resolved");
}

// The dev-only schedule knob (kda_decode.h): -1 until read from SPLICE_KDA_TUNE at the first
// use or set by set_kda_tune().
std::atomic<long long> g_tune{-1};
static_assert(kda::kTuneNoOverlap == kKdaTuneNoOverlap &&
                  kda::kTuneNoL2Hints == kKdaTuneNoL2Hints &&
                  kda::kTuneStaticItems == kKdaTuneStaticItems &&
                  kda::kTuneDevDropCheckpoints == kKdaTuneDevDropCheckpoints &&
                  kda::kTuneDevDropSweepMath == kKdaTuneDevDropSweepMath &&
                  kda::kTuneDevCheckpointsToShared == kKdaTuneDevCheckpointsToShared &&
                  kda::kTuneDevTruncatePack == kKdaTuneDevTruncatePack &&
                  kda::kTuneDevDropPrecompute == kKdaTuneDevDropPrecompute &&
                  kda::kTuneDevDropNorms == kKdaTuneDevDropNorms &&
                  kda::kTuneDevDropButterflies == kKdaTuneDevDropButterflies,
              "kernel and header tune bits agree");
// The bits a launch may carry: the attribution bits only in a dev attribution build.
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
constexpr unsigned kTuneMask = kKdaTuneAll | kKdaTuneDevDropCheckpoints | kKdaTuneDevDropSweepMath |
                               kKdaTuneDevCheckpointsToShared | kKdaTuneDevTruncatePack |
                               kKdaTuneDevDropPrecompute | kKdaTuneDevDropNorms |
                               kKdaTuneDevDropButterflies;
#else
constexpr unsigned kTuneMask = kKdaTuneAll;
#endif

void check_cuda(const Tensor& t, const char* name, int device) {
  SPLICE_INTERNAL_CHECK(!t.defined() || (t.device().is_cuda() && t.device().index == device),
                        "cuda::kda_decode: `", name, "` is on ", t.device().str());
}

}  // namespace

KdaKernelInfo kda_stream_kernel_info(DType state_dtype, bool staged_inputs,
                                     KdaStreamKernel kernel) {
  SPLICE_INTERNAL_CHECK(state_dtype == DType::f32 || state_dtype == DType::bf16, "state dtype ",
                        dtype_name(state_dtype));
  if (kernel == KdaStreamKernel::precompute_group_one_token) {
    if (state_dtype != DType::f32)
      fail<ValueError>("kda_stream_kernel_info: the one-token precompute-group kernel exists for ",
                       "f32 state only, got ", dtype_name(state_dtype));
    return stream_info_of<float, true, 1>(staged_inputs);
  }
  const bool f32 = state_dtype == DType::f32;
  if (kernel == KdaStreamKernel::precompute_group)
    return f32 ? stream_info_of<float, true>(staged_inputs)
               : stream_info_of<__nv_bfloat16, true>(staged_inputs);
  return f32 ? stream_info_of<float, false>(staged_inputs)
             : stream_info_of<__nv_bfloat16, false>(staged_inputs);
}

#ifdef SPLICE_KDA_DEV_ATTRIBUTION
void kda_dev_stamps_reset() {
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  void* stamps = nullptr;
  SPLICE_CUDA_CHECK(cudaGetSymbolAddress(&stamps, kda::g_kda_dev_stamps));
  SPLICE_CUDA_CHECK(cudaMemset(stamps, 0xff, sizeof(kda::g_kda_dev_stamps)));
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  g_dev_stamps_next.store(true);
}
void kda_dev_timeline_reset() {
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  void* p = nullptr;
  SPLICE_CUDA_CHECK(cudaGetSymbolAddress(&p, kda::g_kda_dev_timeline));
  SPLICE_CUDA_CHECK(cudaMemset(p, 0xff, sizeof(kda::g_kda_dev_timeline)));
  SPLICE_CUDA_CHECK(cudaGetSymbolAddress(&p, kda::g_kda_dev_timeline_ticket));
  SPLICE_CUDA_CHECK(cudaMemset(p, 0, sizeof(kda::g_kda_dev_timeline_ticket)));
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
}
KdaDevTimeline kda_dev_timeline() {
  static_assert(KdaDevTimeline::kSlots == kda::kTimelineSlots &&
                KdaDevTimeline::kCtas == kda::kTimelineCtas &&
                KdaDevTimeline::kItems == kda::kTimelineItems &&
                KdaDevTimeline::kFields == kda::kTimelineFields);
  KdaDevTimeline out;
  out.raw.resize(sizeof(kda::g_kda_dev_timeline) / sizeof(long long));
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  SPLICE_CUDA_CHECK(cudaMemcpyFromSymbol(out.raw.data(), kda::g_kda_dev_timeline,
                                         sizeof(kda::g_kda_dev_timeline)));
  return out;
}
std::vector<long long> kda_dev_stamps() {
  std::vector<long long> out(sizeof(kda::g_kda_dev_stamps) / sizeof(long long));
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  SPLICE_CUDA_CHECK(
      cudaMemcpyFromSymbol(out.data(), kda::g_kda_dev_stamps, sizeof(kda::g_kda_dev_stamps)));
  return out;
}
#endif

unsigned kda_tune() {
  long long v = g_tune.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("SPLICE_KDA_TUNE");
    v = env != nullptr ? static_cast<long long>(std::strtoul(env, nullptr, 10) & kTuneMask) : 0;
    g_tune.store(v, std::memory_order_relaxed);
    if (v != 0 && debug_level() > 0)
      std::fprintf(stderr, "splice: kda dev knob SPLICE_KDA_TUNE=%lld\n", v);
  }
  return static_cast<unsigned>(v);
}

void set_kda_tune(unsigned bits) {
  g_tune.store(static_cast<long long>(bits & kTuneMask), std::memory_order_relaxed);
}

void set_kda_stream_grid_cap(int ctas) {
  if (ctas < 0) fail<ValueError>("set_kda_stream_grid_cap: `ctas` must be >= 0, got ", ctas);
  g_stream_grid_cap.store(ctas, std::memory_order_relaxed);
}

std::uint64_t kda_dynamic_item_launches() {
  return g_dynamic_item_launches.load(std::memory_order_relaxed);
}

const char* kda_variant_name(KdaVariant variant) {
  switch (variant) {
    case KdaVariant::automatic:
      return "automatic";
    case KdaVariant::stream:
      return "stream";
    case KdaVariant::stream_plain:
      return "stream_plain";
    case KdaVariant::wide:
      return "wide";
    case KdaVariant::wide512:
      return "wide512";
    case KdaVariant::rows:
      return "rows";
    case KdaVariant::split2:
      return "split2";
    case KdaVariant::split4:
      return "split4";
  }
  return "?";
}

KdaVariant choose_kda_variant(std::int64_t units, std::int64_t heads, std::int64_t max_t,
                              DType state_dtype, int sm_count, double dram_bytes_per_s) {
  // The rule's table, from the H200 run of dev/kda_b (2026-11-30, every variant forced at H = 32,
  // 132 SMs; us per call, the rule's pick marked *; a "~" pick is the run's fastest forced
  // variant whose name the summary did not print, inferred: split4's own T series 5.47 / 7.18 /
  // 10.52 us at f32 N = 1 T = 1 / 2 / 4 extrapolates to T = 8 at 17.2; at bf16 N = 8 T = 1
  // split4 ran ~20 us in run 7 and stream 11.91, leaving wide. The next run confirms them.):
  //   band (items = units x heads)  state T    pick     measured points
  //   items <= SMs/4                any   any  split4   N=1 T=1 f32 5.47* bf16 4.93*; T=8 f32
  //                                                     17.17~ (stream 19.99), bf16 T=4/8
  //                                                     9.90/16.45~ (stream 10.54/17.06)
  //   SMs/2 <= items < SMs          any   any  wide512  (session 39, perf.md run 292, N=4: bf16
  //                                                     T=1/2/4/8 5.58/6.90/10.01/16.83 against
  //                                                     wide's 6.19/7.61/11.07/18.73; f32
  //                                                     6.83/8.89/14.08/24.43 against stream's
  //                                                     8.49/10.98/17.28/28.03)
  //   SMs <= items < 2 SMs          f32   any  wide     N=8 T=1 15.20 stream (split2 17.59), T=2/4/8
  //                                                     19.75/29.73/51.42 stream (T = 1: rows
  //                                                     and T > 1: wide since, below)
  //                                 bf16  any  wide     N=8 T=1 10.49~ (split2 11.01, stream
  //                                                     11.91), T=2 12.50*, T=4/8 19.09/31.94~
  //                                                     (stream 20.77/34.33)
  //   items >= 2 SMs                bf16  >8   wide     (unmeasured: T = 8's old band kept)
  //                                 otherwise  stream   every other point; bf16 T=8 N=32/128/512
  //                                                     119.49/453.73/1746.53* (wide 122.59/
  //                                                     474.69/1772.54; perf.md run 109)
  // T = 1 first (session 40, perf.md run 298, under the stable-state promise a decode step gives,
  // us against the band's pick below; N at H = 32):
  //   SMs/4 < items < 8 SMs         bf16  1    rows     N=3/4/6/8 4.47/4.69/8.10/8.61 (wide512
  //                                                     4.94/5.35, wide 8.45/9.53); N=12 +2.2%
  //                                                     then (-7.3% since session 41, below)
  //                                 f32   1    rows     N=6/8 10.79/12.25 (stream 11.36/13.24)
  //                                                     but not SMs/2 <= items < SMs: N=4 +5.6%,
  //                                                     N=3 -2.3% against wide512
  //   N=2 (no promise): rows bf16 4.22, f32 5.14 against split4's 4.94 / 5.87; N=1 split4 (3.73
  //   against rows' 4.4, run 295's probe).
  // Session 41 (perf.md run 305, rows with its transposed row sums, under the promise): bf16
  // rows also from 2 SMs to 4 SMs of items (N=12/16 12.50/14.89 against stream's 13.48/16.18;
  // N=24/32 +2.9/+8.4%, stream stays); f32 rows loses from N=12 (+1.5 to +10.5%), its band stays;
  // N=1 rows +4.4% (bf16) / +6.0% (f32) against split4.
  // and T > 1 from SMs/4 to SMs/2 items (N = 2), perf.md runs 300-301, under the promise, T = 2 /
  // 4 / 8: bf16 wide 5.99 / 8.68 / 14.64 (split4 7.09 / 10.89 / 18.61), f32 wide512 6.31 / 9.84 /
  // 16.67 (split4 8.32 / 12.50 / 21.22); split4 stays at and below SMs/4 (N = 1; it held every
  // items < SMs/2 until session 40).
  // Session 44 (perf.md runs 328 and 334, rows with its 8% carveout since session 43, under the
  // promise, 5 rounds): bf16 rows up to 8 SMs of items: N=20/24/28/32 17.65/20.02/23.20/25.68
  // against stream's 18.47/20.88/23.54/25.94 (-4.4/-4.1/-1.4/-1.0%); without the promise N=32
  // rows 26.29 against 28.08 (run 328).
  // Session 49 (perf.md run 356, no promise): f32 T > 1 in SMs <= items < 2 SMs moved from stream
  // to wide, which session 39's one-pass per-head sweep made 17-26% faster at fp32: N=8 T=2/4/8
  // wide 18.36/28.68/48.10 (again as `rows`, which falls through to wide at T > 1: 18.39/28.69/
  // 47.89) against stream's 20.44/30.96/50.67 (-10/-7/-5%); wide512 19.08/27.94/47.30 is level
  // at T >= 4 but takes two waves of CTAs anywhere in the band (wide fits one wave of 2 SMs).
  // Under the stable-state promise (run 359), which takes 5-10% off stream and nothing off wide:
  // -7.4 to +0.9% at N=5-8 (level at N=5-6 T=2, +0.7/+0.9% at N=6/8 T=4).
  // Session 50: f32 T >= 4 from 7/4 SMs to 2 SMs of items (N = 8 at H = 32) runs wide512, whose
  // two waves of one CTA an SM are nearly full there, where wide's one wave of two CTAs an SM
  // runs each head slower: N=8 T=4/8 wide512 27.77/47.37 against wide's 28.63/47.99 (run 358),
  // 27.71/47.17 against 28.47/48.12 under the promise (run 359), and on an H100 34.41/58.58
  // against 35.42/61.65 (run 361): -1.3 to -5.0%. Not at T = 2 (wide 18.52 against 18.89), nor
  // at N = 5-6 (wide ahead by 0.8-4.2%: wide512's second wave is half empty there); crossing at
  // N ~ 7 by linear interpolation (unmeasured), bf16 wide best at every point (runs 358, 361).
  // Session 52: on cards of under kRowsMaxDramBytesPerSm (the H100) bf16 T = 1 past 8 SMs of
  // items runs rows too: N=48/64/128/512 43.17/55.51/105.47/400.34 against stream's
  // 44.87/62.22/110.96/414.08 (perf.md run 366; 3.1-10.5% in run 363's probe); the H200 keeps
  // stream (83.34 against rows' 87.33 at N=128, run 321).
  // (stream falls back to `wide` for state that is not 16-byte aligned; rows to `wide` for state,
  // inputs or output that are not.)
  // Until run 109 bf16 T >= 8 ran `wide` (run 7: 115.70/425.89/1641.44 against stream's
  // 121.09/453.82/1740.38); the stream kernel has since gained more than `wide` at T = 8. Between
  // the measured points the bands are a guess.
  const std::int64_t items = units * heads;
  const std::int64_t sms = sm_count;
  const bool bf16 = state_dtype == DType::bf16;
  const bool f32_wide512_band = !bf16 && 2 * items >= sms && items < sms;
  const bool rows_everywhere =
      bf16 && dram_bytes_per_s > 0 && dram_bytes_per_s < kRowsMaxDramBytesPerSm * sms;
  const std::int64_t rows_end =  // the first item count past rows
      rows_everywhere ? std::numeric_limits<std::int64_t>::max() : bf16 ? 8 * sms : 2 * sms;
  if (max_t == 1 && 4 * items > sms && items < rows_end && !f32_wide512_band)
    return KdaVariant::rows;
  if (4 * items <= sms) return KdaVariant::split4;
  if (2 * items < sms) return bf16 ? KdaVariant::wide : KdaVariant::wide512;
  if (items < sms) return KdaVariant::wide512;
  if (items < 2 * sms)
    return !bf16 && max_t >= kWide512F32MinT && 4 * items >= 7 * sms ? KdaVariant::wide512
                                                                     : KdaVariant::wide;
  if (bf16 && max_t >= kWideBf16MinT) return KdaVariant::wide;
  return KdaVariant::stream;
}

void kda_decode(const KdaDecodeArgs& args) {
  kda_decode(args, current_stream(), KdaVariant::automatic);
}

void kda_decode(const KdaDecodeArgs& args, Stream stream, KdaVariant variant) {
  // Stage 1: what the kernel relies on (validated by the op layer).
  SPLICE_INTERNAL_CHECK(args.head_dim == kda::kD, "head_dim ", args.head_dim);
  SPLICE_INTERNAL_CHECK(args.state_dtype == DType::f32 || args.state_dtype == DType::bf16,
                        "state dtype ", dtype_name(args.state_dtype));
  SPLICE_INTERNAL_CHECK(args.hist_len == args.max_t + 2, "hist_len ", args.hist_len);
  const int device = args.x.device().index;
  check_cuda(args.x, "x", device);
  check_cuda(args.weight, "weight", device);
  check_cuda(args.conv_state, "conv_state", device);
  check_cuda(args.raw_gate, "raw_gate", device);
  check_cuda(args.raw_beta, "raw_beta", device);
  check_cuda(args.A_log, "A_log", device);
  check_cuda(args.dt_bias, "dt_bias", device);
  check_cuda(args.state_indices, "state_indices", device);
  check_cuda(args.state, "state", device);
  check_cuda(args.output_gate, "output_gate", device);
  check_cuda(args.norm_weight, "norm_weight", device);
  check_cuda(args.output, "output", device);
  check_cuda(args.query_start_loc, "query_start_loc", device);
  check_cuda(args.num_accepted_tokens, "num_accepted_tokens", device);
  check_cuda(args.row_slots, "row_slots", device);
  const bool per_row = args.mode != KdaMode::packed;
  SPLICE_INTERNAL_CHECK(!per_row || args.row_slots.defined(), "row_slots missing");
  SPLICE_INTERNAL_CHECK(
      per_row || (args.query_start_loc.defined() && args.num_accepted_tokens.defined()),
      "packed metadata missing");

  // Stage 2: variant and vector width.
  const std::int64_t units = per_row ? args.num_rows : args.num_seqs;
  const std::int64_t heads = args.num_heads;
  if (variant == KdaVariant::automatic) {
    const DeviceFacts& facts = current_device_facts();
    variant = choose_kda_variant(units, heads, args.max_t, args.state_dtype, facts.sm_count,
                                 facts.dram_bytes_per_s);
  }
  const std::size_t elem = dtype_size(args.state_dtype);
  const auto base = reinterpret_cast<std::uintptr_t>(args.state.raw_data());
  const bool vec = base % kVecAlign == 0 &&
                   (args.state.size(0) == 1 ||
                    (static_cast<std::size_t>(args.state.stride(0)) * elem) % kVecAlign == 0);

  // Stage 3: parameters and launch.
  kda::Params p{};
  p.x = args.x.data<std::uint16_t>();
  p.x_row = args.x.stride(0);
  p.weight = args.weight.data<float>();
  p.conv = args.conv_state.data<std::uint16_t>();
  p.conv_slot = args.conv_state.stride(0);
  p.gate = args.raw_gate.data<std::uint16_t>();
  p.gate_row = args.raw_gate.stride(0);
  p.gate_head = args.raw_gate.stride(1);
  p.beta = args.raw_beta.data<std::uint16_t>();
  p.beta_row = args.raw_beta.stride(0);
  p.beta_head = args.raw_beta.stride(1);
  p.a_log = args.A_log.data<float>();
  p.dt_bias = args.dt_bias.data<float>();
  p.norm_weight = args.norm_weight.data<float>();
  p.state = args.state.raw_data();
  p.state_slot = args.state.stride(0);
  p.out_gate = args.output_gate.data<std::uint16_t>();
  p.og_row = args.output_gate.stride(0);
  p.og_head = args.output_gate.stride(1);
  p.out = args.output.data<std::uint16_t>();
  p.state_indices = per_row ? nullptr : args.state_indices.data<std::int32_t>();
  p.row_slots = per_row ? args.row_slots.data<std::int32_t>() : nullptr;
  p.qsl = per_row ? nullptr : args.query_start_loc.data<std::int32_t>();
  p.nat = per_row ? nullptr : args.num_accepted_tokens.data<std::int32_t>();
  p.num_units = static_cast<int>(units);
  p.num_heads = static_cast<int>(heads);
  p.num_rows = static_cast<int>(args.num_rows);
  p.max_t = static_cast<int>(args.max_t);
  p.num_slots = static_cast<int>(args.num_slots);
  p.channels = static_cast<int>(args.channels);
  p.use_lower_bound = args.lower_bound.has_value() ? 1 : 0;
  p.lower_bound = args.lower_bound.value_or(0.0f);
  p.norm_eps = args.norm_eps;
  p.tune = kda_tune();
  p.stable_state = args.stable_state ? 1 : 0;

  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (args.state_dtype == DType::f32) {
    if (vec)
      launch_variant<float, true>(variant, p, units, heads, s);
    else
      launch_variant<float, false>(variant, p, units, heads, s);
  } else {
    if (vec)
      launch_variant<__nv_bfloat16, true>(variant, p, units, heads, s);
    else
      launch_variant<__nv_bfloat16, false>(variant, p, units, heads, s);
  }
}

}  // namespace splice::cuda
