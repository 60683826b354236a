// splice/ir/graph.h: the graph arena, its builder API and Op::Branch.
//
// A Graph is an append-only arena of nodes {op, inputs, shape, dtype, attrs} addressed by NodeId.
// Builders infer shapes symbolically (NumPy broadcasting over SymExprs; two symbolic dims must be
// structurally equal) and reject malformed ops with GraphError naming the op and its operands.
// Passes may rewire inputs (the Branch splice, collapse) and erase nodes (tombstones, so NodeIds
// held by specs and decisions stay valid); the verifier re-checks every invariant after each pass.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "splice/core/sym.h"
#include "splice/core/tensor.h"
#include "splice/core/tolerance.h"
#include "splice/ir/op.h"

namespace splice {

struct NodeId {
  static constexpr std::uint32_t kInvalid = 0xFFFFFFFFu;
  std::uint32_t index = kInvalid;
  bool valid() const { return index != kInvalid; }
  bool operator==(const NodeId&) const = default;
  auto operator<=>(const NodeId&) const = default;
};

// Attributes of a FlashDecode node (the spec's features).
struct FlashDecodeAttrs {
  float softmax_scale = 0.0f;
  bool causal = true;
  std::optional<std::int64_t> window_left, window_right;
  std::optional<float> softcap;
  bool has_alibi = false;
  DynScalar k_len;  // live attended prefix
};

// Attributes of a KdaDecode node.
struct KdaAttrs {
  std::optional<float> lower_bound = -5.0f;
  float norm_eps = 1e-5f;
  bool packed = true;  // packed_fused_kda_decode; false: fused_kda_decode (T = 1)
  bool has_t1_state_indices = false;
};

// What the verifier needs to generate inputs for a branch's region: the fused kernel's kind,
// named roles of the region's boundary nodes, and the length symbol that selects buckets.
struct ArmRecipe {
  std::string kind;                     // "flash_decode", "kda_decode"
  std::map<std::string, NodeId> roles;  // e.g. "q", "k", "v", "alibi"
  std::optional<DynScalar> selector;    // e.g. k_len; buckets are ranges of its value
  std::string contract_revision;        // the fused kernel's revision (tuning-cache key)
  // The fused kernel's contract bound on the exit, for verification (set by offers whose contract
  // row states one, e.g. AttentionContract::tolerance); none: the arm generator's.
  std::optional<Tolerance> output_tolerance;
};

// One bucket of a branch decision: selector values in [lo, hi] run `arm`.
struct BucketChoice {
  std::int64_t lo = 0, hi = 0;
  int arm = 0;
};

struct BranchAttrs {
  NodeId diverge;  // where the arms split (e.g. q)
  NodeId merge;    // the node that reads the branch (the reconverge point)
  std::vector<std::string> arm_labels;
  ArmRecipe recipe;
  std::vector<BucketChoice> dispatch;  // empty: run arm 0
};

struct Attrs {
  std::int64_t axis = 0;
  bool keepdim = false;
  bool transpose_b = false;
  std::vector<std::int64_t> perm;
  DynScalar start, end;  // Slice bounds
  DynScalar offset;      // WriteAt position
  DynScalar value;       // SymValue
  std::string name;      // Input / Param / State name
  Tensor tensor;         // Param / Constant data
  std::shared_ptr<FlashDecodeAttrs> flash;
  std::shared_ptr<KdaAttrs> kda;
  float eps = 0.0f;  // RmsNorm's epsilon
  std::shared_ptr<BranchAttrs> branch;
};

struct Node {
  Op op = Op::Constant;
  std::vector<NodeId> inputs;
  SymShape shape;
  DType dtype = DType::f32;
  Attrs attrs;
  std::string label;  // human-readable provenance, e.g. "layer3.attn.scores"
  bool erased = false;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = default;
  Graph& operator=(const Graph&) = default;

  SymTable& symbols() { return symbols_; }
  const SymTable& symbols() const { return symbols_; }
  SymId declare_symbol(const std::string& name, std::int64_t lo, std::int64_t hi) {
    return symbols_.declare(name, lo, hi);
  }

  std::size_t size() const { return nodes_.size(); }
  // References stay valid only until the next append (the arena is a vector).
  const Node& node(NodeId id) const;
  Node& mutable_node(NodeId id);
  bool contains(NodeId id) const { return id.valid() && id.index < nodes_.size(); }
  bool is_live(NodeId id) const { return contains(id) && !nodes_[id.index].erased; }
  std::vector<NodeId> live_nodes() const;
  // Consumers of every live node (computed on demand; O(edges)).
  std::vector<std::vector<NodeId>> users() const;

  // Appends a fully formed node (used by passes); validates input ids.
  NodeId append(Node node);
  void erase(NodeId id) { mutable_node(id).erased = true; }
  // Replaces every use of `from` by `to` in the inputs of `consumers` (all live nodes if empty).
  void replace_uses(NodeId from, NodeId to, const std::vector<NodeId>& consumers = {});

  // Named graph outputs (e.g. "logits"), readable after each step.
  void mark_output(const std::string& name, NodeId id);
  const std::vector<std::pair<std::string, NodeId>>& outputs() const { return outputs_; }

  // ---- builder API (each validates and infers shape/dtype) ----
  NodeId input(const std::string& name, SymShape shape, DType dtype);
  NodeId param(const std::string& name, Tensor value);
  NodeId constant(Tensor value, const std::string& label = "");
  NodeId scalar(double value, DType dtype);  // a [1] constant
  NodeId state(const std::string& name, SymShape shape, DType dtype);
  NodeId sym_value(DynScalar value, DType dtype = DType::i32);
  NodeId iota(SymShape shape, std::int64_t axis, DType dtype);
  NodeId unary(Op op, NodeId x);
  NodeId binary(Op op, NodeId a, NodeId b);  // arithmetic or comparison
  NodeId where(NodeId cond, NodeId a, NodeId b);
  NodeId reduce(Op op, NodeId x, std::int64_t axis, bool keepdim);
  NodeId softmax(NodeId x, std::int64_t axis);
  NodeId matmul(NodeId a, NodeId b, bool transpose_b = false);
  NodeId reshape(NodeId x, SymShape shape);
  NodeId permute(NodeId x, std::vector<std::int64_t> perm);
  NodeId slice(NodeId x, std::int64_t axis, DynScalar start, DynScalar end);
  NodeId concat(const std::vector<NodeId>& xs, std::int64_t axis);
  NodeId gather(NodeId table, NodeId indices);
  NodeId cast(NodeId x, DType dtype);
  NodeId write_at(NodeId state, NodeId value, std::int64_t axis, DynScalar offset);
  NodeId sequence(NodeId value, const std::vector<NodeId>& after);
  NodeId flash_decode(NodeId q, NodeId k, NodeId v, std::optional<NodeId> alibi,
                      const FlashDecodeAttrs& attrs);
  NodeId kda_decode(const std::vector<NodeId>& inputs, const KdaAttrs& attrs, SymShape out_shape);
  // Fused layer ops (op.h): x [..., H], weight [H]; the output dtype is `dtype`.
  NodeId rms_norm(NodeId x, NodeId weight, float eps, DType dtype);
  NodeId silu_mul(NodeId a, NodeId b);
  // a @ b^T + c (Op::MatMulAdd), stored in `dtype`.
  NodeId matmul_add(NodeId a, NodeId b, NodeId c, DType dtype);
  // round_w(rms_norm(x, weight, eps)) @ w^T (Op::RmsNormMatMul), stored in `dtype`.
  NodeId rms_norm_matmul(NodeId x, NodeId weight, NodeId w, float eps, DType dtype);
  // (silu(a) * b) @ w^T + c (Op::SiluMulMatMulAdd), stored in `dtype`.
  NodeId silu_mul_matmul_add(NodeId a, NodeId b, NodeId w, NodeId c, DType dtype);
  // x [..., D], cos/sin tables [max_seq_len, D], position [1] i32.
  NodeId rope(NodeId x, NodeId cos_table, NodeId sin_table, NodeId position);
  // RopeKvAppend (op.h): returns the rotated q heads; writes k_cache, v_cache in place.
  NodeId rope_kv_append(NodeId qkv, NodeId cos_table, NodeId sin_table, NodeId position,
                        NodeId k_cache, NodeId v_cache);
  // RmsNormMatMulRopeKvAppend (op.h): rms_norm_matmul into the q|k|v row, then rope_kv_append;
  // returns the rotated q heads; writes k_cache, v_cache in place.
  NodeId rms_norm_matmul_rope_kv_append(NodeId x, NodeId norm_weight, NodeId w, float eps,
                                        NodeId cos_table, NodeId sin_table, NodeId position,
                                        NodeId k_cache, NodeId v_cache);
  // RmsNormMatMulSwiglu (op.h): rms_norm_matmul into the gate|up row, then silu(gate) * up;
  // stored in `dtype`.
  NodeId rms_norm_matmul_swiglu(NodeId x, NodeId norm_weight, NodeId w, float eps, DType dtype);
  // StateAfter (op.h): `state` as left by the effects `after` depends on.
  NodeId state_after(NodeId state, const std::vector<NodeId>& after);

  // Labels the most recent node(s) for printing.
  NodeId labeled(NodeId id, const std::string& label);

 private:
  NodeId add(Op op, std::vector<NodeId> inputs, SymShape shape, DType dtype, Attrs attrs = {});
  void check_input(NodeId id, const char* role) const;
  std::int64_t wrap_axis(std::int64_t axis, std::size_t rank, const char* what) const;

  SymTable symbols_;
  std::vector<Node> nodes_;
  std::vector<std::pair<std::string, NodeId>> outputs_;
};

// Broadcasts two symbolic shapes (NumPy rules); throws GraphError naming `what`.
SymShape broadcast_shapes(const SymShape& a, const SymShape& b, const std::string& what);
bool same_shape(const SymShape& a, const SymShape& b);

// ---- Op::Branch (spec decode_attention.md §3) ----
//
// Building a branch is one validated step: open at the diverge node, add arms (arm 0 first, the
// oracle), finalize at the merge. `finalize` rejects: no arm; a merge not strictly downstream of
// the diverge node; an arm exit not downstream of it; arm interiors that overlap or are read from
// outside the branch; exits that differ in shape or dtype; a merge that does not read arm 0's
// exit. On success it appends the Branch node and rewires the merge to read it.
// The interior of an arm is every node downstream of the diverge node and upstream of (or equal
// to) the arm's exit.
class BranchBuilder {
 public:
  BranchBuilder(Graph& graph, NodeId diverge);
  BranchBuilder& add_arm(NodeId exit, const std::string& label);
  NodeId finalize(NodeId merge, ArmRecipe recipe = {});

 private:
  Graph& graph_;
  NodeId diverge_;
  std::vector<NodeId> exits_;
  std::vector<std::string> labels_;
};

// Nodes strictly downstream of `diverge` that are upstream of or equal to `exit`.
std::vector<NodeId> arm_interior(const Graph& graph, NodeId diverge, NodeId exit);

// Rewires every reader of `branch` to the chosen arm's exit and erases the branch node and the
// interiors of the other arms (they are dead). Dead-code elimination removes the rest.
void collapse(Graph& graph, NodeId branch, int arm);

// Erases every live node that no output and no live effect node needs. Returns how many.
std::size_t eliminate_dead_code(Graph& graph);

// Checks every graph invariant: input ids live, shapes/dtypes consistent with each op's rule,
// acyclic, single assignment, outputs live, and every branch invariant. Throws GraphError naming
// the node and the rule.
void verify_graph(const Graph& graph);

// Topological order of the live nodes (inputs before users), stable by node index.
std::vector<NodeId> topological_order(const Graph& graph);

// Readable text: one line per live node, branches shown with their arms.
std::string print_graph(const Graph& graph);
// Graphviz DOT: each branch drawn as a cluster per arm.
std::string graph_to_dot(const Graph& graph);

}  // namespace splice
