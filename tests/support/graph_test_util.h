// Helpers for graph-level tests: random values for a graph's inputs and op counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "splice/core/random.h"
#include "splice/core/sym.h"
#include "splice/exec/session.h"
#include "splice/ir/graph.h"
#include "splice/tune/optimize.h"
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

// Live nodes of `g` with op `op`, in node order.
inline std::vector<NodeId> nodes_of(const Graph& g, Op op) {
  std::vector<NodeId> out;
  for (NodeId id : g.live_nodes())
    if (g.node(id).op == op) out.push_back(id);
  return out;
}

// Live Branch nodes of `g` whose recipe is of kind `kind` (a layer op's name), in node order.
inline std::vector<NodeId> branches_of(const Graph& g, const std::string& kind) {
  std::vector<NodeId> out;
  for (NodeId id : nodes_of(g, Op::Branch))
    if (g.node(id).attrs.branch->recipe.kind == kind) out.push_back(id);
  return out;
}

// Options that only offer the fused arms (no verification, timing or selection).
inline OptimizeOptions offer_only() {
  OptimizeOptions o;
  o.select = false;
  return o;
}

// The Branch nodes inside arm 0 of branch `outer` (the inner layer-op branches it nests).
inline std::vector<NodeId> arm0_branches(const Graph& g, NodeId outer) {
  const Node& branch = g.node(outer);
  std::vector<NodeId> out;
  for (NodeId n : arm_interior(g, branch.attrs.branch->diverge, branch.inputs[0]))
    if (g.node(n).op == Op::Branch) out.push_back(n);
  return out;
}

// Which nested branches select_fused makes arm 1 (the fused arm) the faster for: every one, all
// but the outer layer op's, or only the outer's.
enum class Fused { all, all_but_outer, only_outer };

// Options that select arms by forced timings: arm 1 takes 1.0 and arm 0 2.0 where `fused` prefers
// the fused arm, the other way round elsewhere ("outer": branches of recipe kind `outer_kind`);
// no warm-up, one repeat.
inline OptimizeOptions select_fused(const Graph* graph, Fused fused, std::string outer_kind) {
  OptimizeOptions o;
  o.select = true;
  o.tune.warmup = 0;
  o.tune.repeats = 1;
  o.tune.time_override = [graph, fused, outer_kind](NodeId branch, int arm, std::int64_t) {
    const bool outer = graph->node(branch).attrs.branch->recipe.kind == outer_kind;
    const bool prefer_fused = fused == Fused::all || (fused == Fused::all_but_outer) != outer;
    return (arm == 1) == prefer_fused ? 1.0 : 2.0;
  };
  return o;
}

}  // namespace splice::testing
