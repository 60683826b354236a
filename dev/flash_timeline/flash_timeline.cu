// dev/flash_timeline: where a B = 1 flash-decode call's time goes, every CTA, back to back
// (issue #5: (1, 32, 8) at 4K reads 7.36 us where 16.8 MB of K/V take 3.8 us at 4.4 TB/s).
//
// Builds flash_decode_kernel.cuh with SPLICE_KERNEL_STAMPS and SPLICE_KERNEL_STAMPS_EVERY_CTA
// (launch.cuh: thread 0 of every CTA stores {%gridid, %globaltimer, mark | cta | smid} at each
// mark) and launches the plan's instance for B = 1, (32, 8), head_dim 128 from 4K to 16K keys the
// way flash_decode.cu does: 8 eight-warp splits per kv head in clusters of 8, the cluster merge,
// speculative split 0, the next call let in once split 0 holds every partial
// (FlashDecodeTrigger::merge_inputs_landed), programmatic dependent launch. As the bench does
// (bench/cuda/flash_decode_cuda_bench.cu), one CUDA graph holds one call per input set, the sets
// (K, V, q, out) rotating over >= 512 MB so the L2 does not flatter, k_len one shared int.
//
// Per k_len it prints: the replay's time per call (CUDA events, median of 20 replays after 50 ms
// of warm replays; stamps on, so compare with the bench's number), the output's largest error
// against a float64 reference (units of 2e-2 + 2e-2 |ref|), then, from one stamped replay, each
// mark's time after the call's first wait return, the earliest / median / latest CTA (each the
// median over the replay's calls but the first and last), split 0 and the peers apart, and the
// hand-off to the next call. With `-v`, every CTA of the middle call.
//
//   flash_timeline [-v] [--batch B] [--warps 4|8] [--splits S] [--cluster 0|1] [--sets N]
//                 [--head 0|1] [--split-from U] [--late L [--shift S]] [K_LEN ...]
//
// (defaults: the B = 1 plan above, --batch 1 --warps 8 --splits 8 --cluster 1; k_len 4096 16384).
// Other plans: e.g. issue 5's large points, `--batch 128 --warps 4 --splits 1 --cluster 0 4096`
// (1024 one-split 4-warp CTAs, two to an SM, in 3.9 waves: the head plan only in one-wave grids,
// as flash_decode.cu rules). Multi-split grids without clusters merge through the global
// workspace. Every run also prints the active CTAs over the call's span (20 bins: how full the
// GPU is at the end of a multi-wave grid).
//
// --sets N takes at least N input sets (2: no replay starts on the K/V the last one read);
// --head 0|1 forces the head plan off or on (its speculative tile 0 in a multi-wave one-split
// grid); --split-from U streams units below U in one split and the rest in --splits (mainline's
// tail split, FlashDecodeParams::split_from_bh: 4-warp CTAs without clusters; first measured
// as dev/flash-tail-split.patch, perf.md run 211); --late L [--shift S] runs mainline's late
// splits (FlashDecodeParams::late_splits: with --splits 1 --cluster 0 --warps 4, a grid of
// (1, unit, 1 + L), L pieces of n / 2^S keys a unit after its split 0; the rule's 64K one-wave
// grids: --batch 32 --warps 4 --splits 1 --cluster 0 --late 1 65536).
//
// Built with -DFLASH_TIMELINE_NO_STAMPS the kernel compiles as mainline does and only the time
// per call and the error are printed: the A/B build for kernel variants (a variant header first
// on the include path, -I/tmp/variant before -Isrc). The stamps build's extra code costs ~0.6 us
// at 4K and ~2 us at 16K, so read its marks for shape, and time variants without stamps.
//
// Build (here, nvcc 13, ~1 min): nvcc -O3 -DNDEBUG -DSPLICE_WITH_CUDA=1 -arch=sm_90a -std=c++20
//   --expt-relaxed-constexpr -Iinclude -Isrc -o .gpubin/flash_timeline
//   dev/flash_timeline/flash_timeline.cu
#ifndef FLASH_TIMELINE_NO_STAMPS
#define SPLICE_KERNEL_STAMPS 1
#define SPLICE_KERNEL_STAMPS_EVERY_CTA 1
#endif
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "../../bench/cuda/bench_util.cuh"  // fill_random, time_replays
#include "../experiment_util.cuh"           // CHECK, bf, download
#include "backend/cuda/flash_decode_kernel.cuh"
// clang-format off: flash_case.cuh needs the kernel header first
#include "../flash_case.cuh"  // Case, Buffers, params_for
// clang-format on

namespace splice::cuda::kernel_stamps {
namespace {
void (*g_setter)(Stamp*, std::uint64_t) = nullptr;
}
void register_unit(void (*set_ring)(Stamp*, std::uint64_t)) { g_setter = set_ring; }
void note_launch(const void*, void*) {}
#ifdef FLASH_TIMELINE_NO_STAMPS
// A build without stamps (-DFLASH_TIMELINE_NO_STAMPS): the kernel as mainline compiles it, timed
// only (the stamps build's extra code costs ~0.6 us at 4K and ~2 us at 16K: compare like with
// like).
[[maybe_unused]] const bool g_no_ring = (
    g_setter = [](Stamp*, std::uint64_t) {}, true);
#endif
}  // namespace splice::cuda::kernel_stamps

namespace {

namespace kd = splice::cuda::detail;
using splice::cuda::kernel_stamps::Stamp;
using T = __nv_bfloat16;

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;
constexpr std::size_t kRingSlots = std::size_t{1} << 22;  // 64 grids of 4096 CTA slots x 16 marks
constexpr std::size_t kRotateBytes = std::size_t{512} << 20;
#ifdef FLASH_TIMELINE_NO_STAMPS
constexpr bool kStamped = false;
#else
constexpr bool kStamped = true;
#endif
constexpr int kSmCount = 132;  // H200 (the one-wave rule of the head plan)

// The launch: flash_decode.cu's plan for the shape, given here rather than derived.
struct Plan {
  int batch = 1, warps = 8, splits = 8;
  bool cluster = true;
  int min_sets = 1;    // --sets: at least this many input sets (2: no set read twice in a row)
  int head = -1;       // --head 0|1: the head plan forced off / on (-1: flash_decode.cu's rule)
  int split_from = 0;  // --split-from U: units below U in one split (the tail split)
  int late = 0;        // --late L: the late splits (L pieces a unit after split 0; --splits 1)
  int late_shift = 4;  // --shift S: late pieces of n / 2^S keys (flash_decode.h's rule: 4)
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The marks shown, in time order (kernel_stamps.h 0-1, flash_decode_kernel.cuh 2-14).
struct MarkRow {
  unsigned mark;
  const char* name;
};
const MarkRow kRows[] = {
    {1, "arrival (before the wait)"},
    {0, "wait returned"},
    {kd::kMarkPlanned, "k_len landed, planned"},
    {kd::kMarkQReady, "q ready (ring prologue issued)"},
    {kd::kMarkFirstTile, "warp 0: tile 0 done"},
    {kd::kMarkTile2Waited, "warp 0: tile 1 landed"},
    {kd::kMarkLoopDone, "warp 0: loop done"},
    {kd::kMarkWarpsDone, "all warps' loops done"},
    {kd::kMarkScratch, "warp-merge scratch written"},
    {kd::kMarkStored, "partial stored / sent"},
    {kd::kMarkMergeLanded, "split 0: peers' partials landed"},
    {kd::kMarkMerged, "split 0: merged output stored"},
};

struct CtaMarks {
  double t[16];
  bool has[16];
  int sm = -1;
};

template <int kWarps, bool kCluster>
void run(const Plan& plan, int k_len, bool verbose) {
  using Cfg = kd::FlashDecodeConfig<kHeadDim, kWarps>;
  const int kSplits = plan.splits;
  // Splits a unit: the grid's y, or its z under the late splits (grid (1, unit, split)).
  const int unit_splits = kSplits + plan.late;
  const std::size_t batch_kv = static_cast<std::size_t>(kKvHeads) * k_len * kHeadDim;
  const std::size_t batch_q = static_cast<std::size_t>(kKvHeads) * kGroup * kHeadDim;
  const std::size_t kv_elems = batch_kv * plan.batch;  // one set
  const std::size_t q_elems = batch_q * plan.batch;
  const int sets =
      std::max(plan.min_sets,
               static_cast<int>(std::clamp<std::size_t>(kRotateBytes / (2 * kv_elems * 2), 1, 64)));
  T *k_pool, *v_pool, *q_pool, *out_pool;
  int* k_len_dev;
  CHECK(cudaMalloc(&k_pool, sets * kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&v_pool, sets * kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&q_pool, sets * q_elems * sizeof(T)));
  CHECK(cudaMalloc(&out_pool, sets * q_elems * sizeof(T)));
  CHECK(cudaMalloc(&k_len_dev, sizeof(int)));
  CHECK(cudaMemcpy(k_len_dev, &k_len, sizeof k_len, cudaMemcpyHostToDevice));
  splice::bench::fill_random<<<1024, 256>>>(k_pool, sets * kv_elems, 11u);
  splice::bench::fill_random<<<1024, 256>>>(v_pool, sets * kv_elems, 22u);
  splice::bench::fill_random<<<64, 256>>>(q_pool, sets * q_elems, 33u);
  CHECK(cudaDeviceSynchronize());

  flash_case::Buffers b;  // per-batch element counts: params_for's batch strides
  b.q_elems = batch_q;
  b.kv_elems = batch_kv;
  b.k_len = k_len_dev;
  const flash_case::Case c{kKvHeads, kGroup, kHeadDim, k_len, false, kSplits};
  kd::FlashDecodeParams base = flash_case::params_for(c, b);
  // flash_decode.cu's rules: the cluster grid's trigger up to 16K keys, the head plan in one-wave
  // grids, the global merge's workspace for split grids without clusters.
  base.trigger = k_len <= 16384 ? kd::kTriggerMergeInputsLanded : kd::kTriggerAtExit;
  const int units = plan.batch * kKvHeads;
  // (under the late splits the split 0s are the one wave, and only they speculate)
  const int first_wave = plan.late > 0 ? units : units * kSplits;
  base.head_plan = first_wave <= kSmCount * (kWarps == 8 ? 1 : 2) ? 1 : 0;
  if (plan.head >= 0) base.head_plan = plan.head;
  base.split_from_bh = plan.split_from;
  base.late_splits = plan.late;
  base.late_shift = plan.late_shift;
  if (!kCluster && unit_splits > 1) {
    const std::size_t rows = static_cast<std::size_t>(units) * unit_splits * 16;
    CHECK(cudaMalloc(&base.partial_lse, rows * sizeof(float)));
    CHECK(cudaMalloc(&base.partial_o, rows * kHeadDim * sizeof(float)));
    CHECK(cudaMalloc(&base.counters, units * sizeof(unsigned)));
    CHECK(cudaMemset(base.counters, 0, units * sizeof(unsigned)));
  }

  auto kernel = kd::flash_decode_kernel<T, kHeadDim, kWarps, false, kCluster>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto launch = [&](int set) {
    kd::FlashDecodeParams p = base;
    p.q = q_pool + set * q_elems;
    p.out = out_pool + set * q_elems;
    p.k = k_pool + set * kv_elems;
    p.v = v_pool + set * kv_elems;
    cudaLaunchConfig_t config{};
    config.gridDim = plan.late > 0 ? dim3(1, units, unit_splits) : dim3(1, kSplits, units);
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attrs[2]{};
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = 1;
    attrs[1].val.clusterDim.y = kSplits;
    attrs[1].val.clusterDim.z = 1;
    config.attrs = attrs;
    config.numAttrs = kCluster ? 2 : 1;
    CHECK(cudaLaunchKernelEx(&config, kernel, p));
  };

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  for (int i = 0; i < sets; ++i) launch(i);
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < sets; ++i) launch(i);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  // Timing as the bench's: 50 ms of warm replays, then 20 timed ones (the ring is not set yet, so
  // a stamps build stamps nothing here, but runs its extra code).
  const double us_per_call = splice::bench::time_replays(exec, stream, 3, 20, sets, 50.0).median_us;

  // One stamped replay into a cleared ring.
  Stamp* ring = nullptr;
  CHECK(cudaMalloc(&ring, kRingSlots * sizeof(Stamp)));
  CHECK(cudaMemset(ring, 0, kRingSlots * sizeof(Stamp)));
  splice::cuda::kernel_stamps::g_setter(ring, kRingSlots - 1);
  CHECK(cudaGraphLaunch(exec, stream));  // one replay: its calls are told apart by grid id
  CHECK(cudaStreamSynchronize(stream));
  splice::cuda::kernel_stamps::g_setter(nullptr, 0);
  const std::vector<Stamp> got = experiment::download(ring, kRingSlots);
  CHECK(cudaFree(ring));

  // Output of set 0's sequence 0 against float64.
  const auto kh = experiment::download(reinterpret_cast<std::uint16_t*>(k_pool), batch_kv);
  const auto vh = experiment::download(reinterpret_cast<std::uint16_t*>(v_pool), batch_kv);
  const auto qh = experiment::download(reinterpret_cast<std::uint16_t*>(q_pool), batch_q);
  const auto oh = experiment::download(reinterpret_cast<std::uint16_t*>(out_pool), batch_q);
  double worst = 0.0;
  for (int h = 0; h < kKvHeads * kGroup; ++h) {
    const std::size_t kv0 = static_cast<std::size_t>(h / kGroup) * k_len * kHeadDim;
    std::vector<double> s(k_len);
    double big = -INFINITY;
    for (int j = 0; j < k_len; ++j) {
      double dot = 0.0;
      for (int d = 0; d < kHeadDim; ++d)
        dot += experiment::bf(qh[h * kHeadDim + d]) * experiment::bf(kh[kv0 + j * kHeadDim + d]);
      s[j] = dot / std::sqrt(static_cast<double>(kHeadDim));
      big = std::max(big, s[j]);
    }
    double sum = 0.0;
    for (double& x : s) sum += (x = std::exp(x - big));
    for (int d = 0; d < kHeadDim; ++d) {
      double ref = 0.0;
      for (int j = 0; j < k_len; ++j) ref += s[j] * experiment::bf(vh[kv0 + j * kHeadDim + d]);
      ref /= sum;
      const double err = std::abs(experiment::bf(oh[h * kHeadDim + d]) - ref);
      worst = std::max(worst, err / (2e-2 + 2e-2 * std::abs(ref)));
    }
  }

  // Stamps by call (grid id) and CTA (linear index = split + 8 kv_head).
  std::map<std::uint64_t, std::map<int, CtaMarks>> calls;
  std::uint64_t min_step = ~0ull;
  for (const Stamp& s : got) {
    if (s.grid_id == 0) continue;
    const unsigned mark = s.mark & 0xffu, cta = (s.mark >> 8) & 0xfffu, sm = (s.mark >> 20) & 0xffu;
    if (mark >= 16 || s.ns == 0) continue;
    CtaMarks& m = calls[s.grid_id][static_cast<int>(cta)];
    m.t[mark] = static_cast<double>(s.ns);
    m.has[mark] = true;
    m.sm = static_cast<int>(sm);
  }
  std::vector<std::uint64_t> ids;
  for (const auto& [id, ctas] : calls) ids.push_back(id);
  // A CTA's split from its linear index (stamps: x + gridDim.x (y + gridDim.y z)).
  const auto split_of = [&](int cta) { return plan.late > 0 ? cta / units : cta % kSplits; };
  // t0 of a call: its earliest wait return; end: split 0's latest merged store.
  const auto t0_of = [&](std::uint64_t id) {
    double t = INFINITY;
    for (const auto& [cta, m] : calls[id])
      if (m.has[0]) t = std::min(t, m.t[0]);
    return t;
  };
  // A CTA's end: its merged output (a cluster merge's split 0), else its output or partial.
  const auto cta_end = [](const CtaMarks& m) {
    return m.has[kd::kMarkMerged] ? m.t[kd::kMarkMerged]
                                  : (m.has[kd::kMarkStored] ? m.t[kd::kMarkStored] : -INFINITY);
  };
  const auto end_of = [&](std::uint64_t id) {
    double t = -INFINITY;
    for (const auto& [cta, m] : calls[id]) t = std::max(t, cta_end(m));
    return t;
  };
  for (const auto& [id, ctas] : calls)
    for (const auto& [cta, m] : ctas)
      for (int a = 0; a < 16; ++a)
        for (int z = 0; z < 16; ++z)
          if (m.has[a] && m.has[z] && m.t[a] > m.t[z])
            min_step =
                std::min<std::uint64_t>(min_step, static_cast<std::uint64_t>(m.t[a] - m.t[z]));

  std::printf(
      "\n(%d,32,8,%d,128), %d-warp CTAs, %d split(s) + %d late of n / 2^%d, %s merge, head plan "
      "%s: %d sets, %zu calls stamped, %.2f us per call (median of 20 replays), max err %.3f of "
      "tolerance, smallest stamp step %llu ns\n",
      plan.batch, k_len, kWarps, kSplits, plan.late, plan.late_shift,
      kCluster ? "cluster" : "global", base.head_plan ? "on" : "off", sets, ids.size(), us_per_call,
      worst, static_cast<unsigned long long>(min_step));
  // A graph of one call (one input set) replays with the same grid id: its one stamped replay is
  // analysed alone; otherwise the calls but the first and last.
  const std::size_t first_call = ids.size() >= 3 ? 1 : 0;
  const std::size_t end_call = ids.size() >= 3 ? ids.size() - 1 : ids.size();
  if (ids.empty()) return;
  // Per row: over the calls analysed, the median of (earliest, median, latest CTA) of the mark
  // minus the call's t0; split 0 and the peers apart.
  std::printf("%-34s %8s %8s %8s | %8s %8s   (us after the call's first wait return)\n", "mark",
              "first", "median", "last", "split 0", "peers");
  for (const MarkRow& row : kRows) {
    std::vector<double> lo, mid, hi, s0, peers;
    for (std::size_t i = first_call; i < end_call; ++i) {
      const double t0 = t0_of(ids[i]);
      std::vector<double> all, zero, rest;
      for (const auto& [cta, m] : calls[ids[i]]) {
        if (!m.has[row.mark]) continue;
        const double us = (m.t[row.mark] - t0) / 1000.0;
        all.push_back(us);
        (split_of(cta) == 0 ? zero : rest).push_back(us);
      }
      if (all.empty()) continue;
      lo.push_back(*std::min_element(all.begin(), all.end()));
      mid.push_back(median(all));
      hi.push_back(*std::max_element(all.begin(), all.end()));
      if (!zero.empty()) s0.push_back(median(zero));
      if (!rest.empty()) peers.push_back(median(rest));
    }
    std::printf("%-34s %8.2f %8.2f %8.2f | %8.2f %8.2f\n", row.name, median(lo), median(mid),
                median(hi), median(s0), median(peers));
  }
  std::vector<double> period, gap, early;
  for (std::size_t i = 1; i + 2 < ids.size(); ++i) {
    period.push_back((t0_of(ids[i + 1]) - t0_of(ids[i])) / 1000.0);
    gap.push_back((t0_of(ids[i + 1]) - end_of(ids[i])) / 1000.0);
    double first_arrival = INFINITY;
    for (const auto& [cta, m] : calls[ids[i + 1]])
      if (m.has[1]) first_arrival = std::min(first_arrival, m.t[1]);
    early.push_back((first_arrival - end_of(ids[i])) / 1000.0);
  }
  std::printf(
      "call period (t0 to next t0) %.2f us; last merged store -> next call's first wait "
      "return %.2f us, -> its first CTA's arrival %.2f us (medians)\n",
      median(period), median(gap), median(early));
  {
    // The middle call's active CTAs (arrived, not yet ended) at the middles of 20 equal bins of
    // its span, from its first arrival to its last end.
    const std::uint64_t id = ids[ids.size() / 2];
    double first = INFINITY, last = -INFINITY;
    for (const auto& [cta, m] : calls[id]) {
      if (m.has[1]) first = std::min(first, m.t[1]);
      last = std::max(last, cta_end(m));
    }
    std::printf("active CTAs over the middle call's %.2f us (20 bins):", (last - first) / 1000.0);
    for (int bin = 0; bin < 20; ++bin) {
      const double at = first + (bin + 0.5) * (last - first) / 20.0;
      int active = 0;
      for (const auto& [cta, m] : calls[id])
        if (m.has[1] && m.t[1] <= at && cta_end(m) > at) ++active;
      std::printf(" %d", active);
    }
    std::printf("\n");
    // The start and the drain of a multi-wave grid: the first wave's ramp (its CTAs' median
    // first tile), the last arrival, then when the CTAs running after it end (quartiles), and the
    // active-CTA integral over the span against all slots busy throughout.
    std::vector<double> ends, first_tiles;
    double last_arrival = -INFINITY, busy = 0.0;
    for (const auto& [cta, m] : calls[id]) {
      if (!m.has[1] || !std::isfinite(cta_end(m))) continue;  // (a split with no keys exits)
      last_arrival = std::max(last_arrival, m.t[1]);
      busy += cta_end(m) - m.t[1];
      if (m.t[1] < first + 1000.0 && m.has[kd::kMarkFirstTile])
        first_tiles.push_back((m.t[kd::kMarkFirstTile] - first) / 1000.0);
    }
    for (const auto& [cta, m] : calls[id])
      if (m.has[1] && cta_end(m) > last_arrival) ends.push_back((cta_end(m) - first) / 1000.0);
    std::sort(ends.begin(), ends.end());
    const int slots = kSmCount * (kWarps == 8 ? 1 : 2);
    if (!ends.empty())
      std::printf(
          "first wave's median tile 0 done %.2f us; last arrival %.2f us; the %zu CTAs running "
          "after it end at %.2f / %.2f / %.2f / %.2f us (quartiles, last); busy %.1f%% of %d "
          "slots x span\n",
          median(first_tiles), (last_arrival - first) / 1000.0, ends.size(), ends[ends.size() / 4],
          ends[ends.size() / 2], ends[3 * ends.size() / 4], ends.back(),
          100.0 * busy / (slots * (last - first)), slots);
  }
  if (verbose) {
    const std::uint64_t id = ids[ids.size() / 2];
    const double t0 = t0_of(id);
    std::printf("call %zu, every CTA (us after t0; - = no stamp):\n%5s %5s %4s", ids.size() / 2,
                "cta", "split", "sm");
    for (const MarkRow& row : kRows) std::printf(" %6u", row.mark);
    std::printf("\n");
    for (const auto& [cta, m] : calls[id]) {
      std::printf("%5d %5d %4d", cta, split_of(cta), m.sm);
      for (const MarkRow& row : kRows) {
        if (m.has[row.mark])
          std::printf(" %6.2f", (m.t[row.mark] - t0) / 1000.0);
        else
          std::printf(" %6s", "-");
      }
      std::printf("\n");
    }
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  for (void* ptr :
       {static_cast<void*>(k_pool), static_cast<void*>(v_pool), static_cast<void*>(q_pool),
        static_cast<void*>(out_pool), static_cast<void*>(k_len_dev)})
    CHECK(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  Plan plan;
  std::vector<int> k_lens;
  for (int i = 1; i < argc; ++i) {
    const auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (std::strcmp(argv[i], "-v") == 0)
      verbose = true;
    else if (std::strcmp(argv[i], "--batch") == 0)
      plan.batch = value();
    else if (std::strcmp(argv[i], "--warps") == 0)
      plan.warps = value();
    else if (std::strcmp(argv[i], "--splits") == 0)
      plan.splits = value();
    else if (std::strcmp(argv[i], "--cluster") == 0)
      plan.cluster = value() != 0;
    else if (std::strcmp(argv[i], "--sets") == 0)
      plan.min_sets = value();
    else if (std::strcmp(argv[i], "--head") == 0)
      plan.head = value();
    else if (std::strcmp(argv[i], "--split-from") == 0)
      plan.split_from = value();
    else if (std::strcmp(argv[i], "--late") == 0)
      plan.late = value();
    else if (std::strcmp(argv[i], "--shift") == 0)
      plan.late_shift = value();
    else
      k_lens.push_back(std::atoi(argv[i]));
  }
  if (plan.batch < 1 || (plan.warps != 4 && plan.warps != 8) || plan.splits < 1 ||
      plan.splits > 16 || (plan.cluster && plan.splits < 2) || plan.late < 0 ||
      (plan.late > 0 && (plan.splits != 1 || plan.cluster || plan.warps != 4)) ||
      (kStamped && plan.batch * kKvHeads * (plan.splits + plan.late) > 4096)) {
    std::fprintf(stderr,
                 "need --batch >= 1, --warps 4 or 8, 1 <= --splits <= 16 (>= 2 with --cluster 1), "
                 "--late only with --splits 1 --cluster 0 --warps 4, and (stamps builds: a CTA's "
                 "stamp holds 12 bits of its index) batch x 8 x "
                 "splits <= 4096 CTAs\n");
    return 2;
  }
  if (k_lens.empty()) k_lens = {4096, 16384};
  for (int k_len : k_lens) {
    if (plan.warps == 8)
      plan.cluster ? run<8, true>(plan, k_len, verbose) : run<8, false>(plan, k_len, verbose);
    else
      plan.cluster ? run<4, true>(plan, k_len, verbose) : run<4, false>(plan, k_len, verbose);
  }
  return 0;
}
