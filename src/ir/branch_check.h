// Branch invariants shared by the builder (before the splice) and the verifier (after it).
#pragma once

#include <vector>

#include "splice/ir/graph.h"

namespace splice {

// Throws GraphError for each rejection in spec §3. `branch_node` is invalid before the splice
// (the merge must then read arm 0's exit) and the Branch node after it (the merge reads it).
void check_branch_arms(const Graph& graph, NodeId diverge, const std::vector<NodeId>& exits,
                       NodeId merge, NodeId branch_node);

std::vector<bool> downstream_of(const Graph& graph, NodeId from,
                                const std::vector<std::vector<NodeId>>& users);
std::vector<bool> upstream_of(const Graph& graph, NodeId to);

}  // namespace splice
