// splice/tune/optimize.h: the optimizer driver a model calls once, before planning.
//
//   1. offer every spec's fused arm (attention, KDA, then the layer ops) against the target
//      device's contract row (declines recorded);
//   2. select arms (verify, time, choose, persist, explain: select.h);
//   3. dead-code elimination; the verifier runs after every stage.
// SPLICE_DEBUG=1 prints the decisions, =2 also the IR after each stage (core/debug.h).
#pragma once

#include <vector>

#include "splice/passes/decode_flash.h"
#include "splice/passes/kda.h"
#include "splice/passes/layer_ops.h"
#include "splice/tune/select.h"

namespace splice {

struct OptimizeOptions {
  TuneOptions tune;
  bool select = true;  // false: offer only (branches stay uncollapsed and run arm 0)
};

// The flash-decode contract row of `device`'s backend.
const AttentionContract& flash_decode_contract_for(Device device);

const KdaContract& kda_contract_for(Device device);

// The layer-op (RmsNorm, SiluMul, Rope) contract row of `device`'s backend.
const LayerOpContract& layer_ops_contract_for(Device device);

DecisionLog optimize_graph(Graph& graph, const std::vector<DecodeFlashSpec>& attention_specs,
                           const OptimizeOptions& options,
                           const std::vector<KdaDecodeSpec>& kda_specs = {},
                           const std::vector<LayerOpSpec>& layer_specs = {});

}  // namespace splice
