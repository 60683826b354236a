// Host-side argument checks shared by the CPU and CUDA layer-op kernels (RMSNorm, SiluMul, RoPE,
// MatMulAdd and the prologue products): one wording of each typed error, so both backends reject
// bad input the same way.
#pragma once

#include <cmath>

#include "splice/core/error.h"
#include "splice/core/tensor.h"

namespace splice::layer_op_checks {

// `t` holds a floating dtype (DTypeError otherwise).
inline void check_float(const Tensor& t, const char* op, const char* name) {
  if (!is_floating(t.dtype()))
    fail<DTypeError>(op, ": `", name, "` must be f32, f16 or bf16, got ", dtype_name(t.dtype()));
}

// `t` is rows of its last axis: rank >= 1 and a unit stride on that axis (the kernels read rows
// as contiguous vectors; leading axes may have any strides).
inline void check_rows(const Tensor& t, const char* op, const char* name) {
  if (t.dim() < 1) fail<ShapeError>(op, ": `", name, "` must have rank >= 1, got a scalar");
  if (t.size(-1) > 1 && t.stride(-1) != 1)
    fail<LayoutError>(op, ": `", name, "` must have a unit stride on its last axis, got strides ",
                      dims_str(t.strides()), " for shape ", dims_str(t.shape()));
}

// RMSNorm's weight is one vector over x's last axis (ShapeError otherwise).
inline void check_norm_weight(const Tensor& x, const Tensor& weight, const char* op) {
  const std::int64_t hidden = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != hidden)
    fail<ShapeError>(op, ": `weight` must be [", hidden, "] for x ", dims_str(x.shape()), ", got ",
                     dims_str(weight.shape()));
}

// RMSNorm's epsilon is finite and >= 0 (ValueError otherwise).
inline void check_eps(float eps, const char* op) {
  if (!std::isfinite(eps) || eps < 0)
    fail<ValueError>(op, ": `eps` must be finite and >= 0, got ", eps);
}

}  // namespace splice::layer_op_checks
