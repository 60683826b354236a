// The `rows` KDA decode kernel (spec kda_decode.md §2-§3, T = 1 only): device code. It shares
// kda_decode.cuh's Params, metadata (resolve_item, owned_rows, zero_unowned), input addressing
// (GlobalInputs) and numerics (sigmoid_n, inv_sqrt_rn, softplus).
//
// One CTA of 16 warps per item (head h of unit u), two CTAs an SM (64 registers a thread):
//   - warp w owns value rows 8w .. 8w + 7 of the head's state S [V, K] and lane l its key columns
//     4l .. 4l + 3: 32 state values a thread (FlashInfer's fused_kda_decode shape; issue 6's
//     mid-N sizes, where splice's per-head kernels, holding a head on 256 threads, ran slower:
//     perf.md runs 291, 295). The rows are loaded at entry (kept as loaded until the barrier, so
//     no conv or gate thread waits for them before issuing its own loads), beside
//   - the conv (threads 0-95: projection pr = tid / 32, channels 4l .. 4l + 3):
//     pre = hist0 w0 + hist1 w1 + hist2 w2 + x w3 (multiply, add in tap order, no contraction),
//     mixed = bf16(pre sigmoid(pre)) into shared memory, and the conv write-back of those
//     channels (positions 0, 1, 2 <- hist1, hist2, x: T = 1, accepted offset 0);
//   - the gates (threads 384-511, key channel k each): decay = e^g with g = lb sigmoid(e^A z) or
//     -e^A softplus(z), z = raw_gate + dt_bias; norm_weight sigmoid(output_gate); beta (each of
//     these threads loads it, so its load is issued with the others: loaded by one thread, the
//     compiler sinks it into that thread's branch, a second round trip, perf.md run 295).
//     Warps 0 and 1 also L2-normalize q and k (one warp sum each): q^ = q / |q| / sqrt(D), k^.
//   - Barrier; every warp: k^ . q^ (a warp sum); then
//     per row one pass over the decayed state S' = S diag(decay): pred = S' k^ and S' q^ (the
//     warp's 16 row sums by one transposing butterfly: 16 shuffles, not 16 x 5; shuffles issue
//     at one warp instruction a clock an SM, and a wave's 32 warps an SM reach this phase at
//     once: perf.md run 304, bf16 N = 8 -6.7%), delta = beta (v - pred), S += delta k^ (stored in
//     place: T = 1's checkpoint is the source slot), o = S' q^ + delta (k^ . q^), o_b = bf16(o)
//     into shared memory.
//   - Barrier; warp 0: the gated RMSNorm, out = bf16(o_b inv norm_weight sigmoid(output_gate)).
// PDL as the per-head kernels: without the stable-state promise one thread prefetches the item's
// source state and conv history into L2 before the wait and the metadata is read after it; under
// the promise the metadata and the state rows are read before it. The launcher runs it only for
// T = 1 with 16-byte aligned states, inputs and output (else `wide`). The rule runs it at T = 1
// for SMs / 4 < items < 4 SMs with bf16 state (N = 2-16 at H = 32), < 2 SMs with f32 (N = 2-8;
// wide512 at SMs / 2 <= items < SMs): perf.md runs 298 and 305, e.g. bf16 N = 8 8.05 us against
// wide's 9.53, N = 16 14.89 against stream's 16.18, f32 N = 8 12.37 against stream's 13.24, under
// the stable-state promise.
#pragma once

#include <type_traits>

#include "backend/cuda/kda_decode.cuh"
#include "backend/cuda/launch.cuh"

namespace splice::cuda::kda {

constexpr int kRowsThreads = 512;
constexpr int kRowsWarps = kRowsThreads / kWarp;                 // 16
constexpr int kRowsPerWarp = kD / kRowsWarps;                    // 8 value rows a warp
constexpr int kRowsConvThreads = kProj * kD / kChannelsPerLane;  // 96
constexpr int kRowsGateThread0 = kRowsThreads - kD;              // 384: one key channel each

// This lane's 4 columns of state row `row` of the head's [D, D] block at `s`, as loaded (raw:
// float4 for fp32, uint2 of 4 bf16 for bf16), and as fp32. The raw form is what crosses the
// inputs' section: a bf16 unpack there (shifts of the loaded words) would make each conv and gate
// thread wait for its state rows before issuing its own loads.
template <typename StateT>
using RawRow4 = std::conditional_t<sizeof(StateT) == 4, float4, uint2>;
// The load keeps no L1 line (L1::no_allocate): under the carveout rule's largest shared
// carveout an SM has ~23 KB of L1, and two CTAs' state rows (64 KB bf16, 128 KB fp32), read
// once, gain nothing from it (perf.md run 311: -2.8 to -4.6% under the promise at N = 8 / 16).
template <typename StateT>
__device__ __forceinline__ RawRow4<StateT> load_row4(const StateT* s, int row, int lane) {
  const void* at = s + row * kD + 4 * lane;
  RawRow4<StateT> v;
  if constexpr (sizeof(StateT) == 4) {
    asm volatile("ld.global.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(__cvta_generic_to_global(at)));
  } else {
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(__cvta_generic_to_global(at)));
  }
  return v;
}
__device__ __forceinline__ void unpack_row4(const float4& v, float (&f)[4]) {
  f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
__device__ __forceinline__ void unpack_row4(const uint2& v, float (&f)[4]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
}
// One vector store as PTX (a plain float4 / uint2 assignment reached PTX as 4 / 2 scalar stores,
// which ptxas did not rejoin here: 4x / 2x the store requests; store_state_vec's note).
template <typename StateT>
__device__ __forceinline__ void store_row4(StateT* s, int row, int lane, const float (&f)[4]) {
  void* const at = s + row * kD + 4 * lane;
  if constexpr (sizeof(StateT) == 4) {
    store_state_vec<StateT, true>(static_cast<StateT*>(at),
                                  make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]),
                                             __float_as_uint(f[2]), __float_as_uint(f[3])));
  } else {
    const std::uint32_t lo =
        f32_to_bf16(f[0]) | (static_cast<std::uint32_t>(f32_to_bf16(f[1])) << 16);
    const std::uint32_t hi =
        f32_to_bf16(f[2]) | (static_cast<std::uint32_t>(f32_to_bf16(f[3])) << 16);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(__cvta_generic_to_global(at)), "r"(lo),
                 "r"(hi));
  }
}
// Four bf16 channels (8 bytes) as raw bits.
__device__ __forceinline__ void load_bits4(const std::uint16_t* at, std::uint16_t (&b)[4]) {
  const uint2 v = *reinterpret_cast<const uint2*>(at);
  b[0] = v.x & 0xffffu, b[1] = v.x >> 16, b[2] = v.y & 0xffffu, b[3] = v.y >> 16;
}
__device__ __forceinline__ void store_bits4(std::uint16_t* at, const std::uint16_t (&b)[4]) {
  *reinterpret_cast<uint2*>(at) = make_uint2(b[0] | (static_cast<std::uint32_t>(b[1]) << 16),
                                             b[2] | (static_cast<std::uint32_t>(b[3]) << 16));
}

// Grid: H x units CTAs in x (head fastest: a unit's heads share its rows' input lines).
template <typename StateT>
__global__ void __launch_bounds__(kRowsThreads, 2) kda_decode_rows_kernel(const Params p) {
  __shared__ alignas(16) float mixed[kProj][kD];  // q^, k^, v: conv + SiLU, q and k L2-normed
  __shared__ alignas(16) float decay[kD];         // [K] e^g
  __shared__ alignas(16) float out_scale[kD];     // [V] norm_weight sigmoid(output_gate)
  __shared__ alignas(16) float o_b[kD];           // [V] bf16(o)
  __shared__ float beta_k[kD];                    // sigmoid(raw_beta), one copy a gate thread
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int h = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_heads));
  const int u = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_heads));
  const bool stable_state = p.stable_state != 0;
  if (!stable_state) {
    if (tid == kRowsThreads - kWarp)
      prefetch_sources_before_wait<StateT, true>(p, u, h, 0, kD, true, true);
    detail::pdl_prologue();
  }
  const int qn = owned_rows(p);
  const Item it = resolve_item<true>(p, u, h);  // T = 1 only: no slot row in registers
  StateT* const state = static_cast<StateT*>(p.state) +
                        static_cast<std::int64_t>(it.ss) * p.state_slot +
                        static_cast<std::int64_t>(h) * kD * kD;
  RawRow4<StateT> raw[kRowsPerWarp];  // rows 8 warp + i, columns 4 lane .. 4 lane + 3
  if (it.live) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) raw[i] = load_row4(state, warp * kRowsPerWarp + i, lane);
  }
  if (stable_state) detail::pdl_prologue();  // every store, and every input load, after it
  zero_unowned<kRowsThreads, kD>(p, it, 0, qn);
  if (!it.live) return;

  const GlobalInputs in(p, it);
  if (tid < kRowsConvThreads) {
    const int pr = tid / kWarp, d = 4 * lane;
    std::uint16_t act[kConvWidth][4];
    float w[kConvWidth][4];
#pragma unroll
    for (int tap = 0; tap < kHist; ++tap) load_bits4(in.hist_at(tap, pr) + d, act[tap]);
    load_bits4(in.x_at(0, pr) + d, act[kHist]);
#pragma unroll
    for (int tap = 0; tap < kConvWidth; ++tap) {
      const float4 v = *reinterpret_cast<const float4*>(in.w_at(pr, tap) + d);
      w[tap][0] = v.x, w[tap][1] = v.y, w[tap][2] = v.z, w[tap][3] = v.w;
    }
    float pre[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sig[4];
#pragma unroll
    for (int tap = 0; tap < kConvWidth; ++tap)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        pre[c] = __fadd_rn(pre[c], __fmul_rn(bf16_to_f32(act[tap][c]), w[tap][c]));
    sigmoid_n<4>(pre, sig);
    float m[4];  // mixed = bf16(pre sigmoid(pre)), channels d .. d + 3 of projection pr
#pragma unroll
    for (int c = 0; c < 4; ++c) m[c] = round_bf16(pre[c] * sig[c]);
    // q and k (warps 0 and 1 hold all 128 channels of one each): the L2 norm here, once, not by
    // every warp after the barrier: q^ = q / |q| / sqrt(D), k^ = k / |k|.
    if (pr < 2) {
      float ss = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) ss += m[c] * m[c];
      const float inv = inv_sqrt_rn(warp_sum(ss) + kL2Eps);
      const float scale = pr == 0 ? 1.0f / sqrtf(static_cast<float>(kD)) : 1.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) m[c] = pr == 0 ? m[c] * inv * scale : m[c] * inv;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) mixed[pr][d + c] = m[c];
    // The write-back: positions 0, 1, 2 of conv slot cs <- hist1, hist2, x (this thread's
    // channels only, read above by this thread alone).
    std::uint16_t* conv = p.conv + static_cast<std::int64_t>(it.cs) * p.conv_slot +
                          static_cast<std::int64_t>(pr) * p.channels + h * kD + d;
    const std::int64_t width = static_cast<std::int64_t>(kProj) * p.channels;
#pragma unroll
    for (int pos = 0; pos < kHist; ++pos) store_bits4(conv + pos * width, act[pos + 1]);
  } else if (tid >= kRowsGateThread0) {
    const int k = tid - kRowsGateThread0;
    const std::uint16_t gate_bits = in.gate_bits(0, k), og_bits = in.og_bits(0, k);
    const std::uint16_t beta_bits = in.beta_bits(0);
    const float bias = in.dt_bias(0, k), a_log = in.a_log(), norm_w = __ldg(p.norm_weight + k);
    const float a_h = exp_f32(a_log);
    const float z = bf16_to_f32(gate_bits) + bias;
    float gz[3] = {a_h * z, bf16_to_f32(og_bits), bf16_to_f32(beta_bits)}, sig[3];
    sigmoid_n<3>(gz, sig);
    decay[k] = p.use_lower_bound ? exp_f32(p.lower_bound * sig[0]) : exp_f32(-a_h * softplus(z));
    out_scale[k] = norm_w * sig[1];
    beta_k[k] = sig[2];
  }
  __syncthreads();

  float s[kRowsPerWarp][4];  // the state rows in fp32
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) unpack_row4(raw[i], s[i]);

  float q[4], kk[4], dec[4];  // q^, k^ and decay at this lane's columns
  {
    const float4 qv = *reinterpret_cast<const float4*>(&mixed[0][4 * lane]);
    const float4 kv = *reinterpret_cast<const float4*>(&mixed[1][4 * lane]);
    const float4 dv = *reinterpret_cast<const float4*>(&decay[4 * lane]);
    q[0] = qv.x, q[1] = qv.y, q[2] = qv.z, q[3] = qv.w;
    kk[0] = kv.x, kk[1] = kv.y, kk[2] = kv.z, kk[3] = kv.w;
    dec[0] = dv.x, dec[1] = dv.y, dec[2] = dv.z, dec[3] = dv.w;
  }
  float kq = 0.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c) kq = fmaf(kk[c], q[c], kq);
  kq = warp_sum(kq);  // k^ . q^
  const float beta = beta_k[0];

  // Per row i: pred_i = S'_i k^ and (S' q^)_i as lane partials, summed over the warp by one
  // transposing butterfly (16 shuffles for the 16 sums, not 80): lane l gets the total of partial
  // l / 2, i.e. lanes 2i, 2i + 1 pred_i and lanes 16 + 2i, 17 + 2i (S' q^)_i.
  float part[2 * kRowsPerWarp];  // [pred_0 .. pred_7, (S' q^)_0 .. (S' q^)_7] lane partials
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    part[i] = part[kRowsPerWarp + i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[i][c] *= dec[c];
      part[i] = fmaf(s[i][c], kk[c], part[i]);
      part[kRowsPerWarp + i] = fmaf(s[i][c], q[c], part[kRowsPerWarp + i]);
    }
  }
  const float total = reduce_rows<2 * kRowsPerWarp, kWarp>(part, lane);
  const int my_row = warp * kRowsPerWarp + (lane / 2) % kRowsPerWarp;
  // delta of my_row (computed from pred in lanes 0-15; lanes 16-31 take it from lane l - 16).
  const float delta_pred = beta * (mixed[2][my_row] - total);
  const float delta_other = __shfl_xor_sync(kFullMask, delta_pred, kWarp / 2);
  const float delta_mine = lane < kWarp / 2 ? delta_pred : delta_other;
  if (lane >= kWarp / 2 && lane % 2 == 0) o_b[my_row] = round_bf16(fmaf(delta_mine, kq, total));
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const float delta = __shfl_sync(kFullMask, delta_mine, 2 * i);
#pragma unroll
    for (int c = 0; c < 4; ++c) s[i][c] = fmaf(delta, kk[c], s[i][c]);
    store_row4(state, warp * kRowsPerWarp + i, lane, s[i]);  // the checkpoint: the source slot
  }
  __syncthreads();

  if (warp == 0) {
    float o[4], ssq = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) o[c] = o_b[4 * lane + c], ssq += o[c] * o[c];
    const float inv = 1.0f / sqrtf(warp_sum(ssq) / static_cast<float>(kD) + p.norm_eps);
    std::uint16_t ob[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) ob[c] = f32_to_bf16(o[c] * inv * out_scale[4 * lane + c]);
    store_bits4(p.out + (it.b * p.num_heads + h) * kD + 4 * lane, ob);
  }
}

}  // namespace splice::cuda::kda
