// CUDA primitive kernels (splice/backend/cuda/primitives.h) against the CPU backend, the oracle.
//
//  1. Every op runs on fresh random inputs (never zeros) of odd sizes (1, 17, 97, and a 4097-long
//     row for the row kernels), each dtype it takes, in three layouts on the device: contiguous,
//     padded (NaN-poisoned gaps between rows) and transposed (memory order reversed); outputs
//     are written in the same layouts. A device tensor is made by copying a CPU tensor's whole
//     storage (poison included) and viewing it with the same offset and strides.
//  2. The CPU backend computes the same op on the same (rounded) inputs into a contiguous output;
//     results agree within default_tolerance(out dtype) (design.md §2), copies bit for bit.
//  3. Broadcasting (leading, middle and inner ones), softmax rows with -inf and fully masked rows,
//     matmul batch broadcasting / transpose_b / strided operands / mixed dtypes / k = 0, write_at
//     with its offset read from device memory, and the typed errors of bad calls.
#include "splice/backend/cuda/primitives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "splice/backend/cpu/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

using cpu::BinaryKind;
using cpu::CompareKind;
using cpu::ReduceKind;
using cpu::UnaryKind;

constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kPad = 3;
constexpr std::int64_t kSizes[] = {1, 17, 97};

enum class Layout { contiguous, padded, transposed };
constexpr Layout kLayouts[] = {Layout::contiguous, Layout::padded, Layout::transposed};
const char* layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::padded ? "padded" : "transposed";
}

// An uninitialized CPU tensor of `shape` in `layout` (memory outside the view is NaN).
Tensor host(const Dims& shape, DType dtype, Layout layout) {
  switch (layout) {
    case Layout::contiguous:
      return Tensor::empty(shape, dtype);
    case Layout::padded:
      return testing::padded_tensor(shape, dtype, kPad);
    case Layout::transposed: {
      const Dims reversed(shape.rbegin(), shape.rend());
      Tensor base = Tensor::empty(reversed, dtype);
      poison_nan(base);
      std::vector<std::int64_t> perm;
      for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d)
        perm.push_back(d);
      return base.permute(perm);
    }
  }
  return {};
}

using testing::download;
using testing::upload;

Tensor normal(Rng& rng, const Dims& shape, DType dtype, Layout layout = Layout::contiguous,
              double stddev = 1.0, double mean = 0.0) {
  Tensor t = host(shape, dtype, layout);
  rng.normal(t, mean, stddev);
  return t;
}

Tensor uniform(Rng& rng, const Dims& shape, DType dtype, double lo, double hi,
               Layout layout = Layout::contiguous) {
  Tensor t = host(shape, dtype, layout);
  rng.uniform(t, lo, hi);
  return t;
}

Tensor integers(Rng& rng, const Dims& shape, DType dtype, std::int64_t lo, std::int64_t hi,
                Layout layout = Layout::contiguous) {
  Tensor t = host(shape, dtype, layout);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.set_linear(i, static_cast<double>(rng.integer(lo, hi)));
  return t;
}

// Runs `gpu` into a device output of `layout` and `cpu_fn` into a contiguous CPU output, then
// compares (bitwise when `exact`).
::testing::AssertionResult agree(const Dims& out_shape, DType out_dtype, Layout layout,
                                 const std::function<void(Tensor&)>& cpu_fn,
                                 const std::function<void(Tensor&)>& gpu_fn, bool exact = false) {
  Tensor expected = Tensor::empty(out_shape, out_dtype);
  cpu_fn(expected);
  Tensor device_out = upload(host(out_shape, out_dtype, layout));
  gpu_fn(device_out);
  const Tensor actual = download(device_out);
  if (exact || !is_floating(out_dtype)) return testing::bit_equal(actual, expected);
  return testing::close(actual, expected, default_tolerance(out_dtype));
}

std::string where_am_i(const char* op, DType dtype, Layout layout, const Dims& shape) {
  return std::string(op) + " " + dtype_name(dtype) + " " + layout_name(layout) + " " +
         dims_str(shape);
}

// ---- elementwise ----------------------------------------------------------------------------

TEST(CudaPrimitives, UnaryEveryKindDtypeSizeAndLayout) {
  SKIP_WITHOUT_GPU();
  Rng rng(1);
  const UnaryKind kinds[] = {UnaryKind::exp,        UnaryKind::log,     UnaryKind::neg,
                             UnaryKind::abs,        UnaryKind::sqrt,    UnaryKind::rsqrt,
                             UnaryKind::reciprocal, UnaryKind::sigmoid, UnaryKind::silu,
                             UnaryKind::softplus,   UnaryKind::tanh};
  for (UnaryKind kind : kinds)
    for (DType dtype : kFloatTypes)
      for (std::int64_t n : kSizes)
        for (Layout layout : kLayouts) {
          const Dims shape = {3, n};
          const bool positive = kind == UnaryKind::log || kind == UnaryKind::sqrt ||
                                kind == UnaryKind::rsqrt || kind == UnaryKind::reciprocal;
          const Tensor in = positive ? uniform(rng, shape, dtype, 0.25, 4.0, layout)
                                     : normal(rng, shape, dtype, layout, 3.0);
          const Tensor din = upload(in);
          EXPECT_TRUE(agree(
              shape, dtype, layout, [&](Tensor& o) { cpu::unary(kind, in, o); },
              [&](Tensor& o) { cuda::unary(kind, din, o); }))
              << where_am_i("unary", dtype, layout, shape) << " kind " << static_cast<int>(kind);
        }
}

TEST(CudaPrimitives, BinaryBroadcastingFloatsAndInts) {
  SKIP_WITHOUT_GPU();
  Rng rng(2);
  const BinaryKind kinds[] = {BinaryKind::add, BinaryKind::sub,     BinaryKind::mul,
                              BinaryKind::div, BinaryKind::minimum, BinaryKind::maximum};
  const std::pair<Dims, Dims> shapes[] = {{{17, 97}, {97}},
                                          {{3, 1, 17}, {1, 5, 17}},
                                          {{1}, {97}},
                                          {{2, 17, 1}, {2, 1, 1}},
                                          {{1, 1}, {1, 1}}};
  for (BinaryKind kind : kinds)
    for (const auto& [sa, sb] : shapes) {
      Dims out_shape = sa.size() >= sb.size() ? sa : sb;
      for (std::size_t i = 0; i < out_shape.size(); ++i) {
        const std::size_t ia = i + sa.size() - out_shape.size(),
                          ib = i + sb.size() - out_shape.size();
        const std::int64_t x = ia < sa.size() ? sa[ia] : 1, y = ib < sb.size() ? sb[ib] : 1;
        out_shape[i] = std::max(x, y);
      }
      for (DType dtype : kFloatTypes)
        for (Layout layout : kLayouts) {
          const Tensor a = normal(rng, sa, dtype, layout);
          const Tensor b = kind == BinaryKind::div ? uniform(rng, sb, dtype, 0.5, 2.0, layout)
                                                   : normal(rng, sb, dtype, layout);
          const Tensor da = upload(a), db = upload(b);
          EXPECT_TRUE(agree(
              out_shape, dtype, layout, [&](Tensor& o) { cpu::binary(kind, a, b, o); },
              [&](Tensor& o) { cuda::binary(kind, da, db, o); }))
              << where_am_i("binary", dtype, layout, out_shape) << " kind "
              << static_cast<int>(kind);
        }
      for (DType dtype : {DType::i32, DType::i64}) {
        const Tensor a = integers(rng, sa, dtype, -1000, 1000);
        const Tensor b = kind == BinaryKind::div ? integers(rng, sb, dtype, 1, 37)
                                                 : integers(rng, sb, dtype, -1000, 1000);
        const Tensor da = upload(a), db = upload(b);
        EXPECT_TRUE(agree(
            out_shape, dtype, Layout::padded, [&](Tensor& o) { cpu::binary(kind, a, b, o); },
            [&](Tensor& o) { cuda::binary(kind, da, db, o); }))
            << where_am_i("binary", dtype, Layout::padded, out_shape);
      }
      // Mixed: an int operand with a float one computes in fp32.
      const Tensor a = integers(rng, sa, DType::i64, -50, 50);
      const Tensor b = uniform(rng, sb, DType::bf16, 0.5, 2.0);
      const Tensor da = upload(a), db = upload(b);
      EXPECT_TRUE(agree(
          out_shape, DType::f32, Layout::contiguous, [&](Tensor& o) { cpu::binary(kind, a, b, o); },
          [&](Tensor& o) { cuda::binary(kind, da, db, o); }))
          << "mixed i64 x bf16 " << dims_str(out_shape);
    }
}

TEST(CudaPrimitives, CompareAndWhere) {
  SKIP_WITHOUT_GPU();
  Rng rng(3);
  const CompareKind kinds[] = {CompareKind::less,    CompareKind::less_equal,
                               CompareKind::greater, CompareKind::greater_equal,
                               CompareKind::equal,   CompareKind::not_equal};
  for (CompareKind kind : kinds)
    for (DType dtype : {DType::f32, DType::bf16, DType::i32, DType::i64})
      for (Layout layout : kLayouts) {
        // Small integer values so that equal elements occur.
        const Tensor a = integers(rng, {17, 97}, dtype, -3, 3, layout);
        const Tensor b = integers(rng, {97}, dtype == DType::i32 ? DType::f32 : dtype, -3, 3);
        const Tensor da = upload(a), db = upload(b);
        EXPECT_TRUE(agree(
            {17, 97}, DType::boolean, layout, [&](Tensor& o) { cpu::compare(kind, a, b, o); },
            [&](Tensor& o) { cuda::compare(kind, da, db, o); }))
            << where_am_i("compare", dtype, layout, {17, 97});
      }
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i64})
    for (Layout layout : kLayouts) {
      Tensor cond = host({17, 1}, DType::boolean, Layout::contiguous);
      for (std::int64_t i = 0; i < 17; ++i)
        cond.set_linear(i, static_cast<double>(rng.integer(0, 1)));
      const Tensor a = integers(rng, {17, 97}, dtype, -100, 100, layout);
      const Tensor b = normal(rng, {97}, DType::f32);
      const Tensor dc = upload(cond), da = upload(a), db = upload(b);
      EXPECT_TRUE(agree(
          {17, 97}, dtype, layout, [&](Tensor& o) { cpu::where(cond, a, b, o); },
          [&](Tensor& o) { cuda::where(dc, da, db, o); }))
          << where_am_i("where", dtype, layout, {17, 97});
    }
}

TEST(CudaPrimitives, IotaFillAndCastEveryDtypePair) {
  SKIP_WITHOUT_GPU();
  Rng rng(4);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64})
    for (std::int64_t axis : {0, 1, -1})
      for (Layout layout : kLayouts)
        EXPECT_TRUE(agree(
            {17, 3, 97}, dtype, layout, [&](Tensor& o) { cpu::iota(o, axis, 2.0, 3.0); },
            [&](Tensor& o) { cuda::iota(o, axis, 2.0, 3.0); }))
            << where_am_i("iota", dtype, layout, {17, 3, 97}) << " axis " << axis;
  const DType all[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean};
  for (DType from : all)
    for (DType to : all)
      for (Layout layout : kLayouts) {
        const Tensor in = is_floating(from)
                              ? normal(rng, {17, 97}, from, layout, 50.0)
                              : integers(rng, {17, 97}, from, from == DType::boolean ? 0 : -1000,
                                         from == DType::boolean ? 1 : 1000, layout);
        const Tensor din = upload(in);
        EXPECT_TRUE(agree(
            {17, 97}, to, Layout::padded, [&](Tensor& o) { cpu::cast(in, o); },
            [&](Tensor& o) { cuda::cast(din, o); }, true))
            << "cast " << dtype_name(from) << " -> " << dtype_name(to) << " "
            << layout_name(layout);
      }
  Tensor ones = upload(host({5, 7}, DType::bf16, Layout::padded));
  cuda::fill(ones, 1.5);
  const Tensor back = download(ones);
  for (std::int64_t i = 0; i < back.numel(); ++i) EXPECT_EQ(back.at_linear(i), 1.5);
}

// ---- reductions and softmax -------------------------------------------------------------------

TEST(CudaPrimitives, ReduceEveryKindAxisAndDtype) {
  SKIP_WITHOUT_GPU();
  Rng rng(5);
  for (ReduceKind kind : {ReduceKind::sum, ReduceKind::max, ReduceKind::mean})
    for (DType dtype : kFloatTypes)
      for (Layout layout : kLayouts)
        for (std::int64_t axis : {0, 1, 2})
          for (bool keepdim : {false, true}) {
            const Dims shape = {3, 17, 97};
            Dims out_shape;
            for (std::int64_t d = 0; d < 3; ++d)
              if (d != axis)
                out_shape.push_back(shape[d]);
              else if (keepdim)
                out_shape.push_back(1);
            // Mean 1 keeps sums away from cancellation, where fp32 reassociation error
            // (~n 2^-24 sum|x|) could exceed the f32 atol without any kernel being wrong.
            const Tensor in = normal(rng, shape, dtype, layout, 1.0, 1.0);
            const Tensor din = upload(in);
            EXPECT_TRUE(agree(
                out_shape, dtype, Layout::contiguous,
                [&](Tensor& o) { cpu::reduce(kind, in, axis, keepdim, o); },
                [&](Tensor& o) { cuda::reduce(kind, din, axis, keepdim, o); }))
                << where_am_i("reduce", dtype, layout, shape) << " kind " << static_cast<int>(kind)
                << " axis " << axis << " keepdim " << keepdim;
          }
  // One long row (4097, past a warp's stride many times) and an f32 result of bf16 input.
  const Tensor in = normal(rng, {2, 4097}, DType::bf16, Layout::contiguous, 1.0, 1.0);
  const Tensor din = upload(in);
  EXPECT_TRUE(agree(
      {2}, DType::f32, Layout::contiguous,
      [&](Tensor& o) { cpu::reduce(ReduceKind::sum, in, 1, false, o); },
      [&](Tensor& o) { cuda::reduce(ReduceKind::sum, din, 1, false, o); }));
  Tensor empty = upload(host({3, 0}, DType::f32, Layout::contiguous));
  Tensor out = upload(host({3}, DType::f32, Layout::contiguous));
  EXPECT_THROW(cuda::reduce(ReduceKind::max, empty, 1, false, out), ShapeError);
}

TEST(CudaPrimitives, SoftmaxWithMaskedRowsEveryDtypeAndLayout) {
  SKIP_WITHOUT_GPU();
  Rng rng(6);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloatTypes)
    for (Layout layout : kLayouts)
      for (std::int64_t n : {1L, 17L, 97L, 4097L}) {
        Tensor in = normal(rng, {5, n}, dtype, layout, 4.0);
        for (std::int64_t j = 0; j < n; j += 3) in.set({1, j}, -kInf);  // partly masked
        for (std::int64_t j = 0; j < n; ++j) in.set({3, j}, -kInf);     // fully masked: zeros
        const Tensor din = upload(in);
        for (std::int64_t axis : {1, 0})
          EXPECT_TRUE(agree(
              {5, n}, dtype, layout, [&](Tensor& o) { cpu::softmax(in, axis, o); },
              [&](Tensor& o) { cuda::softmax(din, axis, o); }))
              << where_am_i("softmax", dtype, layout, {5, n}) << " axis " << axis;
      }
  // In place.
  const Tensor in = normal(rng, {4, 33}, DType::f32);
  Tensor expected = Tensor::empty({4, 33}, DType::f32);
  cpu::softmax(in, 1, expected);
  Tensor inplace = upload(in);
  cuda::softmax(inplace, 1, inplace);
  EXPECT_TRUE(testing::close(download(inplace), expected, default_tolerance(DType::f32)));
}

// ---- matmul -----------------------------------------------------------------------------------

struct MatmulCase {
  Dims a, b;
  bool transpose_b;
};

Dims matmul_shape(const Dims& a, const Dims& b, bool tb) {
  const std::size_t rank = std::max(a.size(), b.size());
  Dims out(rank - 2, 1);
  for (std::size_t i = 0; i + 2 < rank; ++i) {
    const std::size_t ia = i + a.size() - rank, ib = i + b.size() - rank;
    const std::int64_t x = i + a.size() >= rank ? a[ia] : 1, y = i + b.size() >= rank ? b[ib] : 1;
    out[i] = std::max(x, y);
  }
  out.push_back(a[a.size() - 2]);
  out.push_back(tb ? b[b.size() - 2] : b.back());
  return out;
}

TEST(CudaPrimitives, MatmulThroughCublasLtAgainstCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(7);
  const MatmulCase cases[] = {
      {{1, 17}, {17, 97}, false},             // decode GEMV
      {{1, 1, 97}, {97, 17}, false},          // rank-3 activations x a weight
      {{17, 33}, {97, 33}, true},             // transpose_b
      {{3, 17, 33}, {33, 97}, false},         // batch of a, b broadcast
      {{2, 1, 5, 17}, {1, 3, 17, 9}, false},  // both batch dims broadcast
      {{4, 1, 64}, {4, 97, 64}, true},        // decode scores q . k^T
      {{4, 1, 97}, {4, 97, 64}, false},       // decode probs . v
      {{1, 1}, {1, 1}, false},
  };
  for (const MatmulCase& c : cases)
    for (DType dtype : kFloatTypes)
      for (Layout layout : kLayouts) {
        // Means of 0.5 keep the dot products away from cancellation, where the fp32
        // reassociation error (~k 2^-24 sum|a||b|) of two valid summation orders could exceed
        // the f32 atol.
        const Tensor a = normal(rng, c.a, dtype, layout, 1.0, 0.5);
        const Tensor b = normal(rng, c.b, dtype,
                                layout == Layout::padded ? Layout::transposed : layout, 1.0, 0.5);
        const Tensor da = upload(a), db = upload(b);
        const Dims out_shape = matmul_shape(c.a, c.b, c.transpose_b);
        for (DType out_dtype : {dtype, DType::f32})
          EXPECT_TRUE(agree(
              out_shape, out_dtype, layout == Layout::transposed ? Layout::padded : layout,
              [&](Tensor& o) { cpu::matmul(a, b, o, c.transpose_b); },
              [&](Tensor& o) { cuda::matmul(da, db, o, c.transpose_b); }))
              << "matmul " << dims_str(c.a) << " x " << dims_str(c.b) << " tb " << c.transpose_b
              << " " << dtype_name(dtype) << " -> " << dtype_name(out_dtype) << " "
              << layout_name(layout);
      }
  // Mixed dtypes and k = 0.
  const Tensor a = normal(rng, {5, 17}, DType::bf16), b = normal(rng, {17, 9}, DType::f32);
  const Tensor da = upload(a), db = upload(b);
  EXPECT_TRUE(agree(
      {5, 9}, DType::bf16, Layout::contiguous, [&](Tensor& o) { cpu::matmul(a, b, o); },
      [&](Tensor& o) { cuda::matmul(da, db, o); }));
  const Tensor a0 = upload(host({5, 0}, DType::f32, Layout::contiguous));
  const Tensor b0 = upload(host({0, 9}, DType::f32, Layout::contiguous));
  Tensor zeros = upload(normal(rng, {5, 9}, DType::f32));
  cuda::matmul(a0, b0, zeros);
  const Tensor z = download(zeros);
  for (std::int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.at_linear(i), 0.0);
}

// ---- copies -----------------------------------------------------------------------------------

TEST(CudaPrimitives, ConcatGatherAndWriteAtAreBitExact) {
  SKIP_WITHOUT_GPU();
  Rng rng(8);
  for (DType dtype : kFloatTypes)
    for (Layout layout : kLayouts) {
      const Tensor x = normal(rng, {3, 17, 5}, dtype, layout), y = normal(rng, {3, 1, 5}, dtype);
      const Tensor z = normal(rng, {3, 97, 5}, DType::f32, layout);  // converted on the way
      const Tensor dx = upload(x), dy = upload(y), dz = upload(z);
      EXPECT_TRUE(agree(
          {3, 115, 5}, dtype, layout,
          [&](Tensor& o) {
            cpu::concat({x, y, z}, 1, o);
          },
          [&](Tensor& o) {
            cuda::concat({dx, dy, dz}, 1, o);
          },
          true))
          << where_am_i("concat", dtype, layout, {3, 115, 5});

      const Tensor table = normal(rng, {97, 17}, dtype, layout);
      const Tensor dtable = upload(table);
      for (DType index_dtype : {DType::i32, DType::i64}) {
        const Tensor idx = integers(rng, {2, 5}, index_dtype, 0, 96, layout);
        const Tensor didx = upload(idx);
        for (DType out_dtype : {dtype, DType::f32})
          EXPECT_TRUE(agree(
              {2, 5, 17}, out_dtype, layout, [&](Tensor& o) { cpu::gather(table, idx, o); },
              [&](Tensor& o) { cuda::gather(dtable, didx, o); }, true))
              << where_am_i("gather", dtype, layout, {2, 5, 17});
      }

      // write_at: host offset and device offset agree with the CPU, the rest of the state intact.
      const Tensor state = normal(rng, {2, 3, 97, 16}, dtype, layout);
      const Tensor value = normal(rng, {2, 3, 1, 16}, dtype);
      const Tensor dvalue = upload(value);
      for (std::int64_t offset : {0L, 45L, 96L}) {
        Tensor expected = state.clone();
        cpu::write_at(expected, value, 2, offset);
        Tensor host_offset = upload(state);
        cuda::write_at(host_offset, dvalue, 2, offset);
        EXPECT_TRUE(testing::bit_equal(download(host_offset), expected)) << "offset " << offset;
        for (DType offset_dtype : {DType::i32, DType::i64}) {
          Tensor o = Tensor::empty({1}, offset_dtype);
          o.set({0}, static_cast<double>(offset));
          const Tensor device_offset = upload(o);
          Tensor device_written = upload(state);
          cuda::write_at(device_written, dvalue, 2, device_offset);
          EXPECT_TRUE(testing::bit_equal(download(device_written), expected))
              << "device offset " << offset << " " << dtype_name(offset_dtype);
        }
      }
      Tensor target = upload(state);
      EXPECT_THROW(cuda::write_at(target, dvalue, 2, 97), ValueError);
    }
}

// ---- errors -----------------------------------------------------------------------------------

TEST(CudaPrimitives, BadCallsRaiseTypedErrors) {
  SKIP_WITHOUT_GPU();
  Rng rng(9);
  const Tensor host_a = normal(rng, {4, 8}, DType::f32);
  const Tensor a = upload(host_a), b = upload(normal(rng, {8, 3}, DType::f32));
  Tensor out = upload(host({4, 3}, DType::f32, Layout::contiguous));
  EXPECT_THROW(cuda::matmul(host_a, b, out), DeviceError);
  EXPECT_THROW(cuda::matmul(a, a, out), ShapeError);
  Tensor wrong = upload(host({4, 4}, DType::f32, Layout::contiguous));
  EXPECT_THROW(cuda::matmul(a, b, wrong), ShapeError);
  Tensor ints = upload(host({4, 8}, DType::i32, Layout::contiguous));
  Tensor fout = upload(host({4, 8}, DType::f32, Layout::contiguous));
  EXPECT_THROW(cuda::unary(UnaryKind::exp, ints, fout), DTypeError);
  EXPECT_THROW(cuda::binary(BinaryKind::add, a, b, out), ShapeError);
  EXPECT_THROW(cuda::unary(UnaryKind::exp, Tensor(), fout), ValueError);
  try {
    cuda::binary(BinaryKind::add, a, b, out);
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 8]"), std::string::npos) << e.what();
  }
}

// Outputs that share memory are refused before any launch, by the checks the CPU backend runs
// (splice::check_no_self_overlap / check_no_overlap): an expanded out, an out overlapping an input
// anywhere but as its identical view, a reduce whose out starts inside its input, a write_at
// whose value meets its window (or, with a device offset, lies anywhere in the state). The
// identical view still updates in place.
TEST(CudaPrimitives, OutputsThatShareMemoryAreRefusedAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(10);
  const Tensor host_buf = normal(rng, {8, 16}, DType::f32);
  Tensor buf = upload(host_buf);                                  // [8, 16]
  Tensor top = buf.slice(0, 0, 4), shifted = buf.slice(0, 1, 5);  // [4, 16]: rows 0-3, 1-4
  Tensor expanded = buf.slice(0, 6, 7).expand({4, 16});           // row 6 four times
  const auto refused = [](const std::function<void()>& call, const std::string& needle) {
    testing::expect_error_with<LayoutError>(call, needle);
  };
  refused([&] { cuda::unary(UnaryKind::exp, top, shifted); }, "overlaps `in`");
  refused([&] { cuda::unary(UnaryKind::exp, top, expanded); }, "share an address");
  refused([&] { cuda::binary(BinaryKind::add, top, top, shifted); }, "overlaps `a`");
  refused([&] { cuda::cast(top, shifted); }, "overlaps `in`");
  refused([&] { cuda::softmax(top, 1, shifted); }, "overlaps `in`");
  Tensor sums = buf.select(0, 0).slice(0, 0, 4);  // [4]: the first floats of row 0
  refused([&] { cuda::reduce(ReduceKind::sum, top, 1, false, sums); }, "overlaps `in`");
  const Tensor b = upload(normal(rng, {16, 4}, DType::f32));
  Tensor product_in_a = top.slice(1, 0, 4);  // [4, 4] inside a's rows
  refused([&] { cuda::matmul(top, b, product_in_a); }, "overlaps `a`");
  Tensor gathered = buf.slice(0, 6, 8);  // [2, 16]
  const Tensor indices = upload(integers(rng, {2}, DType::i32, 0, 8));
  refused([&] { cuda::gather(buf, indices, gathered); }, "overlaps `table`");
  Tensor joined = buf.slice(0, 1, 5);  // [4, 16]: rows 1-4, over inputs[0]'s row 1
  refused(
      [&] {
        cuda::concat({buf.slice(0, 0, 2), buf.slice(0, 6, 8)}, 0, joined);
      },
      "overlaps `inputs[0]`");
  Tensor offset_host = Tensor::empty({1}, DType::i32);
  offset_host.data<std::int32_t>()[0] = 2;
  const Tensor offset = upload(offset_host);
  refused([&] { cuda::write_at(buf, buf.slice(0, 7, 8), 0, offset); }, "overlaps `value`");
  // Host offset: a value straddling rows 2 and 3 overlaps the window (row 2) it is written to.
  const Tensor straddling =
      Tensor::view_of(buf.storage(), buf.offset() + 40, {1, 16}, {16, 1}, DType::f32);
  refused([&] { cuda::write_at(buf, straddling, 0, 2); }, "`state window`");
  cuda::synchronize();
  EXPECT_TRUE(testing::bit_equal(download(buf), host_buf));
  // In place on the identical view: allowed, and the same as out of place.
  cuda::unary(UnaryKind::neg, top, top);
  Tensor negated = Tensor::empty({4, 16}, DType::f32);
  cpu::unary(UnaryKind::neg, host_buf.slice(0, 0, 4), negated);
  EXPECT_TRUE(testing::bit_equal(download(top), negated));
}

}  // namespace
}  // namespace splice
