// Benchmark of the CUDA flash-decode kernel on the issue-5 grid (a plain main; prints a table and
// writes JSON).
//
//   1. Grid: batch {1, 8, 32, 128} x k_len {1K, 4K, 16K, 64K} x (Hq, Hkv) {(32, 8), (32, 32),
//      (64, 8)}, head_dim 128, bf16, q_len 1 (shapes whose K+V exceed --max-kv-gb are skipped).
//   2. Bytes first: KV = 2 * batch * Hkv * k_len * head_dim * 2 bytes, the floor is KV / 4.4 TB/s.
//   3. Timing: `sets` independent input sets (K, V, q, out) rotate so at least 512 MB is touched
//      per replay and the 60 MB L2 cannot flatter; one CUDA graph holds one call per set; after
//      warm-up, each of --reps replays is timed with events; time per call = median replay / sets.
//      The PyTorch peers (bench/peers/attention_peers.py) are timed the same way.
//   4. Output: one row per shape (us, effective KV GB/s, % of the 4.4 TB/s floor) and JSON.
//   5. Variants (unless --no-variants): the batch <= 8 shapes again with thread-block clusters
//      (C), programmatic dependent launch (P) and the wide 8-warp cluster variant (W) switched
//      off and on, to attribute the savings; the resident-cluster counts the launcher queried
//      are printed with them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/tensor.h"

namespace splice::cuda::detail {
void set_flash_decode_features(bool cluster, bool pdl, bool wide);  // flash_decode.cu (A/B)
std::string flash_decode_cluster_summary();  // resident clusters per instantiation
std::string flash_decode_last_launch();      // "<cluster>x<grid splits>[w]"
}  // namespace splice::cuda::detail

namespace {

constexpr double kFloorBytesPerSecond = 4.4e12;  // measured read ceiling (design.md §4)
constexpr std::size_t kRotateBytes = std::size_t{512} << 20;
constexpr int kMaxSets = 64;
constexpr int kWarmupReplays = 3;
constexpr std::int64_t kHeadDim = 128;

#define BENCH_CHECK(call)                                                          \
  do {                                                                             \
    const cudaError_t status_ = (call);                                            \
    if (status_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(status_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Deterministic pseudo-random bf16 values in [-2, 2) (a hash of the index; never zeros).
__global__ void fill_random(__nv_bfloat16* data, std::size_t count, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed ^
                      static_cast<std::uint32_t>(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    data[i] = __float2bfloat16(static_cast<float>(x & 0xFFFFu) / 16384.0f - 2.0f);
  }
}

struct Shape {
  std::int64_t batch, num_qo_heads, num_kv_heads, k_len;
  std::int64_t kv_bytes() const { return 2 * batch * num_kv_heads * k_len * kHeadDim * 2; }
};

struct Result {
  Shape shape;
  int sets = 0;
  int splits = 0;
  std::string launch;  // the launch's "<cluster>x<grid splits>[w]" (w: the 8-warp variant)
  double us = 0.0;
  double spread_us = 0.0;  // max - min replay time per call
};

splice::Tensor device_view(const std::shared_ptr<splice::Storage>& storage, std::int64_t offset,
                           const splice::Dims& shape) {
  return splice::Tensor::view_of(storage, offset, shape, splice::Tensor::contiguous_strides(shape),
                                 splice::DType::bf16);
}

Result run_shape(const Shape& s, const std::shared_ptr<splice::Storage>& k_pool,
                 const std::shared_ptr<splice::Storage>& v_pool, int reps, cudaStream_t stream,
                 std::int64_t forced_splits = 0) {
  Result r;
  r.shape = s;
  const std::size_t per_tensor = static_cast<std::size_t>(s.kv_bytes() / 2);
  r.sets = static_cast<int>(
      std::clamp<std::size_t>((kRotateBytes + s.kv_bytes() - 1) / s.kv_bytes(), 1, kMaxSets));
  const splice::Dims kv_shape = {s.batch, s.num_kv_heads, s.k_len, kHeadDim};
  const splice::Dims q_shape = {s.batch, s.num_qo_heads, 1, kHeadDim};
  const std::int64_t kv_elems = static_cast<std::int64_t>(per_tensor / 2);

  std::vector<splice::Tensor> q, k, v, out;
  for (int i = 0; i < r.sets; ++i) {
    k.push_back(device_view(k_pool, i * kv_elems, kv_shape));
    v.push_back(device_view(v_pool, i * kv_elems, kv_shape));
    q.push_back(splice::Tensor::empty(q_shape, splice::DType::bf16, splice::Device::cuda()));
    fill_random<<<256, 256, 0, stream>>>(q.back().data<__nv_bfloat16>(), q.back().numel(), 77u + i);
    out.push_back(splice::Tensor::empty(q_shape, splice::DType::bf16, splice::Device::cuda()));
  }
  std::vector<std::int32_t> lens(static_cast<std::size_t>(s.batch),
                                 static_cast<std::int32_t>(s.k_len));
  splice::Tensor k_len =
      splice::Tensor::empty({s.batch}, splice::DType::i32, splice::Device::cuda());
  BENCH_CHECK(cudaMemcpy(k_len.raw_data(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  splice::DecodeAttentionOptions options;
  options.num_splits = forced_splits;
  r.splits = forced_splits > 0 ? static_cast<int>(forced_splits)
                               : splice::cuda::plan_flash_decode(
                                     s.batch, s.num_qo_heads, s.num_kv_heads, 1, kHeadDim, s.k_len,
                                     s.k_len, splice::cuda::sm_count())
                                     .num_splits;

  for (int i = 0; i < r.sets; ++i)  // warm-up outside capture: sizes the workspace
    splice::cuda::flash_decode(q[i], k[i], v[i], k_len, nullptr, options, out[i], nullptr, stream);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  r.launch = splice::cuda::detail::flash_decode_last_launch();

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < r.sets; ++i)
    splice::cuda::flash_decode(q[i], k[i], v[i], k_len, nullptr, options, out[i], nullptr, stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < kWarmupReplays; ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(cudaGraphLaunch(exec, stream));
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e3 / r.sets);
  }
  std::sort(times.begin(), times.end());
  r.us = times[times.size() / 2];
  r.spread_us = times.back() - times.front();
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  BENCH_CHECK(cudaGraphDestroy(graph));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "flash_decode_cuda_bench.json";
  double max_kv_gb = 40.0;
  int reps = 20;
  bool quick = false;
  bool sweep = false;
  bool variants = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (arg == "--max-kv-gb" && i + 1 < argc)
      max_kv_gb = std::atof(argv[++i]);
    else if (arg == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (arg == "--quick")
      quick = true;
    else if (arg == "--sweep")
      sweep = true;
    else if (arg == "--no-variants")
      variants = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--max-kv-gb G] [--reps N] [--quick] [--sweep] "
                   "[--no-variants]\n",
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
        const Shape s{batch, h[0], h[1], k_len};
        if (quick && batch != 1 && s.kv_bytes() < (std::int64_t{1} << 30)) continue;
        if (static_cast<double>(s.kv_bytes()) <= max_kv_gb * 1e9) shapes.push_back(s);
      }
  // Smallest KV first (the peers use the same order): a latency-bound shape is never timed right
  // after a multi-GB one.
  std::stable_sort(shapes.begin(), shapes.end(),
                   [](const Shape& a, const Shape& b) { return a.kv_bytes() < b.kv_bytes(); });
  std::size_t pool_bytes = 0;  // per tensor (K or V): the largest sets x shape
  for (const Shape& s : shapes) {
    const std::size_t per = static_cast<std::size_t>(s.kv_bytes() / 2);
    const std::size_t sets =
        std::clamp<std::size_t>((kRotateBytes + 2 * per - 1) / (2 * per), 1, kMaxSets);
    pool_bytes = std::max(pool_bytes, sets * per);
  }
  const std::int64_t pool_elems = static_cast<std::int64_t>(pool_bytes / 2);
  splice::Tensor k_pool =
      splice::Tensor::empty({pool_elems}, splice::DType::bf16, splice::Device::cuda());
  splice::Tensor v_pool =
      splice::Tensor::empty({pool_elems}, splice::DType::bf16, splice::Device::cuda());
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fill_random<<<4096, 256, 0, stream>>>(k_pool.data<__nv_bfloat16>(), pool_elems, 1u);
  fill_random<<<4096, 256, 0, stream>>>(v_pool.data<__nv_bfloat16>(), pool_elems, 2u);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::printf("device: %s; K/V pools 2 x %.2f GB\n", splice::cuda::device_name().c_str(),
              pool_bytes / 1e9);

  std::vector<Result> results;
  for (const Shape& s : shapes) {
    results.push_back(run_shape(s, k_pool.storage(), v_pool.storage(), reps, stream));
    const Result& r = results.back();
    std::printf(
        "  B=%-3lld Hq=%-2lld Hkv=%-2lld k_len=%-6lld sets=%-2d splits=%-3d launch=%-6s %9.2f us "
        "(spread %.2f)\n",
        static_cast<long long>(s.batch), static_cast<long long>(s.num_qo_heads),
        static_cast<long long>(s.num_kv_heads), static_cast<long long>(s.k_len), r.sets, r.splits,
        r.launch.c_str(), r.us, r.spread_us);
    std::fflush(stdout);
  }

  if (sweep) {  // forced split counts on the small-batch shapes: is the planned count the best?
    std::printf("\nsplit sweep (B=1, (32,8) and (64,8)), us per call:\n");
    for (const Shape& s : shapes) {
      if (s.batch != 1 || s.num_kv_heads != 8 || s.k_len > 16384) continue;
      std::printf("  Hq=%-2lld k_len=%-6lld", static_cast<long long>(s.num_qo_heads),
                  static_cast<long long>(s.k_len));
      for (std::int64_t splits : {8, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
        const Result r = run_shape(s, k_pool.storage(), v_pool.storage(), reps, stream, splits);
        std::printf(" %lld:%.2f", static_cast<long long>(splits), r.us);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  std::printf("\ncluster capacity:\n%s",
              splice::cuda::detail::flash_decode_cluster_summary().c_str());

  if (variants) {  // attribution: clusters (C), PDL (P), the wide variant (W) off (-) / on (+)
    std::printf("\nvariants (batch <= 8), us per call (launch shape):\n");
    for (const Shape& s : shapes) {
      if (s.batch > 8) continue;
      std::printf("  B=%-2lld Hq=%-2lld Hkv=%-2lld k_len=%-6lld", static_cast<long long>(s.batch),
                  static_cast<long long>(s.num_qo_heads), static_cast<long long>(s.num_kv_heads),
                  static_cast<long long>(s.k_len));
      constexpr bool kVariants[][3] = {{false, false, false}, {false, true, false},
                                       {true, false, false},  {true, true, false},
                                       {true, false, true},   {true, true, true}};
      for (const auto& f : kVariants) {
        splice::cuda::detail::set_flash_decode_features(f[0], f[1], f[2]);
        const Result r = run_shape(s, k_pool.storage(), v_pool.storage(), reps, stream);
        std::printf("  C%cP%cW%c %.2f (%s)", f[0] ? '+' : '-', f[1] ? '+' : '-', f[2] ? '+' : '-',
                    r.us, r.launch.c_str());
      }
      splice::cuda::detail::set_flash_decode_features(false, true, false);  // the defaults
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  std::ofstream json(json_path);
  json << "{\n  \"device\": \"" << splice::cuda::device_name() << "\",\n  \"floor_tbps\": 4.4,\n"
       << "  \"method\": \"graph of `sets` rotating calls, median of " << reps
       << " replays / sets\",\n  \"rows\": [\n";
  std::printf("\n%-28s %10s %9s %8s %8s\n", "shape (B,Hq,Hkv,k_len)", "splice us", "GB/s", "%4.4TB",
              "floor us");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double bytes = static_cast<double>(r.shape.kv_bytes());
    const double gbps = bytes / (r.us * 1e-6) / 1e9;
    const double floor_us = bytes / kFloorBytesPerSecond * 1e6;
    char name[64];
    std::snprintf(name, sizeof name, "(%lld,%lld,%lld,%lld)", static_cast<long long>(r.shape.batch),
                  static_cast<long long>(r.shape.num_qo_heads),
                  static_cast<long long>(r.shape.num_kv_heads),
                  static_cast<long long>(r.shape.k_len));
    std::printf("%-28s %10.2f %9.0f %7.1f%% %8.2f\n", name, r.us, gbps, 100.0 * floor_us / r.us,
                floor_us);
    json << "    {\"batch\": " << r.shape.batch << ", \"num_qo_heads\": " << r.shape.num_qo_heads
         << ", \"num_kv_heads\": " << r.shape.num_kv_heads << ", \"k_len\": " << r.shape.k_len
         << ", \"head_dim\": " << kHeadDim << ", \"kv_bytes\": " << r.shape.kv_bytes()
         << ", \"sets\": " << r.sets << ", \"splits\": " << r.splits << ", \"us\": " << r.us
         << ", \"spread_us\": " << r.spread_us << ", \"gbps\": " << gbps
         << ", \"floor_us\": " << floor_us << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  json << "  ]\n}\n";
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}
