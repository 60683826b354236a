// dev/qkv_rope/qkv_rope.cu: is RoPE + the KV appends in the q|k|v GEMV's epilogue worth a kernel
// per layer? (issue #7, docs/perf-decode-step.md §5 step 3). A standalone experiment, like
// dev/chain_latency/chain.cu: it links nothing of splice and measures minimal kernels of the
// SmolLM2-135M attention prologue (hidden 576, 9 query / 3 KV heads of 64, bf16) in a 30-layer
// PDL chain captured in one CUDA graph:
//
//   two kernels per layer (what the model runs today, in minimal form):
//     rms_qkv:  qkv[960] = bf16(rms_norm(x) . W^T), one warp per output column, the RMSNorm in
//               registers (every warp sums the whole row: gemv.cu's register prologue);
//     rope_kv:  one thread per RoPE pair (i, i + 32) of each head of the row: q heads rotated into
//               q_out, k heads rotated into k_cache row p, v heads copied into v_cache row p
//               (rope_kv_append.cu's operations, p and its cos/sin rows read before the wait);
//   one kernel per layer:
//     fused:    one warp per RoPE pair: the two weight rows h D + i and h D + i + D/2 of the
//               stacked q|k|v weight (the "rope pairs" column mapping: no weight permutation),
//               both dot products reduced across the warp, each rounded to bf16 (the two-kernel
//               path's rounding), then rotated / copied and stored like rope_kv.
//
// Layer l reads x = q_out of layer l - 1 (576 = 9 x 64: the chain is dependent, like the real
// step's residual stream) and weight set (offset + l) mod kSets: 120 sets of 1.1 MB, four graphs
// with offsets 0, 30, 60, 90 replayed in turn, so every layer's weights come from DRAM.
//
// Prints: the fused chain bitwise against the two-kernel chain (every layer's q_out and both
// caches' row p), layer 0 against a host fp32 computation of the same formula (max |diff|), and
// the median us per layer of each chain (graph replay / 30). The decision: the fused kernel pays
// if it saves >= ~0.8 us per layer (~25 us per token) over the two kernels.
//
// Build and run (device): nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \
//   -o qkv_rope dev/qkv_rope/qkv_rope.cu && ./qkv_rope
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

constexpr int kHidden = 576;                        // K
constexpr int kHeads = 9, kKvHeads = 3, kDim = 64;  // Hq, Hkv, D
constexpr int kHalf = kDim / 2;                     // RoPE pairs per head
constexpr int kAllHeads = kHeads + 2 * kKvHeads;    // q | k | v heads of the row
constexpr int kRows = kAllHeads * kDim;             // N = 960
constexpr int kPairs = kAllHeads * kHalf;           // 480
constexpr int kVec = 8;                             // bf16 per 16-byte vector
constexpr int kVecPerRow = kHidden / kVec;          // 72
constexpr int kU = (kVecPerRow + 31) / 32;          // 3 vectors per lane
constexpr int kLayers = 30;
constexpr int kSets = 120;  // weight sets (1.1 MB each)
constexpr int kMaxSeq = 256, kPosition = 100;
constexpr int kWarpsPerCta = 4;
constexpr float kEps = 1e-5f;
constexpr unsigned kFull = 0xffffffffu;

static_assert(kHeads * kDim == kHidden, "q_out of a layer is the next layer's x");

struct Layer {
  const __nv_bfloat16* x;       // [576]
  const __nv_bfloat16* w;       // [960, 576] stacked q|k|v weight
  const __nv_bfloat16* norm_w;  // [576]
  __nv_bfloat16* qkv;           // [960] (two-kernel path)
  __nv_bfloat16* q_out;         // [576] = [9, 64]
  __nv_bfloat16* k_cache;       // [3, kMaxSeq, 64]
  __nv_bfloat16* v_cache;       // [3, kMaxSeq, 64]
  const float* cos;             // [kMaxSeq, 64]
  const float* sin;
  const int* position;  // [1]
};

__device__ __forceinline__ uint4 load_vec(const __nv_bfloat16* row, int v) {
  return v < kVecPerRow ? *reinterpret_cast<const uint4*>(row + v * kVec) : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ void unpack8(uint4 raw, float (&f)[kVec]) {
  __nv_bfloat162 h[4];
  memcpy(h, &raw, sizeof raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// The normalized row of this lane (vectors lane, lane + 32, lane + 64), each element
// bf16((x * inv) * norm_w) as gemv.cu's prologue rounds it, from x and the norm weight's vectors.
__device__ __forceinline__ void normalized_row(const uint4 (&x)[kU], const uint4 (&nw)[kU],
                                               float (&xs)[kU][kVec]) {
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float f[kVec];
    unpack8(x[u], f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) ss += f[i] * f[i];
  }
  const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(kHidden) + kEps);
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float f[kVec], w[kVec];
    unpack8(x[u], f);
    unpack8(nw[u], w);
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      xs[u][i] = __bfloat162float(__float2bfloat16_rn(__fmul_rn(__fmul_rn(f[i], inv), w[i])));
  }
}

// The full dot product of the normalized row with weight row `w` (vectors already loaded), on
// every lane: a partial per vector, then the lanes' sum (the same order in both paths).
__device__ __forceinline__ float dot(const float (&xs)[kU][kVec], const uint4 (&w)[kU]) {
  float acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float f[kVec];
    unpack8(w[u], f);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) part = fmaf(xs[u][i], f[i], part);
    acc += part;
  }
  return warp_sum(acc);
}

// Where element `row` (0 .. 959) of the q|k|v row goes: head h = row / 64, element e = row % 64.
struct Target {
  __nv_bfloat16* base;  // q_out, k_cache or v_cache
  bool rotate;          // q and k heads; v heads are copied
};
__device__ __forceinline__ Target target_of(const Layer& L, int head, int p) {
  if (head < kHeads) return {L.q_out + head * kDim, true};
  if (head < kHeads + kKvHeads) return {L.k_cache + ((head - kHeads) * kMaxSeq + p) * kDim, true};
  return {L.v_cache + ((head - kHeads - kKvHeads) * kMaxSeq + p) * kDim, false};
}

// y_i = x_i c_i - x_{i+32} s_i, y_{i+32} = x_{i+32} c_{i+32} + x_i s_{i+32}: products rounded to
// fp32 before the sum (rope_kv_append.cu's exact operations), stored as bf16.
__device__ __forceinline__ void store_pair(const Target& t, int i, float x1, float x2,
                                           const float (&cs)[4]) {
  if (t.rotate) {
    t.base[i] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x1, cs[0]), __fmul_rn(-x2, cs[2])));
    t.base[i + kHalf] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x2, cs[1]), __fmul_rn(x1, cs[3])));
  } else {
    t.base[i] = __float2bfloat16_rn(x1);
    t.base[i + kHalf] = __float2bfloat16_rn(x2);
  }
}
__device__ __forceinline__ void load_tables(const Layer& L, int p, int i, float (&cs)[4]) {
  cs[0] = L.cos[p * kDim + i];
  cs[1] = L.cos[p * kDim + i + kHalf];
  cs[2] = L.sin[p * kDim + i];
  cs[3] = L.sin[p * kDim + i + kHalf];
}

// Two-kernel path, kernel 1: one warp per output column n.
__global__ void __launch_bounds__(kWarpsPerCta * 32) rms_qkv(Layer L) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarpsPerCta + threadIdx.x / 32;
  uint4 w[kU], nw[kU], x[kU];
  const __nv_bfloat16* w_row = L.w + static_cast<std::size_t>(n) * kHidden;
#pragma unroll
  for (int u = 0; u < kU; ++u) {  // constant weights before the wait (gemv.cu's w_constant)
    w[u] = load_vec(w_row, lane + 32 * u);
    nw[u] = load_vec(L.norm_w, lane + 32 * u);
  }
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int u = 0; u < kU; ++u) x[u] = load_vec(L.x, lane + 32 * u);
  float xs[kU][kVec];
  normalized_row(x, nw, xs);
  const float y = dot(xs, w);
  if (lane == 0) L.qkv[n] = __float2bfloat16_rn(y);
}

// Two-kernel path, kernel 2: one thread per RoPE pair of the row.
__global__ void __launch_bounds__(256) rope_kv(Layer L) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const bool in = t < kPairs;
  const int head = t / kHalf, i = t % kHalf;
  const int p = *L.position;  // a step scalar: stable before the wait
  float cs[4] = {};
  if (in && head < kHeads + kKvHeads) load_tables(L, p, i, cs);
  pdl_wait();
  pdl_trigger();
  if (!in) return;
  const float x1 = __bfloat162float(L.qkv[head * kDim + i]);
  const float x2 = __bfloat162float(L.qkv[head * kDim + i + kHalf]);
  store_pair(target_of(L, head, p), i, x1, x2, cs);
}

// The fused kernel: one warp per RoPE pair g = head * 32 + i, weight rows head * 64 + i and
// head * 64 + i + 32.
__global__ void __launch_bounds__(kWarpsPerCta * 32) fused(Layer L) {
  const int lane = threadIdx.x % 32;
  const int g = blockIdx.x * kWarpsPerCta + threadIdx.x / 32;
  const int head = g / kHalf, i = g % kHalf;
  uint4 w0[kU], w1[kU], nw[kU], x[kU];
  const __nv_bfloat16* row0 = L.w + static_cast<std::size_t>(head * kDim + i) * kHidden;
  const __nv_bfloat16* row1 = row0 + static_cast<std::size_t>(kHalf) * kHidden;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    w0[u] = load_vec(row0, lane + 32 * u);
    w1[u] = load_vec(row1, lane + 32 * u);
    nw[u] = load_vec(L.norm_w, lane + 32 * u);
  }
  const int p = *L.position;
  float cs[4] = {};
  if (lane == 0 && head < kHeads + kKvHeads) load_tables(L, p, i, cs);
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int u = 0; u < kU; ++u) x[u] = load_vec(L.x, lane + 32 * u);
  float xs[kU][kVec];
  normalized_row(x, nw, xs);
  const float y0 = dot(xs, w0), y1 = dot(xs, w1);
  if (lane == 0)
    store_pair(target_of(L, head, p), i, __bfloat162float(__float2bfloat16_rn(y0)),
               __bfloat162float(__float2bfloat16_rn(y1)), cs);
}

struct Buffers {
  __nv_bfloat16 *x0, *w, *norm_w, *qkv, *q_out, *k_cache, *v_cache;
  float *cos, *sin;
  int* position;
};

Layer layer(const Buffers& b, int l, int set) {
  Layer L;
  L.x = l == 0 ? b.x0 : b.q_out + (l - 1) * kHidden;
  L.w = b.w + static_cast<std::size_t>(set) * kRows * kHidden;
  L.norm_w = b.norm_w + l * kHidden;
  L.qkv = b.qkv + l * kRows;
  L.q_out = b.q_out + l * kHidden;
  L.k_cache = b.k_cache + static_cast<std::size_t>(l) * kKvHeads * kMaxSeq * kDim;
  L.v_cache = b.v_cache + static_cast<std::size_t>(l) * kKvHeads * kMaxSeq * kDim;
  L.cos = b.cos;
  L.sin = b.sin;
  L.position = b.position;
  return L;
}

void chain(const Buffers& b, bool fused_path, int offset, cudaStream_t s) {
  for (int l = 0; l < kLayers; ++l) {
    const Layer L = layer(b, l, (offset + l) % kSets);
    if (fused_path) {
      launch_pdl(fused, kPairs / kWarpsPerCta, kWarpsPerCta * 32, 0, s, L);
    } else {
      launch_pdl(rms_qkv, kRows / kWarpsPerCta, kWarpsPerCta * 32, 0, s, L);
      launch_pdl(rope_kv, (kPairs + 255) / 256, 256, 0, s, L);
    }
  }
}

// Median us per layer over `reps` rounds of the four offset graphs.
double time_chain(const Buffers& b, bool fused_path, cudaStream_t s, int reps) {
  cudaGraphExec_t exec[4];
  for (int o = 0; o < 4; ++o) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    chain(b, fused_path, o * kLayers, s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec[o], g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < reps + 2; ++r)
    for (int o = 0; o < 4; ++o) {
      CHECK(cudaEventRecord(e0, s));
      CHECK(cudaGraphLaunch(exec[o], s));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) us.push_back(1e3 * ms / kLayers);
    }
  for (auto& e : exec) CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Buffers b{};
  const auto x0 = random_bf16(kHidden, 1, 1.0f, 0.0f);
  const auto w = random_bf16(static_cast<std::size_t>(kSets) * kRows * kHidden, 2,
                             1.0f / std::sqrt(static_cast<float>(kHidden)), 0.0f);
  const auto norm_w = random_bf16(static_cast<std::size_t>(kLayers) * kHidden, 3, 0.3f, 1.0f);
  std::vector<float> cos(kMaxSeq * kDim), sin(kMaxSeq * kDim);
  for (int p = 0; p < kMaxSeq; ++p)
    for (int e = 0; e < kDim; ++e) {
      const double f = p * std::pow(10000.0, -2.0 * (e % kHalf) / kDim);
      cos[p * kDim + e] = static_cast<float>(std::cos(f));
      sin[p * kDim + e] = static_cast<float>(std::sin(f));
    }
  b.x0 = reinterpret_cast<__nv_bfloat16*>(upload(x0));
  b.w = reinterpret_cast<__nv_bfloat16*>(upload(w));
  b.norm_w = reinterpret_cast<__nv_bfloat16*>(upload(norm_w));
  b.cos = upload(cos);
  b.sin = upload(sin);
  b.position = upload(std::vector<int>{kPosition});
  const std::size_t cache = static_cast<std::size_t>(kLayers) * kKvHeads * kMaxSeq * kDim;
  CHECK(cudaMalloc(&b.qkv, sizeof(__nv_bfloat16) * kLayers * kRows));
  CHECK(cudaMalloc(&b.q_out, sizeof(__nv_bfloat16) * kLayers * kHidden));
  CHECK(cudaMalloc(&b.k_cache, sizeof(__nv_bfloat16) * cache));
  CHECK(cudaMalloc(&b.v_cache, sizeof(__nv_bfloat16) * cache));

  // Correctness: both chains once from the same state; every output bit for bit.
  auto run_once = [&](bool fused_path) {
    CHECK(cudaMemsetAsync(b.q_out, 0, sizeof(__nv_bfloat16) * kLayers * kHidden, s));
    CHECK(cudaMemsetAsync(b.k_cache, 0, sizeof(__nv_bfloat16) * cache, s));
    CHECK(cudaMemsetAsync(b.v_cache, 0, sizeof(__nv_bfloat16) * cache, s));
    chain(b, fused_path, 0, s);
    CHECK(cudaStreamSynchronize(s));
    struct Out {
      std::vector<std::uint16_t> q, k, v;
    };
    return Out{download(reinterpret_cast<std::uint16_t*>(b.q_out),
                        static_cast<std::size_t>(kLayers) * kHidden),
               download(reinterpret_cast<std::uint16_t*>(b.k_cache), cache),
               download(reinterpret_cast<std::uint16_t*>(b.v_cache), cache)};
  };
  const auto two = run_once(false);
  const auto one = run_once(true);
  const bool same = two.q == one.q && two.k == one.k && two.v == one.v;
  std::printf("fused vs two kernels, 30 layers: q, k_cache, v_cache %s\n",
              same ? "bit for bit equal" : "DIFFER");

  // Layer 0 on the host (fp32, the same formula) against the two-kernel path's q_out.
  double ss = 0;
  for (int k = 0; k < kHidden; ++k) ss += static_cast<double>(bf(x0[k])) * bf(x0[k]);
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss) / kHidden + kEps);
  std::vector<float> xs(kHidden), qkv(kRows);
  for (int k = 0; k < kHidden; ++k) xs[k] = bf(to_bf(bf(x0[k]) * inv * bf(norm_w[k])));
  for (int n = 0; n < kRows; ++n) {
    double acc = 0;
    for (int k = 0; k < kHidden; ++k)
      acc += static_cast<double>(xs[k]) * bf(w[static_cast<std::size_t>(n) * kHidden + k]);
    qkv[n] = bf(to_bf(static_cast<float>(acc)));
  }
  double max_diff = 0, max_q = 0;
  for (int h = 0; h < kHeads; ++h)
    for (int i = 0; i < kHalf; ++i) {
      const float x1 = qkv[h * kDim + i], x2 = qkv[h * kDim + i + kHalf];
      const float c1 = cos[kPosition * kDim + i], c2 = cos[kPosition * kDim + i + kHalf];
      const float s1 = sin[kPosition * kDim + i], s2 = sin[kPosition * kDim + i + kHalf];
      const float y[2] = {x1 * c1 - x2 * s1, x2 * c2 + x1 * s2};
      for (int j = 0; j < 2; ++j) {
        const double got = bf(two.q[h * kDim + i + j * kHalf]);
        max_diff = std::max(max_diff, std::fabs(got - y[j]));
        max_q = std::max(max_q, std::fabs(static_cast<double>(y[j])));
      }
    }
  std::printf("layer 0 q against the host: max |diff| %.3g (max |q| %.3g; bf16 steps allowed)\n",
              max_diff, max_q);

  const double t_two = time_chain(b, false, s, 50), t_one = time_chain(b, true, s, 50);
  std::printf("us per layer (median of 200 replays of 30 layers, weights from DRAM):\n");
  std::printf("  rms_qkv + rope_kv (2 kernels)  %.3f\n  fused (1 kernel)               %.3f\n",
              t_two, t_one);
  std::printf("  saved per layer %.3f us, per 30-layer token %.1f us\n", t_two - t_one,
              30 * (t_two - t_one));
  return same ? 0 : 1;
}
