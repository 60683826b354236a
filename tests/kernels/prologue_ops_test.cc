// The CPU kernels of the two prologue products (cpu::rms_norm_matmul, cpu::silu_mul_matmul_add):
// each is the composition of existing CPU kernels, so it must be BITWISE that chain, and the
// public ops must route to it and check their contract row.
//
//  1. rms_norm_matmul == cpu::rms_norm into a temporary of w's dtype, then cpu::matmul (w^T): the
//     RmsNorm -> MatMul region's kernels. Grid: K in {64, 576, 97} x N in {1, 17, 96} x x shapes
//     {[1, 1, K], [3, K], [2, 3, K] permuted from [3, 2, K] (strided rows)} x bf16 / f16 / f32 x
//     out in the operands' dtype or f32 x norm weight in the operands' dtype or f32.
//  2. silu_mul_matmul_add == cpu::silu_mul, cpu::matmul into fp32, cpu::binary add of c (and
//     within tolerance of cpu::matmul_add after the same silu_mul), over the same grid with a and b
//     last-axis views of one [.., 2K] gate|up tensor (the builders' layout), c in the operands'
//     dtype or f32, and c = out (the identical view: h += ...).
//  3. A float64 check of rms_norm_matmul (the normalized row rounded to w's dtype, then the
//     product) within the contract tolerance, so a composition of two wrong kernels cannot pass.
//  4. Errors: shapes (w not [N, K], c not the product's shape, norm weight not [K]), dtypes (w
//     not a's dtype for silu_mul_matmul_add), rank-1 x, the contract row (a row without the op
//     is an UnsupportedError through the public op).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"
#include "splice/ir/op.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const std::int64_t kKGrid[] = {64, 97, 576};
const std::int64_t kNGrid[] = {1, 17, 96};
constexpr float kEps = 1e-5f;

// x rows of length k in three layouts: [1, 1, K], [3, K], and a strided [2, 3, K] view (the
// permute of a contiguous [3, 2, K]).
std::vector<Tensor> x_layouts(Rng& rng, std::int64_t k, DType dtype, std::int64_t width = 0) {
  const std::int64_t w = width ? width : k;
  std::vector<Tensor> out;
  out.push_back(testing::random_tensor(rng, {1, 1, w}, dtype));
  out.push_back(testing::random_tensor(rng, {3, w}, dtype));
  out.push_back(testing::random_tensor(rng, {3, 2, w}, dtype).permute({1, 0, 2}));
  return out;
}

Dims product_shape(const Tensor& x, std::int64_t n) {
  Dims d = x.shape();
  d.back() = n;
  return d;
}

TEST(RmsNormMatMulCpu, IsBitwiseRmsNormThenMatmul) {
  Rng rng(11);
  int cases = 0;
  for (DType dtype : kDtypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (const Tensor& x : x_layouts(rng, k, dtype))
          for (DType out_dtype : {dtype, DType::f32}) {
            const DType norm_dtype = cases % 2 ? DType::f32 : dtype;
            const Tensor norm = testing::random_tensor(rng, {k}, norm_dtype, 0.3, 1.0);
            const Tensor w = testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(k));
            Tensor got = Tensor::empty(product_shape(x, n), out_dtype);
            cpu::rms_norm_matmul(x, norm, kEps, w, got);
            Tensor normalized = Tensor::empty(x.shape(), dtype);
            cpu::rms_norm(x, norm, kEps, normalized);
            Tensor want = Tensor::empty(product_shape(x, n), out_dtype);
            cpu::matmul(normalized, w, want, /*transpose_b=*/true);
            ASSERT_TRUE(testing::bit_equal(got, want))
                << dtype_name(dtype) << " k " << k << " n " << n << " x " << dims_str(x.shape())
                << " out " << dtype_name(out_dtype);
            // The public op takes the same path on the CPU.
            Tensor via_op = Tensor::empty(product_shape(x, n), out_dtype);
            fused_rms_norm_matmul(x, norm, kEps, w, via_op);
            ASSERT_TRUE(testing::bit_equal(via_op, want));
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 3 * 3 * 3 * 2);
}

TEST(RmsNormMatMulCpu, AgreesWithAFloat64Reference) {
  Rng rng(12);
  for (DType dtype : kDtypes)
    for (std::int64_t k : {64, 576}) {
      const std::int64_t n = 33;
      const Tensor x = testing::random_tensor(rng, {2, k}, dtype);
      const Tensor norm = testing::random_tensor(rng, {k}, dtype, 0.3, 1.0);
      const Tensor w = testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(k));
      Tensor got = Tensor::empty({2, n}, dtype);
      cpu::rms_norm_matmul(x, norm, kEps, w, got);
      Tensor ref = Tensor::empty({2, n}, DType::f32);
      for (std::int64_t r = 0; r < 2; ++r) {
        double ss = 0;
        for (std::int64_t i = 0; i < k; ++i) ss += x.at({r, i}) * x.at({r, i});
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(k) + kEps);
        std::vector<double> row(static_cast<std::size_t>(k));
        for (std::int64_t i = 0; i < k; ++i)  // the RmsNorm node's output, in w's dtype
          row[i] = round_to(dtype, static_cast<float>(x.at({r, i}) * inv * norm.at({i})));
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t i = 0; i < k; ++i) s += row[i] * w.at({j, i});
          ref.set({r, j}, s);
        }
      }
      // The normalized row may round one ulp apart (fp32 vs f64 inv), a few flips per row.
      Tolerance tol = default_tolerance(dtype);
      if (dtype != DType::f32) tol.atol *= 4;
      EXPECT_TRUE(testing::close(got, ref, tol)) << dtype_name(dtype) << " k " << k;
    }
}

TEST(SiluMulMatMulAddCpu, IsBitwiseSiluMulMatmulThenAdd) {
  Rng rng(13);
  int cases = 0;
  for (DType dtype : kDtypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (const Tensor& gate_up : x_layouts(rng, k, dtype, 2 * k))
          for (DType c_dtype : {dtype, DType::f32}) {
            // a, b: the gate and up halves of one [..., 2K] projection output (views).
            const std::int64_t last = gate_up.dim() - 1;
            const Tensor a = gate_up.slice(last, 0, k), b = gate_up.slice(last, k, 2 * k);
            const Tensor w = testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(k));
            const Tensor c = testing::random_tensor(rng, product_shape(a, n), c_dtype);
            Tensor got = Tensor::empty(product_shape(a, n), dtype);
            cpu::silu_mul_matmul_add(a, b, w, c, got);
            Tensor act = Tensor::empty(a.shape(), dtype);
            cpu::silu_mul(a, b, act);
            Tensor product = Tensor::empty(product_shape(a, n), DType::f32);
            cpu::matmul(act, w, product, /*transpose_b=*/true);
            Tensor want = Tensor::empty(product_shape(a, n), dtype);
            cpu::binary(cpu::BinaryKind::add, c, product, want);
            ASSERT_TRUE(testing::bit_equal(got, want))
                << dtype_name(dtype) << " k " << k << " n " << n << " a " << dims_str(a.shape());
            // The MatMulAdd kernel computes the same definition in another summation order.
            Tensor other = Tensor::empty(product_shape(a, n), dtype);
            cpu::matmul_add(act, w, c, other);
            ASSERT_TRUE(testing::close(got, other, cpu_layer_ops_contract().tolerance(dtype)));
            // In place (out = c, the identical view) and through the public op.
            if (c_dtype == dtype) {
              Tensor h = c.clone();
              fused_silu_mul_matmul_add(a, b, w, h, h);
              ASSERT_TRUE(testing::bit_equal(h, want));
            }
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 3 * 3 * 3 * 2);
}

TEST(PrologueOpsCpu, ValidationErrors) {
  Rng rng(14);
  const DType bf = DType::bf16;
  const Tensor x = testing::random_tensor(rng, {2, 64}, bf);
  const Tensor norm = testing::random_tensor(rng, {64}, bf);
  const Tensor w = testing::random_tensor(rng, {8, 64}, bf);
  Tensor out = Tensor::empty({2, 8}, bf);
  EXPECT_NO_THROW(cpu::rms_norm_matmul(x, norm, kEps, w, out));
  const Tensor w_bad = testing::random_tensor(rng, {8, 32}, bf);
  EXPECT_THROW(cpu::rms_norm_matmul(x, norm, kEps, w_bad, out), ShapeError);
  const Tensor norm_bad = testing::random_tensor(rng, {32}, bf);
  EXPECT_THROW(cpu::rms_norm_matmul(x, norm_bad, kEps, w, out), ShapeError);
  Tensor out_bad = Tensor::empty({2, 9}, bf);
  EXPECT_THROW(cpu::rms_norm_matmul(x, norm, kEps, w, out_bad), ShapeError);
  const Tensor x1 = testing::random_tensor(rng, {64}, bf);
  Tensor out1 = Tensor::empty({8}, bf);
  EXPECT_THROW(cpu::rms_norm_matmul(x1, norm, kEps, w, out1), ShapeError);
  EXPECT_THROW(cpu::rms_norm_matmul(x, norm, -1.0f, w, out), ValueError);

  const Tensor b = testing::random_tensor(rng, {2, 64}, bf);
  const Tensor c = testing::random_tensor(rng, {2, 8}, bf);
  EXPECT_NO_THROW(cpu::silu_mul_matmul_add(x, b, w, c, out));
  const Tensor w32 = testing::random_tensor(rng, {8, 64}, DType::f32);
  EXPECT_THROW(cpu::silu_mul_matmul_add(x, b, w32, c, out), DTypeError);
  const Tensor c_bad = testing::random_tensor(rng, {2, 9}, bf);
  EXPECT_THROW(cpu::silu_mul_matmul_add(x, b, w, c_bad, out), ShapeError);
  const Tensor b_bad = testing::random_tensor(rng, {2, 32}, bf);
  EXPECT_THROW(cpu::silu_mul_matmul_add(x, b_bad, w, c, out), ShapeError);
  // Every operand float, b and w in a's dtype, each error naming its argument (c and out reach
  // an elementwise add that would call them `a` and `out` of its own, or store integers).
  const auto expect_dtype_error = [&](const Tensor& bb, const Tensor& cc, Tensor& oo,
                                      const std::string& needle) {
    try {
      cpu::silu_mul_matmul_add(x, bb, w, cc, oo);
      ADD_FAILURE() << needle << ": accepted";
    } catch (const DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Tensor out_i32 = Tensor::zeros({2, 8}, DType::i32);
  expect_dtype_error(b, Tensor::zeros({2, 8}, DType::i32), out, "`c`");
  expect_dtype_error(b, c, out_i32, "`out`");
  expect_dtype_error(b.to(DType::f32), c, out, "`b` must have a's dtype bf16, got f32");
  // out over a is refused (out may be c itself: h += down_proj(...)).
  Tensor shared = testing::random_tensor(rng, {2, 64}, bf);
  Tensor out_over_a = shared.slice(1, 0, 8);
  EXPECT_THROW(cpu::silu_mul_matmul_add(shared, b, w, c, out_over_a), LayoutError);
  Tensor h = c.clone();
  EXPECT_NO_THROW(cpu::silu_mul_matmul_add(x, b, w, h, h));
}

TEST(PrologueOpsCpu, ContractRowsListBothOps) {
  for (const LayerOpContract* row : {&cpu_layer_ops_contract(), &cuda_layer_ops_contract()}) {
    EXPECT_TRUE(row->supports(LayerOpKind::rms_norm_matmul)) << row->backend;
    EXPECT_TRUE(row->supports(LayerOpKind::silu_mul_matmul_add)) << row->backend;
  }
  EXPECT_STREQ(layer_op_name(LayerOpKind::rms_norm_matmul), "rms_norm_matmul");
  EXPECT_STREQ(layer_op_name(LayerOpKind::silu_mul_matmul_add), "silu_mul_matmul_add");
  EXPECT_STREQ(op_name(Op::RmsNormMatMul), "rms_norm_matmul");
  EXPECT_STREQ(op_name(Op::SiluMulMatMulAdd), "silu_mul_matmul_add");
}

}  // namespace
}  // namespace splice
