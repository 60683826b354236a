// decline_offer / splice_offer: see offer.h.
#include "passes/offer.h"

#include <utility>

namespace splice {

OfferResult decline_offer(Decision decision, const std::string& reason, DecisionLog* log) {
  OfferResult result;
  result.reason = decision.reason = reason;
  if (log) log->add(std::move(decision));
  return result;
}

OfferResult splice_offer(Graph& g, NodeId diverge, NodeId decomposed_out, NodeId fused,
                         NodeId reconverge, const ArmRecipe& recipe, const std::string& fused_label,
                         const std::string& reason, Decision decision, DecisionLog* log) {
  BranchBuilder builder(g, diverge);
  builder.add_arm(decomposed_out, "decomposed").add_arm(fused, fused_label);
  OfferResult result;
  result.branch = builder.finalize(reconverge, recipe);
  result.offered = true;
  result.reason = reason;
  decision.offered = true;
  decision.reason = reason;
  decision.branch = result.branch;
  decision.arm_labels = g.node(result.branch).attrs.branch->arm_labels;
  if (log) log->add(std::move(decision));
  return result;
}

}  // namespace splice
