// dev/icache/icache.cu: does a decode step pay for cold instruction caches? (issue #7, run 25)
//
// Run 24's stage stamps put flash decode's tile loop at ~2.3 us for three 16-key tiles per warp,
// several times its instruction count. Flash decode's D = 64 kernel is 79 KB of SASS and the
// step's GEMV instances 20-53 KB each; one layer runs ~250 KB of distinct code, more than an
// SM's instruction caches hold, so each kernel may start every layer with cold caches, fetching
// its code from L2.
//
// The experiment: K distinct kernels of N independent FMAs each (straight-line code, 16 bytes an
// instruction: N = 1024 is 16 KB), one CTA of 32 threads per SM (132 CTAs), launched in a
// 240-launch PDL chain captured in one graph, kernel i % K at launch i. K = 1 replays one kernel
// (its code stays cached), K > 1 rotates K (K x N x 16 bytes of code between two runs of the
// same kernel). Prints us per launch for N in {256, 512, 1024, 2048} and K in {1, 2, 4, 8, 16},
// with the rotating code's size: where the time jumps is the capacity of the SM's instruction
// caches; K = 16 minus K = 1 is the cold-code cost of N instructions. (Run 26 ran the first
// version: N in {256, 1024, 4096}, K in {1, 8}.)
//
// Build and run (device): nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \
//   -o icache dev/icache/icache.cu && ./icache
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../experiment_util.cuh"

namespace {

using namespace experiment;

constexpr int kLaunches = 240, kReplays = 50, kCtas = 132;

// N independent FMAs over 8 accumulators (no dependent chain longer than N / 8), constants
// distinct per kernel id so the K kernels are K copies of the code.
template <int kId, int kN>
__global__ void straight_line(float* out) {
  pdl_wait();
  pdl_trigger();
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = threadIdx.x + j;
#pragma unroll
  for (int i = 0; i < kN; ++i)
    acc[i % 8] = fmaf(acc[i % 8], 1.0f + 1e-7f * (i + kId), 1e-6f * (kId + 1));
  float s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += acc[j];
  if (s == 12345.0f) out[blockIdx.x] = s;  // keeps the FMAs alive, never true
}

template <int kN, int... kIds>
std::vector<void (*)(float*)> kernels(std::integer_sequence<int, kIds...>) {
  return {straight_line<kIds, kN>...};
}

template <int kN>
double us_per_launch(int distinct, float* out, cudaStream_t stream) {
  const std::vector<void (*)(float*)> ks = kernels<kN>(std::make_integer_sequence<int, 16>{});
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kLaunches; ++i) launch_pdl(ks[i % distinct], kCtas, 32, 0, stream, out);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < kReplays + 3; ++r) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) t.push_back(ms * 1000.0f / kLaunches);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return t[t.size() / 2];
}

}  // namespace

int main() {
  float* out = nullptr;
  CHECK(cudaMalloc(&out, kCtas * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("us per launch, %d-launch PDL chain, %d CTAs of 32 threads (median of %d replays)\n",
              kLaunches, kCtas, kReplays);
  // Rows: kernel size; columns: how many distinct kernels rotate (their code in all, KB).
  std::printf("%8s %6s", "FMAs", "KB");
  for (int k : {1, 2, 4, 8, 16}) std::printf(" %9s%-2d", "kernels=", k);
  std::printf("\n");
  const auto row = [&](int n, auto measure) {
    std::printf("%8d %6d", n, n * 16 / 1024);
    for (int k : {1, 2, 4, 8, 16}) std::printf(" %6.3f(%3d)", measure(k), k * n * 16 / 1024);
    std::printf("\n");
  };
  row(256, [&](int k) { return us_per_launch<256>(k, out, stream); });
  row(512, [&](int k) { return us_per_launch<512>(k, out, stream); });
  row(1024, [&](int k) { return us_per_launch<1024>(k, out, stream); });
  row(2048, [&](int k) { return us_per_launch<2048>(k, out, stream); });
  CHECK(cudaFree(out));
  return 0;
}
