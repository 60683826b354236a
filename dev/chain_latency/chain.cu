// dev/chain_latency/chain.cu: the floor of one dependent kernel in a CUDA-graph chain on the H200,
// and what each ingredient of the decode GEMV adds to it (issue #7). Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o chain chain.cu && ./chain
//
//   1. A chain is kChain (200) launches of one kernel captured into one CUDA graph, each launch
//      depending on the previous one (stream order); with PDL every launch carries
//      cudaLaunchAttributeProgrammaticStreamSerialization and every kernel calls
//      griddepcontrol.wait before touching global memory, then griddepcontrol.launch_dependents
//      (launch.cuh's order: trigger after the wait). Variants: PDL off, on (trigger after wait),
//      on with no explicit trigger (implicit at exit).
//   2. Timing: after warm-up, kReps replays timed with events; us per kernel = median / kChain.
//      `slope` = (median(200) - median(100)) / 100 removes the graph launch's fixed cost.
//   3. Stamps (one more replay, %globaltimer in ns, per kernel i over its CTAs' thread 0):
//        start_i = min entry time, wait_i = min time griddepcontrol.wait returned,
//        end_i = max time of warp 0's last store.
//      body = end_i - wait_i (post-wait critical path, the kernel's own work);
//      handoff = wait_{i+1} - end_i (grid completion -> dependent released: the PDL floor);
//      ahead = wait_{i+1} - start_{i+1} (how long the dependent sat resident before its wait
//      returned; > 0 means its launch was hidden). Medians over kernels 10 .. 189.
//   4. Kernels: (a) empty; (b) tiny dependent: read 1 KB the previous kernel wrote, write 1 KB;
//      (c) GEMV y[576] = W[576, 576] x[576] bf16 (y of kernel i is x of kernel i + 1, a distinct
//      weight copy per kernel so weights come from DRAM as in decode), weights prefetched to
//      registers before the wait, after it: load x, FMA, per-column warp butterfly, store;
//      grid G CTAs of kWarps warps, column j to global warp j mod (G kWarps);
//      (d) the same with the RMSNorm prologue xn = bf16((x * inv) * nw), inv = 1/sqrt(mean(x^2)
//      + eps), computed (mode rms_reg) per warp in registers (each warp reduces the whole row
//      itself: 5 shuffles, no shared memory, no barrier) or (mode rms_smem) as gemv.cu stage 0
//      does: row to shared memory, per-warp partial, __syncthreads, one thread sums, sync, a
//      second elementwise pass in shared memory, sync, reload; (e) grids of 1 CTA per SM vs 2, 4
//      and 8 (empty kernels, and GEMV grid sizes), the cost of CTA scheduling and retirement.
//   5. Output: one line per config (kind, grid, warps/CTA, PDL, us/kernel, slope, body, handoff,
//      ahead) and a final line with %nsmid and the globaltimer's observed resolution.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,             \
                   cudaGetErrorString(e_));                                           \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr int kChain = 200;
constexpr int kShortChain = 100;
constexpr int kWarmup = 3;
constexpr int kReps = 40;
constexpr int kN = 576, kK = 576;  // SmolLM2 q / o projection
constexpr int kVec = 8;            // bf16 per 16-byte vector
constexpr int kVecPerRow = kK / kVec;                 // 72
constexpr int kU = (kVecPerRow + 31) / 32;            // 3 vectors per lane
constexpr int kTinyFloats = 256;                      // 1 KB
constexpr float kEps = 1e-5f;

enum Trigger : int { kNoTrigger = 0, kAfterWait = 1 };
enum Mode : int { kPlain = 0, kRmsReg = 1, kRmsSmem = 2 };

struct Stamps {  // [kChain] each, ns of %globaltimer; null pointers: no stamping
  unsigned long long* start = nullptr;
  unsigned long long* wait = nullptr;
  unsigned long long* end = nullptr;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Predicated 16-byte loads with the predicate inside the asm (zero when off), as gemv.cu does:
// with a C++ `if` around the asm each load is its own basic block and ptxas sinks the weight
// prefetch below griddepcontrol.wait (seen in SASS: the LDGs after ACQBULK).
#define CHAIN_LOAD(NAME, HINT)                                                      \
  __device__ __forceinline__ uint4 NAME(const uint4* p, bool pred) {                \
    uint4 r;                                                                        \
    asm volatile(                                                                   \
        "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"                                \
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"      \
        " @q ld.global.nc" HINT ".v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"              \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                \
        : "l"(p), "r"(static_cast<int>(pred)));                                     \
    return r;                                                                       \
  }
CHAIN_LOAD(ld_stream, ".L1::no_allocate")
CHAIN_LOAD(ld_act, "")
#undef CHAIN_LOAD
__device__ __forceinline__ void unpack8(uint4 raw, float (&f)[kVec]) {
  __nv_bfloat162 h[4];
  memcpy(h, &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// Stamp helpers: thread 0 of each CTA (fire-and-forget REDs to one address per kernel; at ~1 per
// L2 cycle, grids of >= 528 CTAs perturb their own stamped replay by a few hundred ns).
__device__ __forceinline__ void stamp_min(unsigned long long* a, int i, unsigned long long t) {
  if (a != nullptr && threadIdx.x == 0) atomicMin(a + i, t);
}
__device__ __forceinline__ void stamp_max(unsigned long long* a, int i, unsigned long long t) {
  if (a != nullptr && threadIdx.x == 0) atomicMax(a + i, t);
}

// (a), (e): nothing but the PDL handshake.
__global__ void empty_kernel(Stamps s, int index, int trigger) {
  if (s.start) stamp_min(s.start, index, global_ns());
  pdl_wait();
  if (trigger == kAfterWait) pdl_trigger();
  if (s.wait) {
    stamp_min(s.wait, index, global_ns());
    stamp_max(s.end, index, global_ns());
  }
}

// (b): out[block][t] = in[0][t] + 1 for t < 256 floats (1 KB per CTA; the next kernel reads
// CTA 0's KB). 64 threads, one float4 each.
__global__ void tiny_kernel(const float4* in, float4* out, Stamps s, int index, int trigger) {
  if (s.start) stamp_min(s.start, index, global_ns());
  pdl_wait();
  if (trigger == kAfterWait) pdl_trigger();
  if (s.wait) stamp_min(s.wait, index, global_ns());
  float4 v = in[threadIdx.x];
  v.x += 1.0f;
  out[blockIdx.x * (kTinyFloats / 4) + threadIdx.x] = v;
  if (s.end) stamp_max(s.end, index, global_ns());
}

// (c), (d): y[j] = sum_k xin[k] w[j, k] with xin = x (kPlain) or bf16((x inv) nw) (rms modes).
// kC columns per warp at most: global warp g takes columns g, g + G kWarps, ...
template <int kWarps, int kC, int kMode>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ w,   // [kN, kK]
                const __nv_bfloat16* x,                // [kK] (written by the previous kernel)
                __nv_bfloat16* y,                      // [kN]
                const __nv_bfloat16* __restrict__ nw,  // [kK] norm weight (rms modes)
                Stamps s, int index, int trigger, int prefetch) {
  __shared__ __align__(16) __nv_bfloat16 xs[kK];
  __shared__ float ws[kK];
  __shared__ float partial[kWarps];
  __shared__ float inv_shared;
  if (s.start) stamp_min(s.start, index, global_ns());
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int total_warps = gridDim.x * kWarps;
  const int gw = blockIdx.x * kWarps + warp;
  // Prefetch (constant weights, before the wait): kC columns x kU vectors per lane. In a block of
  // its own under a run-time flag (`prefetch`, always 1 here), as gemv.cu's w_constant: issued
  // unconditionally, ptxas hoisted griddepcontrol.wait above the loads (SASS: ACQBULK first).
  uint4 wr[kC][kU];
  uint4 nwr[kU];
  const auto load_weights = [&] {
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int j = gw + c * total_warps;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int v = lane + 32 * u;
        wr[c][u] = ld_stream(reinterpret_cast<const uint4*>(w + static_cast<size_t>(j) * kK) + v,
                             j < kN && v < kVecPerRow);
      }
    }
    if constexpr (kMode == kRmsReg) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        nwr[u] = ld_stream(reinterpret_cast<const uint4*>(nw) + lane + 32 * u,
                           lane + 32 * u < kVecPerRow);
    }
  };
  if (prefetch) load_weights();
  pdl_wait();
  if (trigger == kAfterWait) pdl_trigger();
  if (s.wait) stamp_min(s.wait, index, global_ns());
  if (!prefetch) load_weights();

  float xf[kU][kVec];
  if constexpr (kMode == kRmsSmem) {
    // gemv.cu stage 0's shape: copy + partial sums, butterfly, barrier, one thread's total,
    // barrier, elementwise pass, barrier, reload.
    float ss = 0.0f;
    for (int c = threadIdx.x; c < kVecPerRow; c += kWarps * 32) {
      const uint4 raw = ld_act(reinterpret_cast<const uint4*>(x) + c, true);
      const uint4 wraw = ld_act(reinterpret_cast<const uint4*>(nw) + c, true);
      reinterpret_cast<uint4*>(xs)[c] = raw;
      float f[kVec], g[kVec];
      unpack8(raw, f);
      unpack8(wraw, g);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        ss += f[i] * f[i];
        ws[c * kVec + i] = g[i];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.0f;
      for (int i = 0; i < kWarps; ++i) t += partial[i];
      inv_shared = 1.0f / sqrtf(t / kK + kEps);
    }
    __syncthreads();
    const float inv = inv_shared;
    for (int j = threadIdx.x; j < kK; j += kWarps * 32)
      xs[j] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(__bfloat162float(xs[j]), inv), ws[j]));
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = lane + 32 * u;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (v < kVecPerRow) raw = reinterpret_cast<const uint4*>(xs)[v];
      unpack8(raw, xf[u]);
    }
  } else {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = lane + 32 * u;
      unpack8(ld_act(reinterpret_cast<const uint4*>(x) + v, v < kVecPerRow), xf[u]);
    }
    if constexpr (kMode == kRmsReg) {
      float ss = 0.0f;
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int i = 0; i < kVec; ++i) ss += xf[u][i] * xf[u][i];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = 1.0f / sqrtf(ss / kK + kEps);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        float g[kVec];
        unpack8(nwr[u], g);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          xf[u][i] = __bfloat162float(
              __float2bfloat16_rn(__fmul_rn(__fmul_rn(xf[u][i], inv), g[i])));
      }
    }
  }
  if (gw >= kN) {  // a warp without a column (grids with more warps than columns)
    if (s.end) stamp_max(s.end, index, global_ns());
    return;
  }
  float acc[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    acc[c] = 0.0f;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float f[kVec];
      unpack8(wr[c][u], f);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[c] = fmaf(xf[u][i], f[i], acc[c]);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int j = gw + c * total_warps;
      if (j < kN) y[j] = __float2bfloat16_rn(acc[c]);
    }
  }
  if (s.end) stamp_max(s.end, index, global_ns());
}

__global__ void nsmid_kernel(unsigned* out) {
  unsigned v;
  asm("mov.u32 %0, %%nsmid;" : "=r"(v));
  *out = v;
}

// Observed globaltimer step: the smallest nonzero difference between consecutive reads.
__global__ void timer_resolution_kernel(unsigned long long* out) {
  unsigned long long best = ~0ull, prev = global_ns();
  for (int i = 0; i < 100000; ++i) {
    const unsigned long long t = global_ns();
    if (t != prev && t - prev < best) best = t - prev;
    prev = t;
  }
  *out = best;
}

struct Config {
  std::string kind;  // empty | tiny | gemv | rms_reg | rms_smem
  int grid = 1, warps = 1, cols = 1;
  bool pdl = true;
  int trigger = kAfterWait;
  bool prefetch = true;  // GEMV kinds: weights loaded before the wait (else after it)
};

struct Buffers {
  std::vector<__nv_bfloat16*> weights;  // kChain copies of [kN, kK]
  __nv_bfloat16* act[2] = {};           // [kK] ping-pong
  __nv_bfloat16* norm = nullptr;        // [kK]
  float4* tiny[2] = {};                 // [1024 CTAs, 64] float4
  Stamps stamps;
};

template <int kWarps, int kC, int kMode>
void launch_gemv(cudaLaunchConfig_t* cfg, const Buffers& b, int i, Stamps s, int trigger,
                 int prefetch) {
  CHECK(cudaLaunchKernelEx(cfg, gemv_kernel<kWarps, kC, kMode>, b.weights[i],
                           (const __nv_bfloat16*)b.act[i & 1], b.act[(i + 1) & 1],
                           (const __nv_bfloat16*)b.norm, s, i, trigger, prefetch));
}

template <int kWarps, int kMode>
void launch_gemv_c(cudaLaunchConfig_t* cfg, const Buffers& b, int i, Stamps s, int trigger,
                   int cols, int prefetch) {
  switch (cols) {
    case 1:
      return launch_gemv<kWarps, 1, kMode>(cfg, b, i, s, trigger, prefetch);
    case 2:
      return launch_gemv<kWarps, 2, kMode>(cfg, b, i, s, trigger, prefetch);
    case 3:
      return launch_gemv<kWarps, 3, kMode>(cfg, b, i, s, trigger, prefetch);
    case 4:
      return launch_gemv<kWarps, 4, kMode>(cfg, b, i, s, trigger, prefetch);
    default:
      return launch_gemv<kWarps, 8, kMode>(cfg, b, i, s, trigger, prefetch);
  }
}

template <int kMode>
void launch_gemv_w(cudaLaunchConfig_t* cfg, const Buffers& b, int i, Stamps s, const Config& c) {
  switch (c.warps) {
    case 1:
      return launch_gemv_c<1, kMode>(cfg, b, i, s, c.trigger, c.cols, c.prefetch);
    case 2:
      return launch_gemv_c<2, kMode>(cfg, b, i, s, c.trigger, c.cols, c.prefetch);
    case 4:
      return launch_gemv_c<4, kMode>(cfg, b, i, s, c.trigger, c.cols, c.prefetch);
    default:
      return launch_gemv_c<8, kMode>(cfg, b, i, s, c.trigger, c.cols, c.prefetch);
  }
}

void launch_one(const Config& c, const Buffers& b, int i, cudaStream_t stream, bool stamped) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(c.grid);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  if (c.pdl) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  const Stamps s = stamped ? b.stamps : Stamps{};
  if (c.kind == "empty") {
    cfg.blockDim = dim3(c.warps * 32);
    CHECK(cudaLaunchKernelEx(&cfg, empty_kernel, s, i, c.trigger));
  } else if (c.kind == "tiny") {
    cfg.blockDim = dim3(kTinyFloats / 4);
    CHECK(cudaLaunchKernelEx(&cfg, tiny_kernel, (const float4*)b.tiny[i & 1], b.tiny[(i + 1) & 1],
                             s, i, c.trigger));
  } else {
    cfg.blockDim = dim3(c.warps * 32);
    if (c.kind == "gemv")
      launch_gemv_w<kPlain>(&cfg, b, i, s, c);
    else if (c.kind == "rms_reg")
      launch_gemv_w<kRmsReg>(&cfg, b, i, s, c);
    else
      launch_gemv_w<kRmsSmem>(&cfg, b, i, s, c);
  }
}

cudaGraphExec_t capture(const Config& c, const Buffers& b, int length, cudaStream_t stream,
                        bool stamped) {
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < length; ++i) launch_one(c, b, i, stream, stamped);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return exec;
}

float median_replay_us(cudaGraphExec_t exec, cudaStream_t stream) {
  cudaEvent_t a, z;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&z));
  for (int r = 0; r < kWarmup; ++r) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> t;
  for (int r = 0; r < kReps; ++r) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(z, stream));
    CHECK(cudaEventSynchronize(z));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, z));
    t.push_back(ms * 1000.0f);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(z));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run(const Config& c, const Buffers& b, cudaStream_t stream) {
  cudaGraphExec_t full = capture(c, b, kChain, stream, false);
  cudaGraphExec_t half = capture(c, b, kShortChain, stream, false);
  const float t_full = median_replay_us(full, stream);
  const float t_half = median_replay_us(half, stream);
  // Stamped replay.
  cudaGraphExec_t st = capture(c, b, kChain, stream, true);
  CHECK(cudaGraphLaunch(st, stream));  // warm
  CHECK(cudaStreamSynchronize(stream));
  const size_t bytes = kChain * sizeof(unsigned long long);
  CHECK(cudaMemsetAsync(b.stamps.start, 0xff, bytes, stream));
  CHECK(cudaMemsetAsync(b.stamps.wait, 0xff, bytes, stream));
  CHECK(cudaMemsetAsync(b.stamps.end, 0, bytes, stream));
  CHECK(cudaGraphLaunch(st, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<unsigned long long> start(kChain), wait(kChain), end(kChain);
  CHECK(cudaMemcpy(start.data(), b.stamps.start, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(wait.data(), b.stamps.wait, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(end.data(), b.stamps.end, bytes, cudaMemcpyDeviceToHost));
  std::vector<double> body, handoff, ahead;
  for (int i = 10; i < kChain - 11; ++i) {
    body.push_back(static_cast<double>(end[i]) - static_cast<double>(wait[i]));
    handoff.push_back(static_cast<double>(wait[i + 1]) - static_cast<double>(end[i]));
    ahead.push_back(static_cast<double>(wait[i + 1]) - static_cast<double>(start[i + 1]));
  }
  std::printf("%-9s grid %4d warps %d cols %2d pdl %-3s trig %-5s%s | %6.3f us/kernel  slope %6.3f"
              " | body %5.0f ns  handoff %5.0f ns  ahead %6.0f ns\n",
              c.kind.c_str(), c.grid, c.kind == "tiny" ? 2 : c.warps, c.cols, c.pdl ? "on" : "off",
              c.pdl ? (c.trigger == kAfterWait ? "after" : "exit") : "-",
              c.prefetch ? "" : " no-prefetch", t_full / kChain,
              (t_full - t_half) / (kChain - kShortChain), median(body), median(handoff),
              median(ahead));
  std::fflush(stdout);
  CHECK(cudaGraphExecDestroy(full));
  CHECK(cudaGraphExecDestroy(half));
  CHECK(cudaGraphExecDestroy(st));
}

}  // namespace

int main() {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  Buffers b;
  // Weights: random bf16 in [-1, 1), one copy per chain position (~133 MB: DRAM, not L2).
  std::vector<__nv_bfloat16> host(static_cast<size_t>(kN) * kK);
  unsigned state = 12345u;
  auto rnd = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  for (auto& h : host) h = __float2bfloat16(rnd() * 0.05f);
  for (int i = 0; i < kChain; ++i) {
    __nv_bfloat16* w;
    CHECK(cudaMalloc(&w, host.size() * sizeof(__nv_bfloat16)));
    CHECK(cudaMemcpy(w, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    b.weights.push_back(w);
  }
  std::vector<__nv_bfloat16> xh(kK), nh(kK);
  for (auto& v : xh) v = __float2bfloat16(rnd());
  for (auto& v : nh) v = __float2bfloat16(1.0f + 0.1f * rnd());
  for (auto& a : b.act) {
    CHECK(cudaMalloc(&a, kK * sizeof(__nv_bfloat16)));
    CHECK(cudaMemcpy(a, xh.data(), kK * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  }
  CHECK(cudaMalloc(&b.norm, kK * sizeof(__nv_bfloat16)));
  CHECK(cudaMemcpy(b.norm, nh.data(), kK * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  for (auto& t : b.tiny) {
    CHECK(cudaMalloc(&t, 1024 * kTinyFloats * sizeof(float)));
    CHECK(cudaMemset(t, 0, 1024 * kTinyFloats * sizeof(float)));
  }
  CHECK(cudaMalloc(&b.stamps.start, kChain * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&b.stamps.wait, kChain * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&b.stamps.end, kChain * sizeof(unsigned long long)));

  const int sms = prop.multiProcessorCount;
  std::vector<Config> configs;
  // (a) empty kernels, (e) 1 CTA per SM and more.
  for (int grid : {1, sms, 240, 2 * sms, 4 * sms, 8 * sms}) {
    configs.push_back({"empty", grid, 4, 1, false, kAfterWait});
    configs.push_back({"empty", grid, 4, 1, true, kAfterWait});
  }
  configs.push_back({"empty", 1, 4, 1, true, kNoTrigger});
  configs.push_back({"empty", sms, 4, 1, true, kNoTrigger});
  configs.push_back({"empty", sms, 1, 1, true, kAfterWait});
  configs.push_back({"empty", 8 * sms, 1, 1, true, kAfterWait});
  // (b) tiny dependent.
  for (int grid : {1, 240}) {
    configs.push_back({"tiny", grid, 2, 1, false, kAfterWait});
    configs.push_back({"tiny", grid, 2, 1, true, kAfterWait});
  }
  // (c) GEMV 576x576 at grids 36 .. 576 CTAs, 1 vs 4 warps per CTA (cols = ceil(576 / warps)).
  struct Shape {
    int grid, warps;
  };
  const Shape shapes[] = {{36, 4},  {72, 4},  {144, 4}, {240, 4}, {18, 4}, {72, 2},
                          {72, 1},  {144, 1}, {240, 1}, {288, 1}, {576, 1},
                          {132, 4}, {132, 1}, {72, 8},  {144, 2}};
  for (const char* kind : {"gemv", "rms_reg", "rms_smem"}) {
    for (const Shape& s : shapes) {
      const int warps_total = s.grid * s.warps;
      const int cols = (kN + warps_total - 1) / warps_total;
      const int cols_bucket = cols <= 4 ? cols : 8;
      if (cols > 8) continue;  // 16 columns x 3 vectors would spill
      configs.push_back({kind, s.grid, s.warps, cols_bucket, true, kAfterWait});
    }
  }
  configs.push_back({"gemv", 144, 4, 1, false, kAfterWait});
  configs.push_back({"gemv", 144, 4, 1, true, kAfterWait, false});  // weights after the wait
  configs.push_back({"gemv", 144, 4, 1, true, kNoTrigger});
  configs.push_back({"rms_smem", 144, 4, 1, false, kAfterWait});

  for (const Config& c : configs) run(c, b, stream);

  unsigned* d_nsmid;
  unsigned long long* d_res;
  CHECK(cudaMalloc(&d_nsmid, sizeof(unsigned)));
  CHECK(cudaMalloc(&d_res, sizeof(unsigned long long)));
  nsmid_kernel<<<1, 1, 0, stream>>>(d_nsmid);
  timer_resolution_kernel<<<1, 1, 0, stream>>>(d_res);
  CHECK(cudaStreamSynchronize(stream));
  unsigned nsmid = 0;
  unsigned long long res = 0;
  CHECK(cudaMemcpy(&nsmid, d_nsmid, sizeof(nsmid), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&res, d_res, sizeof(res), cudaMemcpyDeviceToHost));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("device %s: %d SMs, %%nsmid %u, globaltimer step %llu ns, SM clock %d MHz\n",
              prop.name, sms, nsmid, res, clock_khz / 1000);
  return 0;
}
