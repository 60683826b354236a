// Float64 Llama forward (see reference_llama.h). RoPE: HF rotate_half with
// inv_freq_i = theta^(-2i/D); attention: softmax(q k^T / sqrt(D)) over positions 0..p.
#include "support/reference_llama.h"

#include <cmath>

namespace splice::testing {

ReferenceLlama::Matrix ReferenceLlama::load(const Weights& w, const std::string& name) const {
  const Tensor t = w.get(name, DType::f32);
  Matrix m(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) m[i] = t.at_linear(i);
  return m;
}

ReferenceLlama::ReferenceLlama(const ModelConfig& c, const Weights& w) : c_(c) {
  embed_ = load(w, "model.embed_tokens.weight");
  final_norm_ = load(w, "model.norm.weight");
  lm_head_ =
      (c.tie_word_embeddings || !w.has("lm_head.weight")) ? embed_ : load(w, "lm_head.weight");
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.wq = load(w, p + "self_attn.q_proj.weight");
    L.wk = load(w, p + "self_attn.k_proj.weight");
    L.wv = load(w, p + "self_attn.v_proj.weight");
    L.wo = load(w, p + "self_attn.o_proj.weight");
    L.gate = load(w, p + "mlp.gate_proj.weight");
    L.up = load(w, p + "mlp.up_proj.weight");
    L.down = load(w, p + "mlp.down_proj.weight");
    L.norm1 = load(w, p + "input_layernorm.weight");
    L.norm2 = load(w, p + "post_attention_layernorm.weight");
    layers_.push_back(std::move(L));
  }
}

namespace {
std::vector<double> matvec(const std::vector<double>& W, const std::vector<double>& x,
                           std::int64_t out) {
  const std::int64_t in = static_cast<std::int64_t>(x.size());
  std::vector<double> y(static_cast<std::size_t>(out), 0.0);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) y[o] += W[o * in + i] * x[i];
  return y;
}
std::vector<double> rms(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}
}  // namespace

std::vector<double> ReferenceLlama::step(std::int32_t token) {
  const std::int64_t H = c_.hidden_size, nh = c_.num_attention_heads, nkv = c_.num_key_value_heads,
                     D = c_.head_dim, group = nh / nkv;
  std::vector<double> h(embed_.begin() + token * H, embed_.begin() + (token + 1) * H);
  const double p = static_cast<double>(position_);
  auto rope = [&](std::vector<double>& v, std::int64_t heads) {
    for (std::int64_t hd = 0; hd < heads; ++hd)
      for (std::int64_t i = 0; i < D / 2; ++i) {
        const double freq =
            1.0 / std::pow(c_.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(D));
        const double a = p * freq, cs = std::cos(a), sn = std::sin(a);
        double& x1 = v[hd * D + i];
        double& x2 = v[hd * D + i + D / 2];
        const double r1 = x1 * cs - x2 * sn, r2 = x2 * cs + x1 * sn;
        x1 = r1;
        x2 = r2;
      }
  };
  for (auto& L : layers_) {
    const auto a = rms(h, L.norm1, c_.rms_norm_eps);
    auto q = matvec(L.wq, a, nh * D), k = matvec(L.wk, a, nkv * D), v = matvec(L.wv, a, nkv * D);
    rope(q, nh);
    rope(k, nkv);
    L.k_cache.push_back(k);
    L.v_cache.push_back(v);
    std::vector<double> attn(static_cast<std::size_t>(nh * D), 0.0);
    for (std::int64_t hd = 0; hd < nh; ++hd) {
      const std::int64_t kvh = hd / group;
      std::vector<double> s(L.k_cache.size());
      double mx = -INFINITY;
      for (std::size_t j = 0; j < s.size(); ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += q[hd * D + d] * L.k_cache[j][kvh * D + d];
        s[j] = dot / std::sqrt(static_cast<double>(D));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (std::size_t j = 0; j < s.size(); ++j)
        for (std::int64_t d = 0; d < D; ++d)
          attn[hd * D + d] += s[j] / sum * L.v_cache[j][kvh * D + d];
    }
    const auto o = matvec(L.wo, attn, H);
    for (std::int64_t i = 0; i < H; ++i) h[i] += o[i];
    const auto n = rms(h, L.norm2, c_.rms_norm_eps);
    auto g = matvec(L.gate, n, c_.intermediate_size);
    const auto u = matvec(L.up, n, c_.intermediate_size);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    const auto d = matvec(L.down, g, H);
    for (std::int64_t i = 0; i < H; ++i) h[i] += d[i];
  }
  ++position_;
  return matvec(lm_head_, rms(h, final_norm_, c_.rms_norm_eps), c_.vocab_size);
}

}  // namespace splice::testing
