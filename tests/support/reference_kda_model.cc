// Float64 reference of FLA's KDAForCausalLM decode (see reference_kda_model.h for the math).
#include "support/reference_kda_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "splice/core/dtype.h"

namespace splice::testing {

namespace {

constexpr double kL2Eps = 1e-6;              // added to the sum of squares in the q/k L2 norm
constexpr double kSoftplusThreshold = 20.0;  // softplus(z) = z above it (FLA, torch)

std::vector<double> read(const Weights& w, const std::string& name, const Dims& shape) {
  const Tensor t = w.get(name, DType::f32, shape);
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = t.at_linear(i);
  return out;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double silu(double z) { return z * sigmoid(z); }
double softplus(double z) { return z > kSoftplusThreshold ? z : std::log1p(std::exp(z)); }

}  // namespace

ReferenceKdaModel::ReferenceKdaModel(const ModelConfig& c, const Weights& w, std::int64_t batch,
                                     bool round_activations)
    : c_(c), batch_(batch), round_(round_activations) {
  const std::int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  auto linear = [&](const std::string& name, std::int64_t out, std::int64_t in, bool bias) {
    Linear l;
    l.out = out;
    l.in = in;
    l.weight = read(w, name + ".weight", {out, in});
    if (bias) l.bias = read(w, name + ".bias", {out});
    return l;
  };
  embeddings_ = read(w, "model.embeddings.weight", {vocab, hidden});
  norm_ = read(w, "model.norm.weight", {hidden});
  lm_head_ = (c.tie_word_embeddings || !w.has("lm_head.weight"))
                 ? embeddings_
                 : read(w, "lm_head.weight", {vocab, hidden});
  const KdaLayerConfig& k = c.kda;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer layer;
    layer.attention = c.is_attention_layer(l);
    layer.attn_norm = read(w, p + "attn_norm.weight", {hidden});
    layer.mlp_norm = read(w, p + "mlp_norm.weight", {hidden});
    const std::int64_t inter = c.intermediate_size;
    layer.gate_proj = linear(p + "mlp.gate_proj", inter, hidden, false);
    layer.up_proj = linear(p + "mlp.up_proj", inter, hidden, false);
    layer.down_proj = linear(p + "mlp.down_proj", hidden, inter, false);
    if (layer.attention) {
      const std::int64_t qd = c.num_attention_heads * c.head_dim,
                         kvd = c.num_key_value_heads * c.head_dim;
      layer.q_proj = linear(p + "attn.q_proj", qd, hidden, c.attention_bias);
      layer.k_proj = linear(p + "attn.k_proj", kvd, hidden, c.attention_bias);
      layer.v_proj = linear(p + "attn.v_proj", kvd, hidden, c.attention_bias);
      layer.o_proj = linear(p + "attn.o_proj", hidden, qd, false);
      layer.keys.resize(static_cast<std::size_t>(batch));
      layer.values.resize(static_cast<std::size_t>(batch));
    } else {
      const std::int64_t kd = k.key_dim(), vd = k.value_dim(), HV = k.num_v_heads;
      const std::int64_t Dk = k.head_dim, Dv = k.head_v_dim, W = k.conv_size;
      layer.q_proj = linear(p + "attn.q_proj", kd, hidden, false);
      layer.k_proj = linear(p + "attn.k_proj", kd, hidden, false);
      layer.v_proj = linear(p + "attn.v_proj", vd, hidden, false);
      layer.f0 = linear(p + "attn.f_proj.0", Dv, hidden, false);
      layer.f1 = linear(p + "attn.f_proj.1", HV * Dk, Dv, false);
      layer.b_proj = linear(p + "attn.b_proj", HV, hidden, false);
      layer.g0 = linear(p + "attn.g_proj.0", Dv, hidden, false);
      layer.g1 = linear(p + "attn.g_proj.1", vd, Dv, true);
      layer.o_proj = linear(p + "attn.o_proj", hidden, vd, false);
      layer.A_log = read(w, p + "attn.A_log", {HV});
      layer.dt_bias = read(w, p + "attn.dt_bias", {HV * Dk});
      layer.o_norm = read(w, p + "attn.o_norm.weight", {Dv});
      const std::int64_t channels = 2 * kd + vd;
      if (k.use_short_conv) {
        for (const auto& [name, dim] : {std::pair<const char*, std::int64_t>{"q_conv1d", kd},
                                        {"k_conv1d", kd},
                                        {"v_conv1d", vd}}) {
          const Vec wc = read(w, p + "attn." + name + ".weight", {dim, 1, W});
          layer.conv_weight.insert(layer.conv_weight.end(), wc.begin(), wc.end());
        }
        layer.conv_history.assign(static_cast<std::size_t>(batch),
                                  std::vector<Vec>(static_cast<std::size_t>(W - 1),
                                                   Vec(static_cast<std::size_t>(channels), 0.0)));
      }
      layer.state.assign(static_cast<std::size_t>(batch),
                         Vec(static_cast<std::size_t>(HV * Dv * Dk), 0.0));
    }
    layers_.push_back(std::move(layer));
  }
}

double ReferenceKdaModel::round(double x) const {
  if (!round_) return x;
  return static_cast<double>(bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(x))));
}

ReferenceKdaModel::Vec ReferenceKdaModel::linear(const Linear& l, const Vec& x) const {
  Vec y(static_cast<std::size_t>(l.out));
  for (std::int64_t o = 0; o < l.out; ++o) {
    double acc = l.bias.empty() ? 0.0 : l.bias[static_cast<std::size_t>(o)];
    for (std::int64_t i = 0; i < l.in; ++i)
      acc += l.weight[static_cast<std::size_t>(o * l.in + i)] * x[static_cast<std::size_t>(i)];
    y[static_cast<std::size_t>(o)] = round(acc);
  }
  return y;
}

ReferenceKdaModel::Vec ReferenceKdaModel::rms_norm(const Vec& x, const Vec& weight) const {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_norm_eps);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = round(x[i] * inv * weight[i]);
  return y;
}

ReferenceKdaModel::Vec ReferenceKdaModel::mlp(const Layer& layer, const Vec& a) const {
  const Vec gate = linear(layer.gate_proj, a), up = linear(layer.up_proj, a);
  Vec act(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) act[i] = round(silu(gate[i]) * up[i]);
  return linear(layer.down_proj, act);
}

ReferenceKdaModel::Vec ReferenceKdaModel::kda_mixer(Layer& layer, std::int64_t b, const Vec& a) {
  const KdaLayerConfig& k = c_.kda;
  const std::int64_t kd = k.key_dim(), vd = k.value_dim(), H = k.num_heads, HV = k.num_v_heads,
                     Dk = k.head_dim, Dv = k.head_v_dim, W = k.conv_size, group = HV / H;
  const std::int64_t channels = 2 * kd + vd;
  // Projections, packed q | k | v.
  Vec x = linear(layer.q_proj, a);
  const Vec kx = linear(layer.k_proj, a), vx = linear(layer.v_proj, a);
  x.insert(x.end(), kx.begin(), kx.end());
  x.insert(x.end(), vx.begin(), vx.end());
  // Short convs over [history, x] (tap W-1 is the current input) + SiLU, or SiLU alone.
  Vec mixed(static_cast<std::size_t>(channels));
  if (k.use_short_conv) {
    auto& hist = layer.conv_history[static_cast<std::size_t>(b)];
    for (std::int64_t ch = 0; ch < channels; ++ch) {
      double pre = 0;
      for (std::int64_t t = 0; t < W; ++t) {
        const double in = t < W - 1
                              ? hist[static_cast<std::size_t>(t)][static_cast<std::size_t>(ch)]
                              : x[static_cast<std::size_t>(ch)];
        pre += in * layer.conv_weight[static_cast<std::size_t>(ch * W + t)];
      }
      mixed[static_cast<std::size_t>(ch)] = round(silu(pre));
    }
    hist.erase(hist.begin());
    hist.push_back(x);
  } else {
    for (std::int64_t ch = 0; ch < channels; ++ch)
      mixed[static_cast<std::size_t>(ch)] = round(silu(x[static_cast<std::size_t>(ch)]));
  }
  const Vec f = linear(layer.f1, linear(layer.f0, a));         // [HV * Dk]
  const Vec beta_raw = linear(layer.b_proj, a);                // [HV]
  const Vec out_gate = linear(layer.g1, linear(layer.g0, a));  // [HV * Dv]
  Vec& S = layer.state[static_cast<std::size_t>(b)];
  Vec out(static_cast<std::size_t>(vd));
  for (std::int64_t hv = 0; hv < HV; ++hv) {
    const std::int64_t h = hv / group;
    // q, k of q/k head h, L2-normalized.
    Vec q(static_cast<std::size_t>(Dk)), kk(static_cast<std::size_t>(Dk));
    double qq = 0, kn = 0;
    for (std::int64_t i = 0; i < Dk; ++i) {
      q[i] = mixed[static_cast<std::size_t>(h * Dk + i)];
      kk[i] = mixed[static_cast<std::size_t>(kd + h * Dk + i)];
      qq += q[i] * q[i];
      kn += kk[i] * kk[i];
    }
    const double q_scale = 1.0 / std::sqrt(qq + kL2Eps) / std::sqrt(static_cast<double>(Dk));
    const double k_scale = 1.0 / std::sqrt(kn + kL2Eps);
    for (std::int64_t i = 0; i < Dk; ++i) {
      q[i] *= q_scale;
      kk[i] *= k_scale;
    }
    // Gate and beta.
    const double A = std::exp(layer.A_log[static_cast<std::size_t>(hv)]);
    Vec decay(static_cast<std::size_t>(Dk));
    for (std::int64_t i = 0; i < Dk; ++i) {
      const double z = f[static_cast<std::size_t>(hv * Dk + i)] +
                       layer.dt_bias[static_cast<std::size_t>(hv * Dk + i)];
      const double g = k.lower_bound ? *k.lower_bound * sigmoid(A * z) : -A * softplus(z);
      decay[i] = std::exp(g);
    }
    double beta = sigmoid(beta_raw[static_cast<std::size_t>(hv)]);
    if (k.allow_neg_eigval) beta *= 2.0;
    // Delta rule on S[hv] (rows: value index, columns: key index).
    double* s = S.data() + hv * Dv * Dk;
    Vec o(static_cast<std::size_t>(Dv));
    for (std::int64_t vi = 0; vi < Dv; ++vi) {
      double* row = s + vi * Dk;
      double pred = 0;
      for (std::int64_t i = 0; i < Dk; ++i) {
        row[i] *= decay[i];
        pred += row[i] * kk[i];
      }
      const double delta = beta * (mixed[static_cast<std::size_t>(2 * kd + hv * Dv + vi)] - pred);
      double acc = 0;
      for (std::int64_t i = 0; i < Dk; ++i) {
        row[i] += delta * kk[i];
        acc += row[i] * q[i];
      }
      o[vi] = round(acc);
    }
    // Gated RMSNorm (sigmoid gate).
    double ss = 0;
    for (double v : o) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(Dv) + c_.rms_norm_eps);
    for (std::int64_t vi = 0; vi < Dv; ++vi)
      out[static_cast<std::size_t>(hv * Dv + vi)] =
          round(o[vi] * inv * layer.o_norm[static_cast<std::size_t>(vi)] *
                sigmoid(out_gate[static_cast<std::size_t>(hv * Dv + vi)]));
  }
  return linear(layer.o_proj, out);
}

ReferenceKdaModel::Vec ReferenceKdaModel::attention_mixer(Layer& layer, std::int64_t b,
                                                          const Vec& a) {
  const std::int64_t heads = c_.num_attention_heads, kv_heads = c_.num_key_value_heads,
                     D = c_.head_dim, half = D / 2, group = heads / kv_heads;
  Vec q = linear(layer.q_proj, a), k = linear(layer.k_proj, a);
  const Vec v = linear(layer.v_proj, a);
  // RoPE (rotate-half) at this position; angles as FLA computes them (fp32 position * inv_freq).
  const double pos = static_cast<double>(position_);
  auto rotate = [&](Vec& x, std::int64_t n) {
    for (std::int64_t h = 0; h < n; ++h)
      for (std::int64_t i = 0; i < half; ++i) {
        const float inv_freq = static_cast<float>(
            1.0 / std::pow(c_.rope_theta, static_cast<double>(2 * i) / static_cast<double>(D)));
        const double angle = static_cast<double>(static_cast<float>(pos) * inv_freq);
        const double cs = std::cos(angle), sn = std::sin(angle);
        double& x1 = x[static_cast<std::size_t>(h * D + i)];
        double& x2 = x[static_cast<std::size_t>(h * D + i + half)];
        const double r1 = x1 * cs - x2 * sn, r2 = x2 * cs + x1 * sn;
        x1 = round(r1);
        x2 = round(r2);
      }
  };
  rotate(q, heads);
  rotate(k, kv_heads);
  auto& keys = layer.keys[static_cast<std::size_t>(b)];
  auto& values = layer.values[static_cast<std::size_t>(b)];
  keys.push_back(k);
  values.push_back(v);
  const std::int64_t n = static_cast<std::int64_t>(keys.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Vec out(static_cast<std::size_t>(heads * D), 0.0);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t kh = h / group;
    Vec scores(static_cast<std::size_t>(n));
    double max_score = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::int64_t i = 0; i < D; ++i)
        dot +=
            q[static_cast<std::size_t>(h * D + i)] * keys[j][static_cast<std::size_t>(kh * D + i)];
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    double total = 0;
    for (double& s : scores) total += (s = std::exp(s - max_score));
    for (std::int64_t i = 0; i < D; ++i) {
      double acc = 0;
      for (std::int64_t j = 0; j < n; ++j)
        acc += scores[j] * values[j][static_cast<std::size_t>(kh * D + i)];
      out[static_cast<std::size_t>(h * D + i)] = round(acc / total);
    }
  }
  return linear(layer.o_proj, out);
}

const std::vector<double>& ReferenceKdaModel::kda_state(std::int64_t layer, std::int64_t b) const {
  static const std::vector<double> kNone;
  const Layer& l = layers_.at(static_cast<std::size_t>(layer));
  return l.attention ? kNone : l.state.at(static_cast<std::size_t>(b));
}

std::vector<std::vector<double>> ReferenceKdaModel::step(const std::vector<std::int64_t>& tokens) {
  const std::int64_t hidden = c_.hidden_size, vocab = c_.vocab_size;
  std::vector<std::vector<double>> logits;
  for (std::int64_t b = 0; b < batch_; ++b) {
    const std::int64_t token = tokens[static_cast<std::size_t>(b)];
    Vec h(embeddings_.begin() + token * hidden, embeddings_.begin() + (token + 1) * hidden);
    for (Layer& layer : layers_) {
      const Vec a = rms_norm(h, layer.attn_norm);
      const Vec mixed = layer.attention ? attention_mixer(layer, b, a) : kda_mixer(layer, b, a);
      for (std::int64_t i = 0; i < hidden; ++i) h[i] = round(h[i] + mixed[i]);
      const Vec y = mlp(layer, rms_norm(h, layer.mlp_norm));
      for (std::int64_t i = 0; i < hidden; ++i) h[i] = round(h[i] + y[i]);
    }
    const Vec n = rms_norm(h, norm_);
    Vec row(static_cast<std::size_t>(vocab));
    for (std::int64_t v = 0; v < vocab; ++v) {
      double acc = 0;
      for (std::int64_t i = 0; i < hidden; ++i)
        acc += lm_head_[static_cast<std::size_t>(v * hidden + i)] * n[i];
      row[static_cast<std::size_t>(v)] = round(acc);
    }
    logits.push_back(std::move(row));
  }
  ++position_;
  return logits;
}

}  // namespace splice::testing
