// config.json loading: the Llama family (SmolLM2-135M's real config, Qwen2, Llama 3.1 RoPE
// scaling, transformers 5's `rope_parameters`), FLA's KDAForCausalLM (hybrid and pure), defaults,
// and one clear error per kind of bad input.
#include "splice/model/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "splice/core/error.h"

namespace splice {
namespace {

// SmolLM2-135M's config.json as published (LlamaForCausalLM).
const char* kSmolLM2 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152
})";

// A hybrid FLA KDA config: layers 1 and 3 are attention.
const char* kKdaHybrid = R"({
  "architectures": ["KDAForCausalLM"], "model_type": "kda", "attn_mode": "chunk",
  "hidden_size": 256, "expand_v": 1.0, "use_short_conv": true, "allow_neg_eigval": false,
  "conv_size": 4, "head_dim": 64, "num_heads": 4, "num_v_heads": null,
  "max_position_embeddings": 2048, "hidden_ratio": 4, "intermediate_size": null,
  "hidden_act": "swish", "num_hidden_layers": 4, "norm_eps": 1e-06,
  "attn": {"layers": [3, 1], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": false,
           "window_size": null, "rope_theta": 10000.0},
  "use_cache": true, "pad_token_id": null, "bos_token_id": 1, "eos_token_id": 2,
  "tie_word_embeddings": false, "initializer_range": 0.02, "fuse_norm": true, "fuse_swiglu": true,
  "fuse_cross_entropy": true, "use_l2warp": false, "vocab_size": 1000, "torch_dtype": "float32"
})";

std::string with(const char* base, const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(base);
  if (value == "<delete>")
    j.erase(key);
  else
    j[key] = nlohmann::json::parse(value);
  return j.dump();
}

// Expects parse_config to throw `E` whose message contains every part.
template <typename E>
void expect_error(const std::string& text, std::initializer_list<std::string> parts) {
  try {
    parse_config(text, "config.json");
    ADD_FAILURE() << "no error for " << text;
  } catch (const E& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("config.json: ", 0), 0u) << message;
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

TEST(ConfigTest, ReadsSmolLM2) {
  const ModelConfig c = parse_config(kSmolLM2);
  EXPECT_EQ(c.family, ModelFamily::llama);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);  // 576 / 9
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_ids, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.attention_bias);
  ASSERT_EQ(c.layer_kinds.size(), 30u);
  EXPECT_TRUE(c.is_attention_layer(29));
  EXPECT_FALSE(c.is_attention_layer(30));
  EXPECT_EQ(c.num_kda_layers(), 0);
}

TEST(ConfigTest, LoadsFromFileOrDirectory) {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("splice_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << kSmolLM2;
  }
  EXPECT_EQ(load_config(dir.string()).hidden_size, 576);
  EXPECT_EQ(load_config((dir / "config.json").string()).source, (dir / "config.json").string());
  try {
    load_config((dir / "missing").string());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, Llama3RopeScalingListTokenIdsAndExplicitHeadDim) {
  std::string text = with(kSmolLM2, "rope_scaling",
                          R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  text = with(text.c_str(), "eos_token_id", "[128001, 128008, 128009]");
  text = with(text.c_str(), "head_dim", "128");
  text = with(text.c_str(), "torch_dtype", "<delete>");
  text = with(text.c_str(), "dtype", "\"float16\"");
  const ModelConfig c = parse_config(text);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ConfigTest, TransformersFiveRopeParameters) {
  std::string text = with(kSmolLM2, "rope_theta", "<delete>");
  text =
      with(text.c_str(), "rope_parameters", R"({"rope_type": "default", "rope_theta": 50000.0})");
  const ModelConfig c = parse_config(text);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
}

TEST(ConfigTest, Qwen2HasQkvBias) {
  std::string text = with(kSmolLM2, "architectures", R"(["Qwen2ForCausalLM"])");
  text = with(text.c_str(), "model_type", "\"qwen2\"");
  const ModelConfig c = parse_config(text);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_out_bias);
  expect_error<UnsupportedError>(with(text.c_str(), "use_sliding_window", "true"),
                                 {"use_sliding_window"});
}

TEST(ConfigTest, DefaultsWhenOptionalFieldsAreAbsent) {
  const std::string text = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4})";
  const ModelConfig c = parse_config(text);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_EQ(c.max_position_embeddings, 2048);
  // model_type alone is enough when architectures is absent.
  EXPECT_EQ(
      parse_config(
          with(text.c_str(), "architectures", "<delete>").insert(1, "\"model_type\":\"llama\","))
          .architecture,
      "LlamaForCausalLM");
}

TEST(ConfigTest, ReadsHybridKda) {
  const ModelConfig c = parse_config(kKdaHybrid);
  EXPECT_EQ(c.family, ModelFamily::kda);
  EXPECT_EQ(c.architecture, "KDAForCausalLM");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.hidden_size, 256);
  // FLA's GatedMLP: 256 * ceil(int(256 * 4 * 2 / 3) / 256) = 256 * ceil(682 / 256) = 768.
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.kda.num_heads, 4);
  EXPECT_EQ(c.kda.num_v_heads, 4);  // null -> num_heads
  EXPECT_EQ(c.kda.head_dim, 64);
  EXPECT_EQ(c.kda.head_v_dim, 64);
  EXPECT_EQ(c.kda.key_dim(), 256);
  EXPECT_EQ(c.kda.value_dim(), 256);
  EXPECT_TRUE(c.kda.use_short_conv);
  EXPECT_EQ(c.kda.conv_size, 4);
  EXPECT_FALSE(c.kda.allow_neg_eigval);
  EXPECT_FALSE(c.kda.lower_bound.has_value());
  EXPECT_EQ(c.attention_layers, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(c.layer_kinds, (std::vector<LayerKind>{LayerKind::kda, LayerKind::attention,
                                                   LayerKind::kda, LayerKind::attention}));
  EXPECT_EQ(c.num_kda_layers(), 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // hidden_size / attn.num_heads
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_token_ids, (std::vector<std::int64_t>{1}));
  EXPECT_FALSE(c.pad_token_id.has_value());
}

TEST(ConfigTest, PureKdaAndNewerFlaFields) {
  std::string text = with(kKdaHybrid, "attn", "null");
  text = with(text.c_str(), "expand_v", "2.0");
  text = with(text.c_str(), "num_v_heads", "8");
  text = with(text.c_str(), "lower_bound", "-5.0");
  text = with(text.c_str(), "safe_gate", "true");
  text = with(text.c_str(), "intermediate_size", "300");
  const ModelConfig c = parse_config(text);
  EXPECT_TRUE(c.attention_layers.empty());
  EXPECT_EQ(c.num_kda_layers(), 4);
  EXPECT_EQ(c.num_attention_heads, 0);
  EXPECT_EQ(c.kda.head_v_dim, 128);
  EXPECT_EQ(c.kda.value_dim(), 8 * 128);
  EXPECT_EQ(c.intermediate_size, 300);
  EXPECT_TRUE(c.kda.safe_gate);
  ASSERT_TRUE(c.kda.lower_bound.has_value());
  EXPECT_DOUBLE_EQ(*c.kda.lower_bound, -5.0);
}

TEST(ConfigTest, BadValuesAreClearErrors) {
  expect_error<ValueError>(with(kSmolLM2, "num_attention_heads", "-1"),
                           {"`num_attention_heads` must be a positive integer, got -1"});
  expect_error<ValueError>(with(kSmolLM2, "hidden_size", "\"576\""),
                           {"`hidden_size` must be a positive integer, got \"576\""});
  expect_error<ValueError>(with(kSmolLM2, "vocab_size", "1.5"), {"`vocab_size`", "got 1.5"});
  expect_error<ValueError>(with(kSmolLM2, "vocab_size", "<delete>"),
                           {"missing required field `vocab_size`"});
  expect_error<ValueError>(with(kSmolLM2, "rms_norm_eps", "0"),
                           {"`rms_norm_eps` must be a positive finite number, got 0"});
  expect_error<ValueError>(
      with(kSmolLM2, "num_key_value_heads", "2"),
      {"`num_attention_heads` (9) must be a multiple of `num_key_value_heads` (2)"});
  expect_error<ValueError>(with(kSmolLM2, "tie_word_embeddings", "1"),
                           {"`tie_word_embeddings` must be true or false"});
  expect_error<ValueError>(with(kSmolLM2, "eos_token_id", "[1, \"x\"]"), {"`eos_token_id`"});
  expect_error<ValueError>(
      with(with(kSmolLM2, "num_attention_heads", "7").c_str(), "num_key_value_heads", "7"),
      {"`hidden_size` (576) must be a multiple of `num_attention_heads` (7)"});
  expect_error<ValueError>(
      with(kSmolLM2, "rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})"),
      {"`rope_scaling.low_freq_factor`"});
  expect_error<ValueError>(with(kKdaHybrid, "attn", R"({"layers": [0, 4], "num_heads": 4})"),
                           {"`attn.layers` entries must be layer indices in [0, 4), got 4"});
  expect_error<ValueError>(with(kKdaHybrid, "attn", R"({"layers": [1]})"),
                           {"missing required field `attn.num_heads`"});
  expect_error<ValueError>(with(kKdaHybrid, "num_v_heads", "6"),
                           {"`num_v_heads` (6) must be a multiple of `num_heads` (4)"});
  expect_error<ValueError>(with(kKdaHybrid, "lower_bound", "0.5"),
                           {"`lower_bound` must be negative"});
  expect_error<ValueError>(with(kSmolLM2, "num_hidden_layers", "3000000000"),
                           {"`num_hidden_layers` must be at most 4096, got 3000000000"});
  // Sizes derived in floating point are bounded before their conversion (found by the JSON
  // fuzzer: a 100-digit expand_v made the conversion undefined).
  expect_error<ValueError>(with(kKdaHybrid, "expand_v", "2.5e100"),
                           {"`head_dim` * `expand_v` (64 * 2.5e+100) must be at least 1"});
  expect_error<ValueError>(with(kKdaHybrid, "hidden_ratio", "9000000000000000000"),
                           {"`hidden_size` * `hidden_ratio` * 2 / 3 (256 * 9000000000000000000"});
  expect_error<IoError>("{\"architectures\": [", {"not valid JSON"});
  expect_error<IoError>("[1]", {"must be a JSON object"});
}

TEST(ConfigTest, UnsupportedArchitecturesAndFeatures) {
  expect_error<UnsupportedError>(
      with(kSmolLM2, "architectures", R"(["GPT2LMHeadModel"])"),
      {"architecture 'GPT2LMHeadModel' is not supported", "LlamaForCausalLM", "KDAForCausalLM"});
  expect_error<UnsupportedError>(
      with(with(kSmolLM2, "architectures", "<delete>").c_str(), "model_type", "\"mamba\""),
      {"`model_type` 'mamba'"});
  expect_error<UnsupportedError>(with(kSmolLM2, "rope_scaling", R"({"type": "yarn", "factor": 4})"),
                                 {"`rope_scaling` type 'yarn' is not supported"});
  expect_error<UnsupportedError>(with(kSmolLM2, "hidden_act", "\"gelu\""),
                                 {"`hidden_act` 'gelu' is not supported"});
  expect_error<UnsupportedError>(
      with(kKdaHybrid, "attn", R"({"layers": [1], "num_heads": 4, "window_size": 512})"),
      {"`attn.window_size` 512"});
  expect_error<UnsupportedError>(with(kKdaHybrid, "attnres_block_size", "2"),
                                 {"`attnres_block_size` 2"});
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.has_value(), b.rope_scaling.has_value());
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_ids, b.bos_token_ids);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.layer_kinds, b.layer_kinds);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.kda.num_heads, b.kda.num_heads);
  EXPECT_EQ(a.kda.num_v_heads, b.kda.num_v_heads);
  EXPECT_EQ(a.kda.head_v_dim, b.kda.head_v_dim);
  EXPECT_EQ(a.kda.conv_size, b.kda.conv_size);
  EXPECT_EQ(a.kda.lower_bound, b.kda.lower_bound);
}

TEST(ConfigTest, WritesConfigJsonThatReadsBack) {
  const ModelConfig llama =
      parse_config(with(kSmolLM2, "rope_scaling",
                        R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  expect_same(parse_config(to_config_json(llama)), llama);
  const ModelConfig kda = parse_config(with(kKdaHybrid, "lower_bound", "-5.0"));
  expect_same(parse_config(to_config_json(kda)), kda);
  const ModelConfig pure = parse_config(with(kKdaHybrid, "attn", "null"));
  expect_same(parse_config(to_config_json(pure)), pure);
}

}  // namespace
}  // namespace splice
