// Float64 reference of decode attention (see reference_attention.h for the stages).
#include "support/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace splice::testing {

namespace {

// Loads row [a, b, c, :] of a rank-4 tensor as doubles.
void load_row(const Tensor& t, std::int64_t a, std::int64_t b, std::int64_t c,
              std::vector<double>& row) {
  const std::int64_t n = t.size(3);
  row.resize(static_cast<std::size_t>(n));
  const std::int64_t base = t.offset() + a * t.stride(0) + b * t.stride(1) + c * t.stride(2);
  for (std::int64_t d = 0; d < n; ++d)
    row[d] = load_as_double(t.storage()->data, t.dtype(), base + d * t.stride(3));
}

}  // namespace

Tensor reference_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& k_len, const Tensor* alibi,
                                  const DecodeAttentionOptions& options, Tensor* lse) {
  const std::int64_t batch = q.size(0), num_qo_heads = q.size(1), q_len = q.size(2),
                     head_dim = q.size(3), num_kv_heads = k.size(1);
  const std::int64_t group = num_qo_heads / num_kv_heads;
  const double scale = options.softmax_scale != 0.0f
                           ? static_cast<double>(options.softmax_scale)
                           : 1.0 / std::sqrt(static_cast<double>(head_dim));
  // out [batch, num_qo_heads, q_len, head_dim]; lse [batch, num_qo_heads, q_len].
  Tensor out = Tensor::empty({batch, num_qo_heads, q_len, head_dim}, DType::f32);
  if (lse) *lse = Tensor::empty({batch, num_qo_heads, q_len}, DType::f32);

  std::vector<double> qi, kj, vj, scores, acc(static_cast<std::size_t>(head_dim));
  std::vector<std::int64_t> keys;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = static_cast<std::int64_t>(k_len.at({k_len.size(0) == 1 ? 0 : b}));
    for (std::int64_t h = 0; h < num_qo_heads; ++h) {
      const std::int64_t kv_head = h / group;
      const double slope = alibi ? alibi->at({h}) : 0.0;
      for (std::int64_t i = 0; i < q_len; ++i) {
        const std::int64_t p = len - q_len + i;
        keys.clear();
        for (std::int64_t j = 0; j < len; ++j) {
          if (options.causal && j > p) continue;
          if (options.window_left && j < p - *options.window_left) continue;
          if (options.window_right && j > p + *options.window_right) continue;
          keys.push_back(j);
        }
        load_row(q, b, h, i, qi);
        scores.assign(keys.size(), 0.0);
        double max_score = -std::numeric_limits<double>::infinity();
        for (std::size_t n = 0; n < keys.size(); ++n) {
          load_row(k, b, kv_head, keys[n], kj);
          double dot = 0.0;
          for (std::int64_t d = 0; d < head_dim; ++d) dot += qi[d] * kj[d];
          double s = scale * dot;
          if (options.softcap) {
            const double cap = *options.softcap;
            s = cap * std::tanh(s / cap);
          }
          if (alibi) s += -slope * static_cast<double>(p - keys[n]);
          scores[n] = s;
          max_score = std::max(max_score, s);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0.0;
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(scores[n] - max_score);
          sum += w;
          load_row(v, b, kv_head, keys[n], vj);
          for (std::int64_t d = 0; d < head_dim; ++d) acc[d] += w * vj[d];
        }
        for (std::int64_t d = 0; d < head_dim; ++d)
          out.set({b, h, i, d}, keys.empty() ? 0.0 : acc[d] / sum);
        if (lse)
          lse->set({b, h, i}, keys.empty() ? -std::numeric_limits<double>::infinity()
                                           : max_score + std::log(sum));
      }
    }
  }
  return out;
}

}  // namespace splice::testing
