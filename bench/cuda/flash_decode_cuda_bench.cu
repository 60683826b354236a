// Benchmark of the CUDA flash-decode kernel on the issue-5 grid and the SmolLM2 attention shape
// (a plain main; prints a table and writes JSON).
//
//   1. Grid: batch {1, 8, 32, 128} x k_len {1K, 4K, 16K, 64K} x (Hq, Hkv) {(32, 8), (32, 32),
//      (64, 8)}, head_dim 128, bf16, q_len 1 (shapes whose K+V exceed --max-kv-gb are skipped),
//      plus SmolLM2-135M's attention (B 1, Hq 9, Hkv 3, head_dim 64) at k_len 64, 256 and 1K
//      (also in --quick).
//   2. Bytes first: KV = 2 * batch * Hkv * k_len * head_dim * 2 bytes, the floor is KV over the
//      card's read ceiling, measured at the start (bench::measure_read_bandwidth; ~4.48 TB/s on
//      the H200, whose issue-5 yardstick is 4.4: --read-tbps pins it).
//   3. Timing: `sets` independent input sets (K, V, q, out) rotate so at least 512 MB (64 sets
//      at most), and never less than 128 MB (over twice the 60 MB L2; up to 4096 sets of the tiny
//      shapes), is touched per replay; one CUDA graph holds one call per set; after warm-up, each
//      of --reps replays is timed with events; time per call = median replay / sets. The PyTorch
//      peers (bench/peers/attention_peers.py) are timed the same way.
//   4. Output: one row per shape (us, effective KV GB/s, % of the floor; batch <= 8
//      also under the stable-prefix promise, what a decode step launches) and JSON.
//   4'. Output check (every timed configuration, every mode but the attribution knobs'): after
//      the timing, one more call of input set 0 with the LSE, and its last unit (batch B - 1,
//      kv head Hkv - 1: every batch and head stride in its addresses) against the CPU kernel
//      (tested against float64) on the same bf16 q, K and V: the outputs within bf16's default
//      tolerance, the LSE within 1e-4 (one 16-key tile left out or read twice moves it by >= 16
//      / k_len: 2.4e-4 at 64K keys).
//      A failure prints CHECK FAILED with the configuration and the bench exits 1: a plan
//      column or a dev/ variant that is fast but wrong shows in its own timing run.
//   5. Plan check (unless --no-variants): the SmolLM2 shapes and B = 1 (32, 8) at 1K / 4K with
//      forced split counts {1, 2, 4, 8, 16} beside the plan's, to check the single-split limit
//      and the split rule; then the batch <= 8 shapes with programmatic dependent launch off and
//      on (P- / P+).
//   6. --ab (issue 5, dev/flash_b1/device_run.sh; replaces 1-5): the B = 1 shapes only, plus
//      the SmolLM2 shape as the model runs it (k_len 17 / 64 / 256 in a capacity-256 cache),
//      each timed at the plan's split count (twice, for the noise), then with the merge left
//      out (-merge) and with the merge and the K/V stream left out (-mrg-kv;
//      FlashDecodeDevKnobs::drop_stages, attribution only: outputs wrong), then at forced split
//      counts 1 / 4 / 16 / 32.
//   7. --warps-ab (replaces 1-6): B = 1 and 8 of the grid (head_dim 128) and the SmolLM2 shapes
//      (with the model's capacity-256 cache too), each timed with 4-warp and 8-warp CTAs
//      (FlashDecodeDevKnobs::warps), alternating, twice: the evidence for the plan's wide rule.
//   8. --cluster-ab (replaces 1-7): B = 1, 8 and 32 (k_len <= 4K at B > 1) of (32, 8) and
//      (64, 8) and the SmolLM2 shapes (also in its capacity-256 cache), each timed under the
//      plan's rules, with the cluster grid's trigger moved, with the global split merge, and with
//      widths and cluster sizes forced (FlashDecodeDevKnobs), two alternating rounds: the
//      evidence for the plan's cluster rule.
//   9. --plans 'LABEL:WARPS:CLUSTER:SPLITS[:LATE[:SHIFT[:HALVING]]];...' (replaces 1-8): each
//      shape timed under each plan column (FlashDecodeDevKnobs warps, cluster_merge, late_splits,
//      late_shift and late_halving, 0 / -1 / -1 / -1 / -1: the rule; SPLITS > 0 a forced split
//      count, 0 the plan's),
//      in --rounds rounds (default 3) that alternate the
//      columns; per column every round's time, then the fastest: whether another plan beats
//      the rule at a point, measured beside the rule in one process.
//  10. --shapes 'B,Hq,Hkv,k_len,D[,capacity];...' replaces the shape list of any mode;
//      --warm-ms M: each graph replays untimed for at least M ms first (default 50);
//      --min-sets N: at least N input sets per shape (2: no set is read twice in a row).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "splice/backend/cpu/flash_decode.h"
#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/tensor.h"
#include "splice/core/tolerance.h"

namespace {

using splice::bench::to_host;

constexpr std::size_t kRotateBytes = std::size_t{512} << 20;
constexpr int kMaxSets = 64;
constexpr std::size_t kMinTouchedBytes = std::size_t{128} << 20;  // > 2x the L2
constexpr int kMaxSmallSets = 4096;
constexpr int kWarmupReplays = 3;
int g_min_sets = 1;  // --min-sets: at least this many input sets (2: no set read twice in a row)
// Untimed replays of each graph before its timed ones, at least this many ms (--warm-ms): with 3
// replays alone the KDA bench's first configurations after a dtype switch read 8-10% slow (perf.md
// run 142); flash decode showed no such transient (run 143) but is timed the same way.
double g_warm_ms = 50.0;

struct Shape {
  std::int64_t batch, num_qo_heads, num_kv_heads, k_len, head_dim;
  std::int64_t capacity = 0;  // cache rows; 0: k_len (a full cache)
  std::int64_t cap() const { return capacity > 0 ? capacity : k_len; }
  // Live K+V bytes (the floor) and the allocated cache of one input set.
  std::int64_t kv_bytes() const { return 2 * batch * num_kv_heads * k_len * head_dim * 2; }
  std::int64_t cache_bytes() const { return 2 * batch * num_kv_heads * cap() * head_dim * 2; }
  bool smollm2() const { return num_qo_heads == 9; }
};

// Input sets rotated per replay: at least kRotateBytes of K/V (at most kMaxSets sets), and never
// less than kMinTouchedBytes (up to kMaxSmallSets sets).
int sets_for(const Shape& s) {
  const std::size_t kv = static_cast<std::size_t>(s.cache_bytes());
  std::size_t sets = std::clamp<std::size_t>((kRotateBytes + kv - 1) / kv, 1, kMaxSets);
  if (sets * kv < kMinTouchedBytes)
    sets = std::min<std::size_t>((kMinTouchedBytes + kv - 1) / kv, kMaxSmallSets);
  return std::max(static_cast<int>(sets), g_min_sets);
}

struct Result {
  Shape shape;
  int sets = 0;
  int splits = 0;        // the grid's split dimension (forced or planned)
  int live = 0;          // splits the device plan runs at this k_len
  int warps = 0;         // warps per CTA
  bool cluster = false;  // the splits merged in thread-block clusters (every timed launch)
  int late = 0;          // late splits (the plan's, or the knob's where the plan may take them)
  bool halving = false;  // the late pieces halve in size (FlashDecodePlan::late_halving)
  double us = 0.0;
  double spread_us = 0.0;   // max - min replay time per call
  double stable_us = -1.0;  // batch <= 8: the same under the stable-prefix promise
  bool checked = false;     // the output check (4') ran and passed (JSON: output_checked)
};

splice::Tensor device_view(const std::shared_ptr<splice::Storage>& storage, std::int64_t offset,
                           const splice::Dims& shape) {
  return splice::Tensor::view_of(storage, offset, shape, splice::Tensor::contiguous_strides(shape),
                                 splice::DType::bf16);
}

// The input sets of one shape: K/V views into the shared pools, q and out views into their own
// pools (one allocation each), k_len on the device.
struct Inputs {
  Shape shape;
  int sets = 0;
  splice::Tensor q_pool, out_pool, k_len;
  std::vector<splice::Tensor> q, k, v, out;

  Inputs(const Shape& s, const std::shared_ptr<splice::Storage>& k_pool,
         const std::shared_ptr<splice::Storage>& v_pool, cudaStream_t stream)
      : shape(s), sets(sets_for(s)) {
    const splice::Dims kv_shape = {s.batch, s.num_kv_heads, s.cap(), s.head_dim};
    const splice::Dims q_shape = {s.batch, s.num_qo_heads, 1, s.head_dim};
    const std::int64_t kv_elems = s.cache_bytes() / 4;  // K (or V) elements of one set
    const std::int64_t q_elems = s.batch * s.num_qo_heads * s.head_dim;
    q_pool = splice::Tensor::empty({sets * q_elems}, splice::DType::bf16, splice::Device::cuda());
    out_pool = splice::Tensor::empty({sets * q_elems}, splice::DType::bf16, splice::Device::cuda());
    splice::bench::fill_random<<<256, 256, 0, stream>>>(q_pool.data<__nv_bfloat16>(),
                                                        q_pool.numel(), 77u);
    for (int i = 0; i < sets; ++i) {
      k.push_back(device_view(k_pool, i * kv_elems, kv_shape));
      v.push_back(device_view(v_pool, i * kv_elems, kv_shape));
      q.push_back(device_view(q_pool.storage(), i * q_elems, q_shape));
      out.push_back(device_view(out_pool.storage(), i * q_elems, q_shape));
    }
    std::vector<std::int32_t> lens(static_cast<std::size_t>(s.batch),
                                   static_cast<std::int32_t>(s.k_len));
    k_len = splice::Tensor::empty({s.batch}, splice::DType::i32, splice::Device::cuda());
    BENCH_CHECK(cudaMemcpy(k_len.raw_data(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  }
};

std::string shape_name(const Shape& s) {
  char name[80];
  std::snprintf(name, sizeof name, "(%lld,%lld,%lld,%lld,D%lld)", static_cast<long long>(s.batch),
                static_cast<long long>(s.num_qo_heads), static_cast<long long>(s.num_kv_heads),
                static_cast<long long>(s.k_len), static_cast<long long>(s.head_dim));
  std::string out = name;
  if (s.capacity > 0) out += "c" + std::to_string(s.capacity);
  return out;
}

// Configurations whose output check failed (4'); main exits 1 when there are any.
int g_check_failures = 0;

// main's exit code: 1 when some configuration's output check failed (named on stdout as it ran).
int checks_exit_code() {
  if (g_check_failures == 0) return 0;
  std::printf("\nCHECK FAILED: %d configurations' outputs (above)\n", g_check_failures);
  return 1;
}

splice::Tensor host_tensor(std::vector<std::uint8_t>& bytes, const splice::Dims& shape,
                           splice::DType dtype) {
  return splice::Tensor::borrow(bytes.data(), shape, dtype, {}, splice::Device::cpu());
}

// The output check (4'): `lse0` and in.out[0] hold input set 0's call; its last unit against the
// CPU kernel (itself tested against float64) on host copies of that unit's q, K and V.
// Returns true when both are within tolerance (else prints CHECK FAILED and counts it).
bool check_last_unit(const Inputs& in, const splice::Tensor& lse0, const char* what) {
  using splice::DType;
  const Shape& s = in.shape;
  const std::int64_t g = s.num_qo_heads / s.num_kv_heads, d = s.head_dim;
  const std::int64_t b = s.batch - 1, h = s.num_kv_heads - 1;
  const std::int64_t kv_row0 = ((b * s.num_kv_heads + h) * s.cap()) * d;  // its first K / V row
  const std::int64_t q_row0 = (b * s.num_qo_heads + h * g) * d;           // its first query head
  // The unit as a batch of one: [1, G, 1, D] q and out, [1, 1, k_len, D] K and V, [1, G, 1] lse.
  std::vector<std::uint8_t> q = to_host(in.q[0].data<__nv_bfloat16>() + q_row0, g * d * 2),
                            k = to_host(in.k[0].data<__nv_bfloat16>() + kv_row0, s.k_len * d * 2),
                            v = to_host(in.v[0].data<__nv_bfloat16>() + kv_row0, s.k_len * d * 2),
                            out = to_host(in.out[0].data<__nv_bfloat16>() + q_row0, g * d * 2),
                            lse = to_host(lse0.data<float>() + b * s.num_qo_heads + h * g, g * 4),
                            cpu_out(out.size()), cpu_lse(lse.size());
  std::int32_t k_len = static_cast<std::int32_t>(s.k_len);
  splice::Tensor cpu_out_t = host_tensor(cpu_out, {1, g, 1, d}, DType::bf16);
  splice::Tensor cpu_lse_t = host_tensor(cpu_lse, {1, g, 1}, DType::f32);
  splice::cpu::flash_decode(
      host_tensor(q, {1, g, 1, d}, DType::bf16), host_tensor(k, {1, 1, s.k_len, d}, DType::bf16),
      host_tensor(v, {1, 1, s.k_len, d}, DType::bf16),
      splice::Tensor::borrow(&k_len, {1}, DType::i32, {}, splice::Device::cpu()), nullptr,
      splice::DecodeAttentionOptions{}, cpu_out_t, &cpu_lse_t);
  const splice::CompareReport out_report =
      splice::compare_tensors(host_tensor(out, {1, g, 1, d}, DType::bf16), cpu_out_t,
                              splice::default_tolerance(DType::bf16));
  const splice::CompareReport lse_report = splice::compare_tensors(
      host_tensor(lse, {1, g, 1}, DType::f32), cpu_lse_t, splice::Tolerance{1e-4, 0.0});
  if (out_report.ok && lse_report.ok) return true;
  ++g_check_failures;
  std::printf(
      "CHECK FAILED %s: unit (b %lld, kv head %lld) against the CPU kernel: out %s; lse %s\n", what,
      static_cast<long long>(b), static_cast<long long>(h), out_report.str().c_str(),
      lse_report.str().c_str());
  std::fflush(stdout);
  return false;
}

// `stable_prefix`: the calls carry flash_decode's stable-prefix promise (what a decode step
// launches: nothing in flight writes k_len or the cache rows below k_len - q_len). It holds here:
// no call writes K, V or k_len.
Result run_shape(Inputs& in, int reps, cudaStream_t stream, std::int64_t forced_splits = 0,
                 bool stable_prefix = false) {
  const Shape& s = in.shape;
  Result r;
  r.shape = s;
  r.sets = in.sets;
  splice::DecodeAttentionOptions options;
  options.num_splits = forced_splits;
  const splice::cuda::FlashDecodeDevKnobs knobs = splice::cuda::flash_decode_dev_knobs();
  const splice::cuda::FlashDecodePlan plan = splice::cuda::plan_flash_decode(
      s.batch, s.num_qo_heads, s.num_kv_heads, 1, s.head_dim, s.cap(), s.cap(),
      splice::cuda::current_device_facts().sm_count, knobs.warps, knobs.cluster_merge,
      knobs.single_split_bytes > 0 ? knobs.single_split_bytes
                                   : splice::cuda::kFlashDecodeSingleSplitBytes);
  r.warps = plan.warps;
  const splice::cuda::FlashDecodeLateLaunch late =
      splice::cuda::flash_decode_late_launch(plan, forced_splits, knobs);  // the launcher's
  r.late = late.splits;
  r.halving = late.halving;
  r.splits = forced_splits > 0 ? static_cast<int>(forced_splits) : plan.num_splits;
  r.live = forced_splits > 0 ? static_cast<int>(forced_splits)
                             : splice::cuda::flash_decode_live_splits(plan, s.k_len, true);

  const auto call = [&](int i) {
    splice::cuda::flash_decode(in.q[i], in.k[i], in.v[i], in.k_len, nullptr, options, in.out[i],
                               nullptr, stream, stable_prefix);
  };
  const std::uint64_t clustered = splice::cuda::flash_decode_launches().cluster_merge;
  for (int i = 0; i < r.sets; ++i) call(i);  // warm-up outside capture: sizes the workspace
  BENCH_CHECK(cudaStreamSynchronize(stream));
  r.cluster = splice::cuda::flash_decode_launches().cluster_merge - clustered ==
              static_cast<std::uint64_t>(r.sets);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < r.sets; ++i) call(i);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const splice::bench::ReplayTimes t =
      splice::bench::time_replays(exec, stream, kWarmupReplays, reps, r.sets, g_warm_ms);
  r.us = t.median_us;
  r.spread_us = t.spread_us;
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  BENCH_CHECK(cudaGraphDestroy(graph));

  if (knobs.drop_stages == 0) {  // the output check (4'); attribution runs' outputs are wrong
    splice::Tensor lse = splice::Tensor::empty({s.batch, s.num_qo_heads, 1}, splice::DType::f32,
                                               splice::Device::cuda());
    splice::cuda::flash_decode(in.q[0], in.k[0], in.v[0], in.k_len, nullptr, options, in.out[0],
                               &lse, stream, stable_prefix);
    BENCH_CHECK(cudaStreamSynchronize(stream));
    char what[160];
    std::snprintf(what, sizeof what, "%s warps %d splits %d late %d%s%s", shape_name(s).c_str(),
                  r.warps, r.splits, r.late, r.halving ? "h" : "", stable_prefix ? " stable" : "");
    r.checked = check_last_unit(in, lse, what);
  }
  return r;
}

// Sets the attribution knob (0: the mainline kernel).
void set_drop_stages(int drop_stages) {
  splice::cuda::FlashDecodeDevKnobs knobs = splice::cuda::flash_decode_dev_knobs();
  knobs.drop_stages = drop_stages;
  splice::cuda::set_flash_decode_dev_knobs(knobs);
}

// Sets the warps-per-CTA knob (0: the plan's rule).
void set_warps(int warps) {
  splice::cuda::FlashDecodeDevKnobs knobs = splice::cuda::flash_decode_dev_knobs();
  knobs.warps = warps;
  splice::cuda::set_flash_decode_dev_knobs(knobs);
}

// Sets the warps, cluster-merge and single-split knobs (0 / -1 / 0: the plan's rules).
void set_width_and_merge(int warps, int cluster_merge, std::int64_t single_split_bytes = 0,
                         bool spread = false, int trigger = -1) {
  splice::cuda::FlashDecodeDevKnobs knobs = splice::cuda::flash_decode_dev_knobs();
  knobs.warps = warps;
  knobs.cluster_merge = cluster_merge;
  knobs.single_split_bytes = single_split_bytes;
  knobs.cluster_spread = spread;
  knobs.trigger = trigger;
  splice::cuda::set_flash_decode_dev_knobs(knobs);
}

// Sets the late-split knobs (-1 / -1 / -1: the plan's rule).
void set_late(int late_splits, int late_shift, int late_halving) {
  splice::cuda::FlashDecodeDevKnobs knobs = splice::cuda::flash_decode_dev_knobs();
  knobs.late_splits = late_splits;
  knobs.late_shift = late_shift;
  knobs.late_halving = late_halving;
  splice::cuda::set_flash_decode_dev_knobs(knobs);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "flash_decode_cuda_bench.json";
  double max_kv_gb = 40.0;
  int reps = 20;
  bool quick = false;
  bool sweep = false;
  bool variants = true;
  bool ab = false;
  bool warps_ab = false;
  bool cluster_ab = false;
  std::string shapes_arg;  // "B,Hq,Hkv,k_len,D[,capacity];...": replaces the grid
  std::string plans_arg;   // "LABEL:WARPS:CLUSTER:SPLITS;...": the --plans columns
  int rounds = 3;
  double read_tbps = 0.0;  // --read-tbps: the floor's read ceiling (0: measured on this card)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (arg == "--max-kv-gb" && i + 1 < argc)
      max_kv_gb = std::atof(argv[++i]);
    else if (arg == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (arg == "--warm-ms" && i + 1 < argc)
      g_warm_ms = std::max(0.0, std::atof(argv[++i]));
    else if (arg == "--quick")
      quick = true;
    else if (arg == "--sweep")
      sweep = true;
    else if (arg == "--no-variants")
      variants = false;
    else if (arg == "--ab")
      ab = true;
    else if (arg == "--warps-ab")
      warps_ab = true;
    else if (arg == "--cluster-ab")
      cluster_ab = true;
    else if (arg == "--shapes" && i + 1 < argc)
      shapes_arg = argv[++i];
    else if (arg == "--min-sets" && i + 1 < argc)
      g_min_sets = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--plans" && i + 1 < argc)
      plans_arg = argv[++i];
    else if (arg == "--rounds" && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--read-tbps" && i + 1 < argc)
      read_tbps = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--max-kv-gb G] [--reps N] [--warm-ms M] [--quick] "
                   "[--sweep] [--no-variants] [--ab] [--warps-ab] [--cluster-ab] "
                   "[--shapes 'B,Hq,Hkv,k_len,D[,capacity];...'] [--min-sets N] "
                   "[--plans 'LABEL:WARPS:CLUSTER:SPLITS;...' [--rounds N]] [--read-tbps R]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!splice::cuda::device_available()) {
    std::printf("flash_decode_cuda_bench: no CUDA device, skipped\n");
    return 0;
  }
  splice::cuda::ensure_registered();

  std::vector<Shape> shapes;
  const std::int64_t heads[][2] = {{32, 8}, {32, 32}, {64, 8}};
  for (const auto& h : heads)
    for (std::int64_t batch : {1, 8, 32, 128})
      for (std::int64_t k_len : {1024, 4096, 16384, 65536}) {
        const Shape s{batch, h[0], h[1], k_len, 128};
        if (quick && batch != 1 && s.kv_bytes() < (std::int64_t{1} << 30)) continue;
        if (ab && (batch != 1 || h[0] != 32 || h[1] != 8)) continue;
        if (warps_ab && batch > 8) continue;
        if (cluster_ab && (batch > 32 || (batch > 1 && k_len > 4096) || h[1] == 32)) continue;
        if (static_cast<double>(s.kv_bytes()) <= max_kv_gb * 1e9) shapes.push_back(s);
      }
  for (std::int64_t k_len : {64, 256, 1024}) shapes.push_back(Shape{1, 9, 3, k_len, 64});
  if (ab || warps_ab || cluster_ab)  // the model's SmolLM2 cache: capacity 256, k_len 17-256
    for (std::int64_t k_len : {17, 64, 128, 192, 256})
      shapes.push_back(Shape{1, 9, 3, k_len, 64, 256});
  if (!shapes_arg.empty()) {  // --shapes: only these
    shapes.clear();
    std::size_t start = 0;
    while (start < shapes_arg.size()) {
      const std::size_t end = std::min(shapes_arg.find(';', start), shapes_arg.size());
      long long v[6] = {0, 0, 0, 0, 0, 0};
      const int n =
          std::sscanf(shapes_arg.substr(start, end - start).c_str(),
                      "%lld,%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
      if (n < 5 || v[0] < 1 || v[2] < 1 || v[1] % v[2] != 0 || v[3] < 1) {
        std::fprintf(stderr, "--shapes: bad shape '%s'\n",
                     shapes_arg.substr(start, end - start).c_str());
        return 2;
      }
      shapes.push_back(Shape{v[0], v[1], v[2], v[3], v[4], v[5]});
      start = end + 1;
    }
  }
  // Smallest KV first (the peers use the same order): a latency-bound shape is never timed right
  // after a multi-GB one.
  std::stable_sort(shapes.begin(), shapes.end(),
                   [](const Shape& a, const Shape& b) { return a.kv_bytes() < b.kv_bytes(); });
  cudaStream_t stream;  // (the read ceiling first: its 2 GiB are freed before the pools)
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double floor_bytes_per_s =
      read_tbps > 0.0 ? read_tbps * 1e12 : splice::bench::measure_read_bandwidth(stream);
  std::printf("floor's read bandwidth: %.3f TB/s (%s)\n", floor_bytes_per_s * 1e-12,
              read_tbps > 0.0 ? "--read-tbps" : "a 2 GiB read of 16-byte loads on this card");
  std::size_t pool_bytes = 0;  // per tensor (K or V): the largest sets x shape
  for (const Shape& s : shapes)
    pool_bytes = std::max(pool_bytes, static_cast<std::size_t>(sets_for(s)) *
                                          static_cast<std::size_t>(s.cache_bytes() / 2));
  const std::int64_t pool_elems = static_cast<std::int64_t>(pool_bytes / 2);
  splice::Tensor k_pool =
      splice::Tensor::empty({pool_elems}, splice::DType::bf16, splice::Device::cuda());
  splice::Tensor v_pool =
      splice::Tensor::empty({pool_elems}, splice::DType::bf16, splice::Device::cuda());
  splice::bench::fill_random<<<4096, 256, 0, stream>>>(k_pool.data<__nv_bfloat16>(), pool_elems,
                                                       1u);
  splice::bench::fill_random<<<4096, 256, 0, stream>>>(v_pool.data<__nv_bfloat16>(), pool_elems,
                                                       2u);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::printf("device: %s; K/V pools 2 x %.2f GB\n", splice::cuda::device_name().c_str(),
              pool_bytes / 1e9);

  if (!plans_arg.empty()) {
    struct Column {
      std::string label;
      int warps = 0, cluster = -1;
      std::int64_t splits = 0;
      int late = -1, late_shift = -1, late_halving = -1;
    };
    std::vector<Column> columns;
    std::size_t start = 0;
    while (start < plans_arg.size()) {
      const std::size_t end = std::min(plans_arg.find(';', start), plans_arg.size());
      const std::string item = plans_arg.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      char label[32] = {};
      int warps = 0, cluster = -1, late = -1, late_shift = -1, late_halving = -1;
      long long splits = 0;
      const int fields = std::sscanf(item.c_str(), "%31[^:]:%d:%d:%lld:%d:%d:%d", label, &warps,
                                     &cluster, &splits, &late, &late_shift, &late_halving);
      if (fields < 4 || (warps != 0 && warps != 4 && warps != 8) || cluster < -1 || splits < 0 ||
          late < -1 || late_shift < -1 || late_halving < -1 || late_halving > 1) {
        std::fprintf(stderr,
                     "--plans: bad column '%s' (LABEL:WARPS 0|4|8:CLUSTER >= -1:SPLITS >= "
                     "0[:LATE >= -1[:SHIFT >= -1[:HALVING -1|0|1]]])\n",
                     item.c_str());
        return 2;
      }
      columns.push_back(Column{label, warps, cluster, splits, late, late_shift, late_halving});
    }
    std::printf(
        "\nPlan columns (us per call, graph replay; per column: the rounds, then warps/splits, "
        "* = cluster merge)\n");
    for (const Shape& s : shapes) {
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      std::vector<std::vector<Result>> runs(columns.size());
      for (int round = 0; round < rounds; ++round)
        for (std::size_t i = 0; i < columns.size(); ++i) {
          set_width_and_merge(columns[i].warps, columns[i].cluster);
          set_late(columns[i].late, columns[i].late_shift, columns[i].late_halving);
          runs[i].push_back(run_shape(in, reps, stream, columns[i].splits));
        }
      set_width_and_merge(0, -1);
      set_late(-1, -1, -1);
      std::printf("%-26s sets=%d\n", shape_name(s).c_str(), in.sets);
      for (std::size_t i = 0; i < columns.size(); ++i) {
        double best = runs[i][0].us;
        std::printf("  %-10s", columns[i].label.c_str());
        for (const Result& r : runs[i]) {
          std::printf(" %9.2f", r.us);
          best = std::min(best, r.us);
        }
        const Result& r = runs[i][0];
        std::printf("  w%d s%d%s l%d%s  best %9.2f\n", r.warps, r.splits, r.cluster ? "*" : "",
                    r.late, r.halving ? "h" : "", best);
      }
      std::fflush(stdout);
    }
    BENCH_CHECK(cudaStreamDestroy(stream));
    return checks_exit_code();
  }

  if (cluster_ab) {
    // Split merge through thread-block clusters (DSMEM into split 0) against the global merge,
    // per width: `rule` = the plan's rules; g = global merge (cluster knob 0); c = clusters with
    // the splits capped at 16 (knob 1); w4 / w8 = the width forced. Two alternating rounds, the
    // faster kept; per column the grid's splits and whether clusters merged (*).
    struct Column {
      const char* name;
      int warps, cluster;
      std::int64_t single_split_bytes = 0;
      bool spread = false;
      int trigger = -1;  // -1: the plan's; else a FlashDecodeTrigger value
    };
    // `s`: the spread cluster scheduling policy; `x` / `-x` / `m`: the cluster grid lets the
    // next kernel launch at exit / right after its wait / in split 0 once every partial has
    // landed (FlashDecodeTrigger; the plan's rule sets `m` for its 8-split head_dim 128
    // clusters only).
    const Column columns[] = {{"rule", 0, -1},
                              {"rule -x", 0, -1, 0, false, 0},
                              {"rule x", 0, -1, 0, false, 1},
                              {"g", 0, 0},
                              {"w8 c8 x", 8, 8, 0, false, 1},
                              {"w8 c8 -x", 8, 8, 0, false, 0},
                              {"w4 c8 s", 4, 8, 0, true, 0},
                              {"w4 c8 s x", 4, 8, 0, true, 1},
                              {"w8 c4 x", 8, 4, 0, false, 1}};
    std::printf("\nCluster merge A/B (us per call, graph replay; splits, * = cluster merge)\n");
    std::printf("%-26s %4s", "shape (B,Hq,Hkv,k_len,D)", "sets");
    for (const Column& c : columns) std::printf(" %13s", c.name);
    std::printf("\n");
    for (const Shape& s : shapes) {
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      Result best[std::size(columns)];
      for (int round = 0; round < 2; ++round)
        for (std::size_t i = 0; i < std::size(columns); ++i) {
          set_width_and_merge(columns[i].warps, columns[i].cluster, columns[i].single_split_bytes,
                              columns[i].spread, columns[i].trigger);
          const Result r = run_shape(in, reps, stream);
          if (round == 0 || r.us < best[i].us) best[i] = r;
        }
      set_width_and_merge(0, -1);
      std::printf("%-26s %4d", shape_name(s).c_str(), in.sets);
      for (const Result& r : best)
        std::printf(" %7.2f %3d%s", r.us, r.splits, r.cluster ? "*" : " ");
      std::printf("\n");
      std::fflush(stdout);
    }
    BENCH_CHECK(cudaStreamDestroy(stream));
    return checks_exit_code();
  }

  if (warps_ab) {
    std::printf(
        "\n4-warp against 8-warp CTAs (us per call, graph replay; splits/live per width)\n");
    std::printf("%-26s %4s %9s %9s %7s %7s %7s %7s %6s\n", "shape (B,Hq,Hkv,k_len,D)", "sets",
                "w4 spl/lv", "w8 spl/lv", "w4", "w8", "w4", "w8", "w8/w4");
    for (const Shape& s : shapes) {
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      Result runs[4];
      for (int i = 0; i < 4; ++i) {
        set_warps(i % 2 == 0 ? 4 : 8);
        runs[i] = run_shape(in, reps, stream);
      }
      set_warps(0);
      const double w4 = std::min(runs[0].us, runs[2].us), w8 = std::min(runs[1].us, runs[3].us);
      std::printf("%-26s %4d %4d/%-4d %4d/%-4d %7.2f %7.2f %7.2f %7.2f %6.3f\n",
                  shape_name(s).c_str(), in.sets, runs[0].splits, runs[0].live, runs[1].splits,
                  runs[1].live, runs[0].us, runs[1].us, runs[2].us, runs[3].us, w8 / w4);
      std::fflush(stdout);
    }
    BENCH_CHECK(cudaStreamDestroy(stream));
    return checks_exit_code();
  }

  if (ab) {
    // The table of dev/flash_b1: the plan's split count twice (their difference is the noise),
    // attribution, then forced split counts. `sets` = calls per replayed graph: the replay's
    // fixed cost (~3 us) adds ~3 / sets us to every column of a row.
    std::printf("\nA/B (us per call, graph replay)\n");
    std::printf("%-26s %4s %4s %7s %7s %7s %7s |", "shape (B,Hq,Hkv,k_len,D)", "sets", "live",
                "plan", "plan", "-merge", "-mrg-kv");
    const std::int64_t forced_counts[] = {1, 4, 16, 32};  // 8 and 64 lost everywhere at 10:05
    for (std::int64_t f : forced_counts) std::printf(" %6lld", static_cast<long long>(f));
    std::printf("\n");
    for (const Shape& s : shapes) {
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      set_drop_stages(0);
      Result plan_runs[2];
      for (Result& r : plan_runs) r = run_shape(in, reps, stream);
      double dropped[2];  // attribution: the plan without its merge, then without K/V too
      for (int i = 0; i < 2; ++i) {
        set_drop_stages(i == 0 ? 1 : 3);
        dropped[i] = run_shape(in, reps, stream).us;
      }
      set_drop_stages(0);
      std::printf("%-26s %4d %4d %7.2f %7.2f %7.2f %7.2f |", shape_name(s).c_str(), in.sets,
                  plan_runs[0].live, plan_runs[0].us, plan_runs[1].us, dropped[0], dropped[1]);
      for (std::int64_t f : forced_counts) std::printf(" %6.2f", run_shape(in, reps, stream, f).us);
      std::printf("\n");
      std::fflush(stdout);
    }
    BENCH_CHECK(cudaStreamDestroy(stream));
    return checks_exit_code();
  }

  std::vector<Result> results;
  for (const Shape& s : shapes) {
    Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
    results.push_back(run_shape(in, reps, stream));
    Result& r = results.back();
    if (s.batch <= 8) r.stable_us = run_shape(in, reps, stream, 0, true).us;
    std::printf("  %-26s sets=%-4d warps=%d splits=%-3d live=%-3d late=%-2d %9.2f us (spread %.2f)",
                shape_name(s).c_str(), r.sets, r.warps, r.splits, r.live, r.late, r.us,
                r.spread_us);
    if (r.stable_us > 0) std::printf(", stable prefix %.2f us", r.stable_us);
    std::printf("\n");
    std::fflush(stdout);
  }

  if (sweep) {  // forced split counts on the small-batch shapes: is the planned count the best?
    std::printf("\nsplit sweep (B=1, (32,8) and (64,8)), us per call:\n");
    for (const Shape& s : shapes) {
      if (s.batch != 1 || s.num_kv_heads != 8 || s.k_len > 16384) continue;
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      std::printf("  %-26s", shape_name(s).c_str());
      for (std::int64_t splits : {8, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
        const Result r = run_shape(in, reps, stream, splits);
        std::printf(" %lld:%.2f", static_cast<long long>(splits), r.us);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  if (variants) {
    // Plan check: the plan's choice (live splits in parentheses) against forced split counts.
    std::printf("\nplan check, us per call: plan(live) then forced splits:\n");
    for (const Shape& s : shapes) {
      if (!s.smollm2() &&
          !(s.batch == 1 && s.num_qo_heads == 32 && s.num_kv_heads == 8 && s.k_len <= 4096))
        continue;
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      const Result planned = run_shape(in, reps, stream);
      std::printf("  %-26s plan(%d) %.2f", shape_name(s).c_str(), planned.live, planned.us);
      for (std::int64_t splits : {1, 2, 4, 8, 16}) {
        const Result r = run_shape(in, reps, stream, splits);
        std::printf("  %lld:%.2f", static_cast<long long>(splits), r.us);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    // Attribution: programmatic dependent launch off (P-) and on (P+).
    std::printf("\nPDL off / on (batch <= 8), us per call:\n");
    const bool pdl_default = splice::cuda::pdl_enabled();
    for (const Shape& s : shapes) {
      if (s.batch > 8) continue;
      Inputs in(s, k_pool.storage(), v_pool.storage(), stream);
      std::printf("  %-26s", shape_name(s).c_str());
      for (bool pdl : {false, true}) {
        splice::cuda::set_pdl_enabled(pdl);
        const Result r = run_shape(in, reps, stream);
        std::printf("  P%c %.2f", pdl ? '+' : '-', r.us);
      }
      splice::cuda::set_pdl_enabled(pdl_default);
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  std::ofstream json(json_path);
  json << "{\n  \"device\": \"" << splice::cuda::device_name()
       << "\",\n  \"floor_tbps\": " << floor_bytes_per_s * 1e-12 << ",\n"
       << "  \"method\": \"graph of `sets` rotating calls, median of " << reps
       << " replays / sets\",\n  \"rows\": [\n";
  // `stable us`: batch <= 8 under the stable-prefix promise (what a decode step launches).
  std::printf("\n%-28s %10s %9s %8s %8s %10s\n", "shape (B,Hq,Hkv,k_len,D)", "splice us", "GB/s",
              "%floor", "floor us", "stable us");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double bytes = static_cast<double>(r.shape.kv_bytes());
    const double gbps = bytes / (r.us * 1e-6) / 1e9;
    const double floor_us = bytes / floor_bytes_per_s * 1e6;
    std::printf("%-28s %10.2f %9.0f %7.1f%% %8.2f %10.2f\n", shape_name(r.shape).c_str(), r.us,
                gbps, 100.0 * floor_us / r.us, floor_us, r.stable_us);
    json << "    {\"batch\": " << r.shape.batch << ", \"num_qo_heads\": " << r.shape.num_qo_heads
         << ", \"num_kv_heads\": " << r.shape.num_kv_heads << ", \"k_len\": " << r.shape.k_len
         << ", \"head_dim\": " << r.shape.head_dim << ", \"kv_bytes\": " << r.shape.kv_bytes()
         << ", \"sets\": " << r.sets << ", \"warps\": " << r.warps << ", \"splits\": " << r.splits
         << ", \"live_splits\": " << r.live << ", \"late_splits\": " << r.late
         << ", \"late_halving\": " << (r.halving ? "true" : "false") << ", \"us\": " << r.us
         << ", \"spread_us\": " << r.spread_us << ", \"stable_prefix_us\": " << r.stable_us
         << ", \"output_checked\": " << (r.checked ? "true" : "false") << ", \"gbps\": " << gbps
         << ", \"floor_us\": " << floor_us << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  json << "  ]\n}\n";
  BENCH_CHECK(cudaStreamDestroy(stream));
  return checks_exit_code();
}
