// cpu::rope_kv_append (Op::RopeKvAppend's CPU kernel) against its decomposition: cpu::rope over
// the q and k heads of the q|k|v row, then the two cache-row copies (what the graph's arm 0 does
// with rope + two write_at).
//
//  1. Grid: batch 1, 2 x (Hq, Hkv) (1, 1), (4, 2), (3, 1) x D 2, 64, 128 x bf16 / f16 / f32 x
//     positions 0, an interior row and the last row; qkv also as a batch-strided view (the row of
//     a wider buffer); caches random in every row.
//  2. out and both caches bit for bit against the decomposition; every cache row but p unchanged.
//  3. The CUDA kernel's index math (rope_kv_append_index, the map the kernel calls) run on the
//     host with the kernel's fp32 operations over the same grid, contiguous and with strided qkv
//     rows, cache rows and out heads: bit for bit cpu::rope_kv_append, every element of out and
//     of both cache rows p written exactly once, nothing else written.
//  4. Errors before any write: a position outside the caches or the tables, shape and dtype
//     mismatches (the caches stay as they were).
#include "splice/backend/cuda/rope_kv_append.h"  // rope_kv_append_index: the kernel's map

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

// ---- the CUDA kernel's index math, emulated on the host ----

// The CUDA kernel's loop on the host: rope_kv_append_index::item (the map the kernel itself
// calls) for every work item t, with the kernel's fp32 operations and stores. Counts the writes
// of every destination element in `writes` ([out, k_cache, v_cache] storages, from each view's
// first element).
void emulate_cuda_kernel(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                         std::int64_t position, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                         std::vector<std::int64_t> (&writes)[3]) {
  namespace ix = cuda::rope_kv_append_index;
  const ix::Geometry g = ix::geometry_of(qkv, k_cache, v_cache, out);
  // The operand's storage from its first element on (the kernel's raw_data() pointer).
  auto flat = [](const Tensor& t) {
    const auto elems = static_cast<std::int64_t>(t.storage()->bytes / dtype_size(t.dtype()));
    return Tensor::view_of(t.storage(), t.offset(), {elems - t.offset()}, {1}, t.dtype());
  };
  const Tensor x = flat(qkv);
  Tensor y_of[3] = {flat(out), flat(k_cache), flat(v_cache)};
  for (int target = 0; target < 3; ++target)
    writes[target].assign(static_cast<std::size_t>(y_of[target].numel()), 0);
  const std::int64_t half = g.dim / 2;
  for (long long t = 0; t < ix::items(g); ++t) {
    const ix::Item it = ix::item(g, t, position);
    const int target = static_cast<int>(it.target);
    Tensor& y = y_of[target];
    const std::int64_t lo = it.dst + it.i, hi = lo + half;
    if (lo < 0 || hi >= y.numel() || it.src < 0 || it.src + it.i + half >= x.numel()) {
      ADD_FAILURE() << "item " << t << " of target " << target << " leaves its operand's storage";
      continue;
    }
    const auto x1 = static_cast<float>(x.at({it.src + it.i}));
    const auto x2 = static_cast<float>(x.at({it.src + it.i + half}));
    if (it.target == ix::Target::v) {
      y.set({lo}, x1);
      y.set({hi}, x2);
    } else {
      const auto c1 = static_cast<float>(cos.at({position, it.i}));
      const auto c2 = static_cast<float>(cos.at({position, it.i + half}));
      const auto s1 = static_cast<float>(sin.at({position, it.i}));
      const auto s2 = static_cast<float>(sin.at({position, it.i + half}));
      const float y1 = x1 * c1 + (-x2) * s1, y2 = x2 * c2 + x1 * s2;
      y.set({lo}, y1);
      y.set({hi}, y2);
    }
    ++writes[target][static_cast<std::size_t>(lo)];
    ++writes[target][static_cast<std::size_t>(hi)];
  }
}

// Elements of a counts vector written exactly once, and whether none was written twice.
std::pair<std::int64_t, bool> written_once(const std::vector<std::int64_t>& writes) {
  std::int64_t once = 0;
  bool twice = false;
  for (std::int64_t w : writes) {
    once += w == 1;
    twice = twice || w > 1;
  }
  return {once, twice};
}

TEST(RopeKvAppendCpu, CudaKernelIndexMathEmulatedOnTheHostIsBitwiseTheCpuKernel) {
  Rng rng(29);
  constexpr std::int64_t kPad = 3;  // extra elements / rows / heads of the wider buffers
  const Case shapes[] = {{1, 1, 1, 2, DType::f32},
                         {2, 4, 2, 64, DType::f32},
                         {1, 3, 1, 128, DType::f32},
                         {2, 3, 1, 64, DType::f32}};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (Case c : shapes)
      for (std::int64_t p : {std::int64_t{0}, kCapacity / 2, kCapacity - 1})
        for (bool wide : {false, true}) {
          c.dtype = dtype;
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " B " + std::to_string(c.batch) + " Hq " +
                       std::to_string(c.heads) + " Hkv " + std::to_string(c.kv_heads) + " D " +
                       std::to_string(c.dim) + " p " + std::to_string(p) +
                       (wide ? " strided views" : ""));
          const std::int64_t pad = wide ? kPad : 0;
          const std::int64_t row = (c.heads + 2 * c.kv_heads) * c.dim;
          // [B, 1, row], [B, Hkv, capacity, D] x 2, [B, Hq, 1, D]: views of wider buffers when
          // `wide` (qkv rows, cache rows and out heads padded).
          const Tensor qkv =
              testing::random_tensor(rng, {c.batch, 1, row + pad}, dtype).slice(2, 0, row);
          const Tensor cos = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
          const Tensor sin = testing::random_tensor(rng, {kCapacity, c.dim}, DType::f32);
          Tensor pos = Tensor::empty({1}, DType::i32);
          pos.data<std::int32_t>()[0] = static_cast<std::int32_t>(p);
          // k rows padded along D, v along the capacity: every stride of the two caches differs.
          const Tensor k_wide =
              testing::random_tensor(rng, {c.batch, c.kv_heads, kCapacity, c.dim + pad}, dtype);
          const Tensor v_wide =
              testing::random_tensor(rng, {c.batch, c.kv_heads, kCapacity + 2 * pad, c.dim}, dtype);
          const Tensor out_wide =
              testing::random_tensor(rng, {c.batch, c.heads + pad, 1, c.dim}, dtype);
          Tensor k_cpu = k_wide.clone().slice(3, 0, c.dim);
          Tensor v_cpu = v_wide.clone().slice(2, 0, kCapacity);
          Tensor out_cpu = out_wide.clone().slice(1, 0, c.heads);
          Tensor k_emu = k_wide.clone().slice(3, 0, c.dim);
          Tensor v_emu = v_wide.clone().slice(2, 0, kCapacity);
          Tensor out_emu = out_wide.clone().slice(1, 0, c.heads);
          cpu::rope_kv_append(qkv, cos, sin, pos, k_cpu, v_cpu, out_cpu);
          std::vector<std::int64_t> writes[3];
          emulate_cuda_kernel(qkv, cos, sin, p, k_emu, v_emu, out_emu, writes);
          EXPECT_TRUE(testing::bit_equal(out_emu.clone(), out_cpu.clone()));
          EXPECT_TRUE(testing::bit_equal(k_emu.clone(), k_cpu.clone()));
          EXPECT_TRUE(testing::bit_equal(v_emu.clone(), v_cpu.clone()));
          // Every element of out and of both cache rows p written once, nothing written twice.
          const std::int64_t expected[3] = {c.batch * c.heads * c.dim, c.batch * c.kv_heads * c.dim,
                                            c.batch * c.kv_heads * c.dim};
          for (int target = 0; target < 3; ++target) {
            const auto [once, twice] = written_once(writes[target]);
            EXPECT_EQ(once, expected[target]) << "target " << target;
            EXPECT_FALSE(twice) << "target " << target;
          }
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
  // Outputs that share memory: one cache passed as both (it would end up holding v), out inside
  // a cache (the append would overwrite it), an expanded out whose heads share one address. Each
  // is refused before anything is written, naming the tensor.
  const auto expect_layout = [&](Tensor& k, Tensor& v, Tensor& o, const std::string& names) {
    try {
      cpu::rope_kv_append(qkv, cos, sin, pos, k, v, o);
      ADD_FAILURE() << names << ": accepted";
    } catch (const LayoutError& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  expect_layout(k_cache, k_cache, out, "`k_cache`");
  Tensor out_in_v = Tensor::empty({1, heads, kCapacity, dim}, DType::bf16).slice(2, 0, 1);
  Tensor v_holding_out =
      Tensor::view_of(out_in_v.storage(), 0, {1, kv_heads, kCapacity, dim},
                      {heads * kCapacity * dim, kCapacity * dim, dim, 1}, DType::bf16);
  expect_layout(k_cache, v_holding_out, out_in_v, "`v_cache`");
  Tensor one_head = Tensor::empty({1, 1, 1, dim}, DType::bf16);
  Tensor racing_out = one_head.expand({1, heads, 1, dim});
  expect_layout(k_cache, v_cache, racing_out, "`out`");
  EXPECT_TRUE(testing::bit_equal(k_cache, k_before));
  EXPECT_TRUE(testing::bit_equal(v_cache, v_before));
}

}  // namespace
}  // namespace splice
