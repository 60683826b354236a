// The two ends every offer_*_arm shares (decode_flash.cc, kda.cc, layer_ops.cc): a declined offer
// recorded with its reason, or the branch spliced and recorded. What differs per pass (the spec's
// validation, the gate, the fused node and its recipe) stays in the pass.
#pragma once

#include <string>

#include "splice/ir/graph.h"
#include "splice/passes/decisions.h"
#include "splice/passes/decode_flash.h"

namespace splice {

// The gate refused: `decision` (kind and site set) logged with `reason`, which the result carries.
OfferResult decline_offer(Decision decision, const std::string& reason, DecisionLog* log);

// The gate accepted: a branch from `diverge` with arm 0 = the decomposed region's exit
// `decomposed_out` ("decomposed", the oracle) and arm 1 = `fused` (labelled `fused_label`, the
// contract's kernel/backend), reconverging at `reconverge`; `decision` logged as offered with
// `reason` and the branch's arm labels.
OfferResult splice_offer(Graph& g, NodeId diverge, NodeId decomposed_out, NodeId fused,
                         NodeId reconverge, const ArmRecipe& recipe, const std::string& fused_label,
                         const std::string& reason, Decision decision, DecisionLog* log);

}  // namespace splice
