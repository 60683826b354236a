// splice/backend/cuda/rope_kv_append.h: the CUDA launcher of Op::RopeKvAppend (a fused layer op of
// ops/layer_ops.h; the CPU kernel, its oracle, is cpu::rope_kv_append in backend/cpu/layer_ops.h),
// and the kernel's index math as plain constexpr C++ (rope_kv_append_index), which the kernel
// calls (--expt-relaxed-constexpr) and a CPU-only build emulates (tests/kernels).
// The launch goes to cuda::current_stream() and returns without synchronizing.
#pragma once

#include <cstdint>

#include "splice/core/tensor.h"

namespace splice::cuda {

// The attention prologue of one token in ONE launch (cpu::rope_kv_append's contract; p =
// position[0] read from device memory, so a captured graph replays it per token): qkv
// [B, 1, (Hq + 2 Hkv) D] (unit-stride row) read as q, k, v heads; out [B, Hq, 1, D] = rope(q);
// k_cache[:, :, p] = rope(k), v_cache[:, :, p] = v (caches [B, Hkv, capacity, D], unit last
// stride). A p outside [0, min(max_seq_len, capacity)) writes zeros to out and leaves the caches.
// `position_stable`: the caller's promise that no kernel the stream may still be running (under
// PDL, the kernels before this launch may not have completed) writes `position`, `cos` or `sin`:
// a Session's step scalar (written by its host copy before the step's first kernel, by nothing
// inside the step) and constant tables. The kernel then reads p and its table rows before
// waiting for its producers, so only the q|k|v row's round trip follows the wait. A false
// promise is a silent race; false (the default) assumes nothing.
// `trigger_dependents_first`: every CTA triggers its dependents (griddepcontrol.launch_dependents)
// as its first instruction instead of after its wait, so the next kernel launches while this one
// still waits for its producers. Correctness never depends on it (the dependent still waits for
// this grid's completion); it pays where the next kernel has work before its own wait (flash
// decode under the stable-prefix promise, NodeHints::trigger_dependents_first).
void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out, bool position_stable = false,
                    bool trigger_dependents_first = false);

// Launch counters (process-wide, relaxed atomics) for tests: launches issued, and those that read
// the position before the wait (position_stable).
struct RopeKvAppendLaunches {
  std::uint64_t launches = 0, early_position = 0, early_trigger = 0;
};
RopeKvAppendLaunches rope_kv_append_launches();

// rms_norm_matmul then rope_kv_append in ONE launch (cpu::rms_norm_matmul_rope_kv_append's
// contract; Op::RmsNormMatMulRopeKvAppend): x [B, 1, K], norm_weight [K], w [N, K] with N =
// (Hq + 2 Hkv) D; the q|k|v rows round(round(rms_norm(x)) @ w^T) live only in registers (the
// register-prologue GEMV of gemv_kernel.cuh with the "rope pairs" column mapping, gemv.h's
// RopeParams), then out [B, Hq, 1, D] = rope(q heads), k_cache[:, :, p] = rope(k heads),
// v_cache[:, :, p] = v heads (caches [B, Hkv, capacity, D]) at p = position[0] read on the device;
// a p outside [0, min(max_seq_len, capacity)) writes zeros to out and leaves the caches (as
// rope_kv_append). Takes: B <= kQkvRopeMaxBatch; x, norm_weight, w, out and the caches of one
// dtype, bf16 or f16; K a multiple of kQkvRopeKMultiple and at most kQkvRopeMaxK; unit strides
// along K and D; x, norm_weight and every w row 16-byte aligned (else UnsupportedError /
// LayoutError; every check runs before the launch, so a rejected call leaves the caches
// untouched). B = 1: bitwise rms_norm_matmul followed by rope_kv_append where that GEMV takes its
// register prologue in a one-batch instance (K <= 768, or K <= 1536 with N small enough for <= 2
// columns per warp: gemv.h's launch_rope); elsewhere the normalized row may round one ulp apart
// (the sum of x^2 in another order). B = 2-8: one launch of the multi-row kernel where it takes
// the product (K <= 768, 16-byte aligned x rows; within the op's tolerance of the chain, whose
// GEMV sums with other columns per warp), else exactly that chain (two launches).
// `w_constant` as for rms_norm_matmul (weights streamed before the wait), `position_stable` and
// `trigger_dependents_first` as for rope_kv_append (the trigger only when the grid is one wave).
inline constexpr std::int64_t kQkvRopeMaxK = 2048;
inline constexpr std::int64_t kQkvRopeMaxBatch = 8;   // gemv::kMaxRows
inline constexpr std::int64_t kQkvRopeKMultiple = 8;  // whole 16-byte vectors of 16-bit elements
void rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                    const Tensor& w, const Tensor& cos, const Tensor& sin,
                                    const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                    Tensor& out, bool w_constant = false,
                                    bool position_stable = false,
                                    bool trigger_dependents_first = false);

// Launch counters of rms_norm_matmul_rope_kv_append (like RopeKvAppendLaunches): launches, those
// that read the position before the wait, those that stream the weights before it, and those
// with the early-trigger hint.
struct QkvRopeLaunches {
  std::uint64_t launches = 0, early_position = 0, early_weights = 0, early_trigger = 0;
};
QkvRopeLaunches rms_norm_matmul_rope_kv_append_launches();

namespace rope_kv_append_index {

// Element strides of the kernel's operands (every last stride is 1; the launcher checks it).
struct Geometry {
  long long batch = 0, heads = 0, kv_heads = 0, dim = 0;  // B, Hq, Hkv, D
  long long qkv_stride0 = 0;                              // qkv [B, 1, (Hq + 2 Hkv) D]
  long long out_stride0 = 0, out_stride1 = 0;             // out [B, Hq, 1, D]
  long long k_stride[3] = {}, v_stride[3] = {};  // caches [B, Hkv, capacity, D]: batch, head, row
};

// Where a work item writes: out, k_cache row p (both rotated), v_cache row p (a copy).
enum class Target : int { q, k, v };

// Work item t handles the pair (i, i + D/2) of head h of batch row b, t = (b (Hq + 2 Hkv) + h)
// D/2 + i: it reads x = qkv + src (x_i, x_{i + D/2}) and writes y = <target> + dst (y_i,
// y_{i + D/2}), both offsets in elements from the operand's first element.
struct Item {
  Target target = Target::q;
  long long src = 0, dst = 0, i = 0;
};

constexpr long long items(const Geometry& g) {
  return g.batch * (g.heads + 2 * g.kv_heads) * (g.dim / 2);
}

// Item t at cache row `row` (the position; 0 when the position is invalid and no cache is written).
constexpr Item item(const Geometry& g, long long t, long long row) {
  const long long half = g.dim / 2, all_heads = g.heads + 2 * g.kv_heads;
  const long long i = t % half, h = (t / half) % all_heads, b = t / (half * all_heads);
  const long long src = b * g.qkv_stride0 + h * g.dim;
  if (h < g.heads) return {Target::q, src, b * g.out_stride0 + h * g.out_stride1, i};
  if (h < g.heads + g.kv_heads)
    return {Target::k, src, b * g.k_stride[0] + (h - g.heads) * g.k_stride[1] + row * g.k_stride[2],
            i};
  return {Target::v, src,
          b * g.v_stride[0] + (h - g.heads - g.kv_heads) * g.v_stride[1] + row * g.v_stride[2], i};
}

// The geometry of operands whose shapes the caller checked (cuda::rope_kv_append does).
inline Geometry geometry_of(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& out) {
  Geometry g;
  g.batch = qkv.size(0);
  g.kv_heads = k_cache.size(1);
  g.dim = k_cache.size(3);
  g.heads = g.dim > 0 ? qkv.size(2) / g.dim - 2 * g.kv_heads : 0;
  g.qkv_stride0 = qkv.stride(0);
  g.out_stride0 = out.stride(0);
  g.out_stride1 = out.stride(1);
  for (int d = 0; d < 3; ++d) {
    g.k_stride[d] = k_cache.stride(d);
    g.v_stride[d] = v_cache.stride(d);
  }
  return g;
}

}  // namespace rope_kv_append_index
}  // namespace splice::cuda
