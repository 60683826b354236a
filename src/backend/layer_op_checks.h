// Host-side argument checks shared by the CPU and CUDA layer-op kernels: one function per op
// (check_rms_norm, check_silu_mul, check_rope, check_matmul_add, check_rms_norm_matmul,
// check_silu_mul_matmul_add, check_swiglu, check_rope_kv_append, check_qkv_rope) holding its
// dtype, shape, layout and aliasing rules with one wording of each typed error, so both backends
// refuse bad input the same way before anything is written. Devices are each backend's own check
// (before these); what a kernel reads on the device (a position's value on CUDA) is not here.
// tests/kernels/layer_ops_validation_tables.h runs every rule on both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

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

// Aliasing (every check_<op> below ends with its op's rule, splice::check_output_aliasing): an
// expanded `out` would have threads race on one address, a cache passed as both k_cache and
// v_cache would end up holding v, an out inside a cache would be overwritten by the append, a
// cache over x would change what later rows read. In place: only the identical view of an input
// the op reads elementwise (rms_norm's x, silu_mul's a and b, rope's x, the residual c).

// RoPE's position is one i32 value [1] (DTypeError for another dtype, ShapeError for another
// shape).
inline void check_position(const Tensor& position, const char* op) {
  if (position.dtype() != DType::i32)
    fail<DTypeError>(op, ": `position` must be i32, got ", position.describe());
  if (position.shape() != Dims{1})
    fail<ShapeError>(op, ": `position` must be [1], got ", position.describe());
}

// An output's shape (ShapeError naming `name`, the shape expected and seen).
inline void check_shape(const Tensor& t, const Dims& expected, const char* op, const char* name) {
  if (t.shape() != expected)
    fail<ShapeError>(op, ": `", name, "` must have shape ", dims_str(expected), ", got ",
                     dims_str(t.shape()));
}

// The operands of rms_norm, on either backend (devices are the caller's): x and out [..., H] rows
// of one shape (unit last stride), weight [H], all float (any mix), eps finite and >= 0; the
// aliasing rule.
inline void check_rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out,
                           const char* op) {
  check_float(x, op, "x");
  check_float(weight, op, "weight");
  check_float(out, op, "out");
  check_rows(x, op, "x");
  check_rows(out, op, "out");
  check_norm_weight(x, weight, op);
  check_shape(out, x.shape(), op, "out");
  check_eps(eps, op);
  check_output_aliasing({{out, "out"}}, {{x, "x", true}, {weight, "weight"}}, op);
}

// The operands of silu_mul, on either backend: a, b and out [..., N] rows of one shape and one
// float dtype; the aliasing rule.
inline void check_silu_mul(const Tensor& a, const Tensor& b, const Tensor& out, const char* op) {
  check_float(a, op, "a");
  check_float(b, op, "b");
  check_float(out, op, "out");
  check_rows(a, op, "a");
  check_rows(b, op, "b");
  check_rows(out, op, "out");
  if (b.shape() != a.shape())
    fail<ShapeError>(op, ": `a` ", dims_str(a.shape()), " and `b` ", dims_str(b.shape()),
                     " must have one shape");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&b, "b"}, {&out, "out"}})
    if (t->dtype() != a.dtype())
      fail<DTypeError>(op, ": `", name, "` must have a's dtype ", dtype_name(a.dtype()), ", got ",
                       dtype_name(t->dtype()));
  check_shape(out, a.shape(), op, "out");
  check_output_aliasing({{out, "out"}}, {{a, "a", true}, {b, "b", true}}, op);
}

// The operands of rope, on either backend: x and out [..., D] rows of one shape and float dtype, D
// even; cos, sin [max_seq_len, D] of one float dtype and layout; position i32 [1] (its value is
// the backend's: the CPU reads it, CUDA reads it on the device); the aliasing rule.
inline void check_rope(const Tensor& x, const Tensor& cos, const Tensor& sin,
                       const Tensor& position, const Tensor& out, const char* op) {
  check_float(x, op, "x");
  check_float(cos, op, "cos");
  check_float(sin, op, "sin");
  check_float(out, op, "out");
  check_rows(x, op, "x");
  check_rows(out, op, "out");
  const std::int64_t dim = x.size(-1);
  if (dim % 2 != 0) fail<ShapeError>(op, ": the last axis of `x` must be even, got ", dim);
  if (cos.dim() != 2 || cos.size(1) != dim || sin.shape() != cos.shape() ||
      sin.strides() != cos.strides())
    fail<ShapeError>(op, ": `cos` and `sin` must both be [max_seq_len, ", dim,
                     "] of one layout, got ", cos.describe(), " and ", sin.describe());
  if (sin.dtype() != cos.dtype())
    fail<DTypeError>(op, ": `sin` must have cos's dtype ", dtype_name(cos.dtype()), ", got ",
                     dtype_name(sin.dtype()));
  check_position(position, op);
  check_shape(out, x.shape(), op, "out");
  if (out.dtype() != x.dtype())
    fail<DTypeError>(op, ": `out` must have x's dtype ", dtype_name(x.dtype()), ", got ",
                     dtype_name(out.dtype()));
  check_output_aliasing({{out, "out"}},
                        {{x, "x", true}, {cos, "cos"}, {sin, "sin"}, {position, "position"}}, op);
}

// a [..., M, K] rows and w [N, K] with a unit stride along K (`x_name` names a): the product's
// operands of rms_norm_matmul and silu_mul_matmul_add. Returns the product's shape [..., M, N].
inline Dims check_product_operands(const Tensor& a, const char* x_name, const Tensor& w,
                                   const char* op) {
  check_rows(a, op, x_name);
  if (a.dim() < 2 || w.dim() != 2 || w.size(1) != a.size(-1))
    fail<ShapeError>(op, ": `", x_name, "` must be [..., M, K] and `w` [N, K], got ", x_name, " ",
                     dims_str(a.shape()), " and w ", dims_str(w.shape()));
  if (w.size(1) > 1 && w.stride(1) != 1)
    fail<LayoutError>(op, ": `w` must have a unit stride on its last axis, got strides ",
                      dims_str(w.strides()));
  Dims y_shape = a.shape();
  y_shape.back() = w.size(0);
  return y_shape;
}

// The operands of rms_norm_matmul, on either backend: x [..., M, K] rows, weight [K], w [N, K]
// (unit stride along K), out [..., M, N] rows, all float; eps finite and >= 0; the aliasing rule.
inline void check_rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                                  const Tensor& out, const char* op) {
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&x, "x"},
                                {&weight, "weight"},
                                {&w, "w"},
                                {&out, "out"}})
    check_float(*t, op, name);
  const Dims y_shape = check_product_operands(x, "x", w, op);
  check_rows(out, op, "out");
  check_shape(out, y_shape, op, "out");
  check_norm_weight(x, weight, op);
  check_eps(eps, op);
  check_output_aliasing({{out, "out"}}, {{x, "x"}, {weight, "weight"}, {w, "w"}}, op);
}

// The operands of silu_mul_matmul_add, on either backend: a, b [..., M, K] rows and w [N, K]
// (unit stride along K) of one float dtype, c and out [..., M, N] float (out rows); the aliasing
// rule (c may be out's identical view).
inline void check_silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w,
                                      const Tensor& c, const Tensor& out, const char* op) {
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&a, "a"},
                                {&b, "b"},
                                {&w, "w"},
                                {&c, "c"},
                                {&out, "out"}})
    check_float(*t, op, name);
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&b, "b"}, {&w, "w"}})
    if (t->dtype() != a.dtype())
      fail<DTypeError>(op, ": `", name, "` must have a's dtype ", dtype_name(a.dtype()), ", got ",
                       dtype_name(t->dtype()));
  const Dims y_shape = check_product_operands(a, "a", w, op);
  check_rows(b, op, "b");
  check_shape(b, a.shape(), op, "b");
  if (c.shape() != y_shape)
    fail<ShapeError>(op, ": `c` must have the product's shape ", dims_str(y_shape), ", got ",
                     dims_str(c.shape()));
  check_rows(out, op, "out");
  check_shape(out, y_shape, op, "out");
  check_output_aliasing({{out, "out"}}, {{a, "a"}, {b, "b"}, {w, "w"}, {c, "c", true}}, op);
}

// The operands of matmul_add, on either backend (devices are the caller's; the public op has
// broadcast c to the product's shape): a [..., M, K] rows (unit last stride), b [N, K] of a's
// dtype with a unit stride along K, c and out [..., M, N] (out rows), all float; the aliasing
// rule (c may be out's identical view).
inline void check_matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out,
                             const char* op) {
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&a, "a"}, {&b, "b"}, {&c, "c"}, {&out, "out"}})
    check_float(*t, op, name);
  check_rows(a, op, "a");
  check_rows(out, op, "out");
  if (b.dtype() != a.dtype())
    fail<DTypeError>(op, ": `b` must have a's dtype ", dtype_name(a.dtype()), ", got ",
                     dtype_name(b.dtype()));
  if (a.dim() < 2 || b.dim() != 2 || b.size(1) != a.size(-1))
    fail<ShapeError>(op, ": `a` must be [..., M, K] and `b` [N, K], got a ", dims_str(a.shape()),
                     " and b ", dims_str(b.shape()));
  if (b.size(1) > 1 && b.stride(1) != 1)
    fail<LayoutError>(op, ": `b` must have a unit stride on its last axis, got strides ",
                      dims_str(b.strides()));
  Dims y_shape = a.shape();
  y_shape.back() = b.size(0);
  if (c.shape() != y_shape)
    fail<ShapeError>(op, ": `c` must have the product's shape ", dims_str(y_shape), ", got ",
                     dims_str(c.shape()));
  if (out.shape() != y_shape)
    fail<ShapeError>(op, ": `out` must have the product's shape ", dims_str(y_shape), ", got ",
                     dims_str(out.shape()));
  check_output_aliasing({{out, "out"}}, {{a, "a"}, {b, "b"}, {c, "c", true}}, op);
}

// The operands of rope_kv_append, on either backend (devices are the caller's): qkv [B, 1, (Hq +
// 2 Hkv) D] (unit last stride); k_cache, v_cache [B, Hkv, capacity, D] (one shape, D even); out
// [B, Hq, 1, D]; the caches and out of qkv's dtype, each with a unit last stride; cos, sin
// [max_seq_len, D] (one float dtype and layout); position i32 [1]; and the aliasing rule. The
// position's value is the backend's (the CPU reads it; CUDA reads it on the device). Returns {Hq,
// Hkv, D}.
struct RopeGeometry {
  std::int64_t heads = 0, kv_heads = 0, dim = 0;
};
inline RopeGeometry check_rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                                         const Tensor& position, const Tensor& k_cache,
                                         const Tensor& v_cache, const Tensor& out, const char* op) {
  check_float(qkv, op, "qkv");
  if (qkv.dim() != 3 || qkv.size(1) != 1)
    fail<ShapeError>(op, ": `qkv` must be [B, 1, (Hq + 2 Hkv) D], got ", qkv.describe());
  check_rows(qkv, op, "qkv");
  const std::int64_t batch = qkv.size(0);
  if (k_cache.dim() != 4 || k_cache.size(0) != batch)
    fail<ShapeError>(op, ": `k_cache` must be [", batch, ", Hkv, capacity, D], got ",
                     k_cache.describe());
  RopeGeometry g;
  g.kv_heads = k_cache.size(1);
  g.dim = k_cache.size(3);
  if (g.dim % 2 != 0)
    fail<ShapeError>(op, ": `k_cache`'s head_dim D must be even (rotate-half RoPE), got ",
                     dims_str(k_cache.shape()));
  if (v_cache.shape() != k_cache.shape())
    fail<ShapeError>(op, ": `v_cache` must have k_cache's shape ", dims_str(k_cache.shape()),
                     ", got ", dims_str(v_cache.shape()));
  g.heads = g.dim > 0 ? qkv.size(2) / g.dim - 2 * g.kv_heads : 0;
  if (g.heads <= 0 || qkv.size(2) != (g.heads + 2 * g.kv_heads) * g.dim)
    fail<ShapeError>(op, ": `qkv` rows must hold (Hq + 2 * ", g.kv_heads, ") * ", g.dim,
                     " values with Hq >= 1 (the caches' Hkv and D), got qkv ",
                     dims_str(qkv.shape()));
  if (out.shape() != Dims{batch, g.heads, 1, g.dim})
    fail<ShapeError>(op, ": `out` must be [", batch, ", ", g.heads, ", 1, ", g.dim, "], got ",
                     dims_str(out.shape()));
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&k_cache, "k_cache"},
                                {&v_cache, "v_cache"},
                                {&out, "out"}}) {
    if (t->dtype() != qkv.dtype())
      fail<DTypeError>(op, ": `", name, "` must have qkv's dtype ", dtype_name(qkv.dtype()),
                       ", got ", dtype_name(t->dtype()));
    if (g.dim > 1 && t->stride(-1) != 1)
      fail<LayoutError>(op, ": `", name, "` must have a unit stride on its last axis, got strides ",
                        dims_str(t->strides()), " for shape ", dims_str(t->shape()));
  }
  check_float(cos, op, "cos");
  check_float(sin, op, "sin");
  if (cos.dim() != 2 || cos.size(1) != g.dim || sin.shape() != cos.shape() ||
      sin.strides() != cos.strides())
    fail<ShapeError>(op, ": `cos` and `sin` must both be [max_seq_len, ", g.dim,
                     "] of one layout, got ", cos.describe(), " and ", sin.describe());
  if (sin.dtype() != cos.dtype())
    fail<DTypeError>(op, ": `sin` must have cos's dtype ", dtype_name(cos.dtype()), ", got ",
                     dtype_name(sin.dtype()));
  check_position(position, op);
  check_output_aliasing({{k_cache, "k_cache"}, {v_cache, "v_cache"}, {out, "out"}},
                        {{qkv, "qkv"}, {cos, "cos"}, {sin, "sin"}, {position, "position"}}, op);
  return g;
}

// The operands of rms_norm_matmul_rope_kv_append, on either backend (devices are the caller's):
//   x [B, 1, K] (unit stride along K), norm_weight [K], w [N, K] (unit stride along K), N =
//   (Hq + 2 Hkv) D; k_cache, v_cache [B, Hkv, capacity, D] (one shape, unit last stride, D even);
//   out [B, Hq, 1, D] (unit last stride); cos, sin [max_seq_len, D] (one float dtype and layout);
//   position i32 [1]; x, norm_weight, w float; the caches and out of one float dtype. Everything is
//   checked before any kernel writes, so a rejected call leaves the caches untouched; the
//   aliasing rule too. Returns {Hq, Hkv, D}.
inline RopeGeometry check_qkv_rope(const Tensor& x, const Tensor& norm_weight, float eps,
                                   const Tensor& w, const Tensor& cos, const Tensor& sin,
                                   const Tensor& position, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& out, const char* op) {
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&x, "x"},
                                {&norm_weight, "norm_weight"},
                                {&w, "w"},
                                {&cos, "cos"},
                                {&sin, "sin"},
                                {&k_cache, "k_cache"},
                                {&v_cache, "v_cache"},
                                {&out, "out"}})
    check_float(*t, op, name);
  check_eps(eps, op);
  // A unit stride along the last axis of `t` (named `name`), a LayoutError naming its strides.
  const auto unit_last = [op](const Tensor& t, const char* name) {
    if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1)
      fail<LayoutError>(op, ": `", name,
                        "` must have a unit stride along its last axis, got "
                        "strides ",
                        dims_str(t.strides()), " for shape ", dims_str(t.shape()));
  };
  if (x.dim() != 3 || x.size(1) != 1)
    fail<ShapeError>(op, ": `x` must be [B, 1, K], got ", x.describe());
  unit_last(x, "x");
  const std::int64_t batch = x.size(0), k = x.size(2);
  if (norm_weight.dim() != 1 || norm_weight.size(0) != k)
    fail<ShapeError>(op, ": `norm_weight` must be [", k, "] for x ", dims_str(x.shape()), ", got ",
                     dims_str(norm_weight.shape()));
  if (w.dim() != 2 || w.size(1) != k)
    fail<ShapeError>(op, ": `w` must be [N, ", k, "], got ", w.describe());
  unit_last(w, "w");
  if (k_cache.dim() != 4 || k_cache.size(0) != batch)
    fail<ShapeError>(op, ": `k_cache` must be [", batch, ", Hkv, capacity, D], got ",
                     k_cache.describe());
  if (v_cache.shape() != k_cache.shape())
    fail<ShapeError>(op, ": `v_cache` must have k_cache's shape ", dims_str(k_cache.shape()),
                     ", got ", v_cache.describe());
  unit_last(k_cache, "k_cache");
  unit_last(v_cache, "v_cache");
  RopeGeometry g;
  g.kv_heads = k_cache.size(1);
  g.dim = k_cache.size(3);
  const std::int64_t n = w.size(0);
  g.heads = g.dim > 0 ? n / g.dim - 2 * g.kv_heads : 0;
  if (g.dim % 2 != 0)
    fail<ShapeError>(op, ": `k_cache`'s head_dim D must be even (rotate-half RoPE), got ",
                     dims_str(k_cache.shape()));
  if (g.heads <= 0 || n != (g.heads + 2 * g.kv_heads) * g.dim)
    fail<ShapeError>(op, ": `w` must have N = (Hq + 2 * ", g.kv_heads, ") * ", g.dim,
                     " rows with Hq >= 1 (the caches' Hkv and D), got N = ", n);
  if (out.shape() != Dims{batch, g.heads, 1, g.dim})
    fail<ShapeError>(op, ": `out` must be [", batch, ", ", g.heads, ", 1, ", g.dim, "], got ",
                     out.describe());
  unit_last(out, "out");
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&v_cache, "v_cache"}, {&out, "out"}})
    if (t->dtype() != k_cache.dtype())
      fail<DTypeError>(op, ": `", name, "` must have `k_cache`'s dtype ",
                       dtype_name(k_cache.dtype()), ", got ", dtype_name(t->dtype()));
  if (cos.dim() != 2 || cos.size(1) != g.dim || sin.shape() != cos.shape() ||
      sin.strides() != cos.strides())
    fail<ShapeError>(op, ": `cos` and `sin` must both be [max_seq_len, ", g.dim,
                     "] of one layout, got ", cos.describe(), " and ", sin.describe());
  if (sin.dtype() != cos.dtype())
    fail<DTypeError>(op, ": `cos` and `sin` must have one dtype, got ", dtype_name(cos.dtype()),
                     " and ", dtype_name(sin.dtype()));
  check_position(position, op);
  check_output_aliasing({{k_cache, "k_cache"}, {v_cache, "v_cache"}, {out, "out"}},
                        {{x, "x"},
                         {norm_weight, "norm_weight"},
                         {w, "w"},
                         {cos, "cos"},
                         {sin, "sin"},
                         {position, "position"}},
                        op);
  return g;
}

// The operands of rms_norm_matmul_swiglu, on either backend (devices are the caller's): x
// [..., M, K] (unit stride along K), norm_weight [K], w [2I, K] (unit stride along K; rows 0..I-1
// the gate, I..2I-1 the up projection), out [..., M, I] (x's leading shape, unit last stride);
// all float, eps finite and >= 0; the aliasing rule. Returns I.
inline std::int64_t check_swiglu(const Tensor& x, const Tensor& norm_weight, float eps,
                                 const Tensor& w, const Tensor& out, const char* op) {
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&x, "x"},
                                {&norm_weight, "norm_weight"},
                                {&w, "w"},
                                {&out, "out"}})
    check_float(*t, op, name);
  check_eps(eps, op);
  check_rows(x, op, "x");
  check_rows(out, op, "out");
  if (x.dim() < 2) fail<ShapeError>(op, ": `x` must be [..., M, K], got ", dims_str(x.shape()));
  const std::int64_t k = x.size(-1);
  if (norm_weight.dim() != 1 || norm_weight.size(0) != k)
    fail<ShapeError>(op, ": `norm_weight` must be [", k, "] for x ", dims_str(x.shape()), ", got ",
                     dims_str(norm_weight.shape()));
  if (w.dim() != 2 || w.size(1) != k || w.size(0) < 2 || w.size(0) % 2 != 0)
    fail<ShapeError>(op, ": `w` must be [2I, ", k, "] (gate rows, then up rows; I >= 1), got ",
                     w.describe());
  if (k > 1 && w.stride(1) != 1)
    fail<LayoutError>(op, ": `w` must have a unit stride along K, got strides ",
                      dims_str(w.strides()), " for shape ", dims_str(w.shape()));
  const std::int64_t inter = w.size(0) / 2;
  Dims out_shape = x.shape();
  out_shape.back() = inter;
  if (out.shape() != out_shape)
    fail<ShapeError>(op, ": `out` must be ", dims_str(out_shape), " (x's rows, I = ", inter,
                     " columns), got ", dims_str(out.shape()));
  check_output_aliasing({{out, "out"}}, {{x, "x"}, {norm_weight, "norm_weight"}, {w, "w"}}, op);
  return inter;
}

}  // namespace splice::layer_op_checks
