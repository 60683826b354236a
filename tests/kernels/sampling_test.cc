// The CPU argmax (greedy sampling, cpu/sampling.h) against the independent oracle
// (std::max_element over f32, support/argmax_cases.h), and the Sampler's greedy rule.
//
//  1. Grid: vocab 1, 2, 17, 4097, 49152 x rows 1, 3 x bf16 / f16 / f32 x contiguous or inside a
//     poisoned storage (lead and row padding +inf or NaN: a stray read wins or corrupts), with
//     explicit ties of the row maximum at random positions and a few NaN / -inf entries; ids
//     written through a strided view whose gaps must stay untouched.
//  2. Special rows pin the rule in every dtype: ties, NaN at index 0 and later (both signs), all
//     NaN, all -inf, +inf, signed zeros.
//  3. Errors: every bad argument is a typed error naming it, and ids stay unwritten.
//  4. Sampler with temperature 0 picks what the oracle picks (f32 and bf16 logits).
#include "splice/backend/cpu/sampling.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/error.h"
#include "splice/model/generate.h"
#include "support/argmax_cases.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::argmax_oracle;
using testing::inf;
using testing::quiet_nan;

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
constexpr std::int32_t kUnwritten = -7;

Tensor filled_ids(std::int64_t n) {
  Tensor t = Tensor::empty({n}, DType::i32);
  t.fill(kUnwritten);
  return t;
}

// Overwrites `copies` random positions of row r with a value above the row's maximum (ties of
// the new maximum) and `extras` positions with NaN and -inf; returns the tied positions.
std::vector<std::int64_t> plant(Rng& rng, Tensor& logits, std::int64_t r, int copies, int extras) {
  const std::int64_t vocab = logits.size(1);
  std::vector<std::int64_t> tied;
  for (int c = 0; c < copies; ++c) {
    const std::int64_t j = rng.integer(0, vocab - 1);
    logits.set({r, j}, 8.0);  // N(0, 1) entries never reach 8
    tied.push_back(j);
  }
  for (int e = 0; e < extras && vocab > 2; ++e) {
    const std::int64_t j = rng.integer(1, vocab - 1);
    logits.set({r, j}, e % 2 ? -inf() : quiet_nan());
  }
  return tied;
}

TEST(CpuArgmax, MatchesTheOracleOnGrids) {
  Rng rng(7);
  for (DType dtype : kDtypes)
    for (std::int64_t vocab : {1, 2, 17, 4097, 49152})
      for (std::int64_t rows : {1, 3})
        for (int layout = 0; layout < 3; ++layout) {
          // 0: contiguous; 1: +inf poison around the rows; 2: NaN poison, odd row pitch.
          const std::int64_t lead = layout == 0 ? 0 : 3, pad = layout == 0 ? 0 : 2 * layout + 1;
          const float poison = layout == 2 ? quiet_nan() : inf();
          Tensor logits = testing::poisoned_logits(rng, rows, vocab, dtype, lead, pad, poison);
          for (std::int64_t r = 0; r < rows; ++r) plant(rng, logits, r, 1 + static_cast<int>(r), 4);
          Tensor ids_base = filled_ids(2 * rows);
          Tensor ids = Tensor::view_of(ids_base.storage(), 0, {rows}, {2}, DType::i32);
          cpu::argmax(logits, ids);
          const std::string where = std::string(dtype_name(dtype)) + " vocab " +
                                    std::to_string(vocab) + " rows " + std::to_string(rows) +
                                    " layout " + std::to_string(layout);
          for (std::int64_t r = 0; r < rows; ++r) {
            EXPECT_EQ(ids.at({r}), argmax_oracle(logits, r)) << where << " row " << r;
            EXPECT_EQ(ids_base.at({2 * r + 1}), kUnwritten) << where << ": a gap was written";
          }
        }
}

TEST(CpuArgmax, TiesGoToTheLowestIndex) {
  Rng rng(11);
  for (DType dtype : kDtypes) {
    Tensor logits = testing::poisoned_logits(rng, 1, 4097, dtype, 0, 0, 0.0f);
    for (std::int64_t j : {4096, 2049, 17, 4000}) logits.set({0, j}, 9.0);
    Tensor ids = Tensor::zeros({1}, DType::i32);
    cpu::argmax(logits, ids);
    EXPECT_EQ(ids.at({0}), 17) << dtype_name(dtype);
  }
}

TEST(CpuArgmax, SpecialRowsFollowTheRuleInEveryDtype) {
  for (DType dtype : kDtypes)
    for (const testing::SpecialRow& row : testing::special_rows()) {
      const auto n = static_cast<std::int64_t>(row.values.size());
      Tensor logits = Tensor::empty({n}, dtype);  // rank 1: one row
      for (std::int64_t j = 0; j < n; ++j) logits.set({j}, row.values[static_cast<std::size_t>(j)]);
      Tensor ids = filled_ids(1);
      cpu::argmax(logits, ids);
      EXPECT_EQ(ids.at({0}), row.pick) << row.what << " (" << dtype_name(dtype) << ")";
      EXPECT_EQ(argmax_oracle(logits), row.pick) << "oracle: " << row.what;
      std::vector<float> f32(row.values);
      EXPECT_EQ(cpu::argmax_row(f32.data(), n), row.pick) << "argmax_row: " << row.what;
    }
}

TEST(CpuArgmax, BadArgumentsAreTypedErrorsNamingTheArgument) {
  const Tensor logits = Tensor::zeros({2, 5}, DType::f32);
  Tensor ids = filled_ids(2);
  Tensor ids_i64 = Tensor::zeros({2}, DType::i64);
  Tensor ids_short = Tensor::zeros({1}, DType::i32);
  Tensor ids_2d = Tensor::zeros({2, 1}, DType::i32);
  testing::expect_error_with<DTypeError>(
      [&] {
        cpu::argmax(Tensor::zeros({2, 5}, DType::i32), ids);
      },
      "`logits` must be f32, f16 or bf16, got i32");
  testing::expect_error_with<DTypeError>([&] { cpu::argmax(logits, ids_i64); },
                                         "`ids` must be i32, got i64");
  testing::expect_error_with<ShapeError>([&] { cpu::argmax(logits, ids_short); },
                                         "`ids` must have shape [2]");
  testing::expect_error_with<ShapeError>([&] { cpu::argmax(logits, ids_2d); },
                                         "`ids` must have shape [2]");
  testing::expect_error_with<ShapeError>(
      [&] {
        cpu::argmax(Tensor::zeros({2, 0}, DType::f32), ids);
      },
      "must hold 1 to 2^31 entries");
  testing::expect_error_with<ShapeError>(
      [&] {
        cpu::argmax(Tensor::zeros({1, 2, 5}, DType::f32), ids);
      },
      "`logits` must be [rows, vocab] or [vocab], got shape [1, 2, 5]");
  testing::expect_error_with<LayoutError>(
      [&] {
        cpu::argmax(Tensor::zeros({5, 2}, DType::f32).permute({1, 0}), ids);
      },
      "`logits` must have a unit stride on its vocab axis");
  testing::expect_error_with<ShapeError>([&] { cpu::argmax_row(nullptr, 0); },
                                         "`n` must be >= 1, got 0");
  EXPECT_EQ(ids.at({0}), kUnwritten);  // nothing was written by a refused call
  EXPECT_EQ(ids.at({1}), kUnwritten);
  cpu::argmax(logits, ids);  // the valid call still works: all zeros tie at index 0
  EXPECT_EQ(ids.at({0}), 0);
  EXPECT_EQ(ids.at({1}), 0);
}

TEST(Sampler, GreedyPicksWhatTheOraclePicks) {
  Rng rng(5);
  Sampler greedy({});
  for (DType dtype : {DType::f32, DType::bf16})
    for (int trial = 0; trial < 20; ++trial) {
      Tensor logits = testing::poisoned_logits(rng, 1, 513, dtype, 0, 0, 0.0f);
      plant(rng, logits, 0, trial % 4, trial % 5);
      if (trial == 7) logits.set({0, 0}, quiet_nan());
      const Tensor row = logits.select(0, 0);
      EXPECT_EQ(greedy.sample(row), argmax_oracle(row)) << dtype_name(dtype) << " trial " << trial;
    }
  for (const testing::SpecialRow& row : testing::special_rows()) {
    const auto n = static_cast<std::int64_t>(row.values.size());
    Tensor logits = Tensor::empty({n}, DType::f32);
    for (std::int64_t j = 0; j < n; ++j) logits.set({j}, row.values[static_cast<std::size_t>(j)]);
    EXPECT_EQ(greedy.sample(logits), row.pick) << row.what;
  }
}

// The options' validation (what Sampler's constructor, Generator::generate and `splice run`
// check before anything runs): a ValueError naming the field, for each bad value alone.
TEST(Sampler, BadOptionsAreValueErrorsNamingTheField) {
  const auto message = [](const GenerateOptions& options) {
    try {
      validate(options);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  struct Case {
    const char* field;
    GenerateOptions options;
  };
  std::vector<Case> cases;
  auto add = [&](const char* field, auto edit) {
    GenerateOptions o;
    edit(o);
    cases.push_back({field, o});
  };
  add("max_new_tokens", [](GenerateOptions& o) { o.max_new_tokens = -1; });
  add("temperature", [](GenerateOptions& o) { o.sampling.temperature = -0.5f; });
  add("temperature", [](GenerateOptions& o) { o.sampling.temperature = quiet_nan(); });
  add("temperature",
      [](GenerateOptions& o) { o.sampling.temperature = std::numeric_limits<float>::infinity(); });
  add("top_k", [](GenerateOptions& o) { o.sampling.top_k = -3; });
  add("top_p", [](GenerateOptions& o) { o.sampling.top_p = 0.0f; });
  add("top_p", [](GenerateOptions& o) { o.sampling.top_p = 1.5f; });
  add("top_p", [](GenerateOptions& o) { o.sampling.top_p = quiet_nan(); });
  for (const Case& c : cases) {
    const std::string what = message(c.options);
    EXPECT_NE(what.find(c.field), std::string::npos) << what;
    if (std::string(c.field) != "max_new_tokens") {  // the one field that is not the sampler's
      EXPECT_THROW(Sampler{c.options.sampling}, ValueError) << c.field;
    }
  }
  GenerateOptions fine;
  fine.max_new_tokens = 0;
  fine.sampling = {0.7f, 40, 0.9f, 3};
  EXPECT_NO_THROW(validate(fine));
  EXPECT_NO_THROW(Sampler{fine.sampling});
}

}  // namespace
}  // namespace splice
