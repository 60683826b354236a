// splice/passes/kda.h: KdaDecodeSpec and the offer of a fused KDA decode arm — the same offer /
// verify / time / choose mechanism as attention (passes/decode_flash.h, tune/select.h).
//
// A model builds each KDA layer's decode step (T = 1, one row per sequence, sequence b in cache
// slot state_indices[b]) from primitives (arm 0) and hands the optimizer this spec. The offer
//   1. validates it (ids live, shapes and dtypes of spec kda_decode.md §1, reconverge the sole
//      consumer of decomposed_out): a malformed spec is a GraphError;
//   2. gates it on the contract row (state dtype, head dim): a decline records the reason and
//      leaves the graph untouched;
//   3. appends the KdaDecode node (plain fused_kda_decode over the conv-state view) and splices
//      an Op::Branch at x whose merge is `reconverge`.
#pragma once

#include <optional>
#include <string>

#include "splice/ir/graph.h"
#include "splice/ops/contract.h"
#include "splice/passes/decisions.h"
#include "splice/passes/decode_flash.h"

namespace splice {

struct KdaDecodeSpec {
  NodeId x;              // [R, 3C] bf16 packed q|k|v projections (pre-conv); the diverge point
  NodeId weight;         // [3, 4, C] f32 conv taps
  NodeId conv_state;     // state buffer [slots, 3, 3C] bf16 (history position-major, oldest first)
  NodeId raw_gate;       // [1, R, H, D] bf16
  NodeId raw_beta;       // [1, R, H] bf16
  NodeId A_log;          // [H] f32
  NodeId dt_bias;        // [C] f32
  NodeId state_indices;  // [R] i32 (row r's cache slot; > 0)
  NodeId state;          // state buffer [slots, H, D, D] f32 | bf16
  NodeId output_gate;    // [R, H, D] bf16
  NodeId norm_weight;    // [D] f32
  std::optional<float> lower_bound = -5.0f;
  float norm_eps = 1e-5f;
  NodeId decomposed_out;  // arm 0's exit [1, R, H, D] bf16
  NodeId reconverge;      // its sole consumer
  std::string site;
};

OfferResult offer_kda_arm(Graph& graph, const KdaDecodeSpec& spec, const KdaContract& contract,
                          DecisionLog* log = nullptr);

}  // namespace splice
