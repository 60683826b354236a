// Test inputs and the independent oracle for the argmax (greedy sampling) kernels, shared by the
// CPU test (tests/kernels/sampling_test.cc) and the CUDA test (tests/cuda/sampling_test.cc).
// Header-only, host-only.
//
//   - argmax_oracle: std::max_element over the row read as f32 (the decode loop's greedy rule as
//     it was written before the kernels existed; the kernels must reproduce it, NaN included).
//   - poisoned_logits: [rows, vocab] random logits viewed inside a larger storage whose
//     elements outside the view (a lead before the first row, a pad after every row) hold a
//     poison value that would win if a kernel read it (+inf) or corrupt it (NaN).
//   - special_rows: short rows that pin the rule (ties, NaN at 0 / later, -inf, +inf, signed
//     zeros, negative NaN), with the index the rule picks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "splice/core/dtype.h"
#include "splice/core/random.h"
#include "splice/core/tensor.h"
#include "support/test_util.h"

namespace splice::testing {

inline float quiet_nan() { return std::numeric_limits<float>::quiet_NaN(); }
inline float negative_nan() {
  const std::uint32_t bits = 0xFFC00000u;  // sign set, quiet NaN
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float inf() { return std::numeric_limits<float>::infinity(); }

// The greedy rule's oracle over row `r` of a CPU tensor [rows, vocab] (or [vocab]).
inline std::int64_t argmax_oracle(const Tensor& logits, std::int64_t r = 0) {
  const Tensor row = logits.dim() == 2 ? logits.select(0, r) : logits;
  std::vector<float> v(static_cast<std::size_t>(row.size(0)));
  for (std::int64_t j = 0; j < row.size(0); ++j)
    v[static_cast<std::size_t>(j)] = static_cast<float>(row.at({j}));
  return std::max_element(v.begin(), v.end()) - v.begin();
}

// Writes `value` into every element of a CPU tensor's whole storage (poison around views).
inline void fill_storage(const Tensor& t, float value) {
  const std::size_t es = dtype_size(t.dtype());
  const auto elems = static_cast<std::int64_t>(t.storage()->bytes / es);
  Tensor flat = Tensor::view_of(t.storage(), 0, {elems}, {1}, t.dtype());
  flat.fill(value);
}

// [rows, vocab] N(0, 1) logits rounded to `dtype`, row stride vocab + pad, starting `lead`
// elements into a storage whose other elements hold `poison`.
inline Tensor poisoned_logits(Rng& rng, std::int64_t rows, std::int64_t vocab, DType dtype,
                              std::int64_t lead, std::int64_t pad, float poison) {
  const std::int64_t stride = vocab + pad;
  Tensor base = Tensor::empty({lead + rows * stride + pad}, dtype);
  fill_storage(base, poison);
  Tensor view = Tensor::view_of(base.storage(), lead, {rows, vocab}, {stride, 1}, dtype);
  const Tensor values = random_tensor(rng, {rows, vocab}, dtype);
  view.copy_from(values);
  return view;
}

struct SpecialRow {
  const char* what;
  std::vector<float> values;
  std::int64_t pick;  // what the rule picks
};

// Rows whose values every float dtype represents exactly.
inline std::vector<SpecialRow> special_rows() {
  const float nan = quiet_nan(), neg_nan = negative_nan(), pinf = inf(), ninf = -inf();
  return {
      {"single", {-2.0f}, 0},
      {"tie goes to the lowest index", {1.0f, 3.0f, 3.0f, 2.0f, 3.0f}, 1},
      {"NaN at index 0 is never replaced", {nan, 5.0f, 7.0f, pinf}, 0},
      {"negative NaN at index 0", {neg_nan, 5.0f}, 0},
      {"NaN after index 0 is skipped", {1.0f, nan, 7.0f, nan, 6.0f}, 2},
      {"negative NaN after index 0 is skipped", {1.0f, neg_nan, -7.0f}, 0},
      {"all NaN", {nan, nan, nan}, 0},
      {"all -inf", {ninf, ninf, ninf}, 0},
      {"-inf then NaN", {ninf, nan, ninf}, 0},
      {"NaN before the only finite value", {ninf, nan, -3.0f}, 2},
      {"+inf wins, first of two", {-3.0f, pinf, 1.0f, pinf}, 1},
      {"-0.0 ties +0.0 (first wins)", {-0.0f, 0.0f}, 0},
      {"+0.0 ties -0.0 (first wins)", {-1.0f, 0.0f, -0.0f}, 1},
      {"negative values", {-5.0f, -0.5f, -0.25f, -0.25f, -8.0f}, 2},
      {"max at the end", {0.0f, 1.0f, 2.0f, 4.0f}, 3},
  };
}

}  // namespace splice::testing
