// Float64 reference of the fused KDA decode op (see reference_kda.h; spec kda_decode.md §2-§3).
#include "support/reference_kda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "splice/core/dtype.h"

namespace splice::testing {
namespace {

constexpr std::int64_t kD = 128;      // head dim (K = V)
constexpr std::int64_t kTaps = 4;     // conv width W
constexpr std::int64_t kHistory = 3;  // W - 1 history entries per token
constexpr int kBf16Bits = 8;          // significant bits of bfloat16 (7 stored + implicit)
constexpr int kMinNormalExp = -126;

// Element at a multi-index, read through the tensor's own strides.
double get(const Tensor& t, std::initializer_list<std::int64_t> index) {
  std::int64_t off = t.offset(), axis = 0;
  for (std::int64_t i : index) off += i * t.stride(axis++);
  return load_as_double(t.storage()->data, t.dtype(), off);
}
void put(Tensor& t, std::initializer_list<std::int64_t> index, double value) {
  std::int64_t off = t.offset(), axis = 0;
  for (std::int64_t i : index) off += i * t.stride(axis++);
  store_from_double(t.storage()->data, t.dtype(), off, value);
}
std::int64_t get_int(const Tensor& t, std::int64_t linear) {
  return static_cast<std::int64_t>(t.at_linear(linear));
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double softplus(double z) { return z > 20.0 ? z : std::log(1.0 + std::exp(z)); }

// One sequence's resolved metadata (plain / t1 rows are sequences of one token with a = 0).
struct Seq {
  std::int64_t begin, len, accepted, conv_slot, source_slot;
  std::vector<std::int64_t> dst;  // per token
};

KdaReferenceResult run(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                       const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                       const Tensor& dt_bias, const Tensor& state, const Tensor& output_gate,
                       const Tensor& norm_weight, std::optional<double> lower_bound,
                       double norm_eps, const std::vector<Seq>& seqs) {
  const std::int64_t R = x.size(0), C3 = x.size(1), C = C3 / 3, H = C / kD;
  const bool gate4 = output_gate.dim() == 4;
  KdaReferenceResult res;
  res.output = Tensor::zeros({1, R, H, kD}, DType::bf16);
  res.output_unrounded = Tensor::zeros({1, R, H, kD}, DType::f32);
  res.conv_state = conv_state.clone();
  res.state = state.clone();
  const bool bf16_state = state.dtype() == DType::bf16;

  for (const Seq& s : seqs) {
    // hist[c][j] = conv_state[cs, c, a + j], oldest first.
    std::vector<double> hist(C3 * kHistory);
    for (std::int64_t c = 0; c < C3; ++c)
      for (std::int64_t j = 0; j < kHistory; ++j)
        hist[c * kHistory + j] = get(conv_state, {s.conv_slot, c, s.accepted + j});
    // S[h][v][k] = state[ss, h, v, k].
    std::vector<double> S(H * kD * kD);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t v = 0; v < kD; ++v)
        for (std::int64_t k = 0; k < kD; ++k)
          S[(h * kD + v) * kD + k] = get(state, {s.source_slot, h, v, k});

    for (std::int64_t t = 0; t < s.len; ++t) {
      const std::int64_t r = s.begin + t;
      // (a) conv + SiLU over all 3C channels; weight[p, w, c mod C].
      std::vector<double> mixed(C3);
      for (std::int64_t c = 0; c < C3; ++c) {
        const std::int64_t p = c / C, cc = c % C;
        double pre = 0.0;
        for (std::int64_t w = 0; w < kHistory; ++w)
          pre += hist[c * kHistory + w] * get(weight, {p, w, cc});
        pre += get(x, {r, c}) * get(weight, {p, kTaps - 1, cc});
        mixed[c] = round_bf16(pre * sigmoid(pre));
      }
      for (std::int64_t h = 0; h < H; ++h) {
        const double* q = &mixed[h * kD];
        const double* kk = &mixed[C + h * kD];
        const double* vv = &mixed[2 * C + h * kD];
        // (b) L2 norms.
        double qq = 0.0, kn = 0.0;
        for (std::int64_t d = 0; d < kD; ++d) {
          qq += q[d] * q[d];
          kn += kk[d] * kk[d];
        }
        std::vector<double> qh(kD), kh(kD), g(kD);
        for (std::int64_t d = 0; d < kD; ++d) {
          qh[d] = q[d] / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(kD));
          kh[d] = kk[d] / std::sqrt(kn + 1e-6);
        }
        // (c) gate, (d) beta.
        const double a = std::exp(A_log.at_linear(h));
        for (std::int64_t k = 0; k < kD; ++k) {
          const double z = get(raw_gate, {0, r, h, k}) + dt_bias.at_linear(h * kD + k);
          g[k] = lower_bound ? *lower_bound * sigmoid(a * z) : -a * softplus(z);
        }
        const double b = sigmoid(get(raw_beta, {0, r, h}));
        // (e) delta rule on the carried state.
        double* Sh = &S[h * kD * kD];
        for (std::int64_t v = 0; v < kD; ++v)
          for (std::int64_t k = 0; k < kD; ++k) Sh[v * kD + k] *= std::exp(g[k]);
        std::vector<double> delta(kD);
        for (std::int64_t v = 0; v < kD; ++v) {
          double pred = 0.0;
          for (std::int64_t k = 0; k < kD; ++k) pred += Sh[v * kD + k] * kh[k];
          delta[v] = b * (vv[v] - pred);
        }
        for (std::int64_t v = 0; v < kD; ++v)
          for (std::int64_t k = 0; k < kD; ++k) Sh[v * kD + k] += delta[v] * kh[k];
        std::vector<double> o(kD);
        for (std::int64_t v = 0; v < kD; ++v) {
          double acc = 0.0;
          for (std::int64_t k = 0; k < kD; ++k) acc += Sh[v * kD + k] * qh[k];
          o[v] = round_bf16(acc);
        }
        // (f) gated RMSNorm.
        double ms = 0.0;
        for (std::int64_t v = 0; v < kD; ++v) ms += o[v] * o[v];
        const double inv = 1.0 / std::sqrt(ms / kD + norm_eps);
        for (std::int64_t v = 0; v < kD; ++v) {
          const double og = gate4 ? get(output_gate, {0, r, h, v}) : get(output_gate, {r, h, v});
          const double y = o[v] * inv * norm_weight.at_linear(v) * sigmoid(og);
          put(res.output_unrounded, {0, r, h, v}, y);
          put(res.output, {0, r, h, v}, round_bf16(y));
        }
      }
      // hist = [hist1, hist2, x[r]].
      for (std::int64_t c = 0; c < C3; ++c) {
        hist[c * kHistory + 0] = hist[c * kHistory + 1];
        hist[c * kHistory + 1] = hist[c * kHistory + 2];
        hist[c * kHistory + 2] = get(x, {r, c});
      }
      // Checkpoint after token t.
      if (s.dst[t] > 0) {
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t v = 0; v < kD; ++v)
            for (std::int64_t k = 0; k < kD; ++k) {
              const double val = S[(h * kD + v) * kD + k];
              put(res.state, {s.dst[t], h, v, k}, bf16_state ? round_bf16(val) : val);
            }
      }
    }
    // Conv write-back into slot cs (bit copies of bf16 values).
    for (std::int64_t c = 0; c < C3; ++c) {
      put(res.conv_state, {s.conv_slot, c, 0}, get(conv_state, {s.conv_slot, c, s.accepted + 1}));
      put(res.conv_state, {s.conv_slot, c, 1}, get(conv_state, {s.conv_slot, c, s.accepted + 2}));
      for (std::int64_t t = 0; t < s.len; ++t)
        put(res.conv_state, {s.conv_slot, c, 2 + t}, get(x, {s.begin + t, c}));
    }
  }
  return res;
}

}  // namespace

double round_bf16(double value) {
  if (!std::isfinite(value) || value == 0.0) return value;
  int e = 0;
  std::frexp(value, &e);  // |value| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 1, kMinNormalExp) - (kBf16Bits - 1));
  return std::nearbyint(value / ulp) * ulp;
}

KdaReferenceResult reference_packed_kda_decode(
    const Tensor& x, const Tensor& weight, const Tensor& conv_state, const Tensor& raw_gate,
    const Tensor& raw_beta, const Tensor& A_log, const Tensor& dt_bias, const Tensor& state_indices,
    const Tensor& state, const Tensor& output_gate, const Tensor& norm_weight,
    std::optional<double> lower_bound, double norm_eps, const Tensor& query_start_loc,
    const Tensor& num_accepted_tokens, const Tensor* t1_state_indices) {
  std::vector<Seq> seqs;
  if (t1_state_indices != nullptr && t1_state_indices->defined()) {
    for (std::int64_t r = 0; r < x.size(0); ++r) {
      const std::int64_t slot = get_int(*t1_state_indices, r);
      if (slot > 0) seqs.push_back({r, 1, 0, slot, slot, {slot}});
    }
  } else {
    const std::int64_t N = state_indices.size(0), T = state_indices.size(1);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t b = get_int(query_start_loc, n), e = get_int(query_start_loc, n + 1);
      if (e - b == 0) continue;
      const std::int64_t a =
          std::clamp<std::int64_t>(get_int(num_accepted_tokens, n) - 1, 0, T - 1);
      const std::int64_t cs = get_int(state_indices, n * T), ss = get_int(state_indices, n * T + a);
      if (cs <= 0 || ss <= 0) continue;  // null sequence: zero rows, no cache touched
      Seq s{b, e - b, a, cs, ss, {}};
      for (std::int64_t t = 0; t < e - b; ++t) s.dst.push_back(get_int(state_indices, n * T + t));
      seqs.push_back(s);
    }
  }
  return run(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state, output_gate,
             norm_weight, lower_bound, norm_eps, seqs);
}

KdaReferenceResult reference_fused_kda_decode(const Tensor& x, const Tensor& weight,
                                              const Tensor& conv_state, const Tensor& raw_gate,
                                              const Tensor& raw_beta, const Tensor& A_log,
                                              const Tensor& dt_bias, const Tensor& state_indices,
                                              const Tensor& state, const Tensor& output_gate,
                                              const Tensor& norm_weight,
                                              std::optional<double> lower_bound, double norm_eps) {
  std::vector<Seq> seqs;
  for (std::int64_t r = 0; r < x.size(0); ++r) {
    const std::int64_t slot = get_int(state_indices, r);
    if (slot > 0) seqs.push_back({r, 1, 0, slot, slot, {slot}});
  }
  return run(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state, output_gate,
             norm_weight, lower_bound, norm_eps, seqs);
}

}  // namespace splice::testing
