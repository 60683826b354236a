// dev/stage_sync/stage_sync.cu: what does one dependent stage cost inside ONE persistent kernel,
// when every CTA needs every CTA's output of the previous stage (issue #7; docs/perf-decode-step.md
// §12)? Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o stage_sync stage_sync.cu
//   ./stage_sync            (~5 s on the H200)
//
// The decode step of a batch-1 Llama is ~5 dependent stages a layer, and every stage is an
// all-to-all: each output element of a projection needs the whole input vector (576 or 1536
// values at the SmolLM2 shape). As separate kernels, a stage costs its PDL hand-off (~0.66 us at a
// full grid, perf.md run 57) plus its post-wait work (a minimal GEMV-shaped kernel: ~1.0 us all
// in). This measures both against the alternative, on the same stage: G CTAs (one per SM) run
// kStages stages of
//   x_{s+1}[r] = hash(sum_i x_s[i] + r)  for r < N       (exact uint32 arithmetic: order-free)
// where CTA c computes rows [c N / G, (c + 1) N / G) (one row per warp at a time, lanes summing
// strided elements from shared memory, a butterfly), so every stage needs the whole previous
// vector. Each stage first copies that vector from global memory (L2) into shared memory, every
// load of a thread issued before any is used. Modes:
//   ll:      one persistent (cooperative) launch; LL words as in NCCL's LL protocol: each value
//            is stored with its stage number in one 8-byte word (single-copy atomic), and a
//            reader re-reads, all at once, the words not yet stamped with the stage it wants.
//            No fence, no counter: the data is the flag.
//   counter: one persistent launch; plain 4-byte values; after its rows each CTA fences
//            (__threadfence) and thread 0 adds 1 to the stage's counter (release); readers spin
//            on it (acquire) until all G CTAs arrived, then read the values.
//   pdl:     one launch per stage (kStages launches in one CUDA graph, the PDL attribute,
//            griddepcontrol.wait then the trigger, as splice's kernels): the kernel boundary.
//   none:    one persistent launch, no synchronization (wrong results): the stage's own copy,
//            compute and store, the floor of the instrument.
// ll, counter and pdl are checked against a host simulation of the chain. Printed: us per
// stage for G in {132, 66, 33, 16} and N in {576, 1536, 3072}.
//
// Reading it: with ~150 stages a token, a persistent design beats kernels per stage only by
// the difference per stage; the decision is in docs/perf-decode-step.md §12.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../experiment_util.cuh"  // CHECK

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 1000;
constexpr int kMaxN = 3072;
enum Mode { kLl = 0, kCounter = 1, kNone = 2, kPdl = 3 };
const char* const kModeNames[] = {"ll", "counter", "none", "pdl"};

__host__ __device__ inline std::uint32_t next_value(std::uint32_t sum, int row) {
  return (sum + static_cast<std::uint32_t>(row)) * 2654435761u + 12345u;
}

struct Params {
  unsigned long long* ll;  // [2][n] LL words: value | stage << 32
  std::uint32_t* plain;    // [2][n]
  unsigned* counter;       // one per stage
  int mode;
};

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One stage s of CTA `c` of `G`: the previous vector into shared memory x, this CTA's rows out.
// Every load of a thread is issued before any is used (N is a compile-time constant): one L2
// round trip when the data is there.
template <int N>
__device__ __forceinline__ void run_stage(const Params& p, int s, int mode, std::uint32_t* x) {
  constexpr int kPer = (N + kThreads - 1) / kThreads;
  const int G = gridDim.x, c = blockIdx.x;
  const int row_begin = static_cast<int>(static_cast<long long>(c) * N / G);
  const int row_end = static_cast<int>(static_cast<long long>(c + 1) * N / G);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int in = (s + 1) & 1, out = s & 1;  // stage s reads buffer in (written by s - 1)
  if (mode == kLl) {
    const unsigned want = static_cast<unsigned>(s);  // the stage that wrote it
    unsigned long long w[kPer];
    bool done = false;
#pragma unroll
    for (int k = 0; k < kPer; ++k) w[k] = 0;
    while (!done) {  // re-read every word not yet stamped `want` (all at once)
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (i < N && static_cast<unsigned>(w[k] >> 32) != want) w[k] = load_relaxed(p.ll + in * N + i);
      }
      done = true;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (i < N && static_cast<unsigned>(w[k] >> 32) != want) done = false;
      }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < N) x[i] = static_cast<std::uint32_t>(w[k]);
    }
  } else {
    if (mode == kCounter && s > 0 && threadIdx.x == 0)
      while (load_acquire(p.counter + s - 1) < static_cast<unsigned>(G)) {
      }
    if (mode == kCounter) __syncthreads();
    std::uint32_t v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + k * kThreads;
      v[k] = i < N ? __ldcg(reinterpret_cast<const unsigned*>(p.plain) + in * N + i) : 0u;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < N) x[i] = v[k];
    }
  }
  __syncthreads();
  for (int r = row_begin + warp; r < row_end; r += kWarps) {
    std::uint32_t sum = 0;
#pragma unroll
    for (int i = lane; i < N; i += 32) sum += x[i];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const std::uint32_t v = next_value(sum, r);
      if (mode == kLl)
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p.ll + out * N + r),
                     "l"(static_cast<unsigned long long>(v) |
                         (static_cast<unsigned long long>(s + 1) << 32))
                     : "memory");
      else
        __stcg(reinterpret_cast<unsigned*>(p.plain) + out * N + r, v);
    }
  }
  if (mode == kCounter) {  // every CTA's rows before its arrival
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counter + s) : "memory");
    }
  }
  __syncthreads();  // x is rewritten next stage
}

// All kStages stages in one persistent (cooperative) launch.
template <int N>
__global__ void __launch_bounds__(kThreads) chain_kernel(Params p) {
  __shared__ std::uint32_t x[N];
  for (int s = 0; s < kStages; ++s) run_stage<N>(p, s, p.mode, x);
}

// One stage per launch (mode pdl): griddepcontrol.wait, then the trigger, then the stage.
template <int N>
__global__ void __launch_bounds__(kThreads) stage_kernel(Params p, int s) {
  __shared__ std::uint32_t x[N];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  run_stage<N>(p, s, kNone, x);
}

// Host simulation: the vector after kStages stages.
std::vector<std::uint32_t> simulate(std::vector<std::uint32_t> x) {
  const int n = static_cast<int>(x.size());
  for (int s = 0; s < kStages; ++s) {
    std::uint32_t sum = 0;
    for (std::uint32_t v : x) sum += v;
    for (int r = 0; r < n; ++r) x[r] = next_value(sum, r);
  }
  return x;
}

template <int N>
void run_all(Params p, int sms, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  std::vector<std::uint32_t> x0(N);
  for (int i = 0; i < N; ++i) x0[i] = static_cast<std::uint32_t>(i * 7 + 1);
  const std::vector<std::uint32_t> expect = simulate(x0);
  // The initial vector in buffer 1 (stage 0 reads buffer 1), LL words stamped stage 0.
  std::vector<unsigned long long> ll0(2 * N, ~0ull);
  for (int i = 0; i < N; ++i) ll0[N + i] = x0[i];
  std::vector<std::uint32_t> plain0(2 * N, 0);
  for (int i = 0; i < N; ++i) plain0[N + i] = x0[i];
  for (int G : {sms, sms / 2, sms / 4, 16}) {
    // Mode pdl: kStages launches of stage_kernel in one graph, each with the PDL attribute.
    cudaGraphExec_t pdl_exec = nullptr;
    {
      cudaGraph_t graph;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int s = 0; s < kStages; ++s)
        experiment::launch_pdl(stage_kernel<N>, G, kThreads, 0, stream, p, s);
      CHECK(cudaStreamEndCapture(stream, &graph));
      CHECK(cudaGraphInstantiate(&pdl_exec, graph, 0));
      CHECK(cudaGraphDestroy(graph));
    }
    for (int mode : {kLl, kCounter, kPdl, kNone}) {
      p.mode = mode;
      std::vector<float> us;
      bool ok = true;
      for (int rep = 0; rep < 5; ++rep) {
        CHECK(cudaMemcpyAsync(p.ll, ll0.data(), 2 * N * 8, cudaMemcpyHostToDevice, stream));
        CHECK(cudaMemcpyAsync(p.plain, plain0.data(), 2 * N * 4, cudaMemcpyHostToDevice, stream));
        CHECK(cudaMemsetAsync(p.counter, 0, kStages * sizeof(unsigned), stream));
        CHECK(cudaEventRecord(start, stream));
        if (mode == kPdl) {
          CHECK(cudaGraphLaunch(pdl_exec, stream));
        } else {
          void* args[] = {&p};
          CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(chain_kernel<N>), dim3(G),
                                            dim3(kThreads), args, 0, stream));
        }
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(1e3f * ms / kStages);
        if (mode != kNone && rep == 0) {  // the last stage (kStages - 1) wrote buffer 1
          const int last = (kStages - 1) & 1;
          std::vector<std::uint32_t> got(N);
          if (mode == kLl) {
            std::vector<unsigned long long> w(2 * N);
            CHECK(cudaMemcpy(w.data(), p.ll, 2 * N * 8, cudaMemcpyDeviceToHost));
            for (int i = 0; i < N; ++i) got[i] = static_cast<std::uint32_t>(w[last * N + i]);
          } else {
            std::vector<std::uint32_t> w(2 * N);
            CHECK(cudaMemcpy(w.data(), p.plain, 2 * N * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < N; ++i) got[i] = w[last * N + i];
          }
          ok = got == expect;
        }
      }
      std::sort(us.begin(), us.end());
      std::printf("%6d %5d %8s %12.3f %s\n", N, G, kModeNames[mode], us[us.size() / 2],
                  mode == kNone ? "-" : (ok ? "ok" : "MISMATCH"));
      std::fflush(stdout);
    }
    CHECK(cudaGraphExecDestroy(pdl_exec));
  }
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Params p{};
  CHECK(cudaMalloc(&p.ll, 2 * kMaxN * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&p.plain, 2 * kMaxN * sizeof(std::uint32_t)));
  CHECK(cudaMalloc(&p.counter, kStages * sizeof(unsigned)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::printf("chain of %d all-to-all stages, CTAs of %d threads, one per SM (%d SMs)\n", kStages,
              kThreads, sms);
  std::printf("%6s %5s %8s %12s %s\n", "n", "G", "mode", "us/stage", "check");
  run_all<576>(p, sms, stream, start, stop);
  run_all<1536>(p, sms, stream, start, stop);
  run_all<3072>(p, sms, stream, start, stop);
  return 0;
}
