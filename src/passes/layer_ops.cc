// offer_layer_op_arm: validate the spec, gate it on the layer-op contract row, splice the branch
// (see splice/passes/layer_ops.h for the three stages). The fused node's typing rules are the
// IR's own (infer_node), so the spec is checked against exactly what the node will be.
#include "splice/passes/layer_ops.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "ir/infer.h"
#include "passes/offer.h"
#include "splice/core/error.h"

namespace splice {
namespace {

Op fused_op(LayerOpKind kind) {
  switch (kind) {
    case LayerOpKind::rms_norm:
      return Op::RmsNorm;
    case LayerOpKind::silu_mul:
      return Op::SiluMul;
    case LayerOpKind::rope:
      return Op::Rope;
    case LayerOpKind::matmul_add:
      return Op::MatMulAdd;
    case LayerOpKind::rms_norm_matmul:
      return Op::RmsNormMatMul;
    case LayerOpKind::silu_mul_matmul_add:
      return Op::SiluMulMatMulAdd;
    case LayerOpKind::rope_kv_append:
      return Op::RopeKvAppend;
    case LayerOpKind::rms_norm_matmul_rope_kv_append:
      return Op::RmsNormMatMulRopeKvAppend;
    case LayerOpKind::rms_norm_matmul_swiglu:
      return Op::RmsNormMatMulSwiglu;
  }
  fail<GraphError>("LayerOpSpec: unknown kind ", static_cast<int>(kind));
}

// Role names of the inputs, in order.
std::vector<std::string> role_names(LayerOpKind kind) {
  switch (kind) {
    case LayerOpKind::rms_norm:
      return {"x", "weight"};
    case LayerOpKind::silu_mul:
      return {"a", "b"};
    case LayerOpKind::rope:
      return {"x", "cos", "sin", "position"};
    case LayerOpKind::matmul_add:
      return {"a", "b", "c"};
    case LayerOpKind::rms_norm_matmul:
      return {"x", "norm_weight", "w"};
    case LayerOpKind::silu_mul_matmul_add:
      return {"a", "b", "w", "c"};
    case LayerOpKind::rope_kv_append:
      return {"qkv", "cos", "sin", "position", "k_cache", "v_cache"};
    case LayerOpKind::rms_norm_matmul_rope_kv_append:
      return {"x", "norm_weight", "w", "cos", "sin", "position", "k_cache", "v_cache"};
    case LayerOpKind::rms_norm_matmul_swiglu:
      return {"x", "norm_weight", "w"};
  }
  return {};
}

// The fused node the spec describes (not yet appended).
Node fused_node(const Graph& g, const LayerOpSpec& s) {
  Node n;
  n.op = fused_op(s.kind);
  n.inputs = s.inputs;
  n.dtype = g.node(s.decomposed_out).dtype;
  n.attrs.eps = s.eps;
  return n;
}

void validate(const Graph& g, const LayerOpSpec& s) {
  const char* name = layer_op_name(s.kind);
  const std::vector<std::string> roles = role_names(s.kind);
  if (s.inputs.size() != roles.size())
    fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): takes ", roles.size(),
                     " inputs, got ", s.inputs.size());
  auto live = [&](NodeId id, const std::string& what) {
    if (!g.is_live(id))
      fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): `", what, "` = %", id.index,
                       " is not a live node of the graph (", g.size(), " nodes)");
  };
  for (std::size_t i = 0; i < roles.size(); ++i) live(s.inputs[i], roles[i]);
  live(s.decomposed_out, "decomposed_out");
  // The caches: inputs 4, 5 of rope_kv_append, 6, 7 of rms_norm_matmul_rope_kv_append.
  const std::size_t first_cache = s.kind == LayerOpKind::rope_kv_append                   ? 4
                                  : s.kind == LayerOpKind::rms_norm_matmul_rope_kv_append ? 6
                                                                                          : 0;
  if (first_cache > 0)
    for (std::size_t i : {first_cache, first_cache + 1})
      if (g.node(s.inputs[i]).op != Op::State)
        fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): `", roles[i],
                         "` must be a state buffer (written in place), got ",
                         op_name(g.node(s.inputs[i]).op));
  live(s.reconverge, "reconverge");
  if (!std::isfinite(s.eps) || s.eps < 0)
    fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): `eps` must be finite and >= 0, got ",
                     s.eps);
  Inferred inferred;
  try {
    inferred = infer_node(g, fused_node(g, s));
  } catch (const GraphError& e) {
    fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): ", e.what());
  }
  const Node& out = g.node(s.decomposed_out);
  if (!same_shape(inferred.shape, out.shape) || inferred.dtype != out.dtype)
    fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): `decomposed_out` is ",
                     dtype_name(out.dtype), sym_shape_str(out.shape, &g.symbols()),
                     " but the fused op gives ", dtype_name(inferred.dtype),
                     sym_shape_str(inferred.shape, &g.symbols()));
  const auto users = g.users();
  const auto& consumers = users[s.decomposed_out.index];
  bool is_output = false;
  for (const auto& [output, id] : g.outputs()) is_output |= id == s.decomposed_out;
  if (consumers.size() != 1 || consumers[0] != s.reconverge || is_output)
    fail<GraphError>("LayerOpSpec (", name, ", ", s.site, "): `reconverge` %", s.reconverge.index,
                     " must be the sole consumer of `decomposed_out` %", s.decomposed_out.index,
                     ", which has ", consumers.size(), " consumer(s)",
                     is_output ? " and is an output" : "");
}

}  // namespace

std::string layer_op_gate(const Graph& g, const LayerOpSpec& s, const LayerOpContract& c) {
  const std::string who = c.kernel + "/" + c.backend + " (rev " + c.revision + ")";
  std::ostringstream why;
  if (!c.supports(s.kind)) why << who << " does not implement " << layer_op_name(s.kind) << "; ";
  const Node& x = g.node(s.inputs.at(0));
  const DType out_dtype = g.node(s.decomposed_out).dtype;
  if (!c.supports_dtype(x.dtype))
    why << who << " does not take dtype " << dtype_name(x.dtype) << "; ";
  if (out_dtype != x.dtype && !c.supports_dtype(out_dtype))
    why << who << " does not write dtype " << dtype_name(out_dtype) << "; ";
  // The residual c: input 2 of matmul_add, input 3 of silu_mul_matmul_add.
  const std::size_t residual = s.kind == LayerOpKind::matmul_add            ? 2
                               : s.kind == LayerOpKind::silu_mul_matmul_add ? 3
                                                                            : 0;
  if (residual > 0 && s.inputs.size() > residual &&
      !c.supports_dtype(g.node(s.inputs[residual]).dtype))
    why << who << " does not take a residual of dtype "
        << dtype_name(g.node(s.inputs[residual]).dtype) << "; ";
  // The projection weight w of the norm's product (silu_mul_matmul_add's has a's dtype).
  if ((s.kind == LayerOpKind::rms_norm_matmul || s.kind == LayerOpKind::rms_norm_matmul_swiglu) &&
      s.inputs.size() == 3 && !c.supports_dtype(g.node(s.inputs[2]).dtype))
    why << who << " does not take a weight of dtype " << dtype_name(g.node(s.inputs[2]).dtype)
        << "; ";
  // The q|k|v GEMV with the RoPE epilogue: the row's qkv_rope limits (dtypes of x, norm_weight,
  // w and the caches, head_dim, K, batch) on the largest shapes the symbols allow.
  if (s.kind == LayerOpKind::rms_norm_matmul_rope_kv_append && s.inputs.size() == 8) {
    const Node& k_cache = g.node(s.inputs[6]);
    const std::int64_t head_dim = k_cache.shape.size() == 4 && k_cache.shape[3].is_constant()
                                      ? k_cache.shape[3].constant()
                                      : 0;
    const std::int64_t k = x.shape.back().upper_bound(g.symbols());
    const std::int64_t batch = x.shape.empty() ? 0 : x.shape[0].upper_bound(g.symbols());
    const std::string limits =
        c.qkv_rope_gate(x.dtype, g.node(s.inputs[1]).dtype, g.node(s.inputs[2]).dtype,
                        k_cache.dtype, head_dim, k, batch);
    if (!limits.empty()) why << who << " " << limits << "; ";
  }
  const SymExpr& row = x.shape.back();
  if (c.max_row > 0 && row.upper_bound(g.symbols()) > c.max_row)
    why << "the row length " << row.str(&g.symbols()) << " exceeds " << who << "'s max_row "
        << c.max_row << "; ";
  std::string reason = why.str();
  if (reason.size() >= 2) reason.resize(reason.size() - 2);
  return reason;
}

OfferResult offer_layer_op_arm(Graph& g, const LayerOpSpec& s, const LayerOpContract& c,
                               DecisionLog* log) {
  validate(g, s);
  const std::string kind = layer_op_name(s.kind);
  Decision decision;
  decision.kind = kind;
  decision.site = s.site;
  const std::string reason = layer_op_gate(g, s, c);
  if (!reason.empty()) return decline_offer(std::move(decision), reason, log);
  const auto& in = s.inputs;
  NodeId fused;
  switch (s.kind) {
    case LayerOpKind::rms_norm:
      fused = g.rms_norm(in[0], in[1], s.eps, g.node(s.decomposed_out).dtype);
      break;
    case LayerOpKind::silu_mul:
      fused = g.silu_mul(in[0], in[1]);
      break;
    case LayerOpKind::rope:
      fused = g.rope(in[0], in[1], in[2], in[3]);
      break;
    case LayerOpKind::matmul_add:
      fused = g.matmul_add(in[0], in[1], in[2], g.node(s.decomposed_out).dtype);
      break;
    case LayerOpKind::rms_norm_matmul:
      fused = g.rms_norm_matmul(in[0], in[1], in[2], s.eps, g.node(s.decomposed_out).dtype);
      break;
    case LayerOpKind::silu_mul_matmul_add:
      fused = g.silu_mul_matmul_add(in[0], in[1], in[2], in[3], g.node(s.decomposed_out).dtype);
      break;
    case LayerOpKind::rope_kv_append:
      fused = g.rope_kv_append(in[0], in[1], in[2], in[3], in[4], in[5]);
      break;
    case LayerOpKind::rms_norm_matmul_rope_kv_append:
      fused = g.rms_norm_matmul_rope_kv_append(in[0], in[1], in[2], s.eps, in[3], in[4], in[5],
                                               in[6], in[7]);
      break;
    case LayerOpKind::rms_norm_matmul_swiglu:
      fused = g.rms_norm_matmul_swiglu(in[0], in[1], in[2], s.eps, g.node(s.decomposed_out).dtype);
      break;
  }
  g.labeled(fused, (s.site.empty() ? kind : s.site + "." + kind) + "_fused");
  ArmRecipe recipe;
  recipe.kind = kind;
  const std::vector<std::string> roles = role_names(s.kind);
  for (std::size_t i = 0; i < roles.size(); ++i) recipe.roles[roles[i]] = s.inputs[i];
  recipe.contract_revision = c.revision;
  return splice_offer(
      g, s.inputs[0], s.decomposed_out, fused, s.reconverge, recipe, c.kernel + "/" + c.backend,
      "offered: " + c.kernel + "/" + c.backend + " rev " + c.revision + " implements " + kind,
      std::move(decision), log);
}

}  // namespace splice
