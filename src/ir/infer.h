// Per-op shape and dtype inference: the single rule book used by the builders and the verifier.
#pragma once

#include "splice/ir/graph.h"

namespace splice {

struct Inferred {
  SymShape shape;
  DType dtype;
};

// Infers `node`'s shape and dtype from its inputs and attributes; throws GraphError naming the
// op and the offending operand when the node is malformed.
Inferred infer_node(const Graph& graph, const Node& node);

}  // namespace splice
