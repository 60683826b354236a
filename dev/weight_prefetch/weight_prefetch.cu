// dev/weight_prefetch/weight_prefetch.cu: is the batch-1 decode step bound by when each GEMV's
// weights arrive, and does prefetching them into L2 from an earlier kernel break that (issue #7;
// docs/perf-decode-step.md §11)? Not yet run. Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -diag-suppress 20050 \
//     -o weight_prefetch weight_prefetch.cu
//   ./weight_prefetch            (~20 s on the H200)
//
// The model (SmolLM2-135M-shaped, bf16, batch 1): 30 layers of five dependent kernels, one CUDA
// graph, programmatic dependent launch (PDL) on every launch, the trigger placed as splice places
// it (the GEMVs first thing, the attention stand-in after its wait):
//   q|k|v   y[960]  = W[960, 576] x          (x: the previous layer's down output)
//   attn    o[576]  = q[0:576] + 1 after a spin of `attn_ns` ns on 3 CTAs (the stand-in for flash
//                     decode: its cost is the knob this experiment turns)
//   o_proj  y[576]  = W[576, 576] o
//   gate|up y[3072] = W[3072, 576] y_o
//   down    y[576]  = W[576, 1536] gate_up[0:1536]
// Every layer has its own weights (212 MB in all: the step streams them from DRAM, as decode does).
// A GEMV is one column per warp, 4 warps per CTA, its weights loaded into registers before its
// PDL wait (splice's row_kernel does the same), x after it, a warp butterfly, one store.
//
// The variable: `ahead` = 0 (off), 1, 2 or 3. With ahead = d, every kernel i of the chain, before
// its wait, also prefetches into L2 the weights of kernel i + d (`cp.async.bulk.prefetch.L2`, one
// slice per CTA, issued by thread 0): when kernel i + d's CTAs arrive, their own pre-wait loads hit
// L2 instead of DRAM. Weights are constants: reading them at any time is safe.
//
// Measured per (attn_ns, ahead): us per layer (graph replay, median of kReps, / 30), and from one
// stamped replay each kernel kind's median share (its wait return to the next kernel's) and arrival
// (its first CTA's entry, relative to the previous kernel's wait return; negative = early).
// The hypothesis holds if, without prefetch, a shorter attention is paid back by longer GEMV shares
// (the layer time barely moves with attn_ns), and with prefetch the GEMV shares stay short and the
// layer time follows attn_ns.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../bench/cuda/bench_util.cuh"  // time_replays
#include "../experiment_util.cuh"           // CHECK, pdl_wait, pdl_trigger

namespace {

constexpr int kLayers = 30;
constexpr int kKinds = 5;  // q|k|v, attn, o_proj, gate|up, down
constexpr int kChain = kLayers * kKinds;
constexpr int kHidden = 576, kQkv = 960, kGateUp = 3072, kMlp = 1536;
constexpr int kWarps = 4;
constexpr int kAttnCtas = 3;
constexpr int kReps = 30;
const char* const kKindNames[kKinds] = {"q|k|v", "attn", "o_proj", "gate|up", "down"};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
using experiment::pdl_trigger;
using experiment::pdl_wait;

// A 16-byte load, zero when `pred` is off, the predicate inside the asm (a C++ `if` around it lets
// ptxas sink the pre-wait weight loads below griddepcontrol.wait; dev/chain_latency/chain.cu).
__device__ __forceinline__ uint4 load16(const void* p, bool pred) {
  uint4 r;
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return r;
}
__device__ __forceinline__ uint4 load16_act(const void* p, bool pred) {
  uint4 r = make_uint4(0, 0, 0, 0);
  if (pred) r = __ldcg(static_cast<const uint4*>(p));
  return r;
}

// What a kernel prefetches into L2 for a later one: `bytes` (a multiple of 16) from `base`, split
// into one slice per CTA of this grid.
struct Prefetch {
  const char* base = nullptr;
  unsigned long long bytes = 0;
};
__device__ __forceinline__ void prefetch_slice(const Prefetch& f) {
  if (f.base == nullptr || threadIdx.x != 0) return;
  const unsigned long long per_cta =
      ((f.bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const unsigned long long begin = per_cta * blockIdx.x;
  if (begin >= f.bytes) return;
  const unsigned long long n = per_cta < f.bytes - begin ? per_cta : f.bytes - begin;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(f.base + begin),
               "r"(static_cast<unsigned>(n))
               : "memory");
}

// Stamps of one replay: per kernel, the first CTA's entry and wait return (ns, atomicMin).
struct Stamps {
  unsigned long long* entry = nullptr;  // [kChain]
  unsigned long long* wait = nullptr;   // [kChain]
};
__device__ __forceinline__ void stamp(unsigned long long* a, int i) {
  if (a != nullptr && threadIdx.x == 0) atomicMin(a + i, global_ns());
}

// y[n] = W[n, :] . x for n < kN (bf16, fp32 accumulate); one column per warp.
template <int kK>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* x, __nv_bfloat16* y,
                int n_rows, Prefetch ahead, Stamps s, int index, int preload) {
  constexpr int kVecs = kK / 8;                  // 16-byte vectors per row
  constexpr int kPerLane = (kVecs + 31) / 32;    // 3 at K = 576, 6 at 1536
  stamp(s.entry, index);
  pdl_trigger();  // first thing, as splice's one-wave GEMVs
  prefetch_slice(ahead);
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  // The weights into registers before the wait, in a block of its own under a run-time flag
  // (`preload`, always 1): issued unconditionally, ptxas sinks them below griddepcontrol.wait
  // (SASS: the LDGs after ACQBULK), as dev/chain_latency/chain.cu found.
  uint4 wr[kPerLane];
  const auto load_weights = [&] {
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int v = lane + 32 * u;
      wr[u] = load16(reinterpret_cast<const uint4*>(w + static_cast<size_t>(row) * kK) + v,
                     row < n_rows && v < kVecs);
    }
  };
  if (preload) load_weights();
  pdl_wait();
  if (!preload) load_weights();
  stamp(s.wait, index);
  float acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int v = lane + 32 * u;
    const uint4 xr = load16_act(reinterpret_cast<const uint4*>(x) + v, v < kVecs);
    const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&xr);
    const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wr[u]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = __bfloat1622float2(xh[i]), b = __bfloat1622float2(wh[i]);
      acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0 && row < n_rows) y[row] = __float2bfloat16_rn(acc * (1.0f / 24.0f));
}

// The attention stand-in: 3 CTAs; after the wait (and its trigger, as flash decode), reads q,
// spins until `spin_ns` have passed since its wait returned, writes o = q + 1.
__global__ void attn_kernel(const __nv_bfloat16* q, __nv_bfloat16* o, long long spin_ns,
                            Prefetch ahead, Stamps s, int index) {
  stamp(s.entry, index);
  prefetch_slice(ahead);
  pdl_wait();
  pdl_trigger();
  stamp(s.wait, index);
  const unsigned long long t0 = global_ns();
  constexpr int kPerCta = kHidden / kAttnCtas;  // 192 outputs, 128 threads: two each at most
  float v[2] = {0.0f, 0.0f};
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int t = threadIdx.x + e * blockDim.x;
    if (t < kPerCta) v[e] = __bfloat162float(q[blockIdx.x * kPerCta + t]);
  }
  while (static_cast<long long>(global_ns() - t0) < spin_ns) {
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int t = threadIdx.x + e * blockDim.x;
    if (t < kPerCta) o[blockIdx.x * kPerCta + t] = __float2bfloat16_rn(v[e] + 1.0f);
  }
}

struct Model {
  std::vector<__nv_bfloat16*> w_qkv, w_o, w_gu, w_down;  // per layer
  __nv_bfloat16 *x = nullptr, *qkv = nullptr, *attn = nullptr, *o = nullptr, *gu = nullptr;
};

// Kernel i's weights (attn: none): base pointer and bytes.
Prefetch weights_of(const Model& m, int i) {
  if (i >= kChain) return {};
  const int layer = i / kKinds, kind = i % kKinds;
  switch (kind) {
    case 0: return {reinterpret_cast<const char*>(m.w_qkv[layer]), 2ull * kQkv * kHidden};
    case 2: return {reinterpret_cast<const char*>(m.w_o[layer]), 2ull * kHidden * kHidden};
    case 3: return {reinterpret_cast<const char*>(m.w_gu[layer]), 2ull * kGateUp * kHidden};
    case 4: return {reinterpret_cast<const char*>(m.w_down[layer]), 2ull * kHidden * kMlp};
    default: return {};
  }
}
// What kernel i prefetches with distance `ahead`: the weights of the next kernel at or after
// i + ahead that has any (the attention stand-in has none).
Prefetch ahead_of(const Model& m, int i, int ahead) {
  if (ahead == 0) return {};
  for (int j = i + ahead; j < std::min(kChain, i + ahead + 2); ++j)
    if (weights_of(m, j).base != nullptr) return weights_of(m, j);
  return {};
}

void launch_chain(const Model& m, cudaStream_t stream, long long attn_ns, int ahead, Stamps s) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cfg.blockDim = dim3(kWarps * 32);
  for (int layer = 0; layer < kLayers; ++layer) {
    const int i = layer * kKinds;
    cfg.gridDim = dim3((kQkv + kWarps - 1) / kWarps);
    CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<kHidden>, (const __nv_bfloat16*)m.w_qkv[layer],
                             (const __nv_bfloat16*)m.x, m.qkv, kQkv, ahead_of(m, i, ahead), s, i, 1));
    cfg.gridDim = dim3(kAttnCtas);
    CHECK(cudaLaunchKernelEx(&cfg, attn_kernel, (const __nv_bfloat16*)m.qkv, m.attn, attn_ns,
                             ahead_of(m, i + 1, ahead), s, i + 1));
    cfg.gridDim = dim3((kHidden + kWarps - 1) / kWarps);
    CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<kHidden>, (const __nv_bfloat16*)m.w_o[layer],
                             (const __nv_bfloat16*)m.attn, m.o, kHidden, ahead_of(m, i + 2, ahead),
                             s, i + 2, 1));
    cfg.gridDim = dim3((kGateUp + kWarps - 1) / kWarps);
    CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<kHidden>, (const __nv_bfloat16*)m.w_gu[layer],
                             (const __nv_bfloat16*)m.o, m.gu, kGateUp, ahead_of(m, i + 3, ahead), s,
                             i + 3, 1));
    cfg.gridDim = dim3((kHidden + kWarps - 1) / kWarps);
    CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<kMlp>, (const __nv_bfloat16*)m.w_down[layer],
                             (const __nv_bfloat16*)m.gu, m.x, kHidden, ahead_of(m, i + 4, ahead), s,
                             i + 4, 1));
  }
}

// `elems` bf16 values, every byte 0x3c (each value 0x3c3c, about 0.0115).
__nv_bfloat16* alloc_filled(size_t elems) {
  __nv_bfloat16* p = nullptr;
  CHECK(cudaMalloc(&p, elems * sizeof(__nv_bfloat16)));
  CHECK(cudaMemset(p, 0x3c, elems * sizeof(__nv_bfloat16)));
  return p;
}

cudaGraphExec_t capture(const Model& m, cudaStream_t stream, long long attn_ns, int ahead,
                        Stamps s) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch_chain(m, stream, attn_ns, ahead, s);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return exec;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Model m;
  for (int l = 0; l < kLayers; ++l) {
    m.w_qkv.push_back(alloc_filled(static_cast<size_t>(kQkv) * kHidden));
    m.w_o.push_back(alloc_filled(static_cast<size_t>(kHidden) * kHidden));
    m.w_gu.push_back(alloc_filled(static_cast<size_t>(kGateUp) * kHidden));
    m.w_down.push_back(alloc_filled(static_cast<size_t>(kHidden) * kMlp));
  }
  m.x = alloc_filled(kMlp);
  m.qkv = alloc_filled(kQkv);
  m.attn = alloc_filled(kHidden);
  m.o = alloc_filled(kHidden);
  m.gu = alloc_filled(kGateUp);
  Stamps s;
  CHECK(cudaMalloc(&s.entry, kChain * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&s.wait, kChain * sizeof(unsigned long long)));

  std::printf("SmolLM2-shaped layer chain: 30 layers x 5 kernels, PDL, 212 MB of weights\n");
  std::printf("%8s %5s %9s |", "attn_ns", "ahead", "us/layer");
  for (const char* k : kKindNames) std::printf(" %7s", k);
  std::printf(" | arrival (us, - = before the previous wait return)\n");
  for (long long attn_ns : {500LL, 1500LL, 3000LL}) {
    for (int ahead : {0, 1, 2, 3}) {
      cudaGraphExec_t plain = capture(m, stream, attn_ns, ahead, Stamps{});
      const double us_per_layer =
          splice::bench::time_replays(plain, stream, 3, kReps, kLayers).median_us;
      CHECK(cudaGraphExecDestroy(plain));
      // One stamped replay (its own capture: the stamps cost a few atomics per CTA).
      cudaGraphExec_t stamped = capture(m, stream, attn_ns, ahead, s);
      CHECK(cudaGraphLaunch(stamped, stream));
      CHECK(cudaMemsetAsync(s.entry, 0xff, kChain * sizeof(unsigned long long), stream));
      CHECK(cudaMemsetAsync(s.wait, 0xff, kChain * sizeof(unsigned long long), stream));
      CHECK(cudaGraphLaunch(stamped, stream));
      std::vector<unsigned long long> entry(kChain), wait(kChain);
      CHECK(cudaMemcpyAsync(entry.data(), s.entry, kChain * 8, cudaMemcpyDeviceToHost, stream));
      CHECK(cudaMemcpyAsync(wait.data(), s.wait, kChain * 8, cudaMemcpyDeviceToHost, stream));
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaGraphExecDestroy(stamped));
      std::vector<double> share[kKinds], arrival[kKinds];
      for (int i = kKinds; i + 1 < kChain; ++i) {  // the first layer warms up
        share[i % kKinds].push_back(1e-3 * static_cast<double>(wait[i + 1] - wait[i]));
        arrival[i % kKinds].push_back(1e-3 * (static_cast<double>(entry[i]) -
                                              static_cast<double>(wait[i - 1])));
      }
      std::printf("%8lld %5d %9.2f |", attn_ns, ahead, us_per_layer);
      for (int k = 0; k < kKinds; ++k) std::printf(" %7.2f", median(share[k]));
      std::printf(" |");
      for (int k = 0; k < kKinds; ++k) std::printf(" %6.2f", median(arrival[k]));
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
