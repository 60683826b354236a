// splice/backend/cuda/layer_ops.h: CUDA launchers of the fused layer ops (RmsNorm, SiluMul, Rope;
// ir/op.h), checked against the CPU kernels (backend/cpu/layer_ops.h) in tests/cuda.
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

}  // namespace splice::cuda
