// The CPU kernel of the MatMulAdd layer op (cpu::matmul_add: out = a @ b^T + c, the fp32 sum
// plus c rounded once) against a float64 reference, and its validation errors.
//
//  1. Grid: K in {1, 7, 97, 576, 4095} x N in {1, 17, 96} x rows {[1, K], [3, K], [2, 3, K]} x
//     bf16 / f16 / f32 operands, c in the operands' dtype or f32, out in the operands' dtype;
//     contiguous or padded (NaN padding: a stray read or write shows up as NaN); and c = out (the
//     identical view: h += linear(x)).
//  2. Reference: float64 sum over the storage-rounded inputs plus c. The kernel sums in fp32, so
//     it differs from the reference by the fp32 summation error (about K * 2^-24 of sum |a b|) and
//     one rounding into out's dtype: the contract row's tolerance for out's dtype covers both at
//     these sizes with inputs ~ N(0, 1 / sqrt(K)) weights.
//  3. Errors: shapes (b not [N, K], c not the product's shape), dtypes (b in a's), non-unit last
//     stride of a, out overlapping a or itself; the public op's broadcasts of c (bias, column,
//     scalar).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/core/error.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::padded_tensor;

constexpr std::int64_t kPad = 3;
const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const std::int64_t kKGrid[] = {1, 7, 97, 576, 4095};
const std::int64_t kNGrid[] = {1, 17, 96};

// A tensor of `shape` with N(0, stddev) entries, contiguous or padded (NaN padding).
Tensor make_input(Rng& rng, const Dims& shape, DType dtype, bool padded, double stddev = 1.0) {
  if (!padded) return testing::random_tensor(rng, shape, dtype, stddev);
  Tensor t = padded_tensor(shape, dtype, kPad);
  rng.normal(t, 0.0, stddev);
  return t;
}

// float64: out[r, j] = sum_k a[r, k] b[j, k] + c[r, j] over a [..., K] rows, as an f64 [rows, N].
std::vector<double> reference(const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::int64_t k = a.size(-1), n = b.size(0), rows = a.numel() / k;
  const Tensor ac = a.clone(), bc = b.clone(), cc = c.clone();  // contiguous
  std::vector<double> out(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < k; ++i) s += ac.at_linear(r * k + i) * bc.at_linear(j * k + i);
      out[static_cast<std::size_t>(r * n + j)] = s + cc.at_linear(r * n + j);
    }
  return out;
}

::testing::AssertionResult matches(const Tensor& out, const std::vector<double>& ref) {
  const Tensor o = out.clone();
  const Tolerance tol = cpu_layer_ops_contract().tolerance(out.dtype());
  for (std::int64_t i = 0; i < o.numel(); ++i) {
    const double got = o.at_linear(i), want = ref[static_cast<std::size_t>(i)];
    if (!(std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want)))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got << ", float64 reference " << want;
  }
  return ::testing::AssertionSuccess();
}

TEST(MatMulAddKernel, GridAgainstFloat64) {
  Rng rng(5);
  for (DType dtype : kDtypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (const Dims& lead : {Dims{1}, Dims{3}, Dims{2, 3}})
          for (const bool padded : {false, true})
            for (const DType c_dtype : {dtype, DType::f32}) {
              const std::string name = std::string(dtype_name(dtype)) + " K " + std::to_string(k) +
                                       " N " + std::to_string(n) + " rows " + dims_str(lead) +
                                       (padded ? " padded" : "") + " c " + dtype_name(c_dtype);
              Dims a_shape = lead, y_shape = lead;
              a_shape.push_back(k);
              y_shape.push_back(n);
              const Tensor a = make_input(rng, a_shape, dtype, padded);
              const Tensor b =
                  make_input(rng, {n, k}, dtype, padded, 1.0 / std::sqrt(static_cast<double>(k)));
              const Tensor c = make_input(rng, y_shape, c_dtype, padded);
              const std::vector<double> ref = reference(a, b, c);
              Tensor out =
                  padded ? padded_tensor(y_shape, dtype, kPad) : Tensor::empty(y_shape, dtype);
              cpu::matmul_add(a, b, c, out);
              EXPECT_TRUE(matches(out, ref)) << name;
              if (c_dtype == dtype) {  // in place: c is out
                Tensor h = c.clone();
                cpu::matmul_add(a, b, h, h);
                EXPECT_TRUE(matches(h, ref)) << name << " in place";
              }
            }
}

TEST(MatMulAddKernel, PublicOpMatchesTheKernel) {
  Rng rng(6);
  const Tensor a = testing::random_tensor(rng, {1, 1, 64}, DType::bf16);
  const Tensor b = testing::random_tensor(rng, {32, 64}, DType::bf16, 0.125);
  const Tensor c = testing::random_tensor(rng, {1, 1, 32}, DType::bf16);
  Tensor want = Tensor::empty({1, 1, 32}, DType::bf16),
         got = Tensor::empty({1, 1, 32}, DType::bf16);
  cpu::matmul_add(a, b, c, want);
  fused_matmul_add(a, b, c, got, /*b_constant=*/true);
  EXPECT_TRUE(testing::bit_equal(got, want));
  EXPECT_TRUE(cpu_layer_ops_contract().supports(LayerOpKind::matmul_add));
  EXPECT_STREQ(layer_op_name(LayerOpKind::matmul_add), "matmul_add");
}

// The public op broadcasts a c of fewer dims (a bias [N]) over out's rows: bit for bit the kernel
// on the expanded view; a c that does not broadcast is a ShapeError naming it.
TEST(MatMulAddKernel, PublicOpBroadcastsABias) {
  Rng rng(8);
  const Tensor a = testing::random_tensor(rng, {2, 3, 64}, DType::bf16);       // [2, 3, K]
  const Tensor b = testing::random_tensor(rng, {32, 64}, DType::bf16, 0.125);  // [N, K]
  const Tensor bias = testing::random_tensor(rng, {32}, DType::bf16);          // [N]
  Tensor want = Tensor::empty({2, 3, 32}, DType::bf16), got = want.clone();    // [2, 3, N]
  cpu::matmul_add(a, b, bias.expand({2, 3, 32}), want);
  fused_matmul_add(a, b, bias, got);
  EXPECT_TRUE(testing::bit_equal(got, want));
  try {
    fused_matmul_add(a, b, testing::random_tensor(rng, {31}, DType::bf16), got);
    ADD_FAILURE() << "a c of 31 columns for 32 was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("`c` [31] does not broadcast"), std::string::npos)
        << e.what();
  }
}

// Any c that broadcasts to the product is read as the header says: a column [M, 1] and a scalar
// [1] (a stride-0 last axis, which the kernel reads at that stride), each against the kernel on
// the materialized c; and with a bias, a wrong `out` is blamed on `out`, not on c.
TEST(MatMulAddKernel, PublicOpBroadcastsAColumnAndAScalar) {
  Rng rng(9);
  const Tensor a = testing::random_tensor(rng, {3, 64}, DType::f32);          // [M, K]
  const Tensor b = testing::random_tensor(rng, {16, 64}, DType::f32, 0.125);  // [N, K]
  for (const Dims& c_shape : {Dims{3, 1}, Dims{1}}) {
    SCOPED_TRACE(dims_str(c_shape));
    const Tensor c = testing::random_tensor(rng, c_shape, DType::f32);
    Tensor want = Tensor::empty({3, 16}, DType::f32), got = want.clone();  // [M, N]
    cpu::matmul_add(a, b, c.expand({3, 16}).contiguous(), want);
    fused_matmul_add(a, b, c, got);
    EXPECT_TRUE(testing::bit_equal(got, want));
  }
  Tensor wrong_out = Tensor::empty({2, 16}, DType::f32);
  try {
    fused_matmul_add(a, b, testing::random_tensor(rng, {16}, DType::f32), wrong_out);
    ADD_FAILURE() << "an out of 2 rows for 3 was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("`out`"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("`c`"), std::string::npos) << e.what();
  }
}

TEST(MatMulAddKernel, Errors) {
  Rng rng(7);
  const Tensor a = testing::random_tensor(rng, {2, 8}, DType::f32);
  const Tensor b = testing::random_tensor(rng, {4, 8}, DType::f32);
  const Tensor c = testing::random_tensor(rng, {2, 4}, DType::f32);
  Tensor out = Tensor::empty({2, 4}, DType::f32);
  const Tensor b_wrong_k = testing::random_tensor(rng, {4, 7}, DType::f32);
  EXPECT_THROW(cpu::matmul_add(a, b_wrong_k, c, out), ShapeError);
  const Tensor b3 = testing::random_tensor(rng, {1, 4, 8}, DType::f32);
  EXPECT_THROW(cpu::matmul_add(a, b3, c, out), ShapeError);
  const Tensor c_wrong = testing::random_tensor(rng, {2, 5}, DType::f32);
  EXPECT_THROW(cpu::matmul_add(a, b, c_wrong, out), ShapeError);
  Tensor out_wrong = Tensor::empty({2, 5}, DType::f32);
  EXPECT_THROW(cpu::matmul_add(a, b, c, out_wrong), ShapeError);
  const Tensor a_int = Tensor::zeros({2, 8}, DType::i32);
  EXPECT_THROW(cpu::matmul_add(a_int, b, c, out), DTypeError);
  const Tensor a_t = testing::random_tensor(rng, {8, 2}, DType::f32).permute({1, 0});
  EXPECT_THROW(cpu::matmul_add(a_t, b, c, out), LayoutError);
  Tensor shared = Tensor::empty({2, 8}, DType::f32);
  Tensor out_over_a = shared.slice(1, 0, 4);
  EXPECT_THROW(cpu::matmul_add(shared, b, c, out_over_a), LayoutError);
  // b in a's dtype (the header's contract; CUDA's GEMMs need it too).
  try {
    cpu::matmul_add(a, b.to(DType::bf16), c, out);
    ADD_FAILURE() << "a bf16 b beside an f32 a was accepted";
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("`b` must have a's dtype f32, got bf16"),
              std::string::npos)
        << e.what();
  }
  // An out whose rows share one address (an expanded view) would be written by racing rows.
  Tensor one_row = Tensor::empty({1, 4}, DType::f32);
  Tensor racing = one_row.expand({2, 4});
  EXPECT_THROW(cpu::matmul_add(a, b, c, racing), LayoutError);
}

}  // namespace
}  // namespace splice
