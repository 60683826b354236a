// Benchmark of the greedy-sampling argmax (src/backend/cuda/sampling.cu) against what the host
// path pays per token for the same choice (a plain main; prints a table and writes JSON).
//
//   1. Shapes: one row (batch 1 decode) of vocab 32768, 49152 (SmolLM2), 151936 (Qwen), 262144,
//      bf16 and f32 logits; CTAs per row 1, 2, 4, 8 and the automatic choice.
//   2. Device time: kCalls argmax calls on the same logits are captured into one CUDA graph (the
//      decode step records the argmax into its graph; the logits were just written, so they sit in
//      L2: the same buffer every call models that); after warm-up each of kReps replays is timed
//      with events; time per call = median replay / kCalls. The calls form a PDL chain, so this is
//      the latency a dependent argmax adds to a step.
//   3. Host path: a synchronous device-to-host copy of the f32 logits row plus the host argmax
//      (cpu::argmax_row), the per-token work the in-step argmax removes, median of kReps.
//   4. Check: every configuration's id equals the CPU argmax of the same logits.
//   5. Output: one row per shape (us per call for each CTA count, host path us, GB/s of the best)
//      and JSON at argv[1] (default argmax_cuda_bench.json).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "splice/backend/cpu/sampling.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/backend/cuda/sampling.h"
#include "splice/core/random.h"
#include "splice/core/tensor.h"

namespace {

using splice::DType;
using splice::Tensor;
namespace cuda = splice::cuda;

constexpr int kCalls = 100;  // argmax calls captured per graph
constexpr int kWarmupReplays = 3;
constexpr int kReps = 30;
const int kCtaChoices[] = {1, 2, 4, 8, 0};  // 0: automatic

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time per argmax call (us) inside a captured graph of kCalls calls.
double time_device(const Tensor& logits, Tensor& ids, int ctas, cuda::Stream stream) {
  cuda::ArgmaxOptions options;
  options.ctas_per_row = ctas;
  cudaGraphExec_t exec = nullptr;
  {
    cuda::StreamGuard guard(stream);
    cuda::begin_capture(stream);
    for (int c = 0; c < kCalls; ++c) cuda::argmax(logits, ids, options);
    exec = reinterpret_cast<cudaGraphExec_t>(cuda::end_capture(stream));
  }
  const splice::bench::ReplayTimes t =
      splice::bench::time_replays(exec, stream, kWarmupReplays, kReps, kCalls);
  cuda::destroy_graph(reinterpret_cast<cuda::GraphExec>(exec));
  return t.median_us;
}

// Median time (us) of the host path: the f32 row to the host, then the host argmax.
double time_host_path(const Tensor& logits_f32, std::int32_t& pick) {
  std::vector<float> host(static_cast<std::size_t>(logits_f32.numel()));
  std::vector<double> us;
  for (int r = 0; r < kWarmupReplays + kReps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(cudaMemcpy(host.data(), logits_f32.raw_data(), host.size() * sizeof(float),
                           cudaMemcpyDeviceToHost));
    pick = static_cast<std::int32_t>(
        splice::cpu::argmax_row(host.data(), static_cast<std::int64_t>(host.size())));
    const double t =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (r >= kWarmupReplays) us.push_back(t);
  }
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::printf("argmax_cuda_bench: no CUDA device, skipped\n");
    return 0;
  }
  cuda::ensure_registered();
  const std::string json_path = argc > 1 ? argv[1] : "argmax_cuda_bench.json";
  cuda::Stream stream = cuda::create_stream();
  splice::Rng rng(1);
  std::string json = "[\n";
  std::printf("%-8s %-5s %9s %9s %9s %9s %14s %11s %9s %7s\n", "vocab", "dtype", "1 CTA", "2", "4",
              "8", "auto (CTAs)", "host path", "best GB/s", "check");
  bool first = true;
  for (std::int64_t vocab : {32768, 49152, 151936, 262144})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Tensor host = Tensor::empty({1, vocab}, DType::f32);
      rng.normal(host, 0.0, 1.0);
      const Tensor host_typed = host.to(dtype);
      const Tensor logits = host_typed.to_device(splice::Device::cuda());
      const Tensor logits_f32 = host.to_device(splice::Device::cuda());
      Tensor ids = Tensor::zeros({1}, DType::i32, splice::Device::cuda());
      Tensor want = Tensor::zeros({1}, DType::i32);
      splice::cpu::argmax(host_typed, want);
      std::vector<double> us;
      bool ok = true;
      for (int ctas : kCtaChoices) {
        us.push_back(time_device(logits, ids, ctas, stream));
        ok &= ids.to_device(splice::Device::cpu()).data<std::int32_t>()[0] ==
              want.data<std::int32_t>()[0];
      }
      std::int32_t host_pick = -1;
      const double host_us = time_host_path(logits_f32, host_pick);
      const double best = *std::min_element(us.begin(), us.end());
      const double bytes =
          static_cast<double>(vocab * static_cast<std::int64_t>(splice::dtype_size(dtype)));
      const int auto_ctas = cuda::argmax_launch(vocab, dtype).ctas_per_row;
      std::printf("%-8lld %-5s %9.2f %9.2f %9.2f %9.2f %9.2f (%d) %11.2f %9.0f %7s\n",
                  static_cast<long long>(vocab), splice::dtype_name(dtype), us[0], us[1], us[2],
                  us[3], us[4], auto_ctas, host_us, bytes / (best * 1e-6) / 1e9,
                  ok ? "ok" : "FAIL");
      char row[512];
      std::snprintf(row, sizeof row,
                    "%s  {\"vocab\": %lld, \"dtype\": \"%s\", \"us_1\": %.3f, \"us_2\": %.3f, "
                    "\"us_4\": %.3f, \"us_8\": %.3f, \"us_auto\": %.3f, \"auto_ctas\": %d, "
                    "\"host_path_us\": %.3f, \"ok\": %s}",
                    first ? "" : ",\n", static_cast<long long>(vocab), splice::dtype_name(dtype),
                    us[0], us[1], us[2], us[3], us[4], auto_ctas, host_us, ok ? "true" : "false");
      json += row;
      first = false;
    }
  json += "\n]\n";
  std::ofstream(json_path) << json;
  cuda::destroy_stream(stream);
  std::printf("JSON: %s\n", json_path.c_str());
  return 0;
}
