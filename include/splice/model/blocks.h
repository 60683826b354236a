// splice/model/blocks.h: building blocks models emit as primitive regions (the oracles) plus the
// specs that let the optimizer offer fused arms beside them.
#pragma once

#include <optional>
#include <string>

#include "splice/ir/graph.h"
#include "splice/passes/decode_flash.h"

namespace splice {

struct AttentionRegionArgs {
  NodeId q;                     // [B, Hq, Sq, D]
  NodeId k_cache, v_cache;      // [B, Hkv, capacity, D] (state buffers after this step's append)
  std::optional<NodeId> alibi;  // [Hq] f32
  float softmax_scale = 0.0f;   // 0: 1/sqrt(D)
  bool causal = true;
  std::optional<std::size_t> window_left, window_right;
  std::optional<float> softcap;
  DynScalar k_len;   // live prefix length
  std::string site;  // "layer3.attn"
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

#include "splice/passes/kda.h"

namespace splice {

struct KdaRegionArgs {
  NodeId x;                     // [R, 3C] bf16 packed q|k|v projections (pre-conv)
  NodeId weight;                // [3, 4, C] f32
  NodeId conv_state;            // state [slots, 3, 3C] bf16, position-major (oldest first)
  NodeId raw_gate;              // [1, R, H, D] bf16
  NodeId raw_beta;              // [1, R, H] bf16
  NodeId A_log;                 // [H] f32
  NodeId dt_bias;               // [C] f32
  NodeId output_gate;           // [R, H, D] bf16
  NodeId norm_weight;           // [D] f32
  NodeId state;                 // state [slots, H, D, D] f32 | bf16
  std::int64_t first_slot = 1;  // row r uses cache slot first_slot + r (slot 0 is reserved)
  std::optional<float> lower_bound = -5.0f;
  float norm_eps = 1e-5f;
  std::string site;
};

struct KdaRegion {
  NodeId output;  // [R, H*D] bf16 view of the layer output: the merge
  KdaDecodeSpec spec;
};

// Emits spec kda_decode.md §2 for T = 1 (one row per sequence, contiguous slots) from primitives:
//   1. window = [conv_state[slot, 0..2], x] -> pre = sum_w window[w] * weight[w] (f32),
//      mixed = bf16(silu(pre));  q, k, v = head slices of mixed;
//   2. q^ = q / sqrt(sum q^2 + 1e-6) * D^-1/2,  k^ = k / sqrt(sum k^2 + 1e-6);
//   3. g = lower_bound * sigmoid(e^A_log (raw_gate + dt_bias))  or  -e^A_log softplus(...);
//      b = sigmoid(raw_beta);
//   4. S = state * e^g (per key column);  pred = S k^;  S += b (v - pred) k^T;  o = S q^;
//   5. out = bf16(bf16(o) / sqrt(mean bf16(o)^2 + eps) * norm_weight * sigmoid(output_gate));
//   6. cache writes: conv_state[slot] = [h1, h2, x];  state[slot] = S (rounded to its dtype);
//      the exit is sequenced after both writes.
KdaRegion emit_decomposed_kda(Graph& graph, const KdaRegionArgs& args);

}  // namespace splice
