// The fused KDA decode kernel (spec kda_decode.md §2-§3): device code only. Host logic (variant
// choice, launch, alignment checks) lives in kda_decode.cu.
//
// One CTA per (work unit u, head h, value slice s); a cluster of kSlices CTAs covers one head's
// 128 value rows. Notation: D = 128, C = H*D, rows b .. b+L-1 of unit u, accepted offset a, conv
// slot cs, source slot ss, checkpoint destinations dst[t].
//
// Stages of one CTA:
//   1. Metadata: packed mode reads qsl[u], qsl[u+1], qsl[N], nat[u] (T > 1 only) and the slot row
//      state_indices[u, :]; per-row mode (plain / t1) has b = u, L = 1, a = 0 and
//      cs = ss = dst[0] = row_slots[u]. Rows >= qsl[N] (packed) are zeroed, strided over units.
//      A null unit (cs <= 0 or ss <= 0) zeroes its rows and stops; L == 0 stops.
//   2. Issue the loads of this CTA's rows of S = state[ss, h] (kRows x D, 16-byte vectors) into
//      registers, and of the old conv history this CTA writes back at the end; nothing waits yet.
//   3. For each chunk of up to kChunk tokens:
//      a. Precompute (one warp per (token, kind)), into shared memory:
//           q, k (128 channels): mixed = bf16(pre * sigmoid(pre)),
//                pre = e[t]*w0 + e[t+1]*w1 + e[t+2]*w2 + e[t+3]*w3, e = [hist0..2, x[b], x[b+1], ..]
//                q^ = q * (1/sqrt(sum q^2 + 1e-6)) * D^-0.5,  k^ = k * (1/sqrt(sum k^2 + 1e-6))
//           gate: z = raw_gate + dt_bias, g = lb * sigmoid(e^A z) or -e^A softplus(z), decay = e^g;
//                 beta = sigmoid(raw_beta); dst[t]
//           v (this slice's rows): bf16 conv+SiLU as above; og = sigmoid(output_gate)
//      b. State sweep, no barriers: each thread owns kRowsPerThread rows x kCols columns. Per token
//           S[v,k] *= decay[k];  pred[v] = sum_k S[v,k] k^[k]      (per-thread partials, then a
//           delta[v] = beta (v[v] - pred[v])                        transposing butterfly over
//           S[v,k] += delta[v] k^[k];  o[v] = sum_k S[v,k] q^[k]    the kLanes lanes of a row)
//         then o_b[t][v] = bf16(o[v]) into shared memory and S into slot dst[t] when dst[t] > 0
//         (rounded to the state dtype at the store; the carried S stays fp32).
//      c. Gated RMSNorm (one warp per token): inv = 1/sqrt(sum_v o_b^2 / D + eps), summed over
//         the cluster's slices through distributed shared memory in rank order;
//         out[r,h,v] = bf16(o_b[v] * inv * norm_weight[v] * og[v]).
//   4. Conv write-back of this slice's share of head h's 384 channels in slot cs:
//      positions 0, 1 <- old a+1, a+2 (bit copies loaded in stage 2), 2 .. L+1 <- x[b .. b+L-1].
//      Every read of the history (stage 3a, all slices) precedes the last barrier / cluster sync.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace splice::cuda::kda {

namespace cg = cooperative_groups;

constexpr int kD = 128;               // head dim (K = V)
constexpr int kConvWidth = 4;         // conv taps
constexpr int kHist = kConvWidth - 1; // history entries per channel
constexpr int kProj = 3;              // q, k, v blocks of x
constexpr int kHeadChannels = kProj * kD;  // 384 conv channels per head
constexpr int kChunk = 8;             // tokens precomputed per chunk
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kKindsPerToken = 4;     // precompute work items per token: q, k, gate, v
constexpr float kL2Eps = 1e-6f;
constexpr float kSoftplusThreshold = 20.0f;
constexpr int kChannelsPerLane = kD / kWarp;  // 4

// Kernel arguments: raw pointers, element strides, scalars (no splice types).
struct Params {
  const std::uint16_t* x;           // [R, 3C] bf16, row stride x_row
  std::int64_t x_row;
  const float* weight;              // [3, 4, C] f32 contiguous
  std::uint16_t* conv;              // [slots, 3C, T+2] bf16, strides [conv_slot, 1, 3C]
  std::int64_t conv_slot;
  const std::uint16_t* gate;        // [R, H, D] bf16
  std::int64_t gate_row, gate_head;
  const std::uint16_t* beta;        // [R, H] bf16
  std::int64_t beta_row, beta_head;
  const float* a_log;               // [H]
  const float* dt_bias;             // [C]
  const float* norm_weight;         // [D]
  void* state;                      // [slots, H, D, D] f32 | bf16, slot stride state_slot (elems)
  std::int64_t state_slot;
  const std::uint16_t* out_gate;    // [R, H, D] bf16
  std::int64_t og_row, og_head;
  std::uint16_t* out;               // [R, H, D] bf16 contiguous
  const std::int32_t* state_indices;  // packed: [N, T]
  const std::int32_t* row_slots;      // plain / t1: [R] (null in packed mode)
  const std::int32_t* qsl;            // packed: [N + 1]
  const std::int32_t* nat;            // packed: [N]
  int num_units;                    // N (packed) or R (per-row)
  int num_heads;                    // H
  int num_rows;                     // R
  int max_t;                        // T
  int num_slots;
  int channels;                     // C
  float lower_bound;                // used when use_lower_bound
  int use_lower_bound;
  float norm_eps;
};

__device__ __forceinline__ float bf16_to_f32(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}
__device__ __forceinline__ std::uint16_t f32_to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
__device__ __forceinline__ float softplus(float z) {
  return z > kSoftplusThreshold ? z : log1pf(expf(z));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = kWarp / 2; m >= 1; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}
// Read-only inputs go through the non-coherent path; the conv history (written by this kernel
// at the end) is read with plain loads.
__device__ __forceinline__ std::uint16_t ld_u16(const std::uint16_t* p) { return __ldg(p); }

constexpr int log2_int(int v) { return v <= 1 ? 0 : 1 + log2_int(v / 2); }

// Sums kRt per-row partials over the kLanes lanes of one row group (lanes j = 0..kLanes-1) with a
// transposing butterfly: kRt - 1 + log2(kLanes / kRt) shuffles instead of kRt * log2(kLanes).
// Lane j returns the total of row (j >> log2(kLanes / kRt)).
template <int kRt, int kLanes>
__device__ __forceinline__ float reduce_rows(float (&v)[kRt], int j) {
  constexpr int kStages = log2_int(kRt);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int half = kRt >> (s + 1);
    const int mask = kLanes >> (s + 1);
    const bool upper = (j & mask) != 0;
#pragma unroll
    for (int i = 0; i < kRt / 2; ++i) {
      if (i < half) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, mask);
      }
    }
  }
  float total = v[0];
#pragma unroll
  for (int mask = kLanes / (2 * kRt); mask >= 1; mask /= 2)
    total += __shfl_xor_sync(kFullMask, total, mask);
  return total;
}

// The inverse: lane j holds the value of row (j >> log2(kLanes / kRt)); every lane of the group
// gets all kRt rows' values in `out`, in row order.
template <int kRt, int kLanes>
__device__ __forceinline__ void gather_rows(float mine, float (&out)[kRt], int j) {
  constexpr int kStages = log2_int(kRt);
  out[0] = mine;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int cnt = 1 << s;
    const int mask = (kLanes / kRt) << s;
    const bool upper = (j & mask) != 0;
#pragma unroll
    for (int i = 0; i < kRt / 2; ++i) {
      if (i < cnt) {
        const float other = __shfl_xor_sync(kFullMask, out[i], mask);
        const float lo = upper ? other : out[i];
        const float hi = upper ? out[i] : other;
        out[i] = lo;
        out[i + cnt] = hi;
      }
    }
  }
}

// 16-byte state vectors: 4 fp32 or 8 bf16 elements. kVec = false reads element by element (a
// slot stride or base that is not 16-byte aligned).
template <typename StateT>
struct StateVec;
template <>
struct StateVec<float> {
  static constexpr int kElems = 4;
};
template <>
struct StateVec<__nv_bfloat16> {
  static constexpr int kElems = 8;
};

template <typename StateT, bool kVec>
__device__ __forceinline__ uint4 load_state_vec(const StateT* p) {
  if constexpr (kVec) {
    return *reinterpret_cast<const uint4*>(p);
  } else if constexpr (sizeof(StateT) == 4) {
    const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(p);
    return make_uint4(q[0], q[1], q[2], q[3]);
  } else {
    const std::uint16_t* q = reinterpret_cast<const std::uint16_t*>(p);
    uint4 r;
    r.x = q[0] | (static_cast<std::uint32_t>(q[1]) << 16);
    r.y = q[2] | (static_cast<std::uint32_t>(q[3]) << 16);
    r.z = q[4] | (static_cast<std::uint32_t>(q[5]) << 16);
    r.w = q[6] | (static_cast<std::uint32_t>(q[7]) << 16);
    return r;
  }
}

template <typename StateT, bool kVec>
__device__ __forceinline__ void store_state_vec(StateT* p, uint4 r) {
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(p) = r;
  } else if constexpr (sizeof(StateT) == 4) {
    std::uint32_t* q = reinterpret_cast<std::uint32_t*>(p);
    q[0] = r.x;
    q[1] = r.y;
    q[2] = r.z;
    q[3] = r.w;
  } else {
    std::uint16_t* q = reinterpret_cast<std::uint16_t*>(p);
    const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[2 * i] = static_cast<std::uint16_t>(w[i] & 0xffffu);
      q[2 * i + 1] = static_cast<std::uint16_t>(w[i] >> 16);
    }
  }
}

// Widens one 16-byte vector to fp32.
template <typename StateT>
__device__ __forceinline__ void unpack(uint4 r, float* out) {
  const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
  if constexpr (sizeof(StateT) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

// Rounds fp32 values to the state dtype (RNE) and packs one 16-byte vector.
template <typename StateT>
__device__ __forceinline__ uint4 pack(const float* in) {
  std::uint32_t w[4];
  if constexpr (sizeof(StateT) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(in[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Per-chunk shared memory of one CTA with kRows value rows.
template <int kRows>
struct Shared {
  float q[kChunk][kD];      // q^
  float k[kChunk][kD];      // k^
  float decay[kChunk][kD];  // exp(g)
  float v[kChunk][kRows];   // bf16-exact v of this slice's rows
  float og[kChunk][kRows];  // sigmoid(output_gate)
  float o[kChunk][kRows];   // bf16(o_raw)
  float part[kChunk];       // this CTA's sum of o_b^2 per token (read by the cluster)
  float beta[kChunk];
  int dst[kChunk];
};

template <int kThreads, int kSlices>
struct Layout {
  static constexpr int kRows = kD / kSlices;             // value rows per CTA
  static constexpr int kWarps = kThreads / kWarp;
  static constexpr int kLanes = 8;                       // lanes sharing one state row
  static constexpr int kGroups = kWarp / kLanes;         // rows per warp per instruction
  static constexpr int kRowsPerThread = kRows / (kWarps * kGroups);
  static constexpr int kCols = kD / kLanes;              // columns per thread
  static constexpr int kMinBlocks = (kThreads >= 256 ? 2 : 4);
  static constexpr int kWriteback = (kHeadChannels / kSlices + kThreads - 1) / kThreads;
  static_assert(kRowsPerThread >= 1 && kRowsPerThread <= kLanes, "bad row split");
  static_assert((kRowsPerThread & (kRowsPerThread - 1)) == 0, "rows per thread: power of 2");
  static_assert(kRows % kWarp == 0, "rows per CTA must be a multiple of 32");
};

// The conv + SiLU outputs of channels cg0 + 32 i (i < kPer) for token `tt`, where the extended
// window is e = [hist0, hist1, hist2, x[b], x[b+1], ..]. A warp's lanes take consecutive channels,
// so each tap is one coalesced load per i. The history is read with plain loads (this kernel
// rewrites it at the end); x shares the pointer select and is read the same way.
template <int kPer>
__device__ __forceinline__ void conv_silu(const Params& p, const std::uint16_t* conv_slot_base,
                                          int a, std::int64_t b, int tt, int cg0,
                                          float (&out)[kPer]) {
  const int width = kProj * p.channels;
  const int block = cg0 / p.channels;           // projection of the channel block
  const int within = cg0 - block * p.channels;  // h*D + d
  const float* w = p.weight + static_cast<std::int64_t>(block) * kConvWidth * p.channels + within;
  float pre[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) pre[i] = 0.0f;
#pragma unroll 1
  for (int tap = 0; tap < kConvWidth; ++tap) {
    const int e = tt + tap;
    const std::uint16_t* src = e < kHist
                                   ? conv_slot_base + static_cast<std::int64_t>(a + e) * width + cg0
                                   : p.x + (b + e - kHist) * p.x_row + cg0;
    // Separate multiply and add, in tap order, as the spec writes it (no contraction).
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      pre[i] = __fadd_rn(pre[i], __fmul_rn(bf16_to_f32(src[i * kWarp]),
                                           __ldg(w + tap * p.channels + i * kWarp)));
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) out[i] = round_bf16(pre[i] * sigmoid(pre[i]));
}

template <int kThreads, int kSlices, typename StateT, bool kVec>
__global__ void __launch_bounds__(kThreads, Layout<kThreads, kSlices>::kMinBlocks)
    kda_decode_kernel(const Params p) {
  using L = Layout<kThreads, kSlices>;
  constexpr int kRows = L::kRows;
  constexpr int kRt = L::kRowsPerThread;
  constexpr int kLanes = L::kLanes;
  constexpr int kVecElems = StateVec<StateT>::kElems;
  constexpr int kVecs = L::kCols / kVecElems;  // 16-byte vectors per row per thread
  static_assert(L::kCols % kVecElems == 0, "columns per thread must be whole vectors");

  __shared__ Shared<kRows> sm;

  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int slice = static_cast<int>(blockIdx.x % kSlices);
  const int h = static_cast<int>((blockIdx.x / kSlices) % p.num_heads);
  const int u = static_cast<int>(blockIdx.x / (kSlices * p.num_heads));
  const int row0 = slice * kRows;  // first value row of this CTA
  const bool packed = p.row_slots == nullptr;
  const int T = p.max_t;

  // Stage 1: metadata.
  std::int64_t b;
  int len, a = 0, cs, ss;
  const std::int32_t* dst_row = nullptr;  // packed: state_indices[u, :]
  if (packed) {
    const int q0 = p.qsl[u], q1 = p.qsl[u + 1];
    const int qn = min(max(p.qsl[p.num_units], 0), p.num_rows);
    // Trailing capacity rows [qsl[N], R): zeroed, strided over the units.
    for (int r = qn + u; r < p.num_rows; r += p.num_units)
      for (int i = tid; i < kRows; i += kThreads)
        p.out[(static_cast<std::int64_t>(r) * p.num_heads + h) * kD + row0 + i] = 0;
    b = max(q0, 0);
    len = min(min(q1, p.num_rows) - q0, T);  // value contract: L <= T, rows < R (guarded)
    dst_row = p.state_indices + static_cast<std::int64_t>(u) * T;
    if (T > 1) a = min(max(p.nat[u] - 1, 0), T - 1);
    cs = dst_row[0];
    ss = dst_row[a];
  } else {
    b = u;
    len = 1;
    cs = ss = p.row_slots[u];
  }
  if (len <= 0) return;
  const bool null_unit = cs <= 0 || ss <= 0 || cs >= p.num_slots || ss >= p.num_slots;
  if (null_unit) {
    for (int i = tid; i < len * kRows; i += kThreads) {
      const int t = i / kRows, v = i % kRows;
      p.out[((b + t) * p.num_heads + h) * kD + row0 + v] = 0;
    }
    return;
  }

  // Stage 2: issue the state loads (consumed after the first precompute) and the old history.
  const int g = lane / kLanes;  // row group within the warp
  const int j = lane % kLanes;  // lane within the row group
  // Local row of this thread's i-th row: warps own contiguous blocks of kRt * kGroups rows.
  auto local_row = [&](int i) { return warp * (kRt * L::kGroups) + i * L::kGroups + g; };
  // Column of element e of vector c: vectors j, j + kLanes, ... (coalesced across the group).
  auto vec_col = [&](int c) { return (j + c * kLanes) * kVecElems; };

  const std::int64_t head_off = static_cast<std::int64_t>(h) * kD * kD;
  StateT* const state = static_cast<StateT*>(p.state);
  uint4 raw[kRt][kVecs];
  {
    const StateT* src = state + static_cast<std::int64_t>(ss) * p.state_slot + head_off;
#pragma unroll
    for (int i = 0; i < kRt; ++i)
#pragma unroll
      for (int c = 0; c < kVecs; ++c)
        raw[i][c] = load_state_vec<StateT, kVec>(src + (row0 + local_row(i)) * kD + vec_col(c));
  }
  const int width = kProj * p.channels;
  std::uint16_t* const conv_base = p.conv + static_cast<std::int64_t>(cs) * p.conv_slot;
  std::uint16_t old1[L::kWriteback], old2[L::kWriteback];
  int wb_channel[L::kWriteback];
#pragma unroll
  for (int k = 0; k < L::kWriteback; ++k) {
    const int lc = slice * (kHeadChannels / kSlices) + tid + k * kThreads;
    const bool mine = tid + k * kThreads < kHeadChannels / kSlices;
    wb_channel[k] = mine ? (lc / kD) * p.channels + h * kD + lc % kD : -1;
    if (mine) {
      old1[k] = conv_base[static_cast<std::int64_t>(a + 1) * width + wb_channel[k]];
      old2[k] = conv_base[static_cast<std::int64_t>(a + 2) * width + wb_channel[k]];
    }
  }

  float s[kRt][L::kCols];  // this thread's rows of S, fp32, carried across tokens
  const float a_h = expf(__ldg(p.a_log + h));
  const float q_scale = 1.0f / sqrtf(static_cast<float>(kD));

  // Stage 3a: precompute of tokens c0 .. c0+nt-1, one warp per (token, kind).
  auto precompute = [&](int c0, int nt) {
    #pragma unroll 1
    for (int item = warp; item < nt * kKindsPerToken; item += L::kWarps) {
      const int t = item / kKindsPerToken, kind = item % kKindsPerToken;
      const int tt = c0 + t;
      const std::int64_t row = b + tt;
      if (kind < 2) {  // q (kind 0) or k (kind 1): conv, SiLU, L2 norm
        float m[kChannelsPerLane];
        conv_silu<kChannelsPerLane>(p, conv_base, a, b, tt, kind * p.channels + h * kD + lane, m);
        float ssq = 0.0f;
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e) ssq += m[e] * m[e];
        const float inv = 1.0f / sqrtf(warp_sum(ssq) + kL2Eps);
        float* dst = kind == 0 ? sm.q[t] : sm.k[t];
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e)
          dst[lane + e * kWarp] = kind == 0 ? m[e] * inv * q_scale : m[e] * inv;
      } else if (kind == 2) {  // gate, beta, destination
        const std::uint16_t* gr = p.gate + row * p.gate_row + static_cast<std::int64_t>(h) * p.gate_head;
#pragma unroll
        for (int e = 0; e < kChannelsPerLane; ++e) {
          const int d = lane + e * kWarp;
          const float z = bf16_to_f32(ld_u16(gr + d)) + __ldg(p.dt_bias + h * kD + d);
          const float gk = p.use_lower_bound ? p.lower_bound * sigmoid(a_h * z) : -a_h * softplus(z);
          sm.decay[t][d] = expf(gk);
        }
        if (lane == 0) {
          sm.beta[t] = sigmoid(bf16_to_f32(ld_u16(p.beta + row * p.beta_row + static_cast<std::int64_t>(h) * p.beta_head)));
          const int dst = packed ? dst_row[tt] : ss;
          sm.dst[t] = dst < p.num_slots ? dst : 0;
        }
      } else {  // v of this slice's rows, and the output gate
        const std::uint16_t* ogr = p.out_gate + row * p.og_row + static_cast<std::int64_t>(h) * p.og_head;
        constexpr int kPer = kRows / kWarp;
        float vv[kPer];
        conv_silu<kPer>(p, conv_base, a, b, tt, 2 * p.channels + h * kD + row0 + lane, vv);
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int rr = lane + e * kWarp;
          sm.v[t][rr] = vv[e];
          sm.og[t][rr] = sigmoid(bf16_to_f32(ld_u16(ogr + row0 + rr)));
        }
      }
    }
  };

  precompute(0, min(kChunk, len));
  __syncthreads();
  // The source state has had the whole first precompute to arrive; raw dies here.
#pragma unroll
  for (int i = 0; i < kRt; ++i)
#pragma unroll
    for (int c = 0; c < kVecs; ++c) unpack<StateT>(raw[i][c], &s[i][c * kVecElems]);

  #pragma unroll 1
  for (int c0 = 0; c0 < len; c0 += kChunk) {
    const int nt = min(kChunk, len - c0);
    if (c0 > 0) {
      precompute(c0, nt);
      __syncthreads();
    }

    // Stage 3b: the state sweep.
    const int my_row = j >> log2_int(kLanes / kRt);          // row index reduced into lane j
    const bool row_leader = (j & (kLanes / kRt - 1)) == 0;   // one writer per reduced row
    #pragma unroll 1
    for (int t = 0; t < nt; ++t) {
      float part[kRt];
#pragma unroll
      for (int i = 0; i < kRt; ++i) part[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < kVecs; ++c) {
#pragma unroll
        for (int e = 0; e < kVecElems; e += 4) {
          const float4 dv = *reinterpret_cast<const float4*>(&sm.decay[t][vec_col(c) + e]);
          const float4 kv = *reinterpret_cast<const float4*>(&sm.k[t][vec_col(c) + e]);
          const float dd[4] = {dv.x, dv.y, dv.z, dv.w};
          const float kq[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int col = c * kVecElems + e + x;
#pragma unroll
            for (int i = 0; i < kRt; ++i) {
              s[i][col] *= dd[x];
              part[i] = fmaf(s[i][col], kq[x], part[i]);
            }
          }
        }
      }
      const float pred = reduce_rows<kRt, kLanes>(part, j);
      const float delta_mine = sm.beta[t] * (sm.v[t][local_row(my_row)] - pred);
      float delta[kRt];
      gather_rows<kRt, kLanes>(delta_mine, delta, j);

      float o[kRt];
#pragma unroll
      for (int i = 0; i < kRt; ++i) o[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < kVecs; ++c) {
#pragma unroll
        for (int e = 0; e < kVecElems; e += 4) {
          const float4 qv = *reinterpret_cast<const float4*>(&sm.q[t][vec_col(c) + e]);
          const float4 kv = *reinterpret_cast<const float4*>(&sm.k[t][vec_col(c) + e]);
          const float qq[4] = {qv.x, qv.y, qv.z, qv.w};
          const float kq[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int col = c * kVecElems + e + x;
#pragma unroll
            for (int i = 0; i < kRt; ++i) {
              s[i][col] = fmaf(delta[i], kq[x], s[i][col]);
              o[i] = fmaf(s[i][col], qq[x], o[i]);
            }
          }
        }
      }
      const float o_total = reduce_rows<kRt, kLanes>(o, j);
      if (row_leader) sm.o[t][local_row(my_row)] = round_bf16(o_total);

      const int dst = sm.dst[t];
      if (dst > 0) {
        StateT* out = state + static_cast<std::int64_t>(dst) * p.state_slot + head_off;
#pragma unroll
        for (int i = 0; i < kRt; ++i)
#pragma unroll
          for (int c = 0; c < kVecs; ++c)
            store_state_vec<StateT, kVec>(out + (row0 + local_row(i)) * kD + vec_col(c),
                                          pack<StateT>(&s[i][c * kVecElems]));
      }
    }
    __syncthreads();

    // Stage 3c: gated RMSNorm, one warp per token.
    constexpr int kPerLane = kRows / kWarp;
    if constexpr (kSlices > 1) {
      #pragma unroll 1
      for (int t = warp; t < nt; t += L::kWarps) {
        float ssq = 0.0f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const float v = sm.o[t][lane * kPerLane + e];
          ssq += v * v;
        }
        ssq = warp_sum(ssq);
        if (lane == 0) sm.part[t] = ssq;
      }
      cg::this_cluster().sync();
    }
    #pragma unroll 1
    for (int t = warp; t < nt; t += L::kWarps) {
      float total;
      if constexpr (kSlices > 1) {
        total = 0.0f;
        cg::cluster_group cluster = cg::this_cluster();
#pragma unroll
        for (int r = 0; r < kSlices; ++r) total += cluster.map_shared_rank(sm.part, r)[t];
      } else {
        float ssq = 0.0f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const float v = sm.o[t][lane * kPerLane + e];
          ssq += v * v;
        }
        total = warp_sum(ssq);
      }
      const float inv = 1.0f / sqrtf(total / static_cast<float>(kD) + p.norm_eps);
      std::uint16_t* out = p.out + ((b + c0 + t) * p.num_heads + h) * kD + row0;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int rr = lane * kPerLane + e;
        out[rr] = f32_to_bf16(sm.o[t][rr] * inv * __ldg(p.norm_weight + row0 + rr) * sm.og[t][rr]);
      }
    }
    if constexpr (kSlices > 1) {
      cg::this_cluster().sync();  // partials read; also orders all history reads before stage 4
    } else {
      __syncthreads();
    }
  }

  // Stage 4: conv write-back of this slice's channels.
#pragma unroll
  for (int k = 0; k < L::kWriteback; ++k) {
    if (wb_channel[k] < 0) continue;
    const int cgl = wb_channel[k];
    conv_base[cgl] = old1[k];
    conv_base[static_cast<std::int64_t>(width) + cgl] = old2[k];
    #pragma unroll 1
    for (int t = 0; t < len; ++t)
      conv_base[static_cast<std::int64_t>(kHist - 1 + t) * width + cgl] = ld_u16(p.x + (b + t) * p.x_row + cgl);
  }
}

}  // namespace splice::cuda::kda
