// Graph arena, builder API and per-op shape/dtype inference (see graph.h).
//
// `infer_node` is the single rule book: the builders call it to fill in a new node's shape and
// dtype, and the verifier calls it again after every pass to prove nothing drifted.
#include "splice/ir/graph.h"

#include <algorithm>

#include "ir/infer.h"
#include "splice/core/error.h"

namespace splice {

const Node& Graph::node(NodeId id) const {
  if (!contains(id))
    fail<GraphError>("node id ", id.index, " is out of range (", nodes_.size(), " nodes)");
  return nodes_[id.index];
}

Node& Graph::mutable_node(NodeId id) {
  if (!contains(id))
    fail<GraphError>("node id ", id.index, " is out of range (", nodes_.size(), " nodes)");
  return nodes_[id.index];
}

std::vector<NodeId> Graph::live_nodes() const {
  std::vector<NodeId> out;
  for (std::uint32_t i = 0; i < nodes_.size(); ++i)
    if (!nodes_[i].erased) out.push_back(NodeId{i});
  return out;
}

std::vector<std::vector<NodeId>> Graph::users() const {
  std::vector<std::vector<NodeId>> users(nodes_.size());
  for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].erased) continue;
    for (NodeId in : nodes_[i].inputs)
      if (contains(in)) {
        auto& list = users[in.index];
        if (list.empty() || list.back() != NodeId{i}) list.push_back(NodeId{i});
      }
  }
  return users;
}

void Graph::check_input(NodeId id, const char* role) const {
  if (!contains(id))
    fail<GraphError>("input `", role, "` refers to node ", id.index, ", which does not exist (",
                     nodes_.size(), " nodes)");
  if (nodes_[id.index].erased)
    fail<GraphError>("input `", role, "` refers to erased node %", id.index);
}

NodeId Graph::append(Node node) {
  for (NodeId in : node.inputs) check_input(in, op_name(node.op));
  nodes_.push_back(std::move(node));
  return NodeId{static_cast<std::uint32_t>(nodes_.size() - 1)};
}

void Graph::replace_uses(NodeId from, NodeId to, const std::vector<NodeId>& consumers) {
  auto rewire = [&](Node& n) {
    for (NodeId& in : n.inputs)
      if (in == from) in = to;
  };
  if (consumers.empty()) {
    for (auto& n : nodes_)
      if (!n.erased) rewire(n);
    for (auto& [name, id] : outputs_)
      if (id == from) id = to;
  } else {
    for (NodeId c : consumers) rewire(mutable_node(c));
  }
}

void Graph::mark_output(const std::string& name, NodeId id) {
  check_input(id, name.c_str());
  for (auto& [existing, node] : outputs_)
    if (existing == name) fail<GraphError>("output '", name, "' is already marked");
  outputs_.emplace_back(name, id);
}

NodeId Graph::add(Op op, std::vector<NodeId> inputs, SymShape shape, DType dtype, Attrs attrs) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.shape = std::move(shape);
  n.dtype = dtype;
  n.attrs = std::move(attrs);
  for (NodeId in : n.inputs) check_input(in, op_name(op));
  const Inferred inferred = infer_node(*this, n);
  n.shape = inferred.shape;
  n.dtype = inferred.dtype;
  nodes_.push_back(std::move(n));
  return NodeId{static_cast<std::uint32_t>(nodes_.size() - 1)};
}

NodeId Graph::labeled(NodeId id, const std::string& label) {
  mutable_node(id).label = label;
  return id;
}

NodeId Graph::input(const std::string& name, SymShape shape, DType dtype) {
  Attrs a;
  a.name = name;
  for (const auto& n : nodes_)
    if (n.op == Op::Input && !n.erased && n.attrs.name == name)
      fail<GraphError>("input '", name, "' is already declared");
  return add(Op::Input, {}, std::move(shape), dtype, std::move(a));
}

NodeId Graph::param(const std::string& name, Tensor value) {
  check_defined(value, name.c_str());
  Attrs a;
  a.name = name;
  const SymShape shape = sym_shape_of(value.shape());
  const DType dtype = value.dtype();
  a.tensor = std::move(value);
  return add(Op::Param, {}, shape, dtype, std::move(a));
}

NodeId Graph::constant(Tensor value, const std::string& label) {
  check_defined(value, "constant");
  Attrs a;
  const SymShape shape = sym_shape_of(value.shape());
  const DType dtype = value.dtype();
  a.tensor = std::move(value);
  NodeId id = add(Op::Constant, {}, shape, dtype, std::move(a));
  if (!label.empty()) labeled(id, label);
  return id;
}

NodeId Graph::scalar(double value, DType dtype) {
  Tensor t = Tensor::empty({1}, dtype);
  t.set({0}, value);
  return constant(std::move(t));
}

NodeId Graph::state(const std::string& name, SymShape shape, DType dtype) {
  for (const auto& n : nodes_)
    if (n.op == Op::State && !n.erased && n.attrs.name == name)
      fail<GraphError>("state '", name, "' is already declared");
  Attrs a;
  a.name = name;
  return add(Op::State, {}, std::move(shape), dtype, std::move(a));
}

NodeId Graph::sym_value(DynScalar value, DType dtype) {
  Attrs a;
  a.value = std::move(value);
  return add(Op::SymValue, {}, {SymExpr(1)}, dtype, std::move(a));
}

NodeId Graph::iota(SymShape shape, std::int64_t axis, DType dtype) {
  Attrs a;
  a.axis = axis;
  return add(Op::Iota, {}, std::move(shape), dtype, std::move(a));
}

NodeId Graph::unary(Op op, NodeId x) {
  if (!is_unary(op)) fail<GraphError>("unary() needs a unary op, got ", op_name(op));
  return add(op, {x}, {}, DType::f32);
}

NodeId Graph::binary(Op op, NodeId a, NodeId b) {
  if (!is_binary_arith(op) && !is_compare(op))
    fail<GraphError>("binary() needs an arithmetic or comparison op, got ", op_name(op));
  return add(op, {a, b}, {}, DType::f32);
}

NodeId Graph::where(NodeId cond, NodeId a, NodeId b) {
  return add(Op::Where, {cond, a, b}, {}, DType::f32);
}

NodeId Graph::reduce(Op op, NodeId x, std::int64_t axis, bool keepdim) {
  if (!is_reduce(op)) fail<GraphError>("reduce() needs a reduction op, got ", op_name(op));
  Attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  return add(op, {x}, {}, DType::f32, std::move(a));
}

NodeId Graph::softmax(NodeId x, std::int64_t axis) {
  Attrs a;
  a.axis = axis;
  return add(Op::Softmax, {x}, {}, DType::f32, std::move(a));
}

NodeId Graph::matmul(NodeId a, NodeId b, bool transpose_b) {
  Attrs attrs;
  attrs.transpose_b = transpose_b;
  return add(Op::MatMul, {a, b}, {}, DType::f32, std::move(attrs));
}

NodeId Graph::reshape(NodeId x, SymShape shape) {
  return add(Op::Reshape, {x}, std::move(shape), DType::f32);
}

NodeId Graph::permute(NodeId x, std::vector<std::int64_t> perm) {
  Attrs a;
  a.perm = std::move(perm);
  return add(Op::Permute, {x}, {}, DType::f32, std::move(a));
}

NodeId Graph::slice(NodeId x, std::int64_t axis, DynScalar start, DynScalar end) {
  Attrs a;
  a.axis = axis;
  a.start = std::move(start);
  a.end = std::move(end);
  return add(Op::Slice, {x}, {}, DType::f32, std::move(a));
}

NodeId Graph::concat(const std::vector<NodeId>& xs, std::int64_t axis) {
  Attrs a;
  a.axis = axis;
  return add(Op::Concat, xs, {}, DType::f32, std::move(a));
}

NodeId Graph::gather(NodeId table, NodeId indices) {
  return add(Op::Gather, {table, indices}, {}, DType::f32);
}

NodeId Graph::cast(NodeId x, DType dtype) { return add(Op::Cast, {x}, {}, dtype); }

NodeId Graph::write_at(NodeId state, NodeId value, std::int64_t axis, DynScalar offset) {
  Attrs a;
  a.axis = axis;
  a.offset = std::move(offset);
  return add(Op::WriteAt, {state, value}, {}, DType::f32, std::move(a));
}

NodeId Graph::sequence(NodeId value, const std::vector<NodeId>& after) {
  std::vector<NodeId> inputs{value};
  inputs.insert(inputs.end(), after.begin(), after.end());
  return add(Op::Sequence, std::move(inputs), {}, DType::f32);
}

NodeId Graph::flash_decode(NodeId q, NodeId k, NodeId v, std::optional<NodeId> alibi,
                           const FlashDecodeAttrs& attrs) {
  Attrs a;
  a.flash = std::make_shared<FlashDecodeAttrs>(attrs);
  a.flash->has_alibi = alibi.has_value();
  std::vector<NodeId> inputs{q, k, v};
  if (alibi) inputs.push_back(*alibi);
  return add(Op::FlashDecode, std::move(inputs), {}, DType::f32, std::move(a));
}

NodeId Graph::kda_decode(const std::vector<NodeId>& inputs, const KdaAttrs& attrs,
                         SymShape out_shape) {
  Attrs a;
  a.kda = std::make_shared<KdaAttrs>(attrs);
  return add(Op::KdaDecode, inputs, std::move(out_shape), DType::bf16, std::move(a));
}

NodeId Graph::rms_norm(NodeId x, NodeId weight, float eps, DType dtype) {
  Attrs a;
  a.eps = eps;
  return add(Op::RmsNorm, {x, weight}, {}, dtype, std::move(a));
}

NodeId Graph::silu_mul(NodeId a, NodeId b) { return add(Op::SiluMul, {a, b}, {}, DType::f32); }

NodeId Graph::matmul_add(NodeId a, NodeId b, NodeId c, DType dtype) {
  return add(Op::MatMulAdd, {a, b, c}, {}, dtype);
}

NodeId Graph::rms_norm_matmul(NodeId x, NodeId weight, NodeId w, float eps, DType dtype) {
  Attrs a;
  a.eps = eps;
  return add(Op::RmsNormMatMul, {x, weight, w}, {}, dtype, std::move(a));
}

NodeId Graph::silu_mul_matmul_add(NodeId a, NodeId b, NodeId w, NodeId c, DType dtype) {
  return add(Op::SiluMulMatMulAdd, {a, b, w, c}, {}, dtype);
}

NodeId Graph::rope(NodeId x, NodeId cos_table, NodeId sin_table, NodeId position) {
  return add(Op::Rope, {x, cos_table, sin_table, position}, {}, DType::f32);
}

NodeId Graph::rope_kv_append(NodeId qkv, NodeId cos_table, NodeId sin_table, NodeId position,
                             NodeId k_cache, NodeId v_cache) {
  return add(Op::RopeKvAppend, {qkv, cos_table, sin_table, position, k_cache, v_cache}, {},
             DType::f32);
}

NodeId Graph::rms_norm_matmul_rope_kv_append(NodeId x, NodeId norm_weight, NodeId w, float eps,
                                             NodeId cos_table, NodeId sin_table, NodeId position,
                                             NodeId k_cache, NodeId v_cache) {
  Attrs a;
  a.eps = eps;
  return add(Op::RmsNormMatMulRopeKvAppend,
             {x, norm_weight, w, cos_table, sin_table, position, k_cache, v_cache}, {}, DType::f32,
             std::move(a));
}

NodeId Graph::rms_norm_matmul_swiglu(NodeId x, NodeId norm_weight, NodeId w, float eps,
                                     DType dtype) {
  Attrs a;
  a.eps = eps;
  return add(Op::RmsNormMatMulSwiglu, {x, norm_weight, w}, {}, dtype, std::move(a));
}

NodeId Graph::state_after(NodeId state, const std::vector<NodeId>& after) {
  std::vector<NodeId> inputs{state};
  inputs.insert(inputs.end(), after.begin(), after.end());
  return add(Op::StateAfter, std::move(inputs), {}, DType::f32);
}

std::int64_t Graph::wrap_axis(std::int64_t axis, std::size_t rank, const char* what) const {
  const auto r = static_cast<std::int64_t>(rank);
  const std::int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) fail<GraphError>(what, ": axis ", axis, " is out of range for rank ", r);
  return a;
}

bool same_shape(const SymShape& a, const SymShape& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!a[i].structurally_equal(b[i])) return false;
  return true;
}

SymShape broadcast_shapes(const SymShape& a, const SymShape& b, const std::string& what) {
  const std::size_t rank = std::max(a.size(), b.size());
  SymShape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const bool has_a = i < a.size(), has_b = i < b.size();
    const SymExpr da = has_a ? a[a.size() - 1 - i] : SymExpr(1);
    const SymExpr db = has_b ? b[b.size() - 1 - i] : SymExpr(1);
    SymExpr d;
    if (da.structurally_equal(db))
      d = da;
    else if (da.is_constant() && da.constant() == 1)
      d = db;
    else if (db.is_constant() && db.constant() == 1)
      d = da;
    else
      fail<GraphError>(what, ": shapes ", sym_shape_str(a), " and ", sym_shape_str(b),
                       " do not broadcast");
    out[rank - 1 - i] = d;
  }
  return out;
}

}  // namespace splice
