// Benchmark of the CUDA fused KDA decode kernel (issue 6: the H200), against its bandwidth floor
// and FLA's Triton path (timed in the same run by bench/peers/kda_peers.py).
//
//  1. Shapes: H = 32, D = 128, fp32 and bf16 state, N in {1, 8, 32, 128, 512}, T in {1, 2, 4, 8};
//     every sequence verifies L = T tokens, num_accepted_tokens random in [1, T], all T
//     checkpoints live (the floor's "one checkpoint write per token").
//  2. Floor bytes = source state read (N H D^2 s) + T checkpoint writes (T N H D^2 s) + inputs and
//     outputs (x, raw_gate, raw_beta, output_gate, output, conv history read + write, params),
//     over the card's copy bandwidth (bytes read + written), measured at the start of the run
//     (bench::measure_copy_bandwidth: 4.24 TB/s on the H200, design.md; ~3.0 on the H100) unless
//     KDA_BENCH_COPY_TBPS pins it (4.24: issue 6's own yardstick on the H200).
//  3. Timing: G launches over G disjoint slot sets (so the state working set is >= 400 MB and the
//     50 MB L2 cannot flatter small N) captured in one CUDA graph; the graph is replayed after
//     warm-up, each replay timed with CUDA events; time per launch = median replay / G.
//  4. Every variant (stream, stream_plain, wide, wide512, rows, split2, split4) is timed; the
//     table reports the automatic choice. A/B configurations are timed beside them and printed as
//     "A/B" lines (and JSON fields): `chosen_nopdl` = the chosen variant launched without PDL (N <=
//     8; every other time is with PDL unless SPLICE_PDL=0: the launches of one graph then overlap
//     their predecessor's tail); `chosen_stable` = the chosen variant under the stable-state
//     promise (KdaDecodeArgs::stable_state, what a decode step launches; consecutive launches use
//     disjoint slot sets, so the promise holds), also the table's `stable` column.
//  5. Dev A/B of the `stream` kernel's schedule knob (cuda::KdaTuneBits, dev/kda_b/): with
//     KDA_BENCH_TUNES=1 (kKdaTuneNoOverlap: bf16 T <= 8 on the 8-warp item loop instead of the
//     precompute-group kernel), 256 (kKdaTuneNoL2Hints: no L2 priorities) or 512
//     (kKdaTuneStaticItems: the fp32 precompute-group kernel without dynamic items) the `stream`
//     variant is also timed with each listed bit mask (set_kda_tune), printed as "A/B" lines, a
//     decision table (us and % of the floor per mask) and the JSON field "stream_tune_us"; the main
//     table and "stream_us" keep the default.
//  6. Output check (every timed configuration): after its timing, one more launch of set 0, and
//     its last sequence (rows (N - 1) T .., slots (N - 1) T + 1 ..) against the CPU kernel run
//     on a copy of what that launch read: conv history bit for bit, output and state
//     checkpoints within FlashInfer's tolerances (issue 6: output rtol 3e-2 / atol 2e-2, state
//     rtol 3e-2 / atol 2e-3; the tests hold splice to tighter ones). A failure prints CHECK
//     FAILED with the configuration and the bench exits 1: a variant or a dev/ patch that is
//     fast but wrong shows in its own timing run.
// Prints the table last; writes JSON to argv[1] (default kda_decode_cuda_bench.json). argv[2], if
// given, is the peers' text file ("<dtype> <N> <T> <fla_us> <fla_recurrent_us> [<flashinfer_us>]"
// per line, -1 where a peer was not timed; FlashInfer's fused_kda_decode runs T = 1 only).
// Environment: KDA_BENCH_QUICK (T in {1, 4}), KDA_BENCH_NS / KDA_BENCH_TS (comma lists),
// KDA_BENCH_STATES (comma list of state dtypes, f32 and/or bf16, in that order; default
// bf16,f32),
// KDA_BENCH_VARIANTS (comma list of variant names to time; the rule's pick is always timed),
// KDA_BENCH_TUNES (comma list of tune masks, above), KDA_BENCH_MIN_SETS (at least this many
// launches G per graph, default 2 (1 before session 17): back-to-back launches that overlap their
// neighbours' ramps through PDL, as inside a decode step, instead of one launch per replay at
// large N; the stable-state promise needs a neighbour to show anything), KDA_BENCH_WARM_MS
// (untimed replays of each graph before its timed ones, at least this many ms; default 50: with
// 3 warm-up replays alone the first configurations after a dtype switch read 8-10% slow, perf.md
// runs 134-142), KDA_BENCH_GRID_CAP (at most this many CTAs a stream launch), KDA_BENCH_COLD (a
// 256 KB code flush, bench::flush_code, before every launch and its own time subtracted: each
// launch with its code cold, as in a decode step; perf.md run 343; read it at small launches only:
// beside a data-heavy launch the flush's own time changes and the subtraction fails, run 376),
// KDA_BENCH_STABLE (every timed
// variant also under the stable-state promise: a line per shape and the JSON's "stable_us";
// without it only the pick's, the `stable` column), SPLICE_PDL=0
// (every launch without PDL), SPLICE_KDA_TUNE (the default tune mask
// of every launch). In a SPLICE_KDA_DEV_ATTRIBUTION build also KDA_BENCH_STAMPS (per-phase clock64
// stamps of two CTAs) and KDA_BENCH_TIMELINE (every CTA's %globaltimer timeline over 4 launches
// back to back: print_timeline; KDA_BENCH_TIMELINE=stable also under the stable-state promise).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "splice/backend/cpu/kda_decode.h"
#include "splice/backend/cuda/kda_decode.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/tolerance.h"
#include "splice/ops/kda_decode.h"

namespace {

using splice::bench::to_host;

constexpr int kH = 32;
constexpr int kD = 128;
constexpr double kTargetWorkingSet = 400.0 * (1 << 20);  // bytes of state per graph replay
constexpr int kMaxSets = 64;
constexpr int kWarmup = 3;
constexpr int kReplays = 21;
constexpr int kMaxNoPdlN = 8;  // N up to which the chosen variant is also timed without PDL

__device__ float hash_uniform(std::uint64_t i, std::uint32_t seed) {
  std::uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;  // [-1, 1)
}
__global__ void fill_f32(float* p, std::int64_t n, float scale, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = scale * hash_uniform(i, seed);
}
__global__ void fill_bf16(__nv_bfloat16* p, std::int64_t n, float scale, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(scale * hash_uniform(i, seed));
}

void* dalloc(std::size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void fill(float* p, std::int64_t n, float scale, std::uint32_t seed) {
  fill_f32<<<1024, 256>>>(p, n, scale, seed);
  BENCH_CHECK(cudaGetLastError());
}
void fill(__nv_bfloat16* p, std::int64_t n, float scale, std::uint32_t seed) {
  fill_bf16<<<1024, 256>>>(p, n, scale, seed);
  BENCH_CHECK(cudaGetLastError());
}

// Bench options from the environment (main reads them once).
struct Options {
  std::vector<std::string> variants;  // variant names timed (the rule's pick always)
  std::vector<unsigned> tunes;        // tune masks timed for `stream` as A/B
  int min_sets = 2;                   // at least this many launches per graph
  double warm_ms = 50.0;              // untimed replays of each graph, at least this long
  bool cold = false;  // KDA_BENCH_COLD: bench::flush_code before every launch, its time subtracted
  bool stable_all = false;    // KDA_BENCH_STABLE: every timed variant also under the promise
  double copy_bandwidth = 0;  // bytes/s (read + written): the floor's yardstick on this card
};

struct Result {
  std::string dtype;
  int n = 0, t = 0, sets = 0;
  double floor_bytes = 0, floor_us = 0;
  std::map<std::string, double> variant_us;
  std::map<std::string, double> stable_us;  // variant_us's variants under the promise (if asked)
  std::map<std::string, double> ab_us;      // A/B configurations (not in the table's `best`)
  std::string chosen;
  double us = 0;
  double fla_us = -1, fla_rec_us = -1, flashinfer_us = -1;
};

// Every variant the bench times, in its timing order, and the one a name (kda_variant_name) names.
constexpr splice::cuda::KdaVariant kVariants[] = {
    splice::cuda::KdaVariant::stream, splice::cuda::KdaVariant::stream_plain,
    splice::cuda::KdaVariant::wide,   splice::cuda::KdaVariant::wide512,
    splice::cuda::KdaVariant::rows,   splice::cuda::KdaVariant::split2,
    splice::cuda::KdaVariant::split4};
splice::cuda::KdaVariant variant_of(const std::string& name) {
  for (auto v : kVariants)
    if (name == splice::cuda::kda_variant_name(v)) return v;
  std::fprintf(stderr, "kda bench: no variant named %s\n", name.c_str());
  std::exit(2);
}

// One shape's peer timings (bench/peers/kda_peers.py), us; -1 where not timed.
struct PeerTimes {
  double fla = -1, fla_recurrent = -1, flashinfer = -1;
};

splice::Tensor borrow(void* p, const splice::Dims& shape, splice::DType dt,
                      splice::Dims strides = {}) {
  return splice::Tensor::borrow(p, shape, dt, std::move(strides), splice::Device::cuda());
}

// Configurations whose output check failed (6); main exits 1 when there are any.
int g_check_failures = 0;

#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// (attribution build, KDA_BENCH_STAMPS set) one more `stream` launch (bf16 T <= 8: the
// precompute-group kernel) with its clock64 stamps (kda_decode.cuh, dev_stamp): per warp, the
// mean cycles of each phase of an item over items 4 .. 59 of CTAs 0 and 66, and the whole item.
// Sweep warps 0-7: p1 wait for the precompute, p2 state and history into registers, p3 barrier
// X, p4 the refill's copies, p5 write-back and sweep, p6 arrival. Precompute warps 8-11: p1 the
// next item's precompute (and the taps two items ahead), p2 -, p3 a metadata batch, p4 wait for
// the sweep, p5 the norms, p6 -.
void print_stamps(const splice::KdaDecodeArgs& args, cudaStream_t stream, int N, int T) {
  splice::cuda::kda_dev_stamps_reset();
  splice::cuda::kda_decode(args, stream, splice::cuda::KdaVariant::stream);
  const std::vector<long long> st = splice::cuda::kda_dev_stamps();
  constexpr int kItems = 64, kWarps = 12, kPoints = 7;
  auto at = [&](int c, int k, int w, int pt) {
    return st[((static_cast<std::size_t>(c) * kItems + k) * kWarps + w) * kPoints + pt];
  };
  for (int c = 0; c < 2; ++c) {
    std::printf(
        "  stamps N=%d T=%d cta %d (cycles): warp     p1     p2     p3     p4     p5     p6"
        "   item\n",
        N, T, c == 0 ? 0 : 66);
    for (int w = 0; w < kWarps; ++w) {
      double sum[kPoints] = {};
      int n = 0;
      for (int k = 4; k < 60; ++k) {
        if (at(c, k + 1, w, 0) < 0 || at(c, k, w, 6) < 0) continue;
        for (int pt = 0; pt + 1 < kPoints; ++pt) sum[pt] += at(c, k, w, pt + 1) - at(c, k, w, pt);
        sum[kPoints - 1] += at(c, k + 1, w, 0) - at(c, k, w, 0);
        ++n;
      }
      if (n == 0) continue;
      std::printf("  stamps N=%d T=%d cta %d %20d", N, T, c == 0 ? 0 : 66, w);
      for (int pt = 0; pt < kPoints; ++pt) std::printf(" %6.0f", sum[pt] / n);
      std::printf("\n");
    }
  }
}
#endif

#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// (attribution build, KDA_BENCH_TIMELINE set) 4 `stream` launches back to back (sets 0 .. 3 mod
// G) with the precompute-group kernel's %globaltimer timeline (kda_decode.h, KdaDevTimeline);
// for launches 2-4, in us from the launch's first CTA entry: the previous launch's last norm,
// then min / median / max over the CTAs of their entry, prologue end, item 0's stage landed and
// its precompute done, its state in registers, the last sweep's end, the norm warp's exit; the
// per-CTA item period (first to last sweep end); and
// the timer's finest step seen. `label` follows "launch k" (e.g. the launches' promise).
void print_timeline(const std::vector<splice::KdaDecodeArgs>& args, cudaStream_t stream, int N,
                    int T, const char* label) {
  using TL = splice::cuda::KdaDevTimeline;
  splice::cuda::kda_dev_timeline_reset();
  for (int i = 0; i < TL::kSlots; ++i)
    splice::cuda::kda_decode(args[i % args.size()], stream, splice::cuda::KdaVariant::stream);
  const TL tl = splice::cuda::kda_dev_timeline();
  long long step = 1LL << 62;
  for (int slot = 1; slot < TL::kSlots; ++slot) {
    std::vector<int> ctas;
    for (int c = 0; c < TL::kCtas; ++c)
      if (tl.at(slot, c, TL::entry) >= 0 && tl.at(slot, c, TL::norm_exit) >= 0) ctas.push_back(c);
    if (ctas.empty()) {
      std::printf("  timeline N=%d T=%d launch %d: no stamps (not the precompute-group kernel)\n",
                  N, T, slot + 1);
      return;
    }
    long long t0 = 1LL << 62, prev_end = -1;
    for (int c : ctas) t0 = std::min(t0, tl.at(slot, c, TL::entry));
    for (int c = 0; c < TL::kCtas; ++c)
      prev_end = std::max(prev_end, tl.at(slot - 1, c, TL::norm_exit));
    auto items_of = [&](int c) {  // the CTA's items with stamps
      return static_cast<int>(std::min<long long>(tl.at(slot, c, TL::count), TL::kItems));
    };
    auto stats = [&](auto value) {  // min / median / max over the CTAs, us from t0
      std::vector<double> v;
      for (int c : ctas) v.push_back((value(c) - t0) * 1e-3);
      std::sort(v.begin(), v.end());
      std::printf(" %7.2f %7.2f %7.2f |", v.front(), v[v.size() / 2], v.back());
    };
    std::printf("  timeline N=%d T=%d launch %d%s (%zu CTAs): prev norm end %+.2f us\n", N, T,
                slot + 1, label, ctas.size(), prev_end >= 0 ? (prev_end - t0) * 1e-3 : 0.0);
    std::printf(
        "  timeline   entry                 | prologue end          | item 0 landed"
        "         | item 0 precomputed    | item 0 ready          | last sweep"
        "            | norm exit             |\n  timeline ");
    stats([&](int c) { return tl.at(slot, c, TL::entry); });
    stats([&](int c) { return tl.at(slot, c, TL::prologue_end); });
    stats([&](int c) { return tl.at(slot, c, TL::landed0); });
    stats([&](int c) { return tl.at(slot, c, TL::precomputed0); });
    stats([&](int c) { return tl.ready(slot, c, 0); });
    stats([&](int c) { return tl.swept(slot, c, items_of(c) - 1); });
    stats([&](int c) { return tl.at(slot, c, TL::norm_exit); });
    // Where the first items' states reach registers and their sweeps end (medians over the
    // CTAs; a staggered prefill's other copies issued, where the launch staggers).
    auto median_of = [&](auto value) {
      std::vector<double> v;
      for (int c : ctas)
        if (value(c) >= 0) v.push_back((value(c) - t0) * 1e-3);
      std::sort(v.begin(), v.end());
      return v.empty() ? -1.0 : v[v.size() / 2];
    };
    std::printf("\n  timeline   ring issued %.2f; items 0-4 ready / swept (medians):",
                median_of([&](int c) { return tl.at(slot, c, TL::ring_issued); }));
    for (int k = 0; k < 5; ++k)
      std::printf(" %.2f / %.2f",
                  median_of([&](int c) { return k < items_of(c) ? tl.ready(slot, c, k) : -1; }),
                  median_of([&](int c) { return k < items_of(c) ? tl.swept(slot, c, k) : -1; }));
    std::vector<double> period;
    // A CTA's item period, us: first to last sweep end over its items (0 with fewer than 2).
    auto period_of = [&](int c) {
      const int n = items_of(c);
      return n >= 2 ? (tl.swept(slot, c, n - 1) - tl.swept(slot, c, 0)) * 1e-3 / (n - 1) : 0.0;
    };
    int max_count = 0;
    for (int c : ctas) {
      const int n = items_of(c);
      max_count = std::max(max_count, n);
      if (n >= 2) period.push_back(period_of(c));
      for (int k = 1; k < n; ++k) {
        const long long d = tl.swept(slot, c, k) - tl.swept(slot, c, k - 1);
        if (d > 0) step = std::min(step, d);
      }
    }
    std::sort(period.begin(), period.end());
    if (!period.empty())
      std::printf("\n  timeline   item period us: min %.3f median %.3f max %.3f; items a CTA <= %d",
                  period.front(), period[period.size() / 2], period.back(), max_count);
    // The CTAs that finish last, with their SM and item period: whether a launch waits for the
    // same SMs launch after launch (a property of the chip) or for CTAs with one more item.
    std::vector<int> by_end = ctas;
    auto last_sweep = [&](int c) { return tl.swept(slot, c, items_of(c) - 1); };
    std::sort(by_end.begin(), by_end.end(),
              [&](int a, int b) { return last_sweep(a) > last_sweep(b); });
    std::printf("\n  timeline   last to finish (cta / sm: end us, items, period us):");
    for (std::size_t i = 0; i < std::min<std::size_t>(4, by_end.size()); ++i) {
      const int c = by_end[i], n = items_of(c);
      std::printf(" %d / %lld: %.2f, %d, %.3f;", c, tl.at(slot, c, TL::sm),
                  (last_sweep(c) - t0) * 1e-3, n, period_of(c));
    }
    // The slowest CTA's and a median CTA's item-by-item sweep times (us between sweep ends, item
    // 0 from its ready stamp): a one-off stall or a uniformly slower CTA.
    for (int which : {0, static_cast<int>(by_end.size() / 2)}) {
      const int c = by_end[which], n = items_of(c);
      std::printf("\n  timeline   %s CTA (%d, sm %lld) item times:", which == 0 ? "last" : "median",
                  c, tl.at(slot, c, TL::sm));
      for (int k = 0; k < n; ++k)
        std::printf(" %.2f", (tl.swept(slot, c, k) -
                              (k == 0 ? tl.ready(slot, c, 0) : tl.swept(slot, c, k - 1))) *
                                 1e-3);
    }
    // Every CTA's item period in SM order (SM: period us, a star where the CTA has an extra
    // item): whether an SM's rate is a property of the SM, compared across launches and runs.
    std::vector<int> by_sm = ctas;
    std::sort(by_sm.begin(), by_sm.end(),
              [&](int a, int b) { return tl.at(slot, a, TL::sm) < tl.at(slot, b, TL::sm); });
    std::printf("\n  timeline   sm periods:");
    for (int c : by_sm)
      std::printf(" %lld:%.3f%s", tl.at(slot, c, TL::sm), period_of(c),
                  items_of(c) == max_count ? "*" : "");
    // And in CTA order (blockIdx.x: which items a CTA walks): a CTA slow by its items.
    std::printf("\n  timeline   cta periods:");
    for (int c : ctas) std::printf(" %d:%.3f", c, period_of(c));
    std::printf("\n");
  }
  std::printf("  timeline   finest timer step seen: %lld ns\n", step);
}
#endif

Result run_shape(splice::DType sdt, int N, int T, cudaStream_t stream, const Options& opt) {
  using splice::DType;
  const std::int64_t C = std::int64_t(kH) * kD, R = std::int64_t(N) * T, hist = T + 2;
  const std::int64_t es = splice::dtype_size(sdt);
  const double state_head_bytes = double(kD) * kD * es;
  const double per_set = double(N) * kH * state_head_bytes * (1 + T);
  const int G =
      std::clamp(std::max(static_cast<int>(std::ceil(kTargetWorkingSet / per_set)), opt.min_sets),
                 1, kMaxSets);
  const std::int64_t slots = std::int64_t(G) * N * T + 1;

  // Inputs shared by every set (small next to the state, except at large N where G = 1).
  auto* x = static_cast<__nv_bfloat16*>(dalloc(R * 3 * C * 2));
  auto* weight = static_cast<float*>(dalloc(12 * C * 4));
  auto* gate = static_cast<__nv_bfloat16*>(dalloc(R * C * 2));
  auto* beta = static_cast<__nv_bfloat16*>(dalloc(R * kH * 2));
  auto* alog = static_cast<float*>(dalloc(kH * 4));
  auto* dtb = static_cast<float*>(dalloc(C * 4));
  auto* og = static_cast<__nv_bfloat16*>(dalloc(R * C * 2));
  auto* nw = static_cast<float*>(dalloc(kD * 4));
  auto* out = static_cast<__nv_bfloat16*>(dalloc(R * C * 2));
  auto* conv = static_cast<__nv_bfloat16*>(dalloc(slots * 3 * C * hist * 2));
  void* state = dalloc(static_cast<std::size_t>(slots * kH * state_head_bytes));
  fill(x, R * 3 * C, 1.5f, 1);
  fill(weight, 12 * C, 0.15f, 2);
  fill(gate, R * C, 1.5f, 3);
  fill(beta, R * kH, 1.5f, 4);
  fill(alog, kH, 0.7f, 5);
  fill(dtb, C, 0.15f, 6);
  fill(og, R * C, 1.5f, 7);
  fill(nw, kD, 1.5f, 8);
  fill(conv, slots * 3 * C * hist, 0.15f, 9);
  const std::int64_t state_elems = slots * kH * kD * kD;
  if (sdt == DType::f32)
    fill(static_cast<float*>(state), state_elems, 0.015f, 10);
  else
    fill(static_cast<__nv_bfloat16*>(state), state_elems, 0.015f, 10);

  // Metadata: L = T for every sequence, nat random in [1, T], set g uses slots g N T + 1 ...
  std::vector<int> qsl(N + 1), nat(N);
  for (int n = 0; n <= N; ++n) qsl[n] = n * T;
  std::srand(42);
  for (int n = 0; n < N; ++n) nat[n] = 1 + std::rand() % T;
  auto* d_qsl = static_cast<int*>(dalloc((N + 1) * 4));
  auto* d_nat = static_cast<int*>(dalloc(N * 4));
  BENCH_CHECK(cudaMemcpy(d_qsl, qsl.data(), (N + 1) * 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_nat, nat.data(), N * 4, cudaMemcpyHostToDevice));
  std::vector<int*> d_si(G);
  for (int g = 0; g < G; ++g) {
    std::vector<int> si(std::int64_t(N) * T);
    for (std::int64_t i = 0; i < std::int64_t(N) * T; ++i)
      si[i] = int(1 + g * std::int64_t(N) * T + i);
    d_si[g] = static_cast<int*>(dalloc(si.size() * 4));
    BENCH_CHECK(cudaMemcpy(d_si[g], si.data(), si.size() * 4, cudaMemcpyHostToDevice));
  }
  BENCH_CHECK(cudaDeviceSynchronize());

  std::vector<splice::KdaDecodeArgs> args(G);
  for (int g = 0; g < G; ++g) {
    splice::KdaDecodeArgs& a = args[g];
    a.x = borrow(x, {R, 3 * C}, DType::bf16);
    a.weight = borrow(weight, {3, 4, C}, DType::f32);
    a.conv_state = borrow(conv, {slots, 3 * C, hist}, DType::bf16, {3 * C * hist, 1, 3 * C});
    a.raw_gate = borrow(gate, {R, kH, kD}, DType::bf16);
    a.raw_beta = borrow(beta, {R, kH}, DType::bf16);
    a.A_log = borrow(alog, {kH}, DType::f32);
    a.dt_bias = borrow(dtb, {C}, DType::f32);
    a.state_indices = borrow(d_si[g], {N, T}, DType::i32);
    a.state = borrow(state, {slots, kH, kD, kD}, sdt);
    a.output_gate = borrow(og, {R, kH, kD}, DType::bf16);
    a.norm_weight = borrow(nw, {kD}, DType::f32);
    a.output = borrow(out, {R, kH, kD}, DType::bf16);
    a.query_start_loc = borrow(d_qsl, {N + 1}, DType::i32);
    a.num_accepted_tokens = borrow(d_nat, {N}, DType::i32);
    a.mode = splice::KdaMode::packed;
    a.num_rows = R;
    a.num_heads = kH;
    a.channels = C;
    a.num_seqs = N;
    a.max_t = T;
    a.hist_len = hist;
    a.num_slots = slots;
    a.state_dtype = sdt;
    a.lower_bound = -5.0f;
    a.norm_eps = 1e-5f;
  }

  Result res;
  res.dtype = splice::dtype_name(sdt);
  res.n = N;
  res.t = T;
  res.sets = G;
  res.floor_bytes = double(N) * kH * state_head_bytes * (1 + T) +  // state read + T writes
                    double(R) * 3 * C * 2 +                        // x
                    3.0 * R * C * 2 + double(R) * kH * 2 +    // raw_gate, output_gate, output, beta
                    double(N) * 3 * C * 2 * (3 + hist - 1) +  // conv history read 3, write L+2
                    12.0 * C * 4 + C * 4.0 + kH * 4.0 + kD * 4.0;  // weight, dt_bias, A_log, nw
  res.floor_us = res.floor_bytes / opt.copy_bandwidth * 1e6;
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const splice::cuda::KdaVariant chosen = splice::cuda::choose_kda_variant(
      N, kH, T, sdt, sms, splice::cuda::current_device_facts().dram_bytes_per_s);
  res.chosen = splice::cuda::kda_variant_name(chosen);

  // The output check (6): one launch of set 0 under `variant` (and the tune bits, PDL setting
  // and stable-state flag in force), its last sequence against the CPU kernel on a copy of the
  // conv and state slots that launch read. Set 0's sequence n owns slots 1 + n T .. (n + 1) T;
  // the CPU copy holds them as slots 1 .. T (slot 0 zero, unused).
  auto check_config = [&](splice::cuda::KdaVariant variant) {
    const std::int64_t n = N - 1, row0 = n * T, slot0 = 1 + n * T;
    const std::size_t conv_slot = 3 * C * hist * 2, state_slot = kH * kD * kD * es;
    // Host copies of sequence n's T slots of a [slots, ...] buffer (`slot_bytes` each), after
    // `lead` zero bytes (the CPU copy's unused slot 0).
    const auto seq_slots = [&](const void* base, std::size_t slot_bytes, std::size_t lead) {
      std::vector<std::uint8_t> slots(lead, 0);
      const std::vector<std::uint8_t> seq =
          to_host(static_cast<const std::uint8_t*>(base) + slot0 * slot_bytes, T * slot_bytes);
      slots.insert(slots.end(), seq.begin(), seq.end());
      return slots;
    };
    BENCH_CHECK(cudaStreamSynchronize(stream));
    std::vector<std::uint8_t> conv_in = seq_slots(conv, conv_slot, conv_slot),
                              state_in = seq_slots(state, state_slot, state_slot);
    splice::cuda::kda_decode(args[0], stream, variant);
    BENCH_CHECK(cudaStreamSynchronize(stream));
    // The GPU's results (non-const: the comparisons borrow them as CPU tensors).
    std::vector<std::uint8_t> gpu_out = to_host(out + row0 * C, T * C * 2),
                              gpu_conv = seq_slots(conv, conv_slot, 0),
                              gpu_state = seq_slots(state, state_slot, 0);

    // The CPU kernel's arguments: sequence n alone, over host copies.
    std::vector<std::uint8_t> h_x = to_host(x + row0 * 3 * C, T * 3 * C * 2),
                              h_weight = to_host(weight, 12 * C * 4),
                              h_gate = to_host(gate + row0 * C, T * C * 2),
                              h_beta = to_host(beta + row0 * kH, T * kH * 2),
                              h_alog = to_host(alog, kH * 4), h_dtb = to_host(dtb, C * 4),
                              h_og = to_host(og + row0 * C, T * C * 2), h_nw = to_host(nw, kD * 4),
                              h_out(T * C * 2, 0);
    std::vector<int> h_si(T), h_qsl = {0, T}, h_nat = {nat[n]};
    for (int t = 0; t < T; ++t) h_si[t] = 1 + t;
    const auto host = [](void* p, const splice::Dims& shape, DType dt, splice::Dims strides = {}) {
      return splice::Tensor::borrow(p, shape, dt, std::move(strides), splice::Device::cpu());
    };
    splice::KdaDecodeArgs c = args[0];
    c.x = host(h_x.data(), {T, 3 * C}, DType::bf16);
    c.weight = host(h_weight.data(), {3, 4, C}, DType::f32);
    c.conv_state =
        host(conv_in.data(), {T + 1, 3 * C, hist}, DType::bf16, {3 * C * hist, 1, 3 * C});
    c.raw_gate = host(h_gate.data(), {T, kH, kD}, DType::bf16);
    c.raw_beta = host(h_beta.data(), {T, kH}, DType::bf16);
    c.A_log = host(h_alog.data(), {kH}, DType::f32);
    c.dt_bias = host(h_dtb.data(), {C}, DType::f32);
    c.state_indices = host(h_si.data(), {1, T}, DType::i32);
    c.state = host(state_in.data(), {T + 1, kH, kD, kD}, sdt);
    c.output_gate = host(h_og.data(), {T, kH, kD}, DType::bf16);
    c.norm_weight = host(h_nw.data(), {kD}, DType::f32);
    c.output = host(h_out.data(), {T, kH, kD}, DType::bf16);
    c.query_start_loc = host(h_qsl.data(), {2}, DType::i32);
    c.num_accepted_tokens = host(h_nat.data(), {1}, DType::i32);
    c.num_rows = T;
    c.num_seqs = 1;
    c.num_slots = T + 1;
    c.stable_state = false;
    splice::cpu::kda_decode(c);

    // Slots 1 .. T of the CPU copy against the GPU's: [T, 3C, hist] conv, [T, H, D, D] state.
    const auto slots_of = [&](std::vector<std::uint8_t>& bytes, std::size_t slot_bytes,
                              const splice::Dims& shape, DType dt, splice::Dims strides = {}) {
      return host(bytes.data() + slot_bytes, shape, dt, std::move(strides));
    };
    const splice::Dims conv_shape = {T, 3 * C, hist}, conv_strides = {3 * C * hist, 1, 3 * C};
    const splice::CompareReport conv_report =
        splice::compare_bits(host(gpu_conv.data(), conv_shape, DType::bf16, conv_strides),
                             slots_of(conv_in, conv_slot, conv_shape, DType::bf16, conv_strides));
    const splice::CompareReport out_report = splice::compare_tensors(
        host(gpu_out.data(), {T, kH, kD}, DType::bf16),
        host(h_out.data(), {T, kH, kD}, DType::bf16), splice::Tolerance{2e-2, 3e-2});
    const splice::CompareReport state_report = splice::compare_tensors(
        host(gpu_state.data(), {T, kH, kD, kD}, sdt),
        slots_of(state_in, state_slot, {T, kH, kD, kD}, sdt), splice::Tolerance{2e-3, 3e-2});
    if (conv_report.ok && out_report.ok && state_report.ok) return;
    ++g_check_failures;
    std::printf(
        "CHECK FAILED %s N %d T %d %s (tune %u, PDL %d%s): sequence %lld against the CPU "
        "kernel: conv history %s; output %s; state checkpoints %s\n",
        splice::dtype_name(sdt), N, T, splice::cuda::kda_variant_name(variant),
        splice::cuda::kda_tune(), splice::cuda::pdl_enabled() ? 1 : 0,
        args[0].stable_state ? ", stable state" : "", static_cast<long long>(n),
        conv_report.str().c_str(), out_report.str().c_str(), state_report.str().c_str());
    std::fflush(stdout);
  };

  // Median time per launch of G launches of one configuration captured in one graph, then its
  // output check.
  auto time_config = [&](splice::cuda::KdaVariant variant) {
    for (int g = 0; g < G; ++g) splice::cuda::kda_decode(args[g], stream, variant);  // warm
    BENCH_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    // `launch`: false for the cold mode's graph of the flushes alone.
    const auto timed = [&](bool launch) {
      BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int g = 0; g < G; ++g) {
        if (opt.cold) splice::bench::flush_code(sms, stream);
        if (launch) splice::cuda::kda_decode(args[g], stream, variant);
      }
      BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
      BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const splice::bench::ReplayTimes t =
          splice::bench::time_replays(exec, stream, kWarmup, kReplays, G, opt.warm_ms);
      BENCH_CHECK(cudaGraphExecDestroy(exec));
      BENCH_CHECK(cudaGraphDestroy(graph));
      return t.median_us;
    };
    const double us = opt.cold ? timed(true) - timed(false) : timed(true);
    check_config(variant);
    return us;
  };
  for (auto variant : kVariants) {
    const std::string name = splice::cuda::kda_variant_name(variant);
    if (variant == chosen ||
        std::find(opt.variants.begin(), opt.variants.end(), name) != opt.variants.end())
      res.variant_us[name] = time_config(variant);
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
    if (variant == splice::cuda::KdaVariant::stream && std::getenv("KDA_BENCH_STAMPS") != nullptr)
      print_stamps(args[0], stream, N, T);
    if (variant == splice::cuda::KdaVariant::stream &&
        std::getenv("KDA_BENCH_TIMELINE") != nullptr) {
      print_timeline(args, stream, N, T, "");
      if (std::string(std::getenv("KDA_BENCH_TIMELINE")) == "stable" && args.size() >= 2) {
        std::vector<splice::KdaDecodeArgs> promised = args;  // disjoint sets: the promise holds
        for (auto& a : promised) a.stable_state = true;
        print_timeline(promised, stream, N, T, " (stable-state promise)");
      }
    }
#endif
  }
  if (!opt.tunes.empty()) {  // the `stream` schedule knob (dev A/B)
    const unsigned saved = splice::cuda::kda_tune();
    for (unsigned bits : opt.tunes) {
      splice::cuda::set_kda_tune(bits);
      res.ab_us["stream_tune" + std::to_string(bits)] =
          time_config(splice::cuda::KdaVariant::stream);
    }
    splice::cuda::set_kda_tune(saved);
  }
  if (N <= kMaxNoPdlN) {  // the launch-bound sizes: the chosen variant without PDL
    const bool pdl = splice::cuda::pdl_enabled();
    splice::cuda::set_pdl_enabled(false);
    res.ab_us["chosen_nopdl"] = time_config(chosen);
    splice::cuda::set_pdl_enabled(pdl);
  }
  // With the stable-state promise (KdaDecodeArgs::stable_state, what a decode step launches): it
  // holds here because consecutive launches use disjoint slot sets (G >= 2).
  if (G >= 2) {
    for (auto& a : args) a.stable_state = true;
    res.ab_us["chosen_stable"] = time_config(chosen);
    if (opt.stable_all)
      for (const auto& [name, plain] : res.variant_us)
        res.stable_us[name] =
            name == res.chosen ? res.ab_us["chosen_stable"] : time_config(variant_of(name));
    for (auto& a : args) a.stable_state = false;
  }
  res.us = res.variant_us[res.chosen];
  for (void* p :
       {static_cast<void*>(x), static_cast<void*>(weight), static_cast<void*>(gate),
        static_cast<void*>(beta), static_cast<void*>(alog), static_cast<void*>(dtb),
        static_cast<void*>(og), static_cast<void*>(nw), static_cast<void*>(out),
        static_cast<void*>(conv), state, static_cast<void*>(d_qsl), static_cast<void*>(d_nat)})
    BENCH_CHECK(cudaFree(p));
  for (int* p : d_si) BENCH_CHECK(cudaFree(p));
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string json_path = argc > 1 ? argv[1] : "kda_decode_cuda_bench.json";
  std::map<std::string, PeerTimes> peers;
  if (argc > 2) {
    std::ifstream in(argv[2]);
    for (std::string text; std::getline(in, text);) {
      std::istringstream fields(text);
      std::string dt;
      int n, t;
      PeerTimes pt;
      if (!(fields >> dt >> n >> t >> pt.fla >> pt.fla_recurrent)) continue;
      if (!(fields >> pt.flashinfer)) pt.flashinfer = -1;  // a file of FLA alone
      peers[dt + " " + std::to_string(n) + " " + std::to_string(t)] = pt;
    }
    std::printf("read %zu peer timings from %s\n", peers.size(), argv[2]);
  }
  splice::cuda::ensure_registered();
  std::printf("device: %s\n", splice::cuda::device_name().c_str());
  // The `stream` kernel's launch facts (a kernel that cannot be placed runs as `wide`).
  for (splice::DType dt : {splice::DType::f32, splice::DType::bf16}) {
    for (bool staged : {true, false}) {
      const splice::cuda::KdaKernelInfo k = splice::cuda::kda_stream_kernel_info(dt, staged);
      std::printf("stream %s %s: %d threads, %d registers, %d B local, %d B shared: %s%s\n",
                  splice::dtype_name(dt), staged ? "staged" : "plain ", k.block, k.num_regs,
                  k.local_bytes, k.smem_bytes,
                  k.launchable ? "launchable" : "NOT launchable: ", k.reason.c_str());
    }
  }
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const bool quick = std::getenv("KDA_BENCH_QUICK") != nullptr;
  std::vector<int> ns = {1, 8, 32, 128, 512}, ts = {1, 2, 4, 8};
  if (quick) ts = {1, 4};
  // KDA_BENCH_NS / KDA_BENCH_TS: comma-separated subsets (e.g. KDA_BENCH_NS=1,8 for the
  // launch-bound sizes only).
  auto int_list = [](const char* name, std::vector<int>& out) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return;
    out.clear();
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  };
  int_list("KDA_BENCH_NS", ns);
  int_list("KDA_BENCH_TS", ts);
  Options opt;
  opt.variants = {"stream", "stream_plain", "wide", "wide512", "rows", "split2", "split4"};
  if (const char* v = std::getenv("KDA_BENCH_VARIANTS"); v != nullptr && *v != '\0') {
    opt.variants.clear();
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ',')) opt.variants.push_back(item);
  }
  std::vector<int> tunes;
  int_list("KDA_BENCH_TUNES", tunes);
  for (int b : tunes) opt.tunes.push_back(static_cast<unsigned>(b));
  if (const char* v = std::getenv("KDA_BENCH_MIN_SETS"); v != nullptr && *v != '\0')
    opt.min_sets = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("KDA_BENCH_WARM_MS"); v != nullptr && *v != '\0')
    opt.warm_ms = std::max(0.0, std::atof(v));
  opt.cold = std::getenv("KDA_BENCH_COLD") != nullptr;
  opt.stable_all = std::getenv("KDA_BENCH_STABLE") != nullptr;
  if (const char* v = std::getenv("KDA_BENCH_COPY_TBPS"); v != nullptr && *v != '\0') {
    opt.copy_bandwidth = std::atof(v) * 1e12;
    std::printf("floor's copy bandwidth pinned at %.3f TB/s (KDA_BENCH_COPY_TBPS)\n",
                opt.copy_bandwidth * 1e-12);
  } else {
    opt.copy_bandwidth = splice::bench::measure_copy_bandwidth(stream);
    std::printf(
        "floor's copy bandwidth: %.3f TB/s (the faster of two 1 GiB device-to-device copies, "
        "read + written)\n",
        opt.copy_bandwidth * 1e-12);
  }
  if (opt.cold)
    std::printf("cold code: bench::flush_code before every launch, its time subtracted\n");
  // KDA_BENCH_GRID_CAP: at most this many CTAs a stream launch (the test hook
  // set_kda_stream_grid_cap; an experiment's knob: is the bf16 item loop bound by the chip's
  // bandwidth, so fewer CTAs holding whole rounds of items run each item faster?).
  if (const char* v = std::getenv("KDA_BENCH_GRID_CAP"); v != nullptr && *v != '\0') {
    const int cap = std::max(0, std::atoi(v));
    splice::cuda::set_kda_stream_grid_cap(cap);
    std::printf("stream grid capped at %d CTAs\n", cap);
  }
  std::printf("kda tune default %u; timed:", splice::cuda::kda_tune());
  for (const auto& v : opt.variants) std::printf(" %s", v.c_str());
  for (unsigned b : opt.tunes) std::printf(" stream+tune%u", b);
  std::printf("; at least %d launch(es) per graph, %.0f ms of warm-up replays each\n", opt.min_sets,
              opt.warm_ms);
  // bf16 first (from session 17, when 3 warm-up replays left the first bf16 points after the
  // fp32 grid ~8% slow; the 50 ms warm-up removed that, perf.md run 142).
  std::vector<splice::DType> states = {splice::DType::bf16, splice::DType::f32};
  if (const char* v = std::getenv("KDA_BENCH_STATES"); v != nullptr && *v != '\0') {
    states.clear();
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ','))
      states.push_back(item == "bf16" ? splice::DType::bf16 : splice::DType::f32);
  }
  std::vector<Result> results;
  for (auto sdt : states)
    for (int t : ts)
      for (int n : ns) {
        results.push_back(run_shape(sdt, n, t, stream, opt));
        const Result& r = results.back();
        std::printf("  %s N=%d T=%d (G=%d):", r.dtype.c_str(), n, t, r.sets);
        for (const auto& [name, us] : r.variant_us) std::printf(" %s %.2f", name.c_str(), us);
        std::printf(" us (floor %.2f)\n", r.floor_us);
        if (!r.stable_us.empty()) {
          std::printf("  %s N=%d T=%d under the promise:", r.dtype.c_str(), n, t);
          for (const auto& [name, us] : r.stable_us) std::printf(" %s %.2f", name.c_str(), us);
          std::printf(" us\n");
        }
        for (unsigned bits : opt.tunes) {
          const std::string key = "stream_tune" + std::to_string(bits);
          const double base = r.variant_us.count("stream") ? r.variant_us.at("stream") : -1.0;
          std::printf("  A/B %s N=%d T=%d: stream tune=%u %.2f vs tune=default %.2f us (%+.1f%%)\n",
                      r.dtype.c_str(), n, t, bits, r.ab_us.at(key), base,
                      base > 0 ? 100.0 * (r.ab_us.at(key) / base - 1.0) : 0.0);
        }
        if (r.ab_us.count("chosen_nopdl")) {
          const double with = r.variant_us.at(r.chosen);
          std::printf("  A/B %s N=%d T=%d: %s without PDL %.2f vs with %.2f us (%+.1f%%)\n",
                      r.dtype.c_str(), n, t, r.chosen.c_str(), r.ab_us.at("chosen_nopdl"), with,
                      100.0 * (with / r.ab_us.at("chosen_nopdl") - 1.0));
        }
        if (r.ab_us.count("chosen_stable")) {
          const double plain = r.variant_us.at(r.chosen);
          std::printf(
              "  A/B %s N=%d T=%d: %s with the stable-state promise %.2f vs without %.2f "
              "us (%+.1f%%)\n",
              r.dtype.c_str(), n, t, r.chosen.c_str(), r.ab_us.at("chosen_stable"), plain,
              100.0 * (r.ab_us.at("chosen_stable") / plain - 1.0));
        }
        std::fflush(stdout);
      }

  std::ofstream json(json_path);
  json << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    Result& r = results[i];
    const auto it = peers.find(r.dtype + " " + std::to_string(r.n) + " " + std::to_string(r.t));
    if (it != peers.end()) {
      r.fla_us = it->second.fla;
      r.fla_rec_us = it->second.fla_recurrent;
      r.flashinfer_us = it->second.flashinfer;
    }
    auto us_of = [&](const std::string& name) {
      return r.variant_us.count(name) ? r.variant_us.at(name) : -1.0;
    };
    std::ostringstream tune_json;
    tune_json << "{";
    for (std::size_t k = 0; k < opt.tunes.size(); ++k)
      tune_json << (k ? ", " : "") << "\"" << opt.tunes[k]
                << "\": " << r.ab_us.at("stream_tune" + std::to_string(opt.tunes[k]));
    tune_json << "}";
    std::ostringstream stable_json;  // {"variant": us under the promise} (KDA_BENCH_STABLE)
    stable_json << "{";
    for (const auto& [name, us] : r.stable_us)
      stable_json << (stable_json.tellp() > 1 ? ", " : "") << "\"" << name << "\": " << us;
    stable_json << "}";
    json << "  {\"state\": \"" << r.dtype << "\", \"H\": " << kH << ", \"N\": " << r.n
         << ", \"T\": " << r.t << ", \"sets\": " << r.sets
         << ", \"copy_tbps\": " << opt.copy_bandwidth * 1e-12
         << ", \"floor_bytes\": " << r.floor_bytes << ", \"floor_us\": " << r.floor_us
         << ", \"variant\": \"" << r.chosen << "\", \"us\": " << r.us
         << ", \"stream_us\": " << us_of("stream")
         << ", \"stream_plain_us\": " << us_of("stream_plain") << ", \"wide_us\": " << us_of("wide")
         << ", \"wide512_us\": " << us_of("wide512") << ", \"rows_us\": " << us_of("rows")
         << ", \"split2_us\": " << us_of("split2") << ", \"split4_us\": " << us_of("split4")
         << ", \"stream_tune_us\": " << tune_json.str() << ", \"chosen_nopdl_us\": "
         << (r.ab_us.count("chosen_nopdl") ? r.ab_us["chosen_nopdl"] : -1)
         << ", \"chosen_stable_us\": "
         << (r.ab_us.count("chosen_stable") ? r.ab_us["chosen_stable"] : -1)
         << ", \"stable_us\": " << stable_json.str() << ", \"fla_us\": " << r.fla_us
         << ", \"fla_recurrent_us\": " << r.fla_rec_us << ", \"flashinfer_us\": " << r.flashinfer_us
         << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  json << "]\n";

  // `stable` = the chosen variant under the stable-state promise (a decode step's launches).
  // `FI us` / `FIx`: FlashInfer's fused_kda_decode (T = 1) and its time over splice's.
  std::printf("\n%-6s %4s %2s %-7s %9s %8s %7s %9s %7s %9s %7s %9s %7s %9s %6s\n", "state", "N",
              "T", "variant", "us", "GB/s", "%floor", "FLA us", "ratio", "FLArec", "best", "stable",
              "%floor", "FI us", "FIx");
  for (const Result& r : results) {
    double best = 1e30;
    for (const auto& [k, v] : r.variant_us) best = std::min(best, v);
    const double stable = r.ab_us.count("chosen_stable") ? r.ab_us.at("chosen_stable") : -1.0;
    std::printf(
        "%-6s %4d %2d %-7s %9.2f %8.0f %6.1f%% %9.2f %7.2f %9.2f %7.2f %9.2f %6.1f%% %9.2f %6.2f\n",
        r.dtype.c_str(), r.n, r.t, r.chosen.c_str(), r.us, r.floor_bytes / r.us * 1e-3,
        100.0 * r.floor_us / r.us, r.fla_us, r.fla_us > 0 ? r.fla_us / r.us : 0.0, r.fla_rec_us,
        best, stable, stable > 0 ? 100.0 * r.floor_us / stable : 0.0, r.flashinfer_us,
        r.flashinfer_us > 0 ? r.flashinfer_us / r.us : 0.0);
  }
  if (!opt.tunes.empty()) {
    // The decision table of the dev A/B (dev/kda_b/README.md): `stream` with each tune mask, us
    // and % of the floor; "win" = the fastest mask when it beats the default by more than 1%.
    std::printf("\nstream tune A/B (us, %% of floor)\n%-6s %4s %2s %3s %19s", "state", "N", "T",
                "G", "tune=default");
    for (unsigned b : opt.tunes) std::printf(" %19s", ("tune=" + std::to_string(b)).c_str());
    std::printf(" %6s\n", "win");
    for (const Result& r : results) {
      const double base = r.variant_us.count("stream") ? r.variant_us.at("stream") : -1.0;
      std::printf("%-6s %4d %2d %3d %10.2f (%5.1f%%)", r.dtype.c_str(), r.n, r.t, r.sets, base,
                  base > 0 ? 100.0 * r.floor_us / base : 0.0);
      double best = base;
      unsigned win = 0;
      for (unsigned b : opt.tunes) {
        const double us = r.ab_us.at("stream_tune" + std::to_string(b));
        std::printf(" %10.2f (%5.1f%%)", us, 100.0 * r.floor_us / us);
        if (us < best * 0.99) {
          best = us;
          win = b;
        }
      }
      std::printf(" %6u\n", win);
    }
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  if (g_check_failures > 0) {
    std::printf("\nCHECK FAILED: %d configurations' outputs (above)\n", g_check_failures);
    return 1;
  }
  return 0;
}
