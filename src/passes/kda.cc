// offer_kda_arm: validate, gate on the KDA contract row, splice (see splice/passes/kda.h).
#include "splice/passes/kda.h"

#include <algorithm>
#include <utility>

#include "passes/offer.h"
#include "splice/core/error.h"

namespace splice {
namespace {

void validate(const Graph& g, const KdaDecodeSpec& s) {
  const std::pair<const char*, NodeId> ids[] = {{"x", s.x},
                                                {"weight", s.weight},
                                                {"conv_state", s.conv_state},
                                                {"raw_gate", s.raw_gate},
                                                {"raw_beta", s.raw_beta},
                                                {"A_log", s.A_log},
                                                {"dt_bias", s.dt_bias},
                                                {"state_indices", s.state_indices},
                                                {"state", s.state},
                                                {"output_gate", s.output_gate},
                                                {"norm_weight", s.norm_weight},
                                                {"decomposed_out", s.decomposed_out},
                                                {"reconverge", s.reconverge}};
  for (const auto& [name, id] : ids)
    if (!g.is_live(id))
      fail<GraphError>("KdaDecodeSpec: `", name, "` = %", id.index, " is not a live node");
  if (g.node(s.conv_state).op != Op::State || g.node(s.state).op != Op::State)
    fail<GraphError>("KdaDecodeSpec: `conv_state` and `state` must be state buffers");
  const Node& x = g.node(s.x);
  const Node& st = g.node(s.state);
  const Node& out = g.node(s.decomposed_out);
  if (x.shape.size() != 2 || x.dtype != DType::bf16)
    fail<GraphError>("KdaDecodeSpec: `x` must be bf16 [R, 3C], got ", dtype_name(x.dtype),
                     sym_shape_str(x.shape));
  if (st.shape.size() != 4)
    fail<GraphError>("KdaDecodeSpec: `state` must be [slots, H, D, D], got ",
                     sym_shape_str(st.shape));
  const SymShape expected_out{SymExpr(1), x.shape[0], st.shape[1], st.shape[2]};
  if (!same_shape(out.shape, expected_out) || out.dtype != DType::bf16)
    fail<GraphError>("KdaDecodeSpec: `decomposed_out` must be bf16 ", sym_shape_str(expected_out),
                     ", got ", dtype_name(out.dtype), sym_shape_str(out.shape));
  const auto users = g.users();
  const auto& consumers = users[s.decomposed_out.index];
  if (consumers.size() != 1 || consumers[0] != s.reconverge)
    fail<GraphError>("KdaDecodeSpec: `reconverge` %", s.reconverge.index,
                     " must be the sole consumer of `decomposed_out` %", s.decomposed_out.index);
}

}  // namespace

OfferResult offer_kda_arm(Graph& g, const KdaDecodeSpec& s, const KdaContract& c,
                          DecisionLog* log) {
  validate(g, s);
  Decision decision;
  decision.kind = "kda_decode";
  decision.site = s.site;
  const Node& st = g.node(s.state);  // read before anything is appended
  std::string reason;
  if (std::find(c.state_dtypes.begin(), c.state_dtypes.end(), st.dtype) == c.state_dtypes.end())
    reason = c.kernel + "/" + c.backend + " does not take state dtype " + dtype_name(st.dtype);
  const SymExpr& d = st.shape[3];
  if (!d.is_constant() ||
      std::find(c.head_dims.begin(), c.head_dims.end(), d.constant()) == c.head_dims.end())
    reason += std::string(reason.empty() ? "" : "; ") + c.kernel + "/" + c.backend +
              " does not take head_dim " + d.str();
  if (!reason.empty()) return decline_offer(std::move(decision), reason, log);
  // The op's conv_state layout [slots, 3C, T+2] with strides [slot, 1, 3C] is a view of the
  // position-major state buffer [slots, T+2, 3C].
  const NodeId conv_view =
      g.labeled(g.permute(s.conv_state, {0, 2, 1}), s.site + ".conv_state_view");
  KdaAttrs attrs;
  attrs.lower_bound = s.lower_bound;
  attrs.norm_eps = s.norm_eps;
  attrs.packed = false;
  const SymShape out_shape = g.node(s.decomposed_out).shape;
  const NodeId fused =
      g.kda_decode({s.x, s.weight, conv_view, s.raw_gate, s.raw_beta, s.A_log, s.dt_bias,
                    s.state_indices, s.state, s.output_gate, s.norm_weight},
                   attrs, out_shape);
  g.labeled(fused, s.site + ".kda_decode");
  ArmRecipe recipe;
  recipe.kind = "kda_decode";
  recipe.roles = {{"x", s.x},
                  {"raw_gate", s.raw_gate},
                  {"raw_beta", s.raw_beta},
                  {"output_gate", s.output_gate},
                  {"conv_state", s.conv_state},
                  {"state", s.state}};
  recipe.contract_revision = c.revision;
  return splice_offer(
      g, s.x, s.decomposed_out, fused, s.reconverge, recipe, c.kernel + "/" + c.backend,
      "offered: " + c.kernel + "/" + c.backend + " rev " + c.revision, std::move(decision), log);
}

}  // namespace splice
