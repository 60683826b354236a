// Hugging Face config.json loading (see config.h for the stages and docs/model-formats.md for every
// field).
#include "splice/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "splice/core/error.h"

namespace splice {

namespace {

using Json = nlohmann::json;

constexpr const char* kLlamaArchitectures[] = {"LlamaForCausalLM", "Qwen2ForCausalLM"};
constexpr const char* kKdaArchitecture = "KDAForCausalLM";
// FLA's GatedMLP default: intermediate = 256 * ceil(int(hidden * ratio * 2 / 3) / 256).
constexpr std::int64_t kFlaMlpMultiple = 256;
constexpr std::int64_t kFlaDefaultHiddenRatio = 4;
// The bound on sizes a config derives in floating point (head_dim * expand_v, the FLA MLP width),
// so the conversion to int64 and the rounding up after it stay defined.
constexpr double kMaxDerivedDim = 0x1p62;

std::string supported_list() {
  std::string out;
  for (const char* name : kLlamaArchitectures) out += std::string(name) + ", ";
  return out + kKdaArchitecture;
}

// Field readers over one JSON object, each failure naming the source and the field.
class Fields {
 public:
  Fields(const Json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_[key].is_null(); }
  const Json& raw(const char* key) const { return object_[key]; }
  std::string name(const char* key) const { return prefix_ + key; }

  template <typename... Args>
  [[noreturn]] void bad(const char* key, Args&&... args) const {
    fail<ValueError>(source_, ": `", name(key), "` ", std::forward<Args>(args)...);
  }

  std::int64_t integer(const char* key, std::optional<std::int64_t> fallback,
                       std::int64_t min) const {
    if (!has(key)) {
      if (!fallback) fail<ValueError>(source_, ": missing required field `", name(key), "`");
      return *fallback;
    }
    const Json& v = object_[key];
    const bool is_int = v.is_number_integer() &&
                        (!v.is_number_unsigned() ||
                         v.get<std::uint64_t>() <=
                             static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
    if (!is_int || v.get<std::int64_t>() < min) {
      const char* what = min > 0    ? "a positive integer"
                         : min == 0 ? "a non-negative integer"
                                    : "an integer";
      bad(key, "must be ", what, ", got ", v.dump());
    }
    return v.get<std::int64_t>();
  }
  std::int64_t positive(const char* key,
                        std::optional<std::int64_t> fallback = std::nullopt) const {
    return integer(key, fallback, 1);
  }

  double real(const char* key, std::optional<double> fallback, bool positive_only) const {
    if (!has(key)) {
      if (!fallback) fail<ValueError>(source_, ": missing required field `", name(key), "`");
      return *fallback;
    }
    const Json& v = object_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) ||
        (positive_only && !(v.get<double>() > 0.0)))
      bad(key, "must be a ", positive_only ? "positive " : "", "finite number, got ", v.dump());
    return v.get<double>();
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!object_[key].is_boolean()) bad(key, "must be true or false, got ", object_[key].dump());
    return object_[key].get<bool>();
  }

  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!object_[key].is_string()) bad(key, "must be a string, got ", object_[key].dump());
    return object_[key].get<std::string>();
  }

  // An int, a list of ints, or null/absent (empty).
  std::vector<std::int64_t> token_ids(const char* key, std::vector<std::int64_t> fallback) const {
    if (!object_.contains(key)) return fallback;
    const Json& v = object_[key];
    std::vector<std::int64_t> out;
    auto take = [&](const Json& item) {
      if (!item.is_number_integer() || item.get<std::int64_t>() < 0)
        bad(key, "must be a non-negative integer, a list of them, or null, got ", v.dump());
      out.push_back(item.get<std::int64_t>());
    };
    if (v.is_null()) return out;
    if (v.is_array()) {
      for (const auto& item : v) take(item);
    } else {
      take(v);
    }
    return out;
  }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
};

RopeScaling read_rope_scaling(const Json& object, const std::string& source,
                              const std::string& key) {
  if (!object.is_object())
    fail<ValueError>(source, ": `", key, "` must be an object or null, got ", object.dump());
  Fields f(object, source, key + ".");
  RopeScaling scaling;
  scaling.type = f.string("rope_type", f.string("type", ""));
  if (scaling.type == "llama3") {
    scaling.factor = f.real("factor", std::nullopt, true);
    scaling.low_freq_factor = f.real("low_freq_factor", std::nullopt, true);
    scaling.high_freq_factor = f.real("high_freq_factor", std::nullopt, true);
    scaling.original_max_position_embeddings = f.positive("original_max_position_embeddings");
    if (!(scaling.high_freq_factor > scaling.low_freq_factor))
      fail<ValueError>(source, ": `", key, ".high_freq_factor` (", scaling.high_freq_factor,
                       ") must exceed `", key, ".low_freq_factor` (", scaling.low_freq_factor, ")");
  } else if (scaling.type == "linear") {
    scaling.factor = f.real("factor", std::nullopt, true);
  } else {
    fail<UnsupportedError>(source, ": `", key, "` type '", scaling.type,
                           "' is not supported (supported: default, llama3, linear)");
  }
  return scaling;
}

// Llama/Qwen2 RoPE: `rope_theta` + `rope_scaling` (transformers 4), or `rope_parameters`
// {rope_type, rope_theta, ...} (transformers 5).
void read_rope(const Json& j, const Fields& f, ModelConfig& c) {
  c.rope_theta = f.real("rope_theta", 10000.0, true);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!f.has(key)) continue;
    const Json& r = f.raw(key);
    if (!r.is_object())
      fail<ValueError>(c.source, ": `", key, "` must be an object or null, got ", r.dump());
    Fields rf(r, c.source, std::string(key) + ".");
    if (rf.has("rope_theta")) c.rope_theta = rf.real("rope_theta", std::nullopt, true);
    const std::string type = rf.string("rope_type", rf.string("type", "default"));
    if (type != "default") c.rope_scaling = read_rope_scaling(r, c.source, key);
  }
  (void)j;
}

void read_common(const Fields& f, ModelConfig& c) {
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  if (c.num_hidden_layers > kMaxModelLayers)
    f.bad("num_hidden_layers", "must be at most ", kMaxModelLayers, ", got ", c.num_hidden_layers);
  c.bos_token_ids = f.token_ids("bos_token_id", {});
  c.eos_token_ids = f.token_ids("eos_token_id", {});
  if (f.has("pad_token_id")) c.pad_token_id = f.integer("pad_token_id", std::nullopt, 0);
  c.torch_dtype = f.string("torch_dtype", f.string("dtype", ""));
}

void check_act(const Fields& f, const ModelConfig& c, const char* key) {
  if (c.hidden_act != "silu" && c.hidden_act != "swish")
    fail<UnsupportedError>(c.source, ": `", f.name(key), "` '", c.hidden_act,
                           "' is not supported (supported: silu, swish)");
}

void check_heads(const ModelConfig& c, const char* heads_key, const char* kv_key) {
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail<ValueError>(c.source, ": `", heads_key, "` (", c.num_attention_heads,
                     ") must be a multiple of `", kv_key, "` (", c.num_key_value_heads, ")");
}

void read_llama(const Json& j, ModelConfig& c) {
  Fields f(j, c.source);
  read_common(f, c);
  c.intermediate_size = f.positive("intermediate_size");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  check_heads(c, "num_attention_heads", "num_key_value_heads");
  if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail<ValueError>(c.source, ": `hidden_size` (", c.hidden_size,
                       ") must be a multiple of `num_attention_heads` (", c.num_attention_heads,
                       ") when `head_dim` is absent");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.positive("max_position_embeddings", 2048);
  c.rms_norm_eps = f.real("rms_norm_eps", 1e-6, true);
  read_rope(j, f, c);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.hidden_act = f.string("hidden_act", "silu");
  check_act(f, c, "hidden_act");
  if (c.architecture == "Qwen2ForCausalLM") {
    // Qwen2 always has q/k/v biases and no o_proj bias; sliding windows are off by default.
    c.attention_bias = true;
    if (f.boolean("use_sliding_window", false))
      fail<UnsupportedError>(c.source, ": `use_sliding_window` true is not supported");
  } else {
    c.attention_bias = f.boolean("attention_bias", false);
    c.attention_out_bias = c.attention_bias;
    c.mlp_bias = f.boolean("mlp_bias", false);
  }
  c.layer_kinds.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerKind::attention);
}

void read_kda(const Json& j, ModelConfig& c) {
  Fields f(j, c.source);
  read_common(f, c);
  // FLA's defaults (KDAConfig.__init__): bos 1, eos 2.
  if (!j.contains("bos_token_id")) c.bos_token_ids = {1};
  if (!j.contains("eos_token_id")) c.eos_token_ids = {2};
  c.max_position_embeddings = f.positive("max_position_embeddings", 2048);
  c.rms_norm_eps = f.real("norm_eps", 1e-6, true);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.hidden_act = f.string("hidden_act", "swish");
  check_act(f, c, "hidden_act");
  if (f.has("intermediate_size")) {
    c.intermediate_size = f.positive("intermediate_size");
  } else {
    const std::int64_t ratio = f.positive("hidden_ratio", kFlaDefaultHiddenRatio);
    // In double: hidden_size * ratio may not fit int64 (then the size is refused, not wrapped).
    const double raw = static_cast<double>(c.hidden_size) * static_cast<double>(ratio) * 2 / 3;
    if (!(raw < kMaxDerivedDim))
      fail<ValueError>(c.source, ": `hidden_size` * `hidden_ratio` * 2 / 3 (", c.hidden_size, " * ",
                       ratio, " * 2 / 3) must be below 2^62");
    const auto raw_size = static_cast<std::int64_t>(raw);
    c.intermediate_size = kFlaMlpMultiple * ((raw_size + kFlaMlpMultiple - 1) / kFlaMlpMultiple);
  }
  if (f.has("attnres_block_size"))
    fail<UnsupportedError>(c.source, ": `attnres_block_size` ", f.raw("attnres_block_size").dump(),
                           " (attention residuals) is not supported; it must be null");

  KdaLayerConfig& k = c.kda;
  k.attn_mode = f.string("attn_mode", "chunk");
  k.num_heads = f.positive("num_heads", 16);
  k.num_v_heads = f.positive("num_v_heads", k.num_heads);
  k.head_dim = f.positive("head_dim", 128);
  k.expand_v = f.real("expand_v", 1.0, true);
  const double head_v_dim = static_cast<double>(k.head_dim) * k.expand_v;
  if (!(head_v_dim >= 1.0 && head_v_dim < kMaxDerivedDim))
    fail<ValueError>(c.source, ": `head_dim` * `expand_v` (", k.head_dim, " * ", k.expand_v,
                     ") must be at least 1 and below 2^62");
  k.head_v_dim = static_cast<std::int64_t>(head_v_dim);
  if (k.num_v_heads % k.num_heads != 0)
    fail<ValueError>(c.source, ": `num_v_heads` (", k.num_v_heads,
                     ") must be a multiple of `num_heads` (", k.num_heads, ")");
  k.use_short_conv = f.boolean("use_short_conv", true);
  k.conv_size = f.positive("conv_size", 4);
  k.allow_neg_eigval = f.boolean("allow_neg_eigval", false);
  k.safe_gate = f.boolean("safe_gate", false);
  if (f.has("lower_bound")) {
    const double bound = f.real("lower_bound", std::nullopt, false);
    if (!(bound < 0.0)) f.bad("lower_bound", "must be negative or null, got ", bound);
    k.lower_bound = bound;
  }

  c.layer_kinds.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerKind::kda);
  if (!f.has("attn")) return;
  const Json& attn = f.raw("attn");
  if (!attn.is_object()) f.bad("attn", "must be an object or null, got ", attn.dump());
  Fields a(attn, c.source, "attn.");
  if (!a.has("layers")) fail<ValueError>(c.source, ": missing required field `attn.layers`");
  if (!a.raw("layers").is_array())
    a.bad("layers", "must be a list of layer indices, got ", a.raw("layers").dump());
  std::set<std::int64_t> layers;
  for (const auto& item : a.raw("layers")) {
    if (!item.is_number_integer() || item.get<std::int64_t>() < 0 ||
        item.get<std::int64_t>() >= c.num_hidden_layers)
      a.bad("layers", "entries must be layer indices in [0, ", c.num_hidden_layers, "), got ",
            item.dump());
    if (!layers.insert(item.get<std::int64_t>()).second)
      a.bad("layers", "repeats layer ", item.dump());
  }
  c.attention_layers.assign(layers.begin(), layers.end());
  for (auto layer : c.attention_layers)
    c.layer_kinds[static_cast<std::size_t>(layer)] = LayerKind::attention;
  c.num_attention_heads = a.positive("num_heads");
  c.num_key_value_heads = a.positive("num_kv_heads", c.num_attention_heads);
  check_heads(c, "attn.num_heads", "attn.num_kv_heads");
  // FLA's Attention: head_dim = hidden_size // num_heads; q and o are hidden_size wide.
  if (c.hidden_size % c.num_attention_heads != 0)
    fail<ValueError>(c.source, ": `hidden_size` (", c.hidden_size,
                     ") must be a multiple of `attn.num_heads` (", c.num_attention_heads, ")");
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.attention_bias = a.boolean("qkv_bias", false);
  if (a.has("window_size"))
    fail<UnsupportedError>(c.source, ": `attn.window_size` ", a.raw("window_size").dump(),
                           " (sliding-window attention) is not supported; it must be null");
  if (a.boolean("qk_norm", false))
    fail<UnsupportedError>(c.source, ": `attn.qk_norm` true is not supported");
  c.rope_theta = a.real("rope_theta", 10000.0, true);
}

std::string architecture_of(const Json& j, const std::string& source) {
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const Json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string())
      fail<ValueError>(source, ": `architectures` must be a non-empty list of strings, got ",
                       a.dump());
    return a[0].get<std::string>();
  }
  // No architectures list: infer from model_type.
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : std::string();
  if (type == "llama") return "LlamaForCausalLM";
  if (type == "qwen2") return "Qwen2ForCausalLM";
  if (type == "kda") return kKdaArchitecture;
  fail<UnsupportedError>(source, ": no `architectures` list and `model_type` '", type,
                         "' is not supported (supported: ", supported_list(), ")");
}

}  // namespace

bool ModelConfig::is_attention_layer(std::int64_t layer) const {
  return layer >= 0 && layer < static_cast<std::int64_t>(layer_kinds.size()) &&
         layer_kinds[static_cast<std::size_t>(layer)] == LayerKind::attention;
}

std::int64_t ModelConfig::num_kda_layers() const {
  return std::count(layer_kinds.begin(), layer_kinds.end(), LayerKind::kda);
}

namespace {
ModelConfig config_from_json(const Json& j, const std::string& source);
}  // namespace

ModelConfig parse_config(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail<IoError>(source, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail<IoError>(source, ": must be a JSON object, got ", j.type_name());
  try {
    return config_from_json(j, source);
  } catch (const Json::exception& e) {
    fail<IoError>(source, ": malformed config: ", e.what());
  }
}

namespace {

ModelConfig config_from_json(const Json& j, const std::string& source) {
  ModelConfig c;
  c.source = source;
  c.architecture = architecture_of(j, source);
  c.model_type = j.contains("model_type") && j["model_type"].is_string()
                     ? j["model_type"].get<std::string>()
                     : std::string();
  const bool llama = std::find_if(std::begin(kLlamaArchitectures), std::end(kLlamaArchitectures),
                                  [&](const char* name) { return c.architecture == name; }) !=
                     std::end(kLlamaArchitectures);
  if (llama) {
    c.family = ModelFamily::llama;
    read_llama(j, c);
  } else if (c.architecture == kKdaArchitecture) {
    c.family = ModelFamily::kda;
    read_kda(j, c);
  } else {
    fail<UnsupportedError>(source, ": architecture '", c.architecture,
                           "' is not supported (supported: ", supported_list(), ")");
  }
  return c;
}

}  // namespace

std::string to_config_json(const ModelConfig& c) {
  Json j = Json::object();
  j["architectures"] = {c.architecture};
  j["model_type"] =
      c.model_type.empty() ? (c.family == ModelFamily::kda ? "kda" : "llama") : c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  auto ids = [](const std::vector<std::int64_t>& v) -> Json {
    if (v.empty()) return nullptr;
    if (v.size() == 1) return v.front();
    return v;
  };
  j["bos_token_id"] = ids(c.bos_token_ids);
  j["eos_token_id"] = ids(c.eos_token_ids);
  j["pad_token_id"] = c.pad_token_id ? Json(*c.pad_token_id) : Json(nullptr);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  if (c.family == ModelFamily::llama) {
    j["hidden_act"] = c.hidden_act;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_dim;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.rope_scaling) {
      Json r = {{"rope_type", c.rope_scaling->type}, {"factor", c.rope_scaling->factor}};
      if (c.rope_scaling->type == "llama3") {
        r["low_freq_factor"] = c.rope_scaling->low_freq_factor;
        r["high_freq_factor"] = c.rope_scaling->high_freq_factor;
        r["original_max_position_embeddings"] = c.rope_scaling->original_max_position_embeddings;
      }
      j["rope_scaling"] = r;
    } else {
      j["rope_scaling"] = nullptr;
    }
    if (c.architecture != "Qwen2ForCausalLM") {
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
    }
    return j.dump(2);
  }
  const KdaLayerConfig& k = c.kda;
  j["hidden_act"] = c.hidden_act == "silu" ? "swish" : c.hidden_act;
  j["norm_eps"] = c.rms_norm_eps;
  j["attn_mode"] = k.attn_mode;
  j["num_heads"] = k.num_heads;
  j["num_v_heads"] = k.num_v_heads;
  j["head_dim"] = k.head_dim;
  j["expand_v"] = k.expand_v;
  j["use_short_conv"] = k.use_short_conv;
  j["conv_size"] = k.conv_size;
  j["allow_neg_eigval"] = k.allow_neg_eigval;
  if (k.safe_gate) j["safe_gate"] = true;
  if (k.lower_bound) j["lower_bound"] = *k.lower_bound;
  if (c.attention_layers.empty()) {
    j["attn"] = nullptr;
  } else {
    j["attn"] = {{"layers", c.attention_layers},
                 {"num_heads", c.num_attention_heads},
                 {"num_kv_heads", c.num_key_value_heads},
                 {"qkv_bias", c.attention_bias},
                 {"window_size", nullptr},
                 {"rope_theta", c.rope_theta}};
  }
  return j.dump(2);
}

ModelConfig load_config(const std::string& path) {
  std::filesystem::path file(path);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail<IoError>(file.string(), ": cannot open the model config");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail<IoError>(file.string(), ": reading failed");
  return parse_config(text.str(), file.string());
}

}  // namespace splice
