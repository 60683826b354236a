// rms_norm_matmul_rope_kv_append (Op::RmsNormMatMulRopeKvAppend) on the CPU against its two ops:
// fused_rms_norm_matmul into a q|k|v temporary of the caches' dtype, then fused_rope_kv_append.
//
//  1. Grid: (Hq, Hkv) (9, 3), (4, 4), (8, 2), (1, 1) x D 64, 128 (and 2) x K 576, 2048, 17 x
//     bf16 / f16 / f32 x positions 0, 17, capacity - 1; caches random in every row.
//  2. out and both caches bit for bit against the two-op chain; every other cache row untouched.
//  3. Errors before any write (the caches stay as they were): a position outside the caches or
//     the tables, shape, dtype and device mismatches, each a typed error naming the argument.
//  4. The contract rows: the CPU row takes every float dtype and shape; the CUDA row's qkv_rope
//     limits (bf16 / f16 of one dtype, K <= 2048 in whole 16-byte vectors, batch 1) and the
//     reasons it gives.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kCapacity = 40;  // cache rows (and table rows: max_seq_len)
constexpr float kEps = 1e-5f;

struct Case {
  std::int64_t heads, kv_heads, dim, k;
  DType dtype;
};

struct Operands {
  Tensor x, norm_weight, w, cos, sin, position, k_cache, v_cache;  // see make_operands
};

// x [1, 1, K], norm_weight [K] ~ 1 + N(0, 0.1), w [N, K] ~ N(0, 1 / sqrt(K)), tables
// [kCapacity, D], caches [1, Hkv, kCapacity, D] random in every row.
Operands make_operands(const Case& c, std::int64_t position, Rng& rng) {
  const std::int64_t n = (c.heads + 2 * c.kv_heads) * c.dim;
  Operands o;
  o.x = testing::random_tensor(rng, {1, 1, c.k}, c.dtype);
  o.norm_weight = testing::random_tensor(rng, {c.k}, c.dtype, 0.1, 1.0);
  o.w = testing::random_tensor(rng, {n, c.k}, c.dtype, 1.0 / std::sqrt(static_cast<double>(c.k)));
  o.cos = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
  o.sin = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
  o.position = Tensor::empty({1}, DType::i32);
  o.position.data<std::int32_t>()[0] = static_cast<std::int32_t>(position);
  const Dims cache{1, c.kv_heads, kCapacity, c.dim};  // [1, Hkv, capacity, D]
  o.k_cache = testing::random_tensor(rng, cache, c.dtype);
  o.v_cache = testing::random_tensor(rng, cache, c.dtype);
  return o;
}

void check_case(const Case& c, std::int64_t position, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " Hq " + std::to_string(c.heads) + " Hkv " +
               std::to_string(c.kv_heads) + " D " + std::to_string(c.dim) + " K " +
               std::to_string(c.k) + " p " + std::to_string(position));
  Operands o = make_operands(c, position, rng);
  // The two-op chain.
  Tensor k_expected = o.k_cache.clone(), v_expected = o.v_cache.clone();
  Tensor qkv = Tensor::empty({1, 1, o.w.size(0)}, c.dtype);  // [1, 1, N]
  fused_rms_norm_matmul(o.x, o.norm_weight, kEps, o.w, qkv);
  Tensor q_expected = Tensor::empty({1, c.heads, 1, c.dim}, c.dtype);
  fused_rope_kv_append(qkv, o.cos, o.sin, o.position, k_expected, v_expected, q_expected);
  // The fused op.
  Tensor out = Tensor::empty({1, c.heads, 1, c.dim}, c.dtype);
  const Tensor k_before = o.k_cache.clone();
  fused_rms_norm_matmul_rope_kv_append(o.x, o.norm_weight, kEps, o.w, o.cos, o.sin, o.position,
                                       o.k_cache, o.v_cache, out);
  EXPECT_TRUE(testing::bit_equal(out, q_expected));
  EXPECT_TRUE(testing::bit_equal(o.k_cache, k_expected));
  EXPECT_TRUE(testing::bit_equal(o.v_cache, v_expected));
  // Rows other than p untouched (the chain's caches prove it only if the chain is right).
  for (std::int64_t t = 0; t < kCapacity; ++t) {
    if (t == position) continue;
    EXPECT_TRUE(testing::bit_equal(o.k_cache.slice(2, t, t + 1), k_before.slice(2, t, t + 1)))
        << "row " << t;
  }
}

TEST(QkvRopeCpu, BitwiseRmsNormMatMulThenRopeKvAppend) {
  Rng rng(23);
  const std::pair<std::int64_t, std::int64_t> heads[] = {{9, 3}, {4, 4}, {8, 2}, {1, 1}};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (const auto& [hq, hkv] : heads)
      for (std::int64_t dim : {64, 128})
        for (std::int64_t k : {576, 2048})
          for (std::int64_t p : {std::int64_t{0}, std::int64_t{17}, kCapacity - 1})
            check_case({hq, hkv, dim, k, dtype}, p, rng);
  // Odd sizes: D = 2, K = 17.
  check_case({3, 1, 2, 17, DType::bf16}, 5, rng);
  check_case({2, 1, 2, 17, DType::f32}, kCapacity - 1, rng);
}

// Each bad call raises `E` before any write: the caches keep their bits.
template <typename E, typename Fn>
void expect_rejected(Operands& o, Fn&& call, const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor k_before = o.k_cache.clone(), v_before = o.v_cache.clone();
  EXPECT_THROW(call(), E);
  EXPECT_TRUE(testing::bit_equal(o.k_cache, k_before));
  EXPECT_TRUE(testing::bit_equal(o.v_cache, v_before));
}

TEST(QkvRopeCpu, BadInputsRaiseTypedErrorsAndLeaveTheCaches) {
  Rng rng(24);
  const Case c{4, 2, 64, 64, DType::bf16};
  Operands o = make_operands(c, 3, rng);
  Tensor out = Tensor::empty({1, c.heads, 1, c.dim}, c.dtype);
  auto run = [&](const Tensor& x, const Tensor& nw, const Tensor& w, const Tensor& cos,
                 const Tensor& pos, Tensor& k, Tensor& v, Tensor& y) {
    return [&, x, nw, w, cos, pos] {
      fused_rms_norm_matmul_rope_kv_append(x, nw, kEps, w, cos, cos, pos, k, v, y);
    };
  };
  for (std::int32_t bad : {-1, static_cast<std::int32_t>(kCapacity)}) {
    Tensor pos = Tensor::empty({1}, DType::i32);
    pos.data<std::int32_t>()[0] = bad;
    expect_rejected<ValueError>(o,
                                run(o.x, o.norm_weight, o.w, o.cos, pos, o.k_cache, o.v_cache, out),
                                "position " + std::to_string(bad));
  }
  // Fewer table rows than the position.
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = 20;
  expect_rejected<ValueError>(
      o, run(o.x, o.norm_weight, o.w, o.cos.slice(0, 0, 10), pos, o.k_cache, o.v_cache, out),
      "position past the tables");
  // w with a row count that is not (Hq + 2 Hkv) D.
  expect_rejected<ShapeError>(
      o,
      run(o.x, o.norm_weight, o.w.slice(0, 0, 330), o.cos, o.position, o.k_cache, o.v_cache, out),
      "w rows");
  // x of the wrong rank, norm weight of the wrong length.
  expect_rejected<ShapeError>(
      o,
      run(o.x.reshape({1, c.k}), o.norm_weight, o.w, o.cos, o.position, o.k_cache, o.v_cache, out),
      "x rank");
  expect_rejected<ShapeError>(
      o, run(o.x, o.norm_weight.slice(0, 0, 32), o.w, o.cos, o.position, o.k_cache, o.v_cache, out),
      "norm_weight length");
  // out of the wrong shape and dtype, v_cache of another dtype, a position of another dtype.
  Tensor wrong_out = Tensor::empty({1, c.heads + 1, 1, c.dim}, c.dtype);
  expect_rejected<ShapeError>(
      o, run(o.x, o.norm_weight, o.w, o.cos, o.position, o.k_cache, o.v_cache, wrong_out),
      "out shape");
  Tensor f32_out = Tensor::empty({1, c.heads, 1, c.dim}, DType::f32);
  expect_rejected<DTypeError>(
      o, run(o.x, o.norm_weight, o.w, o.cos, o.position, o.k_cache, o.v_cache, f32_out),
      "out dtype");
  Tensor f16_v = o.v_cache.to(DType::f16);
  {
    SCOPED_TRACE("v_cache dtype");
    const Tensor k_before = o.k_cache.clone();
    EXPECT_THROW(fused_rms_norm_matmul_rope_kv_append(o.x, o.norm_weight, kEps, o.w, o.cos, o.sin,
                                                      o.position, o.k_cache, f16_v, out),
                 DTypeError);
    EXPECT_TRUE(testing::bit_equal(o.k_cache, k_before));
  }
  expect_rejected<DTypeError>(o,
                              run(o.x, o.norm_weight, o.w, o.cos, Tensor::zeros({1}, DType::i64),
                                  o.k_cache, o.v_cache, out),
                              "position dtype");
  // A negative epsilon.
  {
    SCOPED_TRACE("eps");
    const Tensor k_before = o.k_cache.clone();
    EXPECT_THROW(fused_rms_norm_matmul_rope_kv_append(o.x, o.norm_weight, -1.0f, o.w, o.cos, o.sin,
                                                      o.position, o.k_cache, o.v_cache, out),
                 ValueError);
    EXPECT_TRUE(testing::bit_equal(o.k_cache, k_before));
  }
  // The messages name the argument and what is allowed.
  try {
    fused_rms_norm_matmul_rope_kv_append(o.x, o.norm_weight, kEps, o.w.slice(0, 0, 330), o.cos,
                                         o.sin, o.position, o.k_cache, o.v_cache, out);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rms_norm_matmul_rope_kv_append"), std::string::npos) << what;
    EXPECT_NE(what.find("`w`"), std::string::npos) << what;
    EXPECT_NE(what.find("330"), std::string::npos) << what;
  }
}

TEST(QkvRopeCpu, ContractRows) {
  const LayerOpContract& cpu_row = cpu_layer_ops_contract();
  EXPECT_TRUE(cpu_row.supports(LayerOpKind::rms_norm_matmul_rope_kv_append));
  EXPECT_EQ(cpu_row.qkv_rope_gate(DType::f32, DType::f32, DType::f32, DType::f32, 64, 4097, 4), "");
  const LayerOpContract& cuda_row = cuda_layer_ops_contract();
  EXPECT_TRUE(cuda_row.supports(LayerOpKind::rms_norm_matmul_rope_kv_append));
  const DType bf = DType::bf16;
  EXPECT_EQ(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 64, 576, 1), "");
  EXPECT_EQ(cuda_row.qkv_rope_gate(DType::f16, DType::f16, DType::f16, DType::f16, 128, 2048, 1),
            "");
  auto declines = [&](const std::string& why, const char* fragment) {
    EXPECT_NE(why.find(fragment), std::string::npos) << why;
  };
  declines(cuda_row.qkv_rope_gate(DType::f32, DType::f32, DType::f32, DType::f32, 64, 576, 1),
           "takes no `x` of dtype f32");
  declines(cuda_row.qkv_rope_gate(bf, DType::f32, bf, bf, 64, 576, 1), "of one dtype");
  declines(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 64, 4096, 1), "K <= 2048");
  declines(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 64, 580, 1), "multiple of 8");
  EXPECT_EQ(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 64, 576, 8), "");  // the multi-row kernel
  declines(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 64, 576, 9), "batch <= 8");
  declines(cuda_row.qkv_rope_gate(bf, bf, bf, bf, 63, 576, 1), "even head_dim");
}

}  // namespace
}  // namespace splice
