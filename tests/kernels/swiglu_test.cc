// rms_norm_matmul_swiglu (Op::RmsNormMatMulSwiglu) on the CPU against its decomposition:
// fused_rms_norm_matmul into a [..., M, 2I] gate|up temporary of out's dtype, then fused_silu_mul
// of its two halves (the decomposed graph's RmsNormMatMul and SiluMul nodes).
//
//  1. Grid: bf16 / f16 / f32 x rows M 1, 3 (x [M, 1, K] and [1, M, K]) x K 64, 576, 1536 x
//     I 17, 192, 1536; out bit for bit against the two-op chain.
//  2. A strided out view (every other row of a wider buffer) and a [2, 3, K] x of two leading
//     axes.
//  3. Errors: shape, dtype and eps mismatches, each a typed error naming the argument.
//  4. The contract rows: both backends list the op for every float dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr float kEps = 1e-5f;

struct Operands {
  Tensor x, norm_weight, w;  // x [..., M, K], norm_weight [K], w [2I, K]
};

// x ~ N(0, 1), norm_weight ~ 1 + N(0, 0.1), w ~ N(0, 1 / sqrt(K)) (gate|up values of order 1,
// so silu sees both signs and its saturating tails).
Operands make_operands(const Dims& x_shape, std::int64_t inter, DType dtype, Rng& rng) {
  const std::int64_t k = x_shape.back();
  Operands o;
  o.x = testing::random_tensor(rng, x_shape, dtype);
  o.norm_weight = testing::random_tensor(rng, {k}, dtype, 0.1, 1.0);
  o.w = testing::random_tensor(rng, {2 * inter, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
  return o;
}

// The decomposed chain: y = rms_norm_matmul(x) [..., 2I] in `dtype`, then silu_mul of its halves.
Tensor decomposed(const Operands& o, DType dtype) {
  const std::int64_t inter = o.w.size(0) / 2;
  Dims y_shape = o.x.shape();
  y_shape.back() = 2 * inter;
  Tensor y = Tensor::empty(y_shape, dtype);  // [..., M, 2I]
  fused_rms_norm_matmul(o.x, o.norm_weight, kEps, o.w, y);
  const std::int64_t last = y.dim() - 1;
  Dims out_shape = o.x.shape();
  out_shape.back() = inter;
  Tensor out = Tensor::empty(out_shape, dtype);  // [..., M, I]
  fused_silu_mul(y.slice(last, 0, inter), y.slice(last, inter, 2 * inter), out);
  return out;
}

void check_case(const Dims& x_shape, std::int64_t inter, DType dtype, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + dims_str(x_shape) + " I " +
               std::to_string(inter));
  const Operands o = make_operands(x_shape, inter, dtype, rng);
  const Tensor expected = decomposed(o, dtype);
  Tensor out = Tensor::empty(expected.shape(), dtype);
  fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, out);
  EXPECT_TRUE(testing::bit_equal(out, expected));
  // The same values through the CPU kernel directly.
  Tensor direct = Tensor::empty(expected.shape(), dtype);
  cpu::rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, direct);
  EXPECT_TRUE(testing::bit_equal(direct, expected));
}

TEST(SwigluCpu, BitwiseRmsNormMatMulThenSiluMul) {
  Rng rng(71);
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (std::int64_t m : {1, 3})
      for (std::int64_t k : {64, 576, 1536})
        for (std::int64_t inter : {17, 192, 1536}) {
          check_case({m, 1, k}, inter, dtype, rng);  // [B, 1, K]: M decode rows of one token
          if (m > 1) check_case({1, m, k}, inter, dtype, rng);
        }
}

TEST(SwigluCpu, LeadingAxesAndStridedOut) {
  Rng rng(72);
  check_case({2, 3, 576}, 192, DType::bf16, rng);
  // out a strided view: rows of a [3, 1, 2I] buffer's first I columns.
  const Operands o = make_operands({3, 1, 64}, 17, DType::bf16, rng);
  const Tensor expected = decomposed(o, DType::bf16);
  Tensor buffer = testing::random_tensor(rng, {3, 1, 34}, DType::bf16);
  Tensor out = buffer.slice(2, 0, 17);
  const Tensor tail = buffer.slice(2, 17, 34).clone();
  fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, out);
  EXPECT_TRUE(testing::bit_equal(out, expected));
  EXPECT_TRUE(testing::bit_equal(buffer.slice(2, 17, 34), tail));  // untouched
}

TEST(SwigluCpu, BadInputsRaiseTypedErrors) {
  Rng rng(73);
  const Operands o = make_operands({1, 1, 64}, 17, DType::bf16, rng);
  Tensor out = Tensor::empty({1, 1, 17}, DType::bf16);
  // w with an odd row count (no gate|up halves).
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w.slice(0, 0, 33), out),
               ShapeError);
  // out of the product's width instead of I.
  Tensor wide = Tensor::empty({1, 1, 34}, DType::bf16);
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, wide), ShapeError);
  // norm weight of the wrong length, x of rank 1.
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x, o.norm_weight.slice(0, 0, 32), kEps, o.w, out),
               ShapeError);
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x.reshape({64}), o.norm_weight, kEps, o.w, out),
               ShapeError);
  // An integer out, a negative epsilon.
  Tensor int_out = Tensor::empty({1, 1, 17}, DType::i32);
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, int_out), DTypeError);
  EXPECT_THROW(fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, -1.0f, o.w, out), ValueError);
  // The messages name the op, the argument and the value seen.
  try {
    fused_rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w.slice(0, 0, 33), out);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rms_norm_matmul_swiglu"), std::string::npos) << what;
    EXPECT_NE(what.find("`w`"), std::string::npos) << what;
    EXPECT_NE(what.find("33"), std::string::npos) << what;
  }
}

TEST(SwigluCpu, ContractRows) {
  for (const LayerOpContract* row : {&cpu_layer_ops_contract(), &cuda_layer_ops_contract()}) {
    SCOPED_TRACE(row->backend);
    EXPECT_TRUE(row->supports(LayerOpKind::rms_norm_matmul_swiglu));
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      EXPECT_TRUE(row->supports_dtype(dtype));
  }
  EXPECT_STREQ(layer_op_name(LayerOpKind::rms_norm_matmul_swiglu), "rms_norm_matmul_swiglu");
}

}  // namespace
}  // namespace splice
