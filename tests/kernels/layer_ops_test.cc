// CPU kernels of the fused layer ops (RmsNorm, SiluMul, Rope) against float64 references, and
// every validation error of the kernels and the public ops.
//
//  1. Grid: row lengths 1 (2 for rope), 17 (18), 97 (98), 4095 (4096) x rows 1, 3 x bf16 / f16 /
//     f32 x contiguous or padded operands (padding NaN: a stray read shows up as NaN) x, for
//     rms_norm, an output dtype other than x's; rope also at positions 0, an interior row and the
//     tables' last row, on a permuted head view [B, heads, 1, D] of a [B, 1, heads, D] buffer.
//  2. References in float64 from the same storage-rounded inputs: rms_norm
//     y = x / sqrt(mean(x^2) + eps) * w; silu_mul y = round(silu(a)) * b (the intermediate rounding
//     is part of the contract); rope with tables rounded to their storage dtype.
//  3. Outputs compare with the contract row's tolerance for the output dtype; the padding around a
//     padded output must stay NaN (untouched).
//  4. Errors: shapes, dtypes, non-unit last stride, position range, devices, and the public op's
//     contract check (a row without the op refuses it, naming it).
#include "splice/backend/cpu/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::close;
using testing::padded_tensor;

constexpr std::int64_t kPad = 3;
constexpr float kEps = 1e-5f;
const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const std::int64_t kRowLengths[] = {1, 17, 97, 4095};
const std::int64_t kRowCounts[] = {1, 3};

// A tensor of `shape` with N(0, stddev) entries, contiguous or padded (NaN padding).
Tensor make_input(Rng& rng, const Dims& shape, DType dtype, bool padded, double stddev = 1.0) {
  Tensor src = testing::random_tensor(rng, shape, dtype, stddev);
  if (!padded) return src;
  Tensor t = padded_tensor(shape, dtype, kPad);
  t.copy_from(src);
  return t;
}

Tensor make_output(const Dims& shape, DType dtype, bool padded) {
  if (padded) return padded_tensor(shape, dtype, kPad);
  Tensor t = Tensor::empty(shape, dtype);
  t.fill(std::nan(""));
  return t;
}

// True when every element of the padded storage outside `view` is still NaN.
bool padding_untouched(const Tensor& view, const Dims& shape) {
  // The storage is [shape + pad] with an unpadded last axis; rebuild that base view.
  Dims padded = shape;
  for (auto& d : padded) d += kPad;
  padded.back() = shape.back();
  const Tensor base =
      Tensor::view_of(view.storage(), 0, padded, Tensor::contiguous_strides(padded), view.dtype());
  for (std::int64_t i = 0; i < base.numel(); ++i) {
    Dims index(padded.size());
    std::int64_t rest = i;
    bool inside = true;
    for (std::size_t d = padded.size(); d-- > 0;) {
      index[d] = rest % padded[d];
      rest /= padded[d];
      inside &= index[d] < shape[d];
    }
    if (!inside && !std::isnan(base.at(index))) return false;
  }
  return true;
}

std::int64_t rows_of(const Dims& shape) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  return rows;
}

// ---- float64 references
// --------------------------------------------------------------------------

Tensor reference_rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const std::int64_t h = x.size(-1), rows = rows_of(x.shape());
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t j = 0; j < h; ++j) ss += x.at_linear(r * h + j) * x.at_linear(r * h + j);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (std::int64_t j = 0; j < h; ++j)
      y.set_linear(r * h + j, x.at_linear(r * h + j) * inv * w.at_linear(j));
  }
  return y;
}

Tensor reference_silu_mul(const Tensor& a, const Tensor& b, DType out_dtype) {
  Tensor y = Tensor::empty(a.shape(), DType::f32);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double z = a.at_linear(i);
    const double s = round_to(out_dtype, static_cast<float>(z / (1.0 + std::exp(-z))));
    y.set_linear(i, s * b.at_linear(i));
  }
  return y;
}

Tensor reference_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t p) {
  const std::int64_t d = x.size(-1), half = d / 2, rows = rows_of(x.shape());
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < d; ++i) {
      const double xi = x.at_linear(r * d + i);
      const double rot = i < half ? -x.at_linear(r * d + i + half) : x.at_linear(r * d + i - half);
      y.set_linear(r * d + i, xi * cos.at({p, i}) + rot * sin.at({p, i}));
    }
  return y;
}

// ---- grids
// -----------------------------------------------------------------------------------------

TEST(LayerOpsCpu, RmsNormMatchesFloat64Reference) {
  Rng rng(101);
  int cases = 0;
  for (DType dtype : kDtypes)
    for (std::int64_t h : kRowLengths)
      for (std::int64_t rows : kRowCounts)
        for (bool padded : {false, true}) {
          // Every other case writes a dtype other than x's (the node's dtype may differ).
          const DType out_dtype = (cases % 2) ? DType::f32 : dtype;
          const Dims shape{rows, 1, h};
          const Tensor x = make_input(rng, shape, dtype, padded);
          Tensor w = testing::random_tensor(rng, {h}, dtype, 0.1, 1.0);
          Tensor out = make_output(shape, out_dtype, padded);
          cpu::rms_norm(x, w, kEps, out);
          const Tensor want = reference_rms_norm(x, w, kEps);
          EXPECT_TRUE(close(out, want, default_tolerance(out_dtype)))
              << dtype_name(dtype) << "->" << dtype_name(out_dtype) << " rows " << rows << " H "
              << h << (padded ? " padded" : "");
          if (padded) {
            EXPECT_TRUE(padding_untouched(out, shape));
          }
          ++cases;
        }
  EXPECT_EQ(cases, 48);
}

TEST(LayerOpsCpu, SiluMulMatchesFloat64Reference) {
  Rng rng(202);
  for (DType dtype : kDtypes)
    for (std::int64_t n : kRowLengths)
      for (std::int64_t rows : kRowCounts)
        for (bool padded : {false, true}) {
          const Dims shape{rows, 1, n};
          // gate projections reach |a| ~ 10 in real models: cover the saturated silu tails.
          const Tensor a = make_input(rng, shape, dtype, padded, 4.0);
          const Tensor b = make_input(rng, shape, dtype, !padded);
          Tensor out = make_output(shape, dtype, padded);
          cpu::silu_mul(a, b, out);
          EXPECT_TRUE(close(out, reference_silu_mul(a, b, dtype), default_tolerance(dtype)))
              << dtype_name(dtype) << " rows " << rows << " n " << n;
          if (padded) {
            EXPECT_TRUE(padding_untouched(out, shape));
          }
        }
}

TEST(LayerOpsCpu, RopeMatchesFloat64ReferenceOnPermutedHeads) {
  Rng rng(303);
  constexpr std::int64_t kMaxSeq = 37;
  for (DType dtype : kDtypes)
    for (std::int64_t len : kRowLengths)
      for (std::int64_t heads : kRowCounts)
        for (std::int64_t p : {std::int64_t{0}, std::int64_t{17}, kMaxSeq - 1}) {
          const std::int64_t d = len + len % 2;  // even head dims 2, 18, 98, 4096
          Tensor cos = testing::random_tensor(rng, {kMaxSeq, d}, DType::f32);
          Tensor sin = testing::random_tensor(rng, {kMaxSeq, d}, DType::f32);
          // [B, 1, heads, D] buffer seen as [B, heads, 1, D] (what the model's heads_of makes).
          const Tensor buffer = testing::random_tensor(rng, {2, 1, heads, d}, dtype);
          const Tensor x = buffer.permute({0, 2, 1, 3});
          Tensor position = Tensor::empty({1}, DType::i32);
          position.data<std::int32_t>()[0] = static_cast<std::int32_t>(p);
          Tensor out = make_output({2, heads, 1, d}, dtype, p == 17);
          cpu::rope(x, cos, sin, position, out);
          EXPECT_TRUE(close(out, reference_rope(x, cos, sin, p), default_tolerance(dtype)))
              << dtype_name(dtype) << " heads " << heads << " D " << d << " p " << p;
        }
}

// silu_mul does the primitive region's exact fp32 operations and its intermediate rounding.
TEST(LayerOpsCpu, SiluMulIsBitwiseThePrimitiveFormula) {
  Rng rng(404);
  const Tensor a = testing::random_tensor(rng, {4, 33}, DType::bf16, 3.0);
  const Tensor b = testing::random_tensor(rng, {4, 33}, DType::bf16);
  Tensor got = Tensor::empty({4, 33}, DType::bf16), want = Tensor::empty({4, 33}, DType::bf16);
  cpu::silu_mul(a, b, got);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const float z = static_cast<float>(a.at_linear(i));
    const float s = round_to(DType::bf16, z / (1.0f + std::exp(-z)));
    want.set_linear(i, s * static_cast<float>(b.at_linear(i)));
  }
  EXPECT_TRUE(testing::bit_equal(got, want));
}

// ---- errors
// ----------------------------------------------------------------------------------------

template <typename E, typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LayerOpsCpu, ArgumentErrorsNameTheArgument) {
  Rng rng(5);
  const Tensor x = testing::random_tensor(rng, {2, 8}, DType::bf16);
  const Tensor w = testing::random_tensor(rng, {8}, DType::bf16);
  Tensor out = Tensor::empty({2, 8}, DType::bf16);
  expect_error<ShapeError>(
      [&] { cpu::rms_norm(x, testing::random_tensor(rng, {7}, DType::bf16), kEps, out); },
      "`weight`");
  Tensor wrong_out = Tensor::empty({2, 9}, DType::bf16);
  expect_error<ShapeError>([&] { cpu::rms_norm(x, w, kEps, wrong_out); }, "out");
  expect_error<ValueError>([&] { cpu::rms_norm(x, w, -1.0f, out); }, "`eps`");
  expect_error<DTypeError>(
      [&] {
        cpu::rms_norm(Tensor::zeros({2, 8}, DType::i32), w, kEps, out);
      },
      "`x`");
  const Tensor strided = testing::random_tensor(rng, {8, 2}, DType::bf16).permute({1, 0});
  expect_error<LayoutError>([&] { cpu::rms_norm(strided, w, kEps, out); }, "unit stride");
  expect_error<ShapeError>(
      [&] {
        cpu::silu_mul(x, testing::random_tensor(rng, {2, 4}, DType::bf16), out);
      },
      "`b`");
  const Tensor cos = testing::random_tensor(rng, {4, 8}, DType::f32);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = 4;
  expect_error<ValueError>([&] { cpu::rope(x, cos, cos, pos, out); }, "`position` 4");
  pos.data<std::int32_t>()[0] = -1;
  expect_error<ValueError>([&] { cpu::rope(x, cos, cos, pos, out); }, "`position` -1");
  pos.data<std::int32_t>()[0] = 0;
  expect_error<DTypeError>([&] { cpu::rope(x, cos, cos, Tensor::zeros({1}, DType::i64), out); },
                           "`position`");
  expect_error<ShapeError>(
      [&] {
        cpu::rope(x, testing::random_tensor(rng, {4, 6}, DType::f32), cos, pos, out);
      },
      "`cos`");
  const Tensor odd = testing::random_tensor(rng, {2, 7}, DType::bf16);
  Tensor odd_out = Tensor::empty({2, 7}, DType::bf16);
  expect_error<ShapeError>([&] { cpu::rope(odd, cos, cos, pos, odd_out); }, "even");
  // The public ops route CPU tensors to these kernels with the same errors.
  Tensor f32_out = Tensor::empty({2, 8}, DType::f32);
  expect_error<DTypeError>([&] { fused_rope(x, cos, cos, pos, f32_out); }, "`out`");
  // One dtype where the header says so: silu_mul's a, b and out; rope's cos and sin.
  expect_error<DTypeError>([&] { cpu::silu_mul(x, x.to(DType::f32), out); },
                           "`b` must have a's dtype bf16, got f32");
  expect_error<DTypeError>([&] { cpu::silu_mul(x, x, f32_out); }, "`out` must have a's dtype");
  expect_error<DTypeError>([&] { cpu::rope(x, cos, cos.to(DType::bf16), pos, out); },
                           "`sin` must have cos's dtype f32, got bf16");
  // An output whose rows share one address (an expanded view) would be written by racing rows.
  Tensor one_row = Tensor::empty({1, 8}, DType::bf16);
  Tensor racing = one_row.expand({2, 8});
  expect_error<LayoutError>([&] { cpu::rms_norm(x, w, kEps, racing); }, "share an address");
  expect_error<LayoutError>([&] { cpu::silu_mul(x, x, racing); }, "share an address");
  expect_error<LayoutError>([&] { cpu::rope(x, cos, cos, pos, racing); }, "share an address");
  // The contract row's refusal names the argument and the dtypes the row takes.
  expect_error<UnsupportedError>(
      [&] {
        fused_rms_norm(Tensor::zeros({2, 8}, DType::i32), w, kEps, out);
      },
      "`x` must be bf16, f16, f32 for the cpu kernel 'layer_ops', got i32");
}

TEST(LayerOpsCpu, PublicOpsCheckTheContractRow) {
  const LayerOpContract& row = cpu_layer_ops_contract();
  EXPECT_EQ(row.backend, "cpu");
  for (LayerOpKind k : {LayerOpKind::rms_norm, LayerOpKind::silu_mul, LayerOpKind::rope})
    EXPECT_TRUE(row.supports(k)) << layer_op_name(k);
  for (DType d : kDtypes) EXPECT_TRUE(row.supports_dtype(d));
  EXPECT_EQ(cuda_layer_ops_contract().backend, "cuda");
  Rng rng(6);
  const Tensor a = testing::random_tensor(rng, {3, 40}, DType::f16);
  const Tensor b = testing::random_tensor(rng, {3, 40}, DType::f16);
  Tensor via_op = Tensor::empty({3, 40}, DType::f16), direct = Tensor::empty({3, 40}, DType::f16);
  fused_silu_mul(a, b, via_op);
  cpu::silu_mul(a, b, direct);
  EXPECT_TRUE(testing::bit_equal(via_op, direct));
  Tensor x = testing::random_tensor(rng, {3, 40}, DType::f32);
  Tensor w = testing::random_tensor(rng, {40}, DType::f32);
  Tensor y1 = Tensor::empty({3, 40}, DType::f32), y2 = Tensor::empty({3, 40}, DType::f32);
  fused_rms_norm(x, w, kEps, y1);
  cpu::rms_norm(x, w, kEps, y2);
  EXPECT_TRUE(testing::bit_equal(y1, y2));
  expect_error<ValueError>([&] { fused_rms_norm(x, Tensor(), kEps, y1); }, "`weight`");
}

}  // namespace
}  // namespace splice
