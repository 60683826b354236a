#include "support/tiny_llama.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "splice/core/random.h"
#include "splice/ir/graph.h"
#include "splice/model/safetensors.h"
#include "splice/tune/optimize.h"
#include "support/test_util.h"

namespace splice::testing {
namespace {

bool is_qwen2(const TinyLlamaSpec& s) { return s.architecture == "Qwen2ForCausalLM"; }

}  // namespace

std::string tiny_llama_config_json(const TinyLlamaSpec& s) {
  std::ostringstream j;
  j << R"({"architectures": [")" << s.architecture << R"("], "model_type": ")"
    << (is_qwen2(s) ? "qwen2" : "llama") << R"(", "vocab_size": )" << s.vocab
    << R"(, "hidden_size": )" << s.hidden << R"(, "intermediate_size": )" << s.intermediate
    << R"(, "num_hidden_layers": )" << s.layers << R"(, "num_attention_heads": )" << s.heads
    << R"(, "num_key_value_heads": )" << s.kv_heads
    << R"(, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": )"
    << s.max_position_embeddings << R"(, "tie_word_embeddings": )" << (s.tied ? "true" : "false")
    << R"(, "bos_token_id": 1, "eos_token_id": 2})";
  return j.str();
}

std::vector<std::pair<std::string, Tensor>> tiny_llama_tensors(const TinyLlamaSpec& s) {
  Rng rng(s.seed);
  std::vector<std::pair<std::string, Tensor>> t;
  auto add = [&](const std::string& name, Dims shape, double stddev, double mean = 0.0) {
    t.emplace_back(name, random_tensor(rng, shape, s.dtype, stddev, mean));
  };
  const std::int64_t kv = s.kv_heads * (s.hidden / s.heads);  // k / v projection rows
  add("model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0);
  if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden}, s.lm_head_stddev);
  add("model.norm.weight", {s.hidden}, 0.1, 1.0);
  for (std::int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {s.hidden, s.hidden}, s.projection_stddev);
    add(p + "self_attn.k_proj.weight", {kv, s.hidden}, s.projection_stddev);
    add(p + "self_attn.v_proj.weight", {kv, s.hidden}, s.projection_stddev);
    add(p + "self_attn.o_proj.weight", {s.hidden, s.hidden}, s.projection_stddev);
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, s.gate_stddev);
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, s.projection_stddev);
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, s.projection_stddev);
    add(p + "input_layernorm.weight", {s.hidden}, s.norm_stddev, 1.0);
    add(p + "post_attention_layernorm.weight", {s.hidden}, s.norm_stddev, 1.0);
    if (is_qwen2(s)) {
      add(p + "self_attn.q_proj.bias", {s.hidden}, s.projection_stddev);
      add(p + "self_attn.k_proj.bias", {kv}, s.projection_stddev);
      add(p + "self_attn.v_proj.bias", {kv}, s.projection_stddev);
    }
  }
  return t;
}

std::string write_tiny_llama(const std::string& dir, const TinyLlamaSpec& spec) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << tiny_llama_config_json(spec);
  save_safetensors(dir + "/model.safetensors", tiny_llama_tensors(spec));
  return dir;
}

ModelConfig tiny_llama_config(const std::string& dir, const TinyLlamaSpec& spec) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << tiny_llama_config_json(spec);
  return load_config(dir + "/config.json");
}

Weights tiny_llama_weights(const TinyLlamaSpec& spec) {
  return Weights::from_tensors(tiny_llama_tensors(spec));
}

DecodeModel rope_kv_append_llama(const std::string& dir, DType dtype) {
  const TinyLlamaSpec spec = rope_kv_append_llama_spec();
  BuildOptions build;
  build.max_seq_len = 16;
  build.dtype = dtype;
  return build_decode_model(tiny_llama_config(dir, spec), tiny_llama_weights(spec), build);
}

Graph collapsed_rope_kv_append_llama(const std::string& dir, Device device,
                                     const std::function<int(const std::string& kind)>& arm_of) {
  DecodeModel m = rope_kv_append_llama(dir);
  OptimizeOptions o;
  o.select = false;
  o.tune.device = device;
  optimize_graph(m.graph, m.attention_specs, o, m.kda_specs, m.layer_specs);
  for (NodeId id : m.graph.live_nodes()) {
    const Node& n = m.graph.node(id);
    if (n.op != Op::Branch || n.erased) continue;
    collapse(m.graph, id, arm_of(n.attrs.branch->recipe.kind));
  }
  eliminate_dead_code(m.graph);
  verify_graph(m.graph);
  return std::move(m.graph);
}

}  // namespace splice::testing
