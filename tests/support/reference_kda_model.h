// Float64 reference of FLA's KDAForCausalLM decode (fla/models/kda, fla/layers/kda.py,
// fla/layers/attn.py, fla 0.6), written as plain loops from FLA's math, independent of splice's
// graph builders. It is the oracle of tests/e2e/kda_model_test.cc.
//
// Per token (position p = number of tokens seen before it), per sequence:
//   1. h = embeddings[token]
//   2. per layer: a = rmsnorm(h) * attn_norm;  h = h + mixer(a);
//                 h = h + down(silu(gate a') * up a'), a' = rmsnorm(h) * mlp_norm
//      KDA mixer: q|k|v = proj(a) -> depthwise causal conv over the last W inputs, SiLU;
//        q, k L2-normalized (eps 1e-6 on the sum of squares), q scaled by Dk^-1/2; value head hv
//        uses q/k head hv / (HV/H); g = lb * sigmoid(e^A_log (f + dt_bias)) or
//        -e^A_log softplus(f + dt_bias) (softplus(z) = z above 20), f = f_proj.1(f_proj.0 a);
//        beta = sigmoid(b_proj a) (x2 if allow_neg_eigval);
//        S[v][k] *= e^g[k];  S += beta (v - S k) k^T;  o = S q;
//        out = o_proj(o / rms(o) * o_norm * sigmoid(g_proj.1(g_proj.0 a) + bias)).
//      Attention mixer: q/k/v proj (+bias iff qkv_bias), RoPE rotate-half with theta at p, causal
//        softmax(q k^T / sqrt(D)) v over positions 0..p with GQA, o_proj.
//   3. logits = lm_head(rmsnorm(h) * norm)  (embeddings when tied)
// Rounding: with `round_activations` every tensor FLA stores in the model dtype (bf16) is rounded
// to bf16 where FLA's modules store it (outputs of linears, norms, convs, the KDA kernel output,
// RoPE, attention, SwiGLU product, residual sums); everything else, and the recurrent state, is
// float64. Without it the whole forward is float64.
#pragma once

#include <cstdint>
#include <vector>

#include "splice/model/config.h"
#include "splice/model/model.h"

namespace splice::testing {

class ReferenceKdaModel {
 public:
  ReferenceKdaModel(const ModelConfig& config, const Weights& weights, std::int64_t batch,
                    bool round_activations = true);
  // One decode step for every sequence: tokens[b] is sequence b's next token. Returns logits
  // [batch][vocab].
  std::vector<std::vector<double>> step(const std::vector<std::int64_t>& tokens);
  // Layer `layer`'s recurrent state of sequence `b`, S[hv][v][k] flattened (FLA's state_v_first
  // layout [HV, V, K]); empty for attention layers.
  const std::vector<double>& kda_state(std::int64_t layer, std::int64_t b) const;

 private:
  using Vec = std::vector<double>;
  struct Linear {
    std::int64_t out = 0, in = 0;
    Vec weight;  // [out, in]
    Vec bias;    // [out] or empty
  };
  struct Layer {
    bool attention = false;
    Vec attn_norm, mlp_norm;
    Linear gate_proj, up_proj, down_proj;
    // Attention.
    Linear q_proj, k_proj, v_proj, o_proj;
    // KDA.
    Linear f0, f1, b_proj, g0, g1;
    Vec conv_weight;  // [channels, W] (q | k | v channels)
    Vec A_log, dt_bias, o_norm;
    // Per sequence caches.
    std::vector<std::vector<Vec>> conv_history;  // [batch][W-1][channels] (oldest first)
    std::vector<Vec> state;                      // [batch][HV * Dv * Dk]  (S[hv][v][k])
    std::vector<std::vector<Vec>> keys, values;  // [batch][position][Hkv * D]
  };

  double round(double x) const;
  Vec linear(const Linear& l, const Vec& x) const;
  Vec rms_norm(const Vec& x, const Vec& weight) const;
  Vec kda_mixer(Layer& layer, std::int64_t b, const Vec& a);
  Vec attention_mixer(Layer& layer, std::int64_t b, const Vec& a);
  Vec mlp(const Layer& layer, const Vec& a) const;

  ModelConfig c_;
  std::int64_t batch_;
  bool round_;
  std::int64_t position_ = 0;
  Vec embeddings_, lm_head_, norm_;
  std::vector<Layer> layers_;
};

}  // namespace splice::testing
