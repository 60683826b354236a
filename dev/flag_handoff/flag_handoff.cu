// dev/flag_handoff: can a kernel hand its output to the next one faster than the PDL grid
// hand-off (issue #7)? Standalone, not yet run (written at the end of session 9):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o flag_handoff flag_handoff.cu
//   ./flag_handoff
//
// The decode step is ~150 dependent kernels, and each boundary costs ~0.5 us between a kernel's
// last store and the next kernel's griddepcontrol.wait returning (dev/chain_latency, perf.md run
// 17): the grid must complete and its memory be flushed first. This compares, on a chain of
// kChain launches of one tiny kernel (read 1 KB the previous launch wrote, write 1 KB) captured
// in one CUDA graph, every launch with the PDL attribute and triggering its dependents first:
//   pdl:  griddepcontrol.wait, then the work (launch.cuh's rule);
//   flag: no griddepcontrol.wait; thread 0 spins until the previous launch's done counter
//         reaches its CTA count (ld.acquire.gpu), then the CTA works; after the work each CTA
//         bar.syncs and thread 0 adds 1 to its own counter with release semantics
//         (red.release.gpu). The counters are zeroed by a memset node at the head of the graph.
// A dependent grid is launched only once every CTA of its primary has triggered (run its first
// instruction), so a spinning grid never holds the SMs its producer still needs to start; the
// chain of resident spinning grids is bounded by the resources, and the running one always
// makes progress. Spinning CTAs take issue slots from the producer on the same SM: variant
// flag_sleep backs off with __nanosleep(32) between polls.
// Output: us per kernel (median of kReps replays / kChain) per variant and grid size, and the
// chain's result checked (every launch adds 1). Expectation, from the SASS: the release add
// compiles to MEMBAR.ALL.GPU + REDG (the fence waits for the CTA's stores to be acknowledged),
// and the poll is an L2 round trip per try, so the flag hand-off is ~2-3 L2 round trips; it wins
// only if the grid-completion path costs more than that (chain.cu measured it at ~0.5 us).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../experiment_util.cuh"  // CHECK, pdl_wait / pdl_trigger, launch_pdl

namespace {

constexpr int kChain = 200;
constexpr int kWarmup = 3;
constexpr int kReps = 30;
constexpr int kFloats = 256;  // 1 KB per launch
constexpr int kThreads = 128;

enum Variant : int { kPdl = 0, kFlag = 1, kFlagSleep = 2 };

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Launch `index` of the chain: out[i] = in[i] + 1 over kFloats floats, grid-strided (with more
// threads than floats the other CTAs only take part in the hand-off, as a GEMV's CTAs would).
template <int kVariant>
__global__ void __launch_bounds__(kThreads) link(const float* in, float* out, unsigned* done,
                                                 int index) {
  experiment::pdl_trigger();
  if constexpr (kVariant == kPdl) {
    experiment::pdl_wait();
  } else {
    if (threadIdx.x == 0 && index > 0) {
      while (load_acquire(done + index - 1) < gridDim.x) {
        if constexpr (kVariant == kFlagSleep) __nanosleep(32);
      }
    }
    __syncthreads();  // the CTA's threads after thread 0's acquire (bar.sync orders them)
  }
  for (int i = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
       i < kFloats; i += static_cast<int>(gridDim.x) * kThreads)
    out[i] = in[i] + 1.0f;
  if constexpr (kVariant != kPdl) {
    __syncthreads();  // every thread's store before thread 0's release (cumulativity)
    if (threadIdx.x == 0) add_release(done + index, 1u);
  }
}

template <int kVariant>
float time_chain(int grid, float* buf, unsigned* done, cudaStream_t stream, bool check) {
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(done, 0, kChain * sizeof(unsigned), stream));
  CHECK(cudaMemsetAsync(buf, 0, kFloats * sizeof(float), stream));
  for (int k = 0; k < kChain; ++k) {
    const float* in = buf + (k % 2) * kFloats;
    float* out = buf + ((k + 1) % 2) * kFloats;
    experiment::launch_pdl(link<kVariant>, grid, kThreads, 0, stream, in, out, done, k);
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < kWarmup; ++w) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (check) {
    // Launch k reads half k % 2 and writes half (k + 1) % 2; half 0 is zeroed at the head of
    // every replay, so after one the last launch's half, kChain % 2, holds kChain everywhere.
    std::vector<float> host(kFloats);
    CHECK(cudaMemcpy(host.data(), buf + (kChain % 2) * kFloats, kFloats * sizeof(float),
                     cudaMemcpyDeviceToHost));
    for (int i = 0; i < kFloats; ++i)
      if (host[i] != static_cast<float>(kChain)) {
        std::printf("  CHECK FAILED (variant %d, %d CTAs): element %d = %g, expected %d\n",
                    kVariant, grid, i, host[i], kChain);
        break;
      }
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(kReps);
  for (int r = 0; r < kReps; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms[r], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms[kReps / 2] * 1000.0f / kChain;
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* buf = nullptr;
  unsigned* done = nullptr;
  CHECK(cudaMalloc(&buf, 2 * kFloats * sizeof(float)));
  CHECK(cudaMalloc(&done, kChain * sizeof(unsigned)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("chain of %d launches, %d threads per CTA; us per launch (median of %d replays)\n",
              kChain, kThreads, kReps);
  std::printf("%6s %10s %10s %12s\n", "CTAs", "pdl", "flag", "flag_sleep");
  for (int grid : {1, 2, sms, 2 * sms}) {
    const float a = time_chain<kPdl>(grid, buf, done, stream, true);
    const float b = time_chain<kFlag>(grid, buf, done, stream, true);
    const float c = time_chain<kFlagSleep>(grid, buf, done, stream, true);
    std::printf("%6d %10.3f %10.3f %12.3f\n", grid, a, b, c);
  }
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(buf));
  CHECK(cudaFree(done));
  return 0;
}
