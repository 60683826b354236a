// Plan-once scheduling, liveness and the arena memory plan (see plan.h for the stages).
#include "splice/plan/plan.h"

#include <algorithm>
#include <queue>
#include <set>
#include <sstream>

#include "splice/core/error.h"

namespace splice {

bool aliases_input(Op op) { return is_view(op) || op == Op::Reshape; }

namespace {

bool needs_buffer(Op op) { return !is_source(op) && !(is_view(op)); }

std::int64_t align_up(std::int64_t v) {
  return (v + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// Which input a view aliases (WriteAt aliases its state, the rest their first input; a branch
// aliases each of its exits).
std::vector<std::size_t> aliased_inputs(const Node& n) {
  if (n.op == Op::Branch) {
    std::vector<std::size_t> all(n.inputs.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }
  if (aliases_input(n.op)) return {0};
  return {};
}

// Nodes needed by the roots when branch `skip` pulls none of its exits (other branches all).
std::vector<bool> needed_without(const Graph& g, NodeId skip, const std::vector<NodeId>& roots) {
  std::vector<bool> needed(g.size(), false);
  std::vector<NodeId> stack(roots.begin(), roots.end());
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    if (needed[n.index]) continue;
    needed[n.index] = true;
    if (n == skip) continue;
    for (NodeId in : g.node(n).inputs) stack.push_back(in);
  }
  return needed;
}

std::vector<bool> closure(const Graph& g, NodeId from, const std::vector<bool>& stop) {
  std::vector<bool> seen(g.size(), false);
  std::vector<NodeId> stack{from};
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    if (seen[n.index] || stop[n.index]) continue;
    seen[n.index] = true;
    for (NodeId in : g.node(n).inputs) stack.push_back(in);
  }
  return seen;
}

}  // namespace

Plan make_plan(const Graph& g) {
  Plan plan;
  const std::size_t count = g.size();
  const auto users = g.users();
  const auto live = g.live_nodes();

  // Storage roots through alias edges (reshape counted as an alias for liveness purposes).
  plan.storage_root.assign(count, NodeId{});
  for (NodeId id : topological_order(g)) {
    const Node& n = g.node(id);
    plan.storage_root[id.index] =
        (is_view(n.op) && n.op != Op::Branch) ? plan.storage_root[n.inputs[0].index] : id;
  }

  // Branch regions (stage 5) first: ordering edges must not cross arms of one branch.
  std::vector<bool> in_any_arm(count, false);
  for (NodeId id : live)
    if (g.node(id).op == Op::Branch)
      for (NodeId exit : g.node(id).inputs)
        for (NodeId m : arm_interior(g, g.node(id).attrs.branch->diverge, exit))
          in_any_arm[m.index] = true;
  for (const auto& [name, id] : g.outputs()) plan.roots.push_back(id);
  for (NodeId id : live)
    if (has_effect(g.node(id).op) && !in_any_arm[id.index]) plan.roots.push_back(id);
  // [node index] -> the regions with the node in one of their arms. A branch nested inside
  // another's arm is in every arm of the outer one that needs it, so membership is per region.
  std::vector<std::vector<std::size_t>> regions_of(count);
  for (NodeId id : live) {
    const Node& n = g.node(id);
    if (n.op != Op::Branch) continue;
    BranchRegion region;
    region.branch = id;
    const auto base = needed_without(g, id, plan.roots);
    for (std::size_t arm = 0; arm < n.inputs.size(); ++arm) {
      auto nodes = closure(g, n.inputs[arm], base);
      for (std::uint32_t i = 0; i < count; ++i)
        if (nodes[i]) {
          auto& regions = regions_of[i];
          if (regions.empty() || regions.back() != plan.branches.size())
            regions.push_back(plan.branches.size());
          if (has_effect(g.node(NodeId{i}).op)) region.arms_have_effects = true;
        }
      region.arm_nodes.push_back(std::move(nodes));
    }
    plan.branches.push_back(std::move(region));
  }
  // Two nodes never run in one step when some branch needs each only through arms the other is
  // not needed by (its arm regions of the two are disjoint): a step runs one arm, and a shadow
  // step adds arm 0 only where no arm has an effect.
  auto different_arms = [&](NodeId a, NodeId b) {
    for (std::size_t r : regions_of[a.index]) {
      const auto& arms = plan.branches[r].arm_nodes;
      bool b_needed = false, shared = false;
      for (const auto& nodes : arms) {
        b_needed = b_needed || nodes[b.index];
        shared = shared || (nodes[a.index] && nodes[b.index]);
      }
      if (b_needed && !shared) return true;
    }
    return false;
  };

  // Stage 1: extra edges reader -> writer for in-place state writes.
  std::vector<std::vector<NodeId>> extra_after(count);  // writer -> readers that must precede it
  auto readers_of = [&](NodeId version) {
    std::vector<NodeId> out;
    std::vector<NodeId> stack{version};
    while (!stack.empty()) {
      NodeId v = stack.back();
      stack.pop_back();
      for (NodeId u : users[v.index]) {
        const Op op = g.node(u).op;
        // A StateAfter names the contents after its effects: its readers read the new version.
        if (op == Op::StateAfter && g.node(u).inputs[0] == v) continue;
        if (op == Op::Slice || op == Op::Permute || op == Op::Reshape)
          stack.push_back(u);
        else
          out.push_back(u);
      }
    }
    return out;
  };
  for (NodeId w : live) {
    const Node& n = g.node(w);
    std::vector<NodeId> written;
    if (n.op == Op::WriteAt) written.push_back(n.inputs[0]);
    // KdaDecode writes its conv_state and state inputs, RopeKvAppend and
    // RmsNormMatMulRopeKvAppend their k and v caches (through views) in place.
    if (n.op == Op::KdaDecode || n.op == Op::RopeKvAppend || n.op == Op::RmsNormMatMulRopeKvAppend)
      for (NodeId in : n.inputs) {
        const NodeId root = plan.storage_root[in.index];
        if (g.node(root).op == Op::State) written.push_back(root);
      }
    for (NodeId version : written)
      for (NodeId r : readers_of(version))
        if (r != w && !different_arms(r, w)) extra_after[w.index].push_back(r);
  }

  // Kahn's algorithm over data edges plus the extra edges, stable by node index.
  std::vector<int> pending(count, 0);
  std::vector<std::vector<NodeId>> succ(count);
  for (NodeId id : live) {
    std::set<std::uint32_t> preds;
    for (NodeId in : g.node(id).inputs) preds.insert(in.index);
    for (NodeId r : extra_after[id.index]) preds.insert(r.index);
    pending[id.index] = static_cast<int>(preds.size());
    for (std::uint32_t p : preds) succ[p].push_back(id);
  }
  std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, std::greater<>> ready;
  for (NodeId id : live)
    if (pending[id.index] == 0) ready.push(id.index);
  while (!ready.empty()) {
    const std::uint32_t n = ready.top();
    ready.pop();
    plan.schedule.push_back(NodeId{n});
    for (NodeId s : succ[n])
      if (--pending[s.index] == 0) ready.push(s.index);
  }
  if (plan.schedule.size() != live.size())
    fail<GraphError>(
        "plan: state reads and writes cannot be ordered (a node reads a state "
        "version that is overwritten before or by something it depends on)");
  plan.position.assign(count, -1);
  for (std::size_t i = 0; i < plan.schedule.size(); ++i)
    plan.position[plan.schedule[i].index] = static_cast<std::int64_t>(i);

  // Stage 3: liveness, in reverse schedule order, extended through alias edges.
  const std::int64_t end = static_cast<std::int64_t>(plan.schedule.size());
  plan.last_use.assign(count, -1);
  for (const auto& [name, id] : g.outputs()) plan.last_use[id.index] = end;
  for (auto it = plan.schedule.rbegin(); it != plan.schedule.rend(); ++it) {
    const Node& n = g.node(*it);
    const std::int64_t pos = plan.position[it->index];
    std::int64_t mine = std::max(plan.last_use[it->index], pos);
    plan.last_use[it->index] = mine;
    const auto aliased = aliased_inputs(n);
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const bool alias = std::find(aliased.begin(), aliased.end(), i) != aliased.end();
      auto& lu = plan.last_use[n.inputs[i].index];
      lu = std::max(lu, alias ? mine : pos);
    }
  }

  // Stage 4: first-fit arena placement at upper-bound sizes.
  plan.buffer_offset.assign(count, -1);
  plan.buffer_bytes.assign(count, 0);
  plan.static_shape.assign(count, true);
  struct Block {
    std::int64_t offset, bytes, free_after;
  };
  std::vector<Block> blocks;  // sorted by offset
  for (NodeId id : plan.schedule) {
    const Node& n = g.node(id);
    for (const auto& d : n.shape)
      if (d.reads_symbols()) plan.static_shape[id.index] = false;
    if (!needs_buffer(n.op)) continue;
    std::int64_t elements = 1;
    for (auto d : upper_bound_shape(n.shape, g.symbols())) elements *= std::max<std::int64_t>(d, 0);
    const std::int64_t bytes = align_up(std::max<std::int64_t>(elements, 1) *
                                        static_cast<std::int64_t>(dtype_size(n.dtype)));
    const std::int64_t pos = plan.position[id.index];
    blocks.erase(std::remove_if(blocks.begin(), blocks.end(),
                                [&](const Block& b) { return b.free_after < pos; }),
                 blocks.end());
    std::int64_t offset = 0;
    for (const Block& b : blocks) {
      if (b.offset - offset >= bytes) break;
      offset = std::max(offset, b.offset + b.bytes);
    }
    Block placed{offset, bytes, plan.last_use[id.index]};
    blocks.insert(
        std::upper_bound(blocks.begin(), blocks.end(), placed,
                         [](const Block& a, const Block& b) { return a.offset < b.offset; }),
        placed);
    plan.buffer_offset[id.index] = offset;
    plan.buffer_bytes[id.index] = bytes;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + bytes);
    plan.unshared_bytes += bytes;
  }
  return plan;
}

std::vector<bool> nodes_to_run(const Graph& g, const Plan& plan, const std::vector<int>& key) {
  SPLICE_INTERNAL_CHECK(key.size() == plan.branches.size() * 2,
                        "nodes_to_run: the key must hold two entries per branch region");
  std::vector<int> region_of(g.size(), -1);
  for (std::size_t b = 0; b < plan.branches.size(); ++b)
    region_of[plan.branches[b].branch.index] = static_cast<int>(b);
  std::vector<bool> run(g.size(), false);
  std::vector<NodeId> stack(plan.roots.begin(), plan.roots.end());
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    if (run[id.index]) continue;
    run[id.index] = true;
    const Node& n = g.node(id);
    const int b = region_of[id.index];
    if (b < 0) {
      for (NodeId in : n.inputs) stack.push_back(in);
      continue;
    }
    const auto arm = static_cast<std::size_t>(key[2 * static_cast<std::size_t>(b)]);
    SPLICE_INTERNAL_CHECK(arm < n.inputs.size(), "nodes_to_run: arm out of range");
    stack.push_back(n.inputs[arm]);
    if (key[2 * static_cast<std::size_t>(b) + 1]) stack.push_back(n.inputs[0]);
  }
  return run;
}

std::string Plan::summary(const Graph& graph) const {
  std::ostringstream out;
  std::size_t buffers = 0;
  for (auto b : buffer_offset) buffers += b >= 0;
  std::int64_t state_bytes = 0;
  for (NodeId id : schedule) {
    const Node& n = graph.node(id);
    if (n.op != Op::State) continue;
    std::int64_t e = 1;
    for (auto d : upper_bound_shape(n.shape, graph.symbols())) e *= d;
    state_bytes += e * static_cast<std::int64_t>(dtype_size(n.dtype));
  }
  out << "plan: " << schedule.size() << " nodes scheduled, " << buffers << " buffers in a "
      << arena_bytes << "-byte arena (" << unshared_bytes << " without reuse), " << state_bytes
      << " bytes of persistent state, " << branches.size() << " branches";
  return out.str();
}

}  // namespace splice
