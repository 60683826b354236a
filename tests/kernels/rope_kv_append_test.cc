// cpu::rope_kv_append (Op::RopeKvAppend's CPU kernel) against its decomposition: cpu::rope over
// the q and k heads of the q|k|v row, then the two cache-row copies (what the graph's arm 0 does
// with rope + two write_at).
//
//  1. Grid: batch 1, 2 x (Hq, Hkv) (1, 1), (4, 2), (3, 1) x D 2, 64, 128 x bf16 / f16 / f32 x
//     positions 0, an interior row and the last row; qkv also as a batch-strided view (the row of
//     a wider buffer); caches random in every row.
//  2. out and both caches bit for bit against the decomposition; every cache row but p unchanged.
//  3. Errors before any write: a position outside the caches or the tables, shape and dtype
//     mismatches (the caches stay as they were).
#include <gtest/gtest.h>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kCapacity = 11;  // cache rows (and table rows: max_seq_len)

struct Case {
  std::int64_t batch, heads, kv_heads, dim;
  DType dtype;
};

// [B, n, 1, D] heads of qkv [B, 1, (Hq + 2 Hkv) D] from head `first`.
Tensor heads_of(const Tensor& qkv, std::int64_t first, std::int64_t n, std::int64_t dim) {
  return Tensor::view_of(qkv.storage(), qkv.offset() + first * dim, {qkv.size(0), n, 1, dim},
                         {qkv.stride(0), dim, dim, 1}, qkv.dtype());
}

void check_case(const Case& c, std::int64_t position, bool strided, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " B " + std::to_string(c.batch) + " Hq " +
               std::to_string(c.heads) + " Hkv " + std::to_string(c.kv_heads) + " D " +
               std::to_string(c.dim) + " p " + std::to_string(position) +
               (strided ? " strided" : ""));
  const std::int64_t row = (c.heads + 2 * c.kv_heads) * c.dim;
  Tensor qkv = testing::random_tensor(rng, {c.batch, 1, row}, c.dtype);  // [B, 1, row]
  if (strided) {
    Tensor wide = testing::random_tensor(rng, {c.batch, 1, row + 8}, c.dtype);
    qkv = wide.slice(2, 0, row);
  }
  const Tensor cos = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
  const Tensor sin = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = static_cast<std::int32_t>(position);
  const Dims cache{c.batch, c.kv_heads, kCapacity, c.dim};  // [B, Hkv, capacity, D]
  Tensor k_cache = testing::random_tensor(rng, cache, c.dtype);
  Tensor v_cache = testing::random_tensor(rng, cache, c.dtype);
  Tensor k_expected = k_cache.clone(), v_expected = v_cache.clone();
  // The decomposition.
  Tensor qk = Tensor::empty({c.batch, c.heads + c.kv_heads, 1, c.dim}, c.dtype);
  cpu::rope(heads_of(qkv, 0, c.heads + c.kv_heads, c.dim), cos, sin, pos, qk);
  Tensor k_row = k_expected.slice(2, position, position + 1);
  k_row.copy_from(qk.slice(1, c.heads, c.heads + c.kv_heads));
  Tensor v_row = v_expected.slice(2, position, position + 1);
  v_row.copy_from(heads_of(qkv, c.heads + c.kv_heads, c.kv_heads, c.dim));
  // The fused kernel, through the public op.
  Tensor out = Tensor::empty({c.batch, c.heads, 1, c.dim}, c.dtype);
  fused_rope_kv_append(qkv, cos, sin, pos, k_cache, v_cache, out);
  EXPECT_TRUE(testing::bit_equal(out, qk.slice(1, 0, c.heads).clone()));
  EXPECT_TRUE(testing::bit_equal(k_cache, k_expected));
  EXPECT_TRUE(testing::bit_equal(v_cache, v_expected));
}

TEST(RopeKvAppendCpu, BitwiseTheRopeAndTwoWriteAtDecomposition) {
  Rng rng(17);
  const Case shapes[] = {{1, 1, 1, 2, DType::f32},
                         {2, 4, 2, 64, DType::f32},
                         {1, 3, 1, 128, DType::f32},
                         {2, 3, 1, 64, DType::f32}};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (Case c : shapes) {
      c.dtype = dtype;
      for (std::int64_t p : {std::int64_t{0}, kCapacity / 2, kCapacity - 1})
        for (bool strided : {false, true}) check_case(c, p, strided, rng);
    }
}

TEST(RopeKvAppendCpu, ErrorsBeforeAnyWrite) {
  Rng rng(3);
  const std::int64_t heads = 2, kv_heads = 1, dim = 8, row = (heads + 2 * kv_heads) * dim;
  const Tensor qkv = testing::random_tensor(rng, {1, 1, row}, DType::bf16);
  const Tensor cos = testing::random_tensor(rng, {kCapacity - 2, dim}, DType::f32);
  const Tensor sin = testing::random_tensor(rng, {kCapacity - 2, dim}, DType::f32);
  Tensor k_cache = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, DType::bf16);
  Tensor v_cache = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, DType::bf16);
  const Tensor k_before = k_cache.clone(), v_before = v_cache.clone();
  Tensor out = Tensor::empty({1, heads, 1, dim}, DType::bf16);
  Tensor pos = Tensor::empty({1}, DType::i32);
  for (std::int32_t p : {-1, static_cast<std::int32_t>(kCapacity),
                         static_cast<std::int32_t>(kCapacity - 2)}) {  // the last: past the tables
    pos.data<std::int32_t>()[0] = p;
    EXPECT_THROW(cpu::rope_kv_append(qkv, cos, sin, pos, k_cache, v_cache, out), ValueError) << p;
  }
  pos.data<std::int32_t>()[0] = 1;
  Tensor wrong_out = Tensor::empty({1, heads + 1, 1, dim}, DType::bf16);
  EXPECT_THROW(cpu::rope_kv_append(qkv, cos, sin, pos, k_cache, v_cache, wrong_out), ShapeError);
  Tensor f32_cache = Tensor::zeros({1, kv_heads, kCapacity, dim}, DType::f32);
  EXPECT_THROW(cpu::rope_kv_append(qkv, cos, sin, pos, f32_cache, v_cache, out), DTypeError);
  EXPECT_TRUE(testing::bit_equal(k_cache, k_before));
  EXPECT_TRUE(testing::bit_equal(v_cache, v_before));
}

}  // namespace
}  // namespace splice
