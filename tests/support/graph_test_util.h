// Helpers for graph-level tests: random values for a graph's inputs and op counts.
#pragma once

#include <cstdint>

#include "splice/core/random.h"
#include "splice/core/sym.h"
#include "splice/exec/session.h"
#include "splice/ir/graph.h"
#include "support/test_util.h"

namespace splice::testing {

// N(0, stddev) values for every live Input node of `g`, at its shape's upper bound.
inline TensorMap random_inputs(const Graph& g, std::uint64_t seed, double stddev = 1.0) {
  Rng rng(seed);
  TensorMap m;
  for (NodeId id : g.live_nodes()) {
    const Node& n = g.node(id);
    if (n.op == Op::Input)
      m[n.attrs.name] =
          random_tensor(rng, upper_bound_shape(n.shape, g.symbols()), n.dtype, stddev);
  }
  return m;
}

// Live nodes of `g` with op `op`.
inline int count_op(const Graph& g, Op op) {
  int n = 0;
  for (NodeId id : g.live_nodes()) n += g.node(id).op == op;
  return n;
}

}  // namespace splice::testing
