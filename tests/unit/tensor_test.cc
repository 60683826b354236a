// Tensors: owning and borrowed storage, strided views, copies, element access and the argument
// checks every entry point uses (typed errors naming the argument).
#include "splice/core/tensor.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/core/tolerance.h"

namespace splice {
namespace {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set_linear(i, static_cast<double>(i));
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.slice(2, 1, 3);
  EXPECT_EQ(s.shape(), (Dims{2, 3, 2}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.at({1, 2, 0}), 1 * 12 + 2 * 4 + 1);
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(p.at({3, 1, 2}), t.at({1, 2, 3}));
  Tensor r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (Dims{6, 4}));
  r.set({5, 3}, -1.0);
  EXPECT_EQ(t.at({1, 2, 3}), -1.0);
  EXPECT_EQ(t.select(0, 1).shape(), (Dims{3, 4}));
  EXPECT_EQ(t.unsqueeze(1).shape(), (Dims{2, 1, 3, 4}));
  Tensor c = p.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(compare_bits(c, p).ok);
}

// view_reshape: torch's view rule on strided tensors (checked against numpy's no-copy reshape on
// 4000 random slices and transposes while it was written, session 43).
TEST(Tensor, ViewReshapeSplitsAndMergesContiguousRunsOnly) {
  Tensor t = Tensor::empty({4, 10}, DType::f32);  // [4, 10]
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set_linear(i, static_cast<double>(i));
  // Every element of `view` equals the same row-major element of `of`.
  auto same_values = [](const Tensor& view, const Tensor& of) {
    for (std::int64_t i = 0; i < of.numel(); ++i)
      if (view.contiguous().at_linear(i) != of.contiguous().at_linear(i)) return false;
    return true;
  };
  const Tensor cols = t.slice(1, 2, 8);  // [4, 6], strides [10, 1]
  const std::optional<Tensor> heads = cols.view_reshape({4, 2, 3});
  ASSERT_TRUE(heads.has_value());
  EXPECT_EQ(heads->strides(), (Dims{10, 3, 1}));
  EXPECT_EQ(heads->raw_data(), cols.raw_data());
  EXPECT_TRUE(same_values(*heads, cols));
  const std::optional<Tensor> with_ones = cols.view_reshape({1, 4, 1, 6, 1});
  ASSERT_TRUE(with_ones.has_value());
  EXPECT_TRUE(same_values(*with_ones, cols));
  EXPECT_FALSE(cols.view_reshape({24}).has_value());    // rows 10 apart: no view
  EXPECT_FALSE(cols.view_reshape({8, 3}).has_value());  // a dim across two rows
  // A transpose: its first dim (stride 1) splits, nothing merges across the two.
  const Tensor tr = t.slice(0, 0, 3).slice(1, 0, 4).permute({1, 0});  // [4, 3], strides [1, 10]
  const std::optional<Tensor> split = tr.view_reshape({2, 2, 3});
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->strides(), (Dims{2, 1, 10}));
  EXPECT_TRUE(same_values(*split, tr));
  EXPECT_FALSE(tr.view_reshape({12}).has_value());
  // A size-1 dim's stride is no constraint; a 0-dim tensor becomes any all-ones shape.
  const Tensor row = t.slice(0, 1, 2).slice(1, 0, 6);  // [1, 6], strides [10, 1]
  const std::optional<Tensor> row_split = row.view_reshape({2, 3});
  ASSERT_TRUE(row_split.has_value());
  EXPECT_TRUE(same_values(*row_split, row));
  const std::optional<Tensor> scalar = t.select(0, 2).select(0, 7).view_reshape({1, 1});
  ASSERT_TRUE(scalar.has_value());
  EXPECT_EQ(scalar->at({0, 0}), 27.0);
  // Contiguous input: the contiguous strides; a count mismatch is a ShapeError.
  EXPECT_EQ(t.view_reshape({5, 8})->strides(), (Dims{8, 1}));
  EXPECT_THROW((void)cols.view_reshape({5, 5}), ShapeError);
}

// expand: a broadcast view (stride 0 on broadcast dims) sharing storage; bad shapes are errors.
TEST(Tensor, ExpandBroadcastsWithZeroStrides) {
  Tensor bias = Tensor::empty({3}, DType::f32);  // [3]
  for (std::int64_t i = 0; i < 3; ++i) bias.set({i}, static_cast<double>(i + 1));
  const Tensor rows = bias.expand({4, 1, 3});  // [4, 1, 3]
  EXPECT_EQ(rows.strides(), (Dims{0, 0, 1}));
  EXPECT_EQ(rows.raw_data(), bias.raw_data());
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(rows.at({r, 0, i}), i + 1.0);
  const Tensor column = Tensor::empty({2, 1}, DType::f32).expand({2, 5});  // [2, 5]
  EXPECT_EQ(column.strides(), (Dims{1, 0}));
  EXPECT_EQ(bias.expand({3}).strides(), bias.strides());
  EXPECT_THROW((void)bias.expand({4, 2}), ShapeError);  // 3 is neither 1 nor 2
  EXPECT_THROW((void)rows.expand({1, 3}), ShapeError);  // fewer dims than the tensor
}

TEST(Tensor, BorrowedAndCasts) {
  float buffer[6] = {1, 2, 3, 4, 5, 6};
  {
    Tensor b = Tensor::borrow(buffer, {2, 3}, DType::f32);
    EXPECT_EQ(b.at({1, 0}), 4.0);
    Tensor h = b.to(DType::bf16);
    EXPECT_EQ(h.dtype(), DType::bf16);
    EXPECT_EQ(h.at({1, 2}), 6.0);
    Tensor strided = Tensor::borrow(buffer, {2, 2}, DType::f32, {3, 1});
    EXPECT_EQ(strided.at({1, 1}), 5.0);
  }
  EXPECT_EQ(buffer[0], 1.0f);  // borrowed memory is never freed or changed
}

TEST(Tensor, DenseConversionsRoundToNearestEven) {
  Rng rng(3);
  Tensor f = Tensor::empty({257}, DType::f32);
  rng.normal(f, 0.0, 100.0);
  for (DType target : {DType::bf16, DType::f16}) {
    const Tensor h = f.to(target);
    const Tensor back = h.to(DType::f32);
    for (std::int64_t i = 0; i < f.numel(); ++i) {
      const float x = f.data<float>()[i];
      const std::uint16_t bits = h.data<std::uint16_t>()[i];
      EXPECT_EQ(bits, target == DType::bf16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x)) << i;
      EXPECT_EQ(back.data<float>()[i],
                target == DType::bf16 ? bf16_bits_to_f32(bits) : f16_bits_to_f32(bits));
    }
  }
  const Tensor cross = f.to(DType::bf16).to(DType::f16);  // bf16 -> f16 through f32
  for (std::int64_t i = 0; i < f.numel(); ++i)
    EXPECT_EQ(cross.data<std::uint16_t>()[i],
              f32_to_f16_bits(bf16_bits_to_f32(f32_to_bf16_bits(f.data<float>()[i]))));
}

TEST(Tensor, ErrorsNameTheArgument) {
  Tensor t = Tensor::empty({2, 3}, DType::f32);
  EXPECT_THROW(t.slice(1, 2, 5), ShapeError);
  EXPECT_THROW(t.permute({0, 0}), ShapeError);
  EXPECT_THROW(t.reshape({4, 2}), ShapeError);
  EXPECT_THROW(t.permute({1, 0}).reshape({6}), LayoutError);
  EXPECT_THROW(t.size(2), ShapeError);
  try {
    check_dtype(t, "state_indices", {DType::i32});
    FAIL();
  } catch (const DTypeError& e) {
    EXPECT_STREQ(e.what(), "`state_indices` must be i32, got f32");
  }
  try {
    check_shape(t, "x", {3, 2});
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "`x` must have shape [3, 2], got [2, 3]");
  }
  EXPECT_THROW(check_rank(t, "x", 3), ShapeError);
  EXPECT_THROW(check_contiguous(t.permute({1, 0}), "x"), LayoutError);
  EXPECT_THROW(check_defined(Tensor(), "out"), ValueError);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), ShapeError);
  EXPECT_THROW(Tensor::empty({0, 1LL << 40, 1LL << 40}, DType::f32),
               ShapeError);  // overflows int64
  EXPECT_THROW(Tensor::empty({1LL << 62, 4}, DType::f32), ShapeError);
}

// ---- aliasing: share_memory, has_internal_overlap, check_output_aliasing ----------------------

TEST(TensorAliasing, ShareMemoryComparesAddressesNotStorages) {
  Tensor buffer = Tensor::empty({64}, DType::f32);
  const Tensor left = buffer.slice(0, 0, 32), right = buffer.slice(0, 32, 64);
  EXPECT_FALSE(share_memory(left, right));
  EXPECT_TRUE(share_memory(left, buffer.slice(0, 31, 33)));  // one element in common
  // A borrowed view of the same bytes is another Storage object: still shared.
  const Tensor borrowed = Tensor::borrow(buffer.data<float>() + 16, {8}, DType::f32);
  EXPECT_TRUE(share_memory(left, borrowed));
  EXPECT_FALSE(share_memory(right, borrowed));
  // Byte ranges, whatever the dtypes: a bf16 view over the last byte pair of element 31.
  const Tensor halves = Tensor::view_of(buffer.storage(), 63, {1}, {1}, DType::bf16);
  EXPECT_TRUE(share_memory(left, halves));
  EXPECT_FALSE(share_memory(right, halves));
  // Empty and undefined tensors hold no byte; negative strides span backwards.
  EXPECT_FALSE(share_memory(left, buffer.slice(0, 8, 8)));
  EXPECT_FALSE(share_memory(left, Tensor()));
  const Tensor reversed = Tensor::view_of(buffer.storage(), 40, {9}, {-1}, DType::f32);  // 40..32
  EXPECT_TRUE(share_memory(reversed, right));
  EXPECT_FALSE(share_memory(reversed, left));
}

TEST(TensorAliasing, SlotInterleavedViewsShareMemoryOnlyWhereTheirSlotsMeet) {
  // One page of 10 f32 per slot, 4 slots: [a: 4 | b: 6]. a and b's byte ranges meet, their
  // elements do not (KDA's conv_state and state in one allocation, spec kda_decode.md §6).
  Tensor pages = Tensor::empty({40}, DType::f32);
  const auto view = [&](std::int64_t offset, std::int64_t n, std::int64_t slots,
                        std::int64_t stride) {
    return Tensor::view_of(pages.storage(), offset, {slots, n}, {stride, 1}, DType::f32);
  };
  EXPECT_FALSE(share_memory(view(0, 4, 4, 10), view(4, 6, 4, 10)));
  EXPECT_FALSE(share_memory(view(4, 6, 4, 10), view(0, 4, 4, 10)));
  EXPECT_TRUE(share_memory(view(0, 5, 4, 10), view(4, 6, 4, 10)));  // element 4 of each page
  EXPECT_TRUE(share_memory(view(0, 4, 4, 10), view(3, 6, 4, 10)));
  // Shifted by a whole page, b's slot j meets a's slot j + 1.
  EXPECT_TRUE(share_memory(view(0, 4, 4, 10), view(10, 6, 3, 10)));
  EXPECT_FALSE(share_memory(view(0, 4, 2, 10), view(24, 6, 1, 10)));  // ranges apart
  // Disjoint elements at different strides (0..1, 10..11, .. and 4..5, 13..14, ..): the
  // conservative range answer.
  EXPECT_TRUE(share_memory(view(0, 2, 4, 10), view(4, 2, 4, 9)));
  // The same in bytes across dtypes: bf16 pages of 20 halves.
  const Tensor halves = Tensor::view_of(pages.storage(), 8, {4, 12}, {20, 1}, DType::bf16);
  EXPECT_FALSE(share_memory(view(0, 4, 4, 10), halves));
  EXPECT_TRUE(share_memory(view(0, 5, 4, 10), halves));
}

TEST(TensorAliasing, InternalOverlapIsAStrideZeroOrInterleavedAxis) {
  Tensor base = Tensor::empty({4, 6}, DType::f32);
  EXPECT_FALSE(has_internal_overlap(base));
  EXPECT_FALSE(has_internal_overlap(base.permute({1, 0})));
  EXPECT_FALSE(has_internal_overlap(base.slice(1, 0, 3)));
  EXPECT_FALSE(has_internal_overlap(Tensor::empty({1, 6}, DType::f32).expand({1, 6})));
  EXPECT_TRUE(has_internal_overlap(Tensor::empty({1, 6}, DType::f32).expand({3, 6})));
  EXPECT_TRUE(has_internal_overlap(Tensor::view_of(base.storage(), 0, {3, 4}, {2, 1}, DType::f32)));
  EXPECT_FALSE(
      has_internal_overlap(Tensor::view_of(base.storage(), 0, {3, 2}, {1, 3}, DType::f32)));
  EXPECT_FALSE(has_internal_overlap(Tensor::empty({0, 6}, DType::f32).expand({0, 6})));
  EXPECT_THROW(check_no_self_overlap(Tensor::empty({1, 6}, DType::f32).expand({3, 6}), "out"),
               LayoutError);
}

TEST(TensorAliasing, OutputAliasingNamesBothTensors) {
  Tensor buffer = Tensor::empty({64}, DType::f32);
  const Tensor x = buffer.slice(0, 0, 16), y = buffer.slice(0, 16, 32);
  const Tensor out = buffer.slice(0, 32, 48), cache = buffer.slice(0, 48, 64);
  const auto message = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const LayoutError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message([&] {
              check_output_aliasing({{out, "out"}, {cache, "cache"}}, {{x, "x"}});
            }),
            "");
  // The identical view of an in-place input passes; any other overlap names both tensors.
  EXPECT_EQ(message([&] { check_output_aliasing({{x, "out"}}, {{x, "x", true}}); }), "");
  std::string m = message([&] { check_output_aliasing({{x, "out"}}, {{x, "x"}}); });
  EXPECT_NE(m.find("`out`"), std::string::npos) << m;
  EXPECT_NE(m.find("overlaps `x`"), std::string::npos) << m;
  m = message([&] { check_output_aliasing({{buffer.slice(0, 1, 17), "out"}}, {{x, "x", true}}); });
  EXPECT_NE(m.find("only an identical view"), std::string::npos) << m;
  m = message([&] { check_output_aliasing({{out, "k_cache"}, {out, "v_cache"}}, {}, "op"); });
  EXPECT_EQ(m.rfind("op: `k_cache` and `v_cache` must not overlap", 0), 0u) << m;
  m = message([&] {
    check_output_aliasing({{Tensor::empty({1}, DType::f32).expand({4}), "lse"}}, {{y, "y"}});
  });
  EXPECT_NE(m.find("`lse`"), std::string::npos) << m;
  EXPECT_NE(m.find("share an address"), std::string::npos) << m;
  // Absent (undefined) tensors are skipped.
  EXPECT_EQ(message([&] {
              check_output_aliasing({{Tensor(), "lse"}, {out, "out"}}, {{Tensor(), "alibi"}});
            }),
            "");
}

TEST(Tensor, CompareReportsWorstIndex) {
  Rng rng(1);
  Tensor a = Tensor::empty({3, 4}, DType::f32);
  rng.normal(a);
  Tensor b = a.clone();
  b.set({2, 1}, b.at({2, 1}) + 1.0);
  const CompareReport r = compare_tensors(b, a, default_tolerance(DType::f32));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.worst_index, (Dims{2, 1}));
  EXPECT_NEAR(r.max_abs_error, 1.0, 1e-6);
  EXPECT_NE(r.str().find("[2, 1]"), std::string::npos);
  Tensor n = a.clone();
  n.set({0, 0}, NAN);
  EXPECT_FALSE(compare_tensors(n, a, {1.0, 1.0}).ok);  // NaN never passes
  EXPECT_FALSE(compare_bits(b, a).ok);
  EXPECT_TRUE(compare_bits(a.clone(), a).ok);
}

// for_each_offset visits every element in row-major order with each tensor's own offset
// (linear_to_offset's, without its divisions): permuted, sliced and selected views in lockstep
// with a dense and a column-major tensor, rank 0, and an empty dimension (no call).
TEST(Tensor, ForEachOffsetWalksRowMajor) {
  const Tensor base = Tensor::empty({4, 5, 6}, DType::f32);
  const Tensor views[] = {base, base.permute({2, 0, 1}).slice(1, 1, 4),
                          base.slice(2, 1, 5).permute({1, 0, 2}), base.select(1, 3),
                          base.slice(0, 2, 3)};
  for (const Tensor& view : views) {
    const Tensor dense = Tensor::empty(view.shape(), DType::bf16);
    // The same shape with column-major strides: a dense tensor of the reversed shape, reversed.
    Dims reversed(view.shape().rbegin(), view.shape().rend());
    std::vector<std::int64_t> reverse(reversed.size());
    for (std::size_t i = 0; i < reverse.size(); ++i)
      reverse[i] = static_cast<std::int64_t>(reverse.size() - 1 - i);
    const Tensor other = Tensor::empty(reversed, DType::i32).permute(reverse);
    std::int64_t i = 0;
    for_each_offset(
        [&](std::int64_t a, std::int64_t b, std::int64_t c) {
          EXPECT_EQ(a, view.linear_to_offset(i)) << view.describe() << " at " << i;
          EXPECT_EQ(b, dense.linear_to_offset(i));
          EXPECT_EQ(c, other.linear_to_offset(i));
          ++i;
        },
        view, dense, other);
    EXPECT_EQ(i, view.numel()) << view.describe();
  }
  const Tensor scalar = base.select(0, 1).select(0, 2).select(0, 3);
  int calls = 0;
  for_each_offset(
      [&](std::int64_t at) {
        EXPECT_EQ(at, scalar.offset());
        ++calls;
      },
      scalar);
  EXPECT_EQ(calls, 1);
  for_each_offset([&](std::int64_t) { ++calls; }, base.slice(1, 2, 2));
  EXPECT_EQ(calls, 1);
}

TEST(Internal, InvariantCheckSaysInternalError) {
  try {
    SPLICE_INTERNAL_CHECK(1 + 1 == 3, "math");
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("internal error at"), std::string::npos);
  }
}

}  // namespace
}  // namespace splice
