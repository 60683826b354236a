// splice/ops/layer_ops.h: the public fused layer ops (RmsNorm, SiluMul, Rope, MatMulAdd,
// RmsNormMatMul, SiluMulMatMulAdd, RopeKvAppend, RmsNormMatMulRopeKvAppend, RmsNormMatMulSwiglu
// of ir/op.h) on any backend, and their kernel contract rows.
//
// Each entry point (1) checks that every tensor sits on x's (or a's) device and that the device's
// backend is compiled in, (2) checks the call against that backend's contract row (op, activation
// dtype, row length) with a typed error naming what is missing, and (3) dispatches to
// cpu::* (backend/cpu/layer_ops.h) or cuda::* (backend/cuda/layer_ops.h), which validate shapes,
// dtypes and layouts themselves. CUDA calls launch on cuda::current_stream() and never
// synchronize; rope reads its position from device memory, so a captured graph replays it with
// the position of each token.
#pragma once

#include "splice/core/tensor.h"
#include "splice/ops/contract.h"

namespace splice {

// out = x * rsqrt(mean(x^2, -1) + eps) * weight; x, out [..., H], weight [H].
void fused_rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// out = round(round(silu(a)) * b); a, b, out of one shape and dtype.
void fused_silu_mul(const Tensor& a, const Tensor& b, Tensor& out);
// Rotate-half RoPE of x [..., D] at position[0] ([1] i32 on x's device); cos, sin
// [max_seq_len, D].
void fused_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
                Tensor& out);

// RoPE of the q and k heads and the KV append (Op::RopeKvAppend) at p = position[0] ([1] i32 on
// qkv's device): qkv [B, 1, (Hq + 2 Hkv) D] read as q, k, v heads; out [B, Hq, 1, D] = rope(q);
// in place, k_cache[:, :, p] = rope(k), v_cache[:, :, p] = v (caches [B, Hkv, capacity, D] of
// qkv's dtype); cos, sin [max_seq_len, D]. Bitwise fused_rope plus two write_at.
// `position_stable`: the caller's promise that no kernel in flight writes position, cos or sin (a
// session's step scalar and constant tables; cuda::rope_kv_append), ignored on the CPU.
// `trigger_dependents_first`: a scheduling hint, never a change of results: the kernel lets the
// next kernel launch before it waits for its own producers (cuda::rope_kv_append), ignored on the
// CPU.
void fused_rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                          const Tensor& position, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                          bool position_stable = false, bool trigger_dependents_first = false);

// rms_norm_matmul then rope_kv_append in one op (Op::RmsNormMatMulRopeKvAppend): x [B, 1, K],
// norm_weight [K], w [N, K] with N = (Hq + 2 Hkv) D; the q|k|v row qkv = round_c(round_w(
// rms_norm(x)) @ w^T) (c the caches' dtype) is never stored: out [B, Hq, 1, D] = rope(q heads);
// in place, k_cache[:, :, p] = rope(k heads), v_cache[:, :, p] = v heads (caches [B, Hkv,
// capacity, D]) at p = position[0] ([1] i32 on x's device); cos, sin [max_seq_len, D]. Bitwise
// fused_rms_norm_matmul into a temporary then fused_rope_kv_append on the CPU; on CUDA one GEMV
// launch whose epilogue applies RoPE and writes the caches (cuda::rms_norm_matmul_rope_kv_append:
// bitwise the two CUDA kernels where the GEMV takes its register prologue, see there). The CUDA
// contract row's qkv_rope_* limits say which calls it takes (an UnsupportedError otherwise).
// `w_constant` as for fused_matmul_add, `position_stable` and `trigger_dependents_first` as for
// fused_rope_kv_append; all ignored on the CPU.
void fused_rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                          const Tensor& w, const Tensor& cos, const Tensor& sin,
                                          const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                          Tensor& out, bool w_constant = false,
                                          bool position_stable = false,
                                          bool trigger_dependents_first = false);

// out = round(a @ b^T + c): a [..., M, K], b [N, K] (a's dtype), out [..., M, N], c out's shape
// or one that broadcasts to it (a bias [N]); the fp32 sum plus c rounded once into out's dtype.
// `b_constant`: the caller's promise that no kernel in flight writes b (a model weight;
// cuda::MatmulOptions::b_constant), ignored on the CPU.
void fused_matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out,
                      bool b_constant = false);

// out = round_w(rms_norm(x, weight, eps)) @ w^T: x [..., M, K], weight [K], w [N, K], out
// [..., M, N]; the normalized row rounded to w's dtype, the product's fp32 sum rounded once.
// CUDA: one GEMV launch that normalizes its x rows into shared memory first (cuda layer_ops.h),
// or rms_norm then matmul where the GEMV does not apply. `w_constant` as for fused_matmul_add.
void fused_rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                           Tensor& out, bool w_constant = false);

// SwiGLU's activation of the gate|up product (Op::RmsNormMatMulSwiglu): x [..., M, K],
// norm_weight [K], w [2I, K] (gate rows, then up rows), out [..., M, I];
// y = round_T(round_w(rms_norm(x)) @ w^T) (T out's dtype), out[..., j] = round_T(round_T(silu(
// y[..., j])) * y[..., I + j]). Bitwise fused_rms_norm_matmul into a temporary then
// fused_silu_mul on its halves, on the CPU and on CUDA: there one GEMV launch whose epilogue
// applies the activation where the one-row GEMV applies, else those two kernels
// (cuda::rms_norm_matmul_swiglu). `w_constant` as for fused_matmul_add, ignored on the CPU.
void fused_rms_norm_matmul_swiglu(const Tensor& x, const Tensor& norm_weight, float eps,
                                  const Tensor& w, Tensor& out, bool w_constant = false);

// out = round(round(round(silu(a)) * b) @ w^T + c): a, b [..., M, K], w [N, K] (a's dtype),
// c, out [..., M, N]. CUDA: one GEMV launch with the activation computed into shared memory, or
// silu_mul then the residual matmul where the GEMV does not apply.
void fused_silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                               Tensor& out, bool w_constant = false);

// The contract rows of the layer-op kernels on each backend (kernel "layer_ops").
const LayerOpContract& cpu_layer_ops_contract();
const LayerOpContract& cuda_layer_ops_contract();

}  // namespace splice
