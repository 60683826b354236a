// CPU flash-decode attention (spec decode_attention.md §5; interface in
// splice/backend/cpu/flash_decode.h). One pass over the live prefix with an online softmax, the key
// axis split into chunks whose partial results merge by log-sum-exp.
//
// Notation: batch b, kv head c, group size G = Hq / Hkv, query heads h = c*G + g (g < G), query
// rows i < Sq at positions p_i = k_len[b] - Sq + i, keys j, scale = softmax_scale (or 1/sqrt(D)).
//
//  1. Visibility. Row i of sequence b sees the key interval [lo_i, hi_i) with
//       lo_i = max(0, p_i - window_left)                       (0 without a left window)
//       hi_i = min(k_len[b], p_i + 1 if causal, p_i + window_right + 1 if a right window)
//     (empty when hi_i <= lo_i). The union U_b = [min lo_i, max hi_i) over non-empty rows is the
//     only range ever touched; inside it a key is loaded only when some row sees it, and a row
//     only ever uses keys inside its own interval. Nothing at or beyond k_len, nor outside every
//     window, is read, so NaN there cannot reach a result.
//  2. Split-KV planning. U_b is cut into S chunks of ceil(|U_b| / S) keys. S is the caller's
//     num_splits, or planned so that batch * Hkv * S tasks keep every thread busy while each chunk
//     keeps at least kMinKeysPerSplit keys. The backend's pool (parallel.h) runs contiguous
//     ranges of tasks (b, c, split).
//  3. Per task: the G*Sq query rows of kv head c are converted to fp32 once (rows r = g*Sq + i).
//     Running state per row: m_r = -inf, l_r = 0, acc_r[0..D) = 0.
//  4. Per key tile [t0, t0 + kKeyTile) of the chunk: each needed key row k_j is converted to fp32
//     scratch once and shared by all G*Sq rows of the group (one K read per GQA group). Scores
//       s_rj = scale * (q_r . k_j);  softcap: s_rj = cap * tanh(s_rj / cap);
//       ALiBi: s_rj += -slope[h] * (p_i - j).
//  5. Online softmax per row over the tile's visible keys, with e_rj = exp(s_rj - m'):
//       m' = max(m_r, max_j s_rj);  alpha = exp(m_r - m');
//       l_r = alpha * l_r + sum_j e_rj;
//       acc_r = alpha * acc_r + sum_j e_rj * v_j      (v_j converted once per tile);
//       m_r = m'.
//  6. Merge (per row, over the S partials (m_s, l_s, acc_s) with m_s > -inf):
//       M = max_s m_s;  L = sum_s l_s exp(m_s - M);  o = (sum_s acc_s exp(m_s - M)) / L;
//       lse = M + log(L)  (natural log). A row with no visible key writes o = 0 and lse = -inf.
//     o is rounded once to the output dtype.
// All arithmetic is fp32, in blocks of W-float vectors (GCC vector extensions; W = 16 where the
// CPU has AVX-512, 8 with AVX2, 4 otherwise, halved until it divides D):
//  - scores: RB query rows x KB keys with RB * KB = W (RB = 4, 2 or 1 by the rows left) keep W
//    accumulator vectors over D; one transpose-add tree (log2 W rounds of even / odd lane
//    shuffles) turns them into one vector of W dot products, so no score pays a horizontal sum of
//    its own. A key no row sees is never loaded: its slot of a block repeats a seen key and its
//    score is never read (no row's visible range holds it).
//  - acc_r += p_rj v_j: up to 4 rows with the same visible keys in this tile share each V vector
//    load; acc stays in registers over the tile's keys, W floats of D at a time.
//  - the next tile's K and V lines are prefetched a pair per inner iteration of both loops
//    (NextTilePrefetch), spread through this tile's arithmetic.
// On x86-64 the task is compiled three times (AVX-512, AVX2+FMA, baseline) and the loader picks
// the best the CPU runs (the clones differ only by FMA contraction: checked equal within 2e-4
// relative on bf16/f16/f32 outputs, far inside the contract tolerance). Inside each clone every W
// is compiled (tests run them all, set_flash_decode_lanes_for_testing); the CPU's own W runs.
#include "splice/backend/cpu/flash_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/target_clones.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"

// The vector helpers take and return Vec<W> by value; they are always inlined, so the ABI note GCC
// gives for 32- and 64-byte vectors outside an AVX function concerns no real call.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define SPLICE_FD_CLONES SPLICE_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")
#define SPLICE_FD_INLINE inline __attribute__((always_inline))

namespace splice::cpu {
namespace {

using i64 = std::int64_t;

// Keys per tile: kKeyTile fp32 K and V rows (16 KB each at D = 128) stay in L1/L2 between use.
constexpr i64 kKeyTile = 32;
// A split shorter than this spends more on its partial state and merge than it saves.
constexpr i64 kMinKeysPerSplit = 256;
// Tasks per thread the split planner aims for, so uneven tasks still balance.
constexpr i64 kTasksPerThread = 4;
// Below this many q.k multiply-adds (~50 us on one core) the call runs on the calling thread:
// waking the pool and a second core's cold caches would cost about as much as they save.
constexpr i64 kSerialWorkLimit = i64{1} << 18;
constexpr i64 kCacheLine = 64;
// Partial sums (and maxima) per row over a tile's scores (one AVX2 register).
constexpr int kSumLanes = 8;
// The widest vector of the blocked kernels, in floats (AVX-512).
constexpr int kMaxLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- fp32 row conversion (stages 3-4: every row is converted once, then reused) ---------------

// f16 bits -> f32, branch-free so the loop vectorizes: the 15 magnitude bits shifted into an f32
// and scaled by 2^(127-15) give normals and subnormals exactly; exponent 31 maps to inf/NaN.
SPLICE_FD_INLINE float f16_to_f32_fast(std::uint16_t bits) {
  constexpr float kRebias = 0x1p112f;
  constexpr std::uint32_t kF16ExpMask = 0x7C00u;
  constexpr int kMantissaShift = 13;
  const std::uint32_t magnitude = bits & 0x7FFFu;
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const float scaled = f32_from_bits(magnitude << kMantissaShift) * kRebias;
  const std::uint32_t finite_bits = f32_bits(scaled);
  const std::uint32_t special_bits = 0x7F800000u | (magnitude << kMantissaShift);
  return f32_from_bits(sign | (magnitude >= kF16ExpMask ? special_bits : finite_bits));
}

SPLICE_FD_INLINE void load_row(const char* src, DType dtype, i64 n, float* __restrict dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::bf16: {
      const auto* s = reinterpret_cast<const std::uint16_t*>(src);
      for (i64 d = 0; d < n; ++d) dst[d] = f32_from_bits(static_cast<std::uint32_t>(s[d]) << 16);
      return;
    }
    default: {  // f16
      const auto* s = reinterpret_cast<const std::uint16_t*>(src);
      for (i64 d = 0; d < n; ++d) dst[d] = f16_to_f32_fast(s[d]);
      return;
    }
  }
}

// ---- the blocked SIMD kernels -------------------------------------------------------------------

// W floats in one vector (one zmm at W = 16 under AVX-512; narrower ISAs split it).
template <int W>
struct FloatVector {
  typedef float type __attribute__((vector_size(sizeof(float) * W)));
};
template <int W>
using Vec = typename FloatVector<W>::type;

template <int W>
SPLICE_FD_INLINE Vec<W> load_vec(const float* p) {
  Vec<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int W>
SPLICE_FD_INLINE void store_vec(float* p, Vec<W> v) {
  std::memcpy(p, &v, sizeof v);
}

// One round of the transpose-add tree: lanes (2u, 2u + 1) of a summed into lane u, of b into lane
// W/2 + u.
template <int W, std::size_t... U>
SPLICE_FD_INLINE Vec<W> add_adjacent_lanes(Vec<W> a, Vec<W> b, std::index_sequence<U...>) {
  return __builtin_shufflevector(a, b, (2 * U)...) + __builtin_shufflevector(a, b, (2 * U + 1)...);
}

// x[0..W) -> one vector whose lane i is the sum of x[i]'s lanes (W - 1 folds over log2 W rounds
// of N vectors each, x overwritten).
template <int W, int N = W>
SPLICE_FD_INLINE Vec<W> sum_each(Vec<W> (&x)[W]) {
  if constexpr (N == 1) {
    return x[0];
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < N / 2; ++i)
      x[i] = add_adjacent_lanes<W>(x[2 * i], x[2 * i + 1], std::make_index_sequence<W>{});
    return sum_each<W, N / 2>(x);
  }
}

// The next tile's K and V rows, one cache line of each per step(): the blocked loops below take a
// step per inner iteration, so the lines are asked for through this tile's arithmetic a pair at a
// time (asked for all at once, they stall the core on its line-fill buffers). rows = 0: no next
// tile, nothing to ask for.
struct NextTilePrefetch {
  const char* k = nullptr;  // the current row's first line
  const char* v = nullptr;
  i64 k_stride = 0, v_stride = 0;  // bytes from one key row to the next
  i64 row_bytes = 0;
  i64 rows = 0;    // rows left
  i64 offset = 0;  // within the current row
  SPLICE_FD_INLINE void step() {
    if (rows == 0) return;
    __builtin_prefetch(k + offset);
    __builtin_prefetch(v + offset);
    offset += kCacheLine;
    if (offset >= row_bytes) {
      offset = 0;
      k += k_stride;
      v += v_stride;
      --rows;
    }
  }
};

// Scores of RB rows (q at q_rows, stride D) against the tile's keys [0, n): slot t uses key row
// key_row[t] of kf (stride D); scores[r * kKeyTile + t] = scale * q_r . k. Blocks of KB = W / RB
// keys; a partial last block writes slots up to round_up(n, KB) <= kKeyTile (never read).
template <int W, int RB>
SPLICE_FD_INLINE void score_rows(const float* __restrict q_rows, const float* __restrict kf,
                                 const int* key_row, i64 D, i64 n, float scale,
                                 float* __restrict scores, NextTilePrefetch& next) {
  constexpr int KB = W / RB;
  for (i64 t = 0; t < n; t += KB) {
    Vec<W> acc[W] = {};  // acc[r * KB + k]
    const float* k_rows[KB];
#pragma GCC unroll 16
    for (int k = 0; k < KB; ++k) k_rows[k] = kf + key_row[t + k] * D;
    for (i64 d = 0; d < D; d += W) {
      Vec<W> kv[KB];
#pragma GCC unroll 16
      for (int k = 0; k < KB; ++k) kv[k] = load_vec<W>(k_rows[k] + d);
      next.step();
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        const Vec<W> qv = load_vec<W>(q_rows + r * D + d);
#pragma GCC unroll 16
        for (int k = 0; k < KB; ++k) acc[r * KB + k] += qv * kv[k];
      }
    }
    const Vec<W> dots = sum_each<W>(acc);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
      for (int k = 0; k < KB; ++k) scores[r * kKeyTile + t + k] = scale * dots[r * KB + k];
  }
}

// Every row of the task against the tile: blocks of 4, then 2, then 1 rows.
template <int W>
SPLICE_FD_INLINE void score_tile(const float* qf, const float* kf, const int* key_row, i64 R, i64 D,
                                 i64 n, float scale, float* scores, NextTilePrefetch& next) {
  i64 r = 0;
  if constexpr (W >= 4)
    for (; r + 4 <= R; r += 4)
      score_rows<W, 4>(qf + r * D, kf, key_row, D, n, scale, scores + r * kKeyTile, next);
  if constexpr (W >= 2)
    for (; r + 2 <= R; r += 2)
      score_rows<W, 2>(qf + r * D, kf, key_row, D, n, scale, scores + r * kKeyTile, next);
  for (; r < R; ++r)
    score_rows<W, 1>(qf + r * D, kf, key_row, D, n, scale, scores + r * kKeyTile, next);
}

// acc_r += sum_{t in [a, e)} p[r * kKeyTile + t] * v_t for RB rows (acc stride D, v_t = vf + t D).
template <int W, int RB>
SPLICE_FD_INLINE void add_values(const float* __restrict p, const float* __restrict vf, i64 a,
                                 i64 e, i64 D, float* __restrict acc, NextTilePrefetch& next) {
  for (i64 d = 0; d < D; d += W) {
    Vec<W> o[RB];
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) o[r] = load_vec<W>(acc + r * D + d);
    for (i64 t = a; t < e; ++t) {
      const Vec<W> v = load_vec<W>(vf + t * D + d);
      next.step();
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) o[r] += p[r * kKeyTile + t] * v;
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) store_vec<W>(acc + r * D + d, o[r]);
  }
}

// exp(x) for x <= 0 (a score minus the running max), branch-free so the loop over a tile's keys
// vectorizes: x = n ln2 + f with n = round(x / ln2), |f| <= ln2 / 2; exp(f) by the degree-6
// minimax polynomial of Cephes' expf (about 1 ulp); 2^n added to the exponent bits. Below
// kExpMinArg the result (< 2e-35, far under fp32 resolution of the row's sum, whose largest term
// is 1) is flushed to 0; x = 0 gives exactly 1; a NaN stays NaN (a poisoned read must reach the
// output, so the verifier sees an arm that reads past k_len). The reduction runs on x clamped with
// NaN sent to kExpMinArg, so n is an integer in [-116, 0] and the exponent arithmetic (unsigned)
// is defined for every input.
SPLICE_FD_INLINE float exp_nonpositive(float x) {
  constexpr float kExpMinArg = -80.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr int kMantissaBits = 23;
  const float xc = x >= kExpMinArg ? x : kExpMinArg;  // NaN -> kExpMinArg
  const float n = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  const float f = (xc - n * kLn2Hi) - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * f + 1.3981999507e-3f;
  poly = poly * f + 8.3334519073e-3f;
  poly = poly * f + 4.1665795894e-2f;
  poly = poly * f + 1.6666665459e-1f;
  poly = poly * f + 5.0000001201e-1f;
  const float y = poly * f * f + f + 1.0f;
  const std::uint32_t scale = static_cast<std::uint32_t>(static_cast<std::int32_t>(n))
                              << kMantissaBits;  // n * 2^23 modulo 2^32: adds n to the exponent
  const float result = f32_from_bits(f32_bits(y) + scale);
  return x >= kExpMinArg ? result : (x < kExpMinArg ? 0.0f : x);
}

// ---- problem description -----------------------------------------------------------------------

struct Strided {
  const char* data = nullptr;  // element (0, ...) of the view
  i64 s0 = 0, s1 = 0, s2 = 0;  // element strides of the outer axes (the last is unit)
};

struct Problem {
  DType dtype = DType::f32;
  std::size_t elem = 4;
  i64 batch = 0, num_qo_heads = 0, num_kv_heads = 0, group = 0, q_len = 0, head_dim = 0;
  Strided q, k, v;  // q [B, Hq, Sq, D]; k, v [B, Hkv, capacity, D]
  float scale = 1.0f;
  bool causal = true;
  bool has_softcap = false;
  float softcap = 0.0f;
  std::vector<float> slopes;    // [Hq] ALiBi slopes, empty without ALiBi
  std::vector<i64> kv_len;      // [B] live prefix per sequence
  std::vector<i64> lo, hi;      // [B, Sq] visible key interval of each query row (stage 1)
  std::vector<i64> u_lo, u_hi;  // [B] union of the rows' intervals
  i64 num_splits = 1;
  i64 rows = 0;   // G * Sq rows per task
  int lanes = 1;  // W of the blocked kernels: a power of two <= kMaxLanes dividing head_dim
  // Partial results, [B, Hkv, S, rows] (+ [D] for acc).
  std::vector<float> part_m, part_l, part_acc;

  const char* q_row(i64 b, i64 h, i64 i) const {
    return q.data + static_cast<i64>(elem) * (b * q.s0 + h * q.s1 + i * q.s2);
  }
  const char* k_row(i64 b, i64 c, i64 j) const {
    return k.data + static_cast<i64>(elem) * (b * k.s0 + c * k.s1 + j * k.s2);
  }
  const char* v_row(i64 b, i64 c, i64 j) const {
    return v.data + static_cast<i64>(elem) * (b * v.s0 + c * v.s1 + j * v.s2);
  }
  void split_range(i64 b, i64 s, i64& begin, i64& end) const {
    const i64 span = u_hi[b] - u_lo[b];
    const i64 chunk = (span + num_splits - 1) / num_splits;
    begin = std::min(u_hi[b], u_lo[b] + s * chunk);
    end = std::min(u_hi[b], begin + chunk);
  }
};

// Scratch of one pool chunk (a range of tasks run by one thread).
struct Scratch {
  std::vector<float> qf, kf, vf, scores;  // [rows, D], [tile, D], [tile, D], [rows, tile]
  std::vector<unsigned char> needed;      // [tile]
  std::vector<int> key_row;               // [tile] the kf row each score slot reads
  void resize(i64 rows, i64 head_dim) {
    qf.resize(static_cast<std::size_t>(rows * head_dim));
    kf.resize(static_cast<std::size_t>(kKeyTile * head_dim));
    vf.resize(static_cast<std::size_t>(kKeyTile * head_dim));
    scores.resize(static_cast<std::size_t>(rows * kKeyTile));
    needed.resize(static_cast<std::size_t>(kKeyTile));
    key_row.resize(static_cast<std::size_t>(kKeyTile));
  }
};

// ---- stages 3-5: one (batch, kv head, split) task ----------------------------------------------

template <int W>
SPLICE_FD_INLINE void run_task_lanes(const Problem& pb, i64 b, i64 c, i64 s, Scratch& scratch,
                                     float* __restrict m, float* __restrict l,
                                     float* __restrict acc) {
  const i64 D = pb.head_dim, Sq = pb.q_len, G = pb.group, R = pb.rows;
  for (i64 r = 0; r < R; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  std::fill(acc, acc + R * D, 0.0f);
  i64 begin, end;
  pb.split_range(b, s, begin, end);
  if (begin >= end) return;

  float* __restrict qf = scratch.qf.data();
  float* __restrict kf = scratch.kf.data();
  float* __restrict vf = scratch.vf.data();
  float* __restrict scores = scratch.scores.data();
  unsigned char* needed = scratch.needed.data();
  int* key_row = scratch.key_row.data();
  const i64* row_lo = pb.lo.data() + b * Sq;
  const i64* row_hi = pb.hi.data() + b * Sq;
  const i64 pos0 = pb.kv_len[b] - Sq;  // p_i = pos0 + i

  for (i64 g = 0; g < G; ++g)
    for (i64 i = 0; i < Sq; ++i)
      load_row(pb.q_row(b, c * G + g, i), pb.dtype, D, qf + (g * Sq + i) * D);

  NextTilePrefetch task_prefetch;  // the task's strides; each tile sets where and how many rows
  task_prefetch.k_stride = pb.k.s2 * static_cast<i64>(pb.elem);
  task_prefetch.v_stride = pb.v.s2 * static_cast<i64>(pb.elem);
  task_prefetch.row_bytes = D * static_cast<i64>(pb.elem);

  for (i64 t0 = begin; t0 < end; t0 += kKeyTile) {
    const i64 t1 = std::min(end, t0 + kKeyTile);
    // Stage 4: mark and convert the key rows some query row sees (each exactly once).
    std::fill(needed, needed + (t1 - t0), static_cast<unsigned char>(0));
    for (i64 i = 0; i < Sq; ++i)
      for (i64 j = std::max(t0, row_lo[i]); j < std::min(t1, row_hi[i]); ++j) needed[j - t0] = 1;
    for (i64 j = t0; j < t1; ++j)
      if (needed[j - t0]) load_row(pb.k_row(b, c, j), pb.dtype, D, kf + (j - t0) * D);

    // Stage 4: q_r . k_j for every row and every key of the tile; a key no row sees reads the
    // first seen key instead (its score is never read), and a tile no row sees is skipped.
    const i64 n = t1 - t0;
    const i64 first_seen = std::find(needed, needed + n, 1) - needed;
    if (first_seen == n) continue;
    for (i64 t = 0; t < kKeyTile; ++t)
      key_row[t] = static_cast<int>(t < n && needed[t] ? t : first_seen);
    NextTilePrefetch next = task_prefetch;
    if (t1 < end) {
      next.k = pb.k_row(b, c, t1);
      next.v = pb.v_row(b, c, t1);
      next.rows = std::min(end, t1 + kKeyTile) - t1;
    }
    score_tile<W>(qf, kf, key_row, R, D, n, pb.scale, scores, next);

    // Stages 4-5: scores, tile max, rescale, probabilities (stored over the scores).
    for (i64 g = 0; g < G; ++g) {
      const i64 h = c * G + g;
      const float slope = pb.slopes.empty() ? 0.0f : pb.slopes[h];
      for (i64 i = 0; i < Sq; ++i) {
        const i64 r = g * Sq + i;
        const i64 a = std::max(t0, row_lo[i]) - t0, e = std::min(t1, row_hi[i]) - t0;
        if (a >= e) continue;
        float* __restrict sr = scores + r * kKeyTile;  // sr[j - t0] for j in [t0, t1)
        if (pb.has_softcap)
          for (i64 t = a; t < e; ++t) sr[t] = pb.softcap * std::tanh(sr[t] / pb.softcap);
        if (!pb.slopes.empty()) {
          const i64 distance0 = pos0 + i - t0;  // p_i - j = distance0 - t
          for (i64 t = a; t < e; ++t) sr[t] += -slope * static_cast<float>(distance0 - t);
        }
        // The tile max in vector lanes (GCC keeps a float max reduction serial): a NaN score is
        // passed over, as std::max(m, s) passes it.
        Vec<kSumLanes> maxes = kNegInf - Vec<kSumLanes>{};
        i64 tm = a;
        for (; tm + kSumLanes <= e; tm += kSumLanes) {
          const Vec<kSumLanes> v = load_vec<kSumLanes>(sr + tm);
          maxes = v > maxes ? v : maxes;
        }
        float tile_max = kNegInf;
        for (int u = 0; u < kSumLanes; ++u) tile_max = std::max(tile_max, maxes[u]);
        for (; tm < e; ++tm) tile_max = std::max(tile_max, sr[tm]);
        const float m_new = std::max(m[r], tile_max);
        if (m_new == kNegInf) {  // every visible score is -inf: all probabilities are 0
          for (i64 t = a; t < e; ++t) sr[t] = 0.0f;
          continue;
        }
        const float alpha = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first visible tile
        if (alpha != 1.0f) {
          float* __restrict ar = acc + r * D;
          for (i64 d = 0; d < D; ++d) ar[d] *= alpha;
          l[r] *= alpha;
        }
        for (i64 t = a; t < e; ++t) sr[t] = exp_nonpositive(sr[t] - m_new);
        float sums[kSumLanes] = {};
        i64 t = a;
        for (; t + kSumLanes <= e; t += kSumLanes)
          for (i64 u = 0; u < kSumLanes; ++u) sums[u] += sr[t + u];
        for (; t < e; ++t) sums[0] += sr[t];
        float sum = 0.0f;
        for (i64 u = 0; u < kSumLanes; ++u) sum += sums[u];
        l[r] += sum;
        m[r] = m_new;
      }
    }

    // Stage 5: acc_r += p_rj * v_j, each V row converted once for the whole group; rows r, r + 1,
    // ... with the same visible keys in this tile (every row when Sq = 1) share the V loads.
    for (i64 j = t0; j < t1; ++j)
      if (needed[j - t0]) load_row(pb.v_row(b, c, j), pb.dtype, D, vf + (j - t0) * D);
    const auto visible = [&](i64 r) {  // row r's keys in this tile, as tile offsets [a, e)
      const i64 i = r % Sq;
      return std::pair<i64, i64>{std::max(t0, row_lo[i]) - t0, std::min(t1, row_hi[i]) - t0};
    };
    for (i64 r = 0; r < R;) {
      const auto [a, e] = visible(r);
      i64 block = 1;
      while (block < 4 && r + block < R && visible(r + block) == std::pair<i64, i64>{a, e}) ++block;
      if (a < e) {
        const float* p = scores + r * kKeyTile;
        float* ar = acc + r * D;
        if (block == 4) {
          add_values<W, 4>(p, vf, a, e, D, ar, next);
        } else if (block >= 2) {
          block = 2;
          add_values<W, 2>(p, vf, a, e, D, ar, next);
        } else {
          add_values<W, 1>(p, vf, a, e, D, ar, next);
        }
      }
      r += block;
    }
  }
}

// The task at pb.lanes: each clone holds every width (tests force them), the CPU's own runs.
SPLICE_FD_CLONES
void run_task(const Problem& pb, i64 b, i64 c, i64 s, Scratch& scratch, float* m, float* l,
              float* acc) {
  switch (pb.lanes) {
    case 16:
      return run_task_lanes<16>(pb, b, c, s, scratch, m, l, acc);
    case 8:
      return run_task_lanes<8>(pb, b, c, s, scratch, m, l, acc);
    case 4:
      return run_task_lanes<4>(pb, b, c, s, scratch, m, l, acc);
    case 2:
      return run_task_lanes<2>(pb, b, c, s, scratch, m, l, acc);
    default:
      return run_task_lanes<1>(pb, b, c, s, scratch, m, l, acc);
  }
}

// ---- output stores -----------------------------------------------------------------------------

void store_row(const float* src, DType dtype, i64 n, char* dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::bf16: {
      auto* d = reinterpret_cast<std::uint16_t*>(dst);
      for (i64 x = 0; x < n; ++x) d[x] = f32_to_bf16_bits(src[x]);
      return;
    }
    default: {
      auto* d = reinterpret_cast<std::uint16_t*>(dst);
      for (i64 x = 0; x < n; ++x) d[x] = f32_to_f16_bits(src[x]);
      return;
    }
  }
}

// set_flash_decode_lanes_for_testing's width; 0: the CPU's.
std::atomic<int> g_forced_lanes{0};

// The widest vector of floats the CPU runs natively (the run_task clone the loader picked).
int native_lanes() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v4")) return 16;
  if (__builtin_cpu_supports("x86-64-v3")) return 8;
#endif
  return 4;
}

// The blocked kernels' W for head_dim: the CPU's (or the forced) width, halved until it divides D.
int lanes_for(i64 head_dim) {
  static const int native = native_lanes();
  const int forced = g_forced_lanes.load(std::memory_order_relaxed);
  int w = forced > 0 ? forced : native;
  while (w > 1 && head_dim % w != 0) w /= 2;
  return w;
}

Strided strided_of(const Tensor& t) {
  Strided s;
  s.data = static_cast<const char*>(t.raw_data());
  s.s0 = t.stride(0);
  s.s1 = t.stride(1);
  s.s2 = t.stride(2);
  return s;
}

}  // namespace

void flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                  const Tensor* alibi, const DecodeAttentionOptions& options, Tensor& out,
                  Tensor* lse) {
  Problem pb;
  pb.dtype = q.dtype();
  pb.elem = dtype_size(pb.dtype);
  pb.batch = q.size(0);
  pb.num_qo_heads = q.size(1);
  pb.q_len = q.size(2);
  pb.head_dim = q.size(3);
  pb.num_kv_heads = k.size(1);
  SPLICE_INTERNAL_CHECK(pb.num_kv_heads > 0 && pb.num_qo_heads % pb.num_kv_heads == 0,
                        "flash_decode: Hq ", pb.num_qo_heads, " Hkv ", pb.num_kv_heads);
  SPLICE_INTERNAL_CHECK(
      q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && out.stride(3) == 1,
      "flash_decode: last axes must be unit stride");
  pb.group = pb.num_qo_heads / pb.num_kv_heads;
  pb.rows = pb.group * pb.q_len;
  pb.lanes = lanes_for(pb.head_dim);
  pb.q = strided_of(q);
  pb.k = strided_of(k);
  pb.v = strided_of(v);
  pb.scale = options.softmax_scale != 0.0f ? options.softmax_scale
                                           : 1.0f / std::sqrt(static_cast<float>(pb.head_dim));
  pb.causal = options.causal;
  pb.has_softcap = options.softcap.has_value();
  pb.softcap = options.softcap.value_or(0.0f);
  if (alibi) {
    pb.slopes.resize(static_cast<std::size_t>(pb.num_qo_heads));
    const float* slope_data = alibi->data<float>();
    for (i64 h = 0; h < pb.num_qo_heads; ++h) pb.slopes[h] = slope_data[h * alibi->stride(0)];
  }

  // Stage 1: per-row visible intervals and their union per sequence.
  const i64 B = pb.batch, Sq = pb.q_len, Hkv = pb.num_kv_heads, D = pb.head_dim;
  const std::int32_t* len_data = k_len.data<std::int32_t>();
  const i64 len_stride = k_len.stride(0);
  pb.kv_len.resize(B);
  pb.lo.resize(B * Sq);
  pb.hi.resize(B * Sq);
  pb.u_lo.assign(B, 0);
  pb.u_hi.assign(B, 0);
  i64 max_span = 0;
  for (i64 b = 0; b < B; ++b) {
    const i64 len = len_data[(k_len.size(0) == 1 ? 0 : b) * len_stride];
    SPLICE_INTERNAL_CHECK(len >= 0 && len <= k.size(2), "flash_decode: k_len ", len);
    pb.kv_len[b] = len;
    i64 u_lo = std::numeric_limits<i64>::max(), u_hi = std::numeric_limits<i64>::min();
    for (i64 i = 0; i < Sq; ++i) {
      const i64 p = len - Sq + i;
      i64 lo = 0, hi = len;
      if (pb.causal) hi = std::min(hi, p + 1);
      if (options.window_left) lo = std::max(lo, p - *options.window_left);
      if (options.window_right) hi = std::min(hi, p + *options.window_right + 1);
      if (hi < lo) hi = lo;
      pb.lo[b * Sq + i] = lo;
      pb.hi[b * Sq + i] = hi;
      if (hi > lo) {
        u_lo = std::min(u_lo, lo);
        u_hi = std::max(u_hi, hi);
      }
    }
    if (u_hi > u_lo) {
      pb.u_lo[b] = u_lo;
      pb.u_hi[b] = u_hi;
      max_span = std::max(max_span, u_hi - u_lo);
    }
  }

  // Stage 2: split planning.
  const i64 heads = B * Hkv;
  const i64 work = heads * pb.rows * max_span * D;
  const bool serial = work < kSerialWorkLimit;
  const i64 workers = serial ? 1 : num_threads();
  if (options.num_splits > 0) {
    pb.num_splits = std::min(options.num_splits, std::max<i64>(1, max_span));
  } else {
    const i64 wanted = (kTasksPerThread * workers + heads - 1) / heads;
    const i64 longest = std::max<i64>(1, max_span / kMinKeysPerSplit);
    pb.num_splits = std::max<i64>(1, std::min(wanted, longest));
  }
  const i64 S = pb.num_splits, R = pb.rows;
  pb.part_m.resize(static_cast<std::size_t>(heads * S * R));
  pb.part_l.resize(static_cast<std::size_t>(heads * S * R));
  pb.part_acc.resize(static_cast<std::size_t>(heads * S * R * D));

  // Stages 3-5 over tasks (b, c, s), contiguous task ranges per pool thread.
  const i64 num_tasks = heads * S;
  auto run_tasks = [&](i64 first, i64 last) {
    Scratch scratch;
    scratch.resize(R, D);
    for (i64 task = first; task < last; ++task) {
      const i64 bc = task / S, s = task % S;
      const i64 slot = task * R;  // [B, Hkv, S, rows] flattened
      run_task(pb, bc / Hkv, bc % Hkv, s, scratch, pb.part_m.data() + slot, pb.part_l.data() + slot,
               pb.part_acc.data() + slot * D);
    }
  };
  if (serial) {
    run_tasks(0, num_tasks);
  } else {
    parallel_for(0, num_tasks, 1, run_tasks);
  }

  // Stage 6: merge the splits of every row and store o (and lse).
  char* out_data = static_cast<char*>(out.raw_data());
  const i64 out_elem = static_cast<i64>(dtype_size(out.dtype()));
  float* lse_data = lse ? lse->data<float>() : nullptr;
  auto merge = [&](i64 bc) {
    const i64 b = bc / Hkv, c = bc % Hkv;
    std::vector<float> o(static_cast<std::size_t>(D));
    for (i64 r = 0; r < R; ++r) {
      const i64 g = r / Sq, i = r % Sq, h = c * pb.group + g;
      float big_m = kNegInf;
      for (i64 s = 0; s < S; ++s) big_m = std::max(big_m, pb.part_m[(bc * S + s) * R + r]);
      std::fill(o.begin(), o.end(), 0.0f);
      float big_l = 0.0f;
      if (big_m != kNegInf) {
        for (i64 s = 0; s < S; ++s) {
          const i64 slot = (bc * S + s) * R + r;
          if (pb.part_m[slot] == kNegInf) continue;
          const float w = std::exp(pb.part_m[slot] - big_m);
          big_l += w * pb.part_l[slot];
          const float* a = pb.part_acc.data() + slot * D;
          for (i64 d = 0; d < D; ++d) o[d] += w * a[d];
        }
        const float inv_l = 1.0f / big_l;
        for (i64 d = 0; d < D; ++d) o[d] *= inv_l;
      }
      store_row(o.data(), out.dtype(), D,
                out_data + out_elem * (b * out.stride(0) + h * out.stride(1) + i * out.stride(2)));
      if (lse_data)
        lse_data[b * lse->stride(0) + h * lse->stride(1) + i * lse->stride(2)] =
            big_m == kNegInf ? kNegInf : big_m + std::log(big_l);
    }
  };
  // The merge touches S * rows * D floats per head: cheap, but split over the pool when large.
  if (serial) {
    for (i64 bc = 0; bc < heads; ++bc) merge(bc);
  } else {
    parallel_for(0, heads, 1, [&](i64 first, i64 last) {
      for (i64 bc = first; bc < last; ++bc) merge(bc);
    });
  }
}

void set_flash_decode_lanes_for_testing(int lanes) {
  SPLICE_INTERNAL_CHECK(lanes == 0 || (lanes <= kMaxLanes && (lanes & (lanes - 1)) == 0),
                        "flash_decode lanes ", lanes);
  g_forced_lanes.store(lanes, std::memory_order_relaxed);
}

}  // namespace splice::cpu
