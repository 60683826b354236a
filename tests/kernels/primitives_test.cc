// CPU primitive kernels (primitives.h) against plain float64 loops.
//
//  1. Every op on random inputs (fresh per case, never zeros) of odd sizes (1, 17, 97, 4097 and
//     above the parallel grain), each float dtype (and ints where the op takes them), in four
//     layouts: contiguous, padded (NaN-poisoned gaps), interleaved (every stride doubled, inner
//     stride 2) and transposed (memory order reversed). Outputs use the same layouts.
//  2. References are double loops over multi-indices reading the stored (rounded) inputs;
//     results compare within default_tolerance(out dtype), copies bit for bit.
//  3. Special cases: broadcasting (leading, inner and middle ones), softmax rows with -inf and
//     fully masked rows, matmul batch broadcasting / transpose_b / every path (BLAS, direct,
//     packed, k = 0), in-place elementwise and softmax, thread-count independence.
//  4. Every error path: its typed error, with the operand and shapes named in the message.
#include "splice/backend/cpu/primitives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../../src/backend/cpu/parallel.h"  // internal: parallel_for is tested here too
#include "splice/core/error.h"
#include "support/test_util.h"

namespace splice {
namespace {

using cpu::BinaryKind;
using cpu::CompareKind;
using cpu::ReduceKind;
using cpu::UnaryKind;
using testing::bit_equal;
using testing::close;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kPad = 3;
constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

// ---- layouts and fills ---------------------------------------------------------------------

enum class Layout { contiguous, padded, interleaved, transposed };
constexpr Layout kLayouts[] = {Layout::contiguous, Layout::padded, Layout::interleaved,
                               Layout::transposed};
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous:
      return "contiguous";
    case Layout::padded:
      return "padded";
    case Layout::interleaved:
      return "interleaved";
    case Layout::transposed:
      return "transposed";
  }
  return "?";
}

// An uninitialized tensor of `shape` in `layout`; memory outside the view is NaN (or 0x7F..)
// so a kernel reading it shows up.
Tensor make(const Dims& shape, DType dtype, Layout layout = Layout::contiguous) {
  switch (layout) {
    case Layout::contiguous:
      return Tensor::empty(shape, dtype);
    case Layout::padded:
      return testing::padded_tensor(shape, dtype, kPad);
    case Layout::interleaved: {
      Dims wide = shape;
      wide.push_back(2);
      Tensor base = Tensor::empty(wide, dtype);
      poison_nan(base);
      return base.select(-1, 0);
    }
    case Layout::transposed: {
      Dims reversed(shape.rbegin(), shape.rend());
      Tensor base = Tensor::empty(reversed, dtype);
      std::vector<std::int64_t> perm;
      for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d)
        perm.push_back(d);
      return base.permute(perm);
    }
  }
  return {};
}

Tensor normal(Rng& rng, const Dims& shape, DType dtype, Layout layout = Layout::contiguous,
              double stddev = 1.0, double mean = 0.0) {
  Tensor t = make(shape, dtype, layout);
  rng.normal(t, mean, stddev);
  return t;
}

Tensor uniform(Rng& rng, const Dims& shape, DType dtype, double lo, double hi,
               Layout layout = Layout::contiguous) {
  Tensor t = make(shape, dtype, layout);
  rng.uniform(t, lo, hi);
  return t;
}

// Random integers in [lo, hi] (any dtype, stored exactly).
Tensor integers(Rng& rng, const Dims& shape, DType dtype, std::int64_t lo, std::int64_t hi,
                Layout layout = Layout::contiguous) {
  Tensor t = make(shape, dtype, layout);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.set_linear(i, static_cast<double>(rng.integer(lo, hi)));
  return t;
}

// ---- reference helpers ----------------------------------------------------------------------

void for_each_index(const Dims& shape, const std::function<void(const Dims&)>& fn) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  Dims index(shape.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    fn(index);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// The index into an operand of `shape` that NumPy broadcasting reads for output index `out`.
Dims source_index(const Dims& out, const Dims& shape) {
  Dims index(shape.size());
  const std::size_t lead = out.size() - shape.size();
  for (std::size_t d = 0; d < shape.size(); ++d) index[d] = shape[d] == 1 ? 0 : out[lead + d];
  return index;
}

// expected[idx] = fn(idx) as an f32 tensor (or i64 for integer results).
Tensor reference(const Dims& shape, DType dtype, const std::function<double(const Dims&)>& fn) {
  Tensor t = Tensor::empty(shape, dtype);
  for_each_index(shape, [&](const Dims& idx) { t.set(idx, fn(idx)); });
  return t;
}

Tolerance tol(DType dtype) { return default_tolerance(dtype); }

// Expects `fn` to throw E with every string of `parts` in its message.
template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// Runs the CPU kernels with more threads than cores so every parallel path is exercised.
class Primitives : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_num_threads(3); }
  void TearDown() override { cpu::set_num_threads(3); }
  Rng rng_{0xC0FFEE};
};

// ---- unary ----------------------------------------------------------------------------------

double unary_ref(UnaryKind kind, double x) {
  switch (kind) {
    case UnaryKind::exp:
      return std::exp(x);
    case UnaryKind::log:
      return std::log(x);
    case UnaryKind::neg:
      return -x;
    case UnaryKind::abs:
      return std::fabs(x);
    case UnaryKind::sqrt:
      return std::sqrt(x);
    case UnaryKind::rsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryKind::reciprocal:
      return 1.0 / x;
    case UnaryKind::sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case UnaryKind::silu:
      return x / (1.0 + std::exp(-x));
    case UnaryKind::softplus:
      return x > 20.0 ? x : std::log1p(std::exp(x));
    case UnaryKind::tanh:
      return std::tanh(x);
  }
  return NAN;
}

TEST_F(Primitives, UnaryEveryKindDtypeLayout) {
  const UnaryKind kinds[] = {UnaryKind::exp,        UnaryKind::log,     UnaryKind::neg,
                             UnaryKind::abs,        UnaryKind::sqrt,    UnaryKind::rsqrt,
                             UnaryKind::reciprocal, UnaryKind::sigmoid, UnaryKind::silu,
                             UnaryKind::softplus,   UnaryKind::tanh};
  const Dims shapes[] = {{1}, {17}, {3, 97}, {2, 5, 17}};
  for (UnaryKind kind : kinds) {
    for (DType dtype : kFloatTypes) {
      for (const Dims& shape : shapes) {
        for (Layout layout : kLayouts) {
          SCOPED_TRACE(::testing::Message()
                       << "kind " << static_cast<int>(kind) << " " << dtype_name(dtype)
                       << dims_str(shape) << " " << layout_name(layout));
          Tensor in;
          switch (kind) {
            case UnaryKind::log:
            case UnaryKind::sqrt:
            case UnaryKind::rsqrt:
              in = uniform(rng_, shape, dtype, 0.05, 8.0, layout);
              break;
            case UnaryKind::reciprocal:
              in = uniform(rng_, shape, dtype, 0.25, 4.0, layout);
              break;
            case UnaryKind::softplus:
              in = uniform(rng_, shape, dtype, -30.0, 30.0, layout);
              break;
            case UnaryKind::exp:
              in = normal(rng_, shape, dtype, layout, 2.0);
              break;
            default:
              in = normal(rng_, shape, dtype, layout, 4.0);
              break;
          }
          // The output uses the next layout, so in and out strides differ.
          Tensor out = make(shape, dtype, kLayouts[(static_cast<int>(layout) + 1) % 4]);
          cpu::unary(kind, in, out);
          const Tensor expected = reference(
              shape, DType::f32, [&](const Dims& i) { return unary_ref(kind, in.at(i)); });
          EXPECT_TRUE(close(out, expected, tol(dtype)));
        }
      }
    }
  }
}

TEST_F(Primitives, UnaryMixedDtypesLargeAndInPlace) {
  // bf16 in -> f32 out over more than the parallel grain.
  const Dims shape = {3, 40961};
  Tensor in = normal(rng_, shape, DType::bf16, Layout::padded, 3.0);
  Tensor out = make(shape, DType::f32);
  cpu::unary(UnaryKind::silu, in, out);
  EXPECT_TRUE(close(out,
                    reference(shape, DType::f32,
                              [&](const Dims& i) { return unary_ref(UnaryKind::silu, in.at(i)); }),
                    tol(DType::f32)));
  // In place: out is the very same view as in.
  Tensor x = normal(rng_, {97, 5}, DType::f32, Layout::transposed);
  const Tensor before = x.contiguous();
  cpu::unary(UnaryKind::tanh, x, x);
  EXPECT_TRUE(close(
      x, reference({97, 5}, DType::f32, [&](const Dims& i) { return std::tanh(before.at(i)); }),
      tol(DType::f32)));
}

TEST_F(Primitives, UnaryEdgeValues) {
  Tensor in = Tensor::empty({6}, DType::f32);
  const double values[] = {-200.0, 200.0, 20.5, 19.5, 0.0, -0.0};
  for (int i = 0; i < 6; ++i) in.set({i}, values[i]);
  Tensor out = Tensor::empty({6}, DType::f32);
  cpu::unary(UnaryKind::sigmoid, in, out);
  EXPECT_EQ(out.at({0}), 0.0);
  EXPECT_EQ(out.at({1}), 1.0);
  cpu::unary(UnaryKind::softplus, in, out);
  EXPECT_EQ(out.at({1}), 200.0);
  EXPECT_EQ(out.at({2}), static_cast<double>(20.5f));  // linear above 20
  EXPECT_NEAR(out.at({3}), std::log1p(std::exp(19.5)), 1e-5);
  EXPECT_FALSE(std::isnan(out.at({0})));
  cpu::unary(UnaryKind::silu, in, out);
  EXPECT_EQ(out.at({0}), -0.0);
  EXPECT_FALSE(std::isnan(out.at({0})));
}

// ---- binary ---------------------------------------------------------------------------------

double binary_ref(BinaryKind kind, double a, double b, bool integer) {
  switch (kind) {
    case BinaryKind::add:
      return a + b;
    case BinaryKind::sub:
      return a - b;
    case BinaryKind::mul:
      return a * b;
    case BinaryKind::div:
      return integer ? std::trunc(a / b) : a / b;
    case BinaryKind::minimum:
      return std::min(a, b);
    case BinaryKind::maximum:
      return std::max(a, b);
  }
  return NAN;
}

struct BinaryCase {
  Dims a, b, out;
};
const BinaryCase kBroadcastCases[] = {
    {{17}, {17}, {17}},
    {{1}, {1}, {1}},
    {{3, 97}, {97}, {3, 97}},
    {{17, 1}, {1, 97}, {17, 97}},
    {{1}, {3, 17, 5}, {3, 17, 5}},
    {{2, 1, 5}, {3, 1}, {2, 3, 5}},
    {{4, 1, 3, 1}, {1, 5, 1, 2}, {4, 5, 3, 2}},
};

TEST_F(Primitives, BinaryFloatBroadcastDtypesLayouts) {
  const BinaryKind kinds[] = {BinaryKind::add, BinaryKind::sub,     BinaryKind::mul,
                              BinaryKind::div, BinaryKind::minimum, BinaryKind::maximum};
  const DType combos[][3] = {
      {DType::f32, DType::f32, DType::f32},   {DType::bf16, DType::bf16, DType::bf16},
      {DType::f16, DType::f16, DType::f16},   {DType::f32, DType::bf16, DType::f32},
      {DType::bf16, DType::f16, DType::bf16}, {DType::i32, DType::f32, DType::f32}};
  int case_id = 0;
  for (BinaryKind kind : kinds) {
    for (const auto& dt : combos) {
      for (const BinaryCase& c : kBroadcastCases) {
        const Layout la = kLayouts[case_id % 4], lb = kLayouts[(case_id / 4) % 4],
                     lo = kLayouts[(case_id + 2) % 4];
        ++case_id;
        SCOPED_TRACE(::testing::Message()
                     << "kind " << static_cast<int>(kind) << " " << dtype_name(dt[0])
                     << dims_str(c.a) << " " << dtype_name(dt[1]) << dims_str(c.b) << " "
                     << layout_name(la) << "/" << layout_name(lb) << "/" << layout_name(lo));
        Tensor a = dt[0] == DType::i32 ? integers(rng_, c.a, dt[0], -50, 50, la)
                                       : normal(rng_, c.a, dt[0], la, 2.0);
        Tensor b = kind == BinaryKind::div ? uniform(rng_, c.b, dt[1], 0.5, 3.0, lb)
                                           : normal(rng_, c.b, dt[1], lb, 2.0);
        Tensor out = make(c.out, dt[2], lo);
        cpu::binary(kind, a, b, out);
        const Tensor expected = reference(c.out, DType::f32, [&](const Dims& i) {
          return binary_ref(kind, a.at(source_index(i, c.a)), b.at(source_index(i, c.b)), false);
        });
        EXPECT_TRUE(close(out, expected, tol(dt[2])));
      }
    }
  }
}

TEST_F(Primitives, BinaryIntegersExact) {
  const BinaryKind kinds[] = {BinaryKind::add, BinaryKind::sub,     BinaryKind::mul,
                              BinaryKind::div, BinaryKind::minimum, BinaryKind::maximum};
  const DType combos[][3] = {{DType::i32, DType::i32, DType::i32},
                             {DType::i64, DType::i32, DType::i64},
                             {DType::i64, DType::i64, DType::i32}};
  for (BinaryKind kind : kinds) {
    for (const auto& dt : combos) {
      for (const BinaryCase& c : kBroadcastCases) {
        Tensor a = integers(rng_, c.a, dt[0], -1000, 1000, Layout::interleaved);
        Tensor b = integers(rng_, c.b, dt[1], 1, 37, Layout::transposed);
        if (kind != BinaryKind::div)
          for (std::int64_t i = 0; i < b.numel(); i += 2) b.set_linear(i, -b.at_linear(i));
        Tensor out = make(c.out, dt[2], Layout::padded);
        cpu::binary(kind, a, b, out);
        const Tensor expected = reference(c.out, DType::i64, [&](const Dims& i) {
          return binary_ref(kind, a.at(source_index(i, c.a)), b.at(source_index(i, c.b)), true);
        });
        EXPECT_TRUE(close(out, expected, {0.0, 0.0}))
            << "kind " << static_cast<int>(kind) << " " << dims_str(c.a) << dims_str(c.b);
      }
    }
  }
  // Truncation toward zero and exact 64-bit arithmetic beyond 2^53.
  Tensor a = Tensor::empty({3}, DType::i64), b = Tensor::empty({3}, DType::i64),
         out = Tensor::empty({3}, DType::i64);
  a.data<std::int64_t>()[0] = -7;
  b.data<std::int64_t>()[0] = 2;
  a.data<std::int64_t>()[1] = (std::int64_t{1} << 60) + 1;
  b.data<std::int64_t>()[1] = 1;
  a.data<std::int64_t>()[2] = 7;
  b.data<std::int64_t>()[2] = -2;
  cpu::binary(BinaryKind::div, a, b, out);
  EXPECT_EQ(out.data<std::int64_t>()[0], -3);
  EXPECT_EQ(out.data<std::int64_t>()[1], (std::int64_t{1} << 60) + 1);
  EXPECT_EQ(out.data<std::int64_t>()[2], -3);
  cpu::binary(BinaryKind::add, a, b, out);
  EXPECT_EQ(out.data<std::int64_t>()[1], (std::int64_t{1} << 60) + 2);
}

TEST_F(Primitives, BinaryLargeParallelAndInPlace) {
  const Dims shape = {5, 33000};
  Tensor a = normal(rng_, shape, DType::bf16);
  Tensor b = normal(rng_, {33000}, DType::bf16);
  Tensor out = make(shape, DType::bf16, Layout::padded);
  cpu::binary(BinaryKind::mul, a, b, out);
  EXPECT_TRUE(close(
      out, reference(shape, DType::f32, [&](const Dims& i) { return a.at(i) * b.at({i[1]}); }),
      tol(DType::bf16)));
  // a += b in place (out is a).
  Tensor x = normal(rng_, shape, DType::f32, Layout::interleaved);
  const Tensor before = x.contiguous();
  cpu::binary(BinaryKind::add, x, b, x);
  EXPECT_TRUE(close(
      x, reference(shape, DType::f32, [&](const Dims& i) { return before.at(i) + b.at({i[1]}); }),
      tol(DType::f32)));
}

TEST_F(Primitives, MinimumMaximumPropagateNan) {
  Tensor a = Tensor::empty({2}, DType::f32), b = Tensor::empty({2}, DType::f32),
         out = Tensor::empty({2}, DType::f32);
  a.set({0}, NAN);
  b.set({0}, 1.0);
  a.set({1}, 1.0);
  b.set({1}, NAN);
  for (BinaryKind kind : {BinaryKind::minimum, BinaryKind::maximum}) {
    cpu::binary(kind, a, b, out);
    EXPECT_TRUE(std::isnan(out.at({0})));
    EXPECT_TRUE(std::isnan(out.at({1})));
  }
}

// ---- compare and where ----------------------------------------------------------------------

TEST_F(Primitives, CompareEveryKindAndDtypeMix) {
  const CompareKind kinds[] = {CompareKind::less,    CompareKind::less_equal,
                               CompareKind::greater, CompareKind::greater_equal,
                               CompareKind::equal,   CompareKind::not_equal};
  const DType combos[][2] = {{DType::f32, DType::f32},  {DType::bf16, DType::f32},
                             {DType::f16, DType::bf16}, {DType::i32, DType::i64},
                             {DType::i64, DType::f32},  {DType::i32, DType::bf16}};
  for (CompareKind kind : kinds) {
    for (const auto& dt : combos) {
      for (const BinaryCase& c : kBroadcastCases) {
        // Small integers so that equal pairs are common.
        Tensor a = integers(rng_, c.a, dt[0], -3, 3, Layout::transposed);
        Tensor b = integers(rng_, c.b, dt[1], -3, 3, Layout::interleaved);
        Tensor out = make(c.out, DType::boolean, Layout::padded);
        cpu::compare(kind, a, b, out);
        const Tensor expected = reference(c.out, DType::boolean, [&](const Dims& i) {
          const double x = a.at(source_index(i, c.a)), y = b.at(source_index(i, c.b));
          switch (kind) {
            case CompareKind::less:
              return x < y ? 1.0 : 0.0;
            case CompareKind::less_equal:
              return x <= y ? 1.0 : 0.0;
            case CompareKind::greater:
              return x > y ? 1.0 : 0.0;
            case CompareKind::greater_equal:
              return x >= y ? 1.0 : 0.0;
            case CompareKind::equal:
              return x == y ? 1.0 : 0.0;
            case CompareKind::not_equal:
              return x != y ? 1.0 : 0.0;
          }
          return 0.0;
        });
        EXPECT_TRUE(bit_equal(out, expected)) << "kind " << static_cast<int>(kind);
      }
    }
  }
  // Integers compare exactly beyond float precision.
  Tensor a = Tensor::empty({1}, DType::i64), b = Tensor::empty({1}, DType::i64),
         out = Tensor::empty({1}, DType::boolean);
  a.data<std::int64_t>()[0] = (std::int64_t{1} << 40) + 1;
  b.data<std::int64_t>()[0] = std::int64_t{1} << 40;
  cpu::compare(CompareKind::greater, a, b, out);
  EXPECT_EQ(out.at({0}), 1.0);
}

TEST_F(Primitives, WhereBroadcastDtypes) {
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
  int case_id = 0;
  for (DType dtype : dtypes) {
    for (const Dims& cond_shape : {Dims{17, 97}, Dims{17, 1}, Dims{97}, Dims{1}}) {
      const Dims a_shape = {1, 97}, b_shape = {17, 1}, out_shape = {17, 97};
      Tensor cond = make(cond_shape, DType::boolean, kLayouts[case_id % 4]);
      for (std::int64_t i = 0; i < cond.numel(); ++i)
        cond.set_linear(i, static_cast<double>(rng_.integer(0, 1)));
      Tensor a = integers(rng_, a_shape, dtype, -100, 100, kLayouts[(case_id + 1) % 4]);
      Tensor b = integers(rng_, b_shape, dtype, -100, 100, kLayouts[(case_id + 2) % 4]);
      Tensor out = make(out_shape, dtype, kLayouts[(case_id + 3) % 4]);
      ++case_id;
      cpu::where(cond, a, b, out);
      const Tensor expected = reference(out_shape, dtype, [&](const Dims& i) {
        return cond.at(source_index(i, cond_shape)) != 0.0 ? a.at(source_index(i, a_shape))
                                                           : b.at(source_index(i, b_shape));
      });
      EXPECT_TRUE(bit_equal(out, expected)) << dtype_name(dtype) << dims_str(cond_shape);
    }
  }
  // Float values pass through exactly (no arithmetic), mixed input dtypes convert.
  Tensor cond = Tensor::empty({97}, DType::boolean);
  for (std::int64_t i = 0; i < 97; ++i) cond.set({i}, static_cast<double>(i % 3 == 0));
  Tensor a = normal(rng_, {97}, DType::f32), b = normal(rng_, {97}, DType::bf16);
  Tensor out = make({97}, DType::f32, Layout::interleaved);
  cpu::where(cond, a, b, out);
  EXPECT_TRUE(bit_equal(out, reference({97}, DType::f32, [&](const Dims& i) {
                          return cond.at(i) != 0.0 ? a.at(i) : b.at(i);
                        })));
}

// ---- iota and cast --------------------------------------------------------------------------

TEST_F(Primitives, IotaEveryDtypeAxisLayout) {
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
  for (DType dtype : dtypes) {
    const bool integral = dtype == DType::i32 || dtype == DType::i64;
    const double start = integral ? -3.0 : 0.25, step = integral ? 2.0 : 0.5;
    for (std::int64_t axis : {0, 1, 2, -1}) {
      for (Layout layout : kLayouts) {
        const Dims shape = {5, 17, 3};
        Tensor out = make(shape, dtype, layout);
        cpu::iota(out, axis, start, step);
        const std::int64_t a = axis < 0 ? axis + 3 : axis;
        const Tensor expected = reference(
            shape, dtype, [&](const Dims& i) { return start + static_cast<double>(i[a]) * step; });
        EXPECT_TRUE(bit_equal(out, expected)) << dtype_name(dtype) << " axis " << axis;
      }
    }
  }
  Tensor big = make({70001}, DType::i32);
  cpu::iota(big, 0);
  EXPECT_EQ(big.at({70000}), 70000.0);
}

TEST_F(Primitives, CastRoundsToNearestEvenAndCopiesExactly) {
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};
  int case_id = 0;
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      const Dims shape = {17, 97};
      const bool int_from = from == DType::i32 || from == DType::i64;
      Tensor in = int_from ? integers(rng_, shape, from, -3000, 3000, kLayouts[case_id % 4])
                           : normal(rng_, shape, from, kLayouts[case_id % 4], 100.0);
      Tensor out = make(shape, to, kLayouts[(case_id + 1) % 4]);
      ++case_id;
      cpu::cast(in, out);
      // Reference: one rounding of the stored value (float -> int truncates toward zero).
      const Tensor expected = reference(shape, to, [&](const Dims& i) {
        const double v = in.at(i);
        return (to == DType::i32 || to == DType::i64) ? std::trunc(v) : v;
      });
      EXPECT_TRUE(bit_equal(out, expected)) << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
  // Halfway cases: f32 -> bf16 ties go to even; NaN bits survive a same-dtype cast.
  Tensor in = Tensor::empty({3}, DType::f32), out = Tensor::empty({3}, DType::bf16);
  const float tie_down = f32_from_bits(0x3F808000u);  // between 0x3F80 (even) and 0x3F81
  const float tie_up = f32_from_bits(0x3F818000u);    // between 0x3F81 and 0x3F82 (even)
  in.data<float>()[0] = tie_down;
  in.data<float>()[1] = tie_up;
  in.data<float>()[2] = -0.0f;
  cpu::cast(in, out);
  EXPECT_EQ(out.data<std::uint16_t>()[0], 0x3F80u);
  EXPECT_EQ(out.data<std::uint16_t>()[1], 0x3F82u);
  EXPECT_EQ(out.data<std::uint16_t>()[2], 0x8000u);
  Tensor nan_in = Tensor::empty({1}, DType::bf16), nan_out = Tensor::empty({1}, DType::bf16);
  nan_in.data<std::uint16_t>()[0] = 0x7F81u;  // signaling-NaN payload
  cpu::cast(nan_in, nan_out);
  EXPECT_EQ(nan_out.data<std::uint16_t>()[0], 0x7F81u);
  // Float -> int saturates and maps NaN to 0; float -> bool is "nonzero".
  Tensor f = Tensor::empty({4}, DType::f32), i = Tensor::empty({4}, DType::i32),
         b = Tensor::empty({4}, DType::boolean);
  f.set({0}, 1e20);
  f.set({1}, -1e20);
  f.set({2}, NAN);
  f.set({3}, 0.5);
  cpu::cast(f, i);
  EXPECT_EQ(i.data<std::int32_t>()[0], std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(i.data<std::int32_t>()[1], std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(i.data<std::int32_t>()[2], 0);
  EXPECT_EQ(i.data<std::int32_t>()[3], 0);
  cpu::cast(f, b);
  EXPECT_EQ(b.at({3}), 1.0);
}

// ---- reduce and softmax ---------------------------------------------------------------------

TEST_F(Primitives, ReduceEveryKindAxisDtypeLayout) {
  const ReduceKind kinds[] = {ReduceKind::sum, ReduceKind::max, ReduceKind::mean};
  const Dims shape = {5, 17, 97};
  int case_id = 0;
  for (ReduceKind kind : kinds) {
    for (DType dtype : kFloatTypes) {
      for (std::int64_t axis : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          const Layout li = kLayouts[case_id % 4], lo = kLayouts[(case_id / 4) % 4];
          ++case_id;
          const std::int64_t a = axis < 0 ? axis + 3 : axis;
          Dims out_shape = shape;
          if (keepdim)
            out_shape[a] = 1;
          else
            out_shape.erase(out_shape.begin() + a);
          Tensor in = normal(rng_, shape, dtype, li, 1.0, 0.5);
          Tensor out = make(out_shape, dtype, lo);
          cpu::reduce(kind, in, axis, keepdim, out);
          const Tensor expected = reference(out_shape, DType::f32, [&](const Dims& o) {
            Dims i = o;
            if (!keepdim) i.insert(i.begin() + a, 0);
            double acc = kind == ReduceKind::max ? -kInf : 0.0;
            for (std::int64_t r = 0; r < shape[a]; ++r) {
              i[a] = r;
              acc = kind == ReduceKind::max ? std::max(acc, in.at(i)) : acc + in.at(i);
            }
            return kind == ReduceKind::mean ? acc / static_cast<double>(shape[a]) : acc;
          });
          EXPECT_TRUE(close(out, expected, tol(dtype)))
              << "kind " << static_cast<int>(kind) << " " << dtype_name(dtype) << " axis " << axis
              << " keepdim " << keepdim << " " << layout_name(li) << "/" << layout_name(lo);
        }
      }
    }
  }
}

TEST_F(Primitives, ReduceLongRowsAndColumns) {
  // A 4097-long last axis (row strategy) and a 4097-long first axis (column strategy).
  for (const Dims& shape : {Dims{3, 4097}, Dims{4097, 19}}) {
    for (std::int64_t axis : {0, 1}) {
      Tensor in = normal(rng_, shape, DType::f32, Layout::contiguous, 1.0, 0.25);
      Dims out_shape = {shape[1 - axis]};
      Tensor out = make(out_shape, DType::f32);
      cpu::reduce(ReduceKind::sum, in, axis, false, out);
      const Tensor expected = reference(out_shape, DType::f32, [&](const Dims& o) {
        double acc = 0.0;
        for (std::int64_t r = 0; r < shape[axis]; ++r)
          acc += axis == 0 ? in.at({r, o[0]}) : in.at({o[0], r});
        return acc;
      });
      EXPECT_TRUE(close(out, expected, tol(DType::f32))) << dims_str(shape) << " axis " << axis;
    }
  }
  // NaN wins a max; a single-element axis is the identity.
  Tensor in = normal(rng_, {2, 17}, DType::f32);
  in.set({1, 5}, NAN);
  Tensor out = Tensor::empty({2}, DType::f32);
  cpu::reduce(ReduceKind::max, in, 1, false, out);
  EXPECT_FALSE(std::isnan(out.at({0})));
  EXPECT_TRUE(std::isnan(out.at({1})));
}

double softmax_ref(const Tensor& in, const Dims& index, std::int64_t axis) {
  Dims i = index;
  double m = -kInf;
  for (std::int64_t r = 0; r < in.shape()[axis]; ++r) {
    i[axis] = r;
    m = std::max(m, in.at(i));
  }
  if (m == -kInf) return 0.0;
  double s = 0.0;
  for (std::int64_t r = 0; r < in.shape()[axis]; ++r) {
    i[axis] = r;
    s += std::exp(in.at(i) - m);
  }
  return std::exp(in.at(index) - m) / s;
}

TEST_F(Primitives, SoftmaxDtypesAxesMaskedRows) {
  int case_id = 0;
  for (DType dtype : kFloatTypes) {
    for (const Dims& shape : {Dims{1}, Dims{4, 97}, Dims{3, 17, 5}, Dims{2, 4097}}) {
      const std::int64_t rank = static_cast<std::int64_t>(shape.size());
      for (std::int64_t axis = -1; axis < rank - 1; ++axis) {
        const Layout li = kLayouts[case_id % 4], lo = kLayouts[(case_id + 1) % 4];
        ++case_id;
        const std::int64_t a = axis < 0 ? axis + rank : axis;
        Tensor in = normal(rng_, shape, dtype, li, 3.0);
        // Mask about a third of the entries, and one whole slice along the axis.
        for (std::int64_t i = 0; i < in.numel(); ++i)
          if (rng_.integer(0, 2) == 0) in.set_linear(i, -kInf);
        if (in.numel() / shape[a] > 1) {
          Dims index(shape.size(), 0);
          for (std::int64_t r = 0; r < shape[a]; ++r) {
            index[a] = r;
            in.set(index, -kInf);
          }
        }
        Tensor out = make(shape, dtype, lo);
        cpu::softmax(in, axis, out);
        const Tensor expected =
            reference(shape, DType::f32, [&](const Dims& i) { return softmax_ref(in, i, a); });
        EXPECT_TRUE(close(out, expected, tol(dtype)))
            << dtype_name(dtype) << dims_str(shape) << " axis " << axis;
      }
    }
  }
}

TEST_F(Primitives, SoftmaxAllMaskedGivesZerosAndInPlaceWorks) {
  Tensor in = Tensor::empty({3, 9}, DType::bf16);
  in.fill(-kInf);
  Tensor out = Tensor::empty({3, 9}, DType::bf16);
  cpu::softmax(in, -1, out);
  for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.at_linear(i), 0.0);
  Tensor x = normal(rng_, {8, 33}, DType::f32, Layout::padded, 2.0);
  const Tensor before = x.contiguous();
  cpu::softmax(x, 1, x);
  EXPECT_TRUE(close(
      x, reference({8, 33}, DType::f32, [&](const Dims& i) { return softmax_ref(before, i, 1); }),
      tol(DType::f32)));
}

// ---- matmul ---------------------------------------------------------------------------------

// out[..., i, j] = sum_k a[..., i, k] * b[..., k, j] in double, broadcasting batch axes.
Tensor matmul_ref(const Tensor& a, const Tensor& b, const Dims& out_shape, bool transpose_b) {
  const std::int64_t k = a.shape().back();
  const Dims a_batch(a.shape().begin(), a.shape().end() - 2);
  const Dims b_batch(b.shape().begin(), b.shape().end() - 2);
  return reference(out_shape, DType::f32, [&](const Dims& o) {
    const std::size_t r = o.size();
    const Dims ob(o.begin(), o.end() - 2);
    Dims ia = source_index(ob, a_batch), ib = source_index(ob, b_batch);
    ia.push_back(o[r - 2]);
    ia.push_back(0);
    ib.push_back(0);
    ib.push_back(0);
    double acc = 0.0;
    for (std::int64_t kk = 0; kk < k; ++kk) {
      ia.back() = kk;
      ib[ib.size() - 2] = transpose_b ? o[r - 1] : kk;
      ib.back() = transpose_b ? kk : o[r - 1];
      acc += a.at(ia) * b.at(ib);
    }
    return acc;
  });
}

struct MatmulCase {
  Dims a, b, out;
  bool transpose_b;
};

TEST_F(Primitives, MatmulShapesDtypesLayoutsPaths) {
  const MatmulCase cases[] = {
      {{1, 17}, {17, 97}, {1, 97}, false},               // gemv (decode)
      {{1, 97}, {17, 97}, {1, 17}, true},                // gemv on [n, k] weights
      {{17, 97}, {97, 1}, {17, 1}, false},               // n = 1
      {{1, 1}, {1, 1}, {1, 1}, false},                   // scalar
      {{5, 33}, {33, 40}, {5, 40}, false},               // direct (m <= 8)
      {{33, 40}, {17, 40}, {33, 17}, true},              // BLAS / packed (m > 8)
      {{2, 1, 5, 17}, {3, 17, 7}, {2, 3, 5, 7}, false},  // batch broadcasting
      {{4, 9, 16}, {16, 11}, {4, 9, 11}, false},         // b broadcast over a's batch
      {{6, 16}, {2, 3, 11, 16}, {2, 3, 6, 11}, true},    // a broadcast over b's batch
  };
  const DType combos[][3] = {{DType::f32, DType::f32, DType::f32},
                             {DType::bf16, DType::bf16, DType::bf16},
                             {DType::f16, DType::f16, DType::f32},
                             {DType::f32, DType::bf16, DType::f32}};
  int case_id = 0;
  for (const MatmulCase& c : cases) {
    for (const auto& dt : combos) {
      for (int variant = 0; variant < 4; ++variant) {
        const Layout la = kLayouts[(case_id + variant) % 4],
                     lb = kLayouts[(case_id + 2 * variant) % 4],
                     lo = kLayouts[(case_id + 3 * variant) % 4];
        ++case_id;
        SCOPED_TRACE(::testing::Message()
                     << dims_str(c.a) << " @ " << dims_str(c.b) << (c.transpose_b ? "^T " : " ")
                     << dtype_name(dt[0]) << "/" << dtype_name(dt[1]) << "/" << dtype_name(dt[2])
                     << " " << layout_name(la) << "/" << layout_name(lb) << "/" << layout_name(lo));
        Tensor a = normal(rng_, c.a, dt[0], la);
        Tensor b = normal(rng_, c.b, dt[1], lb, 1.0 / std::sqrt(static_cast<double>(c.a.back())));
        Tensor out = make(c.out, dt[2], lo);
        cpu::matmul(a, b, out, c.transpose_b);
        EXPECT_TRUE(close(out, matmul_ref(a, b, c.out, c.transpose_b), tol(dt[2])));
      }
    }
  }
}

TEST_F(Primitives, MatmulDecodeShapesAndLargeK) {
  // [1, 576] x [576, 1536] in each dtype and [2, 4097] x [4097, 33]^T: long fp32 accumulations.
  for (DType dtype : kFloatTypes) {
    Tensor a = normal(rng_, {1, 576}, dtype);
    Tensor b = normal(rng_, {576, 1536}, dtype, Layout::contiguous, 1.0 / 24.0);
    Tensor out = make({1, 1536}, dtype);
    cpu::matmul(a, b, out);
    EXPECT_TRUE(close(out, matmul_ref(a, b, {1, 1536}, false), tol(dtype))) << dtype_name(dtype);
    Tensor a2 = normal(rng_, {2, 4097}, dtype);
    Tensor b2 = normal(rng_, {33, 4097}, dtype, Layout::contiguous, 1.0 / 64.0);
    Tensor out2 = make({2, 33}, DType::f32);
    cpu::matmul(a2, b2, out2, /*transpose_b=*/true);
    EXPECT_TRUE(close(out2, matmul_ref(a2, b2, {2, 33}, true), tol(DType::f32)))
        << dtype_name(dtype);
  }
}

TEST_F(Primitives, MatmulEmptyInnerDimGivesZeros) {
  Tensor a = Tensor::empty({2, 3, 0}, DType::f32), b = Tensor::empty({0, 4}, DType::bf16);
  Tensor out = make({2, 3, 4}, DType::bf16, Layout::padded);
  cpu::matmul(a, b, out);
  for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.at_linear(i), 0.0);
  Tensor empty_out = Tensor::empty({2, 0, 4}, DType::f32);
  cpu::matmul(Tensor::empty({2, 0, 5}, DType::f32), normal(rng_, {5, 4}, DType::f32), empty_out);
}

// ---- concat, gather, write_at ---------------------------------------------------------------

TEST_F(Primitives, ConcatAxesDtypesLayouts) {
  int case_id = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (std::int64_t axis : {0, 1, 2, -2}) {
      const std::int64_t a = axis < 0 ? axis + 3 : axis;
      const std::int64_t sizes[] = {1, 17, 5};
      std::vector<Tensor> inputs;
      Dims out_shape = {4, 3, 2};
      out_shape[a] = 0;
      for (std::int64_t s : sizes) {
        Dims shape = {4, 3, 2};
        shape[a] = s;
        inputs.push_back(integers(rng_, shape, dtype, -99, 99, kLayouts[case_id++ % 4]));
        out_shape[a] += s;
      }
      Tensor out = make(out_shape, dtype, kLayouts[case_id % 4]);
      cpu::concat(inputs, axis, out);
      const Tensor expected = reference(out_shape, dtype, [&](const Dims& i) {
        Dims j = i;
        for (const Tensor& t : inputs) {
          if (j[a] < t.shape()[a]) return t.at(j);
          j[a] -= t.shape()[a];
        }
        return std::nan("");
      });
      EXPECT_TRUE(bit_equal(out, expected)) << dtype_name(dtype) << " axis " << axis;
    }
  }
  // Converting concat: bf16 and f32 pieces into an f32 output.
  std::vector<Tensor> mixed = {normal(rng_, {2, 3}, DType::bf16), normal(rng_, {2, 4}, DType::f32)};
  Tensor out = Tensor::empty({2, 7}, DType::f32);
  cpu::concat(mixed, 1, out);
  EXPECT_EQ(out.at({1, 2}), mixed[0].at({1, 2}));
  EXPECT_EQ(out.at({1, 6}), mixed[1].at({1, 3}));
}

TEST_F(Primitives, GatherEmbeddingRows) {
  int case_id = 0;
  for (DType table_dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (DType index_dtype : {DType::i32, DType::i64}) {
      for (const Dims& index_shape : {Dims{}, Dims{1}, Dims{17}, Dims{3, 5}}) {
        const Dims table_shape = {11, 4, 3};
        Tensor table = normal(rng_, table_shape, table_dtype, kLayouts[case_id % 4]);
        Tensor indices =
            integers(rng_, index_shape, index_dtype, 0, 10, kLayouts[(case_id + 1) % 4]);
        Dims out_shape = index_shape;
        out_shape.push_back(4);
        out_shape.push_back(3);
        Tensor out = make(out_shape, table_dtype, kLayouts[(case_id + 2) % 4]);
        ++case_id;
        cpu::gather(table, indices, out);
        const std::size_t lead = index_shape.size();
        const Tensor expected = reference(out_shape, table_dtype, [&](const Dims& o) {
          const Dims ix(o.begin(), o.begin() + lead);
          return table.at({static_cast<std::int64_t>(indices.at(ix)), o[lead], o[lead + 1]});
        });
        EXPECT_TRUE(bit_equal(out, expected))
            << dtype_name(table_dtype) << " " << dtype_name(index_dtype) << dims_str(index_shape);
      }
    }
  }
  // A converting lookup: f32 table rows rounded (RNE) into a bf16 output.
  Tensor table32 = normal(rng_, {7, 5}, DType::f32, Layout::interleaved);
  Tensor ids = integers(rng_, {4}, DType::i32, 0, 6);
  Tensor rows16 = make({4, 5}, DType::bf16, Layout::transposed);
  cpu::gather(table32, ids, rows16);
  EXPECT_TRUE(bit_equal(rows16, reference({4, 5}, DType::bf16, [&](const Dims& o) {
                          return table32.at({static_cast<std::int64_t>(ids.at({o[0]})), o[1]});
                        })));
  // A large lookup (parallel, memcpy rows) of a [vocab, hidden] table.
  Tensor table = normal(rng_, {1000, 576}, DType::bf16);
  Tensor indices = integers(rng_, {300}, DType::i64, 0, 999);
  Tensor out = Tensor::empty({300, 576}, DType::bf16);
  cpu::gather(table, indices, out);
  for (std::int64_t p = 0; p < 300; p += 37)
    EXPECT_EQ(std::memcmp(out.select(0, p).raw_data(),
                          table.select(0, static_cast<std::int64_t>(indices.at({p}))).raw_data(),
                          576 * 2),
              0);
}

TEST_F(Primitives, WriteAtAppendsExactlyAndLeavesTheRest) {
  for (DType value_dtype : {DType::bf16, DType::f32}) {
    // [batch, num_kv_heads, capacity, head_dim]
    Tensor state = normal(rng_, {2, 3, 10, 8}, DType::bf16, Layout::padded);
    const Tensor before = state.contiguous();
    Tensor value = normal(rng_, {2, 3, 3, 8}, value_dtype, Layout::transposed);
    cpu::write_at(state, value, 2, 7);
    const Tensor expected = reference({2, 3, 10, 8}, DType::bf16, [&](const Dims& i) {
      if (i[2] < 7) return before.at(i);
      Dims j = i;
      j[2] -= 7;
      return static_cast<double>(round_to(DType::bf16, static_cast<float>(value.at(j))));
    });
    EXPECT_TRUE(bit_equal(state, expected)) << dtype_name(value_dtype);
  }
}

// ---- threads --------------------------------------------------------------------------------

TEST_F(Primitives, ResultsDoNotDependOnThreadCount) {
  Tensor x = normal(rng_, {7, 20011}, DType::bf16);
  Tensor y = normal(rng_, {20011}, DType::f32);
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    Tensor sum = Tensor::empty({7, 20011}, DType::f32);
    cpu::binary(BinaryKind::add, x, y, sum);
    Tensor soft = Tensor::empty({7, 20011}, DType::bf16);
    cpu::softmax(sum, -1, soft);
    Tensor red = Tensor::empty({20011}, DType::f32);
    cpu::reduce(ReduceKind::sum, x, 0, false, red);
    Tensor mm = Tensor::empty({7, 7}, DType::f32);
    cpu::matmul(x, x, mm, /*transpose_b=*/true);
    return std::vector<Tensor>{sum, soft, red, mm};
  };
  const auto one = run(1), four = run(4);
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bit_equal(one[i], four[i])) << i;
}

TEST_F(Primitives, ParallelForCoversRangeNestsAndRethrows) {
  std::vector<int> hits(100000, 0);
  cpu::parallel_for(0, 100000, 1000, [&](std::int64_t lo, std::int64_t hi) {
    cpu::parallel_for(lo, hi, 1, [&](std::int64_t l2, std::int64_t h2) {  // nested: inline
      for (std::int64_t i = l2; i < h2; ++i) ++hits[i];
    });
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_THROW(cpu::parallel_for(0, 100, 1,
                                 [](std::int64_t lo, std::int64_t) {
                                   if (lo > 0) fail<ValueError>("chunk failed");
                                 }),
               ValueError);
  EXPECT_EQ(cpu::parallel_chunks(0, 10, 100), 1);
  EXPECT_EQ(cpu::parallel_chunks(0, 0, 1), 0);
  EXPECT_EQ(cpu::num_threads(), 3);
  EXPECT_THROW(cpu::set_num_threads(0), ValueError);
}

// ---- empty tensors and aliasing -------------------------------------------------------------

TEST_F(Primitives, EmptyTensorsAreNoOpsOrIdentities) {
  Tensor a = Tensor::empty({0, 5}, DType::f32), b = Tensor::empty({5}, DType::bf16);
  Tensor out = Tensor::empty({0, 5}, DType::f32);
  cpu::binary(BinaryKind::add, a, b, out);
  cpu::unary(UnaryKind::exp, a, out);
  Tensor soft = Tensor::empty({3, 0}, DType::f32);
  cpu::softmax(Tensor::empty({3, 0}, DType::f32), 1, soft);
  // Sum over an empty axis is 0, mean is 0/0 = NaN.
  Tensor sum = Tensor::empty({3}, DType::f32), mean = Tensor::empty({3}, DType::f32);
  cpu::reduce(ReduceKind::sum, Tensor::empty({3, 0}, DType::f32), 1, false, sum);
  cpu::reduce(ReduceKind::mean, Tensor::empty({3, 0}, DType::f32), 1, false, mean);
  for (std::int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sum.at({i}), 0.0);
    EXPECT_TRUE(std::isnan(mean.at({i})));
  }
  Tensor gathered = Tensor::empty({0, 4}, DType::bf16);
  cpu::gather(normal(rng_, {3, 4}, DType::bf16), Tensor::empty({0}, DType::i64), gathered);
  // A zero-length piece in concat, a zero-length append at the very end of a cache.
  Tensor x = normal(rng_, {2, 3}, DType::f32), cat = Tensor::empty({2, 3}, DType::f32);
  cpu::concat({Tensor::empty({2, 0}, DType::f32), x}, 1, cat);
  EXPECT_TRUE(bit_equal(cat, x));
  Tensor state = normal(rng_, {2, 4}, DType::bf16);
  const Tensor before = state.contiguous();
  cpu::write_at(state, Tensor::empty({2, 0}, DType::bf16), 1, 4);
  EXPECT_TRUE(bit_equal(state, before));
}

TEST_F(Primitives, OverlappingOutputsAreRejected) {
  Tensor base = normal(rng_, {4, 8}, DType::f32);
  Tensor left = base.slice(1, 0, 6), right = base.slice(1, 2, 8);
  expect_error<LayoutError>([&] { cpu::binary(BinaryKind::add, left, left, right); },
                            {"`out`", "overlaps `a`"});
  expect_error<LayoutError>([&] { cpu::unary(UnaryKind::neg, left, right); }, {"overlaps `in`"});
  expect_error<LayoutError>([&] { cpu::softmax(left, 1, right); }, {"overlaps `in`"});
  Tensor square = base.slice(1, 0, 4);  // [4, 4]
  expect_error<LayoutError>([&] { cpu::matmul(square, square, square); }, {"overlaps `a`"});
  Tensor transposed = left.permute({1, 0}).slice(1, 0, 4);  // [6, 4], same storage
  Tensor cast_out = base.slice(1, 1, 7).permute({1, 0});    // [6, 4], shifted by one element
  expect_error<LayoutError>([&] { cpu::cast(transposed, cast_out); }, {"overlaps"});
  Tensor column = base.slice(1, 0, 1);
  expect_error<LayoutError>([&] { cpu::concat({left.slice(1, 0, 1)}, 1, column); },
                            {"overlaps `inputs[0]`"});
  Tensor table = normal(rng_, {4, 8}, DType::f32);
  Tensor indices = integers(rng_, {2}, DType::i64, 0, 3);
  Tensor rows = table.slice(0, 2, 4);
  expect_error<LayoutError>([&] { cpu::gather(table, indices, rows); }, {"overlaps `table`"});
  // Two borrowed views of one caller buffer: different Storage objects, same memory.
  std::vector<float> buffer(64, 1.0f);
  Tensor first = Tensor::borrow(buffer.data(), {32}, DType::f32);
  Tensor second = Tensor::borrow(buffer.data() + 16, {32}, DType::f32);
  expect_error<LayoutError>([&] { cpu::unary(UnaryKind::exp, first, second); }, {"overlaps"});
  Tensor same = Tensor::borrow(buffer.data(), {32}, DType::f32);
  cpu::unary(UnaryKind::neg, first, same);  // identical view: in place
  EXPECT_EQ(buffer[0], -1.0f);
  // Disjoint views of one storage are fine, and so is an identical in-place view.
  Tensor top = base.slice(0, 0, 2), bottom = base.slice(0, 2, 4);
  cpu::unary(UnaryKind::neg, top, bottom);
  EXPECT_EQ(bottom.at({1, 7}), -top.at({1, 7}));
  cpu::binary(BinaryKind::mul, top, top, top);
  cpu::cast(top, top);
  Tensor window = base.slice(1, 2, 4);
  cpu::write_at(base, window, 1, 2);  // value is the window itself: a no-op
}

// ---- errors ---------------------------------------------------------------------------------

TEST_F(Primitives, ErrorsNameOperandsAndShapes) {
  const Tensor a = normal(rng_, {3, 4}, DType::f32), b = normal(rng_, {5}, DType::f32);
  Tensor out = Tensor::empty({3, 4}, DType::f32);
  expect_error<ShapeError>([&] { cpu::binary(BinaryKind::add, a, b, out); },
                           {"`a` [3, 4]", "`b` [5]"});
  Tensor wrong = Tensor::empty({4, 3}, DType::f32);
  expect_error<ShapeError>([&] { cpu::binary(BinaryKind::add, a, a, wrong); },
                           {"`out`", "[3, 4]", "[4, 3]"});
  expect_error<ShapeError>([&] { cpu::unary(UnaryKind::exp, a, wrong); }, {"`out`", "[4, 3]"});
  Tensor bool_out = Tensor::empty({3, 4}, DType::boolean);
  expect_error<ShapeError>([&] { cpu::where(bool_out, a, b, out); }, {"`b` [5]"});
  expect_error<DTypeError>([&] { cpu::compare(CompareKind::less, a, a, out); }, {"`out`", "bool"});
  expect_error<DTypeError>([&] { cpu::where(a, a, a, out); }, {"`cond`"});
  Tensor ints = integers(rng_, {3, 4}, DType::i32, 0, 0);
  Tensor int_out = Tensor::empty({3, 4}, DType::i32);
  expect_error<ValueError>([&] { cpu::binary(BinaryKind::div, ints, ints, int_out); },
                           {"division by zero"});
  expect_error<DTypeError>([&] { cpu::unary(UnaryKind::exp, ints, out); }, {"`in`", "i32"});

  // matmul
  Tensor mm_out = Tensor::empty({3, 6}, DType::f32);
  const Tensor w = normal(rng_, {5, 6}, DType::f32);
  expect_error<ShapeError>([&] { cpu::matmul(a, w, mm_out); }, {"inner", "[3, 4]", "[5, 6]"});
  expect_error<ShapeError>([&] { cpu::matmul(a, w, mm_out, true); }, {"`a` [3, 4]", "`b` [5, 6]"});
  expect_error<ShapeError>([&] { cpu::matmul(b, w, mm_out); }, {"`a`", "rank >= 2"});
  const Tensor w4 = normal(rng_, {4, 6}, DType::f32);
  Tensor bad_out = Tensor::empty({3, 7}, DType::f32);
  expect_error<ShapeError>([&] { cpu::matmul(a, w4, bad_out); }, {"`out`", "[3, 6]", "[3, 7]"});
  const Tensor batch_a = normal(rng_, {2, 3, 4}, DType::f32);
  const Tensor batch_b = normal(rng_, {5, 4, 6}, DType::f32);
  Tensor batch_out = Tensor::empty({2, 3, 6}, DType::f32);
  expect_error<ShapeError>([&] { cpu::matmul(batch_a, batch_b, batch_out); },
                           {"`a` [2]", "`b` [5]"});

  // reduce / softmax
  Tensor red_out = Tensor::empty({3}, DType::f32);
  expect_error<ShapeError>([&] { cpu::reduce(ReduceKind::sum, a, 0, false, red_out); },
                           {"`out`", "[4]", "[3]"});
  expect_error<ShapeError>([&] { cpu::reduce(ReduceKind::sum, a, 2, false, red_out); }, {"axis"});
  Tensor empty_in = Tensor::empty({3, 0}, DType::f32);
  expect_error<ShapeError>([&] { cpu::reduce(ReduceKind::max, empty_in, 1, false, red_out); },
                           {"empty"});
  expect_error<ShapeError>([&] { cpu::softmax(a, 0, wrong); }, {"`out`"});

  // concat / gather / write_at
  expect_error<ValueError>([&] { cpu::concat({}, 0, out); }, {"`inputs`"});
  expect_error<ShapeError>([&] { cpu::concat({a, b}, 0, out); }, {"`inputs[1]`", "[5]"});
  expect_error<ShapeError>([&] { cpu::concat({a, a}, 0, out); }, {"sum to 6", "[3, 4]"});
  const Tensor table = normal(rng_, {11, 4}, DType::bf16);
  Tensor indices = integers(rng_, {2, 3}, DType::i32, 0, 10);
  indices.set({1, 2}, 11);
  Tensor gathered = Tensor::empty({2, 3, 4}, DType::bf16);
  gathered.fill(7.0);
  expect_error<ValueError>([&] { cpu::gather(table, indices, gathered); },
                           {"`indices`[1, 2]", "is 11", "[0, 11)"});
  for (std::int64_t i = 0; i < gathered.numel(); ++i) EXPECT_EQ(gathered.at_linear(i), 7.0);
  indices.set({1, 2}, -1);
  expect_error<ValueError>([&] { cpu::gather(table, indices, gathered); }, {"is -1"});
  expect_error<DTypeError>([&] { cpu::gather(table, a, gathered); }, {"`indices`"});
  Tensor bad_gather = Tensor::empty({2, 3, 5}, DType::bf16);
  indices.set({1, 2}, 0);
  expect_error<ShapeError>([&] { cpu::gather(table, indices, bad_gather); },
                           {"`out`", "[2, 3, 4]"});
  Tensor state = normal(rng_, {2, 10, 8}, DType::bf16);
  const Tensor state_before = state.contiguous();
  const Tensor value = normal(rng_, {2, 3, 8}, DType::bf16);
  expect_error<ValueError>([&] { cpu::write_at(state, value, 1, 8); },
                           {"[8, 11)", "`state` [2, 10, 8]"});
  expect_error<ValueError>([&] { cpu::write_at(state, value, 1, -1); }, {"[-1, 2)"});
  expect_error<ShapeError>(
      [&] {
        cpu::write_at(state, normal(rng_, {2, 3, 7}, DType::bf16), 1, 0);
      },
      {"`value` [2, 3, 7]"});
  EXPECT_TRUE(bit_equal(state, state_before));
  expect_error<ShapeError>([&] { cpu::cast(a, wrong); }, {"`out`"});

  // Devices and missing tensors: a borrowed "device" view is never dereferenced.
  float host[12] = {};
  Tensor on_device = Tensor::borrow(host, {3, 4}, DType::f32, {}, Device::cuda(0));
  expect_error<DeviceError>([&] { cpu::binary(BinaryKind::add, a, on_device, out); },
                            {"`b`", "cuda:0"});
  expect_error<DeviceError>([&] { cpu::matmul(a, w4, on_device); }, {"`out`", "cuda:0"});
  expect_error<ValueError>([&] { cpu::unary(UnaryKind::exp, Tensor(), out); }, {"`in`"});
  Tensor undefined;
  expect_error<ValueError>([&] { cpu::softmax(a, 1, undefined); }, {"`out`"});
  expect_error<ShapeError>([&] { cpu::iota(out, 2); }, {"axis"});
}

}  // namespace
}  // namespace splice
