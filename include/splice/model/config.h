// splice/model/config.h: a Hugging Face `config.json`, read into one validated `ModelConfig`.
//
// Two families are understood (docs/model-formats.md lists every field, its default and check):
//   - the Llama family: `LlamaForCausalLM` (also SmolLM, TinyLlama) and `Qwen2ForCausalLM`
//     (q/k/v projections with bias): RoPE (plain or `llama3`/`linear` scaled), GQA, SwiGLU,
//     RMSNorm;
//   - FLA's hybrid `KDAForCausalLM` (`model_type: "kda"`): KDA layers everywhere except the layer
//     indices in its `attn` dict, which are full GQA attention layers with RoPE.
// Loading:
//   1. Read the file (a directory means `<dir>/config.json`) and parse it as a JSON object.
//   2. Pick the family from `architectures[0]` (else `model_type`); anything else is an
//      UnsupportedError naming it and the supported set.
//   3. Read each field with its type and range checked ("config.json: `num_attention_heads` must
//      be a positive integer, got -1", a ValueError), filling Hugging Face's / FLA's defaults.
//   4. Derive what the configs leave implicit (head_dim, num_key_value_heads, FLA's MLP width,
//      the per-layer kind list) and check the cross-field rules (heads divide, layer indices in
//      range). Features splice does not run (sliding windows, attnres, other RoPE scalings) are
//      an UnsupportedError naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace splice {

enum class ModelFamily : std::uint8_t { llama, kda };

// Sanity bounds on sizes read from model files (far above any real model; a file asking for more
// is malformed, and honouring it would allocate per-layer state without limit).
inline constexpr std::int64_t kMaxModelLayers = 4096;
enum class LayerKind : std::uint8_t { attention, kda };

// RoPE frequency scaling. `type` is "llama3" (Llama 3.1's band-wise scaling) or "linear"
// (positions divided by `factor`).
struct RopeScaling {
  std::string type;
  double factor = 1.0;
  double low_freq_factor = 1.0;                          // llama3 only
  double high_freq_factor = 4.0;                         // llama3 only
  std::int64_t original_max_position_embeddings = 8192;  // llama3 only
};

// The KDA (Kimi Delta Attention) layer settings of FLA's KDAConfig.
struct KdaLayerConfig {
  std::int64_t num_heads = 16;        // q/k heads (`num_heads`)
  std::int64_t num_v_heads = 16;      // v heads (`num_v_heads`, default num_heads)
  std::int64_t head_dim = 128;        // q/k head size (`head_dim`)
  double expand_v = 1.0;              // v head size = int(head_dim * expand_v)
  std::int64_t head_v_dim = 128;      // derived: int(head_dim * expand_v)
  bool use_short_conv = true;         // depthwise causal convs on q, k, v
  std::int64_t conv_size = 4;         // their kernel width
  bool allow_neg_eigval = false;      // beta in (0, 2) instead of (0, 1)
  bool safe_gate = false;             // newer FLA: gate clamped to [lower_bound, 0)
  std::optional<double> lower_bound;  // newer FLA: lower bound of the log-space forget gate
  std::string attn_mode = "chunk";    // FLA's training kernel choice; no effect on decode
  std::int64_t key_dim() const { return num_heads * head_dim; }
  std::int64_t value_dim() const { return num_v_heads * head_v_dim; }
};

struct ModelConfig {
  std::string source;        // the file read, for messages
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama", "qwen2", "kda"
  ModelFamily family = ModelFamily::llama;

  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;  // SwiGLU width (KDA: derived from hidden_ratio if absent)
  std::int64_t num_hidden_layers = 0;
  std::int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  // KDA: `norm_eps`
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";          // "silu" (FLA spells it "swish")
  std::vector<std::int64_t> bos_token_ids;  // `bos_token_id`: int, list or null
  std::vector<std::int64_t> eos_token_ids;  // `eos_token_id`: int, list or null
  std::optional<std::int64_t> pad_token_id;
  std::string torch_dtype;  // `torch_dtype` or `dtype` ("bfloat16"); empty if absent

  // Attention layers (all layers for Llama; those in `attn.layers` for KDA, else none).
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;  // default hidden_size / num_attention_heads
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool attention_bias = false;      // q/k/v (and, for Llama's `attention_bias`, o) biases
  bool attention_out_bias = false;  // o_proj bias (Llama `attention_bias` only)
  bool mlp_bias = false;

  // KDA layers (family == kda).
  KdaLayerConfig kda;
  std::vector<std::int64_t> attention_layers;  // KDA: `attn.layers`, sorted
  // One entry per layer.
  std::vector<LayerKind> layer_kinds;

  bool is_attention_layer(std::int64_t layer) const;
  std::int64_t num_kda_layers() const;
};

// Reads `path` (a config.json, or a directory holding one). IoError when it cannot be read or is
// not a JSON object; ValueError for a bad field; UnsupportedError for an unknown architecture or a
// feature splice does not run.
ModelConfig load_config(const std::string& path);
// The same from JSON text; `source` names it in messages.
ModelConfig parse_config(const std::string& json_text, const std::string& source = "config.json");
// The config.json that Hugging Face transformers (Llama family) or FLA (KDA) would write for
// `config`; parse_config reads it back to the same ModelConfig.
std::string to_config_json(const ModelConfig& config);

}  // namespace splice
