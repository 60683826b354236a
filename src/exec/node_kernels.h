// Runs one compute node (not a source, not a view) on the device its output lives on.
#pragma once

#include <vector>

#include "splice/core/tensor.h"
#include "splice/ir/graph.h"

namespace splice {

// Scalars of a node evaluated for this step.
struct NodeScalars {
  std::int64_t value = 0;  // SymValue's value, FlashDecode's k_len, WriteAt's offset
};

// `inputs` are the node's input values, `out` its planned output buffer (concrete shape).
// `aux` carries a node-owned device scalar buffer (FlashDecode's k_len [1] int32).
void run_compute_node(const Node& node, const std::vector<Tensor>& inputs, Tensor& out,
                      const NodeScalars& scalars, Tensor& aux);

}  // namespace splice
