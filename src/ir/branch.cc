// Op::Branch: the validated builder, arm interiors and collapse (spec decode_attention.md §3).
//
// 1. Interior of an arm = (nodes reachable forward from the diverge node, diverge excluded)
//    ∩ (nodes reachable backward from the arm's exit, exit included).
// 2. finalize() checks the spec's rejections in order, then appends the Branch node (inputs =
//    exits, arm 0 first) and rewires the merge from arm 0's exit to the branch.
// 3. collapse() rewires the branch's readers to the chosen exit and erases the branch and the
//    other arms' interiors; anything else they alone used is left to dead-code elimination.
#include <algorithm>
#include <set>

#include "ir/branch_check.h"
#include "splice/core/error.h"
#include "splice/ir/graph.h"

namespace splice {

std::vector<bool> downstream_of(const Graph& graph, NodeId from,
                                const std::vector<std::vector<NodeId>>& users) {
  std::vector<bool> seen(graph.size(), false);
  std::vector<NodeId> stack{from};
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    for (NodeId u : users[n.index])
      if (!seen[u.index]) {
        seen[u.index] = true;
        stack.push_back(u);
      }
  }
  return seen;
}

std::vector<bool> upstream_of(const Graph& graph, NodeId to) {
  std::vector<bool> seen(graph.size(), false);
  std::vector<NodeId> stack{to};
  seen[to.index] = true;
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    for (NodeId in : graph.node(n).inputs)
      if (!seen[in.index]) {
        seen[in.index] = true;
        stack.push_back(in);
      }
  }
  return seen;
}

std::vector<NodeId> arm_interior(const Graph& graph, NodeId diverge, NodeId exit) {
  const auto users = graph.users();
  const auto down = downstream_of(graph, diverge, users);
  const auto up = upstream_of(graph, exit);
  std::vector<NodeId> interior;
  for (std::uint32_t i = 0; i < graph.size(); ++i)
    if (down[i] && up[i] && graph.is_live(NodeId{i})) interior.push_back(NodeId{i});
  return interior;
}

void check_branch_arms(const Graph& graph, NodeId diverge, const std::vector<NodeId>& exits,
                       NodeId merge, NodeId branch_node) {
  if (exits.empty()) fail<GraphError>("branch at %", diverge.index, ": needs at least one arm");
  if (!graph.is_live(diverge))
    fail<GraphError>("branch: diverge node %", diverge.index, " is not a live node");
  if (!graph.is_live(merge))
    fail<GraphError>("branch: merge node %", merge.index, " is not a live node");
  const auto users = graph.users();
  const auto down = downstream_of(graph, diverge, users);
  if (merge == diverge || !down[merge.index])
    fail<GraphError>("branch at %", diverge.index, ": merge %", merge.index,
                     " is not strictly downstream of the diverge node");
  const Node& exit0 = graph.node(exits[0]);
  std::vector<int> owner(graph.size(), -1);
  for (std::size_t arm = 0; arm < exits.size(); ++arm) {
    const NodeId exit = exits[arm];
    if (!graph.is_live(exit))
      fail<GraphError>("branch at %", diverge.index, ": arm ", arm, " exit %", exit.index,
                       " is not a live node");
    if (!down[exit.index])
      fail<GraphError>("branch at %", diverge.index, ": arm ", arm, " exit %", exit.index,
                       " is not downstream of the diverge node");
    const Node& e = graph.node(exit);
    if (!same_shape(e.shape, exit0.shape) || e.dtype != exit0.dtype)
      fail<GraphError>("branch at %", diverge.index, ": arm ", arm, " exit is ",
                       dtype_name(e.dtype), sym_shape_str(e.shape), " but arm 0 exit is ",
                       dtype_name(exit0.dtype), sym_shape_str(exit0.shape));
    const auto up = upstream_of(graph, exit);
    for (std::uint32_t i = 0; i < graph.size(); ++i) {
      if (!(down[i] && up[i]) || !graph.is_live(NodeId{i})) continue;
      if (owner[i] >= 0)
        fail<GraphError>("branch at %", diverge.index, ": arms ", owner[i], " and ", arm,
                         " overlap at node %", i, " (", op_name(graph.node(NodeId{i}).op), ")");
      owner[i] = static_cast<int>(arm);
    }
  }
  // Interior nodes may be read only inside their own arm, by the branch node (exits), or (before
  // the splice) by the merge reading arm 0's exit.
  for (std::uint32_t i = 0; i < graph.size(); ++i) {
    if (owner[i] < 0) continue;
    for (NodeId reader : users[i]) {
      if (owner[reader.index] == owner[i]) continue;
      if (reader == branch_node) continue;
      if (!branch_node.valid() && reader == merge && NodeId{i} == exits[0]) continue;
      fail<GraphError>("branch at %", diverge.index, ": node %", i, " inside arm ", owner[i],
                       " is read from outside the branch by %", reader.index, " (",
                       op_name(graph.node(reader).op), ")");
    }
  }
  const auto& merge_inputs = graph.node(merge).inputs;
  const NodeId expected = branch_node.valid() ? branch_node : exits[0];
  if (std::find(merge_inputs.begin(), merge_inputs.end(), expected) == merge_inputs.end())
    fail<GraphError>("branch at %", diverge.index, ": merge %", merge.index, " does not read ",
                     branch_node.valid() ? "the branch" : "arm 0's exit", " %", expected.index,
                     " (an unselected graph must still run arm 0)");
}

BranchBuilder::BranchBuilder(Graph& graph, NodeId diverge) : graph_(graph), diverge_(diverge) {
  if (!graph.is_live(diverge))
    fail<GraphError>("branch: diverge node %", diverge.index, " is not a live node");
}

BranchBuilder& BranchBuilder::add_arm(NodeId exit, const std::string& label) {
  exits_.push_back(exit);
  labels_.push_back(label);
  return *this;
}

NodeId BranchBuilder::finalize(NodeId merge, ArmRecipe recipe) {
  check_branch_arms(graph_, diverge_, exits_, merge, NodeId{});
  Node branch;
  branch.op = Op::Branch;
  branch.inputs = exits_;
  const Node& exit0 = graph_.node(exits_[0]);
  branch.shape = exit0.shape;
  branch.dtype = exit0.dtype;
  branch.attrs.branch = std::make_shared<BranchAttrs>();
  branch.attrs.branch->diverge = diverge_;
  branch.attrs.branch->merge = merge;
  branch.attrs.branch->arm_labels = labels_;
  branch.attrs.branch->recipe = std::move(recipe);
  branch.label = "branch(" + (labels_.empty() ? std::string() : labels_.back()) + ")";
  const NodeId id = graph_.append(std::move(branch));
  graph_.replace_uses(exits_[0], id, {merge});
  return id;
}

void collapse(Graph& graph, NodeId branch, int arm) {
  const Node& b = graph.node(branch);
  if (b.op != Op::Branch || b.erased)
    fail<GraphError>("collapse: node %", branch.index, " is not a live branch");
  if (arm < 0 || arm >= static_cast<int>(b.inputs.size()))
    fail<GraphError>("collapse: arm ", arm, " does not exist (branch %", branch.index, " has ",
                     b.inputs.size(), " arms)");
  const NodeId diverge = b.attrs.branch->diverge;
  const std::vector<NodeId> exits = b.inputs;
  const NodeId chosen = exits[arm];
  graph.replace_uses(branch, chosen);
  graph.erase(branch);
  std::set<NodeId> keep;
  for (NodeId n : arm_interior(graph, diverge, chosen)) keep.insert(n);
  for (std::size_t i = 0; i < exits.size(); ++i) {
    if (static_cast<int>(i) == arm) continue;
    for (NodeId n : arm_interior(graph, diverge, exits[i]))
      if (!keep.count(n)) graph.erase(n);
  }
}

}  // namespace splice
