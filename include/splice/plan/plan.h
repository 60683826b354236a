// splice/plan/plan.h: plan once — schedule, liveness, memory plan and branch regions.
//
// 1. Schedule: a topological order that also puts every reader of a state version before the
//    node that overwrites that state in place (WriteAt, KdaDecode, RopeKvAppend,
//    RmsNormMatMulRopeKvAppend), reading through view chains; a StateAfter's readers read the
//    new contents (ordered by its inputs instead).
// 2. Aliases: view ops (permute, slice, write_at, sequence, branch, and reshape when its input
//    is contiguous) own no memory; each node's storage root is found by walking those edges.
// 3. Liveness: a buffer lives from its producer to the last use of it or of any view of it;
//    graph outputs live to the end of the step.
// 4. Memory plan: every buffer is sized at its shape's upper bound (symbols at their declared
//    maximum) and placed first-fit in one arena, reusing the space of dead buffers.
// 5. Branch regions: per branch and arm, the nodes only that arm needs, so a step runs exactly
//    the chosen arm (and, for a shadow check, the oracle too). A branch nested inside another's
//    arm belongs to every outer arm that needs it; ordering edges are dropped only between nodes
//    that some branch needs through disjoint arms (they never run in one step).
#pragma once

#include <cstdint>
#include <vector>

#include "splice/ir/graph.h"

namespace splice {

inline constexpr std::int64_t kArenaAlignment = 256;  // bytes: CUDA-friendly for every dtype

struct BranchRegion {
  NodeId branch;
  std::vector<std::vector<bool>> arm_nodes;  // [arm][node index]: needed only by that arm
  bool arms_have_effects = false;            // any cache write inside an arm
};

struct Plan {
  std::vector<NodeId> schedule;
  std::vector<std::int64_t> position;       // [node index] -> schedule position (-1 if dead)
  std::vector<NodeId> storage_root;         // [node index] -> node owning its memory
  std::vector<std::int64_t> buffer_offset;  // [node index] -> arena byte offset (-1: none)
  std::vector<std::int64_t> buffer_bytes;   // [node index] -> bytes at the upper bound
  std::vector<std::int64_t> last_use;       // [node index] -> last schedule position needing it
  std::int64_t arena_bytes = 0;
  std::int64_t unshared_bytes = 0;  // what the arena would be without reuse
  std::vector<BranchRegion> branches;
  std::vector<bool> static_shape;  // [node index] -> shape reads no symbol
  std::vector<NodeId> roots;       // outputs, then the effects outside every arm
  std::string summary(const Graph& graph) const;
};

// Builds the plan of a verified graph. Throws GraphError when state reads and writes cannot be
// ordered (a reader of an old state version that also depends on the write).
Plan make_plan(const Graph& graph);

// The nodes one step runs: everything the roots need, where a branch pulls only the arm in
// key[2 * b] (and arm 0 too when key[2 * b + 1] != 0: a shadow check), b indexing
// plan.branches. Nested branches follow their own choice, so an unchosen arm never runs.
std::vector<bool> nodes_to_run(const Graph& graph, const Plan& plan, const std::vector<int>& key);

// True when `op` owns no memory of its own (Reshape aliases conditionally, see above).
bool aliases_input(Op op);

}  // namespace splice
