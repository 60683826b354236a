// splice/ops/layer_ops.h: the public fused layer ops (RmsNorm, SiluMul, Rope of ir/op.h) on any
// backend, and their kernel contract rows.
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

// out = round(a @ b^T + c): a [..., M, K], b [N, K] (a's dtype), c, out [..., M, N]; the fp32 sum
// plus c rounded once into out's dtype. `b_constant`: the caller's promise that no kernel in
// flight writes b (a model weight; cuda::MatmulOptions::b_constant), ignored on the CPU.
void fused_matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out,
                      bool b_constant = false);

// The contract rows of the layer-op kernels on each backend (kernel "layer_ops").
const LayerOpContract& cpu_layer_ops_contract();
const LayerOpContract& cuda_layer_ops_contract();

}  // namespace splice
