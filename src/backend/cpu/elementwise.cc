// CPU elementwise primitives: unary, binary, compare, where, iota, cast.
//
// Each kernel:
//   1. Validates devices, dtypes and shapes (out must have the broadcast shape of the inputs),
//      before writing anything.
//   2. Builds one coalesced strided loop over out and the inputs (kernel_util.h), inputs with
//      stride 0 on broadcast axes.
//   3. Splits the flat index range over the thread pool (kParallelGrain elements per chunk at
//      least) and processes each run in tiles: inputs load into compute-type arrays (f32 in place
//      for unit-stride f32), the op runs on the arrays, the tile stores back with conversion.
// Compute types: float math (fp32) whenever any operand is a float dtype; exact int64 math when
// all are integers; compare uses double for mixed int/float so int64 and f32 operands both compare
// exactly as long as the integers stay below 2^53.
// Aliasing: `out` may be the very same view as an input (in-place update); any other overlap
// between out and an input throws LayoutError (checked on byte ranges before anything runs).
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/parallel.h"
#include "splice/backend/cpu/primitives.h"

namespace splice::cpu {
namespace {

using detail::kTile;
using detail::Loop;
using detail::make_loop;
using detail::Operand;

constexpr float kSoftplusLinearAbove = 20.0f;  // softplus(z) == z to fp32 precision beyond this

// y = f(x) over n fp32 values.
void apply_unary(UnaryKind kind, const float* x, float* y, std::int64_t n) {
  switch (kind) {
    case UnaryKind::exp:  // y = e^x
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
      return;
    case UnaryKind::log:  // y = ln x (NaN for x < 0, -inf at 0)
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
      return;
    case UnaryKind::neg:
      for (std::int64_t i = 0; i < n; ++i) y[i] = -x[i];
      return;
    case UnaryKind::abs:
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::fabs(x[i]);
      return;
    case UnaryKind::sqrt:
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
      return;
    case UnaryKind::rsqrt:  // y = 1 / sqrt(x)
      for (std::int64_t i = 0; i < n; ++i) y[i] = 1.0f / std::sqrt(x[i]);
      return;
    case UnaryKind::reciprocal:  // y = 1 / x
      for (std::int64_t i = 0; i < n; ++i) y[i] = 1.0f / x[i];
      return;
    case UnaryKind::sigmoid:  // y = 1 / (1 + e^-x); e^-x overflows to inf for x << 0: y -> 0
      for (std::int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
      return;
    case UnaryKind::silu:  // y = x * sigmoid(x)
      for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
      return;
    case UnaryKind::softplus:  // y = x if x > 20 else log1p(e^x)
      for (std::int64_t i = 0; i < n; ++i)
        y[i] = x[i] > kSoftplusLinearAbove ? x[i] : std::log1p(std::exp(x[i]));
      return;
    case UnaryKind::tanh:
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
      return;
  }
  SPLICE_INTERNAL_CHECK(false, "unknown unary kind ", static_cast<int>(kind));
}

// NaN-propagating minimum / maximum (a NaN operand wins, as in torch.minimum).
inline float nan_min(float a, float b) { return (a < b || a != a) ? a : b; }
inline float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// y = a (op) b over n fp32 values.
void apply_binary(BinaryKind kind, const float* a, const float* b, float* y, std::int64_t n) {
  switch (kind) {
    case BinaryKind::add:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
      return;
    case BinaryKind::sub:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
      return;
    case BinaryKind::mul:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
      return;
    case BinaryKind::div:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
      return;
    case BinaryKind::minimum:
      for (std::int64_t i = 0; i < n; ++i) y[i] = nan_min(a[i], b[i]);
      return;
    case BinaryKind::maximum:
      for (std::int64_t i = 0; i < n; ++i) y[i] = nan_max(a[i], b[i]);
      return;
  }
  SPLICE_INTERNAL_CHECK(false, "unknown binary kind ", static_cast<int>(kind));
}

// y = a (op) b over n int64 values: add/sub/mul wrap modulo 2^64 (no UB), div truncates toward
// zero and reports a zero divisor through the return value (false).
bool apply_binary(BinaryKind kind, const std::int64_t* a, const std::int64_t* b, std::int64_t* y,
                  std::int64_t n) {
  using U = std::uint64_t;
  switch (kind) {
    case BinaryKind::add:
      for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int64_t>(U(a[i]) + U(b[i]));
      return true;
    case BinaryKind::sub:
      for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int64_t>(U(a[i]) - U(b[i]));
      return true;
    case BinaryKind::mul:
      for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int64_t>(U(a[i]) * U(b[i]));
      return true;
    case BinaryKind::div:
      for (std::int64_t i = 0; i < n; ++i) {
        if (b[i] == 0) return false;
        // INT64_MIN / -1 overflows: take the wrapped negation instead.
        y[i] = b[i] == -1 ? static_cast<std::int64_t>(U(0) - U(a[i])) : a[i] / b[i];
      }
      return true;
    case BinaryKind::minimum:
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::min(a[i], b[i]);
      return true;
    case BinaryKind::maximum:
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::max(a[i], b[i]);
      return true;
  }
  SPLICE_INTERNAL_CHECK(false, "unknown binary kind ", static_cast<int>(kind));
}

template <typename C>
void apply_compare(CompareKind kind, const C* a, const C* b, std::uint8_t* y, std::int64_t n) {
  switch (kind) {
    case CompareKind::less:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] < b[i];
      return;
    case CompareKind::less_equal:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] <= b[i];
      return;
    case CompareKind::greater:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] > b[i];
      return;
    case CompareKind::greater_equal:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] >= b[i];
      return;
    case CompareKind::equal:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] == b[i];
      return;
    case CompareKind::not_equal:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] != b[i];
      return;
  }
  SPLICE_INTERNAL_CHECK(false, "unknown compare kind ", static_cast<int>(kind));
}

// Checks out's shape against the broadcast of `inputs` and returns the loop over
// (out, inputs...).
template <int N>
Loop<N> broadcast_loop(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs,
                       const std::array<const char*, N - 1>& names) {
  std::vector<const Dims*> shapes;
  std::vector<const char*> name_list;
  for (int i = 0; i < N - 1; ++i) {
    detail::check_cpu(*inputs[i], names[i]);
    shapes.push_back(&inputs[i]->shape());
    name_list.push_back(names[i]);
  }
  detail::check_cpu(out, "out");
  for (int i = 0; i < N - 1; ++i) check_no_overlap(out, "out", *inputs[i], names[i], true);
  const Dims shape = detail::broadcast_shapes(shapes, name_list);
  detail::check_out_shape_lazy(out, shape, [&] {
    std::string why = "the broadcast of";
    for (int i = 0; i < N - 1; ++i)
      why += std::string(i ? ", `" : " `") + names[i] + "` " + dims_str(inputs[i]->shape());
    return why;
  });
  std::array<Dims, N> strides;
  strides[0] = out.strides();
  for (int i = 0; i < N - 1; ++i)
    strides[i + 1] = detail::broadcast_strides(*inputs[i], shape, names[i]);
  return make_loop<N>(shape, strides);
}

// Runs fn(offsets, count) over every run of `loop`, split over the pool.
template <int N, typename Fn>
void run_parallel(const Loop<N>& loop, Fn&& fn) {
  parallel_for(0, loop.numel, kParallelGrain,
               [&](std::int64_t lo, std::int64_t hi) { loop.for_each_run(lo, hi, fn); });
}

constexpr std::initializer_list<DType> kFloatTypes = {DType::f32, DType::f16, DType::bf16};
constexpr std::initializer_list<DType> kNumericTypes = {DType::f32, DType::f16, DType::bf16,
                                                        DType::i32, DType::i64};

template <typename C>
void binary_impl(BinaryKind kind, const Loop<3>& loop, const Tensor& a, const Tensor& b,
                 Tensor& out) {
  const Operand o(out), x(a), y(b);
  const std::int64_t so = loop.inner_stride(0), sa = loop.inner_stride(1),
                     sb = loop.inner_stride(2);
  run_parallel(loop, [&](const std::array<std::int64_t, 3>& off, std::int64_t n) {
    C ta[kTile], tb[kTile], to[kTile];
    for (std::int64_t t = 0; t < n; t += kTile) {
      const std::int64_t m = std::min(kTile, n - t);
      const C* pa = detail::tile_in<C>(x, off[1] + t * sa, sa, m, ta);
      const C* pb = detail::tile_in<C>(y, off[2] + t * sb, sb, m, tb);
      C* po = detail::tile_out_ptr<C>(o, off[0] + t * so, so, to);
      if constexpr (std::is_same_v<C, float>) {
        apply_binary(kind, pa, pb, po, m);
      } else {
        if (!apply_binary(kind, pa, pb, po, m))
          fail<ValueError>("integer division by zero: `b` has a zero divisor");
      }
      detail::tile_out<C>(o, off[0] + t * so, so, m, po);
    }
  });
}

template <typename C>
void compare_impl(CompareKind kind, const Loop<3>& loop, const Tensor& a, const Tensor& b,
                  Tensor& out) {
  const Operand o(out), x(a), y(b);
  const std::int64_t so = loop.inner_stride(0), sa = loop.inner_stride(1),
                     sb = loop.inner_stride(2);
  run_parallel(loop, [&](const std::array<std::int64_t, 3>& off, std::int64_t n) {
    C ta[kTile], tb[kTile];
    std::uint8_t to[kTile];
    for (std::int64_t t = 0; t < n; t += kTile) {
      const std::int64_t m = std::min(kTile, n - t);
      const C* pa = detail::tile_in<C>(x, off[1] + t * sa, sa, m, ta);
      const C* pb = detail::tile_in<C>(y, off[2] + t * sb, sb, m, tb);
      std::uint8_t* po = detail::tile_out_ptr<std::uint8_t>(o, off[0] + t * so, so, to);
      apply_compare(kind, pa, pb, po, m);
      detail::tile_out<std::uint8_t>(o, off[0] + t * so, so, m, po);
    }
  });
}

template <typename C>
void where_impl(const Loop<4>& loop, const Tensor& cond, const Tensor& a, const Tensor& b,
                Tensor& out) {
  const Operand o(out), c(cond), x(a), y(b);
  const std::int64_t so = loop.inner_stride(0), sc = loop.inner_stride(1),
                     sa = loop.inner_stride(2), sb = loop.inner_stride(3);
  run_parallel(loop, [&](const std::array<std::int64_t, 4>& off, std::int64_t n) {
    std::uint8_t tc[kTile];
    C ta[kTile], tb[kTile], to[kTile];
    for (std::int64_t t = 0; t < n; t += kTile) {
      const std::int64_t m = std::min(kTile, n - t);
      const std::uint8_t* pc = detail::tile_in<std::uint8_t>(c, off[1] + t * sc, sc, m, tc);
      const C* pa = detail::tile_in<C>(x, off[2] + t * sa, sa, m, ta);
      const C* pb = detail::tile_in<C>(y, off[3] + t * sb, sb, m, tb);
      C* po = detail::tile_out_ptr<C>(o, off[0] + t * so, so, to);
      // out = cond ? a : b
      for (std::int64_t i = 0; i < m; ++i) po[i] = pc[i] ? pa[i] : pb[i];
      detail::tile_out<C>(o, off[0] + t * so, so, m, po);
    }
  });
}

}  // namespace

void unary(UnaryKind kind, const Tensor& in, Tensor& out) {
  detail::check_cpu(in, "in");
  detail::check_cpu(out, "out");
  check_dtype(in, "in", kFloatTypes);
  check_dtype(out, "out", kFloatTypes);
  detail::check_out_shape(out, in.shape(), "the shape of `in`");
  check_no_overlap(out, "out", in, "in", true);
  const Loop<2> loop = make_loop<2>(out.shape(), {out.strides(), in.strides()});
  const Operand o(out), x(in);
  const std::int64_t so = loop.inner_stride(0), sx = loop.inner_stride(1);
  run_parallel(loop, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
    float tx[kTile], to[kTile];
    for (std::int64_t t = 0; t < n; t += kTile) {
      const std::int64_t m = std::min(kTile, n - t);
      const float* px = detail::tile_in<float>(x, off[1] + t * sx, sx, m, tx);
      float* po = detail::tile_out_ptr<float>(o, off[0] + t * so, so, to);
      apply_unary(kind, px, po, m);
      detail::tile_out<float>(o, off[0] + t * so, so, m, po);
    }
  });
}

void binary(BinaryKind kind, const Tensor& a, const Tensor& b, Tensor& out) {
  const Loop<3> loop = broadcast_loop<3>(out, {&a, &b}, {"a", "b"});
  check_dtype(a, "a", kNumericTypes);
  check_dtype(b, "b", kNumericTypes);
  check_dtype(out, "out", kNumericTypes);
  if (is_floating(a.dtype()) || is_floating(b.dtype()) || is_floating(out.dtype()))
    binary_impl<float>(kind, loop, a, b, out);
  else
    binary_impl<std::int64_t>(kind, loop, a, b, out);
}

void compare(CompareKind kind, const Tensor& a, const Tensor& b, Tensor& out) {
  const Loop<3> loop = broadcast_loop<3>(out, {&a, &b}, {"a", "b"});
  check_dtype(a, "a", kNumericTypes);
  check_dtype(b, "b", kNumericTypes);
  check_dtype(out, "out", {DType::boolean});
  const bool fa = is_floating(a.dtype()), fb = is_floating(b.dtype());
  if (fa && fb)
    compare_impl<float>(kind, loop, a, b, out);
  else if (!fa && !fb)
    compare_impl<std::int64_t>(kind, loop, a, b, out);
  else
    compare_impl<double>(kind, loop, a, b, out);
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const Loop<4> loop = broadcast_loop<4>(out, {&cond, &a, &b}, {"cond", "a", "b"});
  check_dtype(cond, "cond", {DType::boolean});
  if (out.dtype() == DType::boolean)
    where_impl<std::uint8_t>(loop, cond, a, b, out);
  else if (is_floating(out.dtype()) || is_floating(a.dtype()) || is_floating(b.dtype()))
    where_impl<float>(loop, cond, a, b, out);
  else
    where_impl<std::int64_t>(loop, cond, a, b, out);
}

void iota(Tensor& out, std::int64_t axis, double start, double step) {
  detail::check_cpu(out, "out");
  check_dtype(out, "out", kNumericTypes);
  const std::int64_t a = detail::wrap_axis(axis, out.dim(), "axis");
  // values[i] = start + i * step, rounded once into out's dtype, then broadcast over the other
  // axes by a stride-0 view (an exact same-dtype copy).
  const std::int64_t length = out.shape()[a];
  Tensor values = Tensor::empty({length}, out.dtype());  // [length]
  for (std::int64_t i = 0; i < length; ++i)
    store_from_double(values.raw_data(), out.dtype(), i, start + static_cast<double>(i) * step);
  Dims strides(out.dim(), 0);
  strides[a] = 1;
  const Tensor spread = Tensor::view_of(values.storage(), 0, out.shape(), strides, out.dtype());
  detail::copy_broadcast(spread, out, "iota values");
}

void cast(const Tensor& in, Tensor& out) {
  detail::check_cpu(in, "in");
  detail::check_cpu(out, "out");
  detail::check_out_shape(out, in.shape(), "the shape of `in`");
  check_no_overlap(out, "out", in, "in", true);
  detail::copy_broadcast(in, out, "in");
}

}  // namespace splice::cpu
