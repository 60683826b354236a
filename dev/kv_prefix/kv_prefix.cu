// dev/kv_prefix/kv_prefix.cu: what would flash decode gain by reading the stable KV prefix before
// its PDL wait? (issue #7, docs/perf-decode-step.md §5 step 2). A standalone experiment like
// dev/chain_latency/chain.cu: minimal kernels, no splice code.
//
// In a decode step the only cache rows a predecessor still in flight can write are this step's
// (row p = k_len - 1, written by the RoPE/append kernel just before attention); rows [0, p) were
// written by earlier steps, whose graphs completed before this step's began. So attention may
// load them before griddepcontrol.wait, overlapping the predecessor, and load only row p (and q)
// after it.
//
// Per layer, SmolLM2-135M's attention shape (9 query heads over 3 KV heads of 64, bf16, k_len =
// kPosition + 1 = 150), two kernels in a PDL chain of 30 layers in one CUDA graph:
//   append: q[9, 64] = x and cache row p of each KV head (k = x / 2, v = x / 4 of the first three
//           heads' slices) from x = the previous layer's attention output (a dependent chain);
//   attend: one CTA per KV head (128 threads): K and V rows [0, k_len) into shared memory, q's 3
//           heads of the group, scores in fp32 (a thread per key), softmax, o = P V (a thread per
//           (head, d)), written as the next layer's x. Two variants of the same arithmetic:
//             after:  every row loaded after the wait (what a kernel without the promise does);
//             before: rows [0, p) loaded before the wait, row p after it.
// The caches of the 30 layers hold 30 x 2 x 3 x 256 x 64 x 2 B = 5.9 MB (L2-resident, as in the
// real step at this length).
//
// Prints: the two variants bit for bit (every layer's output), layer 0 against a host fp64
// attention (max |diff|), and us per layer (append + attend) of each. The promise is worth
// implementing in flash decode if `before` saves >= ~0.3 us per layer.
//
// Build and run (device): nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \
//   -o kv_prefix dev/kv_prefix/kv_prefix.cu && ./kv_prefix
// Status: written in session 5 without a device; compiled here, not yet run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../experiment_util.cuh"

namespace {

using namespace experiment;

constexpr int kHeads = 9, kKvHeads = 3, kGroup = kHeads / kKvHeads, kDim = 64;
constexpr int kHidden = kHeads * kDim;  // 576
constexpr int kCapacity = 256, kPosition = 149, kLen = kPosition + 1;
constexpr int kLayers = 30;
constexpr int kThreads = 128;
constexpr unsigned kFull = 0xffffffffu;
// Shared memory of attend: K and V rows [0, kLen) as fp32, q's group as fp32, the probabilities.
constexpr int kSmemFloats = 2 * kLen * kDim + kGroup * kDim + kGroup * kLen;

struct Layer {
  const __nv_bfloat16* x;  // [576]: the previous layer's output (or the first input)
  __nv_bfloat16* q;        // [9, 64]
  __nv_bfloat16* k_cache;  // [3, kCapacity, 64]
  __nv_bfloat16* v_cache;
  __nv_bfloat16* out;  // [576] = [9, 64]
};

// One CTA of 192 threads: q = x; cache row p of KV head h = x[h * 64 + d] / 2 (k) and / 4 (v).
__global__ void append(Layer L) {
  pdl_wait();
  pdl_trigger();
  for (int e = threadIdx.x; e < kHidden; e += blockDim.x) L.q[e] = L.x[e];
  for (int e = threadIdx.x; e < kKvHeads * kDim; e += blockDim.x) {
    const int h = e / kDim, d = e % kDim;
    const float v = __bfloat162float(L.x[e]);
    L.k_cache[(h * kCapacity + kPosition) * kDim + d] = __float2bfloat16_rn(0.5f * v);
    L.v_cache[(h * kCapacity + kPosition) * kDim + d] = __float2bfloat16_rn(0.25f * v);
  }
}

// Rows [first, last) of KV head h into shared fp32 (a thread per element, 8 at a time).
__device__ __forceinline__ void load_rows(const Layer& L, int h, int first, int last, float* ks,
                                          float* vs) {
  const __nv_bfloat16* k = L.k_cache + static_cast<std::size_t>(h) * kCapacity * kDim;
  const __nv_bfloat16* v = L.v_cache + static_cast<std::size_t>(h) * kCapacity * kDim;
  for (int e = first * kDim + threadIdx.x; e < last * kDim; e += kThreads) {
    ks[e] = __bfloat162float(k[e]);
    vs[e] = __bfloat162float(v[e]);
  }
}

template <bool kPrefixBeforeWait>
__global__ void __launch_bounds__(kThreads) attend(Layer L) {
  extern __shared__ float smem[];
  float* ks = smem;                                              // [kLen, 64]
  float* vs = ks + kLen * kDim;                                  // [kLen, 64]
  float* qs = vs + kLen * kDim;                                  // [3, 64]
  float* ps = qs + kGroup * kDim;                                // [3, kLen]
  const int h = blockIdx.x;                                      // KV head
  if (kPrefixBeforeWait) load_rows(L, h, 0, kPosition, ks, vs);  // the stable prefix
  pdl_wait();
  pdl_trigger();
  if (kPrefixBeforeWait)
    load_rows(L, h, kPosition, kLen, ks, vs);  // this step's row
  else
    load_rows(L, h, 0, kLen, ks, vs);
  for (int e = threadIdx.x; e < kGroup * kDim; e += kThreads)
    qs[e] = __bfloat162float(L.q[h * kGroup * kDim + e]);
  __syncthreads();
  // Scores: a thread per key, the group's three heads; scale 1/8 = 1/sqrt(64).
  for (int j = threadIdx.x; j < kLen; j += kThreads)
    for (int g = 0; g < kGroup; ++g) {
      float s = 0.0f;
      for (int d = 0; d < kDim; ++d) s = fmaf(qs[g * kDim + d], ks[j * kDim + d], s);
      ps[g * kLen + j] = s * 0.125f;
    }
  __syncthreads();
  // Softmax per head: warp g < 3 reduces head g's row.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < kGroup) {
    float m = -INFINITY;
    for (int j = lane; j < kLen; j += 32) m = fmaxf(m, ps[warp * kLen + j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
    float sum = 0.0f;
    for (int j = lane; j < kLen; j += 32) {
      const float e = __expf(ps[warp * kLen + j] - m);
      ps[warp * kLen + j] = e;
      sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
    const float inv = 1.0f / sum;
    for (int j = lane; j < kLen; j += 32) ps[warp * kLen + j] *= inv;
  }
  __syncthreads();
  // o = P V: a thread per (head of the group, d).
  for (int e = threadIdx.x; e < kGroup * kDim; e += kThreads) {
    const int g = e / kDim, d = e % kDim;
    float o = 0.0f;
    for (int j = 0; j < kLen; ++j) o = fmaf(ps[g * kLen + j], vs[j * kDim + d], o);
    L.out[(h * kGroup + g) * kDim + d] = __float2bfloat16_rn(o);
  }
}

struct Buffers {
  __nv_bfloat16 *x0, *q, *k_cache, *v_cache, *out;
};

std::size_t cache_elems() { return static_cast<std::size_t>(kKvHeads) * kCapacity * kDim; }

Layer layer(const Buffers& b, int l) {
  Layer L;
  L.x = l == 0 ? b.x0 : b.out + (l - 1) * kHidden;
  L.q = b.q + l * kHidden;
  L.k_cache = b.k_cache + l * cache_elems();
  L.v_cache = b.v_cache + l * cache_elems();
  L.out = b.out + l * kHidden;
  return L;
}

void chain(const Buffers& b, bool before, cudaStream_t s) {
  constexpr int kSmem = kSmemFloats * static_cast<int>(sizeof(float));
  for (int l = 0; l < kLayers; ++l) {
    const Layer L = layer(b, l);
    launch_pdl(append, 1, 192, 0, s, L);
    if (before)
      launch_pdl(attend<true>, kKvHeads, kThreads, kSmem, s, L);
    else
      launch_pdl(attend<false>, kKvHeads, kThreads, kSmem, s, L);
  }
}

double time_chain(const Buffers& b, bool before, cudaStream_t s, int reps) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  chain(b, before, s);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < reps + 3; ++r) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3) us.push_back(1e3 * ms / kLayers);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  constexpr int kSmem = kSmemFloats * static_cast<int>(sizeof(float));
  CHECK(cudaFuncSetAttribute(attend<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CHECK(cudaFuncSetAttribute(attend<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto x0 = random_bf16(kHidden, 1);
  const auto caches = random_bf16(2 * kLayers * cache_elems(), 2);  // k then v, every layer
  Buffers b{};
  const std::size_t all = kLayers * cache_elems();
  CHECK(cudaMalloc(&b.x0, sizeof(__nv_bfloat16) * kHidden));
  CHECK(cudaMalloc(&b.q, sizeof(__nv_bfloat16) * kLayers * kHidden));
  CHECK(cudaMalloc(&b.out, sizeof(__nv_bfloat16) * kLayers * kHidden));
  CHECK(cudaMalloc(&b.k_cache, sizeof(__nv_bfloat16) * all));
  CHECK(cudaMalloc(&b.v_cache, sizeof(__nv_bfloat16) * all));
  CHECK(cudaMemcpy(b.x0, x0.data(), sizeof(__nv_bfloat16) * kHidden, cudaMemcpyHostToDevice));
  auto reset = [&] {
    CHECK(
        cudaMemcpy(b.k_cache, caches.data(), sizeof(__nv_bfloat16) * all, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.v_cache, caches.data() + all, sizeof(__nv_bfloat16) * all,
                     cudaMemcpyHostToDevice));
  };
  auto run_once = [&](bool before) {
    reset();
    chain(b, before, s);
    CHECK(cudaStreamSynchronize(s));
    std::vector<std::uint16_t> out(static_cast<std::size_t>(kLayers) * kHidden);
    CHECK(cudaMemcpy(out.data(), b.out, out.size() * 2, cudaMemcpyDeviceToHost));
    return out;
  };
  const auto after = run_once(false), before = run_once(true);
  std::printf("prefix before the wait vs after, 30 layers: outputs %s\n",
              after == before ? "bit for bit equal" : "DIFFER");

  // Layer 0 on the host in fp64 from the same bf16 inputs (the appended row included).
  double max_diff = 0;
  for (int h = 0; h < kKvHeads; ++h)
    for (int g = 0; g < kGroup; ++g) {
      const int qh = h * kGroup + g;
      std::vector<double> p(kLen);
      double m = -1e300;
      for (int j = 0; j < kLen; ++j) {
        double sc = 0;
        for (int d = 0; d < kDim; ++d) {
          const float k = j == kPosition ? bf(to_bf(0.5f * bf(x0[h * kDim + d])))
                                         : bf(caches[(h * kCapacity + j) * kDim + d]);
          sc += static_cast<double>(bf(x0[qh * kDim + d])) * k;
        }
        p[j] = sc * 0.125;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (auto& v : p) sum += v = std::exp(v - m);
      for (int d = 0; d < kDim; ++d) {
        double o = 0;
        for (int j = 0; j < kLen; ++j) {
          const float v = j == kPosition ? bf(to_bf(0.25f * bf(x0[h * kDim + d])))
                                         : bf(caches[all + (h * kCapacity + j) * kDim + d]);
          o += p[j] / sum * v;
        }
        max_diff = std::max(max_diff, std::fabs(o - bf(after[qh * kDim + d])));
      }
    }
  std::printf("layer 0 against fp64 on the host: max |diff| %.3g (bf16 output)\n", max_diff);

  reset();
  const double t_after = time_chain(b, false, s, 200), t_before = time_chain(b, true, s, 200);
  std::printf("us per layer (append + attend; median of 200 replays of 30 layers):\n");
  std::printf("  KV loaded after the wait       %.3f\n  stable prefix before the wait  %.3f\n",
              t_after, t_before);
  std::printf("  saved per layer %.3f us, per 30-layer token %.1f us\n", t_after - t_before,
              30 * (t_after - t_before));
  return after == before ? 0 : 1;
}
