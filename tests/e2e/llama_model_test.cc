// The Llama-family builder end to end: a tiny random Llama saved as a real safetensors +
// config.json directory, loaded back, decoded through the planned Session (decomposed arms, then
// with the optimizer's fused arms) and checked against the float64 reference at every step;
// the sampler's options and reproducibility; loader errors.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "splice/core/error.h"
#include "splice/model/generate.h"
#include "splice/model/safetensors.h"
#include "support/reference_llama.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

std::string write_tiny_llama(const std::string& dir, bool tied) {
  testing::TinyLlamaSpec spec;
  spec.tied = tied;
  return testing::write_tiny_llama(dir, spec);
}

class TinyLlama : public ::testing::TestWithParam<bool> {};

TEST_P(TinyLlama, MatchesFloat64ReferenceEveryStep) {
  const bool optimized = GetParam();
  const std::string dir = write_tiny_llama(
      testing::process_temp_path("tiny_llama_" + std::to_string(optimized)), optimized);
  const ModelConfig config = load_config(dir + "/config.json");
  const Weights weights = Weights::from_directory(dir);
  BuildOptions build;
  build.max_seq_len = 32;
  build.dtype = DType::f32;
  GeneratorOptions go;
  go.optimize.select = optimized;
  go.optimize.tune.time_override = [](NodeId, int arm, std::int64_t) {
    return arm == 1 ? 1.0 : 2.0;
  };
  Generator gen(build_decode_model(config, weights, build), go);
  if (optimized) {
    for (const auto& d : gen.decisions().entries()) EXPECT_EQ(d.collapsed_to, 1) << d.reason;
  }
  testing::ReferenceLlama ref(config, weights);
  Rng rng(9);
  for (int step = 0; step < 20; ++step) {
    const auto token = static_cast<std::int32_t>(rng.integer(0, 96));
    const Tensor logits = gen.step(token);
    const std::vector<double> expected = ref.step(token);
    Tensor e = Tensor::empty({97}, DType::f32);
    for (int i = 0; i < 97; ++i) e.set({i}, expected[i]);
    ASSERT_TRUE(testing::close(logits, e, {2e-4, 2e-4})) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(DecomposedAndOptimized, TinyLlama, ::testing::Bool());

TEST(Generate, GreedyAndSeededSamplingAreReproducible) {
  const std::string dir = write_tiny_llama(testing::process_temp_path("tiny_llama_gen"), true);
  const ModelConfig config = load_config(dir + "/config.json");
  const Weights weights = Weights::from_directory(dir);
  BuildOptions build;
  build.max_seq_len = 64;
  build.dtype = DType::bf16;
  GeneratorOptions go;
  go.optimize.select = false;
  Generator gen(build_decode_model(config, weights, build), go);
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  std::vector<std::int32_t> streamed;
  opt.on_token = [&](std::int32_t t) { streamed.push_back(t); };
  const auto a = gen.generate({1, 5, 9}, opt);
  EXPECT_EQ(a.tokens, streamed);
  gen.reset();
  const auto b = gen.generate({1, 5, 9}, opt);
  EXPECT_EQ(a.tokens, b.tokens);  // greedy is deterministic
  opt.sampling = {0.8f, 20, 0.9f, 1234};
  opt.on_token = nullptr;
  gen.reset();
  const auto c = gen.generate({1, 5, 9}, opt);
  gen.reset();
  const auto d = gen.generate({1, 5, 9}, opt);
  EXPECT_EQ(c.tokens, d.tokens);  // same seed, same tokens
  opt.stop_tokens = {c.tokens[3]};
  gen.reset();
  const auto e = gen.generate({1, 5, 9}, opt);
  EXPECT_TRUE(e.stopped_on_token);
  EXPECT_LE(e.tokens.size(), 4u);
  EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0}), ValueError);
  EXPECT_THROW(Sampler({1.0f, -2, 1.0f, 0}), ValueError);
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), ValueError);
  {
    // Above temperature 0 a non-finite logit is an error naming it (session 51: a NaN broke the
    // top-k sort's ordering and the softmax); -inf (a masked token) is fine while one is finite.
    Sampler sampler({0.8f, 0, 1.0f, 7});
    Tensor logits = Tensor::empty({5}, DType::f32);
    for (std::int64_t i = 0; i < 5; ++i) logits.set({i}, 0.5 * static_cast<double>(i));
    logits.set({4}, -std::numeric_limits<double>::infinity());
    for (int draw = 0; draw < 20; ++draw) EXPECT_NE(sampler.sample(logits), 4);
    for (const double bad :
         {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      Tensor poisoned = logits.clone();
      poisoned.set({2}, bad);
      try {
        sampler.sample(poisoned);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("logit 2 of 5"), std::string::npos) << e.what();
      }
      EXPECT_EQ(Sampler({0.0f, 0, 1.0f, 7}).sample(poisoned), bad > 0 ? 2 : 3);  // greedy: argmax
    }
    logits.fill(-std::numeric_limits<double>::infinity());
    EXPECT_THROW(sampler.sample(logits), ValueError);
  }
  EXPECT_THROW(gen.step(97), ValueError);
  gen.reset();
  EXPECT_THROW(gen.generate(std::vector<std::int32_t>(65, 1), GenerateOptions{}), ValueError);
}

TEST(Loading, MissingOrMalformedWeightsAreClearErrors) {
  const std::string dir = write_tiny_llama(testing::process_temp_path("tiny_llama_bad"), true);
  const ModelConfig config = load_config(dir + "/config.json");
  EXPECT_THROW(Weights::from_directory(dir + "/nope"), IoError);
  const Weights weights = Weights::from_directory(dir);
  EXPECT_THROW(weights.get("model.missing.weight", DType::f32), IoError);
  EXPECT_THROW(weights.get("model.norm.weight", DType::f32, {63}), ShapeError);
  BuildOptions too_long;
  too_long.max_seq_len = 512;  // > max_position_embeddings
  EXPECT_THROW(build_decode_model(config, weights, too_long), ValueError);
  ModelConfig wrong = config;
  wrong.hidden_size = 80;
  try {
    BuildOptions small;
    small.max_seq_len = 16;
    build_decode_model(wrong, weights, small);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace splice
