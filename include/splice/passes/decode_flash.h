// splice/passes/decode_flash.h: DecodeFlashSpec and the offer of a fused flash-decode arm
// (spec decode_attention.md §2).
//
// A model builds each attention layer from primitives (arm 0, the oracle) and hands the optimizer
// a DecodeFlashSpec describing arm 1. offer_decode_flash_arm:
//   1. validates the spec: ids in range and live, reconverge the sole consumer of decomposed_out,
//      q / k / v / decomposed_out shapes and dtypes consistent, alibi [Hq], Hq % Hkv == 0, a
//      finite positive scale. A malformed spec is a GraphError, never a decline.
//   2. gates it against the target kernel's contract row: dtype, head dim, Sq <= max_sq, GQA
//      group, and every feature the spec uses (causal for Sq > 1, windows, softcap, ALiBi).
//      A decline leaves the graph byte-identical and records the reason.
//   3. offers: appends the FlashDecode node (arm 1) reading q, k, v [, alibi] and splices an
//      Op::Branch at q with both arms; the merge is `reconverge`.
#pragma once

#include <cstddef>
#include <optional>

#include "splice/ir/graph.h"
#include "splice/ops/contract.h"
#include "splice/passes/decisions.h"

namespace splice {

struct DecodeFlashSpec {
  NodeId q;     // [B, Hq, Sq, D]; the flash node's first input and the diverge point
  NodeId k, v;  // capacity KV buffers [B, Hkv, capacity, D]
  std::optional<NodeId> alibi;  // ALiBi slopes [Hq]
  float softmax_scale = 0.0f;   // 1/sqrt(D) or the model's scale
  bool causal = true;
  std::optional<std::size_t> window_size_left, window_size_right;
  std::optional<float> softcap;
  DynScalar k_len;        // live attended prefix (cached_len + seq); Concrete or Sym
  NodeId decomposed_out;  // arm 0's exit [B, Hq, Sq, D] (the oracle)
  NodeId reconverge;      // the sole consumer of decomposed_out (the merge)
  std::string site;       // where it came from, for decisions ("layer3.attn")
};

struct OfferResult {
  bool offered = false;
  std::string reason;
  NodeId branch;
};

// Validates, gates and (when the contract supports the spec) splices the branch.
OfferResult offer_decode_flash_arm(Graph& graph, const DecodeFlashSpec& spec,
                                   const AttentionContract& contract, DecisionLog* log = nullptr);

// The gate alone: empty when `contract` supports every feature `spec` uses, else the reason.
std::string decode_flash_gate(const Graph& graph, const DecodeFlashSpec& spec,
                              const AttentionContract& contract);

}  // namespace splice
