// bench/flash_decode_bench.cc: the CPU flash-decode kernel (arm 1) against the decomposed
// attention region built from CPU primitives (arm 0), at decode shapes B = 1, Hq = 32, Hkv = 8,
// D = 128, Sq = 1, bf16, k_len in {1K, 4K, 16K, 32K}; plus the machine's read bandwidth.
//
//  1. Inputs: random bf16 q, K and V of capacity k_len. Several K/V sets rotate between iterations
//     so at least past_the_cache(kMinRotationBytes) stream per rotation (twice the L3 the OS
//     reports, at least 256 MB) and no size is flattered by the cache.
//  2. Flash arm: splice::decode_attention (validation + cpu::flash_decode, one pass over K and V).
//  3. Decomposed arm, as a model would build it from primitives (buffers preallocated, as a plan
//     would): scores = matmul(q as [B, Hkv, G, D], K[:, :, :k_len] transposed)  [B, Hkv, G, k_len]
//     f32; scores *= scale; p = softmax(scores); o = matmul(p, V[:, :, :k_len])  [B, Hkv, G, D].
//  4. Read bandwidth: every thread sums its share of a buffer of past_the_cache(512 MB) bytes (16
//     fp32 lanes, vectorized).
//  5. Summary: wall time per arm, effective KV GB/s = 2 * k_len * Hkv * D * 2 bytes / time, the
//     bytes floor (KV bytes / measured read bandwidth), % of that floor, process CPU time per call
//     (all threads; robust when other processes share the cores), and flash/decomposed ratios.
// Run: ./flash_decode_bench (JSON goes to flash_decode_bench.json unless --benchmark_out= is given;
// SPLICE_NUM_THREADS=1 runs both arms on one core).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "past_the_cache.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/tensor.h"
#include "splice/ops/decode_attention.h"

namespace splice {
namespace {

using bench::past_the_cache;

constexpr std::int64_t kBatch = 1, kQoHeads = 32, kKvHeads = 8, kHeadDim = 128, kQLen = 1;
constexpr std::int64_t kGroup = kQoHeads / kKvHeads;
constexpr std::int64_t kBf16Bytes = 2;
constexpr std::int64_t kMinRotationBytes = std::int64_t{256} << 20;   // K/V sets per rotation
constexpr std::int64_t kMinBandwidthBytes = std::int64_t{512} << 20;  // read-bandwidth buffer
constexpr double kGiga = 1e9;

std::int64_t kv_bytes(std::int64_t k_len) {
  return 2 * kBatch * kKvHeads * k_len * kHeadDim * kBf16Bytes;  // K and V, live prefix
}

// Fast bf16 fill from a splitmix64 stream: uniform in [-2, 2), cheap for 10^8 elements.
void fill_bf16(Tensor& t, std::uint64_t seed) {
  auto* bits = t.data<std::uint16_t>();
  const std::int64_t n = t.numel();
  std::uint64_t state = seed;
  for (std::int64_t x = 0; x < n; ++x) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    const float u = static_cast<float>(z >> 40) * 0x1p-24f;  // [0, 1)
    bits[x] = f32_to_bf16_bits(4.0f * u - 2.0f);
  }
}

struct Inputs {
  Tensor q;                  // [B, Hq, 1, D] bf16
  Tensor k_len;              // [1] int32
  std::vector<Tensor> k, v;  // rotation sets of [B, Hkv, k_len, D] bf16
};

const Inputs& inputs_for(std::int64_t k_len) {
  static std::map<std::int64_t, std::unique_ptr<Inputs>> cache;
  auto& slot = cache[k_len];
  if (!slot) {
    slot = std::make_unique<Inputs>();
    slot->q = Tensor::empty({kBatch, kQoHeads, kQLen, kHeadDim}, DType::bf16);
    fill_bf16(slot->q, 1);
    slot->k_len = Tensor::empty({1}, DType::i32);
    slot->k_len.data<std::int32_t>()[0] = static_cast<std::int32_t>(k_len);
    const std::int64_t sets =
        std::max<std::int64_t>(1, past_the_cache(kMinRotationBytes) / kv_bytes(k_len));
    for (std::int64_t s = 0; s < sets; ++s) {
      Tensor k = Tensor::empty({kBatch, kKvHeads, k_len, kHeadDim}, DType::bf16);
      Tensor v = Tensor::empty({kBatch, kKvHeads, k_len, kHeadDim}, DType::bf16);
      fill_bf16(k, 100 + 2 * s);
      fill_bf16(v, 101 + 2 * s);
      slot->k.push_back(std::move(k));
      slot->v.push_back(std::move(v));
    }
  }
  return *slot;
}

// Mean wall seconds and process CPU seconds (all threads) per iteration of each arm.
struct ArmResult {
  double wall = 0.0;
  double cpu = 0.0;
};
std::map<std::string, std::map<std::int64_t, ArmResult>>& results() {
  static std::map<std::string, std::map<std::int64_t, ArmResult>> r;
  return r;
}

// CPU seconds used by every thread of this process: on a shared machine the wall clock includes
// time other processes held the cores, the CPU time does not.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double g_read_bandwidth = 0.0;  // bytes / s

using Clock = std::chrono::steady_clock;

void finish(benchmark::State& state, const std::string& arm, std::int64_t k_len, double seconds,
            double cpu_seconds) {
  const double per_iter = seconds / static_cast<double>(state.iterations());
  const double cpu_per_iter = cpu_seconds / static_cast<double>(state.iterations());
  results()[arm][k_len] = {per_iter, cpu_per_iter};
  state.counters["cpu_ms"] = cpu_per_iter * 1e3;
  state.SetBytesProcessed(state.iterations() * kv_bytes(k_len));
  state.counters["KV_GBps"] = static_cast<double>(kv_bytes(k_len)) / per_iter / kGiga;
}

void BM_FlashDecode(benchmark::State& state) {
  const std::int64_t k_len = state.range(0);
  const Inputs& in = inputs_for(k_len);
  Tensor out = Tensor::empty({kBatch, kQoHeads, kQLen, kHeadDim}, DType::bf16);
  DecodeAttentionOptions options;
  std::size_t set = 0;
  double seconds = 0.0, cpu_seconds = 0.0;
  for (auto _ : state) {
    const double cpu_start = process_cpu_seconds();
    const auto start = Clock::now();
    decode_attention(in.q, in.k[set], in.v[set], in.k_len, nullptr, options, out);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    cpu_seconds += process_cpu_seconds() - cpu_start;
    set = (set + 1) % in.k.size();
  }
  benchmark::DoNotOptimize(out.raw_data());
  finish(state, "flash", k_len, seconds, cpu_seconds);
}

void BM_Decomposed(benchmark::State& state) {
  const std::int64_t k_len = state.range(0);
  const Inputs& in = inputs_for(k_len);
  // q [B, Hq, 1, D] viewed as [B, Hkv, G, D]: one matmul per kv head covers its query group.
  const Tensor q_group = in.q.reshape({kBatch, kKvHeads, kGroup * kQLen, kHeadDim});
  // scores, scaled, probs [B, Hkv, G, k_len] f32; out [B, Hkv, G, D] bf16; scale [1] f32.
  Tensor scores = Tensor::empty({kBatch, kKvHeads, kGroup * kQLen, k_len}, DType::f32);
  Tensor scaled = Tensor::empty({kBatch, kKvHeads, kGroup * kQLen, k_len}, DType::f32);
  Tensor probs = Tensor::empty({kBatch, kKvHeads, kGroup * kQLen, k_len}, DType::f32);
  Tensor out = Tensor::empty({kBatch, kKvHeads, kGroup * kQLen, kHeadDim}, DType::bf16);
  Tensor scale = Tensor::empty({1}, DType::f32);
  scale.data<float>()[0] = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  std::size_t set = 0;
  double seconds = 0.0, cpu_seconds = 0.0;
  for (auto _ : state) {
    const double cpu_start = process_cpu_seconds();
    const auto start = Clock::now();
    // The live prefix slice of the capacity buffers (here capacity == k_len).
    // [B, Hkv, k_len, D] views of the capacity buffers.
    const Tensor k_live = in.k[set].slice(2, 0, k_len);
    const Tensor v_live = in.v[set].slice(2, 0, k_len);
    cpu::matmul(q_group, k_live, scores, /*transpose_b=*/true);
    cpu::binary(cpu::BinaryKind::mul, scores, scale, scaled);
    cpu::softmax(scaled, -1, probs);
    cpu::matmul(probs, v_live, out);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    cpu_seconds += process_cpu_seconds() - cpu_start;
    set = (set + 1) % in.k.size();
  }
  benchmark::DoNotOptimize(out.raw_data());
  finish(state, "decomposed", k_len, seconds, cpu_seconds);
}

// Sum of a float range with 16 independent lanes (vectorizes without -ffast-math).
float sum_range(const float* data, std::int64_t n) {
  constexpr std::int64_t kLanes = 16;
  float lanes[kLanes] = {};
  for (std::int64_t x = 0; x + kLanes <= n; x += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] += data[x + l];
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

void BM_ReadBandwidth(benchmark::State& state) {
  static Tensor buffer = [] {  // [past_the_cache(kMinBandwidthBytes) / 4] f32
    Tensor t = Tensor::empty({past_the_cache(kMinBandwidthBytes) / 4}, DType::f32);
    std::memset(t.raw_data(), 0, t.nbytes());
    return t;
  }();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t n = buffer.numel(), share = n / threads;
  double seconds = 0.0;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  for (auto _ : state) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t)
      pool.emplace_back([&, t] { sums[t] = sum_range(buffer.data<float>() + t * share, share); });
    sums[0] = sum_range(buffer.data<float>(), share);
    for (auto& th : pool) th.join();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    benchmark::DoNotOptimize(sums.data());
  }
  const double bytes = static_cast<double>(share * threads) * sizeof(float);
  g_read_bandwidth = bytes * static_cast<double>(state.iterations()) / seconds;
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["GBps"] = g_read_bandwidth / kGiga;
}

const std::vector<std::int64_t> kLens = {1024, 4096, 16384, 32768};

BENCHMARK(BM_ReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_FlashDecode)
    ->ArgName("k_len")
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->Arg(32768)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);
BENCHMARK(BM_Decomposed)
    ->ArgName("k_len")
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->Arg(32768)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

void print_summary() {
  auto& r = results();
  std::printf(
      "\nflash-decode vs decomposed, B=%lld Hq=%lld Hkv=%lld D=%lld Sq=%lld bf16, %d threads\n",
      static_cast<long long>(kBatch), static_cast<long long>(kQoHeads),
      static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim),
      static_cast<long long>(kQLen), cpu::num_threads());
  std::printf("measured read bandwidth: %.2f GB/s\n", g_read_bandwidth / kGiga);
  std::printf("%7s %7s %9s | %9s %7s %6s %8s | %9s %7s %8s | %9s %9s\n", "k_len", "KV_MB",
              "floor_us", "flash_us", "GB/s", "%floor", "cpu_us", "decomp_us", "GB/s", "cpu_us",
              "wall f/d", "cpu f/d");
  for (std::int64_t k_len : kLens) {
    if (!r["flash"].count(k_len) || !r["decomposed"].count(k_len)) continue;
    const double bytes = static_cast<double>(kv_bytes(k_len));
    const double floor_s = g_read_bandwidth > 0 ? bytes / g_read_bandwidth : 0.0;
    const ArmResult flash = r["flash"][k_len], dec = r["decomposed"][k_len];
    std::printf("%7lld %7.1f %9.1f | %9.1f %7.2f %5.0f%% %8.1f | %9.1f %7.2f %8.1f | %9.3f %9.3f\n",
                static_cast<long long>(k_len), bytes / 1e6, floor_s * 1e6, flash.wall * 1e6,
                bytes / flash.wall / kGiga, floor_s > 0 ? 100.0 * floor_s / flash.wall : 0.0,
                flash.cpu * 1e6, dec.wall * 1e6, bytes / dec.wall / kGiga, dec.cpu * 1e6,
                flash.wall / dec.wall, flash.cpu / dec.cpu);
  }
}

}  // namespace
}  // namespace splice

// Writes JSON to flash_decode_bench.json unless the caller names another --benchmark_out.
int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool has_out = false;
  for (int a = 1; a < argc; ++a)
    has_out = has_out || std::string(argv[a]).rfind("--benchmark_out=", 0) == 0;
  std::string out_flag = "--benchmark_out=flash_decode_bench.json";
  std::string format_flag = "--benchmark_out_format=json";
  if (!has_out) {
    args.push_back(out_flag.data());
    args.push_back(format_flag.data());
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  splice::print_summary();
  return 0;
}
