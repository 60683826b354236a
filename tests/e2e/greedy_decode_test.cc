// Greedy decoding inside the step (GeneratorOptions::greedy_in_step, model/generate.h) on the CPU:
// the session epilogue writes argmax(logits) into the buffer the next step reads as "tokens", and
// only the id comes back. The host path (logits to the host, Sampler) is the oracle.
//
//  1. generate(): the embedded hybrid default model (KDA + attention layers) decodes the same
//     tokens, the same prompt logits and the same per-step logits (keep_logits) in-step as on the
//     host path, with the decomposed arms and with the fused arms chosen; the ids vary (the test
//     would notice a stuck or stale token), the streamed ids are the returned ones.
//  2. Stops: a stop token mid-way and the capacity (max_seq_len) end both paths at the same token
//     and position.
//  3. step_greedy(): prompt ids then continuations equal generate()'s tokens; continuing with no
//     previous greedy step (fresh, after reset(), after step()) is a ValueError; a bad token id is
//     a ValueError before anything runs.
//  4. Sampling with a temperature takes the host path even with greedy_in_step, reproducibly.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/model/default_model.h"
#include "splice/model/generate.h"
#include "splice/model/model.h"
#include "support/test_util.h"

namespace splice {
namespace {

const std::vector<std::int32_t> kPrompt = {1, 77, 300, 5};

Generator make_generator(bool greedy_in_step, bool fused, std::int64_t max_seq_len = 96) {
  const std::string dir = default_model_dir();
  const ModelConfig config = load_config(dir);
  const Weights weights = Weights::from_directory(dir);
  BuildOptions build;
  build.max_seq_len = max_seq_len;
  GeneratorOptions options;
  options.greedy_in_step = greedy_in_step;
  // Collapse every branch to the fused arms (still verified against the decomposed ones) or to
  // the decomposed arms, without timing them.
  options.optimize.tune.time_override = [fused](NodeId, int arm, std::int64_t) {
    return (arm == 0) == fused ? 2.0 : 1.0;
  };
  return Generator(build_decode_model(config, weights, build), options);
}

GenerateOptions greedy_options(std::int64_t tokens, bool keep_logits = false) {
  GenerateOptions o;
  o.max_new_tokens = tokens;
  o.keep_logits = keep_logits;
  return o;
}

class GreedyInStep : public ::testing::TestWithParam<bool> {};

TEST_P(GreedyInStep, GenerateEqualsTheHostPath) {
  const bool fused = GetParam();
  Generator in_step = make_generator(true, fused);
  Generator host = make_generator(false, fused);
  EXPECT_TRUE(in_step.greedy_in_step());
  EXPECT_FALSE(host.greedy_in_step());
  GenerateOptions options = greedy_options(48, true);
  std::vector<std::int32_t> streamed;
  options.on_token = [&](std::int32_t t) { streamed.push_back(t); };
  const GenerateResult got = in_step.generate(kPrompt, options);
  options.on_token = nullptr;
  const GenerateResult want = host.generate(kPrompt, options);
  EXPECT_TRUE(got.greedy_in_step);
  EXPECT_FALSE(want.greedy_in_step);
  ASSERT_EQ(want.tokens.size(), 48u);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(streamed, got.tokens);
  EXPECT_EQ(got.step_us.size(), want.step_us.size());
  EXPECT_EQ(in_step.position(), host.position());
  // The same computation on both paths: logits bit-equal, so the comparison is exact.
  EXPECT_TRUE(testing::bit_equal(got.prompt_logits, want.prompt_logits));
  EXPECT_EQ(got.all_logits.shape(), want.all_logits.shape());
  EXPECT_EQ(got.all_logits.size(0), static_cast<std::int64_t>(kPrompt.size() + 47));
  EXPECT_TRUE(testing::bit_equal(got.all_logits, want.all_logits));
  // A decode whose ids barely change would not notice a stale token.
  const std::set<std::int32_t> distinct(want.tokens.begin(), want.tokens.end());
  EXPECT_GE(distinct.size(), 8u) << "the default model's greedy ids are too uniform to test";
  // Without keep_logits the in-step path downloads no logits, and still decodes the same ids.
  in_step.reset();
  const GenerateResult lean = in_step.generate(kPrompt, greedy_options(48));
  EXPECT_EQ(lean.tokens, want.tokens);
  EXPECT_FALSE(lean.all_logits.defined());
  EXPECT_TRUE(testing::bit_equal(lean.prompt_logits, want.prompt_logits));
}

INSTANTIATE_TEST_SUITE_P(DecomposedAndFused, GreedyInStep, ::testing::Bool());

TEST(GreedyInStepStops, StopTokenAndCapacityEndBothPathsAlike) {
  Generator in_step = make_generator(true, false, 40);
  Generator host = make_generator(false, false, 40);
  const GenerateResult reference = host.generate(kPrompt, greedy_options(20));
  ASSERT_EQ(reference.tokens.size(), 20u);
  // Stop on the 6th token's id (its first occurrence may be earlier: both paths agree anyway).
  GenerateOptions stop = greedy_options(20);
  stop.stop_tokens = {reference.tokens[5]};
  host.reset();
  const GenerateResult want = host.generate(kPrompt, stop);
  const GenerateResult got = in_step.generate(kPrompt, stop);
  EXPECT_TRUE(got.stopped_on_token);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_LE(got.tokens.size(), 6u);
  EXPECT_EQ(in_step.position(), host.position());
  // Capacity: 4 prompt positions + 36 decode positions, then the loop ends at max_seq_len.
  in_step.reset();
  host.reset();
  const GenerateResult full_want = host.generate(kPrompt, greedy_options(100));
  const GenerateResult full_got = in_step.generate(kPrompt, greedy_options(100));
  EXPECT_EQ(full_got.tokens, full_want.tokens);
  EXPECT_EQ(full_got.tokens.size(), 37u);  // the last pick is returned but never fed
  EXPECT_EQ(in_step.position(), 40);
  EXPECT_EQ(host.position(), 40);
  EXPECT_THROW(in_step.step_greedy(), ValueError);   // full, and generate() left no pick
  EXPECT_THROW(in_step.step_greedy(3), ValueError);  // full
}

TEST(GreedyInStepSteps, StepGreedyContinuesWhereTheDeviceLeftTheToken) {
  Generator in_step = make_generator(true, false);
  Generator host = make_generator(false, false);
  const GenerateResult want = host.generate(kPrompt, greedy_options(24));
  for (Generator* g : {&in_step, &host}) {
    g->reset();
    EXPECT_THROW(g->step_greedy(), ValueError);  // nothing to continue
    std::int32_t pick = -1;
    for (std::int32_t t : kPrompt) pick = g->step_greedy(t);
    std::vector<std::int32_t> tokens = {pick};
    while (tokens.size() < want.tokens.size()) tokens.push_back(g->step_greedy());
    EXPECT_EQ(tokens, want.tokens) << (g == &in_step ? "in-step" : "host");
    EXPECT_EQ(g->position(), static_cast<std::int64_t>(kPrompt.size() + 23));
    // step() gives logits and leaves no pick to continue from.
    const Tensor logits = g->step(tokens.back());
    EXPECT_EQ(logits.numel(), g->config().vocab_size);
    EXPECT_THROW(g->step_greedy(), ValueError);
    const std::int32_t vocab = static_cast<std::int32_t>(g->config().vocab_size);
    const std::int64_t before = g->position();
    EXPECT_THROW(g->step_greedy(vocab), ValueError);
    EXPECT_THROW(g->step_greedy(-1), ValueError);
    EXPECT_EQ(g->position(), before);
    g->reset();
    EXPECT_THROW(g->step_greedy(), ValueError);
  }
}

TEST(GreedyInStepSampling, TemperatureSamplingTakesTheHostPath) {
  Generator in_step = make_generator(true, false);
  Generator host = make_generator(false, false);
  GenerateOptions options = greedy_options(16);
  options.sampling = {0.8f, 20, 0.9f, 1234};
  const GenerateResult got = in_step.generate(kPrompt, options);
  const GenerateResult want = host.generate(kPrompt, options);
  EXPECT_FALSE(got.greedy_in_step);
  EXPECT_EQ(got.tokens, want.tokens);
  // Greedy again on the same generator: back in the step, and equal to the host path.
  in_step.reset();
  host.reset();
  EXPECT_EQ(in_step.generate(kPrompt, greedy_options(16)).tokens,
            host.generate(kPrompt, greedy_options(16)).tokens);
}

}  // namespace
}  // namespace splice
