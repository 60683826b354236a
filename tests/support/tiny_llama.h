// A tiny random Llama-family checkpoint (Hugging Face names and layout), shared by the tests that
// decode one: the CLI, the Llama model, the layer-op end-to-end and RoPE/KV-append graph tests,
// and the GPU greedy and rope_kv_append tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/dtype.h"
#include "splice/core/tensor.h"
#include "splice/model/config.h"
#include "splice/model/model.h"

namespace splice::testing {

struct TinyLlamaSpec {
  std::string architecture = "LlamaForCausalLM";  // or "Qwen2ForCausalLM" (with q/k/v biases)
  std::int64_t vocab = 97, hidden = 128, intermediate = 160, layers = 2;
  std::int64_t heads = 2, kv_heads = 1;  // head_dim = hidden / heads
  std::int64_t max_position_embeddings = 256;
  bool tied = true;  // tie_word_embeddings; false adds lm_head.weight
  std::uint64_t seed = 42;
  DType dtype = DType::f32;  // of the saved tensors
  // Standard deviations: projections, gate_proj, lm_head; RMSNorm weights are 1 + N(0, norm^2)
  // (the final norm's: 1 + N(0, 0.01)); the embedding is N(0, 1).
  double projection_stddev = 0.1, gate_stddev = 0.1, lm_head_stddev = 0.1, norm_stddev = 0.3;
};

// The Llama of the RoPE / KV-append tests (the CPU graph test and the GPU replay test build the
// same model): vocabulary 61, MLP 96, 64 positions.
inline TinyLlamaSpec rope_kv_append_llama_spec() {
  TinyLlamaSpec spec;
  spec.vocab = 61;
  spec.intermediate = 96;
  spec.max_position_embeddings = 64;
  spec.seed = 11;
  return spec;
}

// config.json's text (rms_norm_eps 1e-5, rope_theta 1e4, bos 1, eos 2).
std::string tiny_llama_config_json(const TinyLlamaSpec& spec);
// The checkpoint's tensors, drawn in a fixed order from Rng(spec.seed).
std::vector<std::pair<std::string, Tensor>> tiny_llama_tensors(const TinyLlamaSpec& spec);
// Writes `dir`/config.json and `dir`/model.safetensors; returns dir.
std::string write_tiny_llama(const std::string& dir, const TinyLlamaSpec& spec = {});
// The config (written to `dir`/config.json and loaded back) and the in-memory weights.
ModelConfig tiny_llama_config(const std::string& dir, const TinyLlamaSpec& spec = {});
Weights tiny_llama_weights(const TinyLlamaSpec& spec = {});

// The Llama of the RoPE / KV-append tests (rope_kv_append_llama_spec) built for decoding:
// max_seq_len 16, activations of `dtype`, its config written under `dir`.
DecodeModel rope_kv_append_llama(const std::string& dir, DType dtype = DType::bf16);
// Its graph with every fused arm offered for `device`'s contracts (nothing verified or timed) and
// every branch collapsed to arm_of(its recipe's kind), in node order, so an inner branch goes
// before the outer one that holds it; then dead code eliminated and the graph verified.
Graph collapsed_rope_kv_append_llama(const std::string& dir, Device device,
                                     const std::function<int(const std::string& kind)>& arm_of);

}  // namespace splice::testing
