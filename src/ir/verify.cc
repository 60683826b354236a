// Graph verifier, topological order and dead-code elimination.
//
// verify_graph checks, in order: (1) every live node's inputs are live; (2) each node's stored
// shape and dtype equal what its op's rule infers from its inputs; (3) the live graph is acyclic;
// (4) single assignment: input, state and output names are unique, and a state version is
// overwritten by at most one write outside branch arms; (5) every output is live; (6) every
// Branch node satisfies the invariants of spec §3.
#include <algorithm>
#include <queue>
#include <set>

#include "ir/branch_check.h"
#include "ir/infer.h"
#include "splice/core/error.h"
#include "splice/ir/graph.h"

namespace splice {

std::vector<NodeId> topological_order(const Graph& graph) {
  const auto users = graph.users();
  std::vector<int> pending(graph.size(), 0);
  std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, std::greater<>> ready;
  for (NodeId id : graph.live_nodes()) {
    std::set<std::uint32_t> distinct;
    for (NodeId in : graph.node(id).inputs) distinct.insert(in.index);
    pending[id.index] = static_cast<int>(distinct.size());
    if (pending[id.index] == 0) ready.push(id.index);
  }
  std::vector<NodeId> order;
  while (!ready.empty()) {
    const std::uint32_t n = ready.top();
    ready.pop();
    order.push_back(NodeId{n});
    for (NodeId u : users[n])
      if (--pending[u.index] == 0) ready.push(u.index);
  }
  return order;
}

std::size_t eliminate_dead_code(Graph& graph) {
  std::vector<bool> needed(graph.size(), false);
  std::vector<NodeId> stack;
  for (const auto& [name, id] : graph.outputs()) stack.push_back(id);
  for (NodeId id : graph.live_nodes())
    if (has_effect(graph.node(id).op)) stack.push_back(id);
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    if (needed[n.index]) continue;
    needed[n.index] = true;
    for (NodeId in : graph.node(n).inputs) stack.push_back(in);
  }
  std::size_t removed = 0;
  for (NodeId id : graph.live_nodes())
    if (!needed[id.index]) {
      graph.erase(id);
      ++removed;
    }
  return removed;
}

void verify_graph(const Graph& graph) {
  const auto live = graph.live_nodes();
  for (NodeId id : live) {
    const Node& n = graph.node(id);
    for (NodeId in : n.inputs)
      if (!graph.is_live(in))
        fail<GraphError>("verify: %", id.index, " (", op_name(n.op), ") reads ",
                         graph.contains(in) ? "erased" : "nonexistent", " node %", in.index);
  }
  for (NodeId id : live) {
    const Node& n = graph.node(id);
    Inferred inferred;
    try {
      inferred = infer_node(graph, n);
    } catch (const GraphError& e) {
      fail<GraphError>("verify: %", id.index, " (", op_name(n.op), "): ", e.what());
    }
    if (!same_shape(inferred.shape, n.shape) || inferred.dtype != n.dtype)
      fail<GraphError>("verify: %", id.index, " (", op_name(n.op), ") is ", dtype_name(n.dtype),
                       sym_shape_str(n.shape, &graph.symbols()), " but its inputs make it ",
                       dtype_name(inferred.dtype), sym_shape_str(inferred.shape, &graph.symbols()));
  }
  if (topological_order(graph).size() != live.size())
    fail<GraphError>("verify: the graph has a cycle");

  std::set<std::string> inputs, states, outputs;
  for (NodeId id : live) {
    const Node& n = graph.node(id);
    if (n.op == Op::Input && !inputs.insert(n.attrs.name).second)
      fail<GraphError>("verify: input '", n.attrs.name, "' is declared twice");
    if (n.op == Op::State && !states.insert(n.attrs.name).second)
      fail<GraphError>("verify: state '", n.attrs.name, "' is declared twice");
  }
  for (const auto& [name, id] : graph.outputs()) {
    if (!outputs.insert(name).second)
      fail<GraphError>("verify: output '", name, "' is marked twice");
    if (!graph.is_live(id)) fail<GraphError>("verify: output '", name, "' is not a live node");
  }

  // Branch invariants, and the set of nodes inside some arm.
  std::vector<bool> in_arm(graph.size(), false);
  for (NodeId id : live) {
    const Node& n = graph.node(id);
    if (n.op != Op::Branch) continue;
    if (!n.attrs.branch) fail<GraphError>("verify: branch %", id.index, " has no attributes");
    const BranchAttrs& b = *n.attrs.branch;
    check_branch_arms(graph, b.diverge, n.inputs, b.merge, id);
    for (NodeId exit : n.inputs)
      for (NodeId m : arm_interior(graph, b.diverge, exit)) in_arm[m.index] = true;
    for (const auto& choice : b.dispatch)
      if (choice.arm < 0 || choice.arm >= static_cast<int>(n.inputs.size()) ||
          choice.lo > choice.hi)
        fail<GraphError>("verify: branch %", id.index, " dispatch [", choice.lo, ", ", choice.hi,
                         "] -> arm ", choice.arm, " is invalid");
  }
  std::set<std::uint32_t> overwritten;
  for (NodeId id : live) {
    const Node& n = graph.node(id);
    if (n.op != Op::WriteAt || in_arm[id.index]) continue;
    if (!overwritten.insert(n.inputs[0].index).second)
      fail<GraphError>("verify: state version %", n.inputs[0].index,
                       " is overwritten twice (single assignment)");
  }
}

}  // namespace splice
