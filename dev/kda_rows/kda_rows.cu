// dev/kda_rows/kda_rows.cu: a T = 1 fused KDA decode kernel for the mid-N sizes (N = 8-32) on the
// pattern of FlashInfer's fused_kda_decode, which ran them faster than splice's kernels (session
// 38, perf.md run 282: bf16 N = 8 7.50 us against splice's 10.72, 9.35 after wide's late state
// loads; N = 32 24.38 against 27.76). A probe, not mainline: per-row slots only (fused_kda_decode's
// plain form: row r reads and writes slot slots[r], <= 0 a null row), lower_bound gate (-5), no
// stable-state promise; the question is what splice's own kernel of this shape reaches.
//
// Algorithm (spec kda_decode.md §2, one token): one CTA of 16 warps per (head h, row r).
//   - Warp w owns value rows 8w .. 8w + 7 of the head's state S [V, K], lane l its key columns
//     4l .. 4l + 3: 32 state values a thread, loaded at entry (after the PDL wait), beside
//   - the conv (threads 0-95: projection p = t / 32, 4 channels a lane): pre = hist0 w0 + hist1
//     w1 + hist2 w2 + x w3, mixed = bf16(pre sigmoid(pre)) into shared memory, and the conv
//     write-back [hist1, hist2, x] into the slot; and the gates (threads 384-511, one key channel
//     each): decay = exp(lb sigmoid(e^A (raw_gate + dt_bias))), the RMSNorm's per-channel scale
//     norm_weight sigmoid(output_gate), beta = sigmoid(raw_beta).
//   - Barrier; every warp: q^, k^ (L2 norms by warp sums), k^ . q^; then per row, one pass over
//     the decayed state S' = S diag(decay): pred = S' k^ and S' q^ (warp sums), delta = beta (v -
//     pred), S += delta k^ (stored in place, rounded to the state dtype), o = S' q^ + delta (k^ .
//     q^) (= the updated S times q^), o_b = bf16(o) into shared memory.
//   - Barrier; warp 0: inv = 1 / sqrt(mean(o_b^2) + eps), out = bf16(o_b inv scale).
// The host check runs the spec's math in float64 on a few rows (one null) and compares.
//
// Registers (ptxas): __launch_bounds__(512, 2) 64, no spills; (512, 1) 80.
// Measured (perf.md runs 289-290, H200, float64 check passed): PDL and 2 CTAs an SM best; a plain
// launch +0-5%, 1 CTA an SM +20-40% from N = 8. Run 295, after the gate threads' loads were
// grouped into one round trip and sigmoid took the approximate reciprocal (before, each gate
// load waited for the previous one's use: IEEE division's slow path is a call the compiler did
// not move loads across), bf16 N = 1 / 8 / 32 / 128 / 512: 4.44 / 8.17 / 26.26 / 88.02 / 330.53 us
// (run 290: 4.62 / 8.21 / 29.80 / 105.97 / 402.21; FlashInfer 4.47 / 7.43 / 24.20 / 84.10 /
// 310.85 in run 291, splice's rule 3.73 / 8.99 / 27.96 / 83.06 / 299.28); f32 5.25 / 11.95 /
// 42.20 / 144.90 / 552.83 (FlashInfer 4.58 / 10.91 / 38.84 / 143.74 / 552.99, splice 3.87 /
// 13.79 / 41.71 / 143.10 / 540.99). It now beats splice's rule at N = 8 (bf16 -9%, f32 -13%) and
// at bf16 N = 32 (-6%), and trails FlashInfer by 4-10% at N = 8-32 (perf-gpu-kda.md).
// One call builds and runs it, no carry:
//   run(command="mkdir -p .gpubin && nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17
//       -Isrc -o .gpubin/kda_rows dev/kda_rows/kda_rows.cu && .gpubin/kda_rows")
//   (the check for each launch variant, then N in {1, 8, 32, 128, 512} x {bf16, f32} state x
//   the variants; `kda_rows check` stops after the check; KDA_ROWS_NS=8 times one N, as
//   dev/ncu_rows_call.sh runs it under Nsight Compute)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../bench/cuda/bench_util.cuh"  // time_replays: the benches' graph timer
#include "../experiment_util.cuh"           // CHECK, pdl_wait / pdl_trigger, launch_pdl, bf

namespace {

using experiment::bf;
using experiment::download;
using experiment::launch_pdl;
using experiment::pdl_trigger;
using experiment::pdl_wait;
using experiment::to_bf;
using experiment::upload;

constexpr int kD = 128;
constexpr int kH = 32;
constexpr int kC = kH * kD;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kD / kWarps;  // 8
constexpr int kConvThreads = 3 * kD / 4;   // 96: 4 channels a thread
constexpr int kGateThread0 = kThreads - kD;
constexpr float kLowerBound = -5.0f;
constexpr float kNormEps = 1e-5f;
constexpr double kCopyBandwidth = 4.24e12;

struct Args {
  const std::uint16_t* x;     // [R, 3C] bf16
  const float* weight;        // [3, 4, C]
  std::uint16_t* conv;        // [slots, 3, 3C] bf16 (position-major: spec's [slots, 3C, 3])
  const std::uint16_t* gate;  // [R, H, D] bf16 raw gate
  const std::uint16_t* beta;  // [R, H] bf16 raw beta
  const float* a_log;         // [H]
  const float* dt_bias;       // [C]
  const std::int32_t* slots;  // [R]
  void* state;                // [slots, H, D, D] (v, k)
  const std::uint16_t* og;    // [R, H, D] bf16 output gate
  const float* norm_weight;   // [D]
  std::uint16_t* out;         // [R, H, D] bf16
};

// 1 / (1 + e^-z) with the approximate reciprocal (no IEEE division: its slow path is a call the
// compiler will not move loads across; rcp.approx(inf) = 0 keeps z -> -inf exact).
__device__ __forceinline__ float sigmoid(float z) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + __expf(-z)));
  return r;
}
__device__ __forceinline__ float bf16_round(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
// Four bf16 values (8 bytes) <-> floats.
__device__ __forceinline__ void unpack4(uint2 raw, float (&f)[4]) {
  f[0] = __uint_as_float(raw.x << 16);
  f[1] = __uint_as_float(raw.x & 0xffff0000u);
  f[2] = __uint_as_float(raw.y << 16);
  f[3] = __uint_as_float(raw.y & 0xffff0000u);
}
__device__ __forceinline__ uint2 pack4(const float (&f)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(f[0], f[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(f[2], f[3]);
  return make_uint2(*reinterpret_cast<const unsigned*>(&lo),
                    *reinterpret_cast<const unsigned*>(&hi));
}

// This thread's 4 columns of state row `row` (of the head's [D, D] block at `s`).
template <typename StateT>
__device__ __forceinline__ void load_row(const StateT* s, int row, int lane, float (&f)[4]) {
  if constexpr (sizeof(StateT) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(s + row * kD + 4 * lane);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else {
    unpack4(*reinterpret_cast<const uint2*>(s + row * kD + 4 * lane), f);
  }
}
template <typename StateT>
__device__ __forceinline__ void store_row(StateT* s, int row, int lane, const float (&f)[4]) {
  if constexpr (sizeof(StateT) == 4)
    *reinterpret_cast<float4*>(s + row * kD + 4 * lane) = make_float4(f[0], f[1], f[2], f[3]);
  else
    *reinterpret_cast<uint2*>(s + row * kD + 4 * lane) = pack4(f);
}

// kMinBlocks: 2 CTAs an SM (64 registers a thread) or 1 (up to 128; FlashInfer's kernel states no
// bound).
template <typename StateT, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) kda_rows_t1(const Args a) {
  __shared__ float mixed[3 * kD];  // [3, D] q, k, v after conv + SiLU (bf16-exact)
  __shared__ float decay[kD];      // [D] exp(g)
  __shared__ float out_scale[kD];  // [D] norm_weight * sigmoid(output_gate)
  __shared__ float o_b[kD];        // [D] bf16(o)
  __shared__ float beta_k[kD];     // [D] sigmoid(raw_beta), the same value from each gate thread
  const int h = blockIdx.x, r = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  pdl_trigger();
  pdl_wait();
  const int slot = a.slots[r];
  std::uint16_t* out_row = a.out + (static_cast<std::int64_t>(r) * kH + h) * kD;
  if (slot <= 0) {  // a null row: zero output, no cache touched
    if (tid < 32) *reinterpret_cast<uint2*>(out_row + 4 * lane) = make_uint2(0, 0);
    return;
  }
  StateT* s_head =
      static_cast<StateT*>(a.state) + (static_cast<std::int64_t>(slot) * kH + h) * kD * kD;
  float s[kRowsPerWarp][4];  // rows 8 warp + i, columns 4 lane + c
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) load_row(s_head, warp * kRowsPerWarp + i, lane, s[i]);

  if (tid < kConvThreads) {
    const int p = tid / 32;
    const std::int64_t ch = static_cast<std::int64_t>(p) * kC + h * kD + 4 * lane;  // of 3C
    std::uint16_t* hist = a.conv + static_cast<std::int64_t>(slot) * 3 * 3 * kC + ch;
    const uint2 h0 = *reinterpret_cast<const uint2*>(hist);
    const uint2 h1 = *reinterpret_cast<const uint2*>(hist + 3 * kC);
    const uint2 h2 = *reinterpret_cast<const uint2*>(hist + 2 * 3 * kC);
    const uint2 xr =
        *reinterpret_cast<const uint2*>(a.x + static_cast<std::int64_t>(r) * 3 * kC + ch);
    float w[4][4], e0[4], e1[4], e2[4], e3[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float4 v =
          *reinterpret_cast<const float4*>(a.weight + (p * 4 + t) * kC + h * kD + 4 * lane);
      w[t][0] = v.x, w[t][1] = v.y, w[t][2] = v.z, w[t][3] = v.w;
    }
    unpack4(h0, e0), unpack4(h1, e1), unpack4(h2, e2), unpack4(xr, e3);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float pre = e0[c] * w[0][c] + e1[c] * w[1][c] + e2[c] * w[2][c] + e3[c] * w[3][c];
      mixed[p * kD + 4 * lane + c] = bf16_round(pre * sigmoid(pre));
    }
    *reinterpret_cast<uint2*>(hist) = h1;  // [hist1, hist2, x]
    *reinterpret_cast<uint2*>(hist + 3 * kC) = h2;
    *reinterpret_cast<uint2*>(hist + 2 * 3 * kC) = xr;
  } else if (tid >= kGateThread0) {
    const int k = tid - kGateThread0;
    const std::int64_t hk = (static_cast<std::int64_t>(r) * kH + h) * kD + k;
    // Every load first: one round trip for the gate threads, not one per use.
    const unsigned gate_bits = a.gate[hk], og_bits = a.og[hk];
    // Every gate thread loads beta and stores its own copy: loaded by thread 0 alone, the
    // compiler sinks the load into that thread's branch, a second round trip on the path.
    const unsigned beta_bits = a.beta[static_cast<std::int64_t>(r) * kH + h];
    const float dt_bias = a.dt_bias[h * kD + k], a_log = a.a_log[h], norm_w = a.norm_weight[k];
    const float z = __uint_as_float(gate_bits << 16) + dt_bias;
    decay[k] = __expf(kLowerBound * sigmoid(__expf(a_log) * z));
    out_scale[k] = norm_w * sigmoid(__uint_as_float(og_bits << 16));
    beta_k[k] = sigmoid(__uint_as_float(beta_bits << 16));
  }
  __syncthreads();

  float q[4], k[4], dec[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    q[c] = mixed[4 * lane + c];
    k[c] = mixed[kD + 4 * lane + c];
    dec[c] = decay[4 * lane + c];
  }
  float qq = 0, kk = 0, qk = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) qq += q[c] * q[c], kk += k[c] * k[c], qk += q[c] * k[c];
  qq = warp_sum(qq), kk = warp_sum(kk), qk = warp_sum(qk);
  const float q_scale = rsqrtf(qq + 1e-6f) * 0.08838834764831845f;  // D^-0.5
  const float k_scale = rsqrtf(kk + 1e-6f);
  const float khat_qhat = qk * q_scale * k_scale;
#pragma unroll
  for (int c = 0; c < 4; ++c) q[c] *= q_scale, k[c] *= k_scale;
  const float beta = beta_k[0];

  float sk[kRowsPerWarp], sq[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    sk[i] = sq[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[i][c] *= dec[c];
      sk[i] += s[i][c] * k[c];
      sq[i] += s[i][c] * q[c];
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) sk[i] = warp_sum(sk[i]), sq[i] = warp_sum(sq[i]);
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = warp * kRowsPerWarp + i;
    const float delta = beta * (mixed[2 * kD + row] - sk[i]);
#pragma unroll
    for (int c = 0; c < 4; ++c) s[i][c] += delta * k[c];
    store_row(s_head, row, lane, s[i]);
    if (lane == 0) o_b[row] = bf16_round(sq[i] + delta * khat_qhat);
  }
  __syncthreads();
  if (warp == 0) {
    float o[4], ss = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) o[c] = o_b[4 * lane + c], ss += o[c] * o[c];
    const float inv = rsqrtf(warp_sum(ss) / kD + kNormEps);
#pragma unroll
    for (int c = 0; c < 4; ++c) o[c] *= inv * out_scale[4 * lane + c];
    *reinterpret_cast<uint2*>(out_row + 4 * lane) = pack4(o);
  }
}

// Host: the inputs of R rows over `slots` slots, on the device.
struct Problem {
  int rows = 0, slots = 0;
  bool bf16_state = true;
  std::vector<std::uint16_t> x, conv, gate, beta, og;
  std::vector<float> weight, a_log, dt_bias, norm_weight, state_f32;
  std::vector<std::uint16_t> state_bf16;
  Args dev{};
};

Problem make_problem(int rows, int slots, bool bf16_state, std::uint32_t seed) {
  Problem p;
  p.rows = rows, p.slots = slots, p.bf16_state = bf16_state;
  auto floats = [&](std::size_t n, float scale, std::uint32_t sd) {
    std::vector<float> v(n);
    const auto b = experiment::random_bf16(n, sd, scale);
    for (std::size_t i = 0; i < n; ++i) v[i] = bf(b[i]);
    return v;
  };
  p.x = experiment::random_bf16(static_cast<std::size_t>(rows) * 3 * kC, seed + 1);
  p.conv = experiment::random_bf16(static_cast<std::size_t>(slots) * 9 * kC, seed + 2, 0.2f);
  p.gate = experiment::random_bf16(static_cast<std::size_t>(rows) * kC, seed + 3);
  p.beta = experiment::random_bf16(static_cast<std::size_t>(rows) * kH, seed + 4);
  p.og = experiment::random_bf16(static_cast<std::size_t>(rows) * kC, seed + 5);
  p.weight = floats(3 * 4 * kC, 0.2f, seed + 6);
  p.a_log = floats(kH, 1.0f, seed + 7);
  p.dt_bias = floats(kC, 0.2f, seed + 8);
  p.norm_weight = floats(kD, 1.0f, seed + 9);
  const std::size_t state_n = static_cast<std::size_t>(slots) * kH * kD * kD;
  if (bf16_state)
    p.state_bf16 = experiment::random_bf16(state_n, seed + 10, 0.02f);
  else
    p.state_f32 = floats(state_n, 0.02f, seed + 10);
  p.dev.x = upload(p.x);
  p.dev.conv = upload(p.conv);
  p.dev.gate = upload(p.gate);
  p.dev.beta = upload(p.beta);
  p.dev.og = upload(p.og);
  p.dev.weight = upload(p.weight);
  p.dev.a_log = upload(p.a_log);
  p.dev.dt_bias = upload(p.dt_bias);
  p.dev.norm_weight = upload(p.norm_weight);
  p.dev.state = bf16_state ? static_cast<void*>(upload(p.state_bf16)) : upload(p.state_f32);
  CHECK(cudaMalloc(&p.dev.out, static_cast<std::size_t>(rows) * kC * 2));
  return p;
}

void free_problem(Problem& p) {
  for (const void* ptr :
       {static_cast<const void*>(p.dev.x), static_cast<const void*>(p.dev.conv),
        static_cast<const void*>(p.dev.gate), static_cast<const void*>(p.dev.beta),
        static_cast<const void*>(p.dev.og), static_cast<const void*>(p.dev.weight),
        static_cast<const void*>(p.dev.a_log), static_cast<const void*>(p.dev.dt_bias),
        static_cast<const void*>(p.dev.norm_weight), static_cast<const void*>(p.dev.state),
        static_cast<const void*>(p.dev.out)})
    CHECK(cudaFree(const_cast<void*>(ptr)));
}

}  // namespace

// The launch variants timed: PDL (as splice launches) or a plain launch (as FlashInfer's peer is
// timed), 2 or 1 CTAs an SM.
struct Variant {
  const char* name;
  bool pdl;
  int min_blocks;
};
constexpr Variant kVariants[] = {
    {"pdl/2", true, 2}, {"plain/2", false, 2}, {"pdl/1", true, 1}, {"plain/1", false, 1}};

template <typename StateT, int kMinBlocks>
static void launch(const Args& a, int rows, bool pdl, cudaStream_t stream) {
  if (pdl)
    launch_pdl(&kda_rows_t1<StateT, kMinBlocks>, dim3(kH, rows), kThreads, 0, stream, a);
  else
    kda_rows_t1<StateT, kMinBlocks><<<dim3(kH, rows), kThreads, 0, stream>>>(a);
}

static void run(const Args& a, int rows, bool bf16_state, cudaStream_t stream,
                const Variant& v = kVariants[0]) {
  if (bf16_state)
    v.min_blocks == 2 ? launch<__nv_bfloat16, 2>(a, rows, v.pdl, stream)
                      : launch<__nv_bfloat16, 1>(a, rows, v.pdl, stream);
  else
    v.min_blocks == 2 ? launch<float, 2>(a, rows, v.pdl, stream)
                      : launch<float, 1>(a, rows, v.pdl, stream);
  CHECK(cudaGetLastError());
}

// The spec's T = 1 math in float64 for row r of `p` (slot > 0), against the kernel's results.
static double check(const Problem& p, const std::vector<std::int32_t>& slots, int* failures) {
  const auto out = download(p.dev.out, static_cast<std::size_t>(p.rows) * kC);
  const std::size_t state_n = static_cast<std::size_t>(p.slots) * kH * kD * kD;
  std::vector<float> new_state(state_n);
  if (p.bf16_state) {
    const auto s = download(static_cast<std::uint16_t*>(p.dev.state), state_n);
    for (std::size_t i = 0; i < state_n; ++i) new_state[i] = bf(s[i]);
  } else {
    new_state = download(static_cast<float*>(p.dev.state), state_n);
  }
  const auto new_conv = download(p.dev.conv, static_cast<std::size_t>(p.slots) * 9 * kC);
  auto old_state = [&](std::size_t i) {
    return p.bf16_state ? static_cast<double>(bf(p.state_bf16[i])) : p.state_f32[i];
  };
  auto sig = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  auto rb = [](double v) { return static_cast<double>(bf(to_bf(static_cast<float>(v)))); };
  double max_out = 0, max_state = 0;
  for (int r = 0; r < p.rows; ++r) {
    const int slot = slots[r];
    for (int h = 0; h < kH; ++h) {
      const std::size_t orow = (static_cast<std::size_t>(r) * kH + h) * kD;
      if (slot <= 0) {
        for (int v = 0; v < kD; ++v) *failures += bf(out[orow + v]) != 0.0f;
        continue;
      }
      double mixed[3][kD];
      for (int q = 0; q < 3; ++q)
        for (int d = 0; d < kD; ++d) {
          const std::size_t ch = static_cast<std::size_t>(q) * kC + h * kD + d;
          double pre = bf(p.x[static_cast<std::size_t>(r) * 3 * kC + ch]) *
                       p.weight[(q * 4 + 3) * kC + h * kD + d];
          for (int t = 0; t < 3; ++t)
            pre += bf(p.conv[static_cast<std::size_t>(slot) * 9 * kC + t * 3 * kC + ch]) *
                   p.weight[(q * 4 + t) * kC + h * kD + d];
          mixed[q][d] = rb(pre * sig(pre));
        }
      double qq = 0, kk = 0;
      for (int d = 0; d < kD; ++d) qq += mixed[0][d] * mixed[0][d], kk += mixed[1][d] * mixed[1][d];
      double qh[kD], kh[kD], dec[kD];
      const double a = std::exp(static_cast<double>(p.a_log[h]));
      for (int d = 0; d < kD; ++d) {
        qh[d] = mixed[0][d] / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(kD));
        kh[d] = mixed[1][d] / std::sqrt(kk + 1e-6);
        const double z = bf(p.gate[orow + d]) + p.dt_bias[h * kD + d];
        dec[d] = std::exp(kLowerBound * sig(a * z));
      }
      const double beta = sig(bf(p.beta[static_cast<std::size_t>(r) * kH + h]));
      double o[kD], ss = 0;
      const std::size_t base = (static_cast<std::size_t>(slot) * kH + h) * kD * kD;
      for (int v = 0; v < kD; ++v) {
        double srow[kD], pred = 0;
        for (int d = 0; d < kD; ++d)
          srow[d] = old_state(base + v * kD + d) * dec[d], pred += srow[d] * kh[d];
        const double delta = beta * (mixed[2][v] - pred);
        double ov = 0;
        for (int d = 0; d < kD; ++d) {
          srow[d] += delta * kh[d];
          ov += srow[d] * qh[d];
          max_state = std::max(max_state, std::abs(srow[d] - new_state[base + v * kD + d]));
        }
        o[v] = rb(ov);
        ss += o[v] * o[v];
      }
      const double inv = 1.0 / std::sqrt(ss / kD + kNormEps);
      for (int v = 0; v < kD; ++v) {
        const double want = rb(o[v] * inv * p.norm_weight[v] * sig(bf(p.og[orow + v])));
        const double d = std::abs(want - bf(out[orow + v]));
        max_out = std::max(max_out, d);
        *failures += d > 2e-2 + 3e-2 * std::abs(want);
      }
    }
    if (slot > 0)  // conv history: [hist1, hist2, x], bit for bit
      for (std::size_t ch = 0; ch < 3 * kC; ++ch) {
        const std::size_t s0 = static_cast<std::size_t>(slot) * 9 * kC + ch;
        *failures += new_conv[s0] != p.conv[s0 + 3 * kC];
        *failures += new_conv[s0 + 3 * kC] != p.conv[s0 + 6 * kC];
        *failures += new_conv[s0 + 6 * kC] != p.x[static_cast<std::size_t>(r) * 3 * kC + ch];
      }
  }
  *failures += max_state > 2e-3;
  std::printf("  output max |d| %.3g, state max |d| %.3g\n", max_out, max_state);
  return max_out;
}

int main(int argc, char** argv) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int failures = 0;
  for (const Variant& v : kVariants) {
    for (bool bf16_state : {false, true}) {  // the float64 check: 5 rows, one null
      Problem p = make_problem(5, 8, bf16_state, 11);
      const std::vector<std::int32_t> slots = {3, 0, 7, 1, 5};
      p.dev.slots = upload(slots);
      run(p.dev, p.rows, bf16_state, stream, v);
      CHECK(cudaStreamSynchronize(stream));
      std::printf("check %s, %s state:\n", v.name, bf16_state ? "bf16" : "f32");
      check(p, slots, &failures);
      CHECK(cudaFree(const_cast<std::int32_t*>(p.dev.slots)));
      free_problem(p);
    }
  }
  std::printf("check: %s (%d mismatches)\n", failures == 0 ? "PASSED" : "FAILED", failures);
  if (argc > 1 && std::string(argv[1]) == "check") return failures != 0;

  // KDA_ROWS_NS: the N list (comma-separated; default 1, 8, 32, 128, 512), e.g. one N for ncu.
  std::vector<int> ns = {1, 8, 32, 128, 512};
  if (const char* env = std::getenv("KDA_ROWS_NS")) {
    ns.clear();
    const std::string list = env;
    for (std::size_t at = 0; at < list.size();) {
      const std::size_t comma = list.find(',', at);
      ns.push_back(std::stoi(list.substr(at, comma - at)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  for (bool bf16_state : {true, false}) {
    for (int n : ns) {
      const double state_bytes = static_cast<double>(n) * kH * kD * kD * (bf16_state ? 2 : 4);
      const int sets =
          std::max(2, std::min(64, static_cast<int>(std::ceil(400e6 / (2 * state_bytes)))));
      Problem p = make_problem(n, sets * n + 1, bf16_state, 5);
      std::vector<Args> args(sets, p.dev);
      std::vector<std::int32_t*> slot_sets(sets);
      for (int g = 0; g < sets; ++g) {
        std::vector<std::int32_t> s(n);
        for (int i = 0; i < n; ++i) s[i] = 1 + g * n + i;
        args[g].slots = slot_sets[g] = upload(s);
      }
      for (const Variant& v : kVariants) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        for (int g = 0; g < sets; ++g) run(args[g], n, bf16_state, stream, v);
        CHECK(cudaStreamEndCapture(stream, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const auto t = splice::bench::time_replays(exec, stream, 3, 21, sets, 50.0);
        // Floor: the state read and written, x, the conv history read and written, the gates
        // and the output, over the copy bandwidth.
        const double bytes = 2 * state_bytes + n * (3.0 * kC * 2 * (1 + 3 + 3) + 3.0 * kC * 2);
        const double floor_us = bytes / kCopyBandwidth * 1e6;
        std::printf("rows %-7s %s N=%d T=1 (G=%d): %.2f us (spread %.2f), floor %.2f us (%.1f%%)\n",
                    v.name, bf16_state ? "bf16" : "f32", n, sets, t.median_us, t.spread_us,
                    floor_us, 100.0 * floor_us / t.median_us);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
      }
      for (std::int32_t* d : slot_sets) CHECK(cudaFree(d));
      free_problem(p);
    }
  }
  return failures != 0;
}
