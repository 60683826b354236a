// splice/model/blocks.h: building blocks models emit as primitive regions (the oracles) plus the
// specs that let the optimizer offer fused arms beside them.
#pragma once

#include <optional>
#include <string>

#include "splice/ir/graph.h"
#include "splice/passes/decode_flash.h"

namespace splice {

struct AttentionRegionArgs {
  NodeId q;                      // [B, Hq, Sq, D]
  NodeId k_cache, v_cache;       // [B, Hkv, capacity, D] (state buffers after this step's append)
  std::optional<NodeId> alibi;   // [Hq] f32
  float softmax_scale = 0.0f;    // 0: 1/sqrt(D)
  bool causal = true;
  std::optional<std::size_t> window_left, window_right;
  std::optional<float> softcap;
  DynScalar k_len;               // live prefix length
  std::string site;              // "layer3.attn"
};

struct AttentionRegion {
  NodeId output;         // [B, Sq, Hq, D] view: the merge (reconverge) reading the attention result
  DecodeFlashSpec spec;  // decomposed_out and reconverge filled in
};

// Emits spec decode_attention.md §5 from primitives over the exact live prefix [0, k_len):
//   1. k, v = cache[:, :, 0:k_len]; q, k, v widened to f32;
//   2. scores = (q grouped as [B, Hkv, G*Sq, D]) @ k^T * scale   (G = Hq / Hkv: GQA by reshape);
//   3. softcap: s = cap * tanh(s / cap);  ALiBi: s += -slope[h] * (p_i - j);
//   4. masks from iota: p_i = k_len - Sq + i; visible iff j <= p_i (causal),
//      j >= p_i - left, j <= p_i + right; invisible scores become -inf;
//   5. softmax over keys (an all -inf row gives zeros), @ v, back to [B, Hq, Sq, D] in q's dtype;
//   6. the merge: a permute to [B, Sq, Hq, D].
AttentionRegion emit_decomposed_attention(Graph& graph, const AttentionRegionArgs& args);

}  // namespace splice
