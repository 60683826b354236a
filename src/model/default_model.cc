// The embedded default model (see default_model.h):
//   1. default_model_config(): the ModelConfig, whose to_config_json is FLA's config.json;
//   2. make_kda_weights(): every weight FLA's KDAForCausalLM names for a config, from one seeded
//      generator; write_default_model() saves them (save_safetensors, bf16) beside the config;
//   3. default_model_dir(): the cache directory, filled through a temporary sibling + rename.
#include "splice/model/default_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/model/safetensors.h"

namespace splice {

namespace {

constexpr std::uint64_t kSeed = 20261130;
constexpr std::int64_t kHidden = 256, kVocab = 512, kIntermediate = 512, kLayers = 4;
constexpr std::int64_t kAttentionLayer = 2;
constexpr std::int64_t kKdaHeads = 2, kKdaHeadDim = 128, kConvSize = 4;
constexpr std::int64_t kAttnHeads = 4, kAttnKvHeads = 2;
constexpr double kLowerBound = -5.0;
constexpr double kNormJitter = 0.05;                             // norm weights 1 + N(0, jitter^2)
constexpr double kConvStd = 0.3;                                 // conv taps
constexpr double kGateBiasStd = 0.1;                             // g_proj.1.bias
constexpr double kDtMin = 1e-3, kDtMax = 1e-1, kDtFloor = 1e-4;  // FLA's dt_bias init
constexpr double kALo = 1.0, kAHi = 16.0;                        // FLA's A_log init

class WeightMaker {
 public:
  explicit WeightMaker(std::uint64_t seed) : rng_(seed) {}
  void normal(const std::string& name, const Dims& shape, double stddev, double mean = 0.0) {
    Tensor t = Tensor::empty(shape, DType::bf16);
    rng_.normal(t, mean, stddev);
    out_.emplace_back(name, std::move(t));
  }
  // Linear weight [out, in] ~ N(0, 1/in): unit-variance outputs for unit-variance inputs.
  void linear(const std::string& name, std::int64_t out, std::int64_t in) {
    normal(name, {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
  }
  void norm(const std::string& name, std::int64_t n) { normal(name, {n}, kNormJitter, 1.0); }
  void a_log(const std::string& name, std::int64_t heads) {
    Tensor t = Tensor::empty({heads}, DType::f32);
    rng_.uniform(t, kALo, kAHi);
    for (std::int64_t h = 0; h < heads; ++h) t.set({h}, std::log(t.at({h})));
    out_.emplace_back(name, std::move(t));
  }
  void dt_bias(const std::string& name, std::int64_t n) {
    Tensor t = Tensor::empty({n}, DType::f32);
    rng_.uniform(t, 0.0, 1.0);
    for (std::int64_t i = 0; i < n; ++i) {
      const double dt = std::max(
          kDtFloor, std::exp(t.at({i}) * (std::log(kDtMax) - std::log(kDtMin)) + std::log(kDtMin)));
      t.set({i}, dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt)
    }
    out_.emplace_back(name, std::move(t));
  }
  std::vector<std::pair<std::string, Tensor>>& tensors() { return out_; }

 private:
  Rng rng_;
  std::vector<std::pair<std::string, Tensor>> out_;
};

std::filesystem::path cache_root() {
  namespace fs = std::filesystem;
  if (const char* dir = std::getenv("SPLICE_CACHE_DIR"); dir && *dir) return fs::path(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "splice";
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "splice";
  return fs::temp_directory_path() / "splice";
}

}  // namespace

ModelConfig default_model_config() {
  ModelConfig c;
  c.source = "splice default model";
  c.architecture = "KDAForCausalLM";
  c.model_type = "kda";
  c.family = ModelFamily::kda;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.intermediate_size = kIntermediate;
  c.num_hidden_layers = kLayers;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.hidden_act = "swish";
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  c.torch_dtype = "bfloat16";
  c.num_attention_heads = kAttnHeads;
  c.num_key_value_heads = kAttnKvHeads;
  c.head_dim = kHidden / kAttnHeads;
  c.rope_theta = 10000.0;
  c.kda.num_heads = kKdaHeads;
  c.kda.num_v_heads = kKdaHeads;
  c.kda.head_dim = kKdaHeadDim;
  c.kda.expand_v = 1.0;
  c.kda.head_v_dim = kKdaHeadDim;
  c.kda.conv_size = kConvSize;
  c.kda.lower_bound = kLowerBound;
  c.attention_layers = {kAttentionLayer};
  c.layer_kinds.assign(kLayers, LayerKind::kda);
  c.layer_kinds[kAttentionLayer] = LayerKind::attention;
  return c;
}

std::vector<std::pair<std::string, Tensor>> make_kda_weights(const ModelConfig& c,
                                                             std::uint64_t seed) {
  if (c.family != ModelFamily::kda)
    fail<ValueError>("make_kda_weights needs a KDAForCausalLM config, got '", c.architecture, "'");
  WeightMaker w(seed);
  const KdaLayerConfig& k = c.kda;
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const std::int64_t kd = k.key_dim(), vd = k.value_dim(), dv = k.head_v_dim, hv = k.num_v_heads;
  const std::int64_t qd = c.num_attention_heads * c.head_dim,
                     kvd = c.num_key_value_heads * c.head_dim;
  // A tied table doubles as lm_head: scale it like one so logits stay O(1) either way.
  w.normal("model.embeddings.weight", {vocab, hidden},
           c.tie_word_embeddings ? 1.0 / std::sqrt(static_cast<double>(hidden)) : 1.0);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.norm(p + "attn_norm.weight", hidden);
    if (c.is_attention_layer(l)) {
      w.linear(p + "attn.q_proj.weight", qd, hidden);
      w.linear(p + "attn.k_proj.weight", kvd, hidden);
      w.linear(p + "attn.v_proj.weight", kvd, hidden);
      if (c.attention_bias) {
        w.normal(p + "attn.q_proj.bias", {qd}, kGateBiasStd);
        w.normal(p + "attn.k_proj.bias", {kvd}, kGateBiasStd);
        w.normal(p + "attn.v_proj.bias", {kvd}, kGateBiasStd);
      }
      w.linear(p + "attn.o_proj.weight", hidden, qd);
    } else {
      w.linear(p + "attn.q_proj.weight", kd, hidden);
      w.linear(p + "attn.k_proj.weight", kd, hidden);
      w.linear(p + "attn.v_proj.weight", vd, hidden);
      if (k.use_short_conv) {
        w.normal(p + "attn.q_conv1d.weight", {kd, 1, k.conv_size}, kConvStd);
        w.normal(p + "attn.k_conv1d.weight", {kd, 1, k.conv_size}, kConvStd);
        w.normal(p + "attn.v_conv1d.weight", {vd, 1, k.conv_size}, kConvStd);
      }
      w.linear(p + "attn.f_proj.0.weight", dv, hidden);
      w.linear(p + "attn.f_proj.1.weight", hv * k.head_dim, dv);
      w.linear(p + "attn.b_proj.weight", hv, hidden);
      w.a_log(p + "attn.A_log", hv);
      w.dt_bias(p + "attn.dt_bias", hv * k.head_dim);
      w.linear(p + "attn.g_proj.0.weight", dv, hidden);
      w.linear(p + "attn.g_proj.1.weight", vd, dv);
      w.normal(p + "attn.g_proj.1.bias", {vd}, kGateBiasStd);
      w.norm(p + "attn.o_norm.weight", dv);
      w.linear(p + "attn.o_proj.weight", hidden, vd);
    }
    w.norm(p + "mlp_norm.weight", hidden);
    w.linear(p + "mlp.gate_proj.weight", inter, hidden);
    w.linear(p + "mlp.up_proj.weight", inter, hidden);
    w.linear(p + "mlp.down_proj.weight", hidden, inter);
  }
  w.norm("model.norm.weight", hidden);
  if (!c.tie_word_embeddings) w.linear("lm_head.weight", vocab, hidden);
  return std::move(w.tensors());
}

void write_default_model(const std::string& dir) {
  namespace fs = std::filesystem;
  const ModelConfig c = default_model_config();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail<IoError>("cannot create the default model directory '", dir, "': ", ec.message());
  const auto tensors = make_kda_weights(c, kSeed);
  const fs::path config_path = fs::path(dir) / "config.json";
  {
    std::ofstream out(config_path, std::ios::binary | std::ios::trunc);
    if (!out) fail<IoError>("cannot write '", config_path.string(), "'");
    out << to_config_json(c) << "\n";
    if (!out) fail<IoError>("writing '", config_path.string(), "' failed");
  }
  save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors,
                   {{"format", "pt"},
                    {"producer", "splice default model v" + std::to_string(kDefaultModelVersion)}});
}

std::string default_model_dir() {
  namespace fs = std::filesystem;
  const fs::path root = cache_root();
  const fs::path dir = root / ("default-model-v" + std::to_string(kDefaultModelVersion));
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec) && fs::exists(dir / "model.safetensors", ec))
    return dir.string();
  fs::create_directories(root, ec);
  if (ec) fail<IoError>("cannot create the cache directory '", root.string(), "': ", ec.message());
  const fs::path tmp = root / (dir.filename().string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  write_default_model(tmp.string());
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Another process won the race (the directory now exists): keep its copy.
    fs::remove_all(tmp, ec);
    if (!fs::exists(dir / "model.safetensors", ec))
      fail<IoError>("cannot move the default model into '", dir.string(), "'");
  }
  return dir.string();
}

}  // namespace splice
