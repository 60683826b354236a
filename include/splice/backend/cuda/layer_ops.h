// splice/backend/cuda/layer_ops.h: CUDA launchers of the fused layer ops (RmsNorm, SiluMul, Rope,
// RmsNormMatMul, SiluMulMatMulAdd, RmsNormMatMulSwiglu; ir/op.h; MatMulAdd is cuda::matmul's
// residual epilogue), checked against the CPU kernels (backend/cpu/layer_ops.h) in tests/cuda.
//
// The semantics, argument rules and typed errors are the CPU kernels'; the differences:
//   - every launch goes to cuda::current_stream() and returns without synchronizing; rope reads
//     its position from device memory, so every call can be captured in a CUDA graph and replayed
//     with new positions;
//   - a position outside [0, max_seq_len) cannot be reported without a read-back: those rows are
//     written as zeros (the caller validates positions on the host);
//   - rms_norm sums x^2 in a different order (a CTA per row), so it agrees with the CPU within
//     default_tolerance(out dtype); silu_mul and rope do the CPU's exact fp32 operations (no
//     fused multiply-add) and differ from it only through expf (silu_mul).
#pragma once

#include "splice/core/tensor.h"

namespace splice::cuda {

// out = x * rsqrt(mean(x^2, -1) + eps) * weight; x, out [..., H] (any float dtypes), weight [H].
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// out = round(round(silu(a)) * b); a, b, out of one shape and dtype.
void silu_mul(const Tensor& a, const Tensor& b, Tensor& out);
// Rotate-half RoPE of x [..., D] at position[0] ([1] i32 in device memory); cos, sin
// [max_seq_len, D]; out has x's shape and dtype.
void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
          Tensor& out);

// out = round_w(rms_norm(x, weight, eps)) @ w^T: x [..., M, K], weight [K], w [N, K], out
// [..., M, N] (any float dtypes; unit last strides for x and w). Routing: when x and w share a
// dtype, all M rows (leading axes flattened) number at most gemv::kMaxRows with
// gemv::preferred(rows, N, K) (matmul's own GEMV rule) and the rows fit the prologue's shared
// memory (gemv::prologue_fits), ONE launch of the GEMV with the rms_norm prologue (gemv.h);
// otherwise the two-kernel chain rms_norm into scratch of w's dtype, then cuda::matmul
// (numerically the same definition; docs/decisions.md). `w_constant`: MatmulOptions::b_constant.
void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w, Tensor& out,
                     bool w_constant = false);
// out = round(round(round(silu(a)) * b) @ w^T + c): a, b [..., M, K] (one dtype, unit last
// stride), w [N, K] (a's dtype), c, out [..., M, N] (c may be out itself). The GEMV with the
// silu_mul prologue and the residual epilogue under the same routing rule, else silu_mul into
// scratch then cuda::matmul with the residual.
void silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                         Tensor& out, bool w_constant = false);
// out[..., j] = round_T(round_T(silu(y[..., j])) * y[..., I + j]) with y = round_T(rms_norm_matmul(
// x, weight, eps, w)): x [..., M, K], weight [K], w [2I, K] (gate rows, then up rows; unit stride
// along K), out [..., M, I] (T its dtype). SwiGLU's activation in the gate|up GEMV's epilogue: ONE
// launch of gemv.h's swiglu epilogue kernel when gemv::swiglu_supported (x, w, the norm weight
// and out of one 16-bit dtype, 16-byte aligned; K in whole 16-byte vectors: one row that launch()
// covers in one batch at n = 2I, bitwise rms_norm_matmul into a [..., M, 2I] temporary then
// silu_mul of its halves; or 2-8 rows on norm_rows_kernel, within the op's tolerance), where the
// routing rule takes the product or, at 2-8 rows, norm_rows_kernel streams it in one resident
// wave (the alternative is three launches, not one GEMV); otherwise exactly those two launches.
void rms_norm_matmul_swiglu(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                            Tensor& out, bool w_constant = false);

// The largest K the one-launch route takes: every CTA of the GEMV recomputes the prologue over
// the whole row, which paid at K = 576 and 1536 (1.08-1.40x the two-kernel chain on the H200)
// and lost at K = 4096 and 14336 (0.83-0.92x; docs/perf.md run 13).
inline constexpr std::int64_t kPrologueGemvMaxK = 2048;

// Whether rms_norm_matmul / silu_mul_matmul_add take the one-launch GEMV route for an operand
// x (or a) [..., M, K], weight w [N, K] (the routing rule above, and K <= kPrologueGemvMaxK;
// tests and benches ask it).
bool prologue_gemv_applies(const Tensor& x, const Tensor& w);

// rms_norm_matmul's one-launch route stops at this many rows unless gemv::norm_rows_supported
// (the lean multi-row kernel: 16-bit, K <= 768). In a decode step each kernel runs
// with its code cold: cold, gemv_kernel's 8-row rms_norm instance (~127 KB of SASS) took 6.43 us
// against rms_norm + the plain GEMV's 5.02, though warm it wins (3.22 / 3.66), and the step with
// it was 10-12% slower at B = 6 and 8 (docs/perf.md runs 338-343).
inline constexpr std::int64_t kRmsNormPrologueMaxRows = 4;

}  // namespace splice::cuda
