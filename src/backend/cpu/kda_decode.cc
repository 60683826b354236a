// The CPU backend's fused KDA decode kernel (spec kda_decode.md §2-§3), fp32 throughout with the
// spec's rounding points. Arguments arrive validated (splice/ops/kda_decode.h), value contracts
// included, so every slot read or written here is in range and no two tasks touch one slot.
//
// Notation: D = 128, H heads, C = H*D, R rows, N sequences, T verify tokens; per sequence rows
// b .. b+L-1, accepted offset a, conv slot cs, source slot ss, destinations dst[t].
// Work is split into tasks (live sequence n, head h); each task owns head h's 3*D conv channels
// of slot cs and head h's D x D state block of every slot it writes, so tasks never conflict and
// each result is computed by one thread in a fixed order (bitwise deterministic).
//
// Stages of one task:
//   1. Conv window. Read the old history hist[p][j][d] = conv_state[cs, p*C + h*D + d, a + j]
//      (j = 0..2) for the q, k, v blocks p; the extended window is ext = [hist0, hist1, hist2,
//      x[b], .., x[b+L-1]]. Token t's conv: pre = ext[t] w0 + ext[t+1] w1 + ext[t+2] w2 +
//      ext[t+3] w3 (fp32, no bias), mixed = bf16(pre * sigmoid(pre)).
//      Then (all of this task's history is read) write back: conv_state[cs, c, 0] = hist1,
//      [cs, c, 1] = hist2, [cs, c, 2 + t] = x[b+t] (bit copies); later positions keep their bits.
//   2. Per token t (row r = b+t): q^ = q / sqrt(sum q^2 + 1e-6) * D^-0.5,
//      k^ = k / sqrt(sum k^2 + 1e-6); z = raw_gate[r,h,:] + dt_bias[h*D:], a_h = exp(A_log[h]),
//      g = lb * sigmoid(a_h z) (lower bound given) or g = -a_h * softplus(z);
//      decay = exp(g); beta = sigmoid(raw_beta[r,h]).
//   3. The delta rule, for every token t in order, on each state row v (row = value index,
//      columns = keys):
//        S[v,:] *= decay_t
//        pred    = S[v,:] . k^_t
//        S[v,:] += beta_t (v_t[v] - pred) k^_t
//        o_raw_t[v] = S[v,:] . q^_t   (the updated row)
//      Rows never meet each other, so the sweep is row-block-major: a block of 4 rows is read
//      once from slot ss (widened to fp32), carried unrounded in L1 through all L tokens, and
//      after token t stored to state[dst[t], h, rows, :] (rounded to the state dtype) when
//      dst[t] > 0. The source rows are read before any checkpoint of them is written, so
//      dst == ss is safe. The source is prefetched a page ahead of the block being read.
//      Stages 2 and 4 run for all tokens before and after the sweep.
//   4. Gated RMSNorm: o = bf16(o_raw); inv = 1 / sqrt(mean(o^2) + eps);
//      out[r,h,v] = bf16(o[v] * inv * norm_weight[v] * sigmoid(output_gate[r,h,v])).
// Rows not owned by a live sequence (null sequences, null rows, rows >= qsl[N]) get exact zeros.
//
// Reductions use kLanes fp32 partial sums (a GCC vector of 16 floats) added in a fixed tree, so
// the result does not depend on the thread count or scheduling. exp inside the sigmoids and the
// decay is a 16-lane polynomial (exp_vec, ~2 fp32 ulp); the hot stages are compiled for AVX-512,
// AVX2 and baseline x86-64 (target_clones) and picked at load time.
#include "splice/backend/cpu/kda_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/target_clones.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"

#if defined(__SSE2__)
#include <immintrin.h>
#define SPLICE_KDA_STREAM_STORES 1
#endif

#pragma GCC diagnostic ignored "-Wpsabi"
#define SPLICE_KDA_CLONES SPLICE_TARGET_CLONES("arch=x86-64-v4", "avx2", "default")

namespace splice::cpu {
namespace {

constexpr std::int64_t kD = kKdaHeadDim;
constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using UVec = std::uint32_t __attribute__((vector_size(kLanes * sizeof(std::uint32_t))));
using HVec = std::uint16_t __attribute__((vector_size(kLanes * sizeof(std::uint16_t))));
static_assert(kD % (2 * kLanes) == 0, "head dim must be a multiple of two vectors");

constexpr std::uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kF32Inf = 0x7F800000u;
constexpr std::uint32_t kBf16QuietBit = 0x40u;
constexpr std::uint32_t kBf16RoundBias = 0x7FFFu;
constexpr int kBf16Shift = 16;

inline float bf16f(std::uint16_t bits) { return bf16_bits_to_f32(bits); }
inline std::uint16_t to_bf16(float v) { return f32_to_bf16_bits(v); }
inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
inline float softplus(float z) { return z > kKdaSoftplusThreshold ? z : std::log1p(std::exp(z)); }

// Vector load/store of 16 consecutive elements (unaligned).
#define SPLICE_KDA_INLINE inline __attribute__((always_inline))

SPLICE_KDA_INLINE Vec load_f32(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
SPLICE_KDA_INLINE void store_f32(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
SPLICE_KDA_INLINE Vec load_bf16(const std::uint16_t* p) {
  HVec h;
  std::memcpy(&h, p, sizeof h);
  const UVec bits = __builtin_convertvector(h, UVec) << kBf16Shift;
  Vec v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
// Round-to-nearest-even f32 -> bf16, NaN kept quiet: the vector form of f32_to_bf16_bits.
SPLICE_KDA_INLINE HVec to_bf16_vec(Vec v) {
  UVec bits;
  std::memcpy(&bits, &v, sizeof bits);
  const UVec rounded = (bits + kBf16RoundBias + ((bits >> kBf16Shift) & 1u)) >> kBf16Shift;
  const UVec quiet = (bits >> kBf16Shift) | kBf16QuietBit;
  const UVec out = ((bits & kF32AbsMask) > kF32Inf) ? quiet : rounded;
  return __builtin_convertvector(out, HVec);
}
SPLICE_KDA_INLINE void store_bf16(std::uint16_t* p, Vec v) {
  const HVec h = to_bf16_vec(v);
  std::memcpy(p, &h, sizeof h);
}

SPLICE_KDA_INLINE Vec widen_bf16(HVec h) {
  const UVec bits = __builtin_convertvector(h, UVec) << kBf16Shift;
  Vec v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
// bf16(v) as an fp32 value (round-to-nearest-even), the vector form of round_to(bf16, v).
SPLICE_KDA_INLINE Vec round_bf16(Vec v) { return widen_bf16(to_bf16_vec(v)); }

// exp(x) on 16 lanes (the Cephes expf scheme): n = floor(x log2(e) + 1/2), r = x - n ln2 with ln2
// split in two (n * kLn2Hi is exact), exp(r) = 1 + r + r^2 P(r) with a degree-5 P, times 2^n
// built in the exponent bits. Relative error ~2e-7 (a couple of fp32 ulp). Inputs are clamped to
// [kExpLo, kExpHi] so that 2^n stays a normal float: below kExpLo the result is ~1.2e-38 instead
// of a smaller number (invisible next to the values it is used with: decay factors and sigmoids);
// NaN propagates.
constexpr float kExpHi = 88.0f;
constexpr float kExpLo = -87.33654f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr int kF32ExponentBias = 127;
constexpr int kF32MantissaBits = 23;
using IVec = std::int32_t __attribute__((vector_size(kLanes * sizeof(std::int32_t))));

SPLICE_KDA_INLINE Vec exp_vec(Vec x) {
  x = x > kExpHi ? Vec{} + kExpHi : x;
  x = x < kExpLo ? Vec{} + kExpLo : x;
  const Vec fx = x * kLog2e + 0.5f;
  Vec n = __builtin_convertvector(__builtin_convertvector(fx, IVec), Vec);  // trunc
  n = n > fx ? n - 1.0f : n;                                                // floor
  const Vec r = x - n * kLn2Hi - n * kLn2Lo;
  Vec p = Vec{} + kExpP[0];
  for (int i = 1; i < 6; ++i) p = p * r + kExpP[i];
  const Vec y = p * (r * r) + r + 1.0f;
  const IVec bits = (__builtin_convertvector(n, IVec) + kF32ExponentBias) << kF32MantissaBits;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
SPLICE_KDA_INLINE Vec sigmoid_vec(Vec z) { return 1.0f / (1.0f + exp_vec(-z)); }

// Checkpoint stores bypass the cache (non-temporal) when the destination is 16-byte aligned: a
// checkpoint is not read again in this call, and streaming avoids reading each line before
// writing it (the write-allocate traffic would add half again to the state bytes).
constexpr std::uintptr_t kStreamAlignment = 16;
constexpr std::uintptr_t kLineAlignment = 64;
SPLICE_KDA_INLINE void stream_f32(float* p, Vec v) {
#ifdef SPLICE_KDA_STREAM_STORES
  __m128 parts[sizeof(Vec) / sizeof(__m128)];
  std::memcpy(parts, &v, sizeof v);
  for (std::size_t i = 0; i < sizeof(Vec) / sizeof(__m128); ++i)
    _mm_stream_ps(p + i * (sizeof(__m128) / sizeof(float)), parts[i]);
#else
  store_f32(p, v);
#endif
}
// Two vectors (32 bf16 = one 64-byte line) at once, so that the line's four 16-byte streaming
// stores are issued back to back and its write-combining buffer fills completely.
SPLICE_KDA_INLINE void stream_bf16_pair(std::uint16_t* p, Vec v0, Vec v1) {
#ifdef SPLICE_KDA_STREAM_STORES
  constexpr std::size_t kParts = 2 * sizeof(HVec) / sizeof(__m128i);
  const HVec h[2] = {to_bf16_vec(v0), to_bf16_vec(v1)};
  __m128i parts[kParts];
  std::memcpy(parts, h, sizeof parts);
  for (std::size_t i = 0; i < kParts; ++i)
    _mm_stream_si128(reinterpret_cast<__m128i*>(p) + i, parts[i]);
#else
  store_bf16(p, v0);
  store_bf16(p + kLanes, v1);
#endif
}
// A checkpoint row block (kRowBlock rows, contiguous in the block and in the slot) written with
// one 64-byte streaming store per line. Compiled for AVX-512F only and called (not inlined) when
// the CPU has it; the stored bits are those of the generic paths.
constexpr std::int64_t kBlockElems = 4 * kD;  // kRowBlock * D
#ifdef SPLICE_KDA_STREAM_STORES
__attribute__((target("avx512f"))) void stream64_rows_f32(void* sink, const float* block) {
  float* dst = static_cast<float*>(sink);
  for (std::int64_t j = 0; j < kBlockElems; j += kLanes)
    _mm512_stream_ps(dst + j, _mm512_loadu_ps(block + j));
}
__attribute__((target("avx512f"))) void stream64_rows_bf16(void* sink, const float* block) {
  std::uint16_t* dst = static_cast<std::uint16_t*>(sink);
  for (std::int64_t j = 0; j < kBlockElems; j += 2 * kLanes) {
    const HVec h[2] = {to_bf16_vec(load_f32(block + j)), to_bf16_vec(load_f32(block + j + kLanes))};
    __m512i line;
    std::memcpy(&line, h, sizeof line);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + j), line);
  }
}
bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
#else
void stream64_rows_f32(void*, const float*) { SPLICE_INTERNAL_CHECK(false, "no 64-byte stores"); }
void stream64_rows_bf16(void*, const float*) { SPLICE_INTERNAL_CHECK(false, "no 64-byte stores"); }
bool cpu_has_avx512f() { return false; }
#endif

// Fixed-order tree sum of the 16 lanes: lanes i and i + 8, then i and i + 4, i and i + 2, 0 and 1
// (in registers, by halving shuffles).
using Vec8 = float __attribute__((vector_size(8 * sizeof(float))));
using Vec4 = float __attribute__((vector_size(4 * sizeof(float))));
SPLICE_KDA_INLINE float reduce(Vec v) {
  const Vec8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 s4 =
      __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
  return s0 + s1;
}
SPLICE_KDA_INLINE float sum_squares(const float* p) {
  Vec acc = {};
  for (std::int64_t j = 0; j < kD; j += kLanes) {
    const Vec v = load_f32(p + j);
    acc += v * v;
  }
  return reduce(acc);
}

// Where the state rows come from (the source slot) and where token t's checkpoint goes.
enum class RowSource : std::uint8_t { slot_f32, slot_bf16 };
// none: no checkpoint for this token; store: plain stores (unaligned destination); stream16 /
// stream64: non-temporal 16-byte / 64-byte stores (16- / 64-byte aligned destination; 64 needs
// AVX-512F at run time).
enum class RowSink : std::uint8_t {
  none,
  store_f32,
  store_bf16,
  stream16_f32,
  stream16_bf16,
  stream64_f32,
  stream64_bf16,
};

// Stage 3 for all L tokens of one (sequence, head). Rows are independent under the delta rule
// (row v of S only meets row v), so the sweep runs row block by row block and, inside a block,
// token by token: the block (kRowBlock rows, 2 KiB of fp32) stays in L1 across all tokens, the
// source slot is read once and each checkpoint written once, and there is no state-sized scratch.
struct SweepArgs {
  const void* source;        // [D, D] slot block of ss (f32 or bf16)
  void* const* sinks;        // [L] slot block of dst[t], or null
  const RowSink* sink_kind;  // [L]
  const float* decay;        // [L, D] exp(g)
  const float* k_hat;        // [L, D]
  const float* q_hat;        // [L, D]
  const float* v;            // token t's v (bf16-exact) at v + t * v_stride
  std::int64_t v_stride;
  const float* beta;        // [L]
  float* o_raw;             // [L, D] out
  std::int64_t len;         // L
  std::int64_t state_elem;  // bytes per state element (4 or 2)
};

// Rows are swept kRowBlock at a time so the block's independent dot-product chains overlap; each
// row's sums still run over j in order and end in the same lane tree.
constexpr std::int64_t kRowBlock = 4;
static_assert(kD % kRowBlock == 0, "head dim must be a multiple of the row block");
static_assert(kBlockElems == kRowBlock * kD, "kBlockElems is one row block");

// One token on one row block: S *= decay; pred = S.k^; S += beta (v - pred) k^; o = S.q^.
SPLICE_KDA_INLINE void token_rows(float* __restrict block, std::int64_t row0, std::int64_t t,
                                  const SweepArgs& s) {
  const float* const __restrict decay_v = s.decay + t * kD;
  const float* const __restrict k_hat_v = s.k_hat + t * kD;
  const float* const __restrict q_hat_v = s.q_hat + t * kD;
  Vec acc[kRowBlock] = {};
  for (std::int64_t j = 0; j < kD; j += kLanes) {
    const Vec decay = load_f32(decay_v + j), k_hat = load_f32(k_hat_v + j);
    for (std::int64_t i = 0; i < kRowBlock; ++i) {
      const Vec x = load_f32(block + i * kD + j) * decay;
      store_f32(block + i * kD + j, x);
      acc[i] += x * k_hat;
    }
  }
  float delta[kRowBlock];
  for (std::int64_t i = 0; i < kRowBlock; ++i)
    delta[i] = s.beta[t] * (s.v[t * s.v_stride + row0 + i] - reduce(acc[i]));
  Vec out[kRowBlock] = {};
  for (std::int64_t j = 0; j < kD; j += kLanes) {
    const Vec k_hat = load_f32(k_hat_v + j), q_hat = load_f32(q_hat_v + j);
    for (std::int64_t i = 0; i < kRowBlock; ++i) {
      const Vec x = load_f32(block + i * kD + j) + delta[i] * k_hat;
      store_f32(block + i * kD + j, x);
      out[i] += x * q_hat;
    }
  }
  for (std::int64_t i = 0; i < kRowBlock; ++i) s.o_raw[t * kD + row0 + i] = reduce(out[i]);
}

// The checkpoint of one row block after token t: the fp32 block, rounded to the state dtype.
SPLICE_KDA_INLINE void store_rows(RowSink kind, void* sink, const float* block) {
  float* f = static_cast<float*>(sink);
  std::uint16_t* b = static_cast<std::uint16_t*>(sink);
  switch (kind) {
    case RowSink::none:
      break;
    case RowSink::store_f32:
      std::memcpy(f, block, kBlockElems * sizeof(float));
      break;
    case RowSink::store_bf16:
      for (std::int64_t j = 0; j < kBlockElems; j += kLanes) store_bf16(b + j, load_f32(block + j));
      break;
    case RowSink::stream16_f32:
      for (std::int64_t j = 0; j < kBlockElems; j += kLanes) stream_f32(f + j, load_f32(block + j));
      break;
    case RowSink::stream16_bf16:
      for (std::int64_t j = 0; j < kBlockElems; j += 2 * kLanes)
        stream_bf16_pair(b + j, load_f32(block + j), load_f32(block + j + kLanes));
      break;
    case RowSink::stream64_f32:
      stream64_rows_f32(sink, block);
      break;
    case RowSink::stream64_bf16:
      stream64_rows_bf16(sink, block);
      break;
  }
}

// How far ahead of the sweep the source is prefetched: one 4 KiB page (2 row blocks of fp32
// state, 4 of bf16). The hardware streamers alone left the reads latency-bound (2 KiB blocks
// with arithmetic between them); 2, 4 and 8 KiB measured alike (perf-cpu-kda.md, version 9).
constexpr std::int64_t kPrefetchBytes = 4096;

// The whole stage 3, compiled for the widest vector ISA the machine has.
SPLICE_KDA_CLONES void sweep_state(const SweepArgs& s, RowSource source) {
  alignas(64) float block[kRowBlock * kD];  // rows row0 .. row0 + kRowBlock - 1, fp32
  const std::uintptr_t source_addr = reinterpret_cast<std::uintptr_t>(s.source);
  const std::int64_t block_bytes = kBlockElems * s.state_elem;
  for (std::int64_t row0 = 0; row0 < kD; row0 += kRowBlock) {
    // Ask for the source lines kPrefetchBytes ahead of this block: past a head's last block they
    // are the next head's, which the thread usually takes next. A prefetch never faults, and the
    // address is formed as an integer, so running past the state tensor is harmless.
    const std::uintptr_t ahead =
        source_addr + static_cast<std::uintptr_t>(row0 / kRowBlock * block_bytes + kPrefetchBytes);
    for (std::uintptr_t line = 0; line < static_cast<std::uintptr_t>(block_bytes);
         line += kLineAlignment)
      __builtin_prefetch(reinterpret_cast<const void*>(ahead + line), 0, 3);
    // Widen the source rows (read before any checkpoint of these rows is written: dst == ss is
    // safe).
    for (std::int64_t j = 0; j < kRowBlock * kD; j += kLanes) {
      if (source == RowSource::slot_f32)
        store_f32(block + j, load_f32(static_cast<const float*>(s.source) + row0 * kD + j));
      else
        store_f32(block + j,
                  load_bf16(static_cast<const std::uint16_t*>(s.source) + row0 * kD + j));
    }
    for (std::int64_t t = 0; t < s.len; ++t) {
      token_rows(block, row0, t, s);
      if (s.sink_kind[t] != RowSink::none)
        store_rows(s.sink_kind[t], static_cast<char*>(s.sinks[t]) + row0 * kD * s.state_elem,
                   block);
    }
  }
}

// Stage 1 for one token and one projection block of one head: pre = sum_tap ext[t+tap] * w[tap]
// (taps in order 0..3, fp32), mixed = bf16(pre * sigmoid(pre)).
SPLICE_KDA_CLONES void conv_silu(const std::uint16_t* const* taps, const float* wt, std::int64_t C,
                                 float* mixed) {
  for (std::int64_t d = 0; d < kD; d += kLanes) {
    Vec pre = load_bf16(taps[0] + d) * load_f32(wt + d);
    for (std::int64_t tap = 1; tap < kKdaConvWidth; ++tap)
      pre += load_bf16(taps[tap] + d) * load_f32(wt + tap * C + d);
    store_f32(mixed + d, round_bf16(pre * sigmoid_vec(pre)));
  }
}

// Stage 2 for one token and head: q^, k^ and the per-key decay exp(g).
struct TokenGates {
  const float* q;             // [D] bf16-exact conv outputs
  const float* k;             // [D]
  const std::uint16_t* gate;  // [D] raw_gate[r, h, :]
  const float* dt_bias;       // [D] dt_bias[h*D:]
  float a_h;                  // exp(A_log[h])
  bool has_lower_bound;
  float lower_bound;
  float* q_hat;  // [D] out
  float* k_hat;  // [D] out
  float* decay;  // [D] out
};

SPLICE_KDA_CLONES void token_gates(const TokenGates& g) {
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const float q_inv = 1.0f / std::sqrt(sum_squares(g.q) + kKdaL2NormEps);
  const float k_inv = 1.0f / std::sqrt(sum_squares(g.k) + kKdaL2NormEps);
  for (std::int64_t d = 0; d < kD; d += kLanes) {
    store_f32(g.q_hat + d, load_f32(g.q + d) * q_inv * q_scale);
    store_f32(g.k_hat + d, load_f32(g.k + d) * k_inv);
  }
  if (g.has_lower_bound) {
    for (std::int64_t d = 0; d < kD; d += kLanes) {
      const Vec z = load_bf16(g.gate + d) + load_f32(g.dt_bias + d);
      store_f32(g.decay + d, exp_vec(g.lower_bound * sigmoid_vec(g.a_h * z)));
    }
  } else {
    for (std::int64_t d = 0; d < kD; ++d)
      g.decay[d] = -g.a_h * softplus(bf16f(g.gate[d]) + g.dt_bias[d]);
    for (std::int64_t d = 0; d < kD; d += kLanes)
      store_f32(g.decay + d, exp_vec(load_f32(g.decay + d)));
  }
}

// Stage 4 for one token and head: o = bf16(o_raw), inv = 1/sqrt(mean(o^2) + eps),
// out = bf16(o * inv * norm_weight * sigmoid(output_gate)).
SPLICE_KDA_CLONES void token_output(float* o, const float* norm_weight,
                                    const std::uint16_t* out_gate, float norm_eps,
                                    std::uint16_t* out) {
  for (std::int64_t d = 0; d < kD; d += kLanes) store_f32(o + d, round_bf16(load_f32(o + d)));
  const float inv = 1.0f / std::sqrt(sum_squares(o) / static_cast<float>(kD) + norm_eps);
  for (std::int64_t d = 0; d < kD; d += kLanes)
    store_bf16(out + d, load_f32(o + d) * inv * load_f32(norm_weight + d) *
                            sigmoid_vec(load_bf16(out_gate + d)));
}

// One sequence as the kernel sees it (plain/t1 rows are sequences of length 1 with a = 0).
struct SeqWork {
  std::int64_t begin = 0;             // first row b
  std::int64_t len = 0;               // L
  std::int64_t accepted = 0;          // a
  std::int32_t conv_slot = 0;         // cs
  std::int32_t source_slot = 0;       // ss
  const std::int32_t* dst = nullptr;  // dst[t], t < L
};

// Raw pointers and element strides of the validated arguments.
struct Kernel {
  const std::uint16_t* x;  // [R, 3C]
  std::int64_t x_row;
  const float* weight;  // [3, 4, C]
  std::uint16_t* conv;  // [slots, 3C, T+2], position stride 3C
  std::int64_t conv_slot;
  const std::uint16_t* gate;  // [R, H, D]
  std::int64_t gate_row, gate_head;
  const std::uint16_t* beta;  // [R, H]
  std::int64_t beta_row, beta_head;
  const float* a_log;        // [H]
  const float* dt_bias;      // [C]
  const float* norm_weight;  // [D]
  char* state;               // [slots, H, D, D] bytes
  std::int64_t state_slot_bytes, state_head_bytes;
  bool state_bf16;
  const std::uint16_t* out_gate;  // [R, H, D]
  std::int64_t og_row, og_head;
  std::uint16_t* out;  // [R, H, D] contiguous
  std::int64_t H, C;
  std::optional<float> lower_bound;
  float norm_eps;
};

// Per-thread working memory, sized for T tokens.
struct Scratch {
  std::vector<float> mixed;                       // [T, 3, D] conv outputs (q, k, v)
  std::vector<std::uint16_t> hist;                // [3, 3, D] old history (projection, position, d)
  std::vector<float> q_hat, k_hat, decay, o_raw;  // [T, D] each
  std::vector<float> beta;                        // [T]
  std::vector<void*> sinks;                       // [T]
  std::vector<RowSink> sink_kind;                 // [T]
  explicit Scratch(std::int64_t T)
      : mixed(T * kKdaNumProjections * kD),
        hist(kKdaNumProjections * (kKdaConvWidth - 1) * kD),
        q_hat(T * kD),
        k_hat(T * kD),
        decay(T * kD),
        o_raw(T * kD),
        beta(T),
        sinks(T),
        sink_kind(T) {}
};

void run_task(const Kernel& k, const SeqWork& w, std::int64_t h, Scratch& sc) {
  const std::int64_t C = k.C, width = kKdaNumProjections * C, L = w.len;
  constexpr std::int64_t kHist = kKdaConvWidth - 1;  // 3 history taps

  // Stage 1: conv window of head h's q, k, v channels.
  std::uint16_t* conv_base = k.conv + w.conv_slot * k.conv_slot;
  for (std::int64_t p = 0; p < kKdaNumProjections; ++p) {
    const std::int64_t c0 = p * C + h * kD;
    std::uint16_t* hist = sc.hist.data() + p * kHist * kD;
    for (std::int64_t j = 0; j < kHist; ++j)
      std::memcpy(hist + j * kD, conv_base + (w.accepted + j) * width + c0,
                  kD * sizeof(std::uint16_t));
    const float* wt = k.weight + p * kKdaConvWidth * C + h * kD;  // taps w = 0..3
    for (std::int64_t t = 0; t < L; ++t) {
      const std::uint16_t* taps[kKdaConvWidth];  // ext[t + tap]
      for (std::int64_t tap = 0; tap < kKdaConvWidth; ++tap) {
        const std::int64_t e = t + tap;  // index into ext = [hist0..2, x[b..]]
        taps[tap] = e < kHist ? hist + e * kD : k.x + (w.begin + e - kHist) * k.x_row + c0;
      }
      conv_silu(taps, wt, C, sc.mixed.data() + (t * kKdaNumProjections + p) * kD);
    }
    // Write-back (every history read of these channels is done): [h1, h2, x[b], .., x[b+L-1]].
    for (std::int64_t j = 0; j < kHist - 1; ++j)
      std::memcpy(conv_base + j * width + c0, hist + (j + 1) * kD, kD * sizeof(std::uint16_t));
    for (std::int64_t t = 0; t < L; ++t)
      std::memcpy(conv_base + (kHist - 1 + t) * width + c0, k.x + (w.begin + t) * k.x_row + c0,
                  kD * sizeof(std::uint16_t));
  }

  const float a_h = std::exp(k.a_log[h]);
  const std::int64_t head_bytes = h * k.state_head_bytes;
  bool streamed = false;
  for (std::int64_t t = 0; t < L; ++t) {
    const std::int64_t r = w.begin + t;
    const float* q = sc.mixed.data() + t * kKdaNumProjections * kD;
    // Stage 2: normalized q, k, the gate and beta of token t.
    token_gates({q, q + kD, k.gate + r * k.gate_row + h * k.gate_head, k.dt_bias + h * kD, a_h,
                 k.lower_bound.has_value(), k.lower_bound.value_or(0.0f), sc.q_hat.data() + t * kD,
                 sc.k_hat.data() + t * kD, sc.decay.data() + t * kD});
    sc.beta[t] = sigmoid(bf16f(k.beta[r * k.beta_row + h * k.beta_head]));
    // Where token t's checkpoint goes: streamed when 16-byte aligned, except in place (dst ==
    // ss), where the sweep has just read the block's lines into L1 and plain stores update them
    // there (a streaming store to a cached line first evicts it; perf-cpu-kda.md, version 8).
    sc.sinks[t] = nullptr;
    sc.sink_kind[t] = RowSink::none;
    if (w.dst[t] > 0) {
      sc.sinks[t] = k.state + w.dst[t] * k.state_slot_bytes + head_bytes;
      const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(sc.sinks[t]);
      const bool in_place = w.dst[t] == w.source_slot;
      const bool line = !in_place && addr % kLineAlignment == 0 && cpu_has_avx512f();
      const bool stream = !in_place && addr % kStreamAlignment == 0;
      streamed = streamed || stream;
      if (k.state_bf16)
        sc.sink_kind[t] = line     ? RowSink::stream64_bf16
                          : stream ? RowSink::stream16_bf16
                                   : RowSink::store_bf16;
      else
        sc.sink_kind[t] = line     ? RowSink::stream64_f32
                          : stream ? RowSink::stream16_f32
                                   : RowSink::store_f32;
    }
  }

  // Stage 3: the fused state sweep over all tokens.
  const SweepArgs s{k.state + w.source_slot * k.state_slot_bytes + head_bytes,
                    sc.sinks.data(),
                    sc.sink_kind.data(),
                    sc.decay.data(),
                    sc.k_hat.data(),
                    sc.q_hat.data(),
                    sc.mixed.data() + 2 * kD,
                    kKdaNumProjections * kD,
                    sc.beta.data(),
                    sc.o_raw.data(),
                    L,
                    k.state_bf16 ? 2 : 4};
  sweep_state(s, k.state_bf16 ? RowSource::slot_bf16 : RowSource::slot_f32);
#ifdef SPLICE_KDA_STREAM_STORES
  if (streamed) _mm_sfence();
#else
  (void)streamed;
#endif

  // Stage 4: gated RMSNorm of each token's bf16-rounded output.
  for (std::int64_t t = 0; t < L; ++t) {
    const std::int64_t r = w.begin + t;
    token_output(sc.o_raw.data() + t * kD, k.norm_weight, k.out_gate + r * k.og_row + h * k.og_head,
                 k.norm_eps, k.out + (r * k.H + h) * kD);
  }
}

// Runs fn(task, scratch) for task in [0, count) on the backend pool (parallel.h): one chunk per
// thread, each pulling tasks from a shared counter (dynamic scheduling: sequences are ragged).
// Every task is computed by one thread in a fixed order, so results do not depend on the thread
// count. The first exception is rethrown on the caller's thread by parallel_for.
template <typename Fn>
void parallel_tasks(std::int64_t count, std::int64_t max_t, const Fn& fn) {
  const std::int64_t workers = std::min<std::int64_t>(num_threads(), count);
  std::atomic<std::int64_t> next{0};
  parallel_for(0, workers, 1, [&](std::int64_t, std::int64_t) {
    Scratch sc(max_t);
    for (std::int64_t i = next++; i < count; i = next++) fn(i, sc);
  });
}

}  // namespace

void kda_decode(const KdaDecodeArgs& a) {
  SPLICE_INTERNAL_CHECK(a.x.device().is_cpu(), "cpu::kda_decode got ", a.x.device().str());
  SPLICE_INTERNAL_CHECK(a.head_dim == kD, "head_dim ", a.head_dim);
  const std::int64_t R = a.num_rows, H = a.num_heads, T = a.max_t;
  const std::int64_t state_elem = static_cast<std::int64_t>(dtype_size(a.state_dtype));

  Kernel k{};
  k.x = a.x.data<std::uint16_t>();
  k.x_row = a.x.stride(0);
  k.weight = a.weight.data<float>();
  k.conv = a.conv_state.data<std::uint16_t>();
  k.conv_slot = a.conv_state.stride(0);
  k.gate = a.raw_gate.data<std::uint16_t>();
  k.gate_row = a.raw_gate.stride(0);
  k.gate_head = a.raw_gate.stride(1);
  k.beta = a.raw_beta.data<std::uint16_t>();
  k.beta_row = a.raw_beta.stride(0);
  k.beta_head = a.raw_beta.stride(1);
  k.a_log = a.A_log.data<float>();
  k.dt_bias = a.dt_bias.data<float>();
  k.norm_weight = a.norm_weight.data<float>();
  k.state = static_cast<char*>(a.state.raw_data());
  k.state_slot_bytes = a.state.stride(0) * state_elem;
  k.state_head_bytes = a.state.stride(1) * state_elem;
  k.state_bf16 = a.state_dtype == DType::bf16;
  k.out_gate = a.output_gate.data<std::uint16_t>();
  k.og_row = a.output_gate.stride(0);
  k.og_head = a.output_gate.stride(1);
  k.out = a.output.data<std::uint16_t>();
  k.H = H;
  k.C = a.channels;
  k.lower_bound = a.lower_bound;
  k.norm_eps = a.norm_eps;

  // Live sequences and the rows they own.
  std::vector<SeqWork> live;
  std::vector<char> row_live(static_cast<std::size_t>(R), 0);
  if (a.mode == KdaMode::plain || a.mode == KdaMode::t1) {
    const std::int32_t* slots = a.row_slots.data<std::int32_t>();
    for (std::int64_t r = 0; r < R; ++r) {
      if (slots[r] <= 0) continue;
      live.push_back({r, 1, 0, slots[r], slots[r], slots + r});
      row_live[r] = 1;
    }
  } else {
    const std::int32_t* qsl = a.query_start_loc.data<std::int32_t>();
    const std::int32_t* nat = a.num_accepted_tokens.data<std::int32_t>();
    const std::int32_t* si = a.state_indices.data<std::int32_t>();
    for (std::int64_t n = 0; n < a.num_seqs; ++n) {
      const std::int64_t b = qsl[n], len = static_cast<std::int64_t>(qsl[n + 1]) - qsl[n];
      const std::int64_t acc = std::clamp<std::int64_t>(nat[n] - 1, 0, T - 1);
      const std::int32_t* row = si + n * T;
      if (len <= 0 || row[0] <= 0 || row[acc] <= 0) continue;  // empty or null sequence
      SPLICE_INTERNAL_CHECK(b >= 0 && b + len <= R && len <= T, "sequence ", n, " rows");
      live.push_back({b, len, acc, row[0], row[acc], row});
      std::fill(row_live.begin() + b, row_live.begin() + b + len, 1);
    }
  }
  for (std::int64_t r = 0; r < R; ++r)
    if (!row_live[r]) std::memset(k.out + r * H * kD, 0, H * kD * sizeof(std::uint16_t));

  const std::int64_t tasks = static_cast<std::int64_t>(live.size()) * H;
  parallel_tasks(
      tasks, T, [&](std::int64_t task, Scratch& sc) { run_task(k, live[task / H], task % H, sc); });
}

}  // namespace splice::cpu
