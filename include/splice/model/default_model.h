// splice/model/default_model.h: the embedded default model, a small hybrid KDA/attention
// KDAForCausalLM whose weights splice creates deterministically, so a fresh machine can decode
// with no download.
//
// The model (FLA field names in its config.json): 4 layers, hidden 256, vocabulary 512, SwiGLU
// width 512, RMSNorm eps 1e-6, untied lm_head; layers 0, 1, 3 are KDA layers (2 heads of 128,
// short convs of width 4, gate lower_bound -5), layer 2 is GQA attention (4 heads of 64, 2 KV
// heads, RoPE theta 10000). Weights are bf16, drawn from one seeded generator:
//   1. linear weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1) (N(0, 1/hidden) when tied to the
//      head), norm weights ~ 1 + N(0, 0.05^2);
//   2. conv taps ~ N(0, 0.3^2); A_log = log U(1, 16); dt_bias = softplus^-1(dt),
//      dt = exp(U(log 1e-3, log 1e-1)) (FLA's initialization); g_proj.1.bias ~ N(0, 0.1^2).
// so activations stay O(1) and greedy decoding produces varied ids.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/tensor.h"
#include "splice/model/config.h"

namespace splice {

// Bumped whenever the generated weights or config change (it names the cache directory).
inline constexpr int kDefaultModelVersion = 1;

// The default model's config (what write_default_model saves as config.json).
ModelConfig default_model_config();

// Every weight FLA's KDAForCausalLM has for `config` (FLA's names; bf16, A_log and dt_bias f32),
// drawn as described above from a generator seeded with `seed`. Also used by the tests for tiny
// random models (any head sizes, GVA, biases, tied or untied head, with or without short convs).
std::vector<std::pair<std::string, Tensor>> make_kda_weights(const ModelConfig& config,
                                                             std::uint64_t seed);

// Writes config.json and model.safetensors into `dir` (created if needed). Deterministic: the
// same bytes on every machine.
void write_default_model(const std::string& dir);

// The cache directory holding the default model, written on first use:
// $SPLICE_CACHE_DIR/default-model-v<N>, else $XDG_CACHE_HOME/splice/..., else
// $HOME/.cache/splice/..., else <temp dir>/splice/.... Written into a temporary sibling and
// renamed into place, so concurrent first uses never see a partial model.
std::string default_model_dir();

}  // namespace splice
