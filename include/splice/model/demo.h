// splice/model/demo.h: a small decode graph of attention layers with deterministic random weights,
// used by `splice inspect`, the tests and the benchmarks.
//
// Per layer l (x: [B, 1, model_dim]):
//   q = x Wq_l -> [B, Hq, 1, D];  k = x Wk_l, v = x Wv_l -> [B, Hkv, 1, D]
//   k_cache_l[:, :, k_len-1] = k;  v_cache_l[:, :, k_len-1] = v      (write_at, the KV append)
//   o = attention(q, k_cache_l, v_cache_l, k_len)                  (primitive region + spec)
//   x = x + o Wo_l
// output "y" = x after the last layer. `k_len` is one symbol in [1, capacity].
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "splice/ir/graph.h"
#include "splice/model/blocks.h"

namespace splice {

struct DemoAttentionOptions {
  std::int64_t num_layers = 2;
  std::int64_t batch = 1;
  std::int64_t num_qo_heads = 4;
  std::int64_t num_kv_heads = 2;
  std::int64_t head_dim = 64;
  std::int64_t capacity = 256;
  DType dtype = DType::f32;
  bool alibi = false;
  std::optional<float> softcap;
  std::optional<std::size_t> window_left;
  std::uint64_t seed = 1;
  // A per-step graph: k_len fixed to this value (DynScalar::Concrete) instead of a symbol.
  std::optional<std::int64_t> concrete_k_len;
};

struct DemoAttentionGraph {
  Graph graph;
  SymId k_len;
  std::vector<DecodeFlashSpec> specs;  // one per layer, for the optimizer
  std::int64_t model_dim = 0;
};

// Validates `options` first (ValueError naming the field: counts >= 1, layers >= 0, heads a
// multiple of kv heads, a floating dtype, softcap > 0 when set, concrete_k_len in [1, capacity]).
DemoAttentionGraph build_demo_attention_graph(const DemoAttentionOptions& options);

}  // namespace splice
