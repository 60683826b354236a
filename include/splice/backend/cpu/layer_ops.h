// splice/backend/cpu/layer_ops.h: the CPU kernels of the fused layer ops (RmsNorm, SiluMul, Rope,
// MatMulAdd, RmsNormMatMul, SiluMulMatMulAdd; ir/op.h), the oracle the CUDA kernels are checked
// against.
//
// Every op works on rows of the last axis. Tensors are CPU tensors of any float dtype (f32, f16,
// bf16) whose last axis has unit stride; leading axes may have any strides (a permuted head view
// is fine). Math is fp32; every result rounds once (RNE) into out's dtype, except silu_mul, which
// rounds silu(a) to out's dtype first, exactly like the primitive Silu -> Mul region. The results
// are bitwise those of the primitive regions the model builders emit on this backend (same
// operations, same summation order: rms_norm sums x^2 in the reduce kernel's 8 interleaved lanes).
// Validation (devices, dtypes, shapes, layout, position range) happens before anything is written.
#pragma once

#include "splice/core/tensor.h"

namespace splice::cpu {

// out[r, :] = x[r, :] * inv_r * weight,  inv_r = 1 / sqrt(sum_j x[r, j]^2 / H + eps)
// x [..., H], weight [H], out [..., H] (out's dtype may differ from x's).
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);

// out = round(round(silu(a)) * b), silu(z) = z / (1 + e^-z); a, b, out of one shape.
void silu_mul(const Tensor& a, const Tensor& b, Tensor& out);

// Rotate-half RoPE at p = position[0] (position: [1] i32 on the CPU, 0 <= p < max_seq_len):
//   out[r, i]     = x[r, i] * cos[p, i]         - x[r, i + D/2] * sin[p, i]         (i < D/2)
//   out[r, i+D/2] = x[r, i+D/2] * cos[p, i+D/2] + x[r, i] * sin[p, i+D/2]
// x, out [..., D] (one dtype), cos, sin [max_seq_len, D] (float dtypes). Each product rounds to
// fp32 before the sum, as in the primitive region (no fused multiply-add).
void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
          Tensor& out);

// The attention prologue of one token at p = position[0] (qkv read as q, k, v heads):
//   out = rope(q);  k_cache[:, :, p] = rope(k);  v_cache[:, :, p] = v
// qkv [B, 1, (Hq + 2 Hkv) D] (unit stride along the row), caches [B, Hkv, capacity, D], out
// [B, Hq, 1, D], all of one dtype; rope exactly as cpu::rope (so bitwise the rope region plus two
// write_at). Everything is validated (0 <= p < min(capacity, max_seq_len)) before any write.
void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out);

// rms_norm_matmul then rope_kv_append (Op::RmsNormMatMulRopeKvAppend): x [B, 1, K], norm_weight
// [K], w [N, K] with N = (Hq + 2 Hkv) D; qkv = rms_norm_matmul(x, norm_weight, eps, w) into a
// [B, 1, N] temporary of the caches' dtype, then rope_kv_append(qkv, ...) into out [B, Hq, 1, D]
// and the caches [B, Hkv, capacity, D] at p = position[0]. The composition of the two kernels
// above, so bitwise the two-op chain; every operand and p (0 <= p < min(capacity, max_seq_len))
// is validated before any write.
void rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                    const Tensor& w, const Tensor& cos, const Tensor& sin,
                                    const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                    Tensor& out);

// rms_norm_matmul then silu_mul on the two halves (Op::RmsNormMatMulSwiglu): x [..., M, K],
// norm_weight [K], w [2I, K] (gate rows, then up rows); y = rms_norm_matmul(x, norm_weight, eps,
// w) into a [..., M, 2I] temporary of out's dtype, then out [..., M, I] = silu_mul(y[..., :I],
// y[..., I:]). The composition of the two kernels, so bitwise the decomposed chain; every operand
// is validated before either runs.
void rms_norm_matmul_swiglu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                            Tensor& out);

// out[..., m, j] = round((sum_k a[..., m, k] * b[j, k]) + c[..., m, j]): a [..., M, K], b [N, K]
// (unit stride along K), c and out [..., M, N] (any float dtypes); the sum in fp32, one rounding
// into out's dtype (the MatMul -> Add region rounds the product to its dtype first). out may be
// c itself (the identical view).
void matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out);

// out = round_w(rms_norm(x, weight, eps)) @ w^T: x [..., M, K], weight [K], w [N, K], out
// [..., M, N]. The composition of rms_norm into a [..., M, K] temporary of w's dtype and the
// primitive matmul (cpu::matmul), so bitwise the RmsNorm -> MatMul region the builders emit.
void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                     Tensor& out);

// out = round(round(round(silu(a)) * b) @ w^T + c): a, b [..., M, K] (one dtype), w [N, K],
// c, out [..., M, N]. The composition of silu_mul into a temporary of a's dtype, cpu::matmul into
// an fp32 temporary (the region's MatMul kernel without its rounding) and cpu::binary's add of c
// rounded once into out, so bitwise that chain (and the region's Silu -> Mul -> MatMul -> Add but
// for the product's rounding: within matmul_add's tolerance). out may be c itself (the
// identical view).
void silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                         Tensor& out);

}  // namespace splice::cpu
