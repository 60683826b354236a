// CPU reductions: reduce (sum, max, mean over one axis, keepdim) and softmax.
//
// Both kernels see `in` as an outer space (in's shape with the reduced axis set to 1, walked by a
// coalesced strided loop together with `out`) times the reduced axis (length R, stride s_r).
//
// reduce, all fp32:
//   sum:  out = sum_r in[r]            mean: out = (sum_r in[r]) / R
//   max:  out = max_r in[r]            (NaN if any entry is NaN; R == 0 is an error)
//   1. Row strategy, when the reduced axis has in's smallest stride (the usual last-axis case):
//      each output element reduces its contiguous-ish row, tile by tile, into kLanes partial
//      accumulators (acc[i mod kLanes] += x_i) that are summed pairwise at the end.
//   2. Column strategy otherwise (e.g. reducing axis 0 of a row-major matrix): a tile of up to
//      kTile neighbouring outputs keeps one accumulator each and streams over r, so every load
//      walks in's fastest axis instead of striding by s_r per element.
//   3. The outer space is split over the pool, kParallelGrain input elements per chunk at least;
//      each output has one owner and one summation order, whatever the thread count.
//
// softmax over an axis of length L, per slice x (fp32):
//   m = max_i x_i;   if m == -inf: y = 0 (a fully masked row: no visible key)
//   else e_i = exp(x_i - m),  s = sum_i e_i,  y_i = e_i * (1 / s)
// The slice is staged into an fp32 row before anything is written, so `out` may be `in` itself.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/parallel.h"
#include "splice/backend/cpu/primitives.h"

namespace splice::cpu {
namespace {

using detail::kTile;
using detail::Loop;
using detail::make_loop;
using detail::Operand;

constexpr int kLanes = 8;  // independent partial accumulators: one AVX register of floats
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// Sum or max of n fp32 values in kLanes interleaved partials (vectorizable, stable order).
struct LaneAccumulator {
  bool is_max;
  float acc[kLanes];
  explicit LaneAccumulator(bool max) : is_max(max) { std::fill(acc, acc + kLanes, init()); }
  float init() const { return is_max ? kNegInf : 0.0f; }
  void add(const float* x, std::int64_t n) {
    std::int64_t i = 0;
    if (is_max) {
      for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] = nan_max(acc[l], x[i + l]);
      for (; i < n; ++i) acc[i % kLanes] = nan_max(acc[i % kLanes], x[i]);
    } else {
      for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l];
      for (; i < n; ++i) acc[i % kLanes] += x[i];
    }
  }
  float total() const {  // pairwise: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))
    float v[kLanes];
    std::copy(acc, acc + kLanes, v);
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l)
        v[l] = is_max ? nan_max(v[l], v[l + width]) : v[l] + v[l + width];
    return v[0];
  }
};

// The reduced axis as one strided vector: length and stride in elements.
struct Axis {
  std::int64_t length;
  std::int64_t stride;
};

// True when `axis` has in's smallest stride among its non-trivial axes (row strategy pays).
bool axis_is_fastest(const Tensor& in, std::int64_t axis) {
  const std::int64_t s = std::abs(in.strides()[axis]);
  for (std::int64_t d = 0; d < in.dim(); ++d)
    if (d != axis && in.shape()[d] > 1 && std::abs(in.strides()[d]) < s) return false;
  return true;
}

// in's outer space (axis set to 1) walked together with `out_kept` (out with the axis as 1).
Loop<2> outer_loop(const Tensor& in, const Tensor& out_kept, std::int64_t axis) {
  Dims outer = in.shape();
  outer[axis] = 1;
  return make_loop<2>(outer, {out_kept.strides(), in.strides()});
}

// out with the reduced axis present as size 1 (a view; strides of size-1 axes never matter).
Tensor kept_view(const Tensor& out, std::int64_t axis, bool keepdim) {
  if (keepdim) return out;
  Dims shape = out.shape(), strides = out.strides();
  shape.insert(shape.begin() + axis, 1);
  strides.insert(strides.begin() + axis, 0);
  return Tensor::view_of(out.storage(), out.offset(), shape, strides, out.dtype());
}

void reduce_rows(ReduceKind kind, const Loop<2>& loop, Axis r, const Operand& o, const Operand& x) {
  const std::int64_t so = loop.inner_stride(0), sx = loop.inner_stride(1);
  const std::int64_t grain =
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(r.length, 1));
  parallel_for(0, loop.numel, grain, [&](std::int64_t lo, std::int64_t hi) {
    float tile[kTile];
    loop.for_each_run(lo, hi, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t row = off[1] + j * sx;
        LaneAccumulator acc(kind == ReduceKind::max);
        for (std::int64_t t = 0; t < r.length; t += kTile) {
          const std::int64_t m = std::min(kTile, r.length - t);
          acc.add(detail::tile_in<float>(x, row + t * r.stride, r.stride, m, tile), m);
        }
        float value = acc.total();
        if (kind == ReduceKind::mean) value /= static_cast<float>(r.length);
        detail::store_tile<float>(o, off[0] + j * so, 1, 1, &value);
      }
    });
  });
}

void reduce_columns(ReduceKind kind, const Loop<2>& loop, Axis r, const Operand& o,
                    const Operand& x) {
  const std::int64_t so = loop.inner_stride(0), sx = loop.inner_stride(1);
  const bool is_max = kind == ReduceKind::max;
  const std::int64_t grain =
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(r.length, 1));
  parallel_for(0, loop.numel, grain, [&](std::int64_t lo, std::int64_t hi) {
    float acc[kTile], tile[kTile];
    loop.for_each_run(lo, hi, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
      for (std::int64_t t = 0; t < n; t += kTile) {
        const std::int64_t m = std::min(kTile, n - t);
        std::fill(acc, acc + m, is_max ? kNegInf : 0.0f);
        for (std::int64_t k = 0; k < r.length; ++k) {
          // acc_j = acc_j (+ or max) in[j, k]
          const float* v = detail::tile_in<float>(x, off[1] + t * sx + k * r.stride, sx, m, tile);
          if (is_max) {
            for (std::int64_t j = 0; j < m; ++j) acc[j] = nan_max(acc[j], v[j]);
          } else {
            for (std::int64_t j = 0; j < m; ++j) acc[j] += v[j];
          }
        }
        if (kind == ReduceKind::mean) {
          const float count = static_cast<float>(r.length);
          for (std::int64_t j = 0; j < m; ++j) acc[j] /= count;
        }
        detail::store_tile<float>(o, off[0] + t * so, so, m, acc);
      }
    });
  });
}

constexpr const char* kReduceNames[] = {"sum", "max", "mean"};

}  // namespace

void reduce(ReduceKind kind, const Tensor& in, std::int64_t axis, bool keepdim, Tensor& out) {
  detail::check_cpu(in, "in");
  detail::check_cpu(out, "out");
  check_dtype(in, "in", {DType::f32, DType::f16, DType::bf16});
  check_dtype(out, "out", {DType::f32, DType::f16, DType::bf16});
  const std::int64_t a = detail::wrap_axis(axis, in.dim(), "axis");
  Dims expected = in.shape();
  if (keepdim)
    expected[a] = 1;
  else
    expected.erase(expected.begin() + a);
  detail::check_out_shape_lazy(out, expected, [&] {
    return std::string(kReduceNames[static_cast<int>(kind)]) + " over axis " + std::to_string(a) +
           (keepdim ? " with keepdim" : "") + " of `in` " + dims_str(in.shape());
  });
  check_no_overlap(out, "out", in, "in", true);
  const Axis r{in.shape()[a], in.strides()[a]};
  if (r.length == 0 && kind == ReduceKind::max)
    fail<ShapeError>("`in` ", dims_str(in.shape()), " has size 0 on axis ", a,
                     ": max over an empty axis is undefined");
  const Tensor kept = kept_view(out, a, keepdim);
  const Loop<2> loop = outer_loop(in, kept, a);
  if (loop.numel == 0) return;
  const Operand o(out), x(in);
  if (axis_is_fastest(in, a) || loop.numel == 1)
    reduce_rows(kind, loop, r, o, x);
  else
    reduce_columns(kind, loop, r, o, x);
}

void softmax(const Tensor& in, std::int64_t axis, Tensor& out) {
  detail::check_cpu(in, "in");
  detail::check_cpu(out, "out");
  check_dtype(in, "in", {DType::f32, DType::f16, DType::bf16});
  check_dtype(out, "out", {DType::f32, DType::f16, DType::bf16});
  detail::check_out_shape(out, in.shape(), "the shape of `in`");
  check_no_overlap(out, "out", in, "in", true);
  const std::int64_t a = detail::wrap_axis(axis, in.dim(), "axis");
  const Axis r{in.shape()[a], in.strides()[a]};
  const std::int64_t out_stride = out.strides()[a];
  const Loop<2> loop = outer_loop(in, out, a);
  if (loop.numel == 0 || r.length == 0) return;
  const Operand o(out), x(in);
  const std::int64_t so = loop.inner_stride(0), sx = loop.inner_stride(1);
  const std::int64_t grain = std::max<std::int64_t>(1, kParallelGrain / r.length);
  parallel_for(0, loop.numel, grain, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> row(static_cast<std::size_t>(r.length));  // [L] the slice in fp32
    loop.for_each_run(lo, hi, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
      for (std::int64_t j = 0; j < n; ++j) {
        float* y = row.data();
        detail::load_tile<float>(x, off[1] + j * sx, r.stride, r.length, y);
        LaneAccumulator max_acc(true);
        max_acc.add(y, r.length);
        const float m = max_acc.total();
        if (m == kNegInf) {
          std::fill(y, y + r.length, 0.0f);
        } else {
          for (std::int64_t i = 0; i < r.length; ++i) y[i] = std::exp(y[i] - m);
          LaneAccumulator sum_acc(false);
          sum_acc.add(y, r.length);
          const float inv = 1.0f / sum_acc.total();
          for (std::int64_t i = 0; i < r.length; ++i) y[i] *= inv;
        }
        detail::store_tile<float>(o, off[0] + j * so, out_stride, r.length, y);
      }
    });
  });
}

}  // namespace splice::cpu
