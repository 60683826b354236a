// CPU kernels of the fused layer ops (see splice/backend/cpu/layer_ops.h).
//
// Each kernel:
//   1. validates devices, dtypes, shapes and the unit last stride before writing anything;
//   2. lists the element offset of every row (the leading axes walked in row-major order with
//      their own strides, so permuted views need no copy);
//   3. splits the rows over the thread pool (each row has one owner, so results do not depend
//      on the thread count) and per row loads the operands into fp32 buffers, computes, and
//      stores with one RNE rounding into out's dtype:
//        rms_norm:  s = sum_j x_j^2 (8 interleaved lanes, pairwise total: the reduce kernel's
//                   order),  inv = 1 / sqrt(s / H + eps),  y_j = (x_j * inv) * w_j
//        silu_mul:  t = round(a / (1 + e^-a)),  y = t * b
//        rope:      y_i = x_i c_i + (-x_{i+h}) s_i,  y_{i+h} = x_{i+h} c_{i+h} + x_i s_{i+h}
//        matmul_add: y_j = (sum_k a_k b_jk) + c_j, the sum in fp32 over 8 interleaved lanes
//                   (pairwise total), b converted to fp32 once per call; the work is split
//                   over (row, column) pairs so one decode row still uses every thread
//        rms_norm_matmul:     t = round_w(rms_norm(x)) into a temporary, then cpu::matmul(t, w^T)
//        silu_mul_matmul_add: t = silu_mul(a, b) into a temporary, then the region's matmul
//                   into fp32 (no rounding) and one elementwise c + product rounded into out
//                   (compositions of existing kernels, so bitwise those chains; the region
//                   differs only by its rounding of the product before the add)
//        rms_norm_matmul_rope_kv_append: rms_norm_matmul into a [B, 1, N] q|k|v temporary of
//                   the caches' dtype, then rope_kv_append (a composition: bitwise that chain)
//        rms_norm_matmul_swiglu: rms_norm_matmul into a [..., M, 2I] gate|up temporary of
//                   out's dtype, then silu_mul of its two halves (a composition: bitwise that
//                   chain)
#include "splice/backend/cpu/layer_ops.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/parallel.h"
#include "backend/layer_op_checks.h"
#include "splice/backend/cpu/primitives.h"

namespace splice::cpu {
namespace {

using detail::Operand;

constexpr int kLanes = 8;  // the reduce kernel's interleaved partial sums (reduce.cc)

using layer_op_checks::check_float;
using layer_op_checks::check_rows;

// Element offsets (relative to the view's first element) of every row of the last axis.
std::vector<std::int64_t> row_offsets(const Tensor& t) {
  const std::int64_t lead = t.dim() - 1;
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d < lead; ++d) rows *= t.size(d);
  std::vector<std::int64_t> out(static_cast<std::size_t>(rows));
  Dims index(static_cast<std::size_t>(lead), 0);
  std::int64_t offset = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    out[static_cast<std::size_t>(r)] = offset;
    for (std::int64_t d = lead - 1; d >= 0; --d) {
      ++index[d];
      offset += t.stride(d);
      if (index[d] < t.size(d)) break;
      offset -= index[d] * t.stride(d);
      index[d] = 0;
    }
  }
  return out;
}

// Rows per parallel chunk: about kParallelGrain elements.
std::int64_t row_grain(std::int64_t row_length) {
  return std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(row_length, 1));
}

float lane_sum_of_squares(const float* x, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * x[i + l];
  for (; i < n; ++i) acc[i % kLanes] += x[i] * x[i];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  return acc[0];
}

float lane_dot(const float* a, const float* b, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) acc[i % kLanes] += a[i] * b[i];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  return acc[0];
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  detail::check_cpu(x, "x");
  detail::check_cpu(weight, "weight");
  detail::check_cpu(out, "out");
  layer_op_checks::check_rms_norm(x, weight, eps, out, kOp);
  const std::int64_t hidden = x.size(-1);
  std::vector<float> w(static_cast<std::size_t>(hidden));
  detail::load_tile<float>(Operand(weight), 0, weight.stride(0), hidden, w.data());
  const auto x_rows = row_offsets(x), out_rows = row_offsets(out);
  const Operand xo(x), oo(out);
  const float count = static_cast<float>(hidden);
  parallel_for(0, static_cast<std::int64_t>(x_rows.size()), row_grain(hidden),
               [&](std::int64_t begin, std::int64_t end) {
                 std::vector<float> row(static_cast<std::size_t>(hidden));
                 for (std::int64_t r = begin; r < end; ++r) {
                   detail::load_tile<float>(xo, x_rows[r], 1, hidden, row.data());
                   const float mean = lane_sum_of_squares(row.data(), hidden) / count;
                   const float inv = 1.0f / std::sqrt(mean + eps);
                   for (std::int64_t j = 0; j < hidden; ++j) row[j] = (row[j] * inv) * w[j];
                   detail::store_tile<float>(oo, out_rows[r], 1, hidden, row.data());
                 }
               });
}

void silu_mul(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* kOp = "silu_mul";
  detail::check_cpu(a, "a");
  detail::check_cpu(b, "b");
  detail::check_cpu(out, "out");
  layer_op_checks::check_silu_mul(a, b, out, kOp);
  const std::int64_t n = a.size(-1);
  const auto a_rows = row_offsets(a), b_rows = row_offsets(b), out_rows = row_offsets(out);
  const Operand ao(a), bo(b), oo(out);
  const DType dt = out.dtype();
  parallel_for(0, static_cast<std::int64_t>(a_rows.size()), row_grain(n),
               [&](std::int64_t begin, std::int64_t end) {
                 std::vector<float> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
                 for (std::int64_t r = begin; r < end; ++r) {
                   detail::load_tile<float>(ao, a_rows[r], 1, n, x.data());
                   detail::load_tile<float>(bo, b_rows[r], 1, n, y.data());
                   // silu(a) as the primitive Silu computes it, then its store's rounding into
                   // the node's dtype (a loop per dtype, so each one vectorizes), then the Mul.
                   for (std::int64_t j = 0; j < n; ++j) x[j] = x[j] / (1.0f + std::exp(-x[j]));
                   if (dt == DType::bf16) {
                     for (std::int64_t j = 0; j < n; ++j) x[j] = round_to(DType::bf16, x[j]);
                   } else if (dt == DType::f16) {
                     for (std::int64_t j = 0; j < n; ++j) x[j] = round_to(DType::f16, x[j]);
                   }
                   for (std::int64_t j = 0; j < n; ++j) y[j] = x[j] * y[j];
                   detail::store_tile<float>(oo, out_rows[r], 1, n, y.data());
                 }
               });
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
          Tensor& out) {
  constexpr const char* kOp = "rope";
  detail::check_cpu(x, "x");
  detail::check_cpu(cos, "cos");
  detail::check_cpu(sin, "sin");
  detail::check_cpu(position, "position");
  detail::check_cpu(out, "out");
  layer_op_checks::check_rope(x, cos, sin, position, out, kOp);
  const std::int64_t dim = x.size(-1);
  const std::int64_t p = position.data<std::int32_t>()[0];
  if (p < 0 || p >= cos.size(0))
    fail<ValueError>(kOp, ": `position` ", p, " is outside the tables' [0, ", cos.size(0), ")");
  const std::int64_t half = dim / 2;
  std::vector<float> c(static_cast<std::size_t>(dim)), s(static_cast<std::size_t>(dim));
  detail::load_tile<float>(Operand(cos), p * cos.stride(0), cos.stride(1), dim, c.data());
  detail::load_tile<float>(Operand(sin), p * sin.stride(0), sin.stride(1), dim, s.data());
  const auto x_rows = row_offsets(x), out_rows = row_offsets(out);
  const Operand xo(x), oo(out);
  parallel_for(0, static_cast<std::int64_t>(x_rows.size()), row_grain(dim),
               [&](std::int64_t begin, std::int64_t end) {
                 std::vector<float> v(static_cast<std::size_t>(dim)),
                     y(static_cast<std::size_t>(dim));
                 for (std::int64_t r = begin; r < end; ++r) {
                   detail::load_tile<float>(xo, x_rows[r], 1, dim, v.data());
                   for (std::int64_t i = 0; i < half; ++i) {
                     const float lo = v[i] * c[i], lo_rot = -v[i + half] * s[i];
                     const float hi = v[i + half] * c[i + half], hi_rot = v[i] * s[i + half];
                     y[i] = lo + lo_rot;
                     y[i + half] = hi + hi_rot;
                   }
                   detail::store_tile<float>(oo, out_rows[r], 1, dim, y.data());
                 }
               });
}

void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out) {
  constexpr const char* kOp = "rope_kv_append";
  detail::check_cpu(qkv, "qkv");
  detail::check_cpu(position, "position");
  detail::check_cpu(k_cache, "k_cache");
  detail::check_cpu(v_cache, "v_cache");
  detail::check_cpu(out, "out");
  detail::check_cpu(cos, "cos");
  detail::check_cpu(sin, "sin");
  const auto [heads, kv_heads, dim] =
      layer_op_checks::check_rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out, kOp);
  const std::int64_t batch = qkv.size(0), capacity = k_cache.size(2);
  const std::int64_t p = position.data<std::int32_t>()[0];
  if (p < 0 || p >= capacity)
    fail<ValueError>(kOp, ": `position` ", p, " is outside the caches' [0, ", capacity, ")");
  // [B, n, 1, D] head views of qkv starting at head `first`.
  auto heads_view = [&](std::int64_t first, std::int64_t n) {
    return Tensor::view_of(qkv.storage(), qkv.offset() + first * dim, {batch, n, 1, dim},
                           {qkv.stride(0), dim, dim, 1}, qkv.dtype());
  };
  // 1. Rotate k into a temporary, q into out (cpu::rope validates the tables and p first).
  Tensor k_rot = Tensor::empty({batch, kv_heads, 1, dim}, qkv.dtype());  // [B, Hkv, 1, D]
  rope(heads_view(heads, kv_heads), cos, sin, position, k_rot);
  rope(heads_view(0, heads), cos, sin, position, out);
  // 2. The appends: exact copies, like write_at.
  Tensor k_row = k_cache.slice(2, p, p + 1), v_row = v_cache.slice(2, p, p + 1);
  k_row.copy_from(k_rot);
  v_row.copy_from(heads_view(heads + kv_heads, kv_heads));
}

void matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  constexpr const char* kOp = "matmul_add";
  detail::check_cpu(a, "a");
  detail::check_cpu(b, "b");
  detail::check_cpu(c, "c");
  detail::check_cpu(out, "out");
  layer_op_checks::check_matmul_add(a, b, c, out, kOp);
  const std::int64_t k = a.size(-1), n = b.size(0);
  // [n, k] in fp32
  std::vector<float> w(static_cast<std::size_t>(n * k));
  const Operand bo(b);
  for (std::int64_t j = 0; j < n; ++j)
    detail::load_tile<float>(bo, j * b.stride(0), 1, k, w.data() + j * k);
  const auto a_rows = row_offsets(a), c_rows = row_offsets(c), out_rows = row_offsets(out);
  const Operand ao(a), co(c), oo(out);
  const std::int64_t rows = static_cast<std::int64_t>(a_rows.size());
  // [rows, k] and [rows, n] in fp32: every row's a and c read once before any store (out may be
  // c itself). c may have any strides: a bias broadcast over rows (stride 0) or along them.
  std::vector<float> x(static_cast<std::size_t>(rows * k)), y(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::load_tile<float>(ao, a_rows[r], 1, k, x.data() + r * k);
    detail::load_tile<float>(co, c_rows[r], c.stride(-1), n, y.data() + r * n);
  }
  parallel_for(0, rows * n, row_grain(k), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t r = i / n, j = i % n;
      y[i] = lane_dot(x.data() + r * k, w.data() + j * k, k) + y[i];
    }
  });
  for (std::int64_t r = 0; r < rows; ++r)
    detail::store_tile<float>(oo, out_rows[r], 1, n, y.data() + r * n);
}

void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                     Tensor& out) {
  constexpr const char* kOp = "rms_norm_matmul";
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&x, "x"},
                                {&weight, "weight"},
                                {&w, "w"},
                                {&out, "out"}})
    detail::check_cpu(*t, name);
  layer_op_checks::check_rms_norm_matmul(x, weight, eps, w, out, kOp);
  // [..., M, K] in w's dtype: the RmsNorm node's output in the region.
  Tensor normalized = Tensor::empty(x.shape(), w.dtype());
  rms_norm(x, weight, eps, normalized);
  matmul(normalized, w, out, /*transpose_b=*/true);
}

void rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                    const Tensor& w, const Tensor& cos, const Tensor& sin,
                                    const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                    Tensor& out) {
  constexpr const char* kOp = "rms_norm_matmul_rope_kv_append";
  const std::pair<const Tensor*, const char*> operands[] = {{&x, "x"},
                                                            {&norm_weight, "norm_weight"},
                                                            {&w, "w"},
                                                            {&cos, "cos"},
                                                            {&sin, "sin"},
                                                            {&position, "position"},
                                                            {&k_cache, "k_cache"},
                                                            {&v_cache, "v_cache"},
                                                            {&out, "out"}};
  for (const auto& [t, name] : operands) detail::check_cpu(*t, name);
  layer_op_checks::check_qkv_rope(x, norm_weight, eps, w, cos, sin, position, k_cache, v_cache, out,
                                  kOp);
  const std::int64_t p = position.data<std::int32_t>()[0];
  const std::int64_t rows = std::min(k_cache.size(2), cos.size(0));
  if (p < 0 || p >= rows)
    fail<ValueError>(kOp, ": `position` ", p, " is outside [0, ", rows,
                     ") (the caches' capacity and the tables' rows)");
  // [B, 1, N]: the q|k|v row, rounded to the caches' dtype like the RmsNormMatMul node's output.
  Tensor qkv = Tensor::empty({x.size(0), 1, w.size(0)}, k_cache.dtype());
  rms_norm_matmul(x, norm_weight, eps, w, qkv);
  rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out);
}

void rms_norm_matmul_swiglu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                            Tensor& out) {
  constexpr const char* kOp = "rms_norm_matmul_swiglu";
  const std::pair<const Tensor*, const char*> operands[] = {
      {&x, "x"}, {&norm_weight, "norm_weight"}, {&w, "w"}, {&out, "out"}};
  for (const auto& [t, name] : operands) detail::check_cpu(*t, name);
  const std::int64_t inter = layer_op_checks::check_swiglu(x, norm_weight, eps, w, out, kOp);
  // [..., M, 2I]: the gate|up row, rounded to out's dtype like the RmsNormMatMul node's output.
  Dims y_shape = x.shape();
  y_shape.back() = 2 * inter;
  Tensor y = Tensor::empty(y_shape, out.dtype());
  rms_norm_matmul(x, norm_weight, eps, w, y);
  const std::int64_t last = y.dim() - 1;
  silu_mul(y.slice(last, 0, inter), y.slice(last, inter, 2 * inter), out);
}

void silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                         Tensor& out) {
  constexpr const char* kOp = "silu_mul_matmul_add";
  const std::pair<const Tensor*, const char*> operands[] = {
      {&a, "a"}, {&b, "b"}, {&w, "w"}, {&c, "c"}, {&out, "out"}};
  for (const auto& [t, name] : operands) detail::check_cpu(*t, name);
  layer_op_checks::check_silu_mul_matmul_add(a, b, w, c, out, kOp);
  // [..., M, K] in a's dtype: the SiluMul node's output in the region.
  Tensor act = Tensor::empty(a.shape(), a.dtype());
  silu_mul(a, b, act);
  // The region's MatMul kernel, its fp32 sum kept unrounded, then c added in fp32 and rounded
  // once (the elementwise add reads each element of c before writing it: out may be c).
  Tensor product = Tensor::empty(out.shape(), DType::f32);  // [..., M, N]
  matmul(act, w, product, /*transpose_b=*/true);
  binary(BinaryKind::add, c, product, out);
}

}  // namespace splice::cpu
